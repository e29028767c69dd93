//! `dots1` (dots.llm1): a leading dense layer, then sigmoid-routed experts
//! with an expert-selection bias and two shared experts; per-head q/k
//! norms, as many KV heads as heads.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator = Generator { name: "dots1", defaults, check, build, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 2;
    spec.dense_layers = 1;
    spec.kv_heads = spec.heads;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.kv_heads != spec.heads {
        return Err("dots1 sizes k and v like q: kv heads must equal heads".into());
    }
    if spec.shared_experts == 0 {
        return Err("dots1 needs a shared expert (its graph adds one unconditionally)".into());
    }
    super::only(spec, true, true, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    b.key_u32("leading_dense_block_count", s.dense_layers);
    b.key_u32("expert_shared_count", s.shared_experts);
    b.key_u32("expert_gating_func", 2);
    b.key_bool("expert_weights_norm", true);
    b.key_f32("expert_weights_scale", 2.5);
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: false });
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention { qk_norm: true, ..Attention::default() });
        b.norm(blk(l, "ffn_norm"), d);
        if l < s.dense_layers {
            pieces::dense_ffn(b, l, "", u64::from(s.dense_ff));
        } else {
            pieces::moe(b, l, Moe { selection_bias: true, shared, ..Moe::SPLIT });
        }
    }
}
