//! Progress bars on stderr for long work the front ends start (writing a
//! synthetic model, the repacked copy of a model's experts); hidden when
//! stderr is not a terminal.

use std::ops::ControlFlow;
use std::path::Path;

use anyhow::Result;

use crate::interrupt;
use crate::synth::{self, ModelSpec, WriteReport};

/// Writes a synthetic model with a progress bar; Ctrl-C stops it (the
/// partial file is removed) with [`interrupt::Interrupted`].
pub fn write_model_with_progress(spec: &ModelSpec, path: &Path, what: &str) -> Result<WriteReport> {
    interrupt::install()?;
    let mut bar = None;
    let written = synth::write_model(spec, path, &mut |done, total| {
        bar.get_or_insert_with(|| progress_bar(total, what)).set_position(done);
        if interrupt::requested() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    interrupt::check()?;
    written
}

/// A byte-progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    bar_with(total, what, "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
}

/// A progress bar of `total` items (tokens, runs) on stderr, hidden when
/// stderr is not a terminal.
pub fn count_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    bar_with(total, what, "{msg} [{bar:30}] {pos}/{len} eta {eta}")
}

/// A bar of `total` drawn with `template`, labelled `what`.
fn bar_with(total: u64, what: &str, template: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template(template).expect("valid template").progress_chars("=> "));
    bar.set_message(what.to_string());
    bar
}
