//! `bmoe repl`: a line REPL over the session host. Plain lines are chat
//! turns, streamed to stdout (reasoning dimmed, or prefixed when stdout is
//! not a terminal); `:commands` change settings and show state; the per-turn
//! summary goes to stderr. On a terminal it edits lines with rustyline
//! (history, completion, hints); from a pipe it reads lines and answers
//! them, with no prompt and no colour, so it can be scripted.

mod commands;
mod helper;

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

pub use commands::{COMMANDS, Input, completions, help, hint, parse};

use crate::chat::{Conversation, Kind};
use crate::host::{Apply, Host, HostEvent, Turn};
use crate::interrupt;
use crate::telemetry::summary::RunSummary;

/// Where lines come from.
enum Lines {
    Editor(Box<rustyline::Editor<helper::ReplHelper, rustyline::history::FileHistory>>, Option<PathBuf>),
    Pipe(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Lines {
    /// The next line; None at the end (Ctrl-D, end of input).
    fn next(&mut self) -> Option<Result<String, String>> {
        match self {
            Lines::Editor(editor, _) => loop {
                match editor.readline("bmoe> ") {
                    Ok(line) => {
                        if !line.trim().is_empty() {
                            let _ = editor.add_history_entry(line.as_str());
                        }
                        return Some(Ok(line));
                    }
                    // Ctrl-C at the prompt clears the line; it never leaves.
                    Err(rustyline::error::ReadlineError::Interrupted) => {
                        eprintln!("(Ctrl-D or :quit leaves)");
                        continue;
                    }
                    Err(rustyline::error::ReadlineError::Eof) => return None,
                    Err(e) => return Some(Err(e.to_string())),
                }
            },
            Lines::Pipe(lines) => lines.next().map(|l| l.map_err(|e| e.to_string())),
        }
    }

    fn save_history(&mut self) {
        if let Lines::Editor(editor, Some(path)) = self {
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            let _ = editor.save_history(path);
        }
    }
}

/// The history file, under the user's data directory.
fn history_path() -> Option<PathBuf> {
    Some(dirs::data_dir()?.join("bmoe").join("repl-history.txt"))
}

/// How generated text is shown.
struct Style {
    /// ANSI dim for reasoning (a terminal without NO_COLOR).
    colour: bool,
}

/// What carries from one input line to the next.
#[derive(Default)]
struct Pending {
    /// The start of the next reply (`:prefill`), empty for none.
    prefill: String,
}

/// Runs the REPL on `host` until `:quit`, Ctrl-D or the end of the input.
pub fn run(host: &mut Host) -> anyhow::Result<()> {
    let interactive = std::io::stdin().is_terminal();
    let style = Style { colour: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() };
    let mut lines = if interactive {
        let mut editor = rustyline::Editor::new()?;
        editor.set_helper(Some(helper::ReplHelper::new()));
        let path = history_path();
        if let Some(p) = &path {
            let _ = editor.load_history(p);
        }
        eprintln!(
            "bmoe repl: {} ({}). Type a message, or :help.",
            host.model().display(),
            host.chat_format().family().name()
        );
        Lines::Editor(Box::new(editor), path)
    } else {
        Lines::Pipe(std::io::stdin().lines())
    };
    let mut pending = Pending::default();
    while let Some(line) = lines.next() {
        // Ctrl-C while waiting for piped input leaves.
        if !interactive && interrupt::requested() {
            break;
        }
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: reading input: {e}");
                break;
            }
        };
        match parse(&line) {
            Ok(Input::Quit) => break,
            Ok(input) => {
                if let Err(e) = execute(host, input, &style, &mut pending) {
                    eprintln!("error: {e}");
                }
            }
            Err(e) => eprintln!("error: {e}"),
        }
        // A Ctrl-C that stopped this turn must not end the next one.
        interrupt::clear();
    }
    lines.save_history();
    host.finish()?;
    Ok(())
}

/// Carries out one input line.
fn execute(host: &mut Host, input: Input, style: &Style, pending: &mut Pending) -> Result<(), String> {
    match input {
        Input::Empty | Input::Quit => {}
        Input::Prefill(start) if start.is_empty() => {
            pending.prefill.clear();
            eprintln!("no prefill");
        }
        Input::Prefill(start) => {
            eprintln!("the next reply begins with: {start}");
            pending.prefill = start;
        }
        Input::Chat(text) => {
            let start = std::mem::take(&mut pending.prefill);
            let turn = chat(host, Some((&text, &start)), style)?;
            eprintln!("{}", turn_line(&turn, host));
            if !turn.tool_calls.is_empty() {
                eprintln!("answer each call with :tool RESULT");
            }
        }
        Input::Tool(result) => {
            let call = host.answer_call(&result).map_err(|e| e.to_string())?;
            let left = host.pending_calls().len();
            eprintln!("answered {call}{}", if left > 0 { format!(" ({left} more to answer)") } else { String::new() });
            if left == 0 {
                let turn = chat(host, None, style)?;
                eprintln!("{}", turn_line(&turn, host));
            }
        }
        Input::Set(key, value) => {
            let outcome = host.set(&key, &value).map_err(|e| e.to_string())?;
            for n in &outcome.notices {
                eprintln!("note: {n}");
            }
            let shown = setting_value(host, &outcome.key);
            let how = match outcome.applied {
                Apply::Live => "from the next turn",
                Apply::Reopen => "model reopened",
                Apply::ServeStart => "kept for `bmoe serve`, which reads it when it starts",
            };
            eprintln!("{} = {shown} ({how})", outcome.key);
        }
        Input::Show(what) => print!("{}", show(host, &what)),
        Input::Think(on) => {
            host.set("chat.think", if on { "true" } else { "false" }).map_err(|e| e.to_string())?;
            eprintln!("thinking {}", if on { "on" } else { "off" });
        }
        Input::System(None) => match &host.conversation().system {
            Some(s) => println!("system: {s}"),
            None => println!("(no system prompt)"),
        },
        Input::System(Some(text)) => {
            let cleared = text.is_empty();
            host.set_system(Some(text));
            eprintln!("{}", if cleared { "system prompt cleared" } else { "system prompt set" });
        }
        Input::Reset => {
            host.reset();
            eprintln!("new conversation");
        }
        Input::Save(path) => {
            host.conversation().save(Path::new(&path))?;
            eprintln!("saved {} messages to {path}", host.conversation().messages.len());
        }
        Input::Load(path) => {
            let conversation = Conversation::load(Path::new(&path))?;
            let n = conversation.messages.len();
            host.set_conversation(conversation);
            eprintln!("loaded {n} messages from {path} (prefilled with the next turn)");
        }
        Input::Trace(path) => {
            host.set("telemetry.route_trace", &path).map_err(|e| e.to_string())?;
            match path.as_str() {
                "" => eprintln!("route trace off"),
                p => eprintln!("route trace of the next turns: {p}"),
            }
        }
        Input::Run(file, args) => {
            // The script's sessions start from these settings, without the
            // REPL's own telemetry files.
            let mut base = host.config().clone();
            base.telemetry.csv = Default::default();
            base.telemetry.route_trace = Default::default();
            let options = crate::script::ScriptOptions { args, base, ..crate::script::ScriptOptions::default() };
            interrupt::clear();
            let result = crate::script::run_file(std::path::Path::new(&file), &options);
            // A Ctrl-C that stopped the script must not stop the next turn.
            interrupt::clear();
            result.map_err(|e| e.to_string())?;
        }
        Input::Help => print!("{}", help()),
    }
    Ok(())
}

/// One chat turn (the reply to a message, beginning with its prefill, or
/// with none the reply after tool results), streamed to stdout; Ctrl-C
/// stops it.
fn chat(host: &mut Host, text: Option<(&str, &str)>, style: &Style) -> Result<Turn, String> {
    let abort = host.abort_handle();
    let stdout = std::io::stdout();
    let mut last: Option<Kind> = None;
    let mut on_event = |event: HostEvent<'_>| {
        if interrupt::requested() {
            abort.abort();
        }
        match event {
            HostEvent::Text { kind, text } => {
                let mut out = stdout.lock();
                let _ = match (kind, style.colour) {
                    (Kind::Reasoning, true) => write!(out, "\x1b[2m{text}\x1b[0m"),
                    (Kind::Reasoning, false) if last != Some(Kind::Reasoning) => write!(out, "thinking: {text}"),
                    (Kind::Answer, false) if last == Some(Kind::Reasoning) => write!(out, "\n{text}"),
                    _ => write!(out, "{text}"),
                };
                let _ = out.flush();
                last = Some(kind);
            }
            HostEvent::Notice(n) => eprintln!("\nnote: {n}"),
            HostEvent::ToolCall(call) if style.colour => println!("\n\x1b[33mtool call\x1b[0m {call}"),
            HostEvent::ToolCall(call) => println!("\ntool call: {call}"),
            HostEvent::Prefill(_) | HostEvent::Step(_) => {}
        }
    };
    let turn = match text {
        Some((text, start)) => {
            // The prefill is the reply's beginning: shown first.
            print!("{start}");
            host.chat_from(text, start, &mut on_event)
        }
        None => host.continue_reply(&mut on_event),
    };
    let turn = turn.map_err(|e| e.to_string())?;
    println!();
    if turn.generation.aborted {
        eprintln!("(stopped)");
    }
    // A reply a limit ended is marked, reasoning included (a reply cut
    // inside its reasoning showed only `thinking: ...`).
    if let Some(cut) = turn.ending.cut_notice() {
        eprintln!("note: {cut}");
    }
    Ok(turn)
}

/// The per-turn summary line.
fn turn_line(turn: &Turn, host: &Host) -> String {
    let s = &turn.generation.summary;
    let (used, n_ctx) = host.context_use();
    let mut line = format!(
        "[{} tokens, {} tok/s | prompt: {} decoded, {} reused | context {used}/{n_ctx}",
        s.decode_tokens + u64::from(!turn.generation.tokens.is_empty()),
        s.decode_tps().map_or("n/a".into(), |t| format!("{t:.1}")),
        turn.prefilled,
        turn.generation.reused_tokens,
    );
    if let Some(m) = s.mib_per_token().filter(|_| s.streaming) {
        line.push_str(&format!(" | {m:.2} MiB/token"));
    }
    if let Some(h) = s.hit_rate_pct() {
        line.push_str(&format!(" | hit {h:.1}%"));
    }
    line.push(']');
    line
}

/// A setting's current value as text.
fn setting_value(host: &Host, key: &str) -> String {
    host.config().resolved_pairs().into_iter().find(|(k, _)| k == key).map_or_else(String::new, |(_, v)| v)
}

/// `:show config|stats|routing`.
pub fn show(host: &Host, what: &str) -> String {
    match what {
        "config" => toml::to_string(host.config()).unwrap_or_else(|e| format!("error: {e}\n")),
        "stats" => stats(host.totals(), host),
        _ => routing(host),
    }
}

fn stats(t: &RunSummary, host: &Host) -> String {
    let (used, n_ctx) = host.context_use();
    let mut out = String::new();
    out.push_str(&format!("turns:     {}\n", host.conversation().messages.len() / 2));
    out.push_str(&format!("context:   {used} of {n_ctx} tokens\n"));
    out.push_str(&t.to_string());
    out
}

/// The last decoded token's routing, layer by layer.
fn routing(host: &Host) -> String {
    let Some(step) = host.last_step() else { return "no token decoded yet\n".into() };
    if step.trace.rows.is_empty() {
        return "no routing observed (routing is seen only while streaming: :set moe.stream true)\n".into();
    }
    let mut out =
        format!("routing of the last token (turn {}, step {}); * = cache hit, x = dropped\n", step.turn, step.step);
    let mut layers: Vec<u32> = step.trace.rows.iter().map(|r| r.layer).collect();
    layers.dedup();
    for layer in layers {
        let rows: Vec<_> = step.trace.rows.iter().filter(|r| r.layer == layer && r.token == 0).collect();
        let hits = rows.iter().filter(|r| r.hit).count();
        let experts: Vec<String> = rows
            .iter()
            .map(|r| format!("{}{}{}", r.expert, if r.hit { "*" } else { "" }, if r.dropped { "x" } else { "" }))
            .collect();
        out.push_str(&format!("  layer {layer:>3}: {:<40} {hits}/{} hits\n", experts.join(" "), rows.len()));
    }
    out
}
