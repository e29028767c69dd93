//! `bmoe chat` end to end in a real terminal (tmux): type a prompt, see
//! tokens arrive and the routing panel change, open help, stop a reply with
//! Esc, change a setting, send another turn, quit with Ctrl-C twice, and
//! find the terminal restored; and the same after a panic.
//!
//! Every wait polls the screen for the text it expects; the deadline only
//! turns a hang into a failure. Without tmux the tests say so and pass,
//! unless `BMOE_REQUIRE_TMUX=1` (CI installs tmux and sets it).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use bmoe::synth::Arch;
use common::*;

/// How long any one expected screen may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(180);

/// A tmux server of its own with one shell window.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(dir: &Path, width: u16, height: u16) -> Tmux {
        let socket = format!("bmoe-e2e-{}-{}", std::process::id(), dir.file_name().unwrap().to_string_lossy());
        let t = Tmux { socket };
        let shell = "env -i PATH=/usr/bin:/bin TERM=xterm-256color HOME=/tmp PS1='$ ' bash --norc --noprofile";
        t.run(&["new-session", "-d", "-x", &width.to_string(), "-y", &height.to_string(), "-c"])
            .arg(dir)
            .arg(shell)
            .status()
            .map(|s| assert!(s.success(), "tmux new-session failed"))
            .unwrap();
        t
    }

    fn run(&self, args: &[&str]) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket]).args(args);
        c
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status().unwrap().success());
    }

    fn type_text(&self, text: &str) {
        assert!(self.run(&["send-keys", "-t", "0", "-l", text]).status().unwrap().success());
    }

    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "0"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn query(&self, format: &str) -> String {
        let out = self.run(&["display-message", "-p", "-t", "0", format]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Polls the screen until `want` holds; returns that screen.
    fn wait(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if want(&screen) {
                return screen;
            }
            assert!(start.elapsed() < DEADLINE, "waited {DEADLINE:?} for {what}; the screen:\n{screen}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for the shell's `EXIT=N` line and returns N.
    fn wait_exit(&self) -> (i32, String) {
        let line = |s: &str| s.lines().find_map(|l| l.strip_prefix("EXIT=")?.trim().parse::<i32>().ok());
        let screen = self.wait("the command to exit", |s| line(s).is_some());
        (line(&screen).unwrap(), screen)
    }

    fn wait_text(&self, text: &str) -> String {
        self.wait(text, |s| s.contains(text))
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]).status();
    }
}

/// The routing panel's layer rows on `screen` (label to the row's end).
fn routing_rows(screen: &str) -> Vec<String> {
    screen.lines().filter_map(|l| l.find("│L0").map(|i| l[i..].to_string())).collect()
}

/// The token count in the routing panel's title.
fn routing_token(screen: &str) -> Option<u64> {
    let at = screen.find("Routing · ")?;
    let rest = &screen[at..];
    let t = rest.find("token ")?;
    rest[t + 6..].split_whitespace().next()?.parse().ok()
}

fn tiny_chat_model(dir: &Path) {
    let template = bmoe::chat::named_template("qwen3").map(str::to_string);
    write_tiny(dir, "tiny.gguf", Arch::Qwen3Moe, |s| s.chat_template = template);
}

/// The shell is back: the alternate screen is gone and the line discipline
/// is out of raw mode again.
fn assert_restored(t: &Tmux) {
    assert_eq!(t.query("#{alternate_on}"), "0", "still on the alternate screen");
    t.type_text("stty -a | tr ' ' '\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ,; echo");
    t.keys(&["Enter"]);
    let output = |s: &str| {
        s.lines().find(|l| l.ends_with("icanon,") || l.contains("icanon,") && !l.contains('|')).map(str::to_string)
    };
    let screen = t.wait("stty output", |s| output(s).is_some());
    assert_eq!(output(&screen).unwrap(), "icanon,echo,", "terminal left raw:\n{screen}");
}

#[test]
fn chat_in_a_real_terminal() {
    if !requires::tmux("chat_in_a_real_terminal") {
        return;
    }
    let dir = tempdir();
    tiny_chat_model(dir.path());
    let t = Tmux::start(dir.path(), 120, 36);
    // A long reply (the context allows thousands of tokens) so that Esc
    // lands while it is being written, however fast the machine.
    let bmoe = env!("CARGO_BIN_EXE_bmoe");
    t.type_text(&format!(
        "{bmoe} chat -m tiny.gguf --moe-stream --cache-mb 0.5 -t 1 -c 32768 -n 30000 --csv chat.csv; echo EXIT=$?"
    ));
    t.keys(&["Enter"]);
    t.wait_text("Type a message and press Enter");
    assert_eq!(t.query("#{alternate_on}"), "1");

    t.type_text("hello experts");
    t.keys(&["Enter"]);
    let first = t.wait("tokens and routing", |s| routing_token(s).is_some_and(|n| n >= 2) && s.contains("bmoe "));
    let rows_before = routing_rows(&first);
    assert_eq!(rows_before.len(), 4, "{first}");
    let token_before = routing_token(&first).unwrap();
    t.wait("the routing panel to change", |s| {
        routing_token(s).is_some_and(|n| n > token_before) && routing_rows(s) != rows_before
    });

    // Help opens over the running reply and closes again.
    t.keys(&["?"]);
    t.wait_text("Help (Esc closes)");
    t.keys(&["Escape"]);
    t.wait("help to close", |s| !s.contains("Help (Esc closes)"));
    // Esc stops the reply; the conversation goes on.
    t.keys(&["Escape"]);
    t.wait_text("stopped (Esc)");

    // Fewer tokens per turn through the settings popup, then a second turn.
    t.keys(&["F2"]);
    t.wait_text("Settings (Enter edits");
    let row = bmoe::host::SETTINGS.iter().position(|s| s.0 == "generate.n_predict").unwrap();
    t.keys(&vec!["Down"; row]);
    t.keys(&["Enter", "C-u"]);
    t.type_text("6");
    t.keys(&["Enter"]);
    t.wait_text("generate.n_predict = 6");
    t.keys(&["Escape"]);
    t.wait("settings to close", |s| !s.contains("Settings (Enter edits"));
    t.type_text("and again");
    t.keys(&["Enter"]);
    t.wait_text("6 tokens ·");

    // Ctrl-C once asks, twice quits.
    t.keys(&["C-c"]);
    t.wait_text("again quits");
    t.keys(&["C-c"]);
    let (code, end) = t.wait_exit();
    assert_eq!(code, 0, "{end}");
    assert!(end.contains("bmoe chat: 2 turns"), "{end}");
    assert_restored(&t);
    // The telemetry file holds both turns' tokens and its trailer.
    let csv = std::fs::read_to_string(dir.path().join("chat.csv")).unwrap();
    assert!(csv.lines().any(|l| l.starts_with("# summary tokens=")), "no trailer:\n{csv}");
}

#[test]
fn the_terminal_is_restored_after_a_panic() {
    if !requires::tmux("the_terminal_is_restored_after_a_panic") {
        return;
    }
    let dir = tempdir();
    tiny_chat_model(dir.path());
    let t = Tmux::start(dir.path(), 100, 30);
    let bmoe = env!("CARGO_BIN_EXE_bmoe");
    t.type_text(&format!("BMOE_CHAT_TEST_PANIC=1 {bmoe} chat -m tiny.gguf -t 1; echo EXIT=$?"));
    t.keys(&["Enter"]);
    let (code, screen) = t.wait_exit();
    assert_eq!(code, 101, "{screen}");
    assert!(screen.contains("BMOE_CHAT_TEST_PANIC is set"), "the panic message is shown:\n{screen}");
    assert_restored(&t);
}

#[test]
fn chat_refuses_a_pipe() {
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe")).args(["chat"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs a terminal") && err.contains("bmoe repl"), "{err}");
}
