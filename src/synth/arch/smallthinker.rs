//! `smallthinker` (SmallThinker-21B-A3B, 4B-A0.6B): the router reads the
//! layer's input before any norm (routing can start while attention runs),
//! ReGLU experts (softmax top-k, renormalized), sliding-window attention
//! with every fourth layer global and without rope.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator =
    Generator { name: "smallthinker", check, build, expert_gain: 0.6, ..Generator::BASE };

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::only(spec, false, false, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    b.key_u32("expert_gating_func", 1);
    b.key_u32("rope.dimension_count", s.head_dim);
    // Any window turns on llama.cpp's 4096-token window on 3 of 4 layers.
    b.key_u32("attention.sliding_window", 4096);
    b.embeddings();
    for l in 0..s.layers {
        pieces::decoder_layer(b, l, Attention::default(), Moe::SPLIT);
    }
}
