//! `bmoe pull REPO[:QUANT]`: a model from the Hugging Face Hub into the hub
//! cache, ready for `-m hf:REPO[:QUANT]` (or `-hf REPO[:QUANT]`).

use anyhow::{Result, anyhow};
use clap::Args;

use crate::hub::{self, HubSettings, HubSpec};
use crate::units::size;

/// `bmoe pull`'s arguments.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// OWNER/NAME[:QUANT]: QUANT is a quantization tag (any case, default Q4_K_M, else the
    /// repository's only model) or a file name ending in .gguf; a split set comes whole.
    pub model: String,
    /// The branch, tag or commit to pull.
    #[arg(long, default_value = "main", value_parser = revision)]
    pub revision: String,
    /// Connections a file of 64 MiB or more is fetched over, each a byte range (1: one stream).
    #[arg(long, default_value_t = hub::DEFAULT_CONNECTIONS, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub connections: u16,
}

/// A `--revision` the cache can hold: a commit or a branch or tag name.
fn revision(text: &str) -> Result<String, String> {
    hub::validate::revision(text).map(|()| text.to_string())
}

/// Pulls the model and prints the file to pass as `-m`.
pub fn pull(args: PullArgs) -> Result<()> {
    let mut spec: HubSpec = args.model.parse().map_err(|e: String| anyhow!(e))?;
    spec.revision = args.revision;
    let settings = HubSettings { connections: usize::from(args.connections), ..HubSettings::from_env() };
    let pulled = hub::pull(&spec, &settings)?;
    let total: u64 = pulled.files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let fetched = if pulled.downloaded == 0 {
        "already in the cache".to_string()
    } else {
        format!("{} downloaded", size(pulled.downloaded))
    };
    eprintln!(
        "bmoe: {spec}: {} file{}, {} ({fetched}), commit {}",
        pulled.files.len(),
        if pulled.files.len() == 1 { "" } else { "s" },
        size(total),
        &pulled.commit[..pulled.commit.len().min(12)]
    );
    eprintln!("bmoe: run it with: bmoe chat -hf {spec}");
    super::print_stdout(&format!("{}\n", pulled.model.display()))
}
