//! `llama` with experts (Mixtral 8x7B, 8x22B): llama attention, every layer
//! routed experts (softmax top-k, renormalized), no shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator = Generator { name: "llama", check, build, ..Generator::BASE };

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::only(spec, false, false, false)
}

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    // In llama the experts' width is feed_forward_length; rope covers the whole head.
    b.key_u32("feed_forward_length", b.spec.expert_ff);
    b.key_u32("rope.dimension_count", b.spec.head_dim);
    b.embeddings();
    for l in 0..b.spec.layers {
        pieces::decoder_layer(b, l, Attention::default(), Moe::SPLIT);
    }
}
