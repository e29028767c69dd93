//! `lfm2moe` (LFM2-8B-A1B, LFM2.5-8B-A1B): short-convolution layers between
//! attention layers, two leading dense layers, then sigmoid-routed experts
//! with an expert-selection bias (weights renormalized).

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe};
use crate::synth::recurrent;

pub(super) const GENERATOR: Generator = Generator {
    name: "lfm2moe",
    defaults,
    derive: super::head_from_embedding,
    check,
    build,
    ties_embeddings: true,
    expert_gain: 1.4,
};

fn defaults(spec: &mut ModelSpec) {
    spec.dense_layers = 2;
    spec.layers = spec.layers.max(spec.dense_layers + 2);
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::attention_spans_embedding(spec)?;
    if !(0..spec.layers).any(|l| is_attention(spec, l)) {
        return Err("lfm2moe needs at least one attention layer".into());
    }
    super::only(spec, false, true, false)
}

/// Whether layer `l` attends (the others convolve): the spec's attention
/// layers, else every odd layer.
fn is_attention(spec: &ModelSpec, l: u32) -> bool {
    match spec.widths.attention_layers {
        Some(bits) => l < 64 && bits >> l & 1 == 1,
        None => l % 2 == 1,
    }
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    b.key_per_layer("attention.head_count_kv", |l| if is_attention(s, l) { s.kv_heads } else { 0 });
    b.key_u32("shortconv.l_cache", recurrent::SHORT_CONV);
    b.key_u32("leading_dense_block_count", s.dense_layers);
    b.key_u32("expert_gating_func", 2);
    b.embeddings_with_norm("token_embd_norm.weight");
    let d = b.d();
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        if is_attention(s, l) {
            pieces::attention(b, l, Attention { qk_norm: true, ..Attention::default() });
        } else {
            recurrent::short_conv(b, l);
        }
        b.norm(blk(l, "ffn_norm"), d);
        pieces::ffn_or_moe(b, l, Moe { selection_bias: true, ..Moe::SPLIT });
    }
}
