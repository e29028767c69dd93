//! Per-tensor quantization mixes the way releases are made: the type each
//! tensor gets under llama.cpp's quantizer recipes (`llama-quant.cpp` of the
//! pinned llama.cpp: `tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`, the recipes'
//! default types), re-stated for the tensors a synthetic model has. See
//! `docs/architecture.md`, "Quantization mixes", for the rules.

use crate::gguf::{GgmlType, TensorSpec};

/// A llama.cpp quantization recipe (`llama-quantize`'s ftype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantMix {
    /// `Q4_K_M`: q4_K, with q6_K on some `ffn_down` and `attn_v` layers.
    Q4KM,
    /// `Q5_K_M`: q5_K, with q6_K on some `ffn_down` and `attn_v` layers.
    Q5KM,
    /// `Q6_K`: q6_K throughout.
    Q6K,
    /// `Q3_K_M`: q3_K, with q4_K/q5_K on `ffn_down`, `attn_v`, `attn_output`.
    Q3KM,
    /// `IQ2_XXS`: iq2_xxs, with q2_K/q4_K/q5_K where it matters most.
    Iq2Xxs,
    /// `MXFP4_MOE`: experts in MXFP4, everything else q8_0 (gpt-oss releases).
    Mxfp4Moe,
}

impl QuantMix {
    /// Every mix, with its name.
    pub const ALL: [(QuantMix, &'static str); 6] = [
        (QuantMix::Q4KM, "q4_k_m"),
        (QuantMix::Q5KM, "q5_k_m"),
        (QuantMix::Q6K, "q6_k"),
        (QuantMix::Q3KM, "q3_k_m"),
        (QuantMix::Iq2Xxs, "iq2_xxs"),
        (QuantMix::Mxfp4Moe, "mxfp4"),
    ];

    /// Parses a mix name (case-insensitive; `mxfp4_moe` is accepted too).
    pub fn from_name(name: &str) -> Option<QuantMix> {
        let name = name.to_ascii_lowercase();
        let name = if name == "mxfp4_moe" { "mxfp4" } else { name.as_str() };
        QuantMix::ALL.iter().find(|(_, n)| *n == name).map(|(m, _)| *m)
    }

    /// The mix's name.
    pub fn name(self) -> &'static str {
        QuantMix::ALL.iter().find(|(m, _)| *m == self).map_or("", |(_, n)| n)
    }

    /// The recipe's default type (`llama_ftype_get_default_type`).
    fn default_type(self) -> GgmlType {
        ty(match self {
            QuantMix::Q4KM => "q4_K",
            QuantMix::Q5KM => "q5_K",
            QuantMix::Q6K => "q6_K",
            QuantMix::Q3KM => "q3_K",
            QuantMix::Iq2Xxs => "iq2_xxs",
            QuantMix::Mxfp4Moe => "mxfp4",
        })
    }
}

/// The model facts the recipes look at.
#[derive(Debug, Clone, Copy)]
pub struct MixModel {
    /// `block_count` (MTP layers included: llama.cpp's `n_layer_all`).
    pub n_layer: u32,
    /// Experts per layer.
    pub n_expert: u32,
    /// Query heads per KV head.
    pub n_gqa: u32,
}

/// The tensor categories llama.cpp's quantizer tells apart (by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    /// `attn_v`, `attn_qkv`, `attn_kv_b`: the attention-v-like tensors.
    AttnV,
    AttnK,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    match name {
        "output.weight" => Category::Output,
        "token_embd.weight" => Category::TokenEmbd,
        _ if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"].iter().any(|p| name.contains(p)) => {
            Category::AttnV
        }
        _ if name.contains("attn_k.weight") => Category::AttnK,
        _ if name.contains("attn_output.weight") => Category::AttnOutput,
        // llama.cpp tests ffn_up and ffn_gate before ffn_down; none of ours has two.
        _ if name.contains("ffn_up") || name.contains("ffn_gate") => Category::Other,
        _ if name.contains("ffn_down") => Category::FfnDown,
        _ => Category::Other,
    }
}

/// Whether llama.cpp's quantizer touches `t` at all: 2-D and 3-D weights,
/// not norms, routers or the small convolution kernels.
fn quantizable(t: &TensorSpec) -> bool {
    let name = t.name.as_str();
    t.dims.len() >= 2
        && name.ends_with("weight")
        && !name.contains("_norm.weight")
        && !name.contains("ffn_gate_inp.weight")
        && !name.contains("ssm_conv1d")
        && !name.contains("shortconv.conv.weight")
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third one between.
fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn ty(name: &str) -> GgmlType {
    GgmlType::from_name(name).unwrap_or(GgmlType::F16)
}

/// The layer of `blk.<l>.` names.
fn layer_of(name: &str) -> Option<i64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Applies `mix` to `tensors` in file order, as llama-quantize would to a
/// model whose tensors are these (it keeps per-category counters, so the
/// order matters).
pub fn apply(mix: QuantMix, model: MixModel, tensors: &mut [TensorSpec]) {
    let n_attention_v = tensors.iter().filter(|t| quantizable(t) && category(&t.name) == Category::AttnV).count();
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    let mut counters = Counters { attention_v: 0, ffn_down: 0, n_attention_v: n_attention_v as i64 };
    for t in tensors.iter_mut().filter(|t| quantizable(t)) {
        let chosen = choose(mix, model, t, tied, &mut counters);
        t.ty = fallback(t, chosen);
    }
}

struct Counters {
    attention_v: i64,
    ffn_down: i64,
    n_attention_v: i64,
}

/// `llama_tensor_get_type_impl` for the recipes here.
fn choose(mix: QuantMix, model: MixModel, t: &TensorSpec, tied: bool, c: &mut Counters) -> GgmlType {
    use QuantMix::*;
    let cat = category(&t.name);
    let mut new = mix.default_type();
    let n_expert = model.n_expert.max(1);
    if cat == Category::Output || (tied && cat == Category::TokenEmbd) {
        let columns = t.dims[0];
        return if mix == Mxfp4Moe || !columns.is_multiple_of(new.block_elems()) {
            ty("q8_0")
        } else if mix == Iq2Xxs {
            ty("q5_K")
        } else {
            ty("q6_K")
        };
    }
    if mix == Mxfp4Moe {
        return if t.dims.get(2).is_some_and(|&e| e > 1) { ty("mxfp4") } else { ty("q8_0") };
    }
    if cat == Category::TokenEmbd {
        return if mix == Iq2Xxs { ty("q2_K") } else { new };
    }
    if mix == Iq2Xxs {
        match cat {
            Category::AttnV => {
                new = if model.n_gqa >= 4 || n_expert >= 4 { ty("q4_K") } else { ty("q2_K") };
                c.attention_v += 1;
            }
            Category::AttnK if n_expert == 8 => new = ty("q4_K"),
            Category::FfnDown => {
                if c.ffn_down < i64::from(model.n_layer) / 8 {
                    new = ty("q2_K");
                }
                c.ffn_down += 1;
            }
            Category::AttnOutput if n_expert == 8 => new = ty("q5_K"),
            _ => {}
        }
        return new;
    }
    match cat {
        Category::AttnV => {
            match mix {
                Q3KM => new = if c.attention_v < 2 { ty("q5_K") } else { ty("q4_K") },
                Q4KM | Q5KM if use_more_bits(c.attention_v, c.n_attention_v) => new = ty("q6_K"),
                _ => {}
            }
            if n_expert == 8 {
                new = ty("q8_0");
            }
            c.attention_v += 1;
        }
        Category::AttnK if n_expert == 8 => new = ty("q8_0"),
        Category::FfnDown => {
            // With experts llama.cpp reads the layer from the name.
            let n = i64::from(model.n_layer);
            let i = if n_expert > 1 { layer_of(&t.name).unwrap_or(c.ffn_down) } else { c.ffn_down };
            match mix {
                Q3KM => new = if i < n / 16 { ty("q5_K") } else { ty("q4_K") },
                Q4KM | Q5KM if use_more_bits(i, n) => new = ty("q6_K"),
                _ => {}
            }
            c.ffn_down += 1;
        }
        Category::AttnOutput => {
            if n_expert == 8 {
                if matches!(mix, Q3KM | Q4KM) {
                    new = ty("q5_K");
                }
            } else if mix == Q3KM {
                new = ty("q4_K");
            }
        }
        _ => {}
    }
    new
}

/// `tensor_type_fallback`: a type whose blocks do not divide the rows gives
/// way to a 32-block type, or f16.
fn fallback(t: &TensorSpec, target: GgmlType) -> GgmlType {
    let columns = t.dims[0];
    if columns.is_multiple_of(target.block_elems()) {
        return target;
    }
    let smaller = match target.name() {
        "iq2_xxs" | "iq3_s" | "iq4_xs" => ty("iq4_nl"),
        "q2_K" | "q3_K" => ty("q4_0"),
        "q4_K" => ty("q5_0"),
        "q5_K" => ty("q5_1"),
        "q6_K" => ty("q8_0"),
        _ => target,
    };
    if columns.is_multiple_of(smaller.block_elems()) { smaller } else { GgmlType::F16 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, dims: &[u64]) -> TensorSpec {
        TensorSpec::new(name, dims, GgmlType::F16)
    }

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        // 16 layers: use_more_bits is true for 0, 1, 4, 7, 10, 13, 14, 15.
        let mut ts: Vec<TensorSpec> =
            (0..16).map(|l| t(&format!("blk.{l}.ffn_down_exps.weight"), &[256, 256, 8])).collect();
        ts.push(t("output.weight", &[256, 1000]));
        ts.push(t("token_embd.weight", &[256, 1000]));
        ts.push(t("blk.0.attn_norm.weight", &[256]));
        ts.push(t("blk.0.ffn_gate_inp.weight", &[256, 8]));
        ts.push(t("blk.0.attn_output.weight", &[64, 256]));
        apply(QuantMix::Q4KM, MixModel { n_layer: 16, n_expert: 8, n_gqa: 2 }, &mut ts);
        let q6: Vec<usize> = (0..16).filter(|&l| ts[l].ty.name() == "q6_K").collect();
        assert_eq!(q6, [0, 1, 4, 7, 10, 13, 14, 15]);
        assert!((0..16).filter(|l| !q6.contains(l)).all(|l| ts[l].ty.name() == "q4_K"));
        assert_eq!(ts[16].ty.name(), "q6_K"); // output
        assert_eq!(ts[17].ty.name(), "q4_K"); // token embeddings
        assert_eq!(ts[18].ty, GgmlType::F16); // norms are not touched
        assert_eq!(ts[19].ty, GgmlType::F16); // nor routers
        assert_eq!(ts[20].ty.name(), "q5_1"); // 8 experts: q5_K, rows of 64 fall back to q5_1
    }

    #[test]
    fn mxfp4_moe_puts_experts_in_mxfp4_and_the_rest_in_q8_0() {
        let mut ts = vec![
            t("blk.0.ffn_up_exps.weight", &[256, 256, 32]),
            t("blk.0.attn_q.weight", &[256, 256]),
            t("output.weight", &[256, 99]),
        ];
        apply(QuantMix::Mxfp4Moe, MixModel { n_layer: 1, n_expert: 32, n_gqa: 8 }, &mut ts);
        assert_eq!([ts[0].ty.name(), ts[1].ty.name(), ts[2].ty.name()], ["mxfp4", "q8_0", "q8_0"]);
        assert_eq!(QuantMix::from_name("MXFP4_MOE"), Some(QuantMix::Mxfp4Moe));
        assert_eq!(QuantMix::from_name("q4_k_m").map(QuantMix::name), Some("q4_k_m"));
    }
}
