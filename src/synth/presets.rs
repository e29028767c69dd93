//! Full-size shape presets: the models people run on small machines, with
//! their published hyper-parameters and real vocabulary sizes, quantized
//! by the recipe their usual release uses. `make-model --preset NAME --plan`
//! compares the planned bytes with that release file's.
//!
//! Sources are the models' `config.json` on Hugging Face and the release
//! files' sizes as llama.cpp reports them (`llama-bench`'s model size: the
//! bytes of all tensors, without the GGUF header); `docs/architecture.md`,
//! "Full-size presets", lists them with the planned sizes.

use super::{Arch, ModelSpec, QuantMix};
use crate::gguf::GgmlType;

/// A real model's shape.
#[derive(Debug)]
pub struct ModelPreset {
    /// The preset's name (`--preset`).
    pub name: &'static str,
    /// The model it re-creates.
    pub model: &'static str,
    /// llama.cpp's architecture for it.
    pub arch: Arch,
    /// Where the hyper-parameters come from.
    pub source: &'static str,
    /// The release file the planned size is compared with.
    pub release: Release,
    /// Sets the shape on a spec of `arch` (after the architecture's defaults).
    shape: fn(&mut ModelSpec),
}

impl PartialEq for ModelPreset {
    fn eq(&self, other: &ModelPreset) -> bool {
        self.name == other.name
    }
}

impl Eq for ModelPreset {}

/// A release file of a preset's model.
#[derive(Debug, PartialEq)]
pub struct Release {
    /// The file's name and where it is published.
    pub file: &'static str,
    /// The recipe it was quantized with (the preset's default mix).
    pub mix: QuantMix,
    /// Its tensors' size in GiB as llama.cpp reports it (`llama-bench`'s
    /// model size: tensor bytes without the GGUF header).
    pub gib: f64,
    /// Its parameter count in billions, as llama.cpp reports it.
    pub params_b: f64,
    /// Where those figures come from.
    pub source: &'static str,
}

impl Release {
    /// The tensor bytes [`Release::gib`] stands for.
    pub fn bytes(&self) -> u64 {
        (self.gib * f64::from(1u32 << 30)) as u64
    }
}

/// Every full-size preset.
pub const MODEL_PRESETS: &[ModelPreset] = &[
    ModelPreset {
        name: "qwen3-30b-a3b",
        model: "Qwen3-30B-A3B",
        arch: Arch::Qwen3Moe,
        source: "huggingface.co/Qwen/Qwen3-30B-A3B config.json",
        release: Release {
            file: "Qwen3-30B-A3B-Q4_K_M.gguf (Qwen/Qwen3-30B-A3B-GGUF)",
            mix: QuantMix::Q4KM,
            // The per-layer bytes of assets/route-traces/qwen.route.csv (recorded
            // from this file) plus token_embd (q4_K) and output (q6_K).
            gib: 17.28,
            params_b: 30.53,
            source: "llama-bench `qwen3moe 30B.A3B Q4_K - Medium | 17.28 GiB | 30.53 B`; file 18,556,685,824 bytes; \
                     assets/route-traces/qwen.route.csv lists its per-layer bytes",
        },
        shape: |s| {
            set(s, 48, 2048, (32, 4, 128), (128, 8, 768), 6144);
            s.ctx = 40_960;
            s.vocab = 151_936;
        },
    },
    ModelPreset {
        name: "gpt-oss-20b",
        model: "gpt-oss-20b",
        arch: Arch::GptOss,
        source: "huggingface.co/openai/gpt-oss-20b config.json",
        release: Release {
            file: "gpt-oss-20b-mxfp4.gguf (ggml-org/gpt-oss-20b-GGUF)",
            mix: QuantMix::Mxfp4Moe,
            gib: 11.27,
            params_b: 20.91,
            source: "llama-bench `gpt-oss 20B MXFP4 MoE | 11.27 GiB | 20.91 B`",
        },
        shape: |s| {
            set(s, 24, 2880, (64, 8, 64), (32, 4, 2880), 2880);
            s.ctx = 131_072;
            s.vocab = 201_088;
        },
    },
    ModelPreset {
        name: "qwen3.5-35b-a3b",
        model: "Qwen3.5-35B-A3B",
        arch: Arch::Qwen35Moe,
        source: "huggingface.co/Qwen/Qwen3.5-35B-A3B config.json",
        release: Release {
            file: "Qwen3.6-35B-A3B-Q4_K_M.gguf (lmstudio-community/Qwen3.6-35B-A3B-GGUF; same shape)",
            mix: QuantMix::Q4KM,
            gib: 19.70,
            params_b: 34.66,
            source: "llama-bench JSON: model_size 21,155,768,832, model_n_params 34,660,610,688; files that keep \
                     the MTP layer (--mtp-layers 1) have 35.51 B parameters",
        },
        shape: |s| {
            set(s, 40, 2048, (16, 2, 256), (256, 8, 512), 512);
            s.shared_experts = 1;
            // Most releases leave out the checkpoint's MTP layer.
            s.mtp_layers = 0;
            s.ctx = 262_144;
            s.vocab = 248_320;
            s.widths.delta_net = Some((128, 16, 32));
        },
    },
    ModelPreset {
        name: "glm-4.5-air",
        model: "GLM-4.5-Air",
        arch: Arch::Glm4Moe,
        source: "huggingface.co/zai-org/GLM-4.5-Air config.json",
        release: Release {
            file: "GLM-4.5-Air-Q4_K_M-0000{1,2}-of-00002.gguf (unsloth/GLM-4.5-Air-GGUF)",
            mix: QuantMix::Q4KM,
            gib: 67.96,
            params_b: 110.47,
            source: "llama-bench `glm4moe 106B.A12B Q4_K - Medium | 67.96 GiB | 110.47 B`; shards 72,975,748,384 bytes",
        },
        shape: |s| {
            set(s, 46, 4096, (96, 8, 128), (128, 8, 1408), 10_944);
            s.shared_experts = 1;
            s.dense_layers = 1;
            s.mtp_layers = 1;
            s.ctx = 131_072;
            s.vocab = 151_552;
        },
    },
    ModelPreset {
        name: "lfm2-8b-a1b",
        model: "LFM2-8B-A1B",
        arch: Arch::Lfm2Moe,
        source: "huggingface.co/LiquidAI/LFM2-8B-A1B config.json",
        release: Release {
            file: "LFM2-8B-A1B-Q4_K_M.gguf (LiquidAI/LFM2-8B-A1B-GGUF)",
            mix: QuantMix::Q4KM,
            gib: 4.70,
            params_b: 8.34,
            source: "file 5,044,779,712 bytes (one unattributed script); llama-bench `lfm2moe 8B.A1B Q4_0 | 4.41 GiB | \
                     8.34 B` (llama.cpp PR 19848)",
        },
        shape: |s| {
            set(s, 24, 2048, (32, 8, 64), (32, 4, 1792), 7168);
            s.dense_layers = 2;
            s.ctx = 128_000;
            s.vocab = 65_536;
            s.tied_embeddings = true;
            s.widths.attention_layers = Some(layer_bits(&[2, 6, 10, 14, 18, 21]));
        },
    },
    ModelPreset {
        name: "deepseek-v2-lite",
        model: "DeepSeek-V2-Lite",
        arch: Arch::Deepseek2,
        source: "huggingface.co/deepseek-ai/DeepSeek-V2-Lite config.json",
        release: Release {
            file: "DeepSeek-Coder-V2-Lite-Instruct-Q4_K_M.gguf (same architecture and shapes as V2-Lite)",
            mix: QuantMix::Q4KM,
            gib: 9.65,
            params_b: 15.71,
            source: "llama-bench `deepseek2 16B Q4_K - Medium | 9.65 GiB | 15.71 B` (ik_llama.cpp issue 230)",
        },
        shape: |s| {
            set(s, 27, 2048, (16, 16, 128), (64, 6, 1408), 10_944);
            s.shared_experts = 2;
            s.dense_layers = 1;
            s.mtp_layers = 0;
            s.ctx = 163_840;
            s.vocab = 102_400;
            s.widths.kv_lora = Some(512);
        },
    },
];

/// Sets the common shape: layers, embedding width, (heads, KV heads, head
/// width), (experts, experts per token, expert width), dense FFN width.
fn set(s: &mut ModelSpec, layers: u32, embd: u32, heads: (u32, u32, u32), experts: (u32, u32, u32), dense_ff: u32) {
    s.layers = layers;
    s.embd = embd;
    (s.heads, s.kv_heads, s.head_dim) = heads;
    (s.experts, s.experts_used, s.expert_ff) = experts;
    s.dense_ff = dense_ff;
}

/// One bit per listed layer.
fn layer_bits(layers: &[u32]) -> u64 {
    layers.iter().fold(0, |bits, l| bits | 1 << l)
}

impl ModelPreset {
    /// Finds a preset by name.
    pub fn from_name(name: &str) -> Option<&'static ModelPreset> {
        MODEL_PRESETS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// The preset's spec: the published shape, the real vocabulary size and
    /// the release's quantization mix.
    pub fn spec(&self) -> ModelSpec {
        let mut spec = ModelSpec::preset(super::Preset::Tiny, self.arch);
        (self.shape)(&mut spec);
        // Routers and other unquantized weights as the converters write them.
        spec.dense_type = GgmlType::F32;
        spec.quant_mix = Some(self.release.mix);
        spec.derive();
        spec
    }
}
