//! `bmoe serve` for the server tests: the real binary on a free port, a
//! ureq agent that reads every status, and the client Python environment.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// Servers of one test binary run side by side, except one that times
/// its streams, which runs alone.
static MACHINE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Servers this thread runs under a shared hold: a second one takes no
    /// hold of its own (a second read could queue behind a waiting writer
    /// and never be granted, the first read being this thread's).
    static SHARED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A test's hold on the machine while its server runs.
enum Hold {
    Shared(Option<RwLockReadGuard<'static, ()>>),
    Alone(RwLockWriteGuard<'static, ()>),
}

impl Hold {
    fn shared() -> Hold {
        let nested = SHARED_HERE.with(|n| n.replace(n.get() + 1)) > 0;
        Hold::Shared((!nested).then(|| MACHINE.read().unwrap_or_else(PoisonError::into_inner)))
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Hold::Shared(_) = self {
            SHARED_HERE.with(|n| n.set(n.get() - 1));
        }
    }
}

/// A `bmoe serve` child process, stopped when dropped.
pub struct Serve {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    _hold: Hold,
}

impl Serve {
    /// Starts `bmoe serve -q -m model --port 0` with `args` and waits until
    /// `/health` answers 200.
    pub fn start(model: &Path, args: &[&str]) -> Serve {
        Serve::start_with(model, &[&["-q"], args].concat(), Stdio::inherit())
    }

    /// Starts `bmoe serve -m model --port 0` with `args`, its stderr going
    /// to `stderr`, and waits until `/health` answers 200.
    pub fn start_with(model: &Path, args: &[&str], stderr: Stdio) -> Serve {
        Serve::start_in(model, args, stderr, &[])
    }

    /// As [`Serve::start`], with no other server of this test binary
    /// running while it does (for a test that times the server).
    pub fn start_alone(model: &Path, args: &[&str]) -> Serve {
        let hold = Hold::Alone(MACHINE.write().unwrap_or_else(PoisonError::into_inner));
        Serve::spawn(model, &[&["-q"], args].concat(), Stdio::inherit(), &[], hold)
    }

    /// As [`Serve::start_with`], with `env` set for the server.
    pub fn start_in(model: &Path, args: &[&str], stderr: Stdio, env: &[(&str, &Path)]) -> Serve {
        let hold = Hold::shared();
        Serve::spawn(model, args, stderr, env, hold)
    }

    fn spawn(model: &Path, args: &[&str], stderr: Stdio, env: &[(&str, &Path)], hold: Hold) -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["serve", "--port", "0", "-t", "1", "-m", model.to_str().unwrap()])
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, *v)))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start bmoe serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("a first line").expect("stdout");
        let url = first.split_whitespace().find(|w| w.starts_with("http://")).expect("the URL").to_string();
        // Keep reading stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let server = Serve { child, url, _hold: hold };
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if get(&server.url, "/health", None).0 == 200 {
                return server;
            }
            assert!(Instant::now() < deadline, "bmoe serve never became ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // The hold is let go after the process is gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An agent that returns every status instead of failing on errors.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(600)))
        .build()
        .into()
}

/// `GET url+path` (with a bearer `key`): status and body text.
pub fn get(url: &str, path: &str, key: Option<&str>) -> (u16, String) {
    let mut request = agent().get(format!("{url}{path}"));
    if let Some(key) = key {
        request = request.header("Authorization", format!("Bearer {key}"));
    }
    match request.call() {
        Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
        Err(_) => (0, String::new()),
    }
}

/// The Python environment with the `openai` and `selenium` packages
/// (made once by scripts/client-venv.sh).
pub fn client_python() -> PathBuf {
    static MADE: Mutex<()> = Mutex::new(());
    let _once = MADE.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(root.join("scripts/client-venv.sh")).output().expect("run scripts/client-venv.sh");
    assert!(out.status.success(), "scripts/client-venv.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    root.join(String::from_utf8(out.stdout).unwrap().trim())
}
