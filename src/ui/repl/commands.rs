//! The REPL's `:commands`: one table that parsing, `:help`, completion and
//! hints all read, and the completion and hint logic as plain functions.

use crate::config::RunConfig;

/// One REPL command: its name, its arguments, what it does.
pub struct CommandSpec {
    /// Name without the colon.
    pub name: &'static str,
    /// Argument synopsis, shown as a hint and in `:help`.
    pub args: &'static str,
    /// One line for `:help`.
    pub help: &'static str,
}

/// Every command, in `:help` order.
pub const COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "set",
        args: "KEY VALUE",
        help: "change a setting (bmoe.toml names: section.key, or the bare key)",
    },
    CommandSpec {
        name: "show",
        args: "config|stats|routing",
        help: "the settings, the totals so far, or the last token's routing",
    },
    CommandSpec { name: "think", args: "on|off", help: "let the model reason before answering, or not" },
    CommandSpec {
        name: "system",
        args: "[TEXT]",
        help: "set the system prompt (no text: show it; `:system -` clears it)",
    },
    CommandSpec {
        name: "prefill",
        args: "TEXT",
        help: "begin the next reply with TEXT: the model goes on from it (`:prefill -` drops it)",
    },
    CommandSpec {
        name: "tool",
        args: "RESULT",
        help: "answer the last reply's next tool call; once all are answered, the model goes on",
    },
    CommandSpec { name: "reset", args: "", help: "start a new conversation (the expert cache stays warm)" },
    CommandSpec { name: "save", args: "FILE", help: "save the conversation as JSON" },
    CommandSpec { name: "load", args: "FILE", help: "load a conversation saved with :save" },
    CommandSpec { name: "trace", args: "FILE|off", help: "write the route trace of the next turns to FILE" },
    CommandSpec {
        name: "run",
        args: "FILE.rhai [ARGS...]",
        help: "run an experiment script (its opens start from these settings; files go to ./bmoe-out)",
    },
    CommandSpec { name: "help", args: "", help: "this list" },
    CommandSpec { name: "quit", args: "", help: "leave (Ctrl-D does too)" },
];

/// `:show` targets.
pub const SHOW_TARGETS: &[&str] = &["config", "stats", "routing"];

/// A parsed input line.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Nothing to do.
    Empty,
    /// A chat turn.
    Chat(String),
    /// `:set KEY VALUE`
    Set(String, String),
    /// `:show WHAT`
    Show(String),
    /// `:think on|off`
    Think(bool),
    /// `:system` (None shows it; Some("") clears it)
    System(Option<String>),
    /// `:prefill TEXT` (empty: drop it)
    Prefill(String),
    /// `:tool RESULT`
    Tool(String),
    /// `:reset`
    Reset,
    /// `:save FILE`
    Save(String),
    /// `:load FILE`
    Load(String),
    /// `:trace FILE`, or `:trace off` (an empty path)
    Trace(String),
    /// `:run FILE ARGS...`
    Run(String, Vec<String>),
    /// `:help`
    Help,
    /// `:quit`
    Quit,
}

/// Parses one line. A line not starting with `:` is a chat turn.
pub fn parse(line: &str) -> Result<Input, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(Input::Empty);
    }
    let Some(command) = line.strip_prefix(':') else { return Ok(Input::Chat(line.to_string())) };
    let (name, rest) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
    let rest = rest.trim();
    let usage = |name: &str| {
        let spec = COMMANDS.iter().find(|c| c.name == name).expect("known command");
        format!("usage: :{} {}", spec.name, spec.args)
    };
    let input = match name {
        "set" => match rest.split_once(char::is_whitespace) {
            Some((key, value)) => Input::Set(key.to_string(), value.trim().to_string()),
            None => return Err(usage("set")),
        },
        "show" if SHOW_TARGETS.contains(&rest) => Input::Show(rest.to_string()),
        "show" => return Err(usage("show")),
        "think" => match rest {
            "on" => Input::Think(true),
            "off" => Input::Think(false),
            _ => return Err(usage("think")),
        },
        "system" if rest.is_empty() => Input::System(None),
        "system" if rest == "-" => Input::System(Some(String::new())),
        "system" => Input::System(Some(rest.to_string())),
        "tool" if !rest.is_empty() => Input::Tool(rest.to_string()),
        "prefill" if rest == "-" => Input::Prefill(String::new()),
        "prefill" if !rest.is_empty() => Input::Prefill(rest.to_string()),
        "reset" => Input::Reset,
        "save" if !rest.is_empty() => Input::Save(rest.to_string()),
        "load" if !rest.is_empty() => Input::Load(rest.to_string()),
        "trace" if rest == "off" => Input::Trace(String::new()),
        "trace" if !rest.is_empty() => Input::Trace(rest.to_string()),
        "run" if !rest.is_empty() => {
            let mut words = rest.split_whitespace().map(str::to_string);
            let file = words.next().expect("rest is not empty");
            Input::Run(file, words.collect())
        }
        "save" | "load" | "trace" | "run" | "tool" | "prefill" => return Err(usage(name)),
        "help" | "h" | "?" => Input::Help,
        "quit" | "q" | "exit" => Input::Quit,
        _ => {
            let names: Vec<String> = COMMANDS.iter().map(|c| format!(":{}", c.name)).collect();
            return Err(format!("unknown command `:{name}`; commands: {}", names.join(" ")));
        }
    };
    Ok(input)
}

/// The `:help` text.
pub fn help() -> String {
    let mut out = String::from("Type a message to chat. Commands:\n");
    for c in COMMANDS {
        let synopsis = format!(":{} {}", c.name, c.args);
        out.push_str(&format!("  {synopsis:<28} {}\n", c.help));
    }
    out.push_str("Ctrl-C stops a reply; Ctrl-D or :quit leaves.\n");
    out
}

/// Completions for `line` with the cursor at `pos`: where the completed
/// word starts and the candidates. `plugins` are the bundled plugin names.
pub fn completions(line: &str, pos: usize, plugins: &[&str]) -> (usize, Vec<String>) {
    let line = &line[..pos];
    let word_start = line.rfind(char::is_whitespace).map_or(0, |i| i + 1);
    let word = &line[word_start..];
    let words: Vec<&str> = line[..word_start].split_whitespace().collect();
    let pick = |options: Vec<String>| options.into_iter().filter(|o| o.starts_with(word)).collect::<Vec<_>>();
    let candidates = match words.as_slice() {
        [] if line.starts_with(':') => pick(COMMANDS.iter().map(|c| format!(":{}", c.name)).collect()),
        [":set"] => {
            let mut keys = RunConfig::keys();
            // Bare names too, where only one section has them.
            let bare: Vec<String> = keys
                .iter()
                .filter_map(|k| k.split_once('.').map(|(_, b)| b.to_string()))
                .filter(|b| RunConfig::resolve_key(b).is_ok())
                .collect();
            keys.extend(bare);
            pick(keys)
        }
        [":set", key] if key.ends_with("draft_plugin") || key.ends_with("drop_plugin") => {
            pick(plugins.iter().map(|p| p.to_string()).collect())
        }
        [":set", key] if RunConfig::resolve_key(key).is_ok_and(|k| k == "chat.think") => {
            pick(vec!["true".into(), "false".into()])
        }
        [":set", key] if RunConfig::resolve_key(key).is_ok_and(|k| k == "moe.stream") => {
            pick(vec!["auto".into(), "true".into(), "false".into()])
        }
        [":show"] => pick(SHOW_TARGETS.iter().map(|s| s.to_string()).collect()),
        [":think"] => pick(vec!["on".into(), "off".into()]),
        _ => Vec::new(),
    };
    (word_start, candidates)
}

/// The grey text shown after the cursor: the rest of a command being typed
/// and its arguments, or the arguments of a command typed in full.
pub fn hint(line: &str, pos: usize) -> Option<String> {
    if pos < line.len() || !line.starts_with(':') {
        return None;
    }
    let typed = &line[1..];
    if typed.contains(char::is_whitespace) {
        return None;
    }
    let matches: Vec<&CommandSpec> = COMMANDS.iter().filter(|c| c.name.starts_with(typed)).collect();
    match matches[..] {
        [c] if c.args.is_empty() => Some(c.name[typed.len()..].to_string()),
        [c] => Some(format!("{} {}", &c.name[typed.len()..], c.args)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        assert_eq!(parse("  hello there "), Ok(Input::Chat("hello there".into())));
        assert_eq!(parse(""), Ok(Input::Empty));
        assert_eq!(parse(":set moe.cache_mb 512"), Ok(Input::Set("moe.cache_mb".into(), "512".into())));
        assert_eq!(
            parse(":set chat.system You are terse."),
            Ok(Input::Set("chat.system".into(), "You are terse.".into()))
        );
        assert_eq!(parse(":think off"), Ok(Input::Think(false)));
        assert_eq!(parse(":system -"), Ok(Input::System(Some(String::new()))));
        assert_eq!(parse(":trace off"), Ok(Input::Trace(String::new())));
        assert_eq!(parse(":q"), Ok(Input::Quit));
        assert_eq!(parse(":set temp").unwrap_err(), "usage: :set KEY VALUE");
        assert_eq!(parse(":show everything").unwrap_err(), "usage: :show config|stats|routing");
        assert!(parse(":frobnicate").unwrap_err().contains("unknown command `:frobnicate`"));
    }

    #[test]
    fn completes_commands_settings_and_plugins() {
        let plugins = ["ngram", "ngram-multi", "suffix", "drop-cold"];
        assert_eq!(
            completions(":s", 2, &plugins),
            (0, vec![":set".into(), ":show".into(), ":system".into(), ":save".into()])
        );
        let (start, keys) = completions(":set moe.cache_m", 16, &plugins);
        assert_eq!((start, keys), (5, vec!["moe.cache_mb".to_string()]));
        let (_, bare) = completions(":set cache", 10, &plugins);
        assert_eq!(bare, ["cache_ceil_mb", "cache_mb", "cache_policy"]);
        let (start, names) = completions(":set draft_plugin ng", 20, &plugins);
        assert_eq!((start, names), (18, vec!["ngram".to_string(), "ngram-multi".to_string()]));
        assert_eq!(completions(":show r", 7, &plugins).1, ["routing"]);
        assert_eq!(completions(":think o", 8, &plugins).1, ["on", "off"]);
        assert!(completions("hello wor", 9, &plugins).1.is_empty());
    }

    #[test]
    fn hints_the_rest_of_a_command() {
        assert_eq!(hint(":se", 3).as_deref(), Some("t KEY VALUE"));
        assert_eq!(hint(":res", 4).as_deref(), Some("et"));
        assert_eq!(hint(":show", 5).as_deref(), Some(" config|stats|routing"));
        assert_eq!(hint(":s", 2), None, "ambiguous");
        assert_eq!(hint("hello", 5), None);
        assert_eq!(hint(":set x", 6), None);
    }
}
