//! An MTP head worth measuring, for synthetic models. A random MTP layer
//! agrees with its model's next-but-one token almost never, so drafting
//! with it measures only the overhead. This rewrites a written model's MTP
//! layer so that its draft is the model's own usual successor of the token
//! it is fed:
//!
//! 1. the model decodes a few prompts greedily, resident, and the token that
//!    most often followed each token is its successor;
//! 2. the MTP layer's own token embeddings become fresh random rows `r_x`,
//!    and its output head's row `v` the sum of the normalized `r_x` of every
//!    token `x` whose successor is `v`, scaled so that a known successor
//!    gets most of the probability;
//! 3. `eh_proj` passes the embedding half through and drops the hidden
//!    state, and the layer's attention and expert outputs are zeroed, so the
//!    layer's output is its input token's row; its experts are still routed
//!    and read, as a real head's are.
//!
//! Tokens never seen get no successor, so the head is unsure there and the
//! probability floor stops the draft. `agree` below 1 gives that share of
//! tokens their successor and the rest a wrong one, to land acceptance where
//! real heads report it.

use std::collections::HashMap;
use std::path::Path;

use crate::engine::{GenerateRequest, Session, SessionOptions};
use crate::gguf::ModelFiles;
use crate::llama::Sampling;
use crate::synth::{mix, rewrite_tensor};

/// Prompts the successors are learned from (not the ones benchmarks use).
const PROMPTS: [&str; 8] = [
    "Once upon a time",
    "The weather today is",
    "In the beginning there was",
    "A list of things to do:",
    "def main():",
    "Dear friend, I write to you",
    "The results of the experiment show",
    "Question: what is the capital of France?",
];

/// Tokens generated per prompt.
const TOKENS_PER_PROMPT: u32 = 96;

/// What building the head found.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadReport {
    /// Tokens generated to learn successors from.
    pub tokens_seen: usize,
    /// Distinct tokens with a successor.
    pub with_successor: usize,
    /// Of those, the ones given their true successor.
    pub agreeing: usize,
}

/// Rewrites the MTP layer of the synthetic model at `path` to agree with
/// the model (`agree`: the share of known successors kept), using `threads`
/// compute threads for the greedy runs.
pub fn write_agreeing_head(path: &Path, agree: f64, seed: u64, threads: u32) -> Result<HeadReport, String> {
    if !(0.0..=1.0).contains(&agree) {
        return Err(format!("agreement must be between 0 and 1 (got {agree})"));
    }
    let files = ModelFiles::open(path).map_err(|e| e.to_string())?;
    let meta = files.meta();
    let mtp = meta.arch_u64("nextn_predict_layers").unwrap_or(0);
    let blocks = meta.arch_u64("block_count").unwrap_or(0);
    if mtp == 0 {
        return Err(format!("{} has no MTP layer to rewrite (make it with --mtp-layers 1)", path.display()));
    }
    let layer = blocks - mtp;
    let name = |t: &str| format!("blk.{layer}.{t}.weight");
    let embed = files.locate(&name("nextn.embed_tokens")).map(|t| t.info.dims.clone());
    let head = files.locate(&name("nextn.shared_head_head")).map(|t| t.info.dims.clone());
    let (Some(embed), Some(_)) = (embed, head) else {
        return Err("this architecture's MTP layer shares the model's embeddings and output head; an agreeing head \
                    needs its own (glm4moe, deepseek2)"
            .into());
    };
    let (d, vocab) = (embed[0] as usize, embed[1] as usize);

    let (successor, seen) = learn_successors(path, threads)?;
    let mut report = HeadReport { tokens_seen: seen, with_successor: successor.len(), agreeing: 0 };
    // Each known successor kept with probability `agree`, else a wrong one.
    let mut target: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut tokens: Vec<_> = successor.into_iter().collect();
    tokens.sort_unstable();
    for (x, s) in tokens {
        let draw = mix(seed ^ 0xa6e3 ^ (x as u64).wrapping_mul(0x9e37)) as f64 / u64::MAX as f64;
        let next = if draw < agree {
            report.agreeing += 1;
            s
        } else {
            (s + 1 + mix(seed ^ x as u64) as usize % (vocab - 1)) % vocab
        };
        target.entry(next).or_default().push(x);
    }

    let row_of = |x: usize, out: &mut [f32]| {
        for (j, v) in out.iter_mut().enumerate() {
            let h = mix(seed ^ 0x5eed ^ ((x as u64) << 24) ^ j as u64);
            *v = (h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
        }
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / d as f32).sqrt().max(1e-6);
        out.iter_mut().for_each(|v| *v /= rms);
    };
    let fail = |e: anyhow::Error| e.to_string();
    rewrite_tensor(&files, &name("nextn.embed_tokens"), &mut |x, out| row_of(x, out)).map_err(fail)?;
    // A known successor's logit: ln(vocab) + 4 over the others', about 98%.
    let scale = ((vocab as f32).ln() + 4.0) / d as f32;
    let mut scratch = vec![0f32; d];
    rewrite_tensor(&files, &name("nextn.shared_head_head"), &mut |v, out| {
        out.fill(0.0);
        for &x in target.get(&v).map_or(&[][..], Vec::as_slice) {
            row_of(x, &mut scratch);
            out.iter_mut().zip(&scratch).for_each(|(o, s)| *o += scale * s);
        }
    })
    .map_err(fail)?;
    // Output i of eh_proj is input i: the embedding half, the hidden state dropped.
    rewrite_tensor(&files, &name("nextn.eh_proj"), &mut |i, out| {
        out.fill(0.0);
        out[i] = 1.0;
    })
    .map_err(fail)?;
    for norm in ["nextn.enorm", "nextn.hnorm", "nextn.shared_head_norm"] {
        rewrite_tensor(&files, &name(norm), &mut |_, out| out.fill(1.0)).map_err(fail)?;
    }
    for zeroed in ["attn_output", "ffn_down_exps", "ffn_down_shexp", "ffn_down"] {
        if files.locate(&name(zeroed)).is_some() {
            rewrite_tensor(&files, &name(zeroed), &mut |_, out| out.fill(0.0)).map_err(fail)?;
        }
    }
    Ok(report)
}

/// Each token's most frequent successor in greedy runs of the model, and
/// how many tokens were generated.
fn learn_successors(path: &Path, threads: u32) -> Result<(HashMap<usize, usize>, usize), String> {
    let options = SessionOptions {
        model: path.to_path_buf(),
        threads: threads.max(1),
        tune: false,
        ctx_size: 512,
        batch: 128,
        ubatch: 128,
        n_expert_used: None,
        stream: None,
        repack: Default::default(),
        mtp: None,
        rpc: None,
        sequences: 1,
        batch_invariant: true,
    };
    let mut session = Session::open(options).map_err(|e| e.to_string())?;
    let mut counts: HashMap<usize, HashMap<usize, u32>> = HashMap::new();
    let mut seen = 0;
    for prompt in PROMPTS {
        let request = GenerateRequest {
            prompt: prompt.into(),
            n_predict: TOKENS_PER_PROMPT,
            sampling: Sampling::default(),
            continue_context: false,
            keep_logits: false,
            constraint: None,
        };
        let g = session.generate(&request, &mut |_| {}).map_err(|e| e.to_string())?;
        seen += g.tokens.len();
        for pair in g.tokens.windows(2) {
            *counts.entry(pair[0] as usize).or_default().entry(pair[1] as usize).or_default() += 1;
        }
    }
    let successor = counts
        .into_iter()
        .map(|(x, next)| (x, next.into_iter().max_by_key(|&(t, n)| (n, std::cmp::Reverse(t))).map_or(0, |(t, _)| t)))
        .collect();
    Ok((successor, seen))
}
