//! `minimax-m2` (MiniMax-M2): q/k norms over all heads, partial rope, every
//! layer sigmoid-routed experts with an expert-selection bias (weights
//! renormalized), no shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator =
    Generator { name: "minimax-m2", check, build, expert_gain: 1.4, ..Generator::BASE };

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::partial_rope(spec, 2)?;
    super::only(spec, false, false, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    // The experts' width is read from feed_forward_length.
    b.key_u32("feed_forward_length", s.expert_ff);
    b.key_u32("expert_gating_func", 2);
    b.key_u32("rope.dimension_count", s.head_dim / 2);
    b.key_f32("rope.freq_base", 5_000_000.0);
    b.embeddings();
    let d = b.d();
    let (q, kv) = (u64::from(s.heads * s.head_dim), u64::from(s.kv_heads * s.head_dim));
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention::default());
        b.norm(blk(l, "attn_q_norm"), q);
        b.norm(blk(l, "attn_k_norm"), kv);
        b.norm(blk(l, "ffn_norm"), d);
        pieces::moe(b, l, Moe { selection_bias: true, ..Moe::SPLIT });
    }
}
