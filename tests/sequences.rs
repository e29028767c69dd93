//! Several sequences decoded in one batch (the server's concurrent
//! requests): each sequence's greedy tokens equal the same prompt run
//! alone, resident and streamed (cache off and evicting), with prompts
//! joining while others decode. Logits are compared too (closely, not
//! bitwise: a batch of several sequences sums attention and matmuls in
//! another order than a batch of one).

mod common;

use bmoe::engine::{GenerateRequest, Phase, Prompt, Session, SessionOptions, StreamOptions};
use bmoe::llama::Sampling;
use bmoe::synth::Arch;

const PROMPTS: [&str; 4] = [
    "The history of the river",
    "Once upon a time in a small village",
    "Rust is a systems programming language",
    "Seven",
];
const N: usize = 12;

fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as i32
}

/// Each prompt alone: its greedy tokens and the logits each was chosen from.
fn alone(opts: &SessionOptions) -> Vec<(Vec<i32>, Vec<Vec<f32>>)> {
    let _serial = common::llama_lock();
    let mut session = Session::open(opts.clone()).expect("open");
    PROMPTS
        .iter()
        .map(|p| {
            let tokens = session.tokenize_rendered(p);
            let request = GenerateRequest {
                prompt: Prompt::Tokens(tokens),
                n_predict: N as u32,
                sampling: Sampling::default(),
                continue_context: false,
                keep_logits: true,
                grammar: None,
            };
            session.reset();
            let g = session.generate(&request, &mut |_| {}).expect("generate");
            (g.tokens, g.logits)
        })
        .collect()
}

/// All prompts on one session of four sequences: the first two prefill
/// together, the other two join two steps later in batches that also carry
/// the first two's next tokens.
fn together(opts: &SessionOptions) -> Vec<(Vec<i32>, Vec<Vec<f32>>)> {
    let _serial = common::llama_lock();
    let mut session = Session::open(SessionOptions { sequences: 4, ..opts.clone() }).expect("open");
    assert_eq!(session.sequences(), 4);
    let prompts: Vec<Vec<i32>> = PROMPTS.iter().map(|p| session.tokenize_rendered(p)).collect();
    let mut out: Vec<(Vec<i32>, Vec<Vec<f32>>)> = vec![(Vec::new(), Vec::new()); 4];
    // What each sequence feeds next: its prompt, then its last token.
    let mut next: Vec<Option<Vec<i32>>> = vec![Some(prompts[0].clone()), Some(prompts[1].clone()), None, None];
    let mut step = 0;
    while out.iter().any(|(t, _)| t.len() < N) {
        if step == 2 {
            next[2] = Some(prompts[2].clone());
            next[3] = Some(prompts[3].clone());
        }
        let parts: Vec<(usize, &[i32], bool)> =
            next.iter().enumerate().filter_map(|(s, t)| t.as_deref().map(|t| (s, t, true))).collect();
        let phase = if step == 0 { Phase::Prefill } else { Phase::Decode };
        let report = session.decode_seqs(&parts, 0, phase, step).expect("decode").expect("not aborted");
        assert_eq!(report.tokens as usize, parts.iter().map(|p| p.1.len()).sum::<usize>());
        let mut chosen = Vec::new();
        for (i, &(seq, _, _)) in parts.iter().enumerate() {
            let logits = session.part_logits(&parts, i).to_vec();
            let token = argmax(&logits);
            out[seq].0.push(token);
            out[seq].1.push(logits);
            chosen.push((seq, token));
        }
        for (seq, token) in chosen {
            next[seq] = (out[seq].0.len() < N).then(|| vec![token]);
        }
        step += 1;
    }
    for (seq, prompt) in prompts.iter().enumerate() {
        // Each history holds its prompt and every token but the last.
        assert_eq!(session.seq_tokens(seq).len(), prompt.len() + N - 1);
    }
    out
}

fn check(what: &str, stream: Option<StreamOptions>) {
    let dir = common::tempdir();
    let model = common::write_tiny(dir.path(), "seqs.gguf", Arch::Qwen3Moe, |_| {});
    let opts = common::options(&model, stream);
    let reference = alone(&opts);
    let batched = together(&opts);
    for (seq, ((ref_tokens, ref_logits), (tokens, logits))) in reference.iter().zip(&batched).enumerate() {
        assert_eq!(tokens, ref_tokens, "{what}: sequence {seq}'s tokens differ from the prompt run alone");
        for (step, (a, b)) in ref_logits.iter().zip(logits).enumerate() {
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            let scale = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!(worst <= 1e-3 * scale.max(1.0), "{what}: sequence {seq} step {step}: logits differ by {worst}");
        }
    }
    // Different prompts continue differently: the comparison can fail.
    assert!(reference.iter().any(|(t, _)| t != &reference[0].0), "{what}: every prompt gave the same tokens");
}

#[test]
fn sequences_decoded_together_equal_each_alone_resident() {
    check("resident", None);
}

#[test]
fn sequences_decoded_together_equal_each_alone_streamed_cache_off() {
    check("streamed, cache off", common::stream0(2, true));
}

#[test]
fn sequences_decoded_together_equal_each_alone_streamed_evicting() {
    check("streamed, evicting cache", common::cached(96 << 10, 2));
}
