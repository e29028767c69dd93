//! What a synthetic model is made of, as `bmoe make-model` takes it on the
//! command line and a script's `make_model` in a map: a preset, then every
//! option given.

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use super::{Arch, ModelSpec, Preset};
use crate::gguf::GgmlType;
use crate::moe::recipe;

/// A synthetic model's preset and the options that change it.
#[derive(Args, Debug, Default, Clone)]
pub struct ModelOptions {
    /// Starting shape: tiny (<5 MB, tests), demo (~220 MB), bench (Qwen3-30B-A3B layers, >5 GB), or a
    /// real model's full shape with its real vocabulary and its release's quantization mix: qwen3-30b-a3b,
    /// gpt-oss-20b, qwen3.5-35b-a3b, glm-4.5-air, lfm2-8b-a1b, deepseek-v2-lite (see --plan).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Architecture, by llama.cpp's `general.architecture` name (`bmoe archs` lists those the generator makes;
    /// default qwen3moe, or the full-size preset's own).
    #[arg(long)]
    pub arch: Option<String>,
    /// Transformer layers.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Embedding width.
    #[arg(long)]
    pub embd: Option<u32>,
    /// Experts per layer.
    #[arg(long)]
    pub experts: Option<u32>,
    /// Experts routed per token.
    #[arg(long)]
    pub experts_used: Option<u32>,
    /// Hidden width of one expert.
    #[arg(long)]
    pub expert_ff: Option<u32>,
    /// Shared experts beside the routed ones (architectures that have them; default: the architecture's usual).
    #[arg(long)]
    pub shared_experts: Option<u32>,
    /// Leading layers with a dense FFN instead of experts (architectures that have them).
    #[arg(long)]
    pub dense_layers: Option<u32>,
    /// MTP (next-token prediction) layers after the main blocks (glm4moe, deepseek2, qwen35moe).
    #[arg(long)]
    pub mtp_layers: Option<u32>,
    /// Expert tensor type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, the K-quants q2_K..q6_K, iq1_s, iq1_m,
    /// iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_xs, iq4_nl or mxfp4 (K-quants and most IQ types need widths
    /// that are multiples of 256, the others of 32).
    #[arg(long)]
    pub quant: Option<String>,
    /// A llama.cpp quantization recipe applied per tensor, as releases are made: q4_k_m, q5_k_m, q6_k, q3_k_m,
    /// iq2_xxs or mxfp4 (MXFP4_MOE: experts in MXFP4, the rest q8_0). Replaces --quant.
    #[arg(long, value_name = "RECIPE")]
    pub quant_mix: Option<String>,
    /// Vocabulary size: byte and letter tokens, the template's markers, then filler tokens up to this many
    /// (the full-size presets use their model's real size).
    #[arg(long)]
    pub vocab: Option<u32>,
    /// No output head: the head is the token embedding, as LFM2 releases ship (architectures that tie;
    /// the first dense layer is widened to the natural vocabulary if narrower).
    #[arg(long)]
    pub tied_embeddings: bool,
    /// Random seed (same seed, same bytes).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write N shard files (llama.cpp's split format).
    #[arg(long)]
    pub split: Option<u32>,
    /// Routing shape: correlation of consecutive tokens' embeddings, in [0, 1).
    #[arg(long, help_heading = "Routing shape")]
    pub token_corr: Option<f32>,
    /// Routing shape: spread of per-expert popularity from a quarter of the depth on.
    #[arg(long, help_heading = "Routing shape")]
    pub skew: Option<f32>,
    /// Routing shape: spread of per-expert popularity in the first MoE layer.
    #[arg(long, help_heading = "Routing shape")]
    pub skew_first: Option<f32>,
    /// Routing shape: size of attention and dense FFN outputs relative to the residual stream.
    #[arg(long, help_heading = "Routing shape")]
    pub mix: Option<f32>,
    /// Size of the routed experts' output relative to the residual stream (0 makes experts that
    /// change nothing; trained models' layers add about 0.2) [default: 0.2].
    #[arg(long, help_heading = "Routing shape")]
    pub expert_mix: Option<f32>,
    /// Write a chat template: a bundled family (qwen3, qwen3.5, gpt-oss, gemma-4, ...) or a .jinja file.
    /// Its markers become special tokens of the vocabulary.
    #[arg(long, value_name = "FAMILY|FILE")]
    pub chat_template: Option<String>,
    /// The MTP layer's weights: random (agrees with the model almost never), or agree (drafts the model's own
    /// usual successor of each token, learned from greedy runs, for 70% of tokens and a wrong one for the rest,
    /// as real heads agree; agree:1 keeps all). agree needs an MTP layer with its own embeddings and head
    /// (glm4moe, deepseek2).
    #[arg(long, value_name = "random|agree[:SHARE]")]
    pub mtp_head: Option<String>,
}

/// The share of successors `--mtp-head agree` keeps: real MTP heads see
/// their first draft accepted about 0.5-0.8 of the time.
pub const DEFAULT_AGREEMENT: f64 = 0.7;

impl ModelOptions {
    /// The share of successors an agreeing MTP head keeps (`None`: a random head).
    pub fn mtp_agreement(&self) -> Result<Option<f64>> {
        match self.mtp_head.as_deref() {
            None | Some("random") => Ok(None),
            Some("agree") => Ok(Some(DEFAULT_AGREEMENT)),
            Some(other) => {
                let share = other.strip_prefix("agree:").and_then(|s| s.parse::<f64>().ok());
                match share {
                    Some(s) if (0.0..=1.0).contains(&s) => Ok(Some(s)),
                    _ => bail!("--mtp-head {other}: random, agree, or agree:SHARE with SHARE in [0, 1]"),
                }
            }
        }
    }
}

/// The model `bmoe make-model` (and a script's `make_model`) would write
/// for `a`: the preset, then every option given.
pub fn model_spec(a: &ModelOptions) -> Result<ModelSpec> {
    let spec = build_spec(a)?;
    if a.mtp_agreement()?.is_some() {
        if spec.mtp_layers == 0 {
            bail!("--mtp-head agree: the model has no MTP layer (add --mtp-layers 1)");
        }
        if ![Arch::Glm4Moe, Arch::Deepseek2].contains(&spec.arch) {
            bail!(
                "--mtp-head agree: {}'s MTP layer shares the model's embeddings and output head; an agreeing head \
                 needs its own (glm4moe, deepseek2)",
                spec.arch.name()
            );
        }
    }
    Ok(spec)
}

fn build_spec(a: &ModelOptions) -> Result<ModelSpec> {
    let preset = Preset::from_name(&a.preset)
        .ok_or_else(|| anyhow!("--preset {}: the presets are {}", a.preset, Preset::names()))?;
    let arch_name = a.arch.as_deref().unwrap_or("qwen3moe");
    let arch = Arch::from_name(arch_name).ok_or_else(|| {
        let known = if recipe::recipe_for(arch_name).is_some() {
            " (llama.cpp runs it, and bmoe streams its files by capability, but has no generator for it)"
        } else {
            ""
        };
        anyhow!("--arch {arch_name}{known}: the generator makes {}", Arch::names())
    })?;
    if let (Preset::Model(model), Some(_)) = (preset, &a.arch)
        && model.arch != arch
    {
        bail!("--preset {} is a {} model; leave out --arch {arch_name}", model.name, model.arch.name());
    }
    let mut spec = ModelSpec::preset(preset, arch);
    if let Some(q) = &a.quant {
        let known = crate::synth::EXPERT_TYPES.iter().any(|t| t.eq_ignore_ascii_case(q));
        spec.expert_type = GgmlType::from_name(q).filter(|_| known).ok_or_else(|| {
            anyhow!("--quant {q}: the generator writes {} experts", crate::synth::EXPERT_TYPES.join(", "))
        })?;
        if spec.quant_mix.take().is_some() {
            // A full-size preset's mix gives way: experts of one type, the dense weights in f16.
            spec.dense_type = GgmlType::F16;
        }
    }
    if let Some(m) = &a.quant_mix {
        if a.quant.is_some() {
            bail!("give --quant (one type for the experts) or --quant-mix (a recipe for every tensor), not both");
        }
        let names: Vec<&str> = crate::synth::QuantMix::ALL.iter().map(|(_, n)| *n).collect();
        spec.quant_mix = Some(
            crate::synth::QuantMix::from_name(m)
                .ok_or_else(|| anyhow!("--quant-mix {m}: the recipes are {}", names.join(", ")))?,
        );
    }
    let set = |dst: &mut u32, v: Option<u32>| {
        if let Some(v) = v {
            *dst = v;
        }
    };
    set(&mut spec.layers, a.layers);
    set(&mut spec.embd, a.embd);
    set(&mut spec.experts, a.experts);
    set(&mut spec.experts_used, a.experts_used);
    set(&mut spec.expert_ff, a.expert_ff);
    set(&mut spec.split, a.split);
    set(&mut spec.shared_experts, a.shared_experts);
    set(&mut spec.dense_layers, a.dense_layers);
    set(&mut spec.mtp_layers, a.mtp_layers);
    set(&mut spec.vocab, a.vocab);
    spec.tied_embeddings |= a.tied_embeddings;
    spec.derive();
    if let Some(s) = a.seed {
        spec.seed = s;
    }
    let r = &mut spec.routing;
    for (dst, v) in [
        (&mut r.token_corr, a.token_corr),
        (&mut r.skew, a.skew),
        (&mut r.skew_first, a.skew_first),
        (&mut r.mix, a.mix),
        (&mut r.experts, a.expert_mix),
    ] {
        if let Some(v) = v {
            *dst = v;
        }
    }
    if let Some(t) = &a.chat_template {
        let source = match crate::chat::named_template(t) {
            Some(s) => s.to_string(),
            None if std::path::Path::new(t).is_file() => {
                std::fs::read_to_string(t).with_context(|| format!("reading {t}"))?
            }
            None => {
                let names: Vec<&str> = crate::chat::NAMED_TEMPLATES.iter().map(|(n, _)| *n).collect();
                bail!("--chat-template {t}: not a file nor a bundled family ({})", names.join(", "));
            }
        };
        crate::chat::ChatTemplate::new(t, &source).map_err(|e| anyhow!(e))?;
        spec.chat_template = Some(source);
    }
    spec.fit_tied_head();
    Ok(spec)
}
