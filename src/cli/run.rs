//! `bmoe run FILE.rhai [-- ARGS...]`: an experiment script.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::Args;

use crate::config::RunConfig;
use crate::interrupt;
use crate::script::{Limits, ScriptOptions, run_file};

/// Runs a Rhai experiment script.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The script (`docs/scripting.md` lists what it can call).
    pub file: PathBuf,
    /// Where the script may write its files (CSV, charts, models).
    #[arg(long, default_value = "bmoe-out")]
    pub out: PathBuf,
    /// Settings every `open` in the script starts from.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Script operations before it is stopped (0 = no limit); a model run counts as one.
    #[arg(long, default_value_t = Limits::default().max_operations)]
    pub max_ops: u64,
    /// Arguments for the script, after `--` (the script sees them as `ARGS`).
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Runs `bmoe run`.
pub fn run(a: RunArgs) -> Result<()> {
    interrupt::install()?;
    let base = match &a.config {
        Some(p) => RunConfig::from_file(p).map_err(|e| anyhow!(e))?,
        None => RunConfig::default(),
    };
    let options = ScriptOptions {
        out_dir: a.out,
        args: a.args,
        limits: Limits { max_operations: a.max_ops, ..Limits::default() },
        base,
        // run_file sets it from the script's path.
        ..ScriptOptions::default()
    };
    let result = run_file(&a.file, &options);
    // A Ctrl-C that stopped the script ends the command like any other.
    interrupt::check()?;
    result.map_err(|e| anyhow!(e))
}
