//! Plugins inside real generations: speculative decoding must emit exactly
//! plain greedy decoding's tokens; a keep-all drop policy must not change a
//! bit; hostile plugins are disabled with a named fault and the run's output
//! stays what it is without them.

mod common;

use bmoe::engine::{Event, GenerateRequest, Generation, Session, SessionOptions};
use bmoe::llama::Sampling;
use bmoe::policy::wasm::{Limits, Source, WasmDrafter, WasmDropper, fixture};
use bmoe::policy::{Drafter, Dropper};
use bmoe::synth::Arch;
use common::*;

/// The options of a run that verifies drafts: `batch_invariant = auto`
/// gives it the batch-invariant kernels, so a verify batch's logits are
/// those of decoding its tokens one at a time.
fn options(model: &std::path::Path, stream: Option<bmoe::engine::StreamOptions>) -> SessionOptions {
    SessionOptions { batch_invariant: true, ..common::options(model, stream) }
}

const N: u32 = 64;

fn request(prompt: &str, n: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.into(),
        n_predict: n,
        sampling: Sampling::default(),
        continue_context: false,
        keep_logits: true,
        constraint: None,
    }
}

/// The test limits for a plugin configured with `params`.
fn limits(params: &[(&str, &str)]) -> Limits {
    hostile_limits(params.iter().find(|(k, _)| *k == "mode").map_or("", |(_, v)| v))
}

fn drafter(source: Source, params: &[(&str, &str)], n_vocab: usize) -> Drafter {
    let p: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let w = WasmDrafter::load(&source, &p, limits(params)).unwrap();
    Drafter::new(&w.info().name.clone(), Box::new(w), n_vocab)
}

fn dropper(source: Source, params: &[(&str, &str)], n_expert: u32) -> Dropper {
    let p: Vec<(String, String)> = params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let w = WasmDropper::load(&source, &p, limits(params)).unwrap();
    Dropper::new(&w.info().name.clone(), Box::new(w), n_expert)
}

/// Generates with `setup` applied to the session; returns the generation,
/// the (drafted, accepted) totals and the notices.
fn generate(
    opts: SessionOptions,
    prompt: &str,
    setup: impl FnOnce(&mut Session),
) -> (Generation, (u32, u32), Vec<String>) {
    let _serial = llama_lock();
    let mut s = Session::open(opts).unwrap();
    setup(&mut s);
    let mut totals = (0, 0);
    let mut notices = Vec::new();
    let g = s
        .generate(&request(prompt, N), &mut |e| match e {
            Event::Step(r) => {
                totals.0 += r.drafted;
                totals.1 += r.accepted;
            }
            Event::Notice(n) => notices.push(n.to_string()),
            _ => {}
        })
        .unwrap();
    (g, totals, notices)
}

/// Tokens must match; on a mismatch, say where and how close the call was.
fn assert_same_tokens(reference: &Generation, got: &Generation, what: &str) {
    if let Some(i) = reference.tokens.iter().zip(&got.tokens).position(|(a, b)| a != b) {
        let mut l: Vec<f32> = reference.logits[i].clone();
        l.sort_by(|a, b| b.total_cmp(a));
        panic!(
            "{what}: speculative decoding flipped token {i} ({} vs {}); the top-2 logit gap there is {}",
            reference.tokens[i],
            got.tokens[i],
            l[0] - l[1]
        );
    }
    assert_eq!(reference.tokens.len(), got.tokens.len(), "{what}: token counts");
}

/// A prompt whose second half repeats text the model is about to generate,
/// so drafts from it are (mostly) right.
fn repetitive_prompt(model: &std::path::Path) -> String {
    let (g, _, _) = generate(options(model, None), "Hello", |_| {});
    format!("Hello{}Hello", &g.text[..g.text.len().min(40)])
}

#[test]
fn every_bundled_drafter_reproduces_greedy_decoding() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let prompt = repetitive_prompt(&m);
    let (reference, _, _) = generate(options(&m, None), &prompt, |_| {});
    for name in ["ngram", "ngram-multi", "suffix"] {
        for stream in [None, stream0(2, true), cached(100 * 1024, 2)] {
            let what = format!("{name} with {stream:?}");
            let (g, (drafted, accepted), notices) = generate(options(&m, stream), &prompt, |s| {
                let n = s.n_vocab();
                s.set_drafter(Some(drafter(Source::parse(name), &[], n)), 4);
            });
            assert_same_tokens(&reference, &g, &what);
            assert!(notices.is_empty(), "{what}: {notices:?}");
            assert!(drafted > 0 && accepted > 0, "{what}: drafted {drafted}, accepted {accepted}");
            assert!(g.summary.decode_steps < u64::from(N) - 1, "{what}: drafting saved no decode steps");
        }
    }
}

/// A test policy that knows the right continuation and drafts it with one
/// deliberate mistake per step, at a position that cycles, so verification
/// accepts 0, 1, ... max drafts in turn.
struct Oracle {
    truth: Vec<i32>,
    /// Context length when the first generated token was appended.
    base: usize,
    len: usize,
    step: usize,
}

impl bmoe::policy::DraftPolicy for Oracle {
    fn reset(&mut self, context: &[i32]) -> Result<(), String> {
        self.base = context.len() - 1;
        self.len = context.len();
        Ok(())
    }
    fn observe(&mut self, accepted: &[i32]) -> Result<(), String> {
        self.len += accepted.len();
        Ok(())
    }
    fn draft(&mut self, max: u32) -> Result<Vec<i32>, String> {
        let next = self.len - self.base;
        let wrong_at = self.step % (max as usize + 1);
        self.step += 1;
        Ok((0..max as usize)
            .filter_map(|j| self.truth.get(next + j).map(|&t| if j == wrong_at { (t + 1) % 300 + 3 } else { t }))
            .collect())
    }
}

#[test]
fn rejected_drafts_roll_back_cleanly() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let turns = [PROMPT, " and then", " finally, the end."];
    let (reference, _) = run_turns(options(&m, None), &turns, 24);
    for stream in [None, cached(100 * 1024, 2)] {
        let _serial = llama_lock();
        let mut s = Session::open(options(&m, stream.clone())).unwrap();
        let n = s.n_vocab();
        let oracle = Oracle { truth: reference[0].tokens.clone(), base: 0, len: 0, step: 0 };
        s.set_drafter(Some(Drafter::new("oracle", Box::new(oracle), n)), 3);
        let mut per_step = Vec::new();
        let g = s
            .generate(&request(turns[0], 24), &mut |e| {
                if let Event::Step(r) = e {
                    per_step.push((r.drafted, r.accepted));
                }
            })
            .unwrap();
        assert_same_tokens(&reference[0], &g, &format!("oracle turn, {stream:?}"));
        for a in 0..=2 {
            assert!(per_step.iter().any(|&(d, acc)| d == 3 && acc == a), "no step accepted exactly {a}: {per_step:?}");
        }
        // The context left behind holds plain decoding's tokens: later turns
        // agree. (Their logits may differ in the last bits: K/V rows written
        // by a batched verify pass are not bit-identical to one-token passes.)
        s.set_drafter(None, 0);
        for (i, prompt) in turns.iter().enumerate().skip(1) {
            let req = GenerateRequest { continue_context: true, ..request(prompt, 24) };
            let g = s.generate(&req, &mut |_| {}).unwrap();
            assert_same_tokens(&reference[i], &g, &format!("turn {i} after speculative turn 0, {stream:?}"));
        }
    }
}

#[test]
fn one_token_turns_keep_the_conversation_whole() {
    // With n_predict 1 the only token is never verified; it must still be
    // carried into the next turn, exactly as plain decoding does.
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let turns = [PROMPT, " more", " and more"];
    let (reference, _) = run_turns(options(&m, None), &turns, 1);
    let _serial = llama_lock();
    let mut s = Session::open(options(&m, None)).unwrap();
    let n = s.n_vocab();
    s.set_drafter(Some(drafter(Source::parse("ngram"), &[], n)), 3);
    for (i, prompt) in turns.iter().enumerate() {
        let req = GenerateRequest { continue_context: i > 0, ..request(prompt, 1) };
        let g = s.generate(&req, &mut |_| {}).unwrap();
        assert_identical(&reference[i], &g, &format!("turn {i}"));
    }
}

#[test]
fn hostile_drafters_leave_the_output_unchanged() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _, _) = generate(options(&m, stream0(1, true)), PROMPT, |_| {});
    for (mode, expect) in [
        ("loop", "ran past its 20 ms CPU-time limit"),
        ("grow", "memory limit"),
        ("trap", "trapped"),
        ("huge", "more than"),
        ("oov", "outside the vocabulary"),
        ("negative", "token id -5"),
        ("loop-reset", "ran past"),
    ] {
        let (g, _, notices) = generate(options(&m, stream0(1, true)), PROMPT, |s| {
            let n = s.n_vocab();
            s.set_drafter(Some(drafter(Source::File(fixture("hostile-drafter")), &[("mode", mode)], n)), 3);
        });
        assert_same_tokens(&reference, &g, mode);
        assert_eq!(notices.len(), 1, "{mode}: {notices:?}");
        assert!(
            notices[0].contains("`hostile-drafter` disabled") && notices[0].contains(expect),
            "{mode}: {notices:?}"
        );
    }
}

#[test]
fn keep_all_drop_policy_is_byte_identical() {
    let dir = tempdir();
    for arch in [Arch::Qwen3Moe, Arch::Gemma4, Arch::GptOss] {
        let m = write_tiny(dir.path(), &format!("{arch:?}.gguf"), arch, |_| {});
        let (resident, _, _) = generate(options(&m, None), PROMPT, |_| {});
        for stream in [stream0(1, true), cached(100 * 1024, 2)] {
            for (source, params) in [
                (Source::File(fixture("hostile-dropper")), vec![("mode", "keep")]),
                (Source::parse("drop-cold"), vec![("F", "0")]),
            ] {
                let (g, _, notices) = generate(options(&m, stream.clone()), PROMPT, |s| {
                    let n = s.info().n_expert;
                    s.set_dropper(Some(dropper(source.clone(), &params, n))).unwrap();
                });
                assert_identical(&resident, &g, &format!("{arch:?}, keep-all {source:?} with {stream:?}"));
                assert!(notices.is_empty());
                assert_eq!(g.summary.dropped, 0);
                assert!(g.summary.routings > 0, "the policy was consulted");
            }
        }
    }
}

#[test]
fn dropping_skips_reads_and_changes_the_output() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |s| s.experts_used = 4);
    let (plain, _, _) = generate(options(&m, cached(100 * 1024, 2)), PROMPT, |_| {});
    let (dropped, _, _) = generate(options(&m, cached(100 * 1024, 2)), PROMPT, |s| {
        let n = s.info().n_expert;
        s.set_dropper(Some(dropper(Source::parse("drop-cold"), &[("F", "1")], n))).unwrap();
    });
    assert!(dropped.summary.dropped > 0 && dropped.summary.avoided_bytes > 0);
    assert!(dropped.summary.decode_bytes < plain.summary.decode_bytes, "dropping reads less");
    assert!(first_difference(&plain, &dropped).is_some(), "dropping is lossy: logits must change");
}

#[test]
fn hostile_droppers_leave_the_output_unchanged() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let (reference, _, _) = generate(options(&m, cached(100 * 1024, 2)), PROMPT, |_| {});
    for (mode, expect) in [
        ("unrouted", "did not route"),
        ("out-of-range", "out of range"),
        ("all", "every routed expert"),
        ("duplicate", "twice"),
        ("trap", "trapped"),
        ("loop", "ran past"),
        ("grow", "memory limit"),
    ] {
        let (g, _, notices) = generate(options(&m, cached(100 * 1024, 2)), PROMPT, |s| {
            let n = s.info().n_expert;
            s.set_dropper(Some(dropper(Source::File(fixture("hostile-dropper")), &[("mode", mode)], n))).unwrap();
        });
        assert_identical(&reference, &g, mode);
        assert_eq!(notices.len(), 1, "{mode}: {notices:?}");
        assert!(
            notices[0].contains("`hostile-dropper` disabled") && notices[0].contains(expect),
            "{mode}: {notices:?}"
        );
    }
}

#[test]
fn drop_policies_need_streaming_and_drafting_needs_greedy() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", Arch::Qwen3Moe, |_| {});
    let _serial = llama_lock();
    let mut s = Session::open(options(&m, None)).unwrap();
    let n = s.info().n_expert;
    assert!(
        s.set_dropper(Some(dropper(Source::parse("drop-cold"), &[], n)))
            .unwrap_err()
            .to_string()
            .contains("--moe-stream")
    );
    let nv = s.n_vocab();
    s.set_drafter(Some(drafter(Source::parse("ngram"), &[], nv)), 3);
    let sampled = GenerateRequest { sampling: Sampling { temp: 0.7, ..Sampling::default() }, ..request(PROMPT, 8) };
    assert!(s.generate(&sampled, &mut |_| {}).unwrap_err().to_string().contains("greedy"));
}
