//! `gpt-oss` (gpt-oss-20b, gpt-oss-120b): attention sinks and an output
//! bias, a sliding window on every other layer, split experts with
//! per-expert biases and a router bias, softmax over the selected experts.

use super::Generator;
use crate::synth::build::{Builder, blk};
use crate::synth::pieces::{self, Attention, Moe};

pub(super) const GENERATOR: Generator = Generator { name: "gpt-oss", build, expert_gain: 0.71, ..Generator::BASE };

fn build(b: &mut Builder) {
    pieces::common_keys(b);
    // Every other layer uses a sliding window (llama.cpp's default pattern for gpt-oss).
    b.key_u32("attention.sliding_window", 128);
    b.embeddings();
    let d = b.d();
    let heads = u64::from(b.spec.heads);
    for l in 0..b.spec.layers {
        b.norm(blk(l, "attn_norm"), d);
        pieces::attention(b, l, Attention { out_bias: true, ..Attention::default() });
        b.zeros(blk(l, "attn_sinks"), &[heads]);
        b.norm(blk(l, "post_attention_norm"), d);
        pieces::moe(b, l, Moe { router_bias: true, expert_bias: true, ..Moe::SPLIT });
    }
}
