//! `granitehybrid` (Granite-4.0-H-Tiny, -Small): Mamba-2 layers with an
//! attention layer every fourth, no positional encoding, Granite's
//! embedding / residual / attention / logit multipliers, and in every
//! layer routed experts (softmax top-k, renormalized) plus a shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe, Shared};
use crate::synth::recurrent;

pub(super) const GENERATOR: Generator = Generator {
    name: "granitehybrid",
    defaults,
    derive: super::head_from_embedding,
    check,
    build,
    expert_gain: 57.0,
    ..Generator::BASE
};

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::attention_spans_embedding(spec)?;
    if spec.layers < 3 {
        return Err("granitehybrid attends on layer 2 of every 4: at least 3 layers".into());
    }
    if !spec.embd.is_multiple_of(8) {
        return Err("granitehybrid's Mamba-2 heads are 16 wide: the embedding width must be a multiple of 8".into());
    }
    super::only(spec, true, false, false)
}

/// Layer 2 of every 4 attends; the others are Mamba-2.
fn is_attention(l: u32) -> bool {
    l % 4 == 2
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    recurrent::mamba2_keys(b);
    // The expert width is read from feed_forward_length.
    b.key_u32("feed_forward_length", s.expert_ff);
    b.key_per_layer("attention.head_count_kv", |l| if is_attention(l) { s.kv_heads } else { 0 });
    let width = if s.shared_experts > 0 { pieces::shared_width(b) } else { 0 };
    b.key_u32("expert_shared_feed_forward_length", width as u32);
    b.key_bool("rope.scaling.finetuned", false);
    b.key_f32("embedding_scale", 12.0);
    b.key_f32("residual_scale", 0.22);
    b.key_f32("attention.scale", 1.0 / s.head_dim as f32);
    b.key_f32("logit_scale", 6.0);
    b.embeddings();
    let d = b.d();
    let shared = (width > 0).then_some(Shared { width, gated: false });
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        if is_attention(l) {
            pieces::attention(b, l, Attention::default());
        } else {
            recurrent::mamba2(b, l);
        }
        b.norm(blk(l, "ffn_norm"), d);
        pieces::moe(b, l, Moe { shared, ..Moe::SPLIT });
    }
}
