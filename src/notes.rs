//! Notes for the person at the terminal, on stderr: each printed once per
//! process (a script opening a model twenty times sees its notes once),
//! none with `-q`, and the details of how a model was set up only with
//! `-v`.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

/// How much the notes say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// No notes (`-q`).
    Quiet,
    /// Notes, not details (the default).
    Normal,
    /// Notes and details (`-v`).
    Verbose,
}

static VERBOSITY: AtomicU8 = AtomicU8::new(1);
static PRINTED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Sets how much the notes say from now on.
pub fn set_verbosity(v: Verbosity) {
    VERBOSITY.store(v as u8, Ordering::Relaxed);
}

/// How much the notes say now.
pub fn verbosity() -> Verbosity {
    match VERBOSITY.load(Ordering::Relaxed) {
        0 => Verbosity::Quiet,
        1 => Verbosity::Normal,
        _ => Verbosity::Verbose,
    }
}

/// Raises the verbosity to `Verbose` (a `-v` or `telemetry.verbose` seen
/// after the command line set it), unless notes are off.
pub fn raise_to_verbose(on: bool) {
    if on && verbosity() == Verbosity::Normal {
        set_verbosity(Verbosity::Verbose);
    }
}

/// The line for `text` if it is to be printed now: not quiet, and the
/// first time this process shows it.
fn first_time(prefix: &str, text: &str) -> Option<String> {
    if verbosity() == Verbosity::Quiet {
        return None;
    }
    let line = format!("{prefix}: note: {text}");
    let mut printed = PRINTED.lock().unwrap_or_else(|e| e.into_inner());
    printed.insert(line.clone()).then_some(line)
}

/// Prints a note (`{prefix}: note: {text}`), once per process.
pub fn note(prefix: &str, text: &str) {
    if let Some(line) = first_time(prefix, text) {
        eprintln!("{line}");
    }
}

/// Prints a detail of how something was set up, with `-v` only, once per
/// process.
pub fn detail(prefix: &str, text: &str) {
    if verbosity() == Verbosity::Verbose {
        note(prefix, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_process_and_nothing_when_quiet() {
        set_verbosity(Verbosity::Normal);
        assert!(first_time("t", "a unique note for this test").is_some());
        assert!(first_time("t", "a unique note for this test").is_none());
        set_verbosity(Verbosity::Quiet);
        assert!(first_time("t", "another note for this test").is_none());
        raise_to_verbose(true);
        assert_eq!(verbosity(), Verbosity::Quiet, "-q wins over -v");
        set_verbosity(Verbosity::Normal);
        raise_to_verbose(true);
        assert_eq!(verbosity(), Verbosity::Verbose);
        set_verbosity(Verbosity::Normal);
    }
}
