//! `glm4moe` (GLM-4.5, 4.6, 4.7 and their Air variants): a leading dense
//! layer, then sigmoid-routed experts with an expert-selection bias and a
//! shared expert, partial rope, q/k/v biases, and an MTP (next-n) layer
//! after the trunk (`block_count` counts it; the main graph skips it).

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe, Shared};

pub(super) const GENERATOR: Generator =
    Generator { name: "glm4moe", defaults, check, build, expert_gain: 1.4, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
    spec.dense_layers = 1;
    spec.mtp_layers = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    super::needs_shared(spec)?;
    if spec.mtp_layers > 1 {
        return Err("glm4moe's MTP graph takes one next-n layer".into());
    }
    super::partial_rope(spec, 2)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    b.key_u32("nextn_predict_layers", s.mtp_layers);
    pieces::sigmoid_routing_keys(b, 1.0);
    // Partial rope: half of each head, as the releases do.
    b.key_u32("rope.dimension_count", s.head_dim / 2);
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: false });
    for l in 0..s.layers + s.mtp_layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention { qkv_bias: true, qk_norm: true, ..Attention::default() });
        b.norm(blk(l, "post_attention_norm"), d);
        pieces::ffn_or_moe(b, l, Moe { selection_bias: true, shared, ..Moe::SPLIT });
        if l >= s.layers {
            pieces::nextn(b, l, true);
        }
    }
}
