//! The command line: `generate`, `make-model`, `inspect`, `archs`,
//! `trace-stats` and `plugin`.

mod generate;
mod model;
mod plugin;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

pub use generate::{GenerateArgs, resolve_config};
pub use model::MakeModelArgs;
pub use plugin::PluginCommand;

/// bmoe runs Mixture-of-Experts models larger than RAM by reading only the
/// routed experts from disk, with output identical to a fully resident run.
#[derive(Parser, Debug)]
#[command(name = "bmoe", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt (stdout carries only the generated text).
    Generate(GenerateArgs),
    /// Write a synthetic MoE model (random weights, real architecture).
    MakeModel(MakeModelArgs),
    /// Describe a GGUF model and whether bmoe can stream it.
    Inspect {
        /// Model file (first shard of a split set).
        file: PathBuf,
    },
    /// List the architectures bmoe can stream.
    Archs,
    /// Measure routing skew and stability in route traces.
    TraceStats {
        /// Route trace files (from --route-trace, or the reference engine's).
        files: Vec<PathBuf>,
        /// Decode tokens to analyse from each trace.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
    },
    /// Draft and drop policy plugins: list, check, bench, scaffold a new one.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

/// Runs the command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate::generate(args),
        Command::MakeModel(args) => model::make_model(args),
        Command::Inspect { file } => model::inspect(&file),
        Command::Archs => {
            model::archs();
            Ok(())
        }
        Command::TraceStats { files, tokens } => model::trace_stats(&files, tokens),
        Command::Plugin(cmd) => plugin::run(cmd),
    }
}

/// A byte-progress bar on stderr (hidden when stderr is not a terminal).
fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}
