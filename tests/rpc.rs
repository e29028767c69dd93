//! Layers on RPC servers: two `bmoe rpc-server` processes on this machine
//! hold the last layers of a model, and the run must print the tokens and
//! bitwise the logits of the resident single-process run, streamed or not,
//! with the expert cache off or evicting. Also: what a user sees when a
//! server is missing, busy on its port, or asked for too many layers.

mod common;

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use bmoe::engine::{RpcOptions, SessionOptions};
use bmoe::synth::Arch;
use common::*;

const N: u32 = 24;

/// The model's layer count.
fn layers(model: &std::path::Path) -> u32 {
    bmoe::gguf::ModelFiles::open(model).unwrap().meta().arch_u64("block_count").unwrap() as u32
}

fn with_rpc(opts: SessionOptions, servers: &[&Server], layers: &[u32]) -> SessionOptions {
    SessionOptions {
        rpc: Some(RpcOptions {
            servers: servers.iter().map(|s| s.endpoint.clone()).collect(),
            layers: layers.to_vec(),
        }),
        ..opts
    }
}

#[test]
fn layers_on_two_servers_are_exact_streamed_or_not() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (a, b) = (Server::start(dir.path()), Server::start(dir.path()));
    let n_layer = layers(&m);
    assert!(n_layer >= 3, "the tiny model needs a layer here and one on each server");
    let (reference, _) = run(options(&m, None), N);
    for (what, stream) in
        [("resident", None), ("cache off", stream0(2, true)), ("evicting cache", cached(100 * 1024, 2))]
    {
        let streamed = stream.is_some();
        let opts = with_rpc(options(&m, stream), &[&a, &b], &[1, 1]);
        {
            let _serial = llama_lock();
            let s = bmoe::engine::Session::open(opts.clone()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let placed: Vec<&String> = s.info().notices.iter().filter(|n| n.starts_with("rpc:")).collect();
            assert_eq!(placed.len(), 2, "{what}: {:?}", s.info().notices);
            assert!(placed[0].contains(&format!("layer {} on {}", n_layer - 2, a.endpoint)), "{placed:?}");
            assert!(placed[1].contains(&format!("layer {} and the output head on {}", n_layer - 1, b.endpoint)));
        }
        let (remote, reports) = run(opts, N);
        assert_identical(&reference, &remote, &format!("two RPC servers, {what}"));
        let rows: Vec<_> = reports.iter().flat_map(|r| &r.trace.rows).collect();
        if streamed {
            let read: u64 = reports.iter().map(|r| r.trace.bytes_read).sum();
            assert!(read > 0, "{what}: nothing was streamed");
            // Only the layers kept here stream; the servers hold theirs.
            assert!(rows.iter().all(|r| r.layer < n_layer - 2), "{what}: a remote layer was streamed");
            assert!((0..n_layer - 2).all(|l| rows.iter().any(|r| r.layer == l)), "{what}: a local layer never routed");
        }
    }
}

#[test]
fn a_total_is_split_by_memory_and_too_many_layers_are_refused() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (a, b) = (Server::start(dir.path()), Server::start(dir.path()));
    let n_layer = layers(&m);
    let _serial = llama_lock();
    // Both servers report this machine's memory, so a total splits evenly.
    let s = bmoe::engine::Session::open(with_rpc(options(&m, None), &[&a, &b], &[2])).unwrap();
    let placed: Vec<&String> = s.info().notices.iter().filter(|n| n.starts_with("rpc:")).collect();
    assert_eq!(placed.len(), 2, "{:?}", s.info().notices);
    drop(s);
    // A streamed session keeps its first layer.
    let e = bmoe::engine::Session::open(with_rpc(options(&m, stream0(1, true)), &[&a], &[n_layer]))
        .err()
        .expect("every layer remote while streaming");
    assert!(e.to_string().contains("keeps at least its first layer here"), "{e}");
    // Unstreamed, every layer may go.
    let s = bmoe::engine::Session::open(with_rpc(options(&m, None), &[&a], &[n_layer])).unwrap();
    assert!(
        s.info().notices.iter().any(|n| n.contains(&format!("layers 0-{}", n_layer - 1))),
        "{:?}",
        s.info().notices
    );
}

#[test]
fn cli_generate_with_servers_prints_the_resident_text_and_says_where_layers_went() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (a, b) = (Server::start(dir.path()), Server::start(dir.path()));
    let generate = |extra: &[&str]| {
        let _serial = llama_lock();
        let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["generate", "-m", m.to_str().unwrap(), "-n", "12", "-t", "1", "-p", PROMPT])
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{extra:?}: {stderr}");
        (String::from_utf8(out.stdout).unwrap(), stderr)
    };
    let (resident, _) = generate(&[]);
    let servers = format!("{},{}", a.endpoint, b.endpoint);
    let (remote, notes) = generate(&["--moe-stream", "--rpc", &servers, "--rpc-layers", "1,1"]);
    assert_eq!(resident, remote);
    assert!(notes.contains(&format!("on {}", a.endpoint)) && notes.contains(&format!("on {}", b.endpoint)), "{notes}");
}

#[test]
fn a_missing_server_or_a_taken_port_is_a_clear_error() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let nobody = format!("127.0.0.1:{}", free_port());
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-m", m.to_str().unwrap(), "-n", "4", "--rpc", &nobody])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(&format!("cannot reach the RPC server at {nobody}")), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let bad = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-m", m.to_str().unwrap(), "--rpc", "nohost"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bad.stderr).contains("HOST:PORT"), "{}", String::from_utf8_lossy(&bad.stderr));
    // A port already taken.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe")).args(["rpc-server", "--port", &port]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")), "{stderr}");
}

#[test]
fn a_server_that_goes_away_between_turns_is_an_error_and_the_process_lives_on() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let mut a = Server::start(dir.path());
    let endpoint = a.endpoint.clone();
    let _serial = llama_lock();
    let mut s = bmoe::engine::Session::open(with_rpc(options(&m, stream0(1, true)), &[&a], &[1])).unwrap();
    let (first, _) = generate_steps(&mut s, 4);
    assert_eq!(first.tokens.len(), 4);
    // The server ends; the kernel closes its side of the connection.
    a.child.kill().unwrap();
    a.child.wait().unwrap();
    let req = bmoe::engine::GenerateRequest {
        prompt: PROMPT.into(),
        n_predict: 4,
        sampling: Default::default(),
        continue_context: false,
        keep_logits: false,
        constraint: None,
    };
    // The close reaches this side asynchronously (until it does, the
    // session cannot know): wait for the kernel to show it.
    let addr = endpoint.parse().unwrap();
    let t0 = Instant::now();
    while !bmoe::llama::rpc::connection_lost(addr) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the server's close never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    let err = s.generate(&req, &mut |_| {}).expect_err("a turn with a gone server");
    assert!(err.to_string().contains(&format!("the RPC server at {endpoint} has gone")), "{err}");
    // Dropping the session must not end the process (its remote buffers
    // cannot be freed), and the model opens again without the server.
    drop(s);
    let mut alone = bmoe::engine::Session::open(options(&m, stream0(1, true))).unwrap();
    let (again, _) = generate_steps(&mut alone, 4);
    assert_eq!(again.tokens, first.tokens, "the same greedy text without the server");
}

#[test]
fn with_a_server_banks_keep_the_file_layout_and_give_its_logits_bit_for_bit() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |s| {
        (s.embd, s.expert_ff) = (256, 256);
        s.derive();
        s.expert_type = bmoe::gguf::GgmlType::from_name("q4_0").unwrap();
    });
    let a = Server::start(dir.path());
    // A server computes the file's layout, so with one the banks here are
    // not repacked either: the run is the single-process `--repack off` run.
    let plain = |stream| SessionOptions { repack: bmoe::engine::Repack::Off, ..options(&m, stream) };
    let (reference, _) = run(plain(None), N);
    let (repacked, _) = run(options(&m, None), N);
    assert!(first_difference(&reference, &repacked).is_some(), "the repacked kernels round the same: nothing to check");
    for (what, stream) in [("resident", None), ("cache off", stream0(2, true))] {
        let (remote, _) = run(with_rpc(options(&m, stream), &[&a], &[1]), N);
        assert_identical(&reference, &remote, &format!("q4_0 experts, one RPC server, {what}"));
    }
}

#[test]
fn a_rhai_script_opens_a_model_with_layers_on_a_server() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let a = Server::start(dir.path());
    let script = dir.path().join("rpc.rhai");
    std::fs::write(
        &script,
        r#"
let here = open(ARGS[0], #{ stream: true, threads: 1 });
let split = open(ARGS[0], #{ stream: true, threads: 1, rpc: ARGS[1], rpc_layers: "1" });
let a = here.generate("Hello world", 10, #{ logits: true });
let b = split.generate("Hello world", 10, #{ logits: true });
print(`same: ${a.token_ids == b.token_ids}`);
"#,
    )
    .unwrap();
    let _serial = llama_lock();
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["run", script.to_str().unwrap(), "--out", dir.path().join("out").to_str().unwrap(), "--"])
        .args([m.to_str().unwrap(), &a.endpoint])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("same: true"), "{stdout}\n{stderr}");
    assert!(stderr.contains(&format!("on {}", a.endpoint)), "the placement note: {stderr}");
}

#[test]
fn a_server_busy_with_another_client_is_named_not_waited_on_forever() {
    use std::io::{Read, Write};
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let a = Server::start(dir.path());
    // Another client: greeted, so the server serves it and leaves new connections waiting.
    let mut other = std::net::TcpStream::connect(&a.endpoint).unwrap();
    let mut hello = vec![14u8];
    hello.extend_from_slice(&24u64.to_le_bytes());
    hello.extend_from_slice(&[0; 24]);
    other.write_all(&hello).unwrap();
    let mut answer = [0u8; 8 + 28];
    other.read_exact(&mut answer).unwrap();
    let _serial = llama_lock();
    let e = bmoe::engine::Session::open(with_rpc(options(&m, None), &[&a], &[1])).err().expect("a busy server");
    assert!(e.to_string().contains("another client is probably using it"), "{e}");
    drop(other);
}

/// How many layers a placement note (`rpc: layers 2-3 on ...`) gives its server.
fn placed_layers(note: &str) -> u32 {
    let what = note.trim_start_matches("rpc: ");
    if what.starts_with("no layers") {
        return 0;
    }
    if let Some(range) = what.strip_prefix("layers ") {
        let range = range.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        return b.parse::<u32>().unwrap() - a.parse::<u32>().unwrap() + 1;
    }
    assert!(what.starts_with("layer "), "{note}");
    1
}

/// The free memory a placement note reports for its server, MiB.
fn placed_free_mib(note: &str) -> f64 {
    let (_, tail) = note.rsplit_once(", ").unwrap();
    tail.trim_end_matches(" MiB free)").parse().unwrap()
}

#[test]
fn without_counts_two_servers_share_the_layers_by_their_free_memory() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (a, b) = (Server::start(dir.path()), Server::start(dir.path()));
    let n_layer = layers(&m);
    let _serial = llama_lock();
    // Streamed: every layer but the first fits on either server many times over.
    let s = bmoe::engine::Session::open(with_rpc(options(&m, stream0(1, true)), &[&a, &b], &[])).unwrap();
    let placed: Vec<&String> = s.info().notices.iter().filter(|n| n.starts_with("rpc:")).collect();
    assert_eq!(placed.len(), 2, "{:?}", s.info().notices);
    assert!(placed[0].contains(&a.endpoint) && placed[1].contains(&b.endpoint), "{placed:?}");
    let counts: Vec<u32> = placed.iter().map(|n| placed_layers(n)).collect();
    let free: Vec<f64> = placed.iter().map(|n| placed_free_mib(n)).collect();
    assert_eq!(counts.iter().sum::<u32>(), n_layer - 1, "{placed:?}");
    // Both report this machine's free memory: the layers split evenly (the
    // odd one to either), none left without.
    assert!((free[0] - free[1]).abs() < 0.1 * free[0].max(free[1]), "{placed:?}");
    assert!(counts.iter().all(|&c| c >= (n_layer - 1) / 2), "split by free memory, not all on the first: {placed:?}");
}

#[test]
fn setting_fewer_servers_after_one_died_re_splits_the_counts_and_runs_on() {
    use bmoe::config::RunConfig;
    use bmoe::host::{Host, HostEvent};
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (a, mut b) = (Server::start(dir.path()), Server::start(dir.path()));
    let mut config = RunConfig::default();
    config.generate.threads = 1;
    config.generate.n_predict = 6;
    config.moe.stream = bmoe::config::StreamMode::On;
    config.model.rpc = format!("{},{}", a.endpoint, b.endpoint);
    config.model.rpc_layers = "1,1".into();
    let _serial = llama_lock();
    let mut host = Host::open(config, &m).unwrap();
    let first = host.complete(PROMPT, false, &mut |_: HostEvent<'_>| {}).unwrap();
    // B ends; the kernel shows its close here asynchronously.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let gone = b.endpoint.parse().unwrap();
    let t0 = Instant::now();
    while !bmoe::llama::rpc::connection_lost(gone) {
        assert!(t0.elapsed() < Duration::from_secs(60), "the server's close never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(host.complete(PROMPT, false, &mut |_: HostEvent<'_>| {}).is_err(), "a turn with a server gone");
    // `:set rpc A`: the two counts of the old list become their total on A.
    let outcome = host.set("rpc", &a.endpoint).unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.notices.iter().any(|n| n.contains("2 layers in all")), "{:?}", outcome.notices);
    assert!(
        outcome
            .notices
            .iter()
            .any(|n| n.contains(&format!("layers {}-{}", layers(&m) - 2, layers(&m) - 1)) && n.contains(&a.endpoint)),
        "{:?}",
        outcome.notices
    );
    assert_eq!(host.config().model.rpc_layers, "2");
    let again = host.complete(PROMPT, false, &mut |_: HostEvent<'_>| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.tokens, first.tokens, "the same greedy text on the server left");
    // No server at all: the counts go too, and the model runs here alone.
    let outcome = host.set("rpc", "").unwrap_or_else(|e| panic!("{e}"));
    assert!(outcome.notices.iter().any(|n| n.contains("cleared")), "{:?}", outcome.notices);
    let alone = host.complete(PROMPT, false, &mut |_: HostEvent<'_>| {}).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(alone.tokens, first.tokens);
}

/// A web server on a free loopback port that, like most, answers once a
/// request's header lines end (within 60 s, then it hangs up).
fn web_server() -> (String, std::thread::JoinHandle<()>) {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let thread = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut request = Vec::new();
        let mut buf = [0u8; 256];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    });
    (endpoint, thread)
}

#[test]
fn a_web_server_on_the_port_did_not_answer_the_greeting() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (web, thread) = web_server();
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-m", m.to_str().unwrap(), "-n", "4", "-t", "1", "--rpc", &web])
        .output()
        .unwrap();
    thread.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("another client"), "{stderr}");
    assert!(
        stderr.contains(&format!("{web} did not answer the RPC greeting (it sent `HTTP/1.1 400 Bad Request`)")),
        "{stderr}"
    );
}

#[test]
fn a_server_on_every_address_tells_clients_this_machines_addresses() {
    // Hold the port on loopback so the server, having printed where clients
    // connect, cannot listen on every address (nothing leaves loopback).
    let held = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["rpc-server", "--host", "0.0.0.0", "--port", &port.to_string(), "--threads", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = exited_within(child, 120, &format!("rpc-server listened on 0.0.0.0:{port} beside a loopback listener"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot listen on 0.0.0.0:{port}")), "{stderr}");
    assert!(!stderr.contains("--rpc 0.0.0.0"), "the wildcard is no address to connect to: {stderr}");
    let mine: Vec<String> = bmoe::llama::rpc::local_addresses()
        .into_iter()
        .filter(|ip| ip.is_ipv4())
        .map(|ip| format!("{ip}:{port}"))
        .collect();
    if mine.is_empty() {
        assert!(stderr.contains(&format!("`--rpc ADDRESS:{port}`")), "{stderr}");
    } else {
        assert!(stderr.contains(&format!("clients connect with `--rpc {}`", mine[0])), "{stderr}");
        assert!(mine.iter().all(|e| stderr.contains(e)), "{mine:?}: {stderr}");
    }
    drop(held);
}

/// A relay on a free loopback port to the server at `server`: it passes the
/// RPC protocol's client messages one by one and, at the `kill_at`-th graph
/// computation, hangs up on both sides instead, as a server that dies in
/// the middle of a step does. Stops taking connections once `stop` is set.
fn dying_relay(server: &str, kill_at: usize) -> (String, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const GRAPH_COMPUTE: u8 = 10;
    const GRAPH_RECOMPUTE: u8 = 16;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    let (server, stop) = (server.to_string(), Arc::new(AtomicBool::new(false)));
    let stopped = stop.clone();
    std::thread::spawn(move || {
        let computes = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs(600);
        while !stopped.load(Ordering::Relaxed) && Instant::now() < deadline {
            let client = match listener.accept() {
                Ok((c, _)) => c,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                }
            };
            client.set_nonblocking(false).unwrap();
            let upstream = std::net::TcpStream::connect(&server).unwrap();
            let (mut from_server, mut to_client) = (upstream.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut from_server, &mut to_client);
                let _ = to_client.shutdown(std::net::Shutdown::Both);
            });
            let computes = computes.clone();
            std::thread::spawn(move || {
                let (mut from_client, mut to_server) = (client, upstream);
                let mut head = [0u8; 9];
                while from_client.read_exact(&mut head).is_ok() {
                    let size = u64::from_le_bytes(head[1..].try_into().unwrap());
                    if matches!(head[0], GRAPH_COMPUTE | GRAPH_RECOMPUTE)
                        && computes.fetch_add(1, Ordering::Relaxed) + 1 == kill_at
                    {
                        break;
                    }
                    let sent = to_server
                        .write_all(&head)
                        .and_then(|()| std::io::copy(&mut (&mut from_client).take(size), &mut to_server).map(|_| ()));
                    if sent.is_err() {
                        break;
                    }
                }
                let _ = from_client.shutdown(std::net::Shutdown::Both);
                let _ = to_server.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    (endpoint, stop)
}

#[test]
fn a_server_that_dies_in_the_middle_of_a_step_is_named_before_the_process_ends() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let a = Server::start(dir.path());
    // The relay drops the connection on the third graph the client sends:
    // the step is under way, past the check before it.
    let (relay, stop) = dying_relay(&a.endpoint, 3);
    let _serial = llama_lock();
    let child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-m", m.to_str().unwrap(), "-n", "12", "-t", "1", "-p", PROMPT])
        .args(["--rpc", &relay, "--rpc-layers", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = exited_within(child, 300, "the client never ended after its server went mid-step");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("bmoe: the RPC server at {relay} stopped answering (its connection")),
        "the server is named: {stderr}"
    );
}

/// The output of `child` once it exits; killed, and the test failed with
/// `why`, if it still runs after `limit_s` seconds (a bound, not a timing:
/// the child is expected to end long before).
fn exited_within(mut child: std::process::Child, limit_s: u64, why: &str) -> std::process::Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(limit_s) {
            let _ = child.kill();
            panic!("{why}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}
