//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B): pre-norm attention with
//! per-head q/k norms, every layer a purely routed MoE (split experts,
//! softmax top-k, normalized weights).

use super::Generator;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator = Generator { name: "qwen3moe", build, ..Generator::BASE };

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    b.embeddings();
    let d = b.d();
    for l in 0..b.spec.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention { qk_norm: true, ..Attention::default() });
        b.norm(blk(l, "ffn_norm"), d);
        pieces::moe(b, l, Moe::SPLIT);
    }
}
