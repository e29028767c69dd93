//! `deepseek2` (DeepSeek-V3, R1, V3.1, Kimi-K2; V2 and V2-Lite): multi-head
//! latent attention (low-rank q and a compressed KV latent, absorbed k/v
//! heads), a leading dense layer, then sigmoid-routed experts with an
//! expert-selection bias, expert groups (top groups first, then top-k
//! within them) and a shared expert; an MTP (next-n) layer after the trunk.

use super::Generator;
use crate::synth::Fill;
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Moe, Shared};

pub(super) const GENERATOR: Generator =
    Generator { name: "deepseek2", defaults, check, build, expert_gain: 0.55, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.shared_experts = 1;
    spec.dense_layers = 1;
    spec.mtp_layers = 1;
}

/// Expert groups: four, two of them searched per token (V3 has 8 and 4).
fn groups(spec: &ModelSpec) -> (u32, u32) {
    if spec.experts.is_multiple_of(4) && spec.experts >= 8 { (4, 2) } else { (1, 1) }
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.shared_experts == 0 {
        return Err("deepseek2 as released has shared experts (use --shared-experts 1 or more)".into());
    }
    super::partial_rope(spec, 2)?;
    let (n_group, used) = groups(spec);
    if n_group > 1 && spec.experts_used > used * spec.experts / n_group {
        return Err(format!(
            "deepseek2 picks experts from {used} of {n_group} groups: at most {} experts per token",
            used * spec.experts / n_group
        ));
    }
    Ok(())
}

/// Whether llama.cpp loads this shape as a "lite" model (DeepSeek-V2-Lite
/// and its relatives): queries straight from the embedding, no q latent.
/// llama.cpp decides it by the trunk's depth and the vocabulary size.
fn is_lite(spec: &ModelSpec, n_vocab: u64) -> bool {
    matches!(spec.layers, 26 | 27) || (spec.layers == 48 && n_vocab == 128_256)
}

fn build(b: &mut Builder) {
    let s = b.spec;
    let d = b.d();
    let heads = u64::from(s.heads);
    // MLA widths: a no-rope and a rope part per head, and the two latents.
    let (nope, rope, v_head) = (u64::from(s.head_dim), u64::from(s.head_dim / 2), u64::from(s.head_dim));
    let q_lora = if is_lite(s, b.n_vocab) { 0 } else { (d / 2).max(16) };
    let kv_lora = s.widths.kv_lora.map_or(2 * nope, u64::from);
    pieces::common_keys(b);
    b.key_u32("attention.head_count_kv", 1);
    b.key_u32("attention.key_length", (kv_lora + rope) as u32);
    b.key_u32("attention.value_length", kv_lora as u32);
    b.key_u32("attention.key_length_mla", (nope + rope) as u32);
    b.key_u32("attention.value_length_mla", v_head as u32);
    if q_lora > 0 {
        b.key_u32("attention.q_lora_rank", q_lora as u32);
    }
    b.key_u32("attention.kv_lora_rank", kv_lora as u32);
    b.key_u32("rope.dimension_count", rope as u32);
    b.key_f32("rope.freq_base", 10_000.0);
    b.key_u32("nextn_predict_layers", s.mtp_layers);
    pieces::sigmoid_routing_keys(b, 2.5);
    let (n_group, used) = groups(s);
    if n_group > 1 {
        b.key_u32("expert_group_count", n_group);
        b.key_u32("expert_group_used_count", used);
    }
    b.embeddings();
    let shared = Some(Shared { width: pieces::shared_width(b), gated: false });
    let ty = s.dense_type;
    for l in 0..s.layers + s.mtp_layers {
        b.norm(blk(l, "attn_norm"), d);
        if q_lora > 0 {
            b.norm(blk(l, "attn_q_a_norm"), q_lora);
        }
        b.norm(blk(l, "attn_kv_a_norm"), kv_lora);
        if q_lora > 0 {
            b.matrix(blk(l, "attn_q_a"), d, q_lora);
            b.matrix(blk(l, "attn_q_b"), q_lora, heads * (nope + rope));
        } else {
            b.matrix(blk(l, "attn_q"), d, heads * (nope + rope));
        }
        b.matrix(blk(l, "attn_kv_a_mqa"), d, kv_lora + rope);
        b.tensor(blk(l, "attn_k_b"), &[nope, kv_lora, heads], ty, Fill::Random { std: 1.0 / (nope as f32).sqrt() });
        b.tensor(
            blk(l, "attn_v_b"),
            &[kv_lora, v_head, heads],
            ty,
            Fill::Random { std: 1.0 / (kv_lora as f32).sqrt() },
        );
        b.out_matrix(blk(l, "attn_output"), heads * v_head, d);
        b.norm(blk(l, "ffn_norm"), d);
        pieces::ffn_or_moe(b, l, Moe { selection_bias: true, shared, ..Moe::SPLIT });
        if l >= s.layers {
            pieces::nextn(b, l, true);
        }
    }
}
