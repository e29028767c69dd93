//! The recipe registry: for each MoE architecture, the names of its expert
//! tensors. Nothing else is per-architecture; shapes, strides and offsets
//! are discovered at run time.

/// How an architecture lays out its expert projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Separate `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`.
    Split,
    /// One fused `ffn_gate_up_exps` plus `ffn_down_exps` (some files may use
    /// the split form instead; both are recognised).
    Fused,
}

/// One registry row.
#[derive(Debug, Clone, Copy)]
pub struct Recipe {
    /// `general.architecture`.
    pub arch: &'static str,
    /// Typical layout.
    pub layout: Layout,
    /// Reference models.
    pub models: &'static str,
    /// What stays resident besides attention and norms.
    pub notes: &'static str,
    /// Whether a byte-identity gate in `tests/` covers this architecture.
    pub gated: bool,
}

/// Expert tensor suffixes recognised in every architecture (the name between
/// `blk.<il>.` and `.weight`). The fused form, when present, replaces gate+up.
pub const EXPERT_SUFFIXES: [&str; 4] = ["ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps"];

/// Every architecture bmoe streams.
pub const RECIPES: &[Recipe] = &[
    Recipe {
        arch: "qwen3moe",
        layout: Layout::Split,
        models: "Qwen3-30B-A3B, Qwen3-235B-A22B",
        notes: "purely routed",
        gated: true,
    },
    Recipe {
        arch: "qwen2moe",
        layout: Layout::Split,
        models: "Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
        notes: "shared expert ffn_*_shexp stays resident",
        gated: false,
    },
    Recipe {
        arch: "qwen35moe",
        layout: Layout::Split,
        models: "Qwen3.5/3.6-35B-A3B",
        notes: "hybrid attention; shared expert resident; MTP block not streamed",
        gated: false,
    },
    Recipe {
        arch: "gemma4",
        layout: Layout::Fused,
        models: "Gemma-4-26B-A4B",
        notes: "dense shared FFN, router scale and ffn_down_exps.scale resident",
        gated: true,
    },
    Recipe {
        arch: "gpt-oss",
        layout: Layout::Split,
        models: "gpt-oss-20b, gpt-oss-120b",
        notes: "MXFP4 experts; expert biases (ffn_*_exps.bias) resident",
        gated: true,
    },
    Recipe {
        arch: "lfm2moe",
        layout: Layout::Split,
        models: "LFM2-8B-A1B, LFM2.5-8B-A1B",
        notes: "leading dense blocks never bind; selection bias resident",
        gated: false,
    },
    Recipe {
        arch: "deepseek4",
        layout: Layout::Split,
        models: "DeepSeek V4 Flash",
        notes: "shared expert and indexer resident; biased top-k",
        gated: false,
    },
    Recipe {
        arch: "bailingmoe3",
        layout: Layout::Split,
        models: "Ling-3.0-flash",
        notes: "shared expert resident; leading dense blocks; biased top-k",
        gated: false,
    },
];

/// The recipe for `arch`, if bmoe can stream it.
pub fn recipe_for(arch: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.arch == arch)
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
    fn every_reference_arch_is_registered() {
        for arch in ["qwen3moe", "qwen2moe", "qwen35moe", "gemma4", "gpt-oss", "lfm2moe", "deepseek4", "bailingmoe3"] {
            assert!(recipe_for(arch).is_some(), "{arch}");
        }
        assert!(recipe_for("llama").is_none());
    }
}
