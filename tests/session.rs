//! Session behaviour: abort from another thread, disk errors mid-run, and
//! sampling; the session must stay usable and lose nothing.

mod common;

use std::os::unix::fs::FileExt;

use bmoe::engine::{EngineError, Event, GenerateRequest, Session};
use bmoe::llama::{Constraint, Model, RemoteLayers, Sampler, Sampling};
use bmoe::synth::Arch;
use common::*;

fn request(n: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: PROMPT.into(),
        n_predict: n,
        sampling: Sampling::default(),
        continue_context: false,
        keep_logits: true,
        constraint: None,
    }
}

#[test]
fn abort_from_another_thread_leaves_the_session_usable() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), 24);
    let _serial = llama_lock();
    for stream in [None, stream0(2, true), cached(100 * 1024, 2)] {
        let mut session = Session::open(options(&m, stream.clone())).unwrap();
        let handle = session.abort_handle();
        // Abort from a second thread once the fifth token is out, and wait
        // until it has raised the flag (no sleep: the order is guaranteed).
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let aborter = std::thread::spawn(move || {
            if go_rx.recv().is_ok() {
                handle.abort();
                let _ = done.send(());
            }
        });
        let mut go = Some(go);
        let mut seen = 0;
        let g = session
            .generate(&request(24), &mut |e| {
                if let Event::Token { .. } = e {
                    seen += 1;
                    if seen == 5 {
                        let _ = go.take().map(|t| t.send(()));
                        done_rx.recv().expect("the aborter raised the flag");
                    }
                }
            })
            .unwrap();
        aborter.join().unwrap();
        assert!(g.aborted, "{stream:?}: the generation should report the abort");
        assert!(g.tokens.len() < 24 && g.tokens.len() >= 5);
        assert_eq!(g.tokens[..], reference.tokens[..g.tokens.len()], "output before the abort is the normal output");
        // A fresh generation on the same session equals a fresh run.
        let again = session.generate(&request(24), &mut |_| {}).unwrap();
        assert!(!again.aborted);
        assert_identical(&reference, &again, &format!("after abort, {stream:?}"));
    }
}

#[test]
fn disk_error_mid_run_is_reported_and_recoverable() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), 24);
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    // The last tensor of the file: blk.3.ffn_down_exps. Cut the file inside it.
    let last = files.locate("blk.3.ffn_down_exps.weight").unwrap();
    let cut = last.file_offset + last.info.size / 4;
    let original = std::fs::read(&m).unwrap();
    let _serial = llama_lock();
    let mut session = Session::open(options(&m, stream0(2, false))).unwrap();
    std::fs::OpenOptions::new().write(true).open(&m).unwrap().set_len(cut).unwrap();
    let err = session.generate(&request(24), &mut |_| {}).unwrap_err();
    assert!(matches!(err, EngineError::Stream(_)), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("layer 3") && msg.contains("m.gguf"), "the error names the layer and file: {msg}");
    // Restore the file: the same session now produces the exact reference output.
    let f = std::fs::OpenOptions::new().write(true).open(&m).unwrap();
    f.write_all_at(&original[cut as usize..], cut).unwrap();
    let g = session.generate(&request(24), &mut |_| {}).unwrap();
    assert_identical(&reference, &g, "after a disk error");
}

#[test]
fn seeded_sampling_repeats_and_streams_identically() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let sampled = GenerateRequest {
        sampling: Sampling { temp: 0.8, top_k: 40, top_p: 0.95, seed: 7, ..Sampling::default() },
        ..request(24)
    };
    let _serial = llama_lock();
    let go = |stream| Session::open(options(&m, stream)).unwrap().generate(&sampled, &mut |_| {}).unwrap();
    let a = go(None);
    assert_identical(&a, &go(None), "same seed, resident");
    assert_identical(&a, &go(cached(100 * 1024, 2)), "same seed, streamed");
    let greedy = Session::open(options(&m, None)).unwrap().generate(&request(24), &mut |_| {}).unwrap();
    assert_ne!(a.tokens, greedy.tokens, "temperature 0.8 should leave the greedy path");
}

#[test]
fn context_overflow_is_a_request_error() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let _serial = llama_lock();
    let mut session = Session::open(options(&m, stream0(1, true))).unwrap();
    let err = session.generate(&request(600), &mut |_| {}).unwrap_err();
    assert!(matches!(err, EngineError::ContextFull { n_ctx: 512, .. }), "{err}");
    assert!(session.generate(&request(8), &mut |_| {}).is_ok());
}

#[test]
fn an_out_of_range_expert_id_changes_nothing() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _) = run(options(&m, None), 16);
    let _serial = llama_lock();
    let mut session = Session::open(options(&m, cached(64 << 20, 2))).unwrap();
    let store = session.store().unwrap();
    let err = store.load_layer(0, &[3, 99]).unwrap_err().to_string();
    assert!(err.contains("expert 99") && err.contains("layer 0"), "{err}");
    assert!(!store.is_resident(0, 3), "a rejected load must not mark expert 3 resident");
    assert_eq!(store.resident_bytes(), 0);
    let g = session.generate(&request(16), &mut |_| {}).unwrap();
    assert_identical(&reference, &g, "after a rejected load");
}

/// A grammar constrains what is generated: greedy choice over the tokens it
/// allows, the text follows it, and streaming under it gives the resident
/// run's tokens and logits bit for bit (the logits are the model's own; the
/// grammar only chooses among them). A grammar that does not parse, or one
/// with a draft plugin, is refused before anything is decoded, and the
/// session stays usable.
#[test]
fn grammar_constrains_output_and_streams_like_resident() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let grammar = "root ::= \"Answer: \" [a-e]+ \".\"\n";
    let constrained = GenerateRequest { constraint: Some(Constraint::Grammar(grammar.into())), ..request(24) };
    let _serial = llama_lock();
    let generate = |stream| {
        let mut session = Session::open(options(&m, stream)).unwrap();
        session.generate(&constrained, &mut |_| {}).unwrap()
    };
    let resident = generate(None);
    let text = resident.text.as_str();
    let rest = text.strip_prefix("Answer: ").unwrap_or_else(|| panic!("{text:?}"));
    let letters = rest.strip_suffix('.').unwrap_or(rest);
    assert!(!letters.is_empty() && letters.chars().all(|c| ('a'..='e').contains(&c)), "{text:?}");
    let free = Session::open(options(&m, None)).unwrap().generate(&request(24), &mut |_| {}).unwrap();
    assert_ne!(free.tokens, resident.tokens, "the grammar changed nothing");
    for stream in [stream0(2, true), cached(100 * 1024, 2)] {
        assert_identical(&resident, &generate(stream), "streamed under a grammar");
    }

    let mut session = Session::open(options(&m, None)).unwrap();
    let bad = GenerateRequest { constraint: Some(Constraint::Grammar("root ::= [a-".into())), ..request(8) };
    let err = session.generate(&bad, &mut |_| {}).unwrap_err().to_string();
    assert!(err.contains("grammar was refused"), "{err}");
    let again = session.generate(&request(24), &mut |_| {}).unwrap();
    assert_eq!(again.tokens, free.tokens, "the session lost nothing");
}

/// Greedy under a grammar checks the unconstrained choice alone first and
/// masks the whole vocabulary only when the grammar refuses it: the same
/// tokens as masking every step, ties included, on logits where the
/// favourite is allowed about half the time.
#[test]
fn greedy_grammar_shortcut_picks_what_the_full_mask_picks() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let _serial = llama_lock();
    let model = Model::load(&m, &[], &[], &[], false, &RemoteLayers::default()).unwrap();
    let grammar = "root ::= [a-e]+ \".\"\n";
    let mut quick = Sampler::with_grammar(&Sampling::default(), &model, grammar).unwrap();
    let mut full = Sampler::with_grammar(&Sampling::default(), &model, grammar).unwrap().without_shortcut();
    let favourites: Vec<i32> = ["a", "c", "e", "."].iter().flat_map(|t| model.tokenize(t, false)).collect();
    let n = model.n_vocab();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut shortcut_steps, mut ends) = (0, 0);
    for step in 0..400 {
        let mut logits: Vec<f32> = (0..n).map(|_| (next() % 1000) as f32 / 100.0).collect();
        if step % 2 == 0 {
            // A favourite the grammar often allows, tied with a lower id
            // every fourth step.
            let t = favourites[(next() % favourites.len() as u64) as usize] as usize;
            logits[t] = 20.0;
            if step % 4 == 0 && t > 0 {
                logits[t - 1] = 20.0;
            }
        }
        let a = quick.sample(&logits);
        let b = full.sample(&logits);
        assert_eq!(a, b, "step {step}");
        shortcut_steps += usize::from(a.is_some_and(|t| logits[t as usize] == 20.0));
        if a.is_none_or(|t| model.is_eog(t)) {
            ends += 1;
            quick.reset();
            full.reset();
        }
    }
    assert!(shortcut_steps > 50 && ends > 5, "both paths ran: {shortcut_steps} favourites chosen, {ends} ends");
}

/// A JSON schema constrains the text (llguidance): it parses as JSON of
/// the schema's shape, and streamed equals resident under it.
#[test]
fn json_schema_output_parses_and_streams_like_resident() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"},"level":{"enum":["low","high"]},
        "n":{"type":"integer","minimum":0,"maximum":99}},"required":["ok","level"]}"#;
    let req = GenerateRequest { constraint: Some(Constraint::json_schema(schema).unwrap()), ..request(48) };
    let _serial = llama_lock();
    let generate = |stream| Session::open(options(&m, stream)).unwrap().generate(&req, &mut |_| {}).unwrap();
    let resident = generate(None);
    let value: serde_json::Value =
        serde_json::from_str(&resident.text).unwrap_or_else(|e| panic!("{e}: {:?}", resident.text));
    let object = value.as_object().unwrap();
    assert!(object["ok"].is_boolean() && ["low", "high"].contains(&object["level"].as_str().unwrap()), "{value}");
    assert!(
        object.get("n").is_none_or(|n| n.as_i64().is_some_and(|n| (0..=99).contains(&n))) && object.len() <= 3,
        "{value}"
    );
    assert!(resident.stopped_at_eog, "the grammar ends the text at the closing brace");
    // The step that chose the end token kept its logits too: one more vector than tokens.
    let streamed = generate(cached(100 * 1024, 2));
    assert_eq!(streamed.tokens, resident.tokens, "streamed under a JSON schema");
    let bits = |g: &bmoe::engine::Generation| -> Vec<Vec<u32>> {
        g.logits.iter().map(|l| l.iter().map(|x| x.to_bits()).collect()).collect()
    };
    assert!(bits(&streamed) == bits(&resident), "streamed logits differ under a JSON schema");
}
