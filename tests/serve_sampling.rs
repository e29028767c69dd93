//! What a request's sampling fields do on `bmoe serve`: a fresh seed per
//! request, reported and reproducing the reply; each field of chat
//! completions and completions changing the reply where it should (and
//! each check failing if the field were ignored).

mod common;

use common::serve::{Serve, agent};

use std::path::{Path, PathBuf};

use bmoe::synth::Arch;
use serde_json::{Value, json};

fn tiny(dir: &Path) -> PathBuf {
    common::write_tiny(dir, "sampling.gguf", Arch::Qwen3Moe, |_| {})
}

/// A greedy-by-default completion of a fixed prompt with `extra` fields:
/// its text, each generated token's text, and the whole reply.
fn complete(url: &str, extra: Value) -> (String, Vec<String>, Value) {
    let mut body = json!({"prompt": "The history of the river", "max_tokens": 64, "logprobs": 0});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let mut r = agent().post(format!("{url}/v1/completions")).send_json(&body).expect("a response");
    let status = r.status().as_u16();
    let reply: Value = r.body_mut().read_json().unwrap();
    assert_eq!(status, 200, "{body}: {reply}");
    let text = reply["choices"][0]["text"].as_str().unwrap().to_string();
    let tokens = reply["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    (text, tokens.iter().map(|t| t.as_str().unwrap().to_string()).collect(), reply)
}

/// Tokens that repeat one generated before them.
fn repeats(tokens: &[String]) -> usize {
    tokens.len() - tokens.iter().collect::<std::collections::BTreeSet<_>>().len()
}

#[test]
fn unseeded_requests_differ_and_the_seed_they_report_reproduces_each() {
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &[]);
    let hot = json!({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "logits_digest": true});
    let (a, _, first) = complete(&server.url, hot.clone());
    let (b, _, second) = complete(&server.url, hot.clone());
    assert_ne!(first["seed"], second["seed"], "two requests without a seed drew the same one");
    assert_ne!(a, b, "two unseeded requests at temperature 1 gave the same text");
    for (text, reply) in [(&a, &first), (&b, &second)] {
        let mut seeded = hot.clone();
        seeded["seed"] = reply["seed"].clone();
        let (again, _, replayed) = complete(&server.url, seeded);
        assert_eq!(&again, text, "the reported seed did not reproduce the reply");
        assert_eq!(replayed["logits_digest"], reply["logits_digest"]);
        assert_eq!(replayed["seed"], reply["seed"]);
    }
    // Chat completions report it too, whole and streamed.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 77});
    let mut r = agent().post(format!("{}/v1/chat/completions", server.url)).send_json(&chat).unwrap();
    assert_eq!(r.body_mut().read_json::<Value>().unwrap()["seed"], 77);
}

#[test]
fn each_sampling_field_changes_the_reply_where_it_should() {
    let dir = common::tempdir();
    let server = Serve::start(&tiny(dir.path()), &[]);
    let url = &server.url;
    let (greedy, tokens, _) = complete(url, json!({}));
    // The checks below can fail: the greedy reply repeats itself and is
    // not one token over and over.
    assert!(repeats(&tokens) > 8, "the greedy reply hardly repeats: {tokens:?}");
    assert!(tokens.iter().any(|t| t != &tokens[0]), "{tokens:?}");

    // A bias forces a token, greedy or sampled; the same bias under -100 bans it.
    for extra in [json!({}), json!({"temperature": 1.0, "seed": 3})] {
        let mut biased = extra.clone();
        biased["logit_bias"] = json!({"300": 100});
        let (_, forced, _) = complete(url, biased);
        assert!(forced.iter().all(|t| t == &forced[0]), "logit_bias did not force token 300: {forced:?}");
        let first = forced[0].clone();
        let mut banned = extra;
        banned["logit_bias"] = json!({"300": -100});
        let (_, without, _) = complete(url, banned);
        assert!(!without.contains(&first), "token 300 ({first:?}) came despite a -100 bias: {without:?}");
    }

    // Each penalty stops repeats the greedy reply makes.
    for field in [
        json!({"repeat_penalty": 3.0}),
        json!({"frequency_penalty": 2.0}),
        json!({"presence_penalty": 2.0}),
        json!({"repeat_penalty": 3.0, "repeat_last_n": -1}),
    ] {
        let (text, penalized, _) = complete(url, field.clone());
        assert_ne!(text, greedy, "{field}: the reply did not change");
        assert!(repeats(&penalized) < repeats(&tokens), "{field}: {penalized:?} repeats as much as {tokens:?}");
    }
    // A window of none penalizes nothing.
    let (text, _, _) = complete(url, json!({"repeat_penalty": 3.0, "repeat_last_n": 0}));
    assert_eq!(text, greedy);

    // min_p, typical_p and top_k narrow a draw: two seeds that differ
    // unfiltered agree once only the favourite (or the most typical token)
    // is left.
    let hot = |seed: u32, extra: Value| {
        let mut body = json!({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": seed});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        complete(url, body).0
    };
    assert_ne!(hot(1, json!({})), hot(2, json!({})), "two seeds drew the same text");
    assert_eq!(hot(1, json!({"min_p": 1.0})), greedy, "min_p 1 left more than the favourite");
    assert_eq!(hot(2, json!({"min_p": 1.0})), greedy);
    assert_eq!(hot(1, json!({"top_k": 1})), greedy, "top_k 1 left more than the favourite");
    assert_eq!(hot(1, json!({"typical_p": 1e-6})), hot(2, json!({"typical_p": 1e-6})), "typical_p did not narrow");

    // Out of range, or a token outside the vocabulary: a 400 naming the field.
    for (field, value) in [
        ("presence_penalty", json!(5)),
        ("frequency_penalty", json!(-3)),
        ("repeat_penalty", json!(0)),
        ("min_p", json!(1.5)),
        ("typical_p", json!(0)),
        ("repeat_last_n", json!(-2)),
        ("logit_bias", json!({"300": 101})),
        ("logit_bias", json!({"abc": 1})),
        ("logit_bias", json!({"99999999": 1})),
    ] {
        let body = json!({"prompt": "x", "max_tokens": 2, field: value});
        let mut r = agent().post(format!("{url}/v1/completions")).send_json(&body).unwrap();
        let status = r.status().as_u16();
        let error: Value = r.body_mut().read_json().unwrap();
        assert_eq!((status, error["error"]["param"].as_str()), (400, Some(field)), "{body}: {error}");
    }
}
