//! Recurrent and convolutional blocks of hybrid architectures: the gated
//! delta-net (Qwen3-Next, Qwen3.5), Mamba-2 (Granite-4.0-H, Nemotron-H) and
//! LFM2's short convolution. Their outputs are scaled down like attention's
//! so the residual stream keeps its token structure.

use super::Fill;
use super::build::{Builder, blk};
use crate::gguf::GgmlType;

/// Convolution kernel width of every recurrent block here (the releases' 4).
pub const CONV_KERNEL: u32 = 4;

/// Gated delta-net widths: `(key head width, key heads, value heads)`,
/// as the spec's widths give them, else from the attention shape (head
/// width, KV heads, heads).
pub fn delta_net_dims(b: &Builder) -> (u64, u64, u64) {
    let s = b.spec;
    let (dk, nk, nv) = s.widths.delta_net.unwrap_or((s.head_dim, s.kv_heads, s.heads));
    (u64::from(dk), u64::from(nk), u64::from(nv))
}

/// The `ssm.*` keys of a gated delta-net.
pub fn delta_net_keys(b: &mut Builder) {
    let (dk, nk, nv) = delta_net_dims(b);
    b.key_u32("ssm.conv_kernel", CONV_KERNEL);
    b.key_u32("ssm.state_size", dk as u32);
    b.key_u32("ssm.group_count", nk as u32);
    b.key_u32("ssm.time_step_rank", nv as u32);
    b.key_u32("ssm.inner_size", (dk * nv) as u32);
}

/// How a delta-net projects its beta and alpha gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BetaAlpha {
    /// One fused `ssm_ba` (Qwen3-Next).
    Fused,
    /// Separate `ssm_beta` and `ssm_alpha` (Qwen3.5).
    Split,
}

/// A gated delta-net block of layer `l` (linear attention with a
/// convolution in front and a gated norm behind).
pub fn delta_net(b: &mut Builder, l: u32, ba: BetaAlpha) {
    let d = b.d();
    let (dk, nk, nv) = delta_net_dims(b);
    let (key_width, value_width) = (dk * nk, dk * nv);
    let conv_channels = 2 * key_width + value_width;
    b.matrix(blk(l, "attn_qkv"), d, conv_channels);
    b.matrix(blk(l, "attn_gate"), d, value_width);
    conv(b, l, "ssm_conv1d", conv_channels);
    b.zeros(format!("blk.{l}.ssm_dt.bias"), &[nv]);
    // -exp(A_log): negative, so the state decays.
    b.constant(format!("blk.{l}.ssm_a"), &[nv], -1.0);
    match ba {
        BetaAlpha::Fused => b.matrix(blk(l, "ssm_ba"), d, 2 * nv),
        BetaAlpha::Split => {
            b.matrix(blk(l, "ssm_beta"), d, nv);
            b.matrix(blk(l, "ssm_alpha"), d, nv);
        }
    }
    b.norm(blk(l, "ssm_norm"), dk);
    b.out_matrix(blk(l, "ssm_out"), value_width, d);
}

/// Mamba-2 widths: `(inner width, heads, groups, state size)`; the inner
/// width is twice the embedding (Granite asserts it), heads of 16.
pub fn mamba2_dims(b: &Builder) -> (u64, u64, u64, u64) {
    let inner = 2 * b.d();
    (inner, inner / 16, 1, 16)
}

/// The `ssm.*` keys of Mamba-2 blocks.
pub fn mamba2_keys(b: &mut Builder) {
    let (inner, heads, groups, state) = mamba2_dims(b);
    b.key_u32("ssm.conv_kernel", CONV_KERNEL);
    b.key_u32("ssm.inner_size", inner as u32);
    b.key_u32("ssm.state_size", state as u32);
    b.key_u32("ssm.time_step_rank", heads as u32);
    b.key_u32("ssm.group_count", groups as u32);
}

/// A Mamba-2 block of layer `l`.
pub fn mamba2(b: &mut Builder, l: u32) {
    let d = b.d();
    let (inner, heads, groups, state) = mamba2_dims(b);
    let conv_channels = inner + 2 * groups * state;
    b.matrix(blk(l, "ssm_in"), d, 2 * inner + 2 * groups * state + heads);
    conv(b, l, "ssm_conv1d", conv_channels);
    b.zeros(format!("blk.{l}.ssm_conv1d.bias"), &[conv_channels]);
    b.zeros(format!("blk.{l}.ssm_dt.bias"), &[heads]);
    b.constant(format!("blk.{l}.ssm_a"), &[1, heads], -1.0);
    b.constant(format!("blk.{l}.ssm_d"), &[1, heads], 1.0);
    b.tensor(blk(l, "ssm_norm"), &[inner / groups, groups], GgmlType::F32, Fill::Const(1.0));
    b.out_matrix(blk(l, "ssm_out"), inner, d);
}

/// Width of LFM2's short convolution (`shortconv.l_cache`, the releases' 3).
pub const SHORT_CONV: u32 = 3;

/// LFM2's short convolution of layer `l`: `in_proj` to three streams, a
/// depthwise convolution, `out_proj`.
pub fn short_conv(b: &mut Builder, l: u32) {
    let d = b.d();
    b.tensor(blk(l, "shortconv.conv"), &[u64::from(SHORT_CONV), d], GgmlType::F32, conv_fill());
    b.matrix(blk(l, "shortconv.in_proj"), d, 3 * d);
    b.out_matrix(blk(l, "shortconv.out_proj"), d, d);
}

/// A depthwise convolution kernel `[CONV_KERNEL, channels]` (f32, as the
/// CPU kernel requires).
fn conv(b: &mut Builder, l: u32, what: &str, channels: u64) {
    b.tensor(blk(l, what), &[u64::from(CONV_KERNEL), channels], GgmlType::F32, conv_fill());
}

fn conv_fill() -> Fill {
    Fill::Random { std: 0.5 }
}
