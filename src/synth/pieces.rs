//! Pieces several architectures share: the common metadata, attention, dense
//! FFNs and the MoE block (router, experts, selection bias, shared experts).
//! Recurrent blocks live in [`super::recurrent`].

use super::build::{Builder, blk, blk_bias};

/// Writes the keys almost every llama.cpp loader reads: context, widths,
/// depth, heads, norm epsilon, rope base and the expert counts.
pub fn common_keys(b: &mut Builder) {
    let s = b.spec;
    b.key_u32("context_length", s.ctx);
    b.key_u32("embedding_length", s.embd);
    b.key_u32("block_count", s.layers + s.mtp_layers);
    b.key_u32("feed_forward_length", s.dense_ff);
    b.key_u32("expert_feed_forward_length", s.expert_ff);
    b.key_u32("attention.head_count", s.heads);
    b.key_u32("attention.head_count_kv", s.kv_heads);
    b.key_u32("attention.key_length", s.head_dim);
    b.key_u32("attention.value_length", s.head_dim);
    b.key_f32("attention.layer_norm_rms_epsilon", 1e-6);
    b.key_f32("rope.freq_base", 1_000_000.0);
    b.key_u32("expert_count", s.experts);
    b.key_u32("expert_used_count", s.experts_used);
}

/// Which optional tensors an attention block carries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Attention {
    /// Per-head RMS norms of queries and keys (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// A bias on the output projection.
    pub out_bias: bool,
    /// The output projection is not scaled down (a post-norm sizes the branch).
    pub full_out: bool,
}

/// Standard multi-head attention with grouped KV heads: `attn_q/k/v/output`
/// (no norm: the caller writes the pre-norm it needs).
pub fn attention(b: &mut Builder, l: u32, a: Attention) {
    let s = b.spec;
    let d = b.d();
    let (q, kv, hd) = (u64::from(s.heads * s.head_dim), u64::from(s.kv_heads * s.head_dim), u64::from(s.head_dim));
    b.matrix(blk(l, "attn_q"), d, q);
    b.matrix(blk(l, "attn_k"), d, kv);
    b.matrix(blk(l, "attn_v"), d, kv);
    if a.full_out {
        b.matrix(blk(l, "attn_output"), q, d);
    } else {
        b.out_matrix(blk(l, "attn_output"), q, d);
    }
    if a.qkv_bias {
        b.zeros(blk_bias(l, "attn_q"), &[q]);
        b.zeros(blk_bias(l, "attn_k"), &[kv]);
        b.zeros(blk_bias(l, "attn_v"), &[kv]);
    }
    if a.out_bias {
        b.zeros(blk_bias(l, "attn_output"), &[d]);
    }
    if a.qk_norm {
        b.norm(blk(l, "attn_q_norm"), hd);
        b.norm(blk(l, "attn_k_norm"), hd);
    }
}

/// How an architecture lays out its expert projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Experts {
    /// `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`.
    Split,
    /// `ffn_gate_up_exps` (gate and up stacked on dimension 1) and `ffn_down_exps`.
    Fused,
    /// `ffn_up_exps` and `ffn_down_exps` only (an ungated activation).
    UpDown,
}

/// A shared expert beside the routed ones.
#[derive(Debug, Clone, Copy)]
pub struct Shared {
    /// Hidden width of the shared FFN (all shared experts together).
    pub width: u64,
    /// A sigmoid gate `ffn_gate_inp_shexp` (one row of `d`) scales the shared expert's output.
    pub gated: bool,
}

/// The MoE block of one layer.
#[derive(Debug, Clone, Copy)]
pub struct Moe {
    /// The expert tensors' layout.
    pub experts: Experts,
    /// A bias on the router logits (`ffn_gate_inp.bias`).
    pub router_bias: bool,
    /// An expert-selection bias `exp_probs_b` added for the top-k only.
    pub selection_bias: bool,
    /// Per-expert biases on each projection (`ffn_*_exps.bias`).
    pub expert_bias: bool,
    /// A shared expert, if any.
    pub shared: Option<Shared>,
}

impl Moe {
    /// Split experts, nothing else.
    pub const SPLIT: Moe =
        Moe { experts: Experts::Split, router_bias: false, selection_bias: false, expert_bias: false, shared: None };
}

/// The down projection's scale per unit of the routing shape's `experts`:
/// measured with `bmoe eval --branches` on the demo model (qwen3moe, 8 of
/// 64 experts, softmax weights), whose first MoE layer then adds an expert
/// output of `experts` times the residual stream's RMS.
pub const EXPERT_DOWN_GAIN: f32 = 4.7;

/// The shared experts' total width: `shared_experts` experts of `expert_ff`.
pub fn shared_width(b: &Builder) -> u64 {
    u64::from(b.spec.shared_experts.max(1) * b.spec.expert_ff)
}

/// Writes layer `l`'s router, experts and shared expert.
pub fn moe(b: &mut Builder, l: u32, m: Moe) {
    let d = b.d();
    let ff = u64::from(b.spec.expert_ff);
    let ne = u64::from(b.spec.experts);
    b.router(blk(l, "ffn_gate_inp"), l);
    if m.router_bias {
        b.zeros(blk_bias(l, "ffn_gate_inp"), &[ne]);
    }
    if m.selection_bias {
        // Zero: the selection bias only reorders the top-k, and a zero one
        // keeps the structured router's popularity curve.
        b.zeros(format!("blk.{l}.exp_probs_b.bias"), &[ne]);
    }
    // Sized by the routing shape's `experts`; the architecture's
    // `expert_gain` evens out how it weights and sums its experts.
    let down = b.spec.routing.experts * EXPERT_DOWN_GAIN;
    match m.experts {
        Experts::Split => {
            b.experts(blk(l, "ffn_gate_exps"), d, ff, 1.0);
            if m.expert_bias {
                b.zeros(blk_bias(l, "ffn_gate_exps"), &[ff, ne]);
            }
            b.experts(blk(l, "ffn_up_exps"), d, ff, 1.0);
            if m.expert_bias {
                b.zeros(blk_bias(l, "ffn_up_exps"), &[ff, ne]);
            }
        }
        Experts::Fused => b.experts(blk(l, "ffn_gate_up_exps"), d, 2 * ff, 1.0),
        Experts::UpDown => b.experts(blk(l, "ffn_up_exps"), d, ff, 1.0),
    }
    b.expert_outputs(blk(l, "ffn_down_exps"), ff, down);
    if m.expert_bias {
        b.zeros(blk_bias(l, "ffn_down_exps"), &[d, ne]);
    }
    if let Some(shared) = m.shared {
        if shared.gated {
            // Random, never zero: qwen2moe computes the sigmoid as silu(g) / g.
            // One row, so f32 as converters write 1-D tensors (and bmoe's
            // file check expects).
            let fill = super::Fill::Random { std: 1.0 / (d as f32).sqrt() };
            b.tensor(blk(l, "ffn_gate_inp_shexp"), &[d], crate::gguf::GgmlType::F32, fill);
        }
        if m.experts == Experts::UpDown {
            // The shared expert takes the experts' ungated form.
            b.matrix(blk(l, "ffn_up_shexp"), d, shared.width);
            b.out_matrix(blk(l, "ffn_down_shexp"), shared.width, d);
        } else {
            b.dense_ffn(l, "_shexp", shared.width);
        }
    }
}

/// The extra tensors of an MTP (next-n) layer `l`: `nextn.eh_proj` joins
/// the token's embedding and the hidden state, `nextn.enorm` /
/// `nextn.hnorm` normalize them, `nextn.shared_head_norm` precedes the
/// head; with `own_head` the layer also has its own embedding and head
/// (GLM and DeepSeek releases ship them; Qwen3.5 reuses the model's).
pub fn nextn(b: &mut Builder, l: u32, own_head: bool) {
    let (d, v, ty) = (b.d(), b.n_vocab, b.spec.dense_type);
    b.matrix(format!("blk.{l}.nextn.eh_proj.weight"), 2 * d, d);
    b.norm(format!("blk.{l}.nextn.enorm.weight"), d);
    b.norm(format!("blk.{l}.nextn.hnorm.weight"), d);
    if own_head {
        b.tensor(format!("blk.{l}.nextn.embed_tokens.weight"), &[d, v], ty, super::Fill::Random { std: 1.0 });
        b.matrix(format!("blk.{l}.nextn.shared_head_head.weight"), d, v);
    }
    b.norm(format!("blk.{l}.nextn.shared_head_norm.weight"), d);
}

/// Layer `l`'s feed-forward: a dense FFN of `dense_ff` on the leading dense
/// layers, the MoE block `m` after them.
pub fn ffn_or_moe(b: &mut Builder, l: u32, m: Moe) {
    if l < b.spec.dense_layers {
        b.dense_ffn(l, "", u64::from(b.spec.dense_ff));
    } else {
        moe(b, l, m);
    }
}

/// The usual pre-norm decoder layer: `attn_norm`, attention `a`,
/// `ffn_norm`, then [`ffn_or_moe`].
pub fn decoder_layer(b: &mut Builder, l: u32, a: Attention, m: Moe) {
    let d = b.d();
    b.norm(blk(l, "attn_norm"), d);
    attention(b, l, a);
    b.norm(blk(l, "ffn_norm"), d);
    ffn_or_moe(b, l, m);
}

/// The keys of DeepSeek-style routing: leading dense layers, shared experts,
/// sigmoid gating, top-k weights renormalized and scaled by `scale`.
pub fn sigmoid_routing_keys(b: &mut Builder, scale: f32) {
    let s = b.spec;
    b.key_u32("leading_dense_block_count", s.dense_layers);
    b.key_u32("expert_shared_count", s.shared_experts);
    b.key_u32("expert_gating_func", 2);
    b.key_bool("expert_weights_norm", true);
    b.key_f32("expert_weights_scale", scale);
}
