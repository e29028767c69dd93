//! The terminal's lifecycle: raw mode, the alternate screen, bracketed
//! paste and mouse reporting on the way in; all of it undone on the way out,
//! whether the app returns, fails or panics.

use std::io::{Stdout, Write};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{cursor, event, execute, terminal};

/// The terminal while the chat screen owns it; dropping it restores it.
pub struct TerminalGuard {
    /// The ratatui terminal.
    pub terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl TerminalGuard {
    /// Takes over the terminal (and installs the panic hook once).
    pub fn enter() -> std::io::Result<TerminalGuard> {
        install_panic_hook();
        terminal::enable_raw_mode()?;
        ENTERED.store(true, Ordering::SeqCst);
        let mut out = std::io::stdout();
        if let Err(e) = execute!(
            out,
            terminal::EnterAlternateScreen,
            event::EnableBracketedPaste,
            event::EnableMouseCapture,
            cursor::Hide
        ) {
            restore();
            return Err(e);
        }
        match Terminal::new(CrosstermBackend::new(out)) {
            Ok(terminal) => Ok(TerminalGuard { terminal }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
    }
}

/// Whether the terminal is set up and not yet restored.
static ENTERED: AtomicBool = AtomicBool::new(false);

/// Undoes everything `enter` did, once: a second restore (the guard's drop
/// after the panic hook's) would leave the alternate screen again, which
/// moves the cursor back over what was printed in between.
pub fn restore() {
    if !ENTERED.swap(false, Ordering::SeqCst) {
        return;
    }
    let mut out = std::io::stdout();
    let _ = execute!(
        out,
        event::DisableMouseCapture,
        event::DisableBracketedPaste,
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
    let _ = terminal::disable_raw_mode();
    let _ = out.flush();
}

/// Restores the terminal before the default hook prints a panic, so the
/// message lands on a usable screen.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}
