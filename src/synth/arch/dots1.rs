//! `dots1` (dots.llm1): a leading dense layer, then sigmoid-routed experts
//! with an expert-selection bias and two shared experts; per-head q/k
//! norms, as many KV heads as heads.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::Builder;
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator =
    Generator { name: "dots1", defaults, check, build, expert_gain: 0.55, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 2;
    spec.dense_layers = 1;
    spec.kv_heads = spec.heads;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.kv_heads != spec.heads {
        return Err("dots1 sizes k and v like q: kv heads must equal heads".into());
    }
    super::needs_shared(spec)?;
    super::only(spec, true, true, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    pieces::sigmoid_routing_keys(b, 2.5);
    b.embeddings();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: false });
    let attention = Attention { qk_norm: true, ..Attention::default() };
    for l in 0..s.layers {
        pieces::decoder_layer(b, l, attention, Moe { selection_bias: true, shared, ..Moe::SPLIT });
    }
}
