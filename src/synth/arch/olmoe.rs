//! `olmoe` (OLMoE-1B-7B): full-width q/k norms over the whole projection
//! (so as many KV heads as heads), every layer purely routed (softmax
//! top-k, weights not renormalized).

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator = Generator {
    name: "olmoe",
    defaults,
    derive: super::head_from_embedding,
    check,
    build,
    expert_gain: 1.5,
    ..Generator::BASE
};

fn defaults(spec: &mut ModelSpec) {
    spec.kv_heads = spec.heads;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.kv_heads != spec.heads {
        return Err("olmoe's k norm spans all heads: kv heads must equal heads".into());
    }
    super::attention_spans_embedding(spec)?;
    super::only(spec, false, false, false)
}

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    // The expert width is read from feed_forward_length.
    b.key_u32("feed_forward_length", b.spec.expert_ff);
    b.key_f32("rope.freq_base", 10_000.0);
    b.embeddings();
    let d = b.d();
    for l in 0..b.spec.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention::default());
        b.norm(blk(l, "attn_q_norm"), d);
        b.norm(blk(l, "attn_k_norm"), d);
        b.norm(blk(l, "ffn_norm"), d);
        pieces::moe(b, l, Moe::SPLIT);
    }
}
