//! Several sequences decoded in one batch (the server's concurrent
//! requests) give each sequence bitwise the logits of its prompt run alone:
//! whatever else shares its batches, whichever sequence it lands on,
//! whatever prefix it reuses from the conversation that sequence held
//! before, and however its prompt is split into chunks. Resident and
//! streamed (cache off and evicting). The batch-invariant kernels
//! (`ContextParams::batch_invariant`) are what this gates.

mod common;

use bmoe::engine::{GenerateRequest, Phase, Prompt, Session, SessionOptions, StreamOptions};
use bmoe::gguf::GgmlType;
use bmoe::llama::Sampling;
use bmoe::synth::{Arch, QuantMix};

/// Tokens generated per request.
const N: usize = 10;

/// A request: its prompt, the sequence it runs on, the step it arrives at,
/// the size of the prompt chunks it is fed in, and the sequence whose
/// cells it exchanges with its own first (as the server brings a cached
/// prefix to the slot a request runs in).
struct Arrival {
    prompt: String,
    seq: usize,
    step: u32,
    chunk: usize,
    bring_from: Option<usize>,
}

/// Two sequences exchanging what they hold before a step (as the server
/// keeps its running slots consecutive, and keeps the conversation a move
/// displaces): (step, a, b); either may run a request.
type Swap = (u32, usize, usize);

/// A request's greedy tokens and the logits each was chosen from.
type Run = (Vec<i32>, Vec<Vec<f32>>);

fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// Each prompt alone on a fresh session of one sequence.
fn alone(opts: &SessionOptions, prompts: &[&str]) -> Vec<Run> {
    let _serial = common::llama_lock();
    let mut session = Session::open(opts.clone()).expect("open");
    prompts
        .iter()
        .map(|p| {
            let request = GenerateRequest {
                prompt: Prompt::Tokens(session.tokenize_rendered(p)),
                n_predict: N as u32,
                sampling: Sampling::default(),
                continue_context: false,
                keep_logits: true,
                constraint: None,
            };
            session.reset();
            let g = session.generate(&request, &mut |_| {}).expect("generate");
            (g.tokens, g.logits)
        })
        .collect()
}

/// One sequence's state in [`together`].
struct Running {
    arrival: usize,
    /// Prompt tokens not yet decoded.
    input: Vec<i32>,
    /// The last generated token, decoded with the next step.
    pending: Option<i32>,
    run: Run,
}

/// Runs `arrivals` on one session of `sequences` sequences: every step is
/// one batch holding each running sequence's next token or its next prompt
/// chunk. A request arriving on a sequence keeps the longest prefix that
/// sequence holds (from the request it ran before, or copied there) and
/// decodes the rest; `swaps` exchange two sequences' requests and cells.
/// Returns the runs and how many prompt tokens each arrival reused.
fn together(opts: &SessionOptions, sequences: u32, arrivals: &[Arrival], swaps: &[Swap]) -> (Vec<Run>, Vec<usize>) {
    let _serial = common::llama_lock();
    // Each sequence gets the context a session of one has; a batch holds
    // every sequence's part (the runs alone prefill in chunks of 64).
    let ctx_size = opts.ctx_size * sequences;
    let (batch, ubatch) = (512, 512);
    let mut session =
        Session::open(SessionOptions { sequences, ctx_size, batch, ubatch, ..opts.clone() }).expect("open");
    let mut out: Vec<Option<Run>> = arrivals.iter().map(|_| None).collect();
    let mut running: Vec<Option<Running>> = (0..sequences).map(|_| None).collect();
    let mut step = 0u32;
    let mut reused_any = false;
    let mut kept_by_arrival = vec![0; arrivals.len()];
    while out.iter().any(Option::is_none) {
        for (i, a) in arrivals.iter().enumerate().filter(|(i, a)| a.step <= step && out[*i].is_none()) {
            let started = running.iter().flatten().any(|r| r.arrival == i);
            if started || running[a.seq].is_some() {
                continue;
            }
            let prompt = session.tokenize_rendered(&a.prompt);
            if let Some(from) = a.bring_from {
                let held = session.seq_tokens(from).to_vec();
                assert!(session.seq_swap(from, a.seq), "a KV cache of several sequences can exchange two");
                assert_eq!(session.seq_tokens(a.seq), held);
            }
            let kept = session.seq_keep_prefix(a.seq, &prompt);
            reused_any |= kept > 0;
            kept_by_arrival[i] = kept;
            running[a.seq] =
                Some(Running { arrival: i, input: prompt[kept..].to_vec(), pending: None, run: Run::default() });
        }
        for &(_, a, b) in swaps.iter().filter(|m| m.0 == step) {
            let (held_a, held_b) = (session.seq_tokens(a).to_vec(), session.seq_tokens(b).to_vec());
            assert!(session.seq_swap(a, b), "a KV cache of several sequences can exchange two");
            assert!(
                session.seq_tokens(a) == held_b && session.seq_tokens(b) == held_a,
                "swap {a} <-> {b} at step {step}"
            );
            running.swap(a, b);
        }
        let mut parts: Vec<(usize, Vec<i32>, bool)> = Vec::new();
        for (seq, r) in running.iter_mut().enumerate() {
            let Some(r) = r else { continue };
            if let Some(token) = r.pending.take() {
                parts.push((seq, vec![token], true));
            } else {
                let take = r.input.len().min(arrivals[r.arrival].chunk);
                let chunk: Vec<i32> = r.input.drain(..take).collect();
                parts.push((seq, chunk, r.input.is_empty()));
            }
        }
        if !parts.is_empty() {
            let refs: Vec<(usize, &[i32], bool)> = parts.iter().map(|(s, t, l)| (*s, t.as_slice(), *l)).collect();
            session.decode_seqs(&refs, 0, Phase::Decode, step).expect("decode").expect("not aborted");
            for (i, &(seq, _, logits)) in refs.iter().enumerate() {
                if !logits {
                    continue;
                }
                let row = session.part_logits(&refs, i).to_vec();
                let r = running[seq].as_mut().expect("running");
                let token = argmax(&row);
                r.run.0.push(token);
                r.run.1.push(row);
                if r.run.0.len() == N {
                    let done = running[seq].take().expect("running");
                    out[done.arrival] = Some(done.run);
                } else {
                    r.pending = Some(token);
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "the schedule never finished");
    }
    assert!(reused_any || arrivals.len() <= sequences as usize, "no request reused a prefix");
    (out.into_iter().map(Option::unwrap).collect(), kept_by_arrival)
}

/// Every request's tokens and every step's logits equal its run alone, bit for bit.
fn assert_bitwise(what: &str, reference: &[Run], batched: &[Run]) {
    for (i, ((ref_tokens, ref_logits), (tokens, logits))) in reference.iter().zip(batched).enumerate() {
        assert_eq!(tokens, ref_tokens, "{what}: request {i}'s tokens differ from the prompt run alone");
        assert_eq!(logits.len(), ref_logits.len());
        for (step, (a, b)) in ref_logits.iter().zip(logits).enumerate() {
            let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(
                differ == 0,
                "{what}: request {i} step {step}: {differ} of {} logits differ from its run alone (by up to {worst})",
                a.len()
            );
        }
    }
    // Different prompts give different logits: the comparison can fail.
    assert!(reference.iter().any(|(_, l)| l[0] != reference[0].1[0]), "{what}: every prompt gave the same logits");
}

/// The chat-shaped prompts of the repro: a system line, then a
/// user turn of three repeats; they share their first tokens.
fn turn(bot: u32, topic: &str) -> String {
    format!(
        "<|im_start|>system\nYou are bot {bot}.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        topic.repeat(3)
    )
}

fn check(what: &str, stream: impl Fn() -> Option<StreamOptions>) {
    let dir = common::tempdir();
    // f32 and f16 dense weights (llamafile's sgemm from two columns, and in
    // a batch-invariant context its order for one: src/llama/invariant_sgemm.rs)
    // and llama.cpp's Q4_K_M mix (K-quants: repacked banks, and ggml's tiled
    // matmul for eight columns or more).
    let f32_model = common::write_tiny(dir.path(), "seqs.gguf", Arch::Qwen3Moe, |_| {});
    let f16_model = common::write_tiny(dir.path(), "seqs-f16.gguf", Arch::Qwen3Moe, |s| s.dense_type = GgmlType::F16);
    let k_model =
        common::write_tiny(dir.path(), "seqs-q4km.gguf", Arch::Qwen3Moe, |s| s.quant_mix = Some(QuantMix::Q4KM));
    for (model, weights) in [(f32_model, "f32"), (f16_model, "f16"), (k_model, "q4_k_m")] {
        let opts = SessionOptions { batch_invariant: true, ..common::options(&model, stream()) };
        check_model(&format!("{what}, {weights}"), opts);
    }
}

fn check_model(what: &str, opts: SessionOptions) {
    let long = "The history of the river that runs through the old town, its bridges, mills and floods, ";
    let prompts = [
        turn(5, "Kyoto temples"),
        turn(2, "the history of Rome"),
        format!("{long}told by a miller"),
        format!("{long}told by a ferryman who crossed it every day"),
        "Seven".to_string(),
        "Once upon a time in a small village".to_string(),
        "Rust is a systems programming language".to_string(),
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20".to_string(),
        turn(7, "Kyoto temples"),
    ];
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let reference = alone(&opts, &refs);

    // The repro: P2 on the sequence that held P5 reuses P5's first tokens.
    let after = [
        Arrival { prompt: prompts[0].clone(), seq: 0, step: 0, chunk: 64, bring_from: None },
        Arrival { prompt: prompts[1].clone(), seq: 0, step: 1, chunk: 64, bring_from: None },
    ];
    let batched = together(&opts, 2, &after, &[]).0;
    assert_bitwise(&format!("{what}, P2 after P5"), &[reference[0].clone(), reference[1].clone()], &batched);

    // Eight at once: mixed lengths, two sharing a long prefix, prompts fed
    // in chunks of odd sizes, one arriving mid-decode, and a ninth landing
    // on a sequence that held another conversation.
    let chunks = [64, 3, 5, 7, 1, 64, 2, 9, 4];
    let steps = [0, 0, 0, 0, 0, 0, 0, 6, 0];
    let seqs = [0, 1, 2, 3, 4, 5, 6, 7, 0];
    let mixed: Vec<Arrival> = (0..prompts.len())
        .map(|i| Arrival {
            prompt: prompts[i].clone(),
            seq: seqs[i],
            step: steps[i],
            chunk: chunks[i],
            bring_from: None,
        })
        .collect();
    let batched = together(&opts, 8, &mixed, &[]).0;
    assert_bitwise(&format!("{what}, eight at once"), &reference, &batched);

    // Requests moved to other sequences mid-prompt and mid-reply, one into
    // the sequence another just left, and a prefix brought from the
    // sequence a finished request left to the one a newcomer runs on.
    let arrival =
        |i: usize, seq, step, chunk, bring_from| Arrival { prompt: prompts[i].clone(), seq, step, chunk, bring_from };
    let moved = [
        arrival(2, 3, 0, 64, None),
        arrival(4, 0, 0, 3, None),
        arrival(6, 2, 0, 5, None),
        arrival(3, 1, 13, 64, Some(3)),
    ];
    let (batched, kept) = together(&opts, 5, &moved, &[(1, 2, 4), (4, 0, 2), (7, 4, 0)]);
    assert!(kept[3] >= 8, "{what}: the newcomer reused {} tokens of the prefix brought to it", kept[3]);
    let expected: Vec<Run> = [2, 4, 6, 3].iter().map(|&i| reference[i].clone()).collect();
    assert_bitwise(&format!("{what}, moved and brought"), &expected, &batched);

    // Exchanges: a running request with an empty sequence mid-prompt and
    // mid-reply, two running requests, and a finished conversation carried
    // to another sequence, where a newcomer sharing its long prefix reuses
    // it (prompts 2 and 3 share the river's opening).
    let swapped =
        [arrival(2, 1, 0, 64, None), arrival(4, 0, 0, 3, None), arrival(6, 2, 0, 5, None), arrival(3, 0, 18, 64, None)];
    let (batched, kept) = together(&opts, 5, &swapped, &[(1, 0, 4), (5, 4, 2), (12, 1, 3), (14, 3, 0)]);
    assert!(kept[3] >= 8, "{what}: the newcomer reused {} tokens of the exchanged conversation", kept[3]);
    let expected: Vec<Run> = [2, 4, 6, 3].iter().map(|&i| reference[i].clone()).collect();
    assert_bitwise(&format!("{what}, exchanged"), &expected, &batched);
}

#[test]
fn sequences_decoded_together_equal_each_alone_bitwise_resident() {
    check("resident", || None);
}

#[test]
fn sequences_decoded_together_equal_each_alone_bitwise_streamed_cache_off() {
    check("streamed, cache off", || common::stream0(2, true));
}

#[test]
fn sequences_decoded_together_equal_each_alone_bitwise_streamed_evicting() {
    check("streamed, evicting cache", || common::cached(96 << 10, 2));
}
