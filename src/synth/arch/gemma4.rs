//! `gemma4` (Gemma-4-26B-A4B): sliding-window and full attention layers,
//! every block a dense FFN beside a fused-gate/up MoE (from the second
//! layer on), each branch normalized before it joins the residual stream.

use super::Generator;
use crate::gguf::{Value, ValueType};
use crate::synth::ModelSpec;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention};

/// Gemma sizes the experts' output by a norm weight, not the down
/// projection: the architecture's `expert_gain` scales that weight.
pub(super) const GENERATOR: Generator = Generator { name: "gemma4", defaults, check, build, ..Generator::BASE };

fn defaults(spec: &mut ModelSpec) {
    spec.dense_layers = 1;
}

fn check(spec: &ModelSpec) -> Result<(), String> {
    if spec.dense_layers != 1 {
        return Err("gemma4 has exactly one leading dense layer".into());
    }
    Ok(())
}

fn build(b: &mut Builder) {
    let s = b.spec;
    pieces::common_keys(b);
    // Every third layer (and the last) uses full attention, the rest a sliding window.
    let pattern = (0..s.layers).map(|l| Value::Bool(!(l % 3 == 2 || l + 1 == s.layers))).collect();
    b.key("attention.sliding_window_pattern", Value::Array(ValueType::Bool, pattern));
    b.key_u32("attention.sliding_window", 512);
    b.key_u32("attention.key_length_swa", s.head_dim);
    b.key_u32("attention.value_length_swa", s.head_dim);
    b.key_u32("embedding_length_per_layer_input", 0);
    b.key_f32("rope.freq_base_swa", 10_000.0);
    b.embeddings();
    let (d, hd, dff, mix) = (b.d(), u64::from(s.head_dim), u64::from(s.dense_ff), s.routing.mix);
    b.norm("rope_freqs.weight", hd / 2);
    // Gemma normalizes each branch output before adding it; a post-norm weight
    // of mix * |residual entry| gives the same relative size as qwen's scaling.
    // (Gemma scales embeddings by sqrt(d), so a residual entry has std sqrt(2d).)
    let post = mix * (2.0 * d as f32).sqrt();
    // The FFN branch is the dense FFN (normalized to `mix`) plus the routed
    // experts (normalized to `experts`), normalized together again: its
    // weight keeps each part at its size relative to the residual.
    let experts = s.routing.experts * GENERATOR.expert_gain;
    let ffn_post = (mix * mix + experts * experts).sqrt() * (2.0 * d as f32).sqrt();
    for l in 0..s.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention { qk_norm: true, full_out: true, ..Attention::default() });
        b.norm(blk(l, "ffn_norm"), d);
        b.constant(blk(l, "post_attention_norm"), &[d], post);
        b.matrix(blk(l, "ffn_gate"), d, dff);
        b.matrix(blk(l, "ffn_up"), d, dff);
        b.matrix(blk(l, "ffn_down"), dff, d);
        b.constant(blk(l, "post_ffw_norm"), &[d], if l < s.dense_layers { post } else { ffn_post });
        if l < s.dense_layers {
            continue;
        }
        b.router(blk(l, "ffn_gate_inp"), l);
        b.constant(format!("blk.{l}.ffn_gate_inp.scale"), &[d], (d as f32).sqrt());
        b.norm(blk(l, "pre_ffw_norm_2"), d);
        b.constant(blk(l, "post_ffw_norm_1"), &[d], mix);
        b.constant(blk(l, "post_ffw_norm_2"), &[d], experts);
        b.experts(blk(l, "ffn_gate_up_exps"), d, 2 * u64::from(s.expert_ff), 1.0);
        b.expert_outputs(blk(l, "ffn_down_exps"), u64::from(s.expert_ff), 1.0);
    }
}
