//! Tool calls end to end on the real engine: a grammar built from the tool
//! list makes a random-weight model call a tool in each template family's
//! own format; a Rhai function answers; the model continues after the
//! result. The REPL and `generate --chat` show the call; bad settings are
//! clear errors.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use bmoe::config::RunConfig;
use bmoe::script::{ScriptOptions, run_source};
use bmoe::synth::Arch;
use common::*;

/// One function whose parameters are choices: what the model picks among
/// them is its own, and every pick is a whole call.
const TOOLS: &str = r#"[{"type": "function", "function": {"name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}}]"#;

/// Bundled templates of every tool-call format bmoe reads (two of some).
const FAMILIES: [&str; 11] = [
    "qwen3",
    "granite-4.0",
    "qwen3.5",
    "nemotron-3",
    "seed-oss",
    "glm-4.7",
    "hunyuan",
    "gpt-oss",
    "deepseek-v4",
    "kimi-k2-thinking",
    "kimi-k3",
];

fn model(dir: &Path) -> PathBuf {
    write_tiny(dir, "m.gguf", Arch::Qwen3Moe, |_| {})
}

#[test]
fn a_script_answers_forced_tool_calls_in_every_family() {
    let dir = tempdir();
    let model = model(dir.path());
    let out = dir.path().join("out");
    let families = FAMILIES.map(|f| format!("\"{f}\"")).join(", ");
    let script = format!(
        r#"
let tools = `{TOOLS}`;
let rows = [];
for family in [{families}] {{
    let s = open(ARGS[0], #{{ template: family, n_predict: 400, think: false }});
    let asked = [];
    let r = s.chat("What is the weather in Paris?", #{{ tools: tools, tool_choice: "required",
        answer: |name, args| {{ asked.push(name); `${{args.city}}: 21 degrees ${{args.unit}}` }} }});
    let m = s.messages();
    let tc = m[1].tool_calls[0];
    let roles = "";
    for x in m {{ roles += "/" + x.role; }}
    rows.push(#{{ family: family, replies: r.replies, answered: r.calls.len(), asked: asked.len(),
        roles: roles,
        name: tc.function.name, city: tc.function.arguments.city, unit: tc.function.arguments.unit,
        id: tc.id, result: m[2].content, result_id: m[2].tool_call_id, result_name: m[2].name,
        pending: r.tool_calls.len(), step_limit: r.step_limit }});
}}
write_csv("calls.csv", rows);
"#
    );
    let mut base = RunConfig::default();
    base.generate.threads = 1;
    let options = ScriptOptions {
        out_dir: out.clone(),
        args: vec![model.display().to_string()],
        base,
        ..ScriptOptions::default()
    };
    {
        let _serial = llama_lock();
        run_source("tools.rhai", &script, &options).unwrap_or_else(|e| panic!("{e}"));
    }
    let csv = std::fs::read_to_string(out.join("calls.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<std::collections::HashMap<&str, &str>> =
        lines.map(|l| header.iter().copied().zip(l.split(',')).collect()).collect();
    assert_eq!(rows.len(), FAMILIES.len(), "{csv}");
    for row in rows {
        let family = row["family"];
        // The forced reply called the tool once; the script answered it; the
        // model replied again, freely, and called nothing more.
        assert_eq!((row["replies"], row["answered"], row["asked"], row["pending"]), ("2", "1", "1", "0"), "{family}");
        assert_eq!(row["roles"], "/user/assistant/tool/assistant", "{family}");
        assert_eq!(row["name"], "get_weather", "{family}");
        assert!(["Paris", "Oslo", "Lima"].contains(&row["city"]), "{family}: {row:?}");
        assert!(["celsius", "fahrenheit"].contains(&row["unit"]), "{family}: {row:?}");
        assert_eq!(row["result"], format!("{}: 21 degrees {}", row["city"], row["unit"]), "{family}");
        assert_eq!(row["result_id"], row["id"], "{family}: the result names its call");
        assert_eq!(row["result_name"], "get_weather", "{family}");
        assert_eq!(row["step_limit"], "false", "{family}");
        // Kimi K2 writes its own ids; the others get bmoe's.
        let id = if family == "kimi-k2-thinking" { "functions.get_weather:0" } else { "call_0" };
        assert_eq!(row["id"], id, "{family}");
    }
}

fn tools_file(dir: &Path) -> String {
    let path = dir.join("tools.json");
    std::fs::write(&path, TOOLS).unwrap();
    path.display().to_string()
}

fn bmoe(args: &[&str], stdin: &str) -> Output {
    let _serial = llama_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .env("XDG_DATA_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe");
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn the_repl_and_generate_show_the_call() {
    let dir = tempdir();
    let model = model(dir.path());
    let m = model.to_str().unwrap();
    let tools = tools_file(dir.path());
    let forced = ["--tools", &tools, "--tool-choice", "required", "--no-think", "-t", "1", "-n", "300"];
    let out = bmoe(
        &[&["generate", "-m", m, "--chat", "-p", "Weather?", "--chat-template", "glm-4.7"], &forced[..]].concat(),
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // The call is no answer text: stdout holds it as one JSON object on a line
    // (the OpenAI `tool_calls` entry), none of its markup; stderr shows it parsed.
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "one call, one line, no blank line: {stdout:?}");
    let call: serde_json::Value = serde_json::from_str(lines[0]).expect("a call is a JSON object");
    assert_eq!(call["type"], "function", "{call}");
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    let arguments: serde_json::Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(arguments["city"].is_string() && call["id"].is_string(), "{call}");
    let err = text(&out.stderr);
    assert!(err.contains("bmoe: tool call: get_weather({\"city\": \""), "{err}");
    // The REPL: the call shown, answered with :tool, the model replying after it.
    let saved = dir.path().join("conv.json");
    let script = format!("Weather in Lima?\n:tool 18 C, cloudy\n:tool again\n:save {}\n", saved.display());
    let out = bmoe(&[&["repl", "-m", m, "--chat-template", "gpt-oss"], &forced[..]].concat(), &script);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(shown.contains("tool call: get_weather({\"city\": \""), "{shown}");
    let err = text(&out.stderr);
    assert!(err.contains("answer each call with :tool RESULT"), "{err}");
    assert!(err.contains("answered get_weather({\"city\": \""), "{err}");
    assert!(err.contains("error: the last reply has no call left to answer"), "{err}");
    let conversation = bmoe::chat::Conversation::load(&saved).unwrap();
    let roles: Vec<&str> = conversation.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    assert_eq!(conversation.messages[1].tool_calls[0].function.name, "get_weather");
    assert_eq!(conversation.messages[2].content, "18 C, cloudy");
    assert_eq!(conversation.messages[2].tool_call_id, conversation.messages[1].tool_calls[0].id);
}

#[test]
fn tool_settings_that_cannot_work_are_clear_errors() {
    let dir = tempdir();
    let model = model(dir.path());
    let m = model.to_str().unwrap();
    let tools = tools_file(dir.path());
    let fails = |args: &[&str], expect: &str| {
        let out = bmoe(&[&["generate", "-m", m, "--chat", "-p", "x", "-n", "4", "-t", "1"], args].concat(), "");
        let err = text(&out.stderr);
        assert!(!out.status.success() && err.contains(expect), "{args:?}: {err}");
    };
    fails(&["--tool-choice", "always"], "chat.tool_choice: `always` is not auto or required");
    // The tiny model carries no chat template: nothing would show the tools.
    fails(
        &["--tools", &tools],
        "has no chat template, so nothing shows the tools to the model; give one with --chat-template",
    );
    fails(&["--tool-choice", "required", "--chat-template", "qwen3"], "no tools are shown to the model");
    fails(
        &["--tool-choice", "required", "--tools", &tools, "--chat-template", "lfm2"],
        "writes tool calls in no format bmoe reads",
    );
    let g = dir.path().join("g.gbnf");
    std::fs::write(&g, "root ::= \"x\"\n").unwrap();
    fails(
        &["--tool-choice", "required", "--tools", &tools, "--chat-template", "qwen3", "--grammar", g.to_str().unwrap()],
        "both constrain the reply",
    );
}

#[test]
fn the_documented_forced_call_runs() {
    // The command docs/chat.md shows under "Forcing a call", on a tiny model.
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/chat.md")).unwrap();
    let section = doc.split("### Forcing a call").nth(1).unwrap();
    let block = section.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    assert!(block.contains("--tool-choice required") && block.contains("examples/tools.json"), "{block}");
    let dir = tempdir();
    let model = model(dir.path());
    let command = block.replace("\\\n", " ").replace("bmoe ", &format!("{} ", env!("CARGO_BIN_EXE_bmoe")));
    let command = command.trim().replace("model.gguf", model.to_str().unwrap()) + " -t 1";
    let _serial = llama_lock();
    let out = Command::new("sh").arg("-c").arg(&command).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{command}\n{err}");
    // The example's city is free text of at most 40 characters: a random model fills it.
    assert!(err.contains("bmoe: tool call: get_weather({\"city\": \""), "{err}");
    assert!(err.contains("\"unit\": \"celsius\"})") || err.contains("\"unit\": \"fahrenheit\"})"), "{err}");
}

/// A forced call that `-n` cuts off is named as cut wherever it shows:
/// `generate` says so and ends with `finish:  length`, the REPL's `:tool`
/// says the call was cut (not that there is none), and a script's
/// `s.chat` returns `finish_reason` `length` and `cut` `tool_call` (and
/// `tool_calls` when the call is whole).
#[test]
fn a_call_cut_off_by_the_token_limit_is_said_to_be_cut() {
    let dir = tempdir();
    let model = model(dir.path());
    let m = model.to_str().unwrap();
    let tools = tools_file(dir.path());
    let cut = ["--tools", &tools, "--tool-choice", "required", "--no-think", "-t", "1", "-n", "4"];
    let out =
        bmoe(&[&["generate", "-m", m, "--chat", "-p", "Weather?", "--chat-template", "qwen3"], &cut[..]].concat(), "");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cut off at 4 tokens inside a tool call") && err.contains("raise -n"), "{err}");
    assert!(err.contains("finish:  length (inside a tool call)"), "{err}");
    let out =
        bmoe(&[&["repl", "-m", m, "--chat-template", "qwen3"], &cut[..]].concat(), "Weather in Lima?\n:tool 18 C\n");
    let err = text(&out.stderr);
    assert!(err.contains("tool call was cut off at 4 tokens before it closed"), "{err}");

    let script = format!(
        r#"
let tools = `{TOOLS}`;
let s = open(ARGS[0], #{{ template: "qwen3", n_predict: 4, think: false }});
let r = s.chat("Weather?", #{{ tools: tools, tool_choice: "required" }});
let t = open(ARGS[0], #{{ template: "qwen3", n_predict: 400, think: false }});
let w = t.chat("Weather?", #{{ tools: tools, tool_choice: "required" }});
let g = t.generate("Say", 3);
write_csv("ends.csv", [#{{ cut_reason: r.finish_reason, cut: r.cut, whole_reason: w.finish_reason,
    whole_cut: w.cut ?? "none", plain: g.finish_reason }}]);
"#
    );
    let mut base = RunConfig::default();
    base.generate.threads = 1;
    let out_dir = dir.path().join("out");
    let options =
        ScriptOptions { out_dir: out_dir.clone(), args: vec![m.to_string()], base, ..ScriptOptions::default() };
    {
        let _serial = llama_lock();
        run_source("ends.rhai", &script, &options).unwrap_or_else(|e| panic!("{e}"));
    }
    let csv = std::fs::read_to_string(out_dir.join("ends.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row: std::collections::HashMap<&str, &str> = header.into_iter().zip(lines.next().unwrap().split(',')).collect();
    assert_eq!(row["cut_reason"], "length", "{csv}");
    assert_eq!(row["cut"], "tool_call", "{csv}");
    assert_eq!(row["whole_reason"], "tool_calls", "{csv}");
    assert_eq!(row["whole_cut"], "none", "{csv}");
    assert_eq!(row["plain"], "length", "{csv}");
}
