//! `bmoe serve`'s chat page in a real browser: headless Chromium, driven by
//! Selenium (tests/clients/page_check.py), sends a message, waits for the
//! streamed reply and for the routing panel's step events, and saves a
//! screenshot under the target directory.
//!
//! Needs Debian's `chromium` and `chromium-driver` packages (CI installs
//! them); without them the test fails and says so.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bmoe::synth::Arch;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A `bmoe serve` child process, stopped when dropped.
struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    url: String,
}

impl Serve {
    /// Starts `bmoe serve -m model --port 0` with `args` and waits until
    /// `/health` answers 200.
    fn start(model: &Path, args: &[&str]) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["serve", "-q", "--port", "0", "-t", "1", "-m", model.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start bmoe serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").expect("stdout");
        let url = first.split_whitespace().find(|w| w.starts_with("http://")).expect("the URL").to_string();
        // Keep reading stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let server = Serve { child, url };
        let deadline = Instant::now() + Duration::from_secs(300);
        while health(&server.url) != 200 {
            assert!(Instant::now() < deadline, "bmoe serve never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The status code of `GET /health` (0 when nothing answered).
fn health(url: &str) -> u16 {
    let Ok(mut s) = TcpStream::connect(url.trim_start_matches("http://")) else { return 0 };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").is_err() {
        return 0;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0)
}

/// The Python of the client virtual environment (with selenium), made once
/// by scripts/client-venv.sh.
fn client_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/client-venv.sh")).output().expect("run scripts/client-venv.sh");
    assert!(out.status.success(), "scripts/client-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    root.join(String::from_utf8(out.stdout).unwrap().trim())
}

#[test]
fn the_chat_page_streams_a_reply_and_shows_the_routing_panel() {
    for (path, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(path).exists(),
            "{path} is missing: this test drives the chat page in headless Chromium; install Debian's \
             `chromium` and `chromium-driver` packages (`apt-get install chromium chromium-driver`; CI \
             installs them) and run it again (`{package}` provides {path})"
        );
    }
    let python = client_python();
    let dir = common::tempdir();
    let model = common::write_tiny(dir.path(), "serve.gguf", Arch::Qwen3Moe, |_| {});
    // Streaming with a small cache, so the panel has reads, hits and residency to show.
    let server = Serve::start(&model, &["--moe-stream", "--cache-mb", "1", "-n", "48"]);

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-page.png");
    let _ = std::fs::remove_file(&shot);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/page_check.py");
    let started = Instant::now();
    let out = Command::new(python).arg(script).arg(&server.url).arg(&shot).output().expect("run page_check.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the chat page check failed (after {:.1} s):\n{stdout}{}",
        started.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{stdout}");

    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    // A blank 1280x900 PNG compresses to a few KB; a drawn page is far larger.
    assert!(size > 20_000, "the screenshot {} is {size} bytes: too small to show the page", shot.display());
}
