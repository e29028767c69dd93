//! `nemotron_h_moe` (Nemotron-3-Nano-30B-A3B): each block is one mixer,
//! Mamba-2, attention or MoE, in the pattern M E * E; the experts are
//! ungated squared-ReLU (`ffn_up_exps`, `ffn_down_exps` only), sigmoid
//! routed with an expert-selection bias, beside an ungated shared expert.

use super::Generator;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Experts, Moe, Shared};
use crate::synth::recurrent;

pub(super) const GENERATOR: Generator =
    Generator { name: "nemotron_h_moe", defaults, check, build, expert_gain: 0.4, ..Generator::BASE };

/// What one block mixes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Mamba,
    Attention,
    Moe,
}

/// The pattern M E * E, repeated.
fn block(l: u32) -> Block {
    match l % 4 {
        0 => Block::Mamba,
        2 => Block::Attention,
        _ => Block::Moe,
    }
}

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.layers < 3 {
        return Err("nemotron_h_moe's pattern M E * E needs at least 3 layers".into());
    }
    if spec.shared_experts != 1 {
        return Err("nemotron_h_moe has exactly one shared expert".into());
    }
    if !spec.embd.is_multiple_of(8) {
        return Err("nemotron_h_moe's Mamba-2 heads are 16 wide: the embedding width must be a multiple of 8".into());
    }
    super::only(spec, true, false, false)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    recurrent::mamba2_keys(b);
    b.key_per_layer("attention.head_count_kv", |l| if block(l) == Block::Attention { s.kv_heads } else { 0 });
    b.key_per_layer("feed_forward_length", |l| if block(l) == Block::Moe { s.expert_ff } else { 0 });
    b.key_f32("attention.layer_norm_epsilon", 1e-5);
    let width = pieces::shared_width(b);
    b.key_u32("expert_shared_feed_forward_length", width as u32);
    b.key_u32("expert_shared_count", s.shared_experts);
    b.key_bool("expert_weights_norm", true);
    b.key_f32("expert_weights_scale", 2.5);
    b.embeddings();
    let d = b.d();
    let shared = Some(Shared { width, gated: false });
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        match block(l) {
            Block::Mamba => recurrent::mamba2(b, l),
            Block::Attention => pieces::attention(b, l, Attention::default()),
            Block::Moe => {
                pieces::moe(b, l, Moe { experts: Experts::UpDown, selection_bias: true, shared, ..Moe::SPLIT })
            }
        }
    }
}
