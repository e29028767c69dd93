//! `qwen3next` (Qwen3-Next-80B-A3B): three gated delta-net layers to one
//! gated full-attention layer, every layer routed experts (softmax top-k,
//! renormalized) plus a sigmoid-gated shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Moe, Shared};
use crate::synth::recurrent::{self, BetaAlpha};

pub(super) const GENERATOR: Generator =
    Generator { name: "qwen3next", defaults, check, build, expert_gain: 0.92, ..Generator::BASE };

/// Every fourth layer has full attention, the rest a delta-net.
pub(super) const FULL_ATTENTION_INTERVAL: u32 = 4;

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    hybrid_check(spec)?;
    super::only(spec, true, false, false)
}

/// Shapes a Qwen delta-net hybrid takes: a full-attention layer, value
/// heads a multiple of key heads, an even rope width.
pub(super) fn hybrid_check(spec: &ModelSpec) -> Result<(), String> {
    let arch = spec.arch.name();
    if spec.layers < FULL_ATTENTION_INTERVAL {
        return Err(format!("{arch} has full attention on every {FULL_ATTENTION_INTERVAL}th layer: at least 4 layers"));
    }
    if spec.shared_experts != 1 {
        return Err(format!("{arch} has exactly one (gated) shared expert"));
    }
    super::partial_rope(spec, 4)
}

/// Whether layer `l` of a Qwen delta-net hybrid is recurrent.
pub(super) fn is_recurrent(l: u32) -> bool {
    !(l + 1).is_multiple_of(FULL_ATTENTION_INTERVAL)
}

/// A Qwen hybrid's gated full attention: `attn_q` carries a per-head
/// output gate beside each query.
pub(super) fn gated_attention(b: &mut Builder, l: u32) {
    let s = b.spec;
    let d = b.d();
    let (q, kv, hd) = (u64::from(s.heads * s.head_dim), u64::from(s.kv_heads * s.head_dim), u64::from(s.head_dim));
    b.matrix(blk(l, "attn_q"), d, 2 * q);
    b.matrix(blk(l, "attn_k"), d, kv);
    b.matrix(blk(l, "attn_v"), d, kv);
    b.out_matrix(blk(l, "attn_output"), q, d);
    b.norm(blk(l, "attn_q_norm"), hd);
    b.norm(blk(l, "attn_k_norm"), hd);
}

/// The keys both Qwen delta-net hybrids write.
pub(super) fn hybrid_keys(b: &mut Builder) {
    pieces::common_keys(b);
    recurrent::delta_net_keys(b);
    let width = pieces::shared_width(b) as u32;
    b.key_u32("expert_shared_feed_forward_length", width);
    b.key_u32("full_attention_interval", FULL_ATTENTION_INTERVAL);
    b.key_u32("rope.dimension_count", b.spec.head_dim / 4);
    b.key_f32("rope.freq_base", 10_000_000.0);
}

fn build(b: &mut Builder) {
    hybrid_keys(b);
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: true });
    for l in 0..b.spec.layers {
        b.norm(blk(l, "attn_norm"), d);
        if is_recurrent(l) {
            recurrent::delta_net(b, l, BetaAlpha::Fused);
        } else {
            gated_attention(b, l);
        }
        b.norm(blk(l, "post_attention_norm"), d);
        pieces::moe(b, l, Moe { shared, ..Moe::SPLIT });
    }
}
