//! `qwen2moe` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): q/k/v biases, every layer
//! routed experts (softmax top-k, weights not renormalized) plus a shared
//! expert behind a sigmoid gate.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator = Generator {
    name: "qwen2moe",
    defaults,
    derive: super::head_from_embedding,
    check,
    build,
    expert_gain: 1.5,
    ..Generator::BASE
};

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::attention_spans_embedding(spec)?;
    super::only(spec, true, false, false)
}

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    let width = pieces::shared_width(b);
    b.key_u32("expert_shared_feed_forward_length", width as u32);
    b.embeddings();
    let shared = (b.spec.shared_experts > 0).then_some(Shared { width, gated: true });
    for l in 0..b.spec.layers {
        pieces::decoder_layer(b, l, Attention { qkv_bias: true, ..Attention::default() }, Moe { shared, ..Moe::SPLIT });
    }
}
