//! Shared helpers for the integration tests: tiny models written to disk,
//! sessions run resident and streamed, and a bitwise comparison.

#![allow(dead_code)]

pub mod requires;
pub mod serve;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bmoe::engine::{
    CacheBudget, DenseWeights, Event, GenerateRequest, Generation, Session, SessionOptions, StepReport, StreamOptions,
};
use bmoe::llama::Sampling;
use bmoe::moe::predict::ReadAhead;
use bmoe::synth::{self, Arch, ModelSpec, Preset};

/// Tests that run llama.cpp take this lock: ggml's threadpools spin while
/// waiting, so parallel runs on a small machine slow each other down 40x.
pub fn llama_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Plugin limits for tests: a 16 MiB memory cap and a 20 ms CPU budget per
/// call, except for the memory bomb (`mode=grow`), which gets a CPU budget it
/// cannot use up before it reaches its memory cap (it grows 16 MiB per step
/// and touches nothing), so only the fault it provokes can happen.
pub fn hostile_limits(mode: &str) -> bmoe::policy::wasm::Limits {
    let call_ms = if mode == "grow" { 60_000 } else { 20 };
    bmoe::policy::wasm::Limits { call_ms, memory_bytes: 16 << 20 }
}

/// A temporary directory on the target's filesystem (so O_DIRECT works).
pub fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

/// The tiny preset of `arch`, adjusted by `edit`, written under `dir`.
pub fn write_tiny(dir: &Path, name: &str, arch: Arch, edit: impl FnOnce(&mut ModelSpec)) -> PathBuf {
    let mut spec = ModelSpec::preset(Preset::Tiny, arch);
    edit(&mut spec);
    let path = dir.join(name);
    let report =
        synth::write_model(&spec, &path, &mut |_, _| std::ops::ControlFlow::Continue(())).expect("write model");
    report.paths[0].clone()
}

/// Session options for a gate run. One compute thread: ggml's threads
/// spin-wait for each other at every graph node, so two of them on a machine
/// with a busy core run many times slower (`two_compute_threads` in the
/// gates covers the multi-threaded path).
pub fn options(model: &Path, stream: Option<StreamOptions>) -> SessionOptions {
    SessionOptions {
        model: model.to_path_buf(),
        threads: 1,
        tune: false,
        ctx_size: 512,
        batch: 64,
        ubatch: 64,
        n_expert_used: None,
        stream,
        repack: Default::default(),
        mtp: None,
        rpc: None,
        sequences: 1,
        // What a single-sequence front end runs by default: llama.cpp's
        // fastest kernels (tests/sequences.rs gates the invariant ones).
        batch_invariant: false,
    }
}

/// Streaming with the cache off.
pub fn stream0(lanes: usize, o_direct: bool) -> Option<StreamOptions> {
    Some(StreamOptions {
        cache: CacheBudget::Off,
        cache_policy: Default::default(),
        dense: DenseWeights::Mmap,
        io_threads: lanes,
        o_direct,
        read_ahead: ReadAhead::default(),
        lean: None,
        io_uring: true,
        recycle_pages: true,
        repacked_copy: None,
        repacked_copy_max_bytes: None,
        route_profile: bmoe::engine::RouteProfileOpen::off(),
    })
}

/// Streaming with an LRU of `bytes`.
pub fn cached(bytes: u64, lanes: usize) -> Option<StreamOptions> {
    Some(StreamOptions {
        cache: CacheBudget::Fixed { bytes, force: true },
        cache_policy: Default::default(),
        dense: DenseWeights::Mmap,
        io_threads: lanes,
        o_direct: true,
        read_ahead: ReadAhead::default(),
        lean: None,
        io_uring: true,
        recycle_pages: true,
        repacked_copy: None,
        repacked_copy_max_bytes: None,
        route_profile: bmoe::engine::RouteProfileOpen::off(),
    })
}

/// The gates' fixed prompt.
pub const PROMPT: &str = "Hello world, this is a streaming test.";

/// Runs one turn per prompt on one session; returns each generation and
/// every decode report.
pub fn run_turns(opts: SessionOptions, prompts: &[&str], n_predict: u32) -> (Vec<Generation>, Vec<StepReport>) {
    let _serial = llama_lock();
    let mut session = Session::open(opts).unwrap_or_else(|e| panic!("open: {e}"));
    let mut reports = Vec::new();
    let gens = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let req = GenerateRequest {
                prompt: (*p).into(),
                n_predict,
                sampling: Sampling::default(),
                continue_context: i > 0,
                keep_logits: true,
                constraint: None,
            };
            session
                .generate(&req, &mut |e| {
                    if let Event::Prefill(r) | Event::Step(r) = e {
                        reports.push(r.clone());
                    }
                })
                .unwrap_or_else(|e| panic!("generate: {e}"))
        })
        .collect();
    (gens, reports)
}

/// One generation of `n_predict` tokens from [`PROMPT`] on an open session
/// (logits kept); returns it and its decode-step reports.
pub fn generate_steps(session: &mut Session, n_predict: u32) -> (Generation, Vec<StepReport>) {
    let req = GenerateRequest {
        prompt: PROMPT.into(),
        n_predict,
        sampling: Sampling::default(),
        continue_context: false,
        keep_logits: true,
        constraint: None,
    };
    let mut reports = Vec::new();
    let generation = session
        .generate(&req, &mut |e| {
            if let Event::Step(r) = e {
                reports.push(r.clone());
            }
        })
        .unwrap_or_else(|e| panic!("generate: {e}"));
    (generation, reports)
}

/// One turn.
pub fn run(opts: SessionOptions, n_predict: u32) -> (Generation, Vec<StepReport>) {
    let (mut g, r) = run_turns(opts, &[PROMPT], n_predict);
    (g.remove(0), r)
}

/// Where two runs first differ, if they do: tokens and every logit bit.
pub fn first_difference(a: &Generation, b: &Generation) -> Option<String> {
    if a.tokens != b.tokens {
        let i = a.tokens.iter().zip(&b.tokens).position(|(x, y)| x != y).unwrap_or(a.tokens.len().min(b.tokens.len()));
        return Some(format!("tokens differ at step {i}: {:?} vs {:?}", a.tokens.get(i), b.tokens.get(i)));
    }
    if a.logits.len() != b.logits.len() {
        return Some(format!("{} vs {} logit vectors", a.logits.len(), b.logits.len()));
    }
    for (step, (x, y)) in a.logits.iter().zip(&b.logits).enumerate() {
        if let Some(i) = x.iter().zip(y).position(|(p, q)| p.to_bits() != q.to_bits()) {
            return Some(format!("logits differ at step {step}, token id {i}: {} vs {}", x[i], y[i]));
        }
    }
    None
}

/// Asserts bitwise identity of tokens and logits.
pub fn assert_identical(reference: &Generation, streamed: &Generation, what: &str) {
    assert!(!reference.tokens.is_empty(), "{what}: nothing generated");
    assert_eq!(reference.logits.len(), reference.tokens.len(), "{what}: one logit vector per token");
    if let Some(d) = first_difference(reference, streamed) {
        panic!("{what}: streamed output is not identical to the resident run: {d}");
    }
}

/// A free TCP port on the loopback interface (bound, then released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `bmoe rpc-server` child process, stopped when dropped.
pub struct Server {
    /// The process.
    pub child: Child,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
    /// Where its output goes.
    log: PathBuf,
}

impl Server {
    /// Starts a server on a free port and waits until it accepts connections.
    pub fn start(dir: &Path) -> Server {
        let port = free_port();
        let log_path = dir.join(format!("server-{port}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        // Not while another test opens a session: a fork in the moment
        // between ggml opening a connection and bmoe marking it
        // close-on-exec would hand the connection to the server.
        let _serial = llama_lock();
        let child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["rpc-server", "--port", &port.to_string(), "--threads", "1"])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start bmoe rpc-server");
        let mut server = Server { child, endpoint: format!("127.0.0.1:{port}"), log: log_path };
        // Ready when it accepts a connection (the server takes the probe as
        // a client that left, and waits for the next). Waits as long as the
        // process runs, with a generous bound against a server that never binds.
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if TcpStream::connect(&server.endpoint).is_ok() {
                return server;
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                let log = std::fs::read_to_string(&server.log).unwrap_or_default();
                panic!("bmoe rpc-server exited with {status} before listening:\n{log}");
            }
            assert!(Instant::now() < deadline, "bmoe rpc-server on {} never listened", server.endpoint);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test that failed shows what its servers said.
        if std::thread::panicking() {
            let state = match self.child.try_wait() {
                Ok(Some(status)) => format!("exited with {status}"),
                _ => "still running".to_string(),
            };
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("--- bmoe rpc-server on {} ({state}):\n{log}---", self.endpoint);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
