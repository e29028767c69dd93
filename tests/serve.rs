//! `bmoe serve` as clients meet it: the real binary on a free port, driven
//! over HTTP (ureq, raw sockets for hostile input, and the official
//! `openai` Python package).

mod common;

use common::serve::{Serve, agent, client_python, get};

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use bmoe::synth::Arch;
use serde_json::{Value, json};

/// `POST url+path` with a JSON body: status and the body as JSON.
fn post(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let mut r = agent().post(format!("{url}{path}")).send_json(body).expect("a response");
    let status = r.status().as_u16();
    (status, r.body_mut().read_json().expect("a JSON body"))
}

/// The `data:` payloads of a streamed answer.
fn stream(url: &str, path: &str, body: &Value) -> Vec<String> {
    let mut r = agent().post(format!("{url}{path}")).send_json(body).expect("a response");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.body_mut().read_to_string().unwrap();
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

/// A raw request on a fresh connection: the status line's code (0 when the
/// server closed the connection without an answer).
fn raw(url: &str, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let _ = s.write_all(request);
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, text)
}

fn tiny(dir: &Path) -> PathBuf {
    common::write_tiny(dir, "serve.gguf", Arch::Qwen3Moe, |_| {})
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

#[test]
fn chat_and_completions_answer_as_the_openai_api_writes_them() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let server = Serve::start(&model, &["--chat-template", "qwen3"]);
    let url = &server.url;

    let (status, models) = get(url, "/v1/models", None);
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "serve");

    let ask = json!({"messages": user("Hello there"), "max_tokens": 6, "temperature": 0});
    let (status, whole) = post(url, "/v1/chat/completions", &ask);
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    let usage = &whole["usage"];
    assert_eq!(usage["completion_tokens"], 6);
    assert_eq!(usage["total_tokens"].as_u64(), Some(usage["prompt_tokens"].as_u64().unwrap() + 6));

    // Streamed: role first, the same text in pieces, the finish, the usage, [DONE].
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = stream(url, "/v1/chat/completions", &streamed);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let whole_text = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text.trim(), whole_text, "streamed and whole replies differ");
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks.last().unwrap()["usage"], *usage);

    // A raw completion is what `bmoe generate` prints for the same prompt.
    let (status, done) =
        post(url, "/v1/completions", &json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}));
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["object"], "text_completion");
    let generated = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-q", "-t", "1", "-m", model.to_str().unwrap(), "-p", "Once upon a time", "-n", "8"])
        .output()
        .unwrap();
    assert_eq!(done["choices"][0]["text"].as_str().unwrap(), String::from_utf8_lossy(&generated.stdout).trim_end());

    // A stop string ends the text before it and counts as the model's stop.
    let text = done["choices"][0]["text"].as_str().unwrap();
    let stop: String = text.chars().skip(3).take(2).collect();
    let (_, stopped) = post(
        url,
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "stop": [stop.clone()]}),
    );
    let cut = stopped["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &text[..text.find(&stop).unwrap()], "cut at {stop:?}");
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");

    // /metrics counts what was answered.
    let (status, metrics) = get(url, "/metrics", None);
    assert_eq!(status, 200);
    assert!(metrics.contains("bmoe_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2"), "{metrics}");
    assert!(metrics.contains("bmoe_expert_cache_hit_ratio"), "{metrics}");
}

#[test]
fn errors_are_openai_error_objects_with_their_status() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let config = dir.path().join("bmoe.toml");
    std::fs::write(&config, "[serve]\nbody_mb = 1\n").unwrap();
    let server =
        Serve::start(&model, &["--ctx-size", "512", "--config", config.to_str().unwrap(), "--api-key", "sesame"]);
    let url = &server.url;
    let call = |path: &str, body: &str, key: Option<&str>| {
        let mut request = agent().post(format!("{url}{path}")).header("Content-Type", "application/json");
        if let Some(key) = key {
            request = request.header("Authorization", format!("Bearer {key}"));
        }
        let mut r = request.send(body).expect("a response");
        let status = r.status().as_u16();
        let body: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        (status, body)
    };
    let chat = |body: &str| call("/v1/chat/completions", body, Some("sesame"));
    let expect = |(status, body): (u16, Value), want: u16, says: &str| {
        assert_eq!(status, want, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}");
        assert!(body["error"]["type"].is_string(), "{body}");
    };
    // The key.
    expect(call("/v1/chat/completions", r#"{"messages": []}"#, None), 401, "API key");
    expect(call("/v1/chat/completions", r#"{"messages": []}"#, Some("wrong")), 401, "API key");
    assert_eq!(get(url, "/v1/models", Some("sesame")).0, 200);
    assert_eq!(get(url, "/v1/models", None).0, 401);
    assert_eq!(get(url, "/health", None).0, 200, "health needs no key");
    let refused = agent().get(format!("{url}/v1/models")).call().unwrap();
    assert_eq!(refused.headers().get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
    let lower = agent().get(format!("{url}/v1/models")).header("Authorization", "bearer sesame").call().unwrap();
    assert_eq!(lower.status().as_u16(), 200, "the scheme's name is case-insensitive");
    // One model by its id; another id is 404.
    let (status, one) = get(url, "/v1/models/serve", Some("sesame"));
    assert_eq!(status, 200, "{one}");
    assert_eq!(serde_json::from_str::<Value>(&one).unwrap()["id"], "serve");
    let (status, none) = get(url, "/v1/models/gpt-4", Some("sesame"));
    assert_eq!(status, 404, "{none}");
    // The context reported is the one a request gets (each of the 4 slots').
    let listed: Value = serde_json::from_str(&get(url, "/v1/models", Some("sesame")).1).unwrap();
    assert_eq!(listed["data"][0]["meta"]["n_ctx"], 512, "{listed}");
    // A method the endpoint does not answer, and a field of the wrong type.
    let (status, body) = get(url, "/v1/chat/completions", Some("sesame"));
    assert_eq!(status, 405, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap()["error"]["message"].is_string(), "{body}");
    let (status, body) = chat(r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "12"}"#);
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("max_tokens")), "{body}");
    // Bad requests.
    expect(chat(r#"{"messages": [{"role": "user", "content": "hi"}"#), 400, "not valid JSON");
    expect(chat(r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#), 400, "unknown role");
    expect(chat(r#"{"messages": "hi"}"#), 400, "must be a list");
    let long = json!({"messages": user(&"many words ".repeat(400))}).to_string();
    let (status, body) = chat(&long);
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("context_length_exceeded")), "{body}");
    let schema = json!({"messages": user("x"), "response_format":
        {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "object", "not": {}}}}});
    expect(chat(&schema.to_string()), 400, "schema");
    expect(chat(&json!({"messages": user("x"), "n": 3}).to_string()), 400, "`n` must be 1");
    let (status, body) = call("/v1/nothing", "{}", Some("sesame"));
    assert_eq!(status, 404, "{body}");
    // What hyper answers itself (a request it cannot parse) has a body too.
    // (More headers than hyper takes, all sent before it answers: a
    // closed socket with unread data would reset the answer.)
    let many_headers: String = (0..120).map(|i| format!("X-Filler-{i}: a\r\n")).collect();
    for (request, want, says) in [
        (format!("GET /v1/models HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n"), 431, "header fields"),
        ("GARBAGE\r\n\r\n".to_string(), 400, "not well-formed"),
        ("GET /v1/models HTTP/1.1\r\nBad Header\r\n\r\n".to_string(), 400, "not well-formed"),
    ] {
        let (status, text) = raw(url, request.as_bytes());
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        assert!(head.to_ascii_lowercase().contains("content-type: application/json"), "{head}");
        expect((status, serde_json::from_str(body).unwrap_or(Value::Null)), want, says);
    }
    let big = format!(r#"{{"messages": [{{"role": "user", "content": "{}"}}]}}"#, "a".repeat(2 << 20));
    expect(chat(&big), 413, "larger than the 1 MiB");
    // The server still answers.
    let (status, body) = chat(&json!({"messages": user("hi"), "max_tokens": 2}).to_string());
    assert_eq!(status, 200, "{body}");
}

#[test]
fn hostile_clients_leave_the_server_answering() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let server = Serve::start(&model, &[]);
    let url = &server.url;
    let host = url.trim_start_matches("http://");
    let ok = || {
        let (status, body) = post(url, "/v1/chat/completions", &json!({"messages": user("hi"), "max_tokens": 2}));
        assert_eq!(status, 200, "{body}");
    };
    // A client that connects and sends nothing: others are answered
    // meanwhile, and the server drops it in bounded time.
    let mut idle = TcpStream::connect(host).unwrap();
    ok();
    idle.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let read = idle.read(&mut buf);
    assert!(matches!(read, Ok(0)) || read.is_err(), "the idle connection got {read:?}");
    assert!(started.elapsed() < Duration::from_secs(100), "the idle connection was kept open");
    // Truncated JSON, invalid UTF-8, an unknown field.
    let body = |text: &[u8]| {
        let mut r = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \
             {}\r\nConnection: close\r\n\r\n",
            text.len()
        )
        .into_bytes();
        r.extend_from_slice(text);
        raw(url, &r)
    };
    assert_eq!(body(br#"{"messages": [{"role": "us"#).0, 400);
    assert_eq!(body(b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}").0, 400);
    let (status, text) = body(br#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "x_extra": [1]}"#);
    assert_eq!(status, 200, "{text}");
    // 10,000 messages.
    let many: Vec<Value> = (0..10_000).map(|i| json!({"role": "user", "content": format!("m{i}")})).collect();
    let (status, answer) = post(url, "/v1/chat/completions", &json!({"messages": many}));
    assert_eq!(status, 400, "{answer}");
    // A body declared over the cap is answered before any of it is sent.
    let mut s = TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n").unwrap();
    let mut status = String::new();
    BufReader::new(&mut s).read_line(&mut status).unwrap();
    assert!(status.starts_with("HTTP/1.1 413"), "{status}");
    drop(s);
    // A 100 MB body: refused (the server may close before reading it all).
    let mut s = TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..100 {
        if s.write_all(&chunk).is_err() {
            break;
        }
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    if !answer.is_empty() {
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    }
    drop(s);
    ok();
}

#[test]
fn a_client_that_leaves_mid_stream_stops_its_generation() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    // A long context, so the reply runs far longer than the client stays.
    let server = Serve::start(&model, &["--ctx-size", "16384"]);
    let url = &server.url;
    drop(long_stream(url));
    // The engine notices, stops and counts it; the next request is answered.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (_, metrics) = get(url, "/metrics", None);
        if metrics.contains("bmoe_requests_cancelled_total 1") {
            break;
        }
        assert!(Instant::now() < deadline, "the generation was never stopped:\n{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, whole) = post(url, "/v1/chat/completions", &json!({"messages": user("hi"), "max_tokens": 3}));
    assert_eq!(status, 200, "{whole}");
    let (_, metrics) = get(url, "/metrics", None);
    let generated: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("bmoe_generated_tokens_total "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    // The cancelled request's tokens count too (it sent at least one).
    assert!(generated > 3, "the cancelled request's tokens are not counted:\n{metrics}");
}

#[test]
fn the_openai_python_client_drives_the_server() {
    if !common::requires::python_venv("the_openai_python_client_drives_the_server") {
        return;
    }
    let python = client_python();
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let server = Serve::start(&model, &["--chat-template", "qwen3", "--no-think"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/openai_client.py");
    let out = Command::new(python).arg(script).arg(format!("{}/v1", server.url)).output().unwrap();
    assert!(
        out.status.success(),
        "the openai client failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each of `n` different prompts' greedy completion, sent at once: its
/// text, usage and per-step logits digests.
fn completions_at_once(url: &str, prompts: &[String]) -> Vec<(String, Value, Value)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| {
                s.spawn(move || {
                    let body = json!({"prompt": p, "max_tokens": 16, "temperature": 0, "logits_digest": true});
                    let (status, done) = post(url, "/v1/completions", &body);
                    assert_eq!(status, 200, "{done}");
                    let text = done["choices"][0]["text"].as_str().unwrap().to_string();
                    (text, done["usage"].clone(), done["logits_digest"].clone())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// `bmoe generate`'s text and per-step logits digests for `prompt` alone,
/// with the batch-invariant kernels a server uses (a plain `generate`
/// takes llama.cpp's fastest kernels, which sum a prompt in another order).
fn generated_alone(model: &Path, prompt: &str, n: u32, args: &[&str]) -> (String, Value) {
    let dir = common::tempdir();
    let digests = dir.path().join("digests.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-q", "-t", "1", "-m", model.to_str().unwrap(), "-p", prompt, "-n", &n.to_string()])
        .args(["--logits-digest", digests.to_str().unwrap(), "--batch-invariant"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = std::fs::read_to_string(&digests).unwrap();
    let steps: Vec<Value> = lines.lines().filter_map(|l| l.split_whitespace().nth(1)).map(|d| json!(d)).collect();
    (String::from_utf8_lossy(&out.stdout).trim_end().to_string(), Value::Array(steps))
}

/// The issue's repro: P2 sent after P5 reuses P5's first tokens from the
/// slot P5 left, and still answers bitwise what P2 alone answers.
#[test]
fn a_reply_does_not_depend_on_what_the_server_decoded_before() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let turn = |bot: u32, topic: &str| {
        format!(
            "<|im_start|>system\nYou are bot {bot}.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
            topic.repeat(3)
        )
    };
    let (p5, p2) = (turn(5, "Kyoto temples"), turn(2, "the history of Rome"));
    for (what, args) in [("resident", vec![]), ("streamed, cache off", vec!["--moe-stream", "--cache-mb", "0"])] {
        let server = Serve::start(&model, &args);
        for prompt in [&p5, &p2, &p5] {
            let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "logits_digest": true});
            let (status, done) = post(&server.url, "/v1/completions", &body);
            assert_eq!(status, 200, "{done}");
            let (text, digests) = generated_alone(&model, prompt, 12, &args);
            assert_eq!(done["logits_digest"], digests, "{what}: the served logits differ from `bmoe generate`'s");
            assert_eq!(done["choices"][0]["text"], json!(text), "{what}");
        }
        // The second request reused the first's tokens (the gate can fail).
        let (_, metrics) = get(&server.url, "/metrics", None);
        let count = |name: &str| -> u64 {
            metrics.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap()
        };
        assert!(
            count("bmoe_prompt_tokens_decoded_total ") < count("bmoe_prompt_tokens_total "),
            "{what}: no prefix was reused:\n{metrics}"
        );
    }
}

#[test]
fn concurrent_requests_decode_together_and_equal_each_alone() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let prompts: Vec<String> = ["The history of the river", "Once upon a time", "Seven", "Rust is a language"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for (what, args) in [
        ("resident", vec![]),
        ("streamed, cache off", vec!["--moe-stream", "--cache-mb", "0"]),
        ("streamed, evicting", vec!["--moe-stream", "--cache-mb", "0.1", "--force-cache"]),
    ] {
        let server = Serve::start(&model, &[&["--parallel", "4"], &args[..]].concat());
        let alone: Vec<(String, Value, Value)> =
            prompts.iter().map(|p| completions_at_once(&server.url, std::slice::from_ref(p)).remove(0)).collect();
        assert!(alone.iter().any(|a| a.0 != alone[0].0), "{what}: every prompt gave the same text");
        for n in [1, 2, 4] {
            let together = completions_at_once(&server.url, &prompts[..n]);
            for (i, got) in together.iter().enumerate() {
                assert_eq!(got, &alone[i], "{what}: request {i} of {n} at once differs from it alone");
            }
        }
        // Whether the requests overlapped depends on the machine's speed;
        // tests/sequences.rs decodes sequences together deterministically.
    }
}

/// A prompt of about `tokens` tokens of the demo model's vocabulary (which
/// reads these words at about 1.9 letters a token), different for each
/// `seed`.
fn long_prompt(seed: usize, tokens: usize) -> String {
    let words = ["river", "stone", "market", "lantern", "harbor", "meadow", "copper", "violin"];
    let mut text = String::new();
    let mut i = seed;
    while text.len() < tokens * 19 / 10 {
        i = (i * 7 + 3) % words.len();
        text.push_str(words[i]);
        text.push(' ');
    }
    text
}

/// Issue 50's scenario: one stream running while three clients send
/// ~1,500-token prompts. The budget keeps the stream's pace (its longest
/// gap within 10x its median; without a budget a step carrying 500
/// prompt tokens held it for hundreds of times its median gap), and all
/// four replies, the prompts prefilled in small chunks beside the stream,
/// equal their solo runs bitwise.
#[test]
fn a_running_stream_keeps_its_pace_while_long_prompts_join() {
    let dir = common::tempdir();
    let model = dir.path().join("demo.gguf");
    let spec = bmoe::synth::ModelSpec::preset(bmoe::synth::Preset::Demo, Arch::Qwen3Moe);
    bmoe::synth::write_model(&spec, &model, &mut |_, _| std::ops::ControlFlow::Continue(())).expect("write model");
    let server = Serve::start_alone(&model, &["--parallel", "4", "--ctx-size", "2048"]);
    let stream_prompt = "The history of the river";
    let prompts: Vec<String> = (0..3).map(|i| long_prompt(i, 1500)).collect();

    // The stream: its tokens' arrival times, then its closing chunk.
    let body = json!({"prompt": stream_prompt, "max_tokens": 400, "temperature": 0, "stream": true,
                      "logits_digest": true})
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let url = server.url.as_str();
    let (text, last, arrivals, newcomers) = std::thread::scope(|scope| {
        let newcomers = scope.spawn(move || {
            // The prompts are sent once the stream runs.
            wait.recv().expect("the stream ended before its 20th token");
            std::thread::scope(|s| {
                let handles: Vec<_> = prompts
                    .iter()
                    .map(|p| {
                        s.spawn(move || {
                            let body = json!({"prompt": p, "max_tokens": 8, "temperature": 0, "logits_digest": true});
                            let (status, done) = post(url, "/v1/completions", &body);
                            assert_eq!(status, 200, "{done}");
                            (p.clone(), done)
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            })
        });
        let mut arrivals = Vec::new();
        let mut text = String::new();
        let mut last = Value::Null;
        let mut go = Some(go);
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let Some(data) = line.trim_end().strip_prefix("data: ") else { continue };
            if data == "[DONE]" {
                break;
            }
            let chunk: Value = serde_json::from_str(data).unwrap();
            let piece = chunk["choices"][0]["text"].as_str().unwrap_or_default();
            if !piece.is_empty() {
                arrivals.push(Instant::now());
                text.push_str(piece);
            }
            if arrivals.len() == 20 {
                go.take().map(|go| go.send(()));
            }
            if !chunk["choices"][0]["finish_reason"].is_null() {
                last = chunk;
            }
        }
        // A stream that ended early lets the newcomers' thread fail.
        drop(go);
        (text, last, arrivals, newcomers.join().unwrap())
    });

    // The prompts were prefilled beside the stream, held to the budget.
    let (_, metrics) = get(&server.url, "/metrics", None);
    let count = |name: &str| -> u64 {
        metrics.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap()
    };
    assert!(
        count("bmoe_prompt_tokens_beside_streams_total ") >= 100,
        "the prompts did not join the stream:\n{metrics}"
    );
    assert!(count("bmoe_paced_steps_total ") > 0, "the budget never held a prompt back:\n{metrics}");
    drop(server);

    let mut gaps: Vec<Duration> = arrivals.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(gaps.len() > 300, "{} tokens streamed", arrivals.len());
    gaps.sort();
    let (median, longest) = (gaps[gaps.len() / 2], gaps[gaps.len() - 1]);
    assert!(
        longest <= median * 10,
        "the stream stalled: longest gap {longest:?}, median {median:?} (slowest ten: {:?})",
        &gaps[gaps.len() - 10..]
    );

    // Every reply equals its solo run, tokens and logits.
    let (alone, digests) = generated_alone(&model, stream_prompt, 400, &[]);
    assert_eq!(last["logits_digest"], digests, "the stream's logits differ from its solo run");
    assert_eq!(text, alone);
    for (prompt, done) in &newcomers {
        assert!(done["usage"]["prompt_tokens"].as_u64().unwrap() >= 1400, "{}", done["usage"]);
        let (alone, digests) = generated_alone(&model, prompt, 8, &[]);
        assert_eq!(done["logits_digest"], digests, "a long prompt's logits differ from its solo run");
        assert_eq!(done["choices"][0]["text"], json!(alone));
    }
}

/// A streamed greedy completion with logits digests on its own connection,
/// read up to its first token.
fn open_stream(url: &str, prompt: &str, max_tokens: u32) -> BufReader<TcpStream> {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": true,
                      "logits_digest": true})
    .to_string();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(600))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream of {prompt:?} ended before its first token");
        if line.starts_with("data: {") {
            return reader;
        }
    }
}

/// Reads a stream from [`open_stream`] to its end: the text after its
/// first token's chunk, and its closing chunk (with the digests).
fn finish_stream(mut reader: BufReader<TcpStream>) -> (String, Value) {
    let (mut text, mut last, mut line) = (String::new(), Value::Null, String::new());
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data: ") else { continue };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).unwrap();
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or_default());
        if !chunk["choices"][0]["finish_reason"].is_null() {
            last = chunk;
        }
    }
    (text, last)
}

/// The running requests are kept in consecutive slots (one pass a step
/// where each sequence has its own KV buffer): a newcomer takes the slot
/// beside them and gets its cached prefix brought there from the slot
/// holding it, and a request running past a slot its client left is moved
/// into it. Both replies equal their solo runs, logits bitwise. Every move
/// is an exchange: the conversation a moved request displaced is still
/// cached afterwards.
#[test]
fn requests_copied_and_moved_between_slots_equal_their_solo_runs() {
    let dir = common::tempdir();
    let model = dir.path().join("demo.gguf");
    let spec = bmoe::synth::ModelSpec::preset(bmoe::synth::Preset::Demo, Arch::Qwen3Moe);
    bmoe::synth::write_model(&spec, &model, &mut |_, _| std::ops::ControlFlow::Continue(())).expect("write model");
    let server = Serve::start(&model, &["--parallel", "5", "--ctx-size", "1024"]);
    let url = server.url.as_str();
    let long = "The history of the river that runs through the old town, its bridges, mills and floods, ";
    let (p, t) = (format!("{long}told by a miller"), format!("{long}told by a ferryman who crossed it every day"));
    let q = "Seven bridges crossed the river in the old town, and nobody could walk over each once";
    // P in slot 0, Q in slot 1: each the free slot holding the least.
    for prompt in [p.as_str(), q] {
        let (status, done) =
            post(url, "/v1/completions", &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}));
        assert_eq!(status, 200, "{done}");
    }
    // R in slot 2, S beside it in 3, T beside them in 4 with P's prefix
    // brought from slot 0; S's client leaves, and T is moved into slot 1,
    // Q's conversation going to slot 4.
    let n = 300;
    let r = open_stream(url, "Once upon a time in a small village", n);
    let s = open_stream(url, "Rust is a systems programming language", n);
    let t_stream = open_stream(url, &t, n);
    drop(s);
    let (r_text, r_last) = finish_stream(r);
    let (t_text, t_last) = finish_stream(t_stream);
    let (_, metrics) = get(url, "/metrics", None);
    let count = |name: &str| -> u64 {
        metrics.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap()
    };
    assert!(count("bmoe_prefix_copies_total ") >= 1, "no prefix was copied:\n{metrics}");
    assert!(count("bmoe_slot_moves_total ") >= 1, "no running request was moved:\n{metrics}");
    assert!(count("bmoe_requests_cancelled_total ") >= 1, "S's client never left:\n{metrics}");
    // Q again: its conversation survived T's move, so only its last prompt
    // token is decoded.
    let decoded = count("bmoe_prompt_tokens_decoded_total ");
    let (status, done) = post(url, "/v1/completions", &json!({"prompt": q, "max_tokens": 4, "temperature": 0}));
    assert_eq!(status, 200, "{done}");
    let (_, metrics) = get(url, "/metrics", None);
    let again: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("bmoe_prompt_tokens_decoded_total "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(again - decoded, 1, "Q's conversation was not kept through the move:\n{metrics}");
    drop(server);
    for (what, prompt, text, last) in
        [("R", "Once upon a time in a small village", r_text, r_last), ("T", t.as_str(), t_text, t_last)]
    {
        let (alone, digests) = generated_alone(&model, prompt, n, &[]);
        assert_eq!(last["logits_digest"], digests, "{what}'s logits differ from its solo run");
        assert!(alone.ends_with(&text), "{what}: {text:?} is not the end of {alone:?}");
    }
}

#[test]
fn a_full_queue_is_answered_429_and_the_queue_drains() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    // One request at a time, one waiting; a long context keeps the first busy.
    let server = Serve::start(&model, &["--parallel", "1", "--queue", "1", "--ctx-size", "16384"]);
    let url = &server.url;
    // The first request runs (its stream has begun)...
    let reader = long_stream(url);
    // ...the second waits in the queue...
    let waiting = std::thread::spawn({
        let url = url.clone();
        move || post(&url, "/v1/chat/completions", &json!({"messages": user("hi"), "max_tokens": 2}))
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    while !get(url, "/metrics", None).1.contains("bmoe_queue_waiting 1") {
        assert!(Instant::now() < deadline, "the second request never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...and a third finds the queue full.
    let (status, body) = post(url, "/v1/chat/completions", &json!({"messages": user("hi"), "max_tokens": 2}));
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "queue_full");
    let full = agent().post(format!("{url}/v1/chat/completions")).send_json(json!({"messages": user("hi")})).unwrap();
    assert_eq!(full.status().as_u16(), 429);
    assert!(full.headers().get("retry-after").is_some(), "a 429 says when to come back");
    // A prompt is rendered and tokenized on the request's side, not by the
    // busy engine: one that cannot fit (by its tokens; its bytes alone do
    // not tell) is refused as too long while the queue is still full.
    let long: String =
        (0..60_000).map(|i| if i % 2 == 0 { char::from(b'a' + (i * 7 % 26) as u8) } else { ' ' }).collect();
    for (path, body) in [
        ("/v1/chat/completions", json!({"messages": user(&long), "max_tokens": 2})),
        ("/v1/completions", json!({"prompt": long, "max_tokens": 2})),
    ] {
        let (status, body) = post(url, path, &body);
        assert_eq!((status, &body["error"]["code"]), (400, &json!("context_length_exceeded")), "{path}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("the prompt needs"), "{path}: {body}");
    }
    // The first client leaves: the waiting request runs.
    drop(reader);
    let (status, body) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
}

/// The server's resident memory (VmRSS), in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Raises this process's open-file limit to its hard limit (the server,
/// started after, inherits it): the most connections one round may open.
fn connections_allowed() -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        limit.rlim_cur = limit.rlim_max.min(65_536);
        libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
    }
    (limit.rlim_cur as usize / 2).saturating_sub(256).min(10_000)
}

#[test]
fn memory_comes_back_after_a_flood_of_idle_connections() {
    let per_round = connections_allowed();
    assert!(per_round >= 500, "the open-file limit allows only {per_round} connections a round");
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let server = Serve::start(&model, &[]);
    let host = server.url.trim_start_matches("http://").to_string();
    let (status, _) = post(&server.url, "/v1/completions", &json!({"prompt": "warm", "max_tokens": 2}));
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_secs(2));
    let idle = rss(server.child.id());
    let mut peak = idle;
    for _ in 0..4 {
        let open: Vec<TcpStream> = (0..per_round).filter_map(|_| TcpStream::connect(&host).ok()).collect();
        assert!(open.len() * 10 >= per_round * 9, "only {} of {per_round} connections opened", open.len());
        // Each connection is accepted and waits for its headers.
        std::thread::sleep(Duration::from_secs(1));
        peak = peak.max(rss(server.child.id()));
        drop(open);
    }
    // The flood is over: memory goes back within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut now = rss(server.child.id());
    while now > idle + (20 << 20) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        now = rss(server.child.id());
    }
    let mib = |b: u64| b as f64 / 1048576.0;
    eprintln!("rss: idle {:.1} MiB, peak {:.1} MiB, after {:.1} MiB", mib(idle), mib(peak), mib(now));
    assert!(now <= idle + (20 << 20), "RSS {:.1} MiB after the flood, idle {:.1} MiB", mib(now), mib(idle));
    let (status, _) = post(&server.url, "/v1/completions", &json!({"prompt": "after", "max_tokens": 2}));
    assert_eq!(status, 200, "the server answers after the flood");
}

/// Reads a streamed reply's events until `[DONE]` or the end: the `data:`
/// payloads.
fn read_events(reader: &mut BufReader<TcpStream>) -> Vec<String> {
    let mut events = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return events;
        }
        if let Some(data) = line.trim_end().strip_prefix("data: ") {
            events.push(data.to_string());
            if data == "[DONE]" {
                return events;
            }
        }
    }
}

/// Starts a long streamed completion and reads up to its first event.
fn long_stream(url: &str) -> BufReader<TcpStream> {
    let body = json!({"messages": user("Tell me everything"), "stream": true}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: \
         {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut reader = BufReader::new(s);
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(reader.read_line(&mut line).unwrap() > 0, "the stream ended before its first chunk");
    }
    reader
}

/// The last chunk before `[DONE]` of a stream read to its end.
fn last_chunk(reader: &mut BufReader<TcpStream>) -> Value {
    let events = read_events(reader);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    serde_json::from_str(&events[events.len() - 2]).unwrap()
}

fn sigterm(server: &Serve) {
    // SAFETY: kill(2) on the server's own pid with SIGTERM.
    let rc = unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0, "SIGTERM could not be sent");
}

#[test]
fn sigterm_lets_running_requests_finish_and_refuses_new_ones() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    // A reply of the whole 4k context takes far longer than a request's
    // round trip: it is running when the next request arrives.
    let mut server = Serve::start(&model, &["--ctx-size", "4096", "--shutdown-grace", "600"]);
    let mut running = long_stream(&server.url);
    sigterm(&server);
    let deadline = Instant::now() + Duration::from_secs(60);
    let refused = loop {
        let (status, body) = post(&server.url, "/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
        if status == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "no 503 while stopping (got {status})");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(refused["error"]["message"].as_str().unwrap().contains("shutting down"), "{refused}");
    // The running reply ends as it would have: its finish, then [DONE].
    let last = last_chunk(&mut running);
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert!(server.child.wait().unwrap().success(), "the server exits cleanly once the reply is done");
}

#[test]
fn sigterm_ends_a_reply_still_running_after_the_grace_period() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let mut server = Serve::start(&model, &["--ctx-size", "16384", "--shutdown-grace", "0.5"]);
    let mut running = long_stream(&server.url);
    sigterm(&server);
    let last = last_chunk(&mut running);
    let message = last["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("stopped before the reply was complete"), "the last chunk says why: {last}");
    assert!(server.child.wait().unwrap().success());
}

/// One access-log line per request on stderr (method, path, status,
/// tokens, milliseconds), a streamed one when its stream ends; `-q`
/// silences them.
#[test]
fn each_request_writes_one_access_log_line() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let log = dir.path().join("stderr.txt");
    let mut server = Serve::start_with(&model, &[], std::process::Stdio::from(std::fs::File::create(&log).unwrap()));
    let url = server.url.clone();
    let (status, _) = post(&url, "/v1/completions", &json!({"prompt": "Once", "max_tokens": 3}));
    assert_eq!(status, 200);
    let events =
        stream(&url, "/v1/chat/completions", &json!({"messages": user("hi"), "max_tokens": 2, "stream": true}));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(get(&url, "/nowhere", None).0, 404);
    // A stream whose client leaves writes its line too, once the server
    // notices (status 499, as nginx writes it).
    drop(long_stream(&url));
    let deadline = Instant::now() + Duration::from_secs(300);
    while !std::fs::read_to_string(&log).unwrap().contains("/v1/chat/completions 499 ") {
        assert!(Instant::now() < deadline, "no access-log line for the cancelled stream");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(" ms") && l.contains("tokens")).collect();
    let line = regex::Regex::new(r"^bmoe serve: (GET|POST) (\S+) (\d{3}) tokens (\d+\+\d+|-) \d+ ms$").unwrap();
    assert!(lines.iter().all(|l| line.is_match(l)), "{text}");
    let find = |path: &str| lines.iter().find(|l| l.contains(&format!(" {path} "))).copied();
    let completion = find("/v1/completions").unwrap_or_else(|| panic!("no line for the completion:\n{text}"));
    assert!(completion.contains(" 200 tokens ") && completion.contains("+3 "), "{completion}");
    let chat = find("/v1/chat/completions").unwrap_or_else(|| panic!("no line for the stream:\n{text}"));
    assert!(chat.contains("+2 "), "{chat}");
    assert!(find("/nowhere").is_some_and(|l| l.contains(" 404 ")), "{text}");
    assert_eq!(lines.iter().filter(|l| l.contains("/v1/")).count(), 3, "one line per request:\n{text}");
    assert!(
        lines.iter().any(|l| l.contains("/v1/chat/completions 499 tokens - ")),
        "no line for the cancelled stream:\n{text}"
    );
    // -q writes none.
    let quiet_log = dir.path().join("quiet.txt");
    let mut quiet =
        Serve::start_with(&model, &["-q"], std::process::Stdio::from(std::fs::File::create(&quiet_log).unwrap()));
    let (status, _) = post(&quiet.url, "/v1/completions", &json!({"prompt": "Once", "max_tokens": 3}));
    assert_eq!(status, 200);
    let _ = quiet.child.kill();
    let _ = quiet.child.wait();
    let text = std::fs::read_to_string(&quiet_log).unwrap();
    assert!(!text.contains("/v1/completions"), "-q still logs requests:\n{text}");
}

#[test]
fn a_preflight_without_cors_is_answered_405_naming_cors() {
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &[]);
    let (code, text) = raw(
        &server.url,
        b"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://localhost:3000\r\n\
          Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(code, 405, "{text}");
    assert!(text.contains("--cors"), "the 405 does not name --cors: {text}");
}

#[test]
fn the_try_line_works_when_pasted_into_a_shell() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["serve", "--port", "0", "-t", "1", "-m", model.to_str().unwrap(), "--api-key", "sesame"])
        .env("BMOE_API_KEY", "sesame")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map(Result::unwrap);
    let first = lines.by_ref().find(|l| l.contains("try:")).expect("a try line");
    let pasted = format!("{}\n{}", first.split_once("try:").unwrap().1.trim(), lines.next().unwrap());
    std::thread::spawn(move || for _ in lines {});
    // The shell's words for the pasted line, curl's arguments.
    let words = Command::new("bash")
        .arg("-c")
        .arg(pasted.replacen("curl", "printf '%s\\n'", 1))
        .env("BMOE_API_KEY", "sesame")
        .output()
        .unwrap();
    let words = String::from_utf8(words.stdout).unwrap();
    let words: Vec<&str> = words.lines().collect();
    assert!(words.contains(&"Authorization: Bearer sesame"), "the key is not in the pasted line's words: {words:?}");
    // The request those words make is answered.
    let url = words[0];
    let mut request = agent().post(url);
    for pair in words.windows(2).filter(|w| w[0] == "-H") {
        let (name, value) = pair[1].split_once(": ").unwrap();
        request = request.header(name, value);
    }
    let body = words.windows(2).find(|w| w[0] == "-d").unwrap()[1];
    let base = url.trim_end_matches("/v1/chat/completions");
    let deadline = Instant::now() + Duration::from_secs(300);
    while get(base, "/health", None).0 != 200 {
        assert!(Instant::now() < deadline, "bmoe serve never became ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = request.send(body).unwrap().status().as_u16();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "the pasted line's request was refused");
}

/// Each request at once holds a whole context: the server states the KV
/// cache llama.cpp allocated for them all (the ready line and
/// `/v1/models`), four contexts and the spare five times one, and `bmoe
/// fit --parallel` estimates it within 10%.
#[test]
fn the_kv_memory_of_every_slot_is_stated_and_fit_agrees() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let stated = |parallel: &str| {
        let server = Serve::start(&model, &["-c", "32768", "--parallel", parallel]);
        let (status, text) = get(&server.url, "/v1/models", None);
        assert_eq!(status, 200, "{text}");
        let meta = serde_json::from_str::<Value>(&text).unwrap()["data"][0]["meta"].clone();
        assert_eq!(
            (meta["n_ctx"].as_u64(), meta["n_parallel"].as_u64()),
            (Some(32768), parallel.parse().ok()),
            "{meta}"
        );
        meta["kv_cache_bytes"].as_u64().unwrap()
    };
    let (one, four) = (stated("1"), stated("4"));
    assert!(one > 0 && four == 5 * one, "KV cache {one} bytes at --parallel 1, {four} at 4 (and the spare)");
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["fit", "-m", model.to_str().unwrap(), "-c", "32768", "--parallel", "4"])
        .args(["--disk-mbps", "1000", "--compute-gws", "10"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = String::from_utf8(out.stdout).unwrap();
    let line = report.lines().find(|l| l.starts_with("context:")).unwrap_or_else(|| panic!("{report}"));
    let mib: f64 = line.split("KV cache ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap().parse().unwrap();
    let estimated = mib * 1048576.0;
    let off = (estimated - four as f64).abs() / four as f64;
    assert!(off <= 0.10, "fit says {mib} MiB, the server allocated {four} bytes: {line}");
    assert!(report.contains("--parallel 4"), "{report}");
}
