//! The rustyline helper: completion of `:commands`, setting names, plugin
//! names and file paths; grey hints with a command's arguments. The logic is
//! in `commands.rs`; this only adapts it to rustyline's traits.

use std::borrow::Cow;

use rustyline::completion::{Completer, FilenameCompleter, Pair};
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::{Context, Helper, validate::Validator};

use super::commands;
use crate::policy::wasm::bundled_names;

/// Completion and hints for the REPL's line editor.
pub struct ReplHelper {
    files: FilenameCompleter,
    plugins: Vec<&'static str>,
}

impl ReplHelper {
    /// A helper knowing the bundled plugins.
    pub fn new() -> ReplHelper {
        ReplHelper { files: FilenameCompleter::new(), plugins: bundled_names() }
    }
}

impl Completer for ReplHelper {
    type Candidate = Pair;

    fn complete(&self, line: &str, pos: usize, ctx: &Context<'_>) -> rustyline::Result<(usize, Vec<Pair>)> {
        // File arguments complete as paths.
        for c in [":save ", ":load ", ":trace "] {
            if line.starts_with(c) {
                return self.files.complete(line, pos, ctx);
            }
        }
        let (start, words) = commands::completions(line, pos, &self.plugins);
        Ok((start, words.into_iter().map(|w| Pair { display: w.clone(), replacement: w }).collect()))
    }
}

impl Hinter for ReplHelper {
    type Hint = String;

    fn hint(&self, line: &str, pos: usize, _ctx: &Context<'_>) -> Option<String> {
        commands::hint(line, pos)
    }
}

impl Highlighter for ReplHelper {
    fn highlight_hint<'h>(&self, hint: &'h str) -> Cow<'h, str> {
        Cow::Owned(format!("\x1b[2m{hint}\x1b[0m"))
    }
}

impl Validator for ReplHelper {}

impl Helper for ReplHelper {}
