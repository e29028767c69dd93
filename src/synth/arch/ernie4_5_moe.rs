//! `ernie4_5-moe` (ERNIE-4.5-21B-A3B, 300B-A47B): a leading dense layer,
//! then routed experts with an expert-selection bias (softmax weights,
//! renormalized) and shared experts.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator = Generator { name: "ernie4_5-moe", defaults, check, build, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 2;
    spec.dense_layers = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::only(spec, true, true, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    // llama.cpp's graph takes every layer past the dense ones as MoE only with step 1.
    b.key_u32("interleave_moe_layer_step", 1);
    b.key_u32("leading_dense_block_count", s.dense_layers);
    b.key_u32("rope.dimension_count", s.head_dim);
    b.key_f32("rope.freq_base", 500_000.0);
    let width = if s.shared_experts > 0 { pieces::shared_width(b) } else { 0 };
    b.key_u32("expert_shared_feed_forward_length", width as u32);
    b.key_u32("expert_shared_count", s.shared_experts);
    b.embeddings();
    let shared = (width > 0).then_some(Shared { width, gated: false });
    for l in 0..s.layers {
        pieces::decoder_layer(b, l, Attention::default(), Moe { selection_bias: true, shared, ..Moe::SPLIT });
    }
}
