//! `bailingmoe2` (Ling-mini-2.0, Ling-flash-2.0, Ring-2.0): fused q/k/v with
//! per-head norms and partial rope, a leading dense layer, then
//! sigmoid-routed experts with an expert-selection bias and expert groups,
//! plus a shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Moe, Shared};

pub(super) const GENERATOR: Generator = Generator {
    name: "bailingmoe2",
    defaults,
    derive: super::head_from_embedding,
    check,
    build,
    expert_gain: 0.55,
    ..Generator::BASE
};

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
    spec.dense_layers = 1;
}

/// Expert groups: four, two searched per token (Ling-flash has 8 and 4).
fn groups(spec: &ModelSpec) -> Option<(u32, u32)> {
    (spec.experts.is_multiple_of(4) && spec.experts >= 8).then_some((4, 2))
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::attention_spans_embedding(spec)?;
    super::needs_shared(spec)?;
    super::partial_rope(spec, 2)?;
    if let Some((n, used)) = groups(spec)
        && spec.experts_used > used * spec.experts / n
    {
        return Err(format!(
            "bailingmoe2 picks experts from {used} of {n} groups: at most {} per token",
            used * spec.experts / n
        ));
    }
    super::only(spec, true, true, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    pieces::sigmoid_routing_keys(b, 2.5);
    b.key_u32("rope.dimension_count", s.head_dim / 2);
    if let Some((n, used)) = groups(s) {
        b.key_u32("expert_group_count", n);
        b.key_u32("expert_group_used_count", used);
    }
    b.embeddings();
    let d = b.d();
    let (q, kv, hd) = (u64::from(s.heads * s.head_dim), u64::from(s.kv_heads * s.head_dim), u64::from(s.head_dim));
    let shared = Some(Shared { width: pieces::shared_width(b), gated: false });
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        b.matrix(blk(l, "attn_qkv"), d, q + 2 * kv);
        b.out_matrix(blk(l, "attn_output"), q, d);
        b.norm(blk(l, "attn_q_norm"), hd);
        b.norm(blk(l, "attn_k_norm"), hd);
        b.norm(blk(l, "ffn_norm"), d);
        pieces::ffn_or_moe(b, l, Moe { selection_bias: true, shared, ..Moe::SPLIT });
    }
}
