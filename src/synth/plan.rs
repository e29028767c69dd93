//! The tensor list, metadata and fill rules of a synthetic model.

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::fill::{Fill, mix};
use super::vocab::{EOS_ID, Vocab, template_markers};
use super::{Arch, ModelSpec};
use crate::gguf::{GgmlType, TensorSpec, Value, ValueType};

/// A model ready to be written.
pub struct Planned {
    /// Metadata in write order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in write order with their fill rule.
    pub tensors: Vec<(TensorSpec, Fill)>,
}

/// Builds the full plan for `spec`.
pub fn plan(spec: &ModelSpec) -> Planned {
    let markers = spec.chat_template.as_deref().map(template_markers).unwrap_or_default();
    let vocab = Vocab::new(spec.pieces, &markers);
    let shape = Structure::new(spec, &vocab);
    let mut p = Planned { metadata: Vec::new(), tensors: Vec::new() };
    let arch = spec.arch.name();
    let mut meta = |k: &str, v: Value| p.metadata.push((k.to_string(), v));
    meta("general.architecture", Value::String(arch.into()));
    meta("general.name", Value::String(format!("bmoe synthetic {arch} (random weights)")));
    meta("general.alignment", Value::U32(32));
    let a = |k: &str| format!("{arch}.{k}");
    meta(&a("context_length"), Value::U32(spec.ctx));
    meta(&a("embedding_length"), Value::U32(spec.embd));
    meta(&a("block_count"), Value::U32(spec.layers));
    meta(&a("feed_forward_length"), Value::U32(spec.dense_ff));
    meta(&a("expert_feed_forward_length"), Value::U32(spec.expert_ff));
    meta(&a("attention.head_count"), Value::U32(spec.heads));
    meta(&a("attention.head_count_kv"), Value::U32(spec.kv_heads));
    meta(&a("attention.key_length"), Value::U32(spec.head_dim));
    meta(&a("attention.value_length"), Value::U32(spec.head_dim));
    meta(&a("attention.layer_norm_rms_epsilon"), Value::F32(1e-6));
    meta(&a("rope.freq_base"), Value::F32(1_000_000.0));
    meta(&a("expert_count"), Value::U32(spec.experts));
    meta(&a("expert_used_count"), Value::U32(spec.experts_used));
    if spec.arch == Arch::Gemma4 {
        // Every third layer (and the last) uses full attention, the rest a sliding window.
        let pattern = (0..spec.layers).map(|l| Value::Bool(!(l % 3 == 2 || l + 1 == spec.layers))).collect();
        meta(&a("attention.sliding_window_pattern"), Value::Array(ValueType::Bool, pattern));
        meta(&a("attention.sliding_window"), Value::U32(512));
        meta(&a("attention.key_length_swa"), Value::U32(spec.head_dim));
        meta(&a("attention.value_length_swa"), Value::U32(spec.head_dim));
        meta(&a("embedding_length_per_layer_input"), Value::U32(0));
        meta(&a("rope.freq_base_swa"), Value::F32(10_000.0));
    }
    if spec.arch == Arch::GptOss {
        // Every other layer uses a sliding window (llama.cpp's default pattern for gpt-oss).
        meta(&a("attention.sliding_window"), Value::U32(128));
    }
    for (k, v) in vocab.metadata() {
        meta(k, v);
    }
    if let Some(template) = &spec.chat_template {
        meta("tokenizer.chat_template", Value::String(template.clone()));
    }

    let dense = spec.dense_type;
    let d = u64::from(spec.embd);
    let n_vocab = vocab.len() as u64;
    let q = u64::from(spec.heads * spec.head_dim);
    let kv = u64::from(spec.kv_heads * spec.head_dim);
    let hd = u64::from(spec.head_dim);
    let ff = u64::from(spec.expert_ff);
    let dff = u64::from(spec.dense_ff);
    let ne = u64::from(spec.experts);
    let mut add = |name: String, dims: &[u64], ty: GgmlType, fill: Fill| {
        p.tensors.push((TensorSpec::new(name, dims, ty), fill));
    };
    let one = Fill::Const(1.0);
    // Standard deviations that keep every projection's output near unit scale.
    let proj = |fan_in: u64| Fill::Random { std: 1.0 / (fan_in as f32).sqrt() };
    let out_proj = |fan_in: u64, scale: f32| Fill::Random { std: scale / (fan_in as f32).sqrt() };
    let mixing = spec.routing.mix;

    add("token_embd.weight".into(), &[d, n_vocab], dense, Fill::Values(shape.embedding.clone()));
    add("output_norm.weight".into(), &[d], GgmlType::F32, one.clone());
    add("output.weight".into(), &[d, n_vocab], dense, Fill::Values(shape.output.clone()));
    if spec.arch == Arch::Gemma4 {
        add("rope_freqs.weight".into(), &[hd / 2], GgmlType::F32, one.clone());
    }
    // Gemma normalizes each branch output before adding it; a post-norm weight
    // of mix * |residual entry| gives the same relative size as qwen's scaling.
    // (Gemma scales embeddings by sqrt(d), so a residual entry has std sqrt(2d).)
    let gemma_post = Fill::Const(mixing * (2.0 * d as f32).sqrt());
    for l in 0..spec.layers {
        let b = |s: &str| format!("blk.{l}.{s}.weight");
        add(b("attn_norm"), &[d], GgmlType::F32, one.clone());
        add(b("attn_q"), &[d, q], dense, proj(d));
        add(b("attn_k"), &[d, kv], dense, proj(d));
        add(b("attn_v"), &[d, kv], dense, proj(d));
        let o_scale = if spec.arch == Arch::Gemma4 { 1.0 } else { mixing };
        add(b("attn_output"), &[q, d], dense, out_proj(q, o_scale));
        let bias = |s: &str| format!("blk.{l}.{s}.bias");
        let zero = Fill::Const(0.0);
        if spec.arch == Arch::GptOss {
            add(bias("attn_output"), &[d], GgmlType::F32, zero.clone());
            add(b("attn_sinks"), &[u64::from(spec.heads)], GgmlType::F32, zero.clone());
            add(b("post_attention_norm"), &[d], GgmlType::F32, one.clone());
        } else {
            add(b("attn_q_norm"), &[hd], GgmlType::F32, one.clone());
            add(b("attn_k_norm"), &[hd], GgmlType::F32, one.clone());
            add(b("ffn_norm"), &[d], GgmlType::F32, one.clone());
        }
        let moe_layer = spec.arch != Arch::Gemma4 || l > 0;
        if spec.arch == Arch::Gemma4 {
            add(b("post_attention_norm"), &[d], GgmlType::F32, gemma_post.clone());
            add(b("ffn_gate"), &[d, dff], dense, proj(d));
            add(b("ffn_up"), &[d, dff], dense, proj(d));
            add(b("ffn_down"), &[dff, d], dense, proj(dff));
            add(b("post_ffw_norm"), &[d], GgmlType::F32, gemma_post.clone());
        }
        if !moe_layer {
            continue;
        }
        add(b("ffn_gate_inp"), &[d, ne], dense_or_f32(dense), Fill::Values(shape.router(spec, l)));
        let ety = spec.expert_type;
        let down_scale = if spec.arch == Arch::Gemma4 { 1.0 } else { mixing * 2.5 };
        match spec.arch {
            Arch::GptOss => {
                add(bias("ffn_gate_inp"), &[ne], GgmlType::F32, zero.clone());
                add(b("ffn_gate_exps"), &[d, ff, ne], ety, proj(d));
                add(bias("ffn_gate_exps"), &[ff, ne], GgmlType::F32, zero.clone());
                add(b("ffn_up_exps"), &[d, ff, ne], ety, proj(d));
                add(bias("ffn_up_exps"), &[ff, ne], GgmlType::F32, zero.clone());
                add(b("ffn_down_exps"), &[ff, d, ne], ety, out_proj(ff, down_scale));
                add(bias("ffn_down_exps"), &[d, ne], GgmlType::F32, zero);
            }
            Arch::Qwen3Moe => {
                add(b("ffn_gate_exps"), &[d, ff, ne], ety, proj(d));
                add(b("ffn_up_exps"), &[d, ff, ne], ety, proj(d));
                add(b("ffn_down_exps"), &[ff, d, ne], ety, out_proj(ff, down_scale));
            }
            Arch::Gemma4 => {
                let sqrt_d = (d as f32).sqrt();
                add(format!("blk.{l}.ffn_gate_inp.scale"), &[d], GgmlType::F32, Fill::Const(sqrt_d));
                add(b("pre_ffw_norm_2"), &[d], GgmlType::F32, one.clone());
                add(b("post_ffw_norm_1"), &[d], GgmlType::F32, one.clone());
                add(b("post_ffw_norm_2"), &[d], GgmlType::F32, one.clone());
                add(b("ffn_gate_up_exps"), &[d, 2 * ff, ne], ety, proj(d));
                add(b("ffn_down_exps"), &[ff, d, ne], ety, out_proj(ff, down_scale));
            }
        }
    }
    p
}

/// Routers are small; keep them at full precision unless dense is f16.
fn dense_or_f32(dense: GgmlType) -> GgmlType {
    if dense == GgmlType::F16 { GgmlType::F16 } else { GgmlType::F32 }
}

/// The structured tensors: embeddings, output head and routers.
struct Structure {
    /// Shared unit direction `u`.
    common: Vec<f32>,
    embedding: Arc<Vec<f32>>,
    output: Arc<Vec<f32>>,
}

impl Structure {
    fn new(spec: &ModelSpec, vocab: &Vocab) -> Structure {
        let d = spec.embd as usize;
        let n = vocab.len();
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x5eed_0001));
        let common = unit(&mut rng, d);
        // Token-specific parts: independent for specials and bytes, an AR(1)
        // chain along a random cycle through the text tokens.
        let mut specific: Vec<Vec<f32>> = (0..n).map(|_| gaussian_vec(&mut rng, d)).collect();
        let mut cycle = vocab.text_tokens();
        shuffle(&mut rng, &mut cycle);
        let rho = spec.routing.token_corr;
        let fresh = (1.0 - rho * rho).sqrt();
        for w in 1..cycle.len() {
            let (prev, cur) = (cycle[w - 1] as usize, cycle[w] as usize);
            let step: Vec<f32> = specific[prev].iter().zip(&specific[cur]).map(|(p, z)| rho * p + fresh * z).collect();
            specific[cur] = step;
        }
        let sqrt_d = (d as f32).sqrt();
        let mut embedding = Vec::with_capacity(n * d);
        for s in &specific {
            embedding.extend(s.iter().zip(&common).map(|(a, u)| a + sqrt_d * u));
        }
        // Output row of a text token = its predecessor's specific part, so the
        // argmax after token t is the token that follows t on the cycle.
        let out_scale = 8.0 / d as f32;
        // Rows of non-text tokens point against `u`, so they are never chosen.
        let mut output: Vec<f32> = (0..n).flat_map(|_| common.iter().map(|u| -8.0 / sqrt_d * u)).collect();
        for w in 0..cycle.len() {
            let prev = cycle[(w + cycle.len() - 1) % cycle.len()] as usize;
            let row = &mut output[cycle[w] as usize * d..][..d];
            for (x, a) in row.iter_mut().zip(&specific[prev]) {
                *x = out_scale * a;
            }
        }
        // End-of-sequence is never preferred: a random model should not stop.
        for (x, u) in output[EOS_ID as usize * d..][..d].iter_mut().zip(&common) {
            *x = -16.0 / sqrt_d * u;
        }
        Structure { common, embedding: Arc::new(embedding), output: Arc::new(output) }
    }

    /// Router of layer `l`: per-expert bias along `u` plus a random part.
    fn router(&self, spec: &ModelSpec, l: u32) -> Arc<Vec<f32>> {
        let d = spec.embd as usize;
        let r = &spec.routing;
        let first_moe = if spec.arch == Arch::Gemma4 { 1 } else { 0 };
        let depth = (l - first_moe) as f32 / (spec.layers as f32 / 4.0).max(1.0);
        let skew = r.skew_first + (r.skew - r.skew_first) * depth.min(1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x0007_0000 ^ u64::from(l)));
        let sqrt_d = (d as f32).sqrt();
        let mut w = Vec::with_capacity(d * spec.experts as usize);
        for _ in 0..spec.experts {
            let bias = skew * gaussian(&mut rng);
            // The random part must not lean on `u`, or it adds a hidden bias.
            let mut random = gaussian_vec(&mut rng, d);
            let along: f32 = random.iter().zip(&self.common).map(|(z, u)| z * u).sum();
            for (z, u) in random.iter_mut().zip(&self.common) {
                *z -= along * u;
            }
            w.extend(random.iter().zip(&self.common).map(|(z, u)| r.gain * (bias / sqrt_d * u + z / sqrt_d)));
        }
        Arc::new(w)
    }
}

/// One standard normal sample (Box-Muller).
fn gaussian(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.r#gen();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

fn gaussian_vec(rng: &mut ChaCha8Rng, d: usize) -> Vec<f32> {
    (0..d).map(|_| gaussian(rng)).collect()
}

fn unit(rng: &mut ChaCha8Rng, d: usize) -> Vec<f32> {
    let v = gaussian_vec(rng, d);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

fn shuffle(rng: &mut ChaCha8Rng, v: &mut [u32]) {
    for i in (1..v.len()).rev() {
        let j = rng.gen_range(0..=i);
        v.swap(i, j);
    }
}
