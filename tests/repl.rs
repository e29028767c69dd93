//! `bmoe repl` driven through a pipe, as a script would: turns, settings,
//! state, a bad setting and a bad template (the REPL goes on), and a
//! conversation saved and loaded back.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use bmoe::synth::Arch;
use common::*;

/// Runs the REPL on `model` with `script` on stdin.
fn repl(model: &Path, extra: &[&str], script: &str) -> Output {
    repl_in(Path::new("."), model, extra, script)
}

/// Runs the REPL in directory `cwd`.
fn repl_in(cwd: &Path, model: &Path, extra: &[&str], script: &str) -> Output {
    let _serial = llama_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["repl", "-m", model.to_str().unwrap(), "-n", "8", "-t", "1"])
        .args(extra)
        .current_dir(cwd)
        .env("XDG_DATA_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start bmoe repl");
    child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "repl failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn qwen3_model(dir: &Path) -> std::path::PathBuf {
    let source = bmoe::chat::named_template("qwen3").unwrap().to_string();
    write_tiny(dir, "m.gguf", Arch::Qwen3Moe, |s| s.chat_template = Some(source))
}

#[test]
fn turns_settings_and_state_over_a_pipe() {
    let dir = tempdir();
    let m = qwen3_model(dir.path());
    let conv = dir.path().join("conv.json");
    let trace = dir.path().join("turn2.trace");
    let script = format!(
        "Hello there\n\
         :trace {}\n\
         :set temp 0.7\n\
         :set cache_gb 3\n\
         :set moe.io_threads 0\n\
         :frobnicate\n\
         :show config\n\
         Second turn\n\
         :trace off\n\
         :show routing\n\
         :show stats\n\
         :save {}\n\
         :reset\n\
         :show stats\n\
         :load {}\n\
         :show stats\n\
         :quit\n\
         never read\n",
        trace.display(),
        conv.display(),
        conv.display()
    );
    let out = repl(&m, &["--moe-stream", "--cache-mb", "0.5"], &script);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // No prompt and no colour on a pipe.
    assert!(!stdout.contains("bmoe> ") && !stdout.contains('\x1b'), "{stdout}");
    // Two turns, each with its summary line on stderr.
    let summaries: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[') && l.contains("tok/s")).collect();
    assert_eq!(summaries.len(), 2, "{stderr}");
    assert!(summaries[1].contains("reused"), "{stderr}");
    assert!(stderr.contains("generate.temp = 0.7 (from the next turn)"), "{stderr}");
    // Bad input: a clear error each, and the REPL went on.
    assert!(
        stderr.contains("error: unknown setting `cache_gb`; settings are:") && stderr.contains("moe.cache_mb"),
        "{stderr}"
    );
    assert!(stderr.contains("error: moe.io_threads: must be between 1 and 64"), "{stderr}");
    assert!(stderr.contains("error: unknown command `:frobnicate`"), "{stderr}");
    // :show config prints the settings as TOML, with the live change.
    assert!(stdout.contains("[generate]") && stdout.contains("temp = 0.7"), "{stdout}");
    // :show routing: the last token's experts in each of the 4 layers.
    assert_eq!(stdout.lines().filter(|l| l.trim_start().starts_with("layer ")).count(), 4, "{stdout}");
    // :show stats before the reset, after it, and after loading the saved conversation.
    let turns: Vec<&str> = stdout.lines().filter(|l| l.starts_with("turns:")).collect();
    assert_eq!(turns, ["turns:     2", "turns:     0", "turns:     2"], "{stdout}");
    // The saved conversation round-trips.
    let saved = bmoe::chat::Conversation::load(&conv).unwrap();
    assert_eq!(saved.messages.len(), 4);
    assert_eq!(saved.messages[0].content, "Hello there");
    assert!(stderr.contains("loaded 4 messages"), "{stderr}");
    // The route trace holds the second turn only: 4 layers x 2 experts per decoded token.
    let rows = std::fs::read_to_string(&trace).unwrap();
    let decode_rows = rows.lines().filter(|l| l.split(',').nth(1) == Some("1")).count();
    assert!(decode_rows > 0 && decode_rows % 8 == 0, "{decode_rows} decode rows");
    assert!(rows.lines().all(|l| l.starts_with('#') || l.starts_with("turn,") || l.starts_with("1,")), "turn 1 only");
    // Nothing after :quit was read as a turn.
    assert!(!stderr.contains("never read"));
}

#[test]
fn a_bad_template_is_reported_and_the_repl_goes_on() {
    let dir = tempdir();
    let m = qwen3_model(dir.path());
    let bad = dir.path().join("bad.jinja");
    std::fs::write(&bad, "{% for m in messages %}\n{{ m.content }\n{% endfor %}").unwrap();
    let script = format!(":set chat.template {}\nStill works\n:think off\nAnd without thinking\n", bad.display());
    let out = repl(&m, &[], &script);
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.jinja, line 2: syntax error"), "{stderr}");
    assert_eq!(stderr.lines().filter(|l| l.starts_with('[') && l.contains("tok/s")).count(), 2, "{stderr}");
    assert!(stderr.contains("thinking off"), "{stderr}");
}

#[test]
fn run_executes_a_script_whose_sessions_start_from_the_repl_settings() {
    let dir = tempdir();
    let m = qwen3_model(dir.path());
    let script = dir.path().join("s.rhai");
    std::fs::write(
        &script,
        "print(`args ${ARGS}`);\nlet s = open(\"\");\nlet r = s.generate(\"hi\", 4);\n\
         print(`ran ${r.tokens} tokens, threads ${s.config()[\"generate.threads\"]}`);\n\
         write_csv(\"r.csv\", r.per_token);\n",
    )
    .unwrap();
    let input = format!(":run {} first second\n:run missing.rhai\nHello\n", script.display());
    let out = repl_in(dir.path(), &m, &[], &input);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("args [\"first\", \"second\"]"), "{stdout}");
    assert!(stdout.contains("ran 4 tokens, threads 1"), "{stdout}");
    assert!(dir.path().join("bmoe-out/r.csv").is_file());
    // A missing script is an error; the REPL goes on to the next turn.
    assert!(stderr.contains("missing.rhai") && stderr.contains("reading the script"), "{stderr}");
}

/// `:prefill` begins the next reply: the model goes on from it, the reply
/// shown starts with it, and the conversation keeps one assistant message
/// holding both; `generate --chat --prefill` continues the same way, its
/// logits those of the REPL's turn.
#[test]
fn a_prefill_begins_the_next_reply_and_the_model_goes_on_from_it() {
    let dir = tempdir();
    let m = qwen3_model(dir.path());
    let conv = dir.path().join("conv.json");
    let script = format!(":prefill Sure, here\nWrite a poem\n:save {}\nAgain\n:prefill -\n:quit\n", conv.display());
    let out = repl(&m, &["--no-think"], &script);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(stderr.contains("the next reply begins with: Sure, here"), "{stderr}");
    assert!(stdout.starts_with("Sure, here"), "{stdout}");
    let saved = bmoe::chat::Conversation::load(&conv).unwrap();
    let roles: Vec<&str> = saved.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant"], "one assistant message for the prefill and its rest");
    let message = &saved.messages[1].content;
    assert!(message.starts_with("Sure, here") && message.len() > "Sure, here".len(), "{message:?}");
    // One prefill, one reply: the second turn's begins afresh.
    assert_eq!(stdout.matches("Sure, here").count(), 1, "{stdout}");
    // generate --chat --prefill: stdout is what the model adds, the same
    // text the REPL's reply went on with.
    let _serial = common::llama_lock();
    let generated = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-q", "-m", m.to_str().unwrap(), "-n", "8", "-t", "1", "--chat", "--no-think"])
        .args(["-p", "Write a poem", "--prefill", "Sure, here"])
        .output()
        .unwrap();
    assert!(generated.status.success(), "{}", text(&generated.stderr));
    let rest = text(&generated.stdout);
    assert_eq!(
        format!("Sure, here{}", rest.trim_end_matches('\n')),
        message.trim_end(),
        "the REPL and generate differ"
    );
    let plain = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-q", "-m", m.to_str().unwrap(), "-n", "8", "-t", "1", "--chat", "--no-think"])
        .args(["-p", "Write a poem"])
        .output()
        .unwrap();
    assert_ne!(text(&plain.stdout), rest, "the prefill changed nothing");
}
