//! The architecture registry: what is known of each MoE architecture the
//! pinned llama.cpp runs (models, MoE features, notes), whether a
//! byte-identity gate covers it, and the few that cannot stream and why.
//!
//! Streaming does not depend on this list: any file that passes the
//! capability check ([`super::capability`]) streams. The registry only says
//! what is known; an architecture without a generator (and so without a
//! gate) streams with one notice saying so.

use crate::synth::Arch;

/// Whether an architecture can stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Streams when its file passes the capability check.
    Capable,
    /// Cannot stream, for this reason.
    Refused(&'static str),
}

/// One registry row.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    /// `general.architecture`.
    pub arch: &'static str,
    /// Reference models.
    pub models: &'static str,
    /// MoE features, comma-separated: shared, dense-lead, sigmoid, bias,
    /// groups, mla, mtp, fused, weight-before, every-other, mamba2, mamba,
    /// delta-net, shortconv, swa, expert-bias.
    pub features: &'static str,
    /// What else is particular to it.
    pub notes: &'static str,
    /// Whether it streams.
    pub support: Support,
}

impl Recipe {
    /// Whether a byte-identity gate in `tests/` covers this architecture
    /// (every architecture the generator makes has one).
    pub fn gated(&self) -> bool {
        Arch::from_name(self.arch).is_some()
    }
}

/// Expert tensor suffixes recognised in every architecture (the name between
/// `blk.<il>.` and `.weight`). The fused form, when present, replaces gate+up.
pub const EXPERT_SUFFIXES: [&str; 4] = ["ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps"];

/// Every architecture whose llama.cpp graph builds the shared MoE block.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        arch: "llama",
        models: "Mixtral-8x7B/8x22B",
        features: "",
        notes: "MoE only if expert_count>0",
        support: Support::Capable,
    },
    Recipe {
        arch: "llama-embed",
        models: "none known with experts",
        features: "",
        notes: "reuses llama; non-causal embed",
        support: Support::Refused("an embedding model, not a text generator"),
    },
    Recipe {
        arch: "llama4",
        models: "Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E",
        features: "shared, sigmoid, weight-before, every-other, swa",
        notes: "chunked-attn",
        support: Support::Capable,
    },
    Recipe {
        arch: "grok",
        models: "Grok-1 (314B), Grok-2",
        features: "",
        notes: "gelu, parallel-dense (optional ffn_up/gate/down, Grok-2)",
        support: Support::Capable,
    },
    Recipe {
        arch: "dbrx",
        models: "DBRX-132B (16 experts, top-4)",
        features: "",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "arctic",
        models: "Snowflake Arctic (128x3.66B)",
        features: "",
        notes: "parallel-dense (dense residual MLP + MoE), ffn_norm_exps",
        support: Support::Capable,
    },
    Recipe {
        arch: "nomic-bert-moe",
        models: "nomic-embed-text-v2-moe",
        features: "every-other",
        notes: "gelu, no-gate, encoder",
        support: Support::Refused("an embedding encoder, not a text generator"),
    },
    Recipe {
        arch: "qwen2moe",
        models: "Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
        features: "shared",
        notes: "shared-gate (ffn_gate_inp_shexp)",
        support: Support::Capable,
    },
    Recipe {
        arch: "qwen3moe",
        models: "Qwen3-30B-A3B, Qwen3-235B-A22B, Qwen3-Coder-30B/480B",
        features: "",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "qwen3vlmoe",
        models: "Qwen3-VL-30B-A3B, Qwen3-VL-235B-A22B",
        features: "",
        notes: "mrope, deepstack",
        support: Support::Capable,
    },
    Recipe {
        arch: "qwen3next",
        models: "Qwen3-Next-80B-A3B",
        features: "shared, fused, mtp, delta-net",
        notes: "shared-gate",
        support: Support::Capable,
    },
    Recipe {
        arch: "qwen35moe",
        models: "Qwen3.5 MoE 35B-A3B / 122B-A10B / 397B-A17B (type names)",
        features: "shared, fused, mtp, delta-net",
        notes: "shared-gate, mrope",
        support: Support::Capable,
    },
    Recipe {
        arch: "qwen4exp",
        models: "Qwen4-exp A3B (48 layers; unknown release)",
        features: "shared, fused, mtp, delta-net",
        notes: "shared-gate, hc, dsa(QSA), PLE",
        support: Support::Capable,
    },
    Recipe {
        arch: "phimoe",
        models: "Phi-3.5-MoE (16x3.8B)",
        features: "",
        notes: "layernorm+bias",
        support: Support::Capable,
    },
    Recipe {
        arch: "minicpm",
        models: "MiniCPM-MoE-8x2B",
        features: "",
        notes: "MoE only if expert_count>0",
        support: Support::Capable,
    },
    Recipe {
        arch: "granite",
        models: "(dense Granite 3.x; MoE path exists)",
        features: "shared",
        notes: "MoE only if expert_count>0; shared if n_ff_shexp>0",
        support: Support::Capable,
    },
    Recipe {
        arch: "granitemoe",
        models: "granite-3.0/3.1-1b-a400m, -3b-a800m; GraniteMoeShared",
        features: "shared",
        notes: "shared optional (n_ff_shexp>0)",
        support: Support::Capable,
    },
    Recipe {
        arch: "granitehybrid",
        models: "Granite-4.0-H-Tiny (7B-A1B), -H-Small (32B-A9B)",
        features: "shared, mamba2",
        notes: "MoE on every layer (attn or mamba2 mixer)",
        support: Support::Capable,
    },
    Recipe {
        arch: "granite_swa",
        models: "Granite 4 SWA variants (3B; MoE optional)",
        features: "shared, fused, swa",
        notes: "shared gate+up fused in ffn_up_shexp {n_embd,2*n_ff_shexp}",
        support: Support::Capable,
    },
    Recipe {
        arch: "jamba",
        models: "Jamba-v0.1 (52B), Jamba-1.5-Mini/Large",
        features: "every-other, mamba",
        notes: "MoE layer = has ffn_gate_inp",
        support: Support::Capable,
    },
    Recipe {
        arch: "cohere2moe",
        models: "Cohere MoE 30B-A3B (type name; unknown release)",
        features: "shared, dense-lead, sigmoid, fused, mtp, swa",
        notes: "parallel attn+ffn, shared optional",
        support: Support::Capable,
    },
    Recipe { arch: "olmoe", models: "OLMoE-1B-7B", features: "", notes: "", support: Support::Capable },
    Recipe {
        arch: "deepseek",
        models: "deepseek-moe-16b",
        features: "shared, dense-lead",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "deepseek2",
        models: "DeepSeek-V2/V2-Lite/V2.5/V3/V3.1/R1, Kimi-K2, Moonlight, GigaChat3, Kanana-2, GLM-4.7-Flash",
        features: "shared, dense-lead, sigmoid, bias, groups, mla, mtp, fused",
        notes: "softmax for V2 (default), sigmoid V3+ (key)",
        support: Support::Capable,
    },
    Recipe {
        arch: "deepseek2-ocr",
        models: "DeepSeek-OCR (3B)",
        features: "shared, dense-lead, fused",
        notes: "no MLA; softmax default",
        support: Support::Capable,
    },
    Recipe {
        arch: "mistral4",
        models: "Mistral \"4\" DeepSeek-V3-style MoE (exact release unknown)",
        features: "shared, dense-lead, sigmoid, bias, mla, mtp, fused",
        notes: "no MTP graph; F32 src1 prec on down",
        support: Support::Capable,
    },
    Recipe {
        arch: "deepseek32",
        models: "DeepSeek-V3.2(-Exp) 685B-A37B",
        features: "shared, dense-lead, sigmoid, bias, groups, mla, mtp",
        notes: "dsa",
        support: Support::Capable,
    },
    Recipe {
        arch: "deepseek4",
        models: "DeepSeek-V4 (43 layers in code)",
        features: "shared, bias, mtp, swa",
        notes: "sqrt-softplus, hash-routing, hc, clamp, compressed attn (hybrid memory)",
        support: Support::Capable,
    },
    Recipe {
        arch: "dflash",
        models: "DFlash/DSpark draft heads on a DeepSeek-V4 backbone",
        features: "shared, bias, swa",
        notes: "sqrt-softplus, hc, clamp; MoE only when hyper_connection_count>0",
        support: Support::Capable,
    },
    Recipe {
        arch: "glm4moe",
        models: "GLM-4.5, GLM-4.5-Air, GLM-4.6, GLM-4.7, Solar-Open-102B",
        features: "shared, dense-lead, sigmoid, bias, mtp",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "glm-dsa",
        models: "GLM-5 / 5.1 / 5.2 (744B-A40B)",
        features: "shared, dense-lead, sigmoid, bias, mla, mtp",
        notes: "dsa",
        support: Support::Capable,
    },
    Recipe {
        arch: "glm5-next",
        models: "GLM-5.3-Flash (320B-A18B; per comment)",
        features: "shared, dense-lead, sigmoid, bias, mla, mtp, delta-net",
        notes: "KDA, hc, dsa, clamp; MTP graph throws",
        support: Support::Capable,
    },
    Recipe {
        arch: "nemotron_h",
        models: "(dense Nemotron-H / Nano-2; MoE path if expert_count>0)",
        features: "shared, sigmoid, bias, mamba2, every-other",
        notes: "no-gate, relu2, latent",
        support: Support::Capable,
    },
    Recipe {
        arch: "nemotron_h_moe",
        models: "Nemotron-3-Nano-30B-A3B, Nemotron-3-Super-120B-A12B, Puzzle-75B-A9B",
        features: "shared, sigmoid, bias, mtp, mamba2, every-other",
        notes: "no-gate, relu2, latent (ffn_latent_down/up), per-layer top-k",
        support: Support::Capable,
    },
    Recipe {
        arch: "exaone-moe",
        models: "LG K-EXAONE (236B-A23B), EXAONE-MoE 30B-A3B (type names)",
        features: "shared, dense-lead, bias, mtp, swa",
        notes: "gating from key (required)",
        support: Support::Capable,
    },
    Recipe {
        arch: "bailingmoe",
        models: "Ling-lite, Ling-plus, Ling-Coder-lite",
        features: "shared",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "bailingmoe2",
        models: "Ling-mini-2.0, Ling-flash-2.0, Ring-2.0, Ling-1T",
        features: "shared, dense-lead, sigmoid, bias, groups, mtp",
        notes: "no MTP graph",
        support: Support::Capable,
    },
    Recipe {
        arch: "bailingmoe3",
        models: "Ling/Ring hybrid 7.9B-A1.3B, 124B-A5.1B (type names)",
        features: "shared, dense-lead, sigmoid, bias, mla, mtp, delta-net",
        notes: "KDA, clamp",
        support: Support::Capable,
    },
    Recipe {
        arch: "dots1",
        models: "rednote dots.llm1 (142B-A14B)",
        features: "shared, dense-lead, sigmoid, bias",
        notes: "gating key has NO default",
        support: Support::Capable,
    },
    Recipe {
        arch: "dots3note",
        models: "dots3 288B-A19B (type name)",
        features: "shared, dense-lead, sigmoid, bias, mla, mtp, swa",
        notes: "dsa; no MTP graph",
        support: Support::Capable,
    },
    Recipe {
        arch: "afmoe",
        models: "Arcee Trinity Nano (6B) / Mini (26B) / Large",
        features: "shared, dense-lead, sigmoid, bias, swa",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "laguna",
        models: "poolside Laguna XS.2 (30B-A3B), S.2 (118B-A8B), M.1 (230B-A10B)",
        features: "shared, dense-lead, sigmoid, bias, swa",
        notes: "swa only on XS.2",
        support: Support::Capable,
    },
    Recipe {
        arch: "ernie4_5-moe",
        models: "ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B",
        features: "shared, dense-lead, bias, every-other",
        notes: "softmax + bias",
        support: Support::Capable,
    },
    Recipe { arch: "hunyuan-moe", models: "Hunyuan-A13B", features: "shared", notes: "", support: Support::Capable },
    Recipe {
        arch: "hy_v3",
        models: "Tencent HY-V3 30B-A3B (type name)",
        features: "shared, dense-lead, sigmoid, bias, mtp, fused",
        notes: "bias tensor named blk.%d.exp_probs_b (no .bias)",
        support: Support::Capable,
    },
    Recipe {
        arch: "hy_v4",
        models: "Tencent HY-V4 (unknown)",
        features: "shared, dense-lead, bias, mla",
        notes: "hc (iHC), dsa, clamp; gating key has NO default",
        support: Support::Capable,
    },
    Recipe {
        arch: "gpt-oss",
        models: "gpt-oss-20b, gpt-oss-120b",
        features: "expert-bias, swa",
        notes: "softmax-weight, swiglu-oai, router bias, attn sinks",
        support: Support::Capable,
    },
    Recipe {
        arch: "lfm2moe",
        models: "LFM2-8B-A1B, LFM2-24B-A2B",
        features: "dense-lead, sigmoid, bias, shortconv",
        notes: "",
        support: Support::Capable,
    },
    Recipe {
        arch: "smallthinker",
        models: "SmallThinker-4BA0.6B, SmallThinker-21BA3B",
        features: "swa",
        notes: "relu, pre-attention router (logits from layer input), gating key has NO default",
        support: Support::Capable,
    },
    Recipe {
        arch: "llada-moe",
        models: "LLaDA-MoE-7B-A1B",
        features: "",
        notes: "diffusion (non-causal)",
        support: Support::Refused("a diffusion model: it does not decode left to right"),
    },
    Recipe {
        arch: "rnd1",
        models: "RND1-Base 30B-A3B",
        features: "",
        notes: "diffusion (non-causal)",
        support: Support::Refused("a diffusion model: it does not decode left to right"),
    },
    Recipe {
        arch: "grovemoe",
        models: "GroveMoE-Base/Inst (33B-A3B)",
        features: "",
        notes: "chunk-experts (ffn_*_chexps), two MoE calls per layer",
        support: Support::Refused(
            "a second expert set (ffn_*_chexps) is routed through a second ffn_moe_topk node per layer whose ids are remapped after it; bmoe streams one routing per layer",
        ),
    },
    Recipe {
        arch: "minimax-01",
        models: "MiniMax-Text-01 (456B)",
        features: "",
        notes: "lightning (linear-attn hybrid)",
        support: Support::Capable,
    },
    Recipe {
        arch: "minimax-m2",
        models: "MiniMax-M2 / M2.1 (230B-A10B)",
        features: "sigmoid, bias",
        notes: "gating key has NO default",
        support: Support::Capable,
    },
    Recipe {
        arch: "minimax-m3",
        models: "MiniMax-M3 428B-A23B (per comment)",
        features: "shared, dense-lead, sigmoid, bias",
        notes: "swiglu-oai, MSA sparse attn",
        support: Support::Capable,
    },
    Recipe {
        arch: "mistral3",
        models: "(Ministral-3 / Mistral-Small are dense; MoE path exists)",
        features: "",
        notes: "MoE only if expert_count>0",
        support: Support::Capable,
    },
    Recipe {
        arch: "maple",
        models: "unknown (20B, 24 layers)",
        features: "swa",
        notes: "clamp (required swiglu_clamp_exp)",
        support: Support::Capable,
    },
    Recipe {
        arch: "mellum",
        models: "JetBrains Mellum 12B-A2.5B (type name)",
        features: "swa",
        notes: "swa optional",
        support: Support::Capable,
    },
    Recipe {
        arch: "mimo2",
        models: "Xiaomi MiMo-V2-Flash (310B-A15B)",
        features: "dense-lead, sigmoid, bias, mtp, swa",
        notes: "dense layers by presence; attn sinks",
        support: Support::Capable,
    },
    Recipe {
        arch: "gemma4",
        models: "Gemma-4 26B-A4B",
        features: "shared, fused, swa",
        notes: "gelu, parallel-dense (dense MLP acts as shared expert), custom router (scaled rms_norm of attn_out)",
        support: Support::Capable,
    },
    Recipe {
        arch: "kimi-linear",
        models: "Kimi-Linear-48B-A3B",
        features: "shared, dense-lead, sigmoid, bias, mla, delta-net",
        notes: "KDA",
        support: Support::Capable,
    },
    Recipe {
        arch: "kimi-k3",
        models: "Kimi-K3 2.8T-A50B (type name)",
        features: "shared, dense-lead, sigmoid, bias, mla, delta-net",
        notes: "KDA, latent (ffn_routed_down/up), situ",
        support: Support::Capable,
    },
    Recipe {
        arch: "step35",
        models: "StepFun Step-3.5-Flash (196B-A11B)",
        features: "shared, dense-lead, sigmoid, bias, mtp, swa",
        notes: "clamp (optional), dense layers by presence",
        support: Support::Capable,
    },
];

/// The registry row for `arch`, if llama.cpp runs it as a MoE.
pub fn recipe_for(arch: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.arch == arch)
}

/// Why `arch` cannot stream, if the registry knows it cannot.
pub fn refusal(arch: &str) -> Option<&'static str> {
    match recipe_for(arch)?.support {
        Support::Refused(why) => Some(why),
        Support::Capable => None,
    }
}

/// The one notice an architecture without a gate streams with.
pub fn ungated_notice(arch: &str) -> Option<String> {
    if Arch::from_name(arch).is_some() {
        return None;
    }
    let known = match recipe_for(arch) {
        Some(r) => format!(" ({})", r.models),
        None => ", an architecture bmoe's registry does not list,".to_string(),
    };
    Some(format!(
        "{arch}{known} streams by capability: its experts and routing nodes are where bmoe needs them, but no \
         byte-identity gate covers it yet (see `bmoe archs`)"
    ))
}

/// The vendored chat-template families (`assets/chat-templates/`) that go
/// with `arch`'s models.
pub fn chat_templates(arch: &str) -> &'static [&'static str] {
    match arch {
        "qwen3moe" | "qwen3next" | "qwen3vlmoe" => &["qwen3"],
        "qwen35moe" => &["qwen3.5"],
        "qwen2moe" => &["qwen2.5"],
        "gpt-oss" => &["gpt-oss"],
        "gemma4" => &["gemma-4"],
        "glm4moe" => &["glm-4.7"],
        "lfm2moe" => &["lfm2", "lfm2.5"],
        "nemotron_h_moe" => &["nemotron-3"],
        "deepseek4" => &["deepseek-v4"],
        "granitehybrid" => &["granite-4.0"],
        "deepseek2" => &["kimi-k2-thinking"],
        "hunyuan-moe" => &["hunyuan"],
        _ => &[],
    }
}

/// Parses `blk.<il>.<suffix>.weight` for an expert suffix; returns the layer
/// and the suffix's index in [`EXPERT_SUFFIXES`].
pub fn parse_expert_tensor(name: &str) -> Option<(u32, usize)> {
    let rest = name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let suffix = rest.strip_suffix(".weight")?;
    let proj = EXPERT_SUFFIXES.iter().position(|s| *s == suffix)?;
    Some((layer.parse().ok()?, proj))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_exact_expert_weights() {
        assert_eq!(parse_expert_tensor("blk.12.ffn_up_exps.weight"), Some((12, 1)));
        assert_eq!(parse_expert_tensor("blk.0.ffn_gate_up_exps.weight"), Some((0, 2)));
        assert_eq!(parse_expert_tensor("blk.3.ffn_down_exps.scale"), None);
        assert_eq!(parse_expert_tensor("blk.3.ffn_down_shexp.weight"), None);
        assert_eq!(parse_expert_tensor("blk.x.ffn_up_exps.weight"), None);
        assert_eq!(parse_expert_tensor("token_embd.weight"), None);
    }

    #[test]
    fn every_generated_architecture_is_registered_and_capable() {
        for arch in Arch::ALL {
            let r = recipe_for(arch.name()).unwrap_or_else(|| panic!("{} is not in the registry", arch.name()));
            assert_eq!(r.support, Support::Capable, "{}", r.arch);
            assert!(r.gated());
        }
        assert!(recipe_for("qwen2").is_none());
    }

    #[test]
    fn every_vendored_template_goes_with_a_registered_architecture() {
        // Vendored for their thinking switches, not for an architecture bmoe
        // streams: Seed-OSS and granite-3.3 are dense models, and Kimi-K3's
        // architecture is not one the pinned llama.cpp names.
        const SWITCHES_ONLY: [&str; 3] = ["seed-oss", "granite-3.3", "kimi-k3"];
        for (family, _) in crate::chat::NAMED_TEMPLATES.iter().filter(|(f, _)| !SWITCHES_ONLY.contains(f)) {
            let archs: Vec<&str> =
                RECIPES.iter().filter(|r| chat_templates(r.arch).contains(family)).map(|r| r.arch).collect();
            assert!(!archs.is_empty(), "template {family} goes with no architecture");
        }
    }

    #[test]
    fn registry_has_one_row_per_architecture() {
        let mut names: Vec<&str> = RECIPES.iter().map(|r| r.arch).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate rows");
        assert!(refusal("grovemoe").is_some());
        assert!(ungated_notice("qwen3moe").is_none());
        assert!(ungated_notice("dbrx").unwrap().contains("no byte-identity gate"));
        assert!(ungated_notice("newmoe").unwrap().contains("does not list"));
    }
}
