//! One file per architecture, the way llama.cpp keeps one file per model
//! graph. Each file names its `general.architecture`, the defaults its
//! shape needs and writes its metadata and tensors from the shared pieces;
//! adding an architecture is a file and a line in [`Arch`].

mod bailingmoe2;
mod deepseek2;
mod dots1;
mod ernie4_5_moe;
mod gemma4;
mod glm4moe;
mod gpt_oss;
mod granitehybrid;
mod hunyuan_moe;
mod lfm2moe;
mod llama;
mod llama4;
mod minimax_m2;
mod nemotron_h_moe;
mod olmoe;
mod qwen2moe;
mod qwen35moe;
mod qwen3moe;
mod qwen3next;
mod smallthinker;

use super::ModelSpec;
use super::build::Builder;

/// What the generator knows of one architecture.
pub struct Generator {
    /// llama.cpp's `general.architecture` name.
    pub name: &'static str,
    /// Adjusts a preset's shape to the architecture's usual form (shared
    /// experts, leading dense layers, MTP layers).
    pub defaults: fn(&mut ModelSpec),
    /// Derives the dimensions that follow from the shape flags (run after
    /// they are applied), such as a head width that must span the embedding.
    pub derive: fn(&mut ModelSpec),
    /// Refuses shapes the architecture's loader or graph cannot take.
    pub check: fn(&ModelSpec) -> Result<(), String>,
    /// Writes the architecture's metadata keys and every tensor.
    pub build: fn(&mut Builder),
    /// Whether the loader takes `token_embd` as the output head when a file
    /// has no `output.weight` (tied embeddings, as some releases ship).
    pub ties_embeddings: bool,
    /// Scales the routed experts' down projections so that the first MoE
    /// layer's branch measures about the routing shape's `experts` of the
    /// residual stream (`bmoe eval --branches` on the demo shape): the
    /// architectures weight and sum their experts differently (softmax or
    /// sigmoid weights, renormalized or scaled, residual multipliers).
    pub expert_gain: f32,
}

impl Generator {
    /// No defaults, no extra checks, nothing built: the base of every entry.
    pub const BASE: Generator = Generator {
        name: "",
        defaults: |_| {},
        derive: |_| {},
        check: no_extras,
        build: |_| {},
        ties_embeddings: false,
        expert_gain: 1.0,
    };
}

/// The check of an architecture with no shared experts, leading dense
/// layers or MTP layers.
fn no_extras(spec: &ModelSpec) -> Result<(), String> {
    only(spec, false, false, false)
}

/// Refuses shared experts, leading dense layers or MTP layers where the
/// architecture has none.
fn only(spec: &ModelSpec, shared: bool, dense: bool, mtp: bool) -> Result<(), String> {
    let arch = spec.arch.name();
    if !shared && spec.shared_experts > 0 {
        return Err(format!("{arch} has no shared experts"));
    }
    if !dense && spec.dense_layers > 0 {
        return Err(format!("{arch} has no leading dense layers"));
    }
    if !mtp && spec.mtp_layers > 0 {
        return Err(format!("{arch} has no MTP layers"));
    }
    Ok(())
}

/// Refuses a shape without shared experts for an architecture whose graph
/// adds them unconditionally.
fn needs_shared(spec: &ModelSpec) -> Result<(), String> {
    if spec.shared_experts == 0 {
        return Err(format!("{} needs a shared expert (its graph adds one unconditionally)", spec.arch.name()));
    }
    Ok(())
}

/// Refuses head widths an architecture that ropes `1/share` of each head
/// cannot split into even rope pairs.
fn partial_rope(spec: &ModelSpec, share: u32) -> Result<(), String> {
    if !spec.head_dim.is_multiple_of(2 * share) {
        return Err(format!(
            "{} ropes 1/{share} of each head: the head width ({}) must be a multiple of {}",
            spec.arch.name(),
            spec.head_dim,
            2 * share
        ));
    }
    Ok(())
}

/// Makes the head width span the embedding (`heads x head width = embd`),
/// for loaders that size `attn_q` and `attn_output` as `[d, d]`.
fn head_from_embedding(spec: &mut ModelSpec) {
    if spec.heads > 0 && spec.embd.is_multiple_of(spec.heads) {
        spec.head_dim = spec.embd / spec.heads;
    }
}

/// Refuses shapes whose query width is not the embedding width (loaders
/// that size `attn_q` and `attn_output` as `[d, d]`).
fn attention_spans_embedding(spec: &ModelSpec) -> Result<(), String> {
    if spec.heads * spec.head_dim != spec.embd {
        return Err(format!(
            "{} sizes attention by the embedding: heads ({}) x head width ({}) must equal the embedding width ({})",
            spec.arch.name(),
            spec.heads,
            spec.head_dim,
            spec.embd
        ));
    }
    Ok(())
}

macro_rules! architectures {
    ($($variant:ident => $module:ident),* $(,)?) => {
        /// Architectures the generator can produce.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Arch {
            $(
                #[doc = concat!("See `src/synth/arch/", stringify!($module), ".rs`.")]
                $variant,
            )*
        }

        impl Arch {
            /// Every architecture the generator supports.
            pub const ALL: &'static [Arch] = &[$(Arch::$variant),*];

            /// The architecture's generator.
            pub fn generator(self) -> &'static Generator {
                match self {
                    $(Arch::$variant => &$module::GENERATOR,)*
                }
            }
        }
    };
}

architectures! {
    Qwen3Moe => qwen3moe,
    Gemma4 => gemma4,
    GptOss => gpt_oss,
    Qwen2Moe => qwen2moe,
    Llama => llama,
    Olmoe => olmoe,
    Llama4 => llama4,
    Ernie45Moe => ernie4_5_moe,
    HunyuanMoe => hunyuan_moe,
    Glm4Moe => glm4moe,
    Dots1 => dots1,
    MinimaxM2 => minimax_m2,
    Deepseek2 => deepseek2,
    Qwen3Next => qwen3next,
    Qwen35Moe => qwen35moe,
    Lfm2Moe => lfm2moe,
    GraniteHybrid => granitehybrid,
    NemotronHMoe => nemotron_h_moe,
    SmallThinker => smallthinker,
    BailingMoe2 => bailingmoe2,
}

impl Arch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        self.generator().name
    }

    /// Parses an architecture name (llama.cpp's `general.architecture`).
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// Every name, comma-separated (for help and errors).
    pub fn names() -> String {
        Arch::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
    }
}
