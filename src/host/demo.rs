//! The model a run opens: the one the configuration names, or the built-in
//! demo model, generated on first use.

use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::config::RunConfig;
use crate::hub::{self, HubSettings, ModelRef};
use crate::progress::write_model_with_progress;
use crate::synth::{self, Arch, ModelSpec, Preset};

/// The model `config` names (`hf:OWNER/NAME[:QUANT]`: pulled from the
/// hub unless cached), or the demo model (generated on first use, with a
/// progress bar; Ctrl-C stops it cleanly). Recorded for `bmoe models`.
pub fn resolve_model(config: &RunConfig) -> Result<PathBuf> {
    let path = locate_model(config)?;
    super::recent::record_use(&path);
    Ok(path)
}

/// Gives a run on the demo model (no model named) a reply budget when it
/// sets none: the demo's random weights rarely end a reply by themselves.
pub fn demo_budget(config: &mut RunConfig) {
    if config.model.path.as_os_str().is_empty() && config.generate.n_predict == 0 {
        config.generate.n_predict = crate::config::DEMO_REPLY_TOKENS;
    }
}

/// The model file `config` means, fetched or generated when needed.
fn locate_model(config: &RunConfig) -> Result<PathBuf> {
    let given = &config.model.path;
    let named =
        given.to_str().filter(|g| !g.is_empty()).map(ModelRef::parse).transpose().map_err(anyhow::Error::msg)?;
    if let Some(ModelRef::Hub(spec)) = named {
        let pulled = hub::pull(&spec, &HubSettings::from_env())?;
        if pulled.downloaded > 0 {
            eprintln!(
                "bmoe: {spec}: {} downloaded to {}",
                crate::units::size(pulled.downloaded),
                pulled.model.display()
            );
        }
        return Ok(pulled.model);
    }
    if !given.as_os_str().is_empty() {
        if !given.exists() {
            anyhow::bail!(
                "{}: no such file; pass -m a GGUF model file (for a split model, its -00001-of-0000N.gguf \
                 shard), a hub model (OWNER/NAME[:QUANT], or a name `bmoe models` lists), or leave -m out to \
                 run the built-in demo model",
                given.display()
            );
        }
        return Ok(given.clone());
    }
    let dir = crate::moe::copies::cache_root();
    let path = dir.join(format!("demo-qwen3moe-v{}.gguf", synth::GENERATOR_VERSION));
    crate::notes::note(
        "bmoe",
        &format!(
            "no model given: using the built-in demo, a synthetic qwen3moe with RANDOM weights (its text is \
             gibberish by design): {}",
            path.display()
        ),
    );
    if !path.exists() {
        // A qwen3moe demo speaks Qwen3's chat template.
        let template = crate::chat::named_template("qwen3").map(str::to_string);
        let spec = ModelSpec { chat_template: template, ..ModelSpec::preset(Preset::Demo, Arch::Qwen3Moe) };
        write_model_with_progress(&spec, &path, "generating demo model").context("generating the demo model")?;
    }
    Ok(path)
}
