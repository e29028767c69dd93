//! Ctrl-C for long commands. The first SIGINT asks the work in progress to
//! stop at its next safe point: a generation stops at the next graph node and
//! the command still writes its telemetry and prints its summary; a model
//! being written stops and removes its partial file. A second SIGINT exits
//! at once with status 130.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context as _, Result};
use signal_hook::SigId;
use signal_hook::consts::SIGINT;

/// The exit status after Ctrl-C (128 + SIGINT), as shells report it.
pub const EXIT_STATUS: i32 = 130;

/// The error a command returns when Ctrl-C stopped it; `main` exits with
/// [`EXIT_STATUS`] and prints `bmoe: interrupted`.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// Set by the first SIGINT.
fn flag() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// Installs the SIGINT handlers (once per process; later calls do nothing).
pub fn install() -> Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let register = || -> std::io::Result<()> {
                // Registered first, so it runs first: on a second SIGINT the
                // flag is already set and the process exits at once.
                signal_hook::flag::register_conditional_shutdown(SIGINT, EXIT_STATUS, flag().clone())?;
                signal_hook::flag::register(SIGINT, flag().clone())?;
                Ok(())
            };
            register().map_err(|e| e.to_string())
        })
        .clone()
        .map_err(anyhow::Error::msg)
        .context("installing the Ctrl-C handler")
}

/// Makes SIGTERM stop the work in progress like a first Ctrl-C (for
/// commands that hold something to clean up, such as `bench`'s cgroup).
pub fn also_on_sigterm() -> Result<()> {
    signal_hook::flag::register(signal_hook::consts::SIGTERM, flag().clone())
        .context("installing the SIGTERM handler")?;
    Ok(())
}

/// Whether Ctrl-C was pressed since the handlers were installed (or since
/// the last [`clear`]).
pub fn requested() -> bool {
    flag().load(Ordering::SeqCst)
}

/// Forgets an earlier Ctrl-C, so that the next one stops the next piece of
/// work instead of exiting (for front ends that go on after a stop).
pub fn clear() {
    flag().store(false, Ordering::SeqCst);
}

/// `Err(Interrupted)` once Ctrl-C was pressed.
pub fn check() -> Result<(), Interrupted> {
    if requested() { Err(Interrupted) } else { Ok(()) }
}

/// Raises `target` too on every SIGINT while the guard lives: hand it a
/// session's abort flag and a Ctrl-C stops the decode at its next graph
/// node, straight from the signal.
pub struct Forward(SigId);

impl Forward {
    /// Starts forwarding SIGINT to `target`.
    pub fn to(target: Arc<AtomicBool>) -> Result<Forward> {
        let id = signal_hook::flag::register(SIGINT, target).context("forwarding Ctrl-C")?;
        Ok(Forward(id))
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        signal_hook::low_level::unregister(self.0);
    }
}
