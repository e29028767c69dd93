//! Tests that need a system package the README's requirements (cmake and
//! libclang) do not list. When the package is missing such a test writes
//! `NOT RUN`, the reason and the install line, and passes, so `cargo test
//! --release` stays green on a machine with only the requirements. CI
//! installs every package and sets `BMOE_REQUIRE_<NAME>=1`, which turns a
//! missing package into a failure, so nothing CI runs is skipped there.
//!
//! Each check runs the tool rather than looking for a file, so a package
//! that is present but cannot run counts as missing (this is also how
//! `.ci/run` hides them to check the promise: an empty file mounted over
//! each program).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// One optional package: what it is for and how to install it.
struct Optional {
    /// The `BMOE_REQUIRE_*` variable that makes it required.
    require_env: &'static str,
    /// What the test does with it, completing "it ...".
    does: &'static str,
    /// The command that installs it on Debian.
    install: &'static str,
}

const TMUX: Optional = Optional {
    require_env: "BMOE_REQUIRE_TMUX",
    does: "drives bmoe chat in a real terminal with tmux",
    install: "apt-get install tmux",
};

const BROWSER: Optional = Optional {
    require_env: "BMOE_REQUIRE_BROWSER",
    does: "drives the chat page in headless Chromium",
    install: "apt-get install chromium chromium-driver python3-venv",
};

const PYTHON_VENV: Optional = Optional {
    require_env: "BMOE_REQUIRE_PYTHON_VENV",
    does: "drives bmoe serve with the official openai Python package (installed into a venv)",
    install: "apt-get install python3-venv",
};

const WASM_TARGET: Optional = Optional {
    require_env: "BMOE_REQUIRE_WASM_TARGET",
    does: "builds a guest plugin",
    install: "rustup target add wasm32-unknown-unknown",
};

/// Whether `program args` runs and exits with success.
fn runs(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `true` when nothing is `missing`; otherwise says NOT RUN (or fails the
/// test when CI requires the package) and returns `false`.
fn check(test: &str, package: &Optional, missing: &[&str]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let why = format!(
        "{test}: NOT RUN: it {}, and here {} not available ({})",
        package.does,
        match missing {
            [one] => format!("{one} is"),
            many => format!("{} are", many.join(", ")),
        },
        package.install
    );
    assert!(std::env::var_os(package.require_env).is_none(), "{} is set: {why}", package.require_env);
    // Straight to stderr, past the test harness's capture, so it shows.
    let _ = writeln!(std::io::stderr(), "{why}");
    false
}

/// tmux, for the tests that drive `bmoe chat` in a terminal.
pub fn tmux(test: &str) -> bool {
    let missing: &[&str] = if runs("tmux", &["-V"]) { &[] } else { &["tmux"] };
    check(test, &TMUX, missing)
}

/// Where Debian's chromium package installs the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Where Debian's chromium-driver package installs the driver.
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Headless Chromium, its driver and a Python venv, for the chat page's tests.
pub fn browser(test: &str) -> bool {
    let mut missing = Vec::new();
    for (name, path) in [("chromium", CHROMIUM), ("chromedriver", CHROMEDRIVER)] {
        if !runs(path, &["--version"]) {
            missing.push(name);
        }
    }
    if !venv_available() {
        missing.push("python3's venv module");
    }
    check(test, &BROWSER, &missing)
}

/// Whether `python3 -m venv` can make an environment with pip (Debian
/// splits ensurepip, which venv needs, into python3-venv).
fn venv_available() -> bool {
    runs("python3", &["-c", "import ensurepip, venv; ensurepip.version()"])
}

/// Python with its venv module, for the tests that use the `openai` package.
pub fn python_venv(test: &str) -> bool {
    let missing: &[&str] = if venv_available() { &[] } else { &["python3's venv module"] };
    check(test, &PYTHON_VENV, missing)
}

/// The wasm32-unknown-unknown target, for the tests that build a guest plugin.
pub fn wasm_target(test: &str) -> bool {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = Command::new(rustc).args(["--print", "sysroot"]).output().expect("run rustc");
    let sysroot = String::from_utf8(sysroot.stdout).unwrap();
    let installed = Path::new(sysroot.trim()).join("lib/rustlib/wasm32-unknown-unknown/lib").is_dir();
    let missing: &[&str] = if installed { &[] } else { &["the wasm32-unknown-unknown target"] };
    check(test, &WASM_TARGET, missing)
}
