//! `qwen3moe` (Qwen3-30B-A3B, Qwen3-235B-A22B): pre-norm attention with
//! per-head q/k norms, every layer a purely routed MoE (split experts,
//! softmax top-k, normalized weights).

use super::Generator;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator = Generator { name: "qwen3moe", build, ..Generator::BASE };

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    b.embeddings();
    for l in 0..b.spec.layers {
        pieces::decoder_layer(b, l, Attention { qk_norm: true, ..Attention::default() }, Moe::SPLIT);
    }
}
