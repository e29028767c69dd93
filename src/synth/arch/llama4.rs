//! `llama4` (Llama-4 Scout, Maverick): chunked attention with every fourth
//! layer global and without rope, MoE on every other layer (dense FFNs
//! between), one routed expert's sigmoid weight applied to its input
//! before the expert (`weight_before_ffn`), plus a shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator =
    Generator { name: "llama4", defaults, check, build, expert_gain: 0.2, ..Generator::BASE };

/// MoE on layers 1, 3, 5, ... (Maverick's interleave step).
const MOE_STEP: u32 = 2;

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
    spec.layers = spec.layers.max(MOE_STEP);
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.shared_experts != 1 {
        return Err("llama4 has exactly one shared expert".into());
    }
    if spec.layers < MOE_STEP {
        return Err(format!("llama4 puts experts on every {MOE_STEP}nd layer: it needs at least {MOE_STEP} layers"));
    }
    super::only(spec, true, false, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    b.key_u32("interleave_moe_layer_step", MOE_STEP);
    b.key_u32("rope.dimension_count", s.head_dim);
    b.key_f32("rope.freq_base", 500_000.0);
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width: u64::from(s.expert_ff), gated: false });
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention::default());
        b.norm(blk(l, "ffn_norm"), d);
        if (l + 1) % MOE_STEP == 0 {
            pieces::moe(b, l, Moe { shared, ..Moe::SPLIT });
        } else {
            b.dense_ffn(l, "", u64::from(s.dense_ff));
        }
    }
}
