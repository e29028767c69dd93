//! The load check (`bmoe::gguf::check_model`) on damaged model files.
//!
//! Each fixture in `MUTANTS` is a small, deterministic mutation of a tiny
//! generated model: one header field or one tensor type changed, every
//! other byte as generated (4 MB each, so they are made here rather than
//! committed; `write_fixtures` writes them out). Without the check, most of
//! them killed bmoe with a signal (SIGFPE, SIGSEGV) or a llama.cpp assertion
//! (SIGABRT), and the rest got llama.cpp's own shape error, which names a
//! tensor but not the key behind it; `bmoe inspect` called every one
//! streamable. Now the library refuses each with one line naming the key or
//! tensor, `bmoe inspect` says so, and `bmoe generate` (resident and
//! streamed) exits with that line.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bmoe::gguf::{GgmlType, GgufFile, GgufWriter, ModelFiles, RunShape, TensorSpec, Value, ValueType, split_path};
use bmoe::synth::{self, Arch, ModelSpec, Preset};
use common::tempdir;

/// The generated models the fixtures are made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    Qwen3Moe,
    /// qwen3moe 256 wide, so every type's blocks fit a row (q8_K: 256).
    Wide,
    Qwen3Next,
    Qwen35Moe,
    Qwen2Moe,
    Deepseek2,
    Glm4Moe,
    GraniteHybrid,
    Lfm2Moe,
    GptOss,
    Gemma4,
}

impl Base {
    fn write(self, dir: &Path) -> PathBuf {
        let arch = match self {
            Base::Qwen3Moe | Base::Wide => Arch::Qwen3Moe,
            Base::Qwen3Next => Arch::Qwen3Next,
            Base::Qwen35Moe => Arch::Qwen35Moe,
            Base::Qwen2Moe => Arch::Qwen2Moe,
            Base::Deepseek2 => Arch::Deepseek2,
            Base::Glm4Moe => Arch::Glm4Moe,
            Base::GraniteHybrid => Arch::GraniteHybrid,
            Base::Lfm2Moe => Arch::Lfm2Moe,
            Base::GptOss => Arch::GptOss,
            Base::Gemma4 => Arch::Gemma4,
        };
        let path = dir.join(format!("base-{self:?}.gguf"));
        if !path.exists() {
            let mut spec = ModelSpec::preset(Preset::Tiny, arch);
            if self == Base::Wide {
                spec.embd = 256;
            }
            synth::write_model(&spec, &path, &mut |_, _| std::ops::ControlFlow::Continue(())).expect("write base");
        }
        path
    }
}

/// A model's header as a fixture edits it.
struct Header {
    meta: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl Header {
    /// `key` with a leading `ARCH.` replaced by the architecture.
    fn key(&self, key: &str) -> String {
        match key.strip_prefix("ARCH.") {
            Some(rest) => {
                let arch = self.meta.iter().find(|(k, _)| k == "general.architecture").unwrap().1.clone();
                format!("{}.{rest}", arch.as_str().unwrap())
            }
            None => key.to_string(),
        }
    }

    fn get(&self, key: &str) -> &Value {
        let key = self.key(key);
        &self.meta.iter().find(|(k, _)| *k == key).unwrap_or_else(|| panic!("{key} is not in the base model")).1
    }

    fn set(&mut self, key: &str, value: Value) {
        let key = self.key(key);
        match self.meta.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.meta.push((key, value)),
        }
    }

    fn remove(&mut self, key: &str) {
        let key = self.key(key);
        let before = self.meta.len();
        self.meta.retain(|(k, _)| *k != key);
        assert!(self.meta.len() < before, "{key} is not in the base model");
    }

    fn retype(&mut self, tensor: &str, ty: &str) {
        let t = self.tensors.iter_mut().find(|t| t.name == tensor).unwrap_or_else(|| panic!("no tensor {tensor}"));
        t.ty = GgmlType::from_name(ty).unwrap();
    }
}

/// Rewrites the GGUF file `src` as `dst` with `edit` applied to its header;
/// a tensor whose size the edit changes gets zero bytes, every other one
/// keeps its own.
fn mutate(src: &Path, dst: &Path, edit: impl FnOnce(&mut Header)) {
    let file = GgufFile::open(src).unwrap();
    let bytes = std::fs::read(src).unwrap();
    let mut header = Header {
        meta: file.metadata().to_vec(),
        tensors: file.tensors().iter().map(|t| TensorSpec::new(t.name.clone(), &t.dims, t.ty)).collect(),
    };
    edit(&mut header);
    let mut w = GgufWriter::new();
    for (k, v) in &header.meta {
        w.set(k, v.clone());
    }
    for t in &header.tensors {
        w.add_tensor(t.clone());
    }
    let infos = file.tensors();
    let data = |i: usize| {
        let (old, new) = (&infos[i], &header.tensors[i]);
        Ok(if old.ty == new.ty && old.dims == new.dims {
            let at = (file.data_offset + old.offset) as usize;
            bytes[at..at + old.size as usize].to_vec()
        } else {
            vec![0; new.size() as usize]
        })
    };
    let mut data = data;
    let tmp = dst.with_extension("tmp");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&tmp).unwrap());
    w.write(&mut out, &mut data).unwrap();
    drop(out);
    std::fs::rename(&tmp, dst).unwrap();
}

/// One damaged file.
struct Mutant {
    /// The fixture's file name (without `.gguf`).
    name: &'static str,
    /// What it did to bmoe before the check.
    before: &'static str,
    base: Base,
    edit: fn(&mut Header),
    /// Extra `bmoe generate` flags the damage needs (and the run it checks under).
    flags: &'static [&'static str],
    /// What the one-line error says, in order of appearance.
    expect: &'static [&'static str],
}

const SIGFPE: &str = "SIGFPE";
const SIGSEGV: &str = "SIGSEGV";
const ABORT: &str = "llama.cpp assertion";
/// llama.cpp's own error about a tensor's shape, which names no key.
const SHAPE: &str = "llama.cpp shape error";
/// A decode that never finished.
const HANG: &str = "hang";
/// A run with another tokenizer (or expert count) than the file's, without a word.
const RAN: &str = "ran";
/// llama.cpp's own error, which names an index but not the key.
const VOCAB: &str = "llama.cpp vocabulary error";

/// `tokenizer.ggml.token_type` with `edit` applied to its list.
fn edit_token_types(h: &mut Header, edit: impl FnOnce(&mut Vec<Value>)) {
    let Value::Array(ty, mut types) = h.get("tokenizer.ggml.token_type").clone() else { panic!("token types") };
    edit(&mut types);
    h.set("tokenizer.ggml.token_type", Value::Array(ty, types));
}

/// The number of tokens in the vocabulary.
fn vocabulary_size(h: &Header) -> u32 {
    h.get("tokenizer.ggml.tokens").as_array().unwrap().len() as u32
}

/// Every fixture: its name, what it did before, the damage, and the error.
const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "qwen3next-full-attention-interval-0",
        before: SIGFPE,
        base: Base::Qwen3Next,
        edit: |h| h.set("ARCH.full_attention_interval", Value::U32(0)),
        flags: &[],
        expect: &["qwen3next.full_attention_interval is 0", "at least 1"],
    },
    Mutant {
        name: "qwen35moe-full-attention-interval-0",
        before: SIGFPE,
        base: Base::Qwen35Moe,
        edit: |h| h.set("ARCH.full_attention_interval", Value::U32(0)),
        flags: &[],
        expect: &["qwen35moe.full_attention_interval is 0"],
    },
    Mutant {
        name: "expert-q8_1",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.1.ffn_gate_exps.weight", "q8_1"),
        flags: &[],
        expect: &["tensor blk.1.ffn_gate_exps.weight has type q8_1", "no dot-product kernel"],
    },
    Mutant {
        name: "expert-q8_K",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.0.ffn_up_exps.weight", "q8_K"),
        flags: &[],
        expect: &["tensor blk.0.ffn_up_exps.weight has type q8_K", "no dot-product kernel"],
    },
    Mutant {
        name: "expert-i8",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.2.ffn_gate_exps.weight", "i8"),
        flags: &[],
        expect: &["blk.2.ffn_gate_exps.weight has type i8"],
    },
    Mutant {
        name: "expert-i16",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.2.ffn_gate_exps.weight", "i16"),
        flags: &[],
        expect: &["blk.2.ffn_gate_exps.weight has type i16"],
    },
    Mutant {
        name: "expert-i32",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.2.ffn_gate_exps.weight", "i32"),
        flags: &[],
        expect: &["blk.2.ffn_gate_exps.weight has type i32"],
    },
    Mutant {
        name: "expert-i64",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.2.ffn_gate_exps.weight", "i64"),
        flags: &[],
        expect: &["blk.2.ffn_gate_exps.weight has type i64"],
    },
    Mutant {
        name: "expert-f64",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.2.ffn_gate_exps.weight", "f64"),
        flags: &[],
        expect: &["blk.2.ffn_gate_exps.weight has type f64"],
    },
    Mutant {
        name: "dense-q8_K",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.0.attn_q.weight", "q8_K"),
        flags: &[],
        expect: &["tensor blk.0.attn_q.weight has type q8_K", "no dot-product kernel"],
    },
    Mutant {
        name: "dense-i32",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("blk.3.attn_output.weight", "i32"),
        flags: &[],
        expect: &["tensor blk.3.attn_output.weight has type i32"],
    },
    Mutant {
        name: "embedding-q8_1",
        before: SIGSEGV,
        base: Base::Wide,
        edit: |h| h.retype("token_embd.weight", "q8_1"),
        flags: &[],
        expect: &["tensor token_embd.weight has type q8_1", "no row lookup"],
    },
    Mutant {
        name: "expert-used-count-missing",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.remove("ARCH.expert_used_count"),
        flags: &[],
        expect: &["qwen3moe.expert_used_count is missing", "1 to 8"],
    },
    Mutant {
        name: "expert-used-count-0",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.expert_used_count", Value::U32(0)),
        flags: &[],
        expect: &["qwen3moe.expert_used_count is 0", "1 to 8"],
    },
    Mutant {
        name: "expert-used-count-above-expert-count",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.expert_used_count", Value::U32(9)),
        flags: &[],
        expect: &["qwen3moe.expert_used_count is 9, above qwen3moe.expert_count (8)"],
    },
    Mutant {
        name: "expert-groups-do-not-divide",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| {
            h.set("ARCH.expert_group_count", Value::U32(3));
            h.set("ARCH.expert_group_used_count", Value::U32(1));
        },
        flags: &[],
        expect: &["deepseek2.expert_group_count is 3, which does not divide deepseek2.expert_count (8)"],
    },
    Mutant {
        name: "expert-group-used-count-0",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| {
            h.set("ARCH.expert_group_count", Value::U32(4));
            h.set("ARCH.expert_group_used_count", Value::U32(0));
        },
        flags: &[],
        expect: &["deepseek2.expert_group_used_count is 0", "expected 1 to 3"],
    },
    Mutant {
        name: "expert-group-used-count-not-below-groups",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| {
            h.set("ARCH.expert_group_count", Value::U32(4));
            h.set("ARCH.expert_group_used_count", Value::U32(4));
        },
        flags: &[],
        expect: &["deepseek2.expert_group_used_count is 4", "fewer than deepseek2.expert_group_count"],
    },
    Mutant {
        name: "expert-groups-as-many-as-experts",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| {
            h.set("ARCH.expert_group_count", Value::U32(8));
            h.set("ARCH.expert_group_used_count", Value::U32(2));
        },
        flags: &[],
        expect: &["deepseek2.expert_group_count is 8", "fewer groups than deepseek2.expert_count (8)"],
    },
    Mutant {
        name: "block-count-0",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.block_count", Value::U32(0)),
        flags: &[],
        expect: &["qwen3moe.block_count is 0", "1 to 512"],
    },
    Mutant {
        name: "nextn-predict-layers-not-below-block-count",
        before: ABORT,
        base: Base::Glm4Moe,
        edit: |h| {
            let n = h.get("ARCH.block_count").clone();
            h.set("ARCH.nextn_predict_layers", n);
        },
        flags: &[],
        expect: &["glm4moe.nextn_predict_layers is 5 but glm4moe.block_count is 5"],
    },
    Mutant {
        name: "mtp-with-two-nextn-layers",
        before: ABORT,
        base: Base::Glm4Moe,
        edit: |h| h.set("ARCH.nextn_predict_layers", Value::U32(2)),
        flags: &["--mtp"],
        expect: &["glm4moe.nextn_predict_layers is 2", "--mtp", "exactly 1 MTP layer"],
    },
    Mutant {
        name: "alignment-8",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("general.alignment", Value::U32(8)),
        flags: &[],
        expect: &["general.alignment is 8", "multiple of 32"],
    },
    Mutant {
        name: "rms-epsilon-nan",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.attention.layer_norm_rms_epsilon", Value::F32(f32::NAN)),
        flags: &[],
        expect: &["qwen3moe.attention.layer_norm_rms_epsilon is NaN", "non-negative"],
    },
    Mutant {
        name: "rms-epsilon-negative",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.attention.layer_norm_rms_epsilon", Value::F32(-1e-6)),
        flags: &[],
        expect: &["qwen3moe.attention.layer_norm_rms_epsilon is -0.000001", "non-negative"],
    },
    Mutant {
        name: "expert-gating-func-unknown",
        before: ABORT,
        base: Base::Glm4Moe,
        edit: |h| h.set("ARCH.expert_gating_func", Value::U32(9)),
        flags: &[],
        expect: &["glm4moe.expert_gating_func is 9", "2 (sigmoid)"],
    },
    Mutant {
        name: "norm-f16",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.retype("blk.0.attn_norm.weight", "f16"),
        flags: &[],
        expect: &["tensor blk.0.attn_norm.weight has type f16; expected f32"],
    },
    Mutant {
        name: "bias-f16",
        before: ABORT,
        base: Base::Qwen2Moe,
        edit: |h| h.retype("blk.1.attn_q.bias", "f16"),
        flags: &[],
        expect: &["tensor blk.1.attn_q.bias has type f16; expected f32"],
    },
    Mutant {
        name: "duplicate-vocabulary-string",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| {
            let Value::Array(ValueType::String, mut tokens) = h.get("tokenizer.ggml.tokens").clone() else {
                panic!("tokens are not strings")
            };
            tokens[300] = tokens[299].clone();
            h.set("tokenizer.ggml.tokens", Value::Array(ValueType::String, tokens));
        },
        flags: &[],
        expect: &["tokenizer.ggml.tokens holds", "twice (tokens 299 and 300)"],
    },
    Mutant {
        name: "value-length-not-key-length",
        before: SHAPE,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.attention.value_length", Value::U32(32)),
        flags: &[],
        expect: &["qwen3moe.attention.key_length is 16 but qwen3moe.attention.value_length is 32"],
    },
    Mutant {
        name: "delta-net-key-heads-0",
        before: SHAPE,
        base: Base::Qwen3Next,
        edit: |h| h.set("ARCH.ssm.group_count", Value::U32(0)),
        flags: &[],
        expect: &["qwen3next.ssm.group_count is 0"],
    },
    Mutant {
        name: "delta-net-value-heads-uneven",
        before: SHAPE,
        base: Base::Qwen35Moe,
        edit: |h| {
            let Value::U32(g) = *h.get("ARCH.ssm.group_count") else { panic!("u32 group count") };
            h.set("ARCH.ssm.time_step_rank", Value::U32(g * 2 + 1));
        },
        flags: &[],
        expect: &["qwen35moe.ssm.time_step_rank is", "not a multiple of qwen35moe.ssm.group_count"],
    },
    Mutant {
        name: "mamba2-inner-size-not-twice-embedding",
        before: ABORT,
        base: Base::GraniteHybrid,
        edit: |h| {
            let Value::U32(inner) = *h.get("ARCH.ssm.inner_size") else { panic!("u32 inner size") };
            h.set("ARCH.ssm.inner_size", Value::U32(inner * 2));
        },
        flags: &[],
        expect: &["granitehybrid.ssm.inner_size is", "twice granitehybrid.embedding_length"],
    },
    Mutant {
        name: "mamba2-heads-do-not-divide-inner-size",
        before: ABORT,
        base: Base::GraniteHybrid,
        edit: |h| {
            let Value::U32(inner) = *h.get("ARCH.ssm.inner_size") else { panic!("u32 inner size") };
            h.set("ARCH.ssm.time_step_rank", Value::U32(inner + 1));
        },
        flags: &[],
        expect: &["granitehybrid.ssm.time_step_rank is", "does not divide granitehybrid.ssm.inner_size"],
    },
    Mutant {
        name: "rope-dimension-count-0",
        before: HANG,
        base: Base::Qwen3Next,
        edit: |h| h.set("ARCH.rope.dimension_count", Value::U32(0)),
        flags: &[],
        expect: &["qwen3next.rope.dimension_count is 0", "even number of rotated dimensions"],
    },
    Mutant {
        name: "rope-dimension-count-odd",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.rope.dimension_count", Value::U32(15)),
        flags: &[],
        expect: &["qwen3moe.rope.dimension_count is 15", "even number"],
    },
    Mutant {
        name: "rope-dimension-count-wider-than-a-head",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| h.set("ARCH.rope.dimension_count", Value::U32(32)),
        flags: &[],
        expect: &["qwen3moe.rope.dimension_count is 32, wider than a key head (qwen3moe.attention.key_length: 16)"],
    },
    Mutant {
        name: "rope-dimension-count-missing-with-latent-attention",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.remove("ARCH.rope.dimension_count"),
        flags: &[],
        expect: &["deepseek2.rope.dimension_count is missing", "rotated width of a key head"],
    },
    Mutant {
        name: "rope-sections-all-0",
        before: ABORT,
        base: Base::Qwen35Moe,
        edit: |h| h.set("ARCH.rope.dimension_sections", Value::Array(ValueType::I32, vec![Value::I32(0); 4])),
        flags: &[],
        expect: &["qwen35moe.rope.dimension_sections is [0, 0, 0, 0]", "one of the first three above 0"],
    },
    Mutant {
        name: "rope-sections-negative",
        before: ABORT,
        base: Base::Qwen35Moe,
        edit: |h| {
            let sections = [-4, 2, 2, 0].map(Value::I32).to_vec();
            h.set("ARCH.rope.dimension_sections", Value::Array(ValueType::I32, sections));
        },
        flags: &[],
        expect: &["qwen35moe.rope.dimension_sections is [-4, 2, 2, 0]", "non-negative widths"],
    },
    Mutant {
        name: "token-types-fewer-than-tokens",
        before: VOCAB,
        base: Base::Qwen3Moe,
        edit: |h| edit_token_types(h, |t| drop(t.pop())),
        flags: &[],
        expect: &["tokenizer.ggml.token_type holds", "types for", "expected one per token"],
    },
    Mutant {
        name: "token-types-more-than-tokens",
        before: RAN,
        base: Base::Qwen3Moe,
        edit: |h| edit_token_types(h, |t| t.push(t[0].clone())),
        flags: &[],
        expect: &["tokenizer.ggml.token_type holds", "expected one per token"],
    },
    Mutant {
        name: "token-type-out-of-range",
        before: RAN,
        base: Base::Qwen3Moe,
        edit: |h| edit_token_types(h, |t| t[7] = Value::I32(9)),
        flags: &[],
        expect: &["tokenizer.ggml.token_type holds 9 for token 7", "0 to 6"],
    },
    Mutant {
        name: "eos-past-the-vocabulary",
        before: RAN,
        base: Base::Qwen3Moe,
        edit: |h| {
            let n = vocabulary_size(h);
            h.set("tokenizer.ggml.eos_token_id", Value::U32(n));
        },
        flags: &[],
        expect: &["tokenizer.ggml.eos_token_id is", "past the vocabulary"],
    },
    Mutant {
        name: "expert-shared-count-huge",
        before: RAN,
        base: Base::Qwen2Moe,
        edit: |h| h.set("ARCH.expert_shared_count", Value::U32(u32::MAX)),
        flags: &[],
        expect: &["qwen2moe.expert_shared_count is 4294967295", "at most 1024"],
    },
    Mutant {
        name: "gpt-oss-value-length-15",
        before: ABORT,
        base: Base::GptOss,
        edit: |h| h.set("ARCH.attention.value_length", Value::U32(15)),
        flags: &[],
        expect: &["gpt-oss.attention.value_length is 15 but", "is 16", "as wide as the rotated width"],
    },
    Mutant {
        name: "gpt-oss-key-length-17",
        before: ABORT,
        base: Base::GptOss,
        edit: |h| h.set("ARCH.attention.key_length", Value::U32(17)),
        flags: &[],
        expect: &["gpt-oss.attention.key_length is 17; with no gpt-oss.rope.dimension_count", "must be even"],
    },
    Mutant {
        name: "kv-heads-do-not-divide-heads",
        before: ABORT,
        base: Base::Qwen3Moe,
        edit: |h| {
            let Value::U32(heads) = *h.get("ARCH.attention.head_count") else { panic!("u32 head count") };
            h.set("ARCH.attention.head_count_kv", Value::U32(heads - 1));
        },
        flags: &[],
        expect: &["qwen3moe.attention.head_count_kv is", "(layer 0); expected a divisor of the query heads"],
    },
    Mutant {
        name: "short-conv-length-1",
        before: SHAPE,
        base: Base::Lfm2Moe,
        edit: |h| h.set("ARCH.shortconv.l_cache", Value::U32(1)),
        flags: &[],
        expect: &["lfm2moe.shortconv.l_cache is 1", "at least 2"],
    },
    Mutant {
        name: "delta-net-inner-size-doubled",
        before: ABORT,
        base: Base::Qwen3Next,
        edit: |h| {
            let Value::U32(inner) = *h.get("ARCH.ssm.inner_size") else { panic!("u32 inner size") };
            h.set("ARCH.ssm.inner_size", Value::U32(inner * 2));
        },
        flags: &[],
        expect: &[
            "qwen3next.ssm.inner_size is",
            "expected qwen3next.ssm.time_step_rank",
            "times qwen3next.ssm.state_size",
        ],
    },
    Mutant {
        name: "delta-net-inner-size-halved",
        before: ABORT,
        base: Base::Qwen35Moe,
        edit: |h| {
            let Value::U32(inner) = *h.get("ARCH.ssm.inner_size") else { panic!("u32 inner size") };
            h.set("ARCH.ssm.inner_size", Value::U32(inner / 2));
        },
        flags: &[],
        expect: &["qwen35moe.ssm.inner_size is", "times qwen35moe.ssm.state_size"],
    },
    Mutant {
        name: "lfm2moe-head-count-doubled",
        before: ABORT,
        base: Base::Lfm2Moe,
        edit: |h| {
            let heads = h.get("ARCH.attention.head_count").clone();
            let doubled = match heads {
                Value::U32(n) => Value::U32(n * 2),
                Value::Array(ty, a) => Value::Array(
                    ty,
                    a.into_iter()
                        .map(|v| match v {
                            Value::U32(n) => Value::U32(n * 2),
                            v => v,
                        })
                        .collect(),
                ),
                v => v,
            };
            h.set("ARCH.attention.head_count", doubled);
        },
        flags: &[],
        expect: &["lfm2moe.attention.head_count is", "expected lfm2moe.embedding_length", "query heads"],
    },
    Mutant {
        name: "deepseek2-key-length-missing",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.remove("ARCH.attention.key_length"),
        flags: &[],
        expect: &[
            "deepseek2.attention.key_length is missing",
            "kv_lora_rank (32) plus deepseek2.rope.dimension_count (8)",
        ],
    },
    // Error lines stay short and printable whatever the file holds.
    Mutant {
        name: "architecture-1mib",
        before: "a 1,048,750-byte error line",
        base: Base::Qwen3Moe,
        edit: |h| h.set("general.architecture", Value::String("q".repeat(1 << 20))),
        flags: &[],
        expect: &["general.architecture is \"qqq", "... (1048576 bytes)", "expected an architecture's name"],
    },
    Mutant {
        name: "architecture-nul-escape",
        before: "the NUL and escape bytes printed raw",
        base: Base::Qwen3Moe,
        edit: |h| h.set("general.architecture", Value::String("qwen3\0moe\u{1b}[2J".into())),
        flags: &[],
        expect: &["general.architecture is \"qwen3\\0moe\\u{1b}[2J\""],
    },
    // Found by the mutation fuzz (`bmoe::fuzz`): llama.cpp asserted in
    // ggml_set_rows (the cache holds one compressed head with latent attention).
    Mutant {
        name: "deepseek2-mla-kv-heads-missing",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.remove("ARCH.attention.head_count_kv"),
        flags: &[],
        expect: &["deepseek2.attention.head_count_kv is missing", "expected 1"],
    },
    Mutant {
        name: "deepseek2-mla-kv-heads-2",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.set("ARCH.attention.head_count_kv", Value::U32(2)),
        flags: &[],
        expect: &["deepseek2.attention.head_count_kv is 2", "expected 1"],
    },
    Mutant {
        name: "deepseek2-mla-kv-heads-0",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.set("ARCH.attention.head_count_kv", Value::U32(0)),
        flags: &[],
        expect: &["deepseek2.attention.head_count_kv is 0", "expected 1"],
    },
    // deepseek2.cpp asserted n_embd_head_qk_nope >= 1.
    Mutant {
        name: "deepseek2-key-length-mla-narrow",
        before: ABORT,
        base: Base::Deepseek2,
        edit: |h| h.set("ARCH.attention.key_length_mla", Value::U32(8)),
        flags: &[],
        expect: &["deepseek2.attention.key_length_mla is 8", "deepseek2.rope.dimension_count (8)"],
    },
    // llama-model.cpp asserted is_swa_any().
    Mutant {
        name: "gemma4-sliding-window-pattern-all-false",
        before: ABORT,
        base: Base::Gemma4,
        edit: |h| {
            let n = h.get("ARCH.attention.sliding_window_pattern").as_array().unwrap().len();
            h.set("ARCH.attention.sliding_window_pattern", Value::Array(ValueType::Bool, vec![Value::Bool(false); n]));
        },
        flags: &[],
        expect: &["gemma4.attention.sliding_window_pattern is", "at least one true"],
    },
    Mutant {
        name: "gemma4-sliding-window-pattern-empty",
        before: ABORT,
        base: Base::Gemma4,
        edit: |h| h.set("ARCH.attention.sliding_window_pattern", Value::Array(ValueType::Bool, Vec::new())),
        flags: &[],
        expect: &["gemma4.attention.sliding_window_pattern is []", "at least one true"],
    },
];

/// Writes every fixture under `dir`; returns (mutant, path).
fn write_mutants(dir: &Path) -> Vec<(&'static Mutant, PathBuf)> {
    MUTANTS
        .iter()
        .map(|m| {
            let path = dir.join(format!("{}.gguf", m.name));
            mutate(&m.base.write(dir), &path, m.edit);
            (m, path)
        })
        .collect()
}

fn run_shape(m: &Mutant) -> RunShape {
    RunShape { expert_used_count: None, mtp: m.flags.contains(&"--mtp") }
}

fn assert_names(m: &Mutant, text: &str) {
    let mut rest = text;
    for e in m.expect {
        let at = rest.find(e).unwrap_or_else(|| panic!("{}: {e:?} not in {text:?}", m.name));
        rest = &rest[at + e.len()..];
    }
}

#[test]
fn fixture_names_are_unique() {
    let mut names: Vec<&str> = MUTANTS.iter().map(|m| m.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), MUTANTS.len());
}

/// The bases pass, so each fixture's error comes from its one change.
#[test]
fn the_base_models_pass() {
    let dir = tempdir();
    for base in [
        Base::Qwen3Moe,
        Base::Wide,
        Base::Qwen3Next,
        Base::Qwen35Moe,
        Base::Qwen2Moe,
        Base::Deepseek2,
        Base::Glm4Moe,
        Base::GraniteHybrid,
        Base::Lfm2Moe,
        Base::GptOss,
        Base::Gemma4,
    ] {
        let path = base.write(dir.path());
        let files = ModelFiles::open(&path).unwrap();
        assert_eq!(bmoe::gguf::check_model(&files, &RunShape::default()), Ok(()), "{base:?}");
        // The same file rewritten unchanged passes too (the rewrite is faithful).
        let copy = dir.path().join(format!("copy-{base:?}.gguf"));
        mutate(&path, &copy, |_| {});
        assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&path).unwrap(), "{base:?}: rewrite changed bytes");
    }
}

/// Every generated architecture, single-file and split, passes: the check
/// refuses nothing bmoe makes (or llama.cpp runs: the gates load them all).
#[test]
fn every_generated_architecture_passes() {
    let dir = tempdir();
    for &arch in Arch::ALL {
        let path = common::write_tiny(dir.path(), &format!("{}.gguf", arch.name()), arch, |_| {});
        let files = ModelFiles::open(&path).unwrap();
        for run in [RunShape::default(), RunShape { expert_used_count: Some(1), mtp: true }] {
            let checked = bmoe::gguf::check_model(&files, &run);
            assert_eq!(checked, Ok(()), "{} under {run:?}", arch.name());
        }
        let report = bmoe::moe::inspect::inspect_report(&files, &path);
        assert!(report.contains("load check:    ok"), "{report}");
    }
    let split = common::write_tiny(dir.path(), "split.gguf", Arch::Deepseek2, |s| s.split = 3);
    let files = ModelFiles::open(&split).unwrap();
    assert_eq!(files.paths().len(), 3);
    assert_eq!(bmoe::gguf::check_model(&files, &RunShape::default()), Ok(()));
}

/// Every type with a CPU kernel passes as an expert, a dense matrix and
/// the embedding; every other one is refused in each role.
#[test]
fn tensor_types_by_role() {
    let dir = tempdir();
    let base = Base::Wide.write(dir.path());
    let types: Vec<GgmlType> = (0..64).filter_map(GgmlType::from_id).collect();
    let no_kernel: Vec<&str> = types.iter().filter(|t| !bmoe::gguf::has_cpu_kernel(**t)).map(|t| t.name()).collect();
    assert_eq!(no_kernel, ["q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64"]);
    let path = dir.path().join("typed.gguf");
    for ty in &types {
        for tensor in ["blk.1.ffn_down_exps.weight", "blk.0.attn_k.weight", "token_embd.weight"] {
            // Rows of 256 (down: the expert width, 64; skip the types whose blocks do not fit it).
            let file = GgufFile::open(&base).unwrap();
            let row = file.tensor(tensor).unwrap().dims[0];
            if ty.row_bytes(row).is_none() {
                continue;
            }
            mutate(&base, &path, |h| h.retype(tensor, ty.name()));
            let files = ModelFiles::open(&path).unwrap();
            let checked = bmoe::gguf::check_model(&files, &RunShape::default());
            if bmoe::gguf::has_cpu_kernel(*ty) {
                assert_eq!(checked, Ok(()), "{tensor} as {ty}");
            } else {
                let e = checked.expect_err(&format!("{tensor} as {ty} passed"));
                assert!(e.starts_with(&format!("tensor {tensor} has type {ty}:")), "{e}");
            }
        }
    }
    // Norms and biases: f32 only.
    for ty in ["f16", "bf16", "q8_0"] {
        mutate(&base, &path, |h| h.retype("output_norm.weight", ty));
        let e = bmoe::gguf::check_model(&ModelFiles::open(&path).unwrap(), &RunShape::default()).unwrap_err();
        assert!(e.starts_with(&format!("tensor output_norm.weight has type {ty}; expected f32")), "{e}");
    }
}

/// Each fixture: the library check, the open (resident and streamed) and
/// `bmoe inspect` all give its one line.
#[test]
fn each_mutant_gets_one_clear_line() {
    let dir = tempdir();
    for (m, path) in write_mutants(dir.path()) {
        let files = ModelFiles::open(&path).unwrap_or_else(|e| panic!("{}: the reader refused it: {e}", m.name));
        let e = bmoe::gguf::check_model(&files, &run_shape(m)).expect_err(m.name);
        assert_eq!(e.lines().count(), 1, "{}: {e}", m.name);
        assert!(e.len() < 400 && !e.chars().any(char::is_control), "{}: {} bytes: {e:.400}", m.name, e.len());
        assert_names(m, &e);
        if m.flags.is_empty() {
            let report = bmoe::moe::inspect::inspect_report(&files, &path);
            assert!(!report.contains("streamable:    yes"), "{}: {report}", m.name);
            let line = report.lines().find(|l| l.starts_with("load check:")).unwrap();
            assert!(line.starts_with("load check:    FAILED: "), "{}: {report}", m.name);
            assert_names(m, line);
            let verdict = report.lines().find(|l| l.starts_with("streamable:")).unwrap();
            assert!(verdict.starts_with("streamable:    no: llama.cpp cannot load this file: "), "{verdict}");
        }
        let mut resident = common::options(&path, None);
        let mut streamed = common::options(&path, common::stream0(1, false));
        if !m.flags.is_empty() {
            // --mtp without its draft settings: the check comes first.
            let mtp = bmoe::llama::MtpParams { draft_max: 2, p_min: 0.0, experts: Default::default() };
            resident.mtp = Some(mtp);
            streamed.mtp = Some(mtp);
        }
        for opts in [resident, streamed] {
            let e = match bmoe::engine::Session::open(opts) {
                Ok(_) => panic!("{}: opened", m.name),
                Err(e) => e.to_string(),
            };
            assert_eq!(e.lines().count(), 1, "{}: {e}", m.name);
            assert!(e.starts_with(&format!("{}: ", path.display())), "{}: {e}", m.name);
            assert_names(m, &e);
        }
    }
}

fn bmoe(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_bmoe")).args(args).output().expect("run bmoe")
}

/// The real binary, on every fixture: `inspect` reports it, `generate`
/// (resident and streamed) exits with the line instead of a signal.
#[test]
fn bmoe_exits_with_the_line_instead_of_a_signal() {
    let dir = tempdir();
    for (m, path) in write_mutants(dir.path()) {
        let p = path.to_str().unwrap();
        if m.flags.is_empty() {
            let out = bmoe(&["inspect", p]);
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{}: inspect {:?}", m.name, out.status);
            assert!(
                stdout.contains("load check:    FAILED: ") && !stdout.contains("streamable:    yes"),
                "{stdout:.2000}"
            );
            let longest = stdout.lines().map(str::len).max().unwrap_or(0);
            assert!(longest < 500 && !stdout.contains('\0'), "{}: a {longest}-byte line: {stdout:.2000}", m.name);
        }
        for stream in [false, true] {
            let mut args = vec!["generate", "-m", p, "-p", "hello", "-n", "2", "-t", "1", "-q"];
            args.extend_from_slice(m.flags);
            if stream {
                args.push("--moe-stream");
            }
            let out = bmoe(&args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            // A signal (the `before` of many) leaves no exit code.
            assert_eq!(
                out.status.code(),
                Some(1),
                "{} ({}): bmoe {args:?}: {:?}\n{stderr}",
                m.name,
                m.before,
                out.status
            );
            assert_eq!(stderr.lines().count(), 1, "{}: {stderr}", m.name);
            assert!(stderr.starts_with("bmoe: error: "), "{}: {stderr}", m.name);
            assert_names(m, &stderr);
            assert!(out.stdout.is_empty(), "{}", m.name);
        }
    }
}

/// A split set whose second shard has the wrong `split.no` is refused in
/// words, not in Rust's debug format.
#[test]
fn wrong_split_number_is_said_plainly() {
    let dir = tempdir();
    let first = common::write_tiny(dir.path(), "s.gguf", Arch::Qwen3Moe, |s| s.split = 3);
    let second = split_path(&dir.path().join("s"), 2, 3);
    assert!(second.exists(), "{}", second.display());
    for (value, shown) in [(Some(Value::U16(5)), "split.no is 5;"), (None, "split.no is missing;")] {
        mutate(&second, &second, |h| match &value {
            Some(v) => h.set("split.no", v.clone()),
            None => h.meta.retain(|(k, _)| k != "split.no"),
        });
        let e = ModelFiles::open(&first).unwrap_err().to_string();
        assert!(e.contains(shown) && e.contains("expected 1 (this is shard 2 of 3"), "{e}");
        assert!(!e.contains("Some(") && !e.contains("None"), "{e}");
    }
}

/// A shard whose `split.count` differs from the first shard's is refused,
/// naming the shard.
#[test]
fn a_shard_with_another_split_count_is_refused() {
    let dir = tempdir();
    let first = common::write_tiny(dir.path(), "c.gguf", Arch::Qwen3Moe, |s| s.split = 3);
    let third = split_path(&dir.path().join("c"), 3, 3);
    mutate(&third, &third, |h| h.set("split.count", Value::U16(4)));
    let e = ModelFiles::open(&first).unwrap_err().to_string();
    assert!(e.contains("split.count is 4; expected 3") && e.contains("shard 3"), "{e}");
    assert!(e.contains(&third.display().to_string()), "{e}");
}

/// A tensor of a type llama.cpp cannot use in a later shard: the error
/// names that shard.
#[test]
fn a_bad_type_in_a_later_shard_names_the_shard() {
    let dir = tempdir();
    let first = common::write_tiny(dir.path(), "t.gguf", Arch::Qwen3Moe, |s| s.split = 3);
    let second = split_path(&dir.path().join("t"), 2, 3);
    let norm =
        GgufFile::open(&second).unwrap().tensors().iter().find(|t| t.name.contains("norm")).unwrap().name.clone();
    mutate(&second, &second, |h| h.retype(&norm, "f16"));
    let e = bmoe::gguf::check_model(&ModelFiles::open(&first).unwrap(), &RunShape::default()).unwrap_err();
    assert!(e.starts_with(&format!("{} (shard 2 of 3): tensor {norm} has type f16", second.display())), "{e}");
}

/// Writes every fixture into `$BMOE_FIXTURES_OUT` (for a look with other
/// tools, or as fuzz seeds): `BMOE_FIXTURES_OUT=dir cargo test --release
/// --test model_checks -- --ignored write_fixtures`.
#[test]
#[ignore = "writes files outside the test's own directory"]
fn write_fixtures() {
    let out = PathBuf::from(std::env::var_os("BMOE_FIXTURES_OUT").expect("set BMOE_FIXTURES_OUT to a directory"));
    std::fs::create_dir_all(&out).unwrap();
    let written = write_mutants(&out);
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("base-")) {
            std::fs::remove_file(path).unwrap();
        }
    }
    assert_eq!(written.len(), MUTANTS.len());
}

/// The full-size presets (real models' shapes, vocabulary sizes and
/// quantization mixes) pass: their headers and tensor tables, written over
/// a sparse file of the right size (no tensor bytes are needed).
#[test]
fn full_size_presets_pass() {
    let dir = tempdir();
    for preset in synth::MODEL_PRESETS {
        let spec = preset.spec();
        let planned = synth::plan(&spec);
        let mut w = GgufWriter::new();
        for (k, v) in &planned.metadata {
            w.set(k, v.clone());
        }
        for (t, _) in &planned.tensors {
            w.add_tensor(t.clone());
        }
        let path = dir.path().join(format!("{}.gguf", preset.name));
        std::fs::write(&path, w.header()).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(w.file_size()).unwrap();
        let files = ModelFiles::open(&path).unwrap();
        assert_eq!(bmoe::gguf::check_model(&files, &RunShape::default()), Ok(()), "{}", preset.name);
        std::fs::remove_file(&path).unwrap();
    }
}
