//! Synthetic MoE models: real GGUF files in real llama.cpp architectures with
//! random weights, shaped so that routing behaves like a trained model's.
//!
//! The shaping (see `docs/architecture.md`, "Synthetic models"):
//! - Text tokens form one long cycle; each token's embedding is an AR(1) step
//!   from its predecessor's (correlation `token_corr`) plus a shared direction
//!   `u`. The output head puts a token's two successors on the cycle first,
//!   so greedy decoding walks the cycle instead of collapsing into a short
//!   loop (a tied head, the embedding itself, through a successor lookup in
//!   the first dense layer: `tied.rs`).
//! - Router row `e` of layer `l` is `gain * (B[l][e] * u / sqrt(d) + r[l][e])`:
//!   the `u` part gives each expert a fixed popularity bias `B` (spread
//!   `skew`), the random part a per-token preference that consecutive tokens
//!   share through the AR(1) embeddings.
//! - Attention and dense outputs are scaled down (`mix`) so the residual
//!   stream keeps that structure through every layer.
//! - Routed experts write only to the expert band ([`expert_band`]), which
//!   embeddings and routers leave out and the output head reads: the experts
//!   chosen change the text (`experts`: about a fifth of the residual
//!   stream per layer) without moving any routing decision.

pub mod arch;
pub mod build;
mod fill;
pub mod mix;
mod options;
pub mod pieces;
mod plan;
pub mod presets;
pub mod recurrent;
mod structure;
mod tied;
mod vocab;
mod write;

pub use arch::{Arch, Generator};
pub use fill::{Fill, mix};
pub use mix::QuantMix;
pub use options::{ModelOptions, model_spec};
pub use plan::{Planned, plan};
pub use presets::{MODEL_PRESETS, ModelPreset};
pub use vocab::{BOS_ID, EOS_ID, Vocab, template_markers};
pub use write::{WriteReport, rewrite_tensor, write_model, write_plan};

use crate::gguf::GgmlType;

/// The expert types the generator writes: the ones releases use for experts
/// (q5_0, q8_0 and q5_1 also as the recipes' fallbacks for widths that are
/// not whole K-quant blocks). f32, f16, bf16, q8_0 and q4_0 are encoded
/// here; the others by ggml's own quantizer (real, validated blocks).
pub const EXPERT_TYPES: &[&str] = &[
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq1_s",
    "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq4_xs", "iq4_nl", "mxfp4",
];

/// The width of the expert band: routed experts write only to the residual
/// stream's first `expert_band(d)` coordinates, which the routers and the
/// token embeddings leave out, so what the experts add changes the output
/// head's choice without moving any router's ranking.
pub fn expert_band(d: usize) -> usize {
    (d / 8).max(1)
}

/// Changes whenever the same spec would produce different bytes.
pub const GENERATOR_VERSION: u32 = 5;

/// Named model sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Preset {
    /// Under 5 MB: for tests.
    Tiny,
    /// About 200 MB: the model `bmoe generate` uses when given none.
    Demo,
    /// Qwen3-30B-A3B-shaped layers, over 5 GB: for benchmarks.
    Bench,
    /// A real model's full shape (its own architecture, real vocabulary,
    /// its release's quantization mix).
    Model(&'static ModelPreset),
}

impl Preset {
    /// Parses a preset name.
    pub fn from_name(name: &str) -> Option<Preset> {
        match name {
            "tiny" => Some(Preset::Tiny),
            "demo" => Some(Preset::Demo),
            "bench" => Some(Preset::Bench),
            _ => ModelPreset::from_name(name).map(Preset::Model),
        }
    }

    /// Every preset name, comma-separated (for help and errors).
    pub fn names() -> String {
        let models = MODEL_PRESETS.iter().map(|p| p.name);
        ["tiny", "demo", "bench"].into_iter().chain(models).collect::<Vec<_>>().join(", ")
    }
}

/// How routing is shaped (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoutingShape {
    /// Correlation between consecutive text tokens' embeddings (0..1).
    pub token_corr: f32,
    /// Spread of per-expert popularity bias in the first MoE layer.
    pub skew_first: f32,
    /// Spread of per-expert popularity bias from a quarter of the depth on.
    pub skew: f32,
    /// Router logit scale (softmax sharpness; does not change the ranking).
    pub gain: f32,
    /// Size of each attention and dense FFN output relative to the residual stream.
    pub mix: f32,
    /// Size of the routed experts' output relative to the residual stream
    /// entering the first MoE layer (`bmoe eval --branches` measures it; see
    /// `docs/architecture.md`, "Experts that matter").
    pub experts: f32,
}

impl Default for RoutingShape {
    fn default() -> RoutingShape {
        RoutingShape { token_corr: 0.42, skew_first: 0.6, skew: 1.35, gain: 2.0, mix: 0.03, experts: 0.2 }
    }
}

/// Widths an architecture sizes apart from its attention heads; `None`
/// derives them from the heads. Presets of real models set them to the
/// release's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Widths {
    /// Gated delta-net (Qwen hybrids): key head width, key heads, value
    /// heads (derived: head width, KV heads, heads).
    pub delta_net: Option<(u32, u32, u32)>,
    /// Multi-head latent attention (deepseek2): the compressed KV latent's
    /// width (derived: twice the head width).
    pub kv_lora: Option<u32>,
    /// Which layers attend in a hybrid whose pattern is not periodic (LFM2),
    /// one bit per layer from layer 0 (derived: every odd layer).
    pub attention_layers: Option<u64>,
}

/// Everything that determines a synthetic model file.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Architecture.
    pub arch: Arch,
    /// Transformer blocks.
    pub layers: u32,
    /// Embedding width.
    pub embd: u32,
    /// Attention heads.
    pub heads: u32,
    /// Key/value heads.
    pub kv_heads: u32,
    /// Width of one head.
    pub head_dim: u32,
    /// Experts per MoE layer.
    pub experts: u32,
    /// Experts routed per token.
    pub experts_used: u32,
    /// Hidden width of one expert.
    pub expert_ff: u32,
    /// Hidden width of dense FFNs (leading dense layers, gemma4's dense branch).
    pub dense_ff: u32,
    /// Shared experts beside the routed ones (0: none); their width is
    /// `expert_ff` each.
    pub shared_experts: u32,
    /// Leading layers with a dense FFN instead of experts.
    pub dense_layers: u32,
    /// MTP (next-token prediction) layers after the main blocks.
    pub mtp_layers: u32,
    /// Training context length written to metadata.
    pub ctx: u32,
    /// Vocabulary size: the natural vocabulary (bytes, letter pieces, the
    /// template's markers) padded with filler tokens up to this many
    /// (0: the natural vocabulary only).
    pub vocab: u32,
    /// Widths some architectures size apart from the heads (default:
    /// derived from the heads, as the generators always have).
    pub widths: Widths,
    /// No `output.weight`: the output head is `token_embd` (tied
    /// embeddings), and the first dense layer a lookup of each token's
    /// successors that makes it one (see `tied.rs`); presets of releases
    /// that tie set it.
    pub tied_embeddings: bool,
    /// Type of the expert tensors.
    pub expert_type: GgmlType,
    /// Type of the large dense matrices (attention, embeddings).
    pub dense_type: GgmlType,
    /// A llama.cpp quantization recipe applied per tensor after the plan
    /// (it replaces `expert_type` and `dense_type` where it applies).
    pub quant_mix: Option<QuantMix>,
    /// Random seed: same seed, same bytes.
    pub seed: u64,
    /// Number of shard files (1 = a single file).
    pub split: u32,
    /// Letter pieces in the vocabulary (readable output).
    pub pieces: bool,
    /// Routing shape.
    pub routing: RoutingShape,
    /// A Jinja chat template to write as `tokenizer.chat_template`; the
    /// markers it writes (`<|im_start|>`, `<think>`, ...) become special
    /// tokens of the vocabulary.
    pub chat_template: Option<String>,
}

impl ModelSpec {
    /// The spec of a preset for `arch` (a full-size model's preset has its
    /// own architecture and ignores `arch`).
    pub fn preset(preset: Preset, arch: Arch) -> ModelSpec {
        if let Preset::Model(model) = preset {
            return model.spec();
        }
        let tiny = ModelSpec {
            arch,
            layers: 4,
            embd: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            experts: 8,
            experts_used: 2,
            expert_ff: 64,
            dense_ff: 128,
            shared_experts: 0,
            dense_layers: 0,
            mtp_layers: 0,
            ctx: 4096,
            vocab: 0,
            widths: Widths::default(),
            tied_embeddings: false,
            expert_type: GgmlType::F32,
            dense_type: GgmlType::F32,
            quant_mix: None,
            seed: 42,
            split: 1,
            pieces: true,
            routing: RoutingShape::default(),
            chat_template: None,
        };
        let mut spec = match preset {
            Preset::Tiny => tiny,
            Preset::Demo => ModelSpec {
                layers: 8,
                embd: 512,
                heads: 8,
                kv_heads: 4,
                head_dim: 64,
                experts: 64,
                experts_used: 8,
                expert_ff: 256,
                dense_ff: 1024,
                expert_type: GgmlType::Q8_0,
                dense_type: GgmlType::F16,
                ..tiny
            },
            Preset::Model(_) => unreachable!("returned above"),
            Preset::Bench => ModelSpec {
                layers: 16,
                embd: 2048,
                heads: 32,
                kv_heads: 4,
                head_dim: 128,
                experts: 128,
                experts_used: 8,
                expert_ff: 768,
                dense_ff: 2048,
                expert_type: GgmlType::Q4_0,
                dense_type: GgmlType::F16,
                ..tiny
            },
        };
        (arch.generator().defaults)(&mut spec);
        spec.derive();
        spec
    }

    /// Derives the dimensions the architecture makes follow from the shape
    /// flags; run after changing the embedding width or heads.
    pub fn derive(&mut self) {
        (self.arch.generator().derive)(self);
    }

    /// Tokens the structure shapes one by one: bytes, letters, specials and
    /// the chat template's markers (not the fillers).
    pub fn natural_tokens(&self) -> usize {
        let markers = self.chat_template.as_deref().map(vocab::template_markers).unwrap_or_default();
        vocab::Vocab::new(self.pieces, &markers, 0).natural_len()
    }

    /// Widens a tied model's leading dense layers to hold its successor
    /// lookup (one unit per natural token, rounded up to 256) if they are
    /// narrower, and gives it one if it has none.
    pub fn fit_tied_head(&mut self) {
        if self.tied_embeddings {
            self.dense_layers = self.dense_layers.max(1);
            let need = self.natural_tokens().next_multiple_of(256) as u32;
            self.dense_ff = self.dense_ff.max(need);
        }
    }

    /// Checks the shape for values llama.cpp or the generator cannot take.
    pub fn validate(&self) -> Result<(), String> {
        let blocks = |what: &str, n: u32, ty: GgmlType| {
            if ty.row_bytes(u64::from(n)).is_none() {
                Err(format!("{what} ({n}) must be a multiple of {} for {ty}", ty.block_elems()))
            } else {
                Ok(())
            }
        };
        if !EXPERT_TYPES.iter().any(|t| GgmlType::from_name(t) == Some(self.expert_type)) {
            return Err(format!("expert type {} is not supported ({})", self.expert_type, EXPERT_TYPES.join(", ")));
        }
        if ![GgmlType::F32, GgmlType::F16].contains(&self.dense_type) {
            return Err(format!("dense type {} is not supported (f32, f16)", self.dense_type));
        }
        let min_layers = self.dense_layers + 1;
        if self.layers < min_layers || self.layers > 256 {
            return Err(format!(
                "layers must be in {min_layers}..=256 (got {}){}",
                self.layers,
                if self.dense_layers > 0 {
                    format!("; {} of them are dense", self.dense_layers)
                } else {
                    String::new()
                }
            ));
        }
        if self.mtp_layers > 4 {
            return Err(format!("mtp layers must be in 0..=4 (got {})", self.mtp_layers));
        }
        if self.shared_experts > 16 {
            return Err(format!("shared experts must be in 0..=16 (got {})", self.shared_experts));
        }
        if self.experts < 2 || self.experts > 512 {
            return Err(format!("experts must be in 2..=512 (got {})", self.experts));
        }
        if self.experts_used == 0 || self.experts_used > self.experts {
            return Err(format!("experts-used must be in 1..={} (got {})", self.experts, self.experts_used));
        }
        if self.heads == 0 || self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!("heads ({}) must be a positive multiple of kv heads ({})", self.heads, self.kv_heads));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return Err(format!("head width must be even and positive (got {})", self.head_dim));
        }
        if self.tied_embeddings {
            if !self.arch.generator().ties_embeddings {
                return Err(format!("{} files carry their own output head (no tied embeddings)", self.arch.name()));
            }
            // The first dense layer holds the tied head's successor lookup.
            let natural = self.natural_tokens();
            if self.dense_layers == 0 || (self.dense_ff as usize) < natural {
                return Err(format!(
                    "tied embeddings need a leading dense layer at least {natural} wide (one unit per natural token: \
                     the lookup that makes the head; got {} dense layers of {})",
                    self.dense_layers, self.dense_ff
                ));
            }
        }
        if self.vocab > vocab::Vocab::MAX_SIZE {
            return Err(format!("vocabulary must be at most {} tokens (got {})", vocab::Vocab::MAX_SIZE, self.vocab));
        }
        if self.split == 0 || self.split > 99 {
            return Err(format!("split must be in 1..=99 (got {})", self.split));
        }
        let r = &self.routing;
        if !(0.0..1.0).contains(&r.token_corr) {
            return Err(format!("token correlation must be in [0, 1) (got {})", r.token_corr));
        }
        if !(0.0..=4.0).contains(&r.experts) {
            return Err(format!("expert mix must be in [0, 4] (got {})", r.experts));
        }
        if !(0.0..=4.0).contains(&r.mix) {
            return Err(format!("mix must be in [0, 4] (got {})", r.mix));
        }
        if self.quant_mix.is_none() {
            // A mix falls back to a type whose blocks fit, as llama.cpp's quantizer does.
            blocks("embedding width", self.embd, self.expert_type)?;
            blocks("expert width", self.expert_ff, self.expert_type)?;
        }
        blocks("embedding width", self.embd, self.dense_type)?;
        (self.arch.generator().check)(self)
    }
}
