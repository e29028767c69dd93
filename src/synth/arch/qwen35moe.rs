//! `qwen35moe` (Qwen3.5-35B-A3B, Qwen3.5-397B-A17B, Qwen3.6): Qwen3-Next's
//! delta-net hybrid with separate beta/alpha projections and multi-section
//! rope, plus an MTP (next-n) layer after the trunk.

use super::Generator;
use super::qwen3next::{gated_attention, hybrid_check, hybrid_keys, is_recurrent};
use crate::gguf::{Value, ValueType};
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Moe, Shared};
use crate::synth::recurrent::{self, BetaAlpha};

pub(super) const GENERATOR: Generator =
    Generator { name: "qwen35moe", defaults, check, build, expert_gain: 0.92, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
    spec.mtp_layers = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    hybrid_check(spec)?;
    if spec.mtp_layers > 1 {
        return Err("qwen35moe's MTP graph takes one next-n layer".into());
    }
    super::only(spec, true, false, true)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    hybrid_keys(b);
    b.key_u32("nextn_predict_layers", s.mtp_layers);
    // Text positions use the first sections of the multi-section rope
    // (the release's [11, 11, 10, 0] for 64 rope dimensions, scaled).
    let half = s.head_dim / 8;
    let sections = [half - half / 4 - half / 4, half / 4, half / 4, 0];
    let sections = sections.iter().map(|&v| Value::I32(v as i32)).collect();
    b.key("rope.dimension_sections", Value::Array(ValueType::I32, sections));
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: true });
    for l in 0..s.layers + s.mtp_layers {
        b.norm(blk(l, "attn_norm"), d);
        if l < s.layers && is_recurrent(l) {
            recurrent::delta_net(b, l, BetaAlpha::Split);
        } else {
            gated_attention(b, l);
        }
        b.norm(blk(l, "post_attention_norm"), d);
        pieces::moe(b, l, Moe { shared, ..Moe::SPLIT });
        if l >= s.layers {
            pieces::nextn(b, l, false);
        }
    }
}
