//! The APIs `bmoe serve` speaks beside chat completions: Anthropic's
//! Messages, OpenAI's Responses and Ollama's own. Each is driven by its
//! official Python package (a streamed two-turn tool loop, thinking on and
//! off), and each endpoint's greedy reply is `bmoe generate --chat`'s on the
//! same conversation, logits digest for logits digest.

mod common;

use common::serve::{Serve, agent, client_python, get};

use std::path::{Path, PathBuf};
use std::process::Command;

use bmoe::synth::Arch;
use serde_json::{Value, json};

/// The bundled template the tests run: Qwen3.5's, which opens a thinking
/// block when thinking is on (so a random model's reply is reasoning) and
/// has a tool-call format bmoe reads.
const TEMPLATE: &str = "qwen3.5";

fn tiny(dir: &Path) -> PathBuf {
    common::write_tiny(dir, "apis.gguf", Arch::Qwen3Moe, |_| {})
}

/// `POST url+path` with a JSON body and extra headers: status, headers'
/// content type, and the body text.
fn post(url: &str, path: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String, String) {
    let mut request = agent().post(format!("{url}{path}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut r = request.send_json(body).expect("a response");
    let kind = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    (r.status().as_u16(), kind, r.body_mut().read_to_string().unwrap())
}

fn post_json(url: &str, path: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = post(url, path, body, &[]);
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}")))
}

/// Runs a client script in tests/clients against `args`; fails the test
/// with its output when it fails.
fn run_client(script: &str, args: &[&str]) {
    let python = client_python();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients").join(script);
    let out = Command::new(python).arg(path).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{script} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_anthropic_python_client_runs_a_streamed_tool_loop() {
    if !common::requires::python_venv("the_anthropic_python_client_runs_a_streamed_tool_loop") {
        return;
    }
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &["--chat-template", TEMPLATE, "--api-key", "sesame"]);
    run_client("anthropic_client.py", &[&server.url, "sesame"]);
}

#[test]
fn the_openai_python_client_runs_a_streamed_tool_loop_on_responses() {
    if !common::requires::python_venv("the_openai_python_client_runs_a_streamed_tool_loop_on_responses") {
        return;
    }
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &["--chat-template", TEMPLATE]);
    run_client("responses_client.py", &[&format!("{}/v1", server.url)]);
}

#[test]
fn the_ollama_python_client_runs_a_streamed_tool_loop() {
    if !common::requires::python_venv("the_ollama_python_client_runs_a_streamed_tool_loop") {
        return;
    }
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &["--chat-template", TEMPLATE, "--tool-choice", "required"]);
    run_client("ollama_client.py", &[&server.url]);
}

/// `bmoe generate --chat`'s per-step logits digests for `prompt` under
/// `system`, greedy, thinking off, with the batch-invariant kernels a
/// server uses.
fn generated_alone(model: &Path, system: &str, prompt: &str, n: u32) -> Value {
    let dir = common::tempdir();
    let digests = dir.path().join("digests.txt");
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-q", "-t", "1", "-m", model.to_str().unwrap(), "--chat", "--chat-template", TEMPLATE])
        .args(["--no-think", "--system", system, "-p", prompt, "-n", &n.to_string(), "--temp", "0"])
        .args(["--logits-digest", digests.to_str().unwrap(), "--batch-invariant"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = std::fs::read_to_string(&digests).unwrap();
    lines.lines().filter_map(|l| l.split_whitespace().nth(1)).map(|d| json!(d)).collect()
}

#[test]
fn every_api_gives_the_solo_runs_greedy_reply_bit_for_bit() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let (system, prompt, n) = ("Be brief.", "Name three rivers", 10);
    let alone = generated_alone(&model, system, prompt, n);
    assert!(alone.as_array().is_some_and(|a| !a.is_empty()), "no digests: {alone}");
    let server = Serve::start(&model, &["--chat-template", TEMPLATE]);
    let url = &server.url;
    let user = json!([{"role": "user", "content": prompt}]);
    let with_system = json!([{"role": "system", "content": system}, {"role": "user", "content": prompt}]);
    let requests = [
        (
            "/v1/chat/completions",
            json!({"messages": with_system, "max_tokens": n, "temperature": 0, "reasoning_effort": "none"}),
        ),
        (
            "/v1/messages",
            json!({"model": "m", "system": system, "messages": user, "max_tokens": n, "temperature": 0,
                   "thinking": {"type": "disabled"}}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "instructions": system, "input": prompt, "max_output_tokens": n,
                   "temperature": 0, "reasoning": {"effort": "none"}}),
        ),
        (
            "/api/chat",
            json!({"model": "m", "messages": with_system, "stream": false, "think": false,
                   "options": {"temperature": 0, "num_predict": n}}),
        ),
        (
            "/api/generate",
            json!({"model": "m", "system": system, "prompt": prompt, "stream": false, "think": false,
                   "options": {"temperature": 0, "num_predict": n}}),
        ),
    ];
    for (path, mut body) in requests {
        body["logits_digest"] = json!(true);
        let (status, reply) = post_json(url, path, &body);
        assert_eq!(status, 200, "{path}: {reply}");
        assert_eq!(reply["logits_digest"], alone, "{path}: the served logits differ from `bmoe generate --chat`'s");
    }
    // Streamed, the digests ride on the closing event or line.
    let streamed = [
        ("/v1/messages", requests_body_stream("/v1/messages", system, prompt, n)),
        ("/api/chat", requests_body_stream("/api/chat", system, prompt, n)),
    ];
    for (path, body) in streamed {
        let (status, _, text) = post(url, path, &body, &[]);
        assert_eq!(status, 200, "{path}: {text}");
        let last = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or(Some(l)))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .rfind(|v| v.get("logits_digest").is_some())
            .unwrap_or_else(|| panic!("{path}: no digests in the stream:\n{text}"));
        assert_eq!(last["logits_digest"], alone, "{path}: streamed logits differ");
    }
}

/// A streamed request of `path`'s API for the conversation of
/// [`every_api_gives_the_solo_runs_greedy_reply_bit_for_bit`].
fn requests_body_stream(path: &str, system: &str, prompt: &str, n: u32) -> Value {
    let user = json!([{"role": "user", "content": prompt}]);
    match path {
        "/v1/messages" => json!({"model": "m", "system": system, "messages": user, "max_tokens": n,
            "temperature": 0, "thinking": {"type": "disabled"}, "stream": true, "logits_digest": true}),
        _ => json!({"model": "m", "messages": [{"role": "system", "content": system}, user[0]], "think": false,
            "options": {"temperature": 0, "num_predict": n}, "logits_digest": true}),
    }
}

#[test]
fn each_api_answers_errors_auth_and_streams_in_its_own_shape() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let log = dir.path().join("stderr.txt");
    let stderr = std::process::Stdio::from(std::fs::File::create(&log).unwrap());
    let mut server =
        Serve::start_with(&model, &["--chat-template", TEMPLATE, "--api-key", "sesame", "--no-think"], stderr);
    let url = server.url.clone();
    let key = [("x-api-key", "sesame")];
    let ask = json!({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]});

    // Anthropic: x-api-key or bearer; errors as {"type": "error", "error": {...}}.
    let (status, _, text) = post(&url, "/v1/messages", &ask, &[]);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (status, &error["type"], &error["error"]["type"]),
        (401, &json!("error"), &json!("authentication_error"))
    );
    let (status, _, text) = post(&url, "/v1/messages", &ask, &[("authorization", "Bearer sesame")]);
    assert_eq!(status, 200, "{text}");
    let mut bad = ask.clone();
    bad["temperature"] = json!(3);
    let (status, _, text) = post(&url, "/v1/messages", &bad, &key);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((status, &error["error"]["type"]), (400, &json!("invalid_request_error")), "{text}");
    assert!(error["error"]["message"].as_str().unwrap().contains("temperature"), "{text}");
    // The stream's events, named, in order.
    let mut streamed = ask.clone();
    streamed["stream"] = json!(true);
    let (status, kind, text) = post(&url, "/v1/messages", &streamed, &key);
    assert_eq!((status, kind.as_str()), (200, "text/event-stream"), "{text}");
    let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"], "{text}");
    assert_eq!(names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"], "{text}");
    let (status, _, text) = post(&url, "/v1/messages/count_tokens", &ask, &key);
    let counted: Value = serde_json::from_str(&text).unwrap();
    assert!(status == 200 && counted["input_tokens"].as_u64().unwrap() > 3, "{text}");

    // Ollama: {"error": "..."}; a stream of JSON lines by default.
    let bearer = [("authorization", "Bearer sesame")];
    let (status, _, text) = post(&url, "/api/chat", &json!({"messages": [{"role": "user", "content": "x"}]}), &[]);
    assert_eq!(status, 401, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string(), "{text}");
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 3}});
    let (status, kind, text) = post(&url, "/api/chat", &chat, &bearer);
    assert_eq!((status, kind.as_str()), (200, "application/x-ndjson"), "{text}");
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.last().unwrap()["done"] == true && lines[..lines.len() - 1].iter().all(|l| l["done"] == false));
    assert_eq!(lines.last().unwrap()["eval_count"], 3, "{text}");
    let mut refused = chat.clone();
    refused["options"]["mirostat"] = json!(2);
    let (status, _, text) = post(&url, "/api/chat", &refused, &bearer);
    assert_eq!(status, 400, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].as_str().unwrap().contains("mirostat"), "{text}");
    let (status, text) = get(&url, "/api/tags", Some("sesame"));
    assert_eq!(status, 200, "{text}");
    let tags: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(tags["models"][0]["details"]["family"], "qwen3moe", "{text}");
    let (status, text) = get(&url, "/api/version", Some("sesame"));
    assert!(status == 200 && text.contains("version"), "{text}");

    // Responses: OpenAI's error shape, named events with sequence numbers.
    let (status, _, text) =
        post(&url, "/v1/responses", &json!({"input": "x", "store": true, "conversation": "c"}), &bearer);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert_eq!((status, &error["error"]["param"]), (400, &json!("conversation")), "{text}");
    let (status, _, text) =
        post(&url, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 3, "stream": true}), &bearer);
    assert_eq!(status, 200, "{text}");
    let events: Vec<Value> =
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(|d| serde_json::from_str(d).unwrap()).collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{text}");
    }
    assert_eq!(events.last().unwrap()["type"], "response.incomplete", "{text}");

    // A 404 names the endpoints, each API's metrics are counted apart, and
    // every request wrote its access-log line (streams too).
    let (status, text) = get(&url, "/api/pull", Some("sesame"));
    assert_eq!(status, 404, "{text}");
    assert!(serde_json::from_str::<Value>(&text).unwrap()["error"].is_string(), "not Ollama's shape: {text}");
    let (status, text) = get(&url, "/v2/anything", Some("sesame"));
    assert!(status == 404 && text.contains("/v1/messages") && text.contains("/api/chat"), "{text}");
    let (_, metrics) = get(&url, "/metrics", Some("sesame"));
    for endpoint in ["/v1/messages", "/v1/responses", "/api/chat", "/api/tags", "/v1/messages/count_tokens"] {
        let line = format!("bmoe_requests_total{{endpoint=\"{endpoint}\",status=\"200\"}}");
        assert!(metrics.contains(&line), "no {line}:\n{metrics}");
    }
    let _ = server.child.kill();
    let _ = server.child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    for path in ["/v1/messages", "/api/chat", "/v1/responses"] {
        let streamed_ok = text.lines().any(|l| l.contains(&format!("POST {path} 200 tokens")) && l.contains("+3 "));
        assert!(streamed_ok, "no access-log line for a streamed {path}:\n{text}");
    }
}

/// A conversation that ends in an assistant message is continued on every
/// endpoint (prefill): its greedy logits are those of the raw completion of
/// the prompt `bmoe template` renders for it, which ends in that message's
/// text, on Qwen3's and gpt-oss's templates.
#[test]
fn a_final_assistant_message_is_continued_on_every_endpoint() {
    let dir = common::tempdir();
    let model = tiny(dir.path());
    let conv = dir.path().join("conv.json");
    let (user, start) = ("Write a poem", "Sure, here");
    let messages = json!([{"role": "user", "content": user}, {"role": "assistant", "content": start}]);
    std::fs::write(&conv, messages.to_string()).unwrap();
    for template in ["qwen3", "gpt-oss"] {
        let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["template", template, "--messages", conv.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let prompt = String::from_utf8(out.stdout).unwrap();
        assert!(prompt.ends_with(start), "{template}: {prompt}");
        let server = Serve::start(&model, &["--chat-template", template]);
        let url = &server.url;
        let n = 8;
        let raw = json!({"prompt": prompt, "max_tokens": n, "temperature": 0, "logits_digest": true});
        let (status, expected) = post_json(url, "/v1/completions", &raw);
        assert_eq!(status, 200, "{expected}");
        let requests = [
            ("/v1/chat/completions", json!({"messages": messages, "max_tokens": n, "temperature": 0})),
            ("/v1/messages", json!({"model": "m", "messages": messages, "max_tokens": n, "temperature": 0})),
            (
                "/v1/responses",
                json!({"model": "m", "input": [{"role": "user", "content": user},
                       {"role": "assistant", "content": [{"type": "output_text", "text": start}]}],
                       "max_output_tokens": n, "temperature": 0}),
            ),
            (
                "/api/chat",
                json!({"model": "m", "messages": messages, "stream": false,
                       "options": {"temperature": 0, "num_predict": n}}),
            ),
        ];
        for (path, mut body) in requests {
            body["logits_digest"] = json!(true);
            let (status, reply) = post_json(url, path, &body);
            assert_eq!(status, 200, "{template} {path}: {reply}");
            assert_eq!(reply["logits_digest"], expected["logits_digest"], "{template} {path}: not the continuation");
        }
        // The reply is the rest of the message: the completion's text, as it came.
        let (_, chat) = post_json(url, "/v1/chat/completions", &requests_chat(&messages, n));
        let text = expected["choices"][0]["text"].as_str().unwrap();
        assert_eq!(chat["choices"][0]["message"]["content"].as_str().unwrap(), text.trim_end(), "{template}");
    }
}

fn requests_chat(messages: &Value, n: u32) -> Value {
    json!({"messages": messages, "max_tokens": n, "temperature": 0})
}
