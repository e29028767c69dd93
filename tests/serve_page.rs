//! `bmoe serve`'s chat page in a real browser: headless Chromium, driven by
//! Selenium (tests/clients/page_check.py), sends a message, waits for the
//! streamed reply and for the routing panel's step events, and saves a
//! screenshot under the target directory.
//!
//! Needs Debian's `chromium`, `chromium-driver` and `python3-venv` packages
//! (CI installs and requires them); without them each test says NOT RUN and
//! how to install them (tests/common/requires.rs).

mod common;

use common::requires;
use common::serve::{Serve, client_python};

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use bmoe::synth::Arch;

#[test]
fn the_chat_page_streams_a_reply_and_shows_the_routing_panel() {
    if !requires::browser("the_chat_page_streams_a_reply_and_shows_the_routing_panel") {
        return;
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

/// A browser app served from another origin calls the API (a CORS
/// preflight, then the call) on a server started with `--cors` naming that
/// origin; a server naming another origin is refused by the browser.
#[test]
fn a_page_on_another_origin_calls_the_api_with_cors() {
    if !requires::browser("a_page_on_another_origin_calls_the_api_with_cors") {
        return;
    }
    let python = client_python();
    let dir = common::tempdir();
    let model = common::write_tiny(dir.path(), "serve.gguf", Arch::Qwen3Moe, |_| {});
    let page_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let origin = format!("http://127.0.0.1:{page_port}");
    let allowed = Serve::start(&model, &["--api-key", "sesame", "--cors", &origin]);
    let refused = Serve::start(&model, &["--api-key", "sesame", "--cors", "http://elsewhere.example"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/cors_check.py");
    let out = Command::new(python)
        .arg(script)
        .args([&page_port.to_string(), &allowed.url, &refused.url, "sesame"])
        .output()
        .expect("run cors_check.py");
    assert!(
        out.status.success(),
        "the CORS check failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
