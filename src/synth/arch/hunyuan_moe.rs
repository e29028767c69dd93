//! `hunyuan-moe` (Hunyuan-A13B): per-head q/k norms after rope, every layer
//! routed experts (softmax top-k, renormalized) plus an ungated shared MLP.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator = Generator { name: "hunyuan-moe", defaults, check, build, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.shared_experts != 1 {
        return Err("hunyuan-moe has exactly one shared MLP".into());
    }
    super::only(spec, true, false, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    // The experts' width is read from feed_forward_length.
    b.key_u32("feed_forward_length", s.expert_ff);
    b.key_u32("expert_shared_feed_forward_length", s.expert_ff);
    b.key_u32("expert_shared_count", 1);
    b.key_u32("rope.dimension_count", s.head_dim);
    b.embeddings();
    let shared = Some(Shared { width: u64::from(s.expert_ff), gated: false });
    for l in 0..s.layers {
        pieces::decoder_layer(b, l, Attention { qk_norm: true, ..Attention::default() }, Moe { shared, ..Moe::SPLIT });
    }
}
