//! The load check: a model's header and tensor types as llama.cpp needs
//! them, checked before llama.cpp sees the file.
//!
//! llama.cpp trusts much of what a GGUF header says. Some damage it reports
//! itself (a missing key, a tensor of the wrong shape), but some kills the
//! process without a word (a modulo by a zero `full_attention_interval`, a
//! matrix multiplication by a type with no CPU kernel) or ends in an
//! assertion (expert counts, norm epsilons, duplicate vocabulary strings).
//! [`check_model`] refuses each of these with one line that names the key or
//! tensor, what it holds and what is expected. Every open runs it (resident
//! and streamed alike), and so does `bmoe inspect`. The rules follow the
//! vendored llama.cpp: `llama_model_base::load_hparams` and the
//! architectures' `load_arch_hparams` (`src/llama-model.cpp`,
//! `src/models/`), the CPU backend's `type_traits_cpu` (`vec_dot`) and
//! `get_rows`, its binary operators (f32 activations combine only with f32
//! norms and biases), and `llama_vocab::load` (`src/llama-vocab.cpp`).

use std::collections::HashMap;

use super::{GgmlType, GgufFile, ModelFiles, Value};

/// llama.cpp's `LLAMA_MAX_LAYERS`.
pub const MAX_LAYERS: u64 = 512;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
pub const MAX_EXPERTS: u64 = 1024;
/// The smallest `general.alignment` accepted (ggml's tensor data alignment).
pub const MIN_ALIGNMENT: u64 = 32;

/// What a run changes about the file before llama.cpp reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunShape {
    /// `--n-expert-used`: replaces `<arch>.expert_used_count`.
    pub expert_used_count: Option<u64>,
    /// `--mtp`: the model's MTP layer is loaded and drafted with.
    pub mtp: bool,
}

/// Checks `files` as the run `run` would hand it to llama.cpp. The error is
/// one line naming the key or tensor, what is wrong and what is expected.
/// The metadata is untrusted: any values give `Ok` or an error, never a panic.
pub fn check_model(files: &ModelFiles, run: &RunShape) -> Result<(), String> {
    let split = files.paths().len() > 1;
    for (shard, path) in files.shards().iter().zip(files.paths()) {
        check_alignment(shard).map_err(|e| if split { format!("{}: {e}", path.display()) } else { e })?;
    }
    let meta = files.meta();
    let arch = match meta.get("general.architecture") {
        None => return Err("general.architecture is missing; expected the model's architecture name".into()),
        Some(Value::String(a))
            if !a.is_empty()
                && a.len() <= 64
                && a.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-_.".contains(c)) =>
        {
            a.as_str()
        }
        Some(v) => {
            return Err(format!(
                "general.architecture is {v}; expected an architecture's name, such as \"qwen3moe\" (`bmoe archs` \
                 lists them)"
            ));
        }
    };
    let keys = Keys { meta, arch };
    check_layers(&keys, run)?;
    check_experts(&keys, run)?;
    check_hybrid(&keys)?;
    check_widths(&keys)?;
    check_rope(&keys)?;
    check_norm_eps(&keys)?;
    check_vocabulary(meta)?;
    check_tensor_types(files)
}

/// The `<arch>.` keys of one header.
struct Keys<'a> {
    meta: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn name(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// `<arch>.<suffix>` as a non-negative integer; an error when it is
    /// there but is not one.
    fn uint(&self, suffix: &str) -> Result<Option<u64>, String> {
        let key = self.name(suffix);
        match self.meta.get(&key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("{key} is {v}; expected a non-negative integer")),
        }
    }

    /// A key that may hold one value or one per layer (llama.cpp's
    /// `get_key_or_arr`), as a list: empty when it is missing.
    fn per_layer(&self, suffix: &str) -> Result<Vec<u64>, String> {
        let key = self.name(suffix);
        match self.meta.get(&key) {
            Some(Value::Array(_, items)) => items
                .iter()
                .map(|v| {
                    v.as_u64().ok_or_else(|| format!("{key} holds {v}; expected one non-negative integer per layer"))
                })
                .collect(),
            _ => Ok(self.uint(suffix)?.into_iter().collect()),
        }
    }

    /// Like [`Keys::uint`], for a key that may also hold one value per layer:
    /// the largest, or the first with `first`.
    fn uint_per_layer(&self, suffix: &str, first: bool) -> Result<Option<u64>, String> {
        let values = self.per_layer(suffix)?;
        Ok(if first { values.first().copied() } else { values.into_iter().max() })
    }
}

/// `general.alignment`: the reader already refuses one that is not a power
/// of two; ggml needs tensor data aligned to at least 32 bytes.
fn check_alignment(file: &GgufFile) -> Result<(), String> {
    if file.alignment < MIN_ALIGNMENT || !file.alignment.is_power_of_two() {
        return Err(format!(
            "general.alignment is {}; expected a power of two that is a multiple of {MIN_ALIGNMENT} (32, 64, ...)",
            file.alignment
        ));
    }
    Ok(())
}

/// `block_count` and the MTP layers counted in it.
fn check_layers(k: &Keys, run: &RunShape) -> Result<(), String> {
    let key = k.name("block_count");
    let n_layer = match k.uint("block_count")? {
        // llama.cpp names a missing key itself (and an architecture it does not know, first).
        None => return Ok(()),
        Some(n) if n == 0 || n > MAX_LAYERS => {
            return Err(format!("{key} is {n}; expected the number of layers (1 to {MAX_LAYERS})"));
        }
        Some(n) => n,
    };
    let nextn = k.uint("nextn_predict_layers")?.unwrap_or(0);
    if nextn > 0 && nextn >= n_layer {
        return Err(format!(
            "{} is {nextn} but {key} is {n_layer}; expected fewer MTP layers than layers (they are counted in \
             {key})",
            k.name("nextn_predict_layers")
        ));
    }
    if run.mtp && nextn > 1 {
        return Err(format!(
            "{} is {nextn}; --mtp drafts with llama.cpp's MTP graph, which takes exactly 1 MTP layer",
            k.name("nextn_predict_layers")
        ));
    }
    Ok(())
}

/// The expert counts `load_hparams` asserts on, and the gating function.
fn check_experts(k: &Keys, run: &RunShape) -> Result<(), String> {
    let (count_key, used_key) = (k.name("expert_count"), k.name("expert_used_count"));
    let n_expert = k.uint("expert_count")?.unwrap_or(0);
    if n_expert > MAX_EXPERTS {
        return Err(format!("{count_key} is {n_expert}; expected at most {MAX_EXPERTS} experts per layer"));
    }
    let used = match run.expert_used_count {
        Some(u) => Some(u),
        None => k.uint_per_layer("expert_used_count", false)?,
    };
    let groups = k.uint("expert_group_count")?.unwrap_or(0);
    let group_key = k.name("expert_group_count");
    if n_expert == 0 {
        if let Some(u) = used.filter(|&u| u > 0) {
            return Err(format!("{used_key} is {u} but {count_key} is 0 or missing; expected no routed experts"));
        }
        if groups > 0 {
            return Err(format!("{group_key} is {groups} but {count_key} is 0 or missing; expected no expert groups"));
        }
        return Ok(());
    }
    match used {
        None => {
            return Err(format!("{used_key} is missing; expected the experts routed per token (1 to {n_expert})"));
        }
        Some(0) => return Err(format!("{used_key} is 0; expected the experts routed per token (1 to {n_expert})")),
        Some(u) if u > n_expert => {
            return Err(format!("{used_key} is {u}, above {count_key} ({n_expert}); expected 1 to {n_expert}"));
        }
        Some(_) => {}
    }
    if groups >= n_expert {
        return Err(format!("{group_key} is {groups}; expected fewer groups than {count_key} ({n_expert})"));
    }
    if groups > 1 {
        if !n_expert.is_multiple_of(groups) {
            return Err(format!(
                "{group_key} is {groups}, which does not divide {count_key} ({n_expert}); expected a divisor of \
                 {n_expert}"
            ));
        }
        let group_used_key = k.name("expert_group_used_count");
        let group_used = k.uint("expert_group_used_count")?.unwrap_or(0);
        if group_used == 0 || group_used >= groups {
            return Err(format!(
                "{group_used_key} is {group_used}; expected 1 to {} (fewer than {group_key}, {groups})",
                groups - 1
            ));
        }
    }
    if let Some(shared) = k.uint("expert_shared_count")?
        && shared > MAX_EXPERTS
    {
        return Err(format!(
            "{} is {shared}; expected a few shared experts (at most {MAX_EXPERTS})",
            k.name("expert_shared_count")
        ));
    }
    let gating_key = k.name("expert_gating_func");
    if let Some(v) = k.meta.get(&gating_key)
        && !v.as_u64().is_some_and(|g| (1..=4).contains(&g))
    {
        return Err(format!(
            "{gating_key} is {v}; expected 1 (softmax), 2 (sigmoid), 3 (softmax of the weights) or 4 \
             (sqrt-softplus)"
        ));
    }
    Ok(())
}

/// Hybrids that place their attention layers by `full_attention_interval`
/// (a modulo by it, unless `attention.recurrent_layers` lists them).
const INTERVAL_ARCHS: &[&str] = &["qwen3next", "qwen35moe", "qwen35", "minimax-01"];

/// Recurrent and convolutional blocks' counts that llama.cpp divides by or
/// asserts on.
fn check_hybrid(k: &Keys) -> Result<(), String> {
    if INTERVAL_ARCHS.contains(&k.arch)
        && k.meta.get(&k.name("attention.recurrent_layers")).is_none()
        && k.uint("full_attention_interval")? == Some(0)
    {
        return Err(format!(
            "{} is 0; expected every how many layers one is a full-attention layer (at least 1)",
            k.name("full_attention_interval")
        ));
    }
    if k.arch.starts_with("lfm2")
        && let Some(l) = k.uint("shortconv.l_cache")?
        && l < 2
    {
        return Err(format!("{} is {l}; expected a convolution length of at least 2", k.name("shortconv.l_cache")));
    }
    Ok(())
}

/// Architectures whose graph asserts that key and value heads are equally
/// wide (`n_embd_head_v == n_embd_head_k`): the MoE ones bmoe runs and the
/// dense ones they share their graph with.
const EQUAL_HEAD_ARCHS: &[&str] = &[
    "llama",
    "llama4",
    "qwen2",
    "qwen2moe",
    "qwen3",
    "qwen3moe",
    "qwen3vlmoe",
    "qwen3next",
    "qwen35",
    "qwen35moe",
    "olmoe",
    "ernie4_5-moe",
    "hunyuan-moe",
    "glm4moe",
    "dots1",
    "minimax-m2",
    "granitehybrid",
    "nemotron_h",
    "nemotron_h_moe",
    "smallthinker",
    "bailingmoe2",
    "afmoe",
    "arctic",
    "dbrx",
    "grok",
    "cohere2moe",
    "phimoe",
];

/// Gated delta-net hybrids: `ssm.time_step_rank` value heads share
/// `ssm.group_count` key heads.
const DELTA_NET_ARCHS: &[&str] = &["qwen3next", "qwen35moe", "qwen35"];

/// Mamba-2 hybrids: `ssm.inner_size` splits into `ssm.time_step_rank` heads
/// and `ssm.group_count` groups.
const MAMBA2_ARCHS: &[&str] = &["mamba2", "granitehybrid", "nemotron_h", "nemotron_h_moe", "falcon-h1"];

/// Attention and SSM widths the graph builders assert on.
fn check_widths(k: &Keys) -> Result<(), String> {
    let n_embd = k.uint("embedding_length")?;
    if EQUAL_HEAD_ARCHS.contains(&k.arch)
        && let Some(n_head) = k.uint_per_layer("attention.head_count", true)?.filter(|&h| h > 0)
    {
        let derived = n_embd.map(|d| d / n_head);
        let key_len = k.uint("attention.key_length")?.or(derived);
        let value_len = k.uint("attention.value_length")?.or(derived);
        if let (Some(kl), Some(vl)) = (key_len, value_len)
            && kl != vl
        {
            return Err(format!(
                "{} is {kl} but {} is {vl}; {}'s graph needs key and value heads of one width",
                k.name("attention.key_length"),
                k.name("attention.value_length"),
                k.arch
            ));
        }
    }
    check_kv_heads(k)?;
    check_latent_widths(k)?;
    check_latent_heads(k)?;
    check_sliding_window_pattern(k)?;
    check_lfm2_heads(k, n_embd)?;
    let (heads_key, groups_key, inner_key) =
        (k.name("ssm.time_step_rank"), k.name("ssm.group_count"), k.name("ssm.inner_size"));
    if DELTA_NET_ARCHS.contains(&k.arch) || MAMBA2_ARCHS.contains(&k.arch) {
        let heads = k.uint("ssm.time_step_rank")?;
        let groups = k.uint("ssm.group_count")?;
        if groups == Some(0) {
            return Err(format!("{groups_key} is 0; expected at least 1 group of SSM heads"));
        }
        if heads == Some(0) {
            return Err(format!("{heads_key} is 0; expected at least 1 SSM head"));
        }
        if DELTA_NET_ARCHS.contains(&k.arch)
            && let (Some(h), Some(g)) = (heads, groups)
            && !h.is_multiple_of(g)
        {
            return Err(format!(
                "{heads_key} is {h}, not a multiple of {groups_key} ({g}); expected value heads that share the key \
                 heads evenly"
            ));
        }
        // The tensors hold `state_size` per value head; the graph splits
        // `inner_size` into the value heads.
        if DELTA_NET_ARCHS.contains(&k.arch)
            && let (Some(h), Some(state), Some(inner)) = (heads, k.uint("ssm.state_size")?, k.uint("ssm.inner_size")?)
            && Some(inner) != h.checked_mul(state)
        {
            return Err(format!(
                "{inner_key} is {inner}; expected {heads_key} ({h}) times {} ({state}), the value heads' width",
                k.name("ssm.state_size")
            ));
        }
        if MAMBA2_ARCHS.contains(&k.arch)
            && let Some(inner) = k.uint("ssm.inner_size")?
        {
            for (key, n) in [(&heads_key, heads), (&groups_key, groups)] {
                if let Some(n) = n
                    && !inner.is_multiple_of(n)
                {
                    return Err(format!(
                        "{key} is {n}, which does not divide {inner_key} ({inner}); expected a divisor"
                    ));
                }
            }
            if k.arch == "granitehybrid"
                && let Some(d) = n_embd
                && Some(inner) != d.checked_mul(2)
            {
                return Err(format!(
                    "{inner_key} is {inner}; granitehybrid expects twice {} ({d})",
                    k.name("embedding_length")
                ));
            }
        }
    }
    Ok(())
}

/// Multi-head latent attention in its absorbed form (`key_length_mla` and
/// `value_length_mla` in the file): the cached key head is the compressed
/// KV (`kv_lora_rank`) and the rotated part, the value head the compressed
/// KV alone. The graph asserts on both widths.
fn check_latent_widths(k: &Keys) -> Result<(), String> {
    let (Some(_), Some(_), Some(lora)) =
        (k.uint("attention.key_length_mla")?, k.uint("attention.value_length_mla")?, k.uint("attention.kv_lora_rank")?)
    else {
        return Ok(());
    };
    // A missing rotated width is check_rope's to name.
    let Some(rotated) = k.uint("rope.dimension_count")? else {
        return Ok(());
    };
    for (suffix, want) in [("attention.key_length", lora + rotated), ("attention.value_length", lora)] {
        let key = k.name(suffix);
        let what = format!("{} ({lora})", k.name("attention.kv_lora_rank"));
        let expected = if suffix.ends_with("key_length") {
            format!("{what} plus {} ({rotated})", k.name("rope.dimension_count"))
        } else {
            what
        };
        match k.uint(suffix)? {
            None => return Err(format!("{key} is missing; with latent attention expected {want}: {expected}")),
            Some(v) if v != want => {
                return Err(format!("{key} is {v}; with latent attention expected {want}: {expected}"));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Latent attention (deepseek2's family): a key head is its unrotated part
/// and its rotated part (`rope.dimension_count`), so it must be wider than
/// the rotated part; in the absorbed form (`key_length_mla` and
/// `value_length_mla` both set) the cache holds one compressed head per
/// token, so `head_count_kv` must be 1 (missing, llama.cpp takes the query
/// heads' count). llama.cpp asserts on both.
fn check_latent_heads(k: &Keys) -> Result<(), String> {
    if !MLA_ARCHS.contains(&k.arch) {
        return Ok(());
    }
    let (key_mla, value_mla) = (k.uint("attention.key_length_mla")?, k.uint("attention.value_length_mla")?);
    let absorbed = key_mla.is_some_and(|v| v > 0) && value_mla.is_some_and(|v| v > 0);
    let rotated = k.uint("rope.dimension_count")?;
    let (width_key, width) = if absorbed {
        (k.name("attention.key_length_mla"), key_mla)
    } else {
        let heads = k.uint_per_layer("attention.head_count", true)?.filter(|&h| h > 0);
        match k.uint("attention.key_length")? {
            Some(w) => (k.name("attention.key_length"), Some(w)),
            None => (
                format!("{} / {}", k.name("embedding_length"), k.name("attention.head_count")),
                k.uint("embedding_length")?.zip(heads).map(|(d, h)| d / h),
            ),
        }
    };
    if let (Some(w), Some(r)) = (width, rotated)
        && w <= r
    {
        return Err(format!(
            "{width_key} is {w}, not wider than {} ({r}); expected more: a key head is its unrotated part and its \
             rotated part",
            k.name("rope.dimension_count")
        ));
    }
    if absorbed {
        let key = k.name("attention.head_count_kv");
        let kv_heads = k.per_layer("attention.head_count_kv")?;
        if kv_heads.is_empty() {
            return Err(format!(
                "{key} is missing; with latent attention ({} set) expected 1: the cache holds one compressed head",
                k.name("attention.key_length_mla")
            ));
        }
        if let Some((layer, n)) = kv_heads.iter().enumerate().find(|(_, n)| **n != 1) {
            return Err(format!(
                "{key} is {n} (layer {layer}); with latent attention ({} set) expected 1: the cache holds one \
                 compressed head",
                k.name("attention.key_length_mla")
            ));
        }
    }
    Ok(())
}

/// Gemma 4 marks each layer sliding-window or global in
/// `attention.sliding_window_pattern`; llama.cpp asserts that at least one
/// layer slides.
fn check_sliding_window_pattern(k: &Keys) -> Result<(), String> {
    if k.arch != "gemma4" {
        return Ok(());
    }
    let key = k.name("attention.sliding_window_pattern");
    let Some(v) = k.meta.get(&key) else { return Ok(()) };
    let layers = k.uint("block_count")?.unwrap_or(u64::MAX) as usize;
    let any_sliding =
        v.as_array().is_some_and(|items| items.iter().take(layers).any(|x| matches!(x, Value::Bool(true))));
    if !any_sliding {
        return Err(format!("{key} is {v}; expected one flag per layer, at least one true (a sliding-window layer)"));
    }
    Ok(())
}

/// LFM2's attention projects queries to `embedding_length` and splits them
/// into `head_count` heads of the key width.
fn check_lfm2_heads(k: &Keys, n_embd: Option<u64>) -> Result<(), String> {
    if !k.arch.starts_with("lfm2") {
        return Ok(());
    }
    let (Some(heads), Some(width), Some(d)) =
        (k.uint_per_layer("attention.head_count", false)?, k.uint("attention.key_length")?, n_embd)
    else {
        return Ok(());
    };
    if heads.checked_mul(width) != Some(d) {
        return Err(format!(
            "{} is {heads}; expected {} ({d}) / {} ({width}) query heads",
            k.name("attention.head_count"),
            k.name("embedding_length"),
            k.name("attention.key_length")
        ));
    }
    Ok(())
}

/// Architectures whose graph rotates with `ggml_rope_multi` (M-RoPE), which
/// asserts that one of the first three `rope.dimension_sections` is wide.
const MROPE_ARCHS: &[&str] = &["qwen2vl", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe"];

/// Architectures with multi-head latent attention: a key head's rotated
/// part is `rope.dimension_count` wide, and without the key llama.cpp
/// takes the whole head, leaving the unrotated part empty.
const MLA_ARCHS: &[&str] = &["deepseek2", "deepseek32"];

/// The rotated dimensions of a head: the CPU rope asserts an even count no
/// wider than the head, and with none it never finishes a step.
fn check_rope(k: &Keys) -> Result<(), String> {
    let Some(n_head) = k.uint_per_layer("attention.head_count", true)?.filter(|&h| h > 0) else {
        // No attention heads: nothing is rotated.
        return Ok(());
    };
    let key = k.name("rope.dimension_count");
    let (width_key, width) = match k.uint("attention.key_length")? {
        Some(w) => (k.name("attention.key_length"), Some(w)),
        None => (
            format!("{} / {}", k.name("embedding_length"), k.name("attention.head_count")),
            k.uint("embedding_length")?.map(|d| d / n_head),
        ),
    };
    match k.uint("rope.dimension_count")? {
        None if MLA_ARCHS.contains(&k.arch) => {
            return Err(format!(
                "{key} is missing; {}'s attention takes the rotated width of a key head from it",
                k.arch
            ));
        }
        // Without the key the whole head is rotated.
        None => {
            if let Some(w) = width.filter(|w| w % 2 == 1) {
                return Err(format!(
                    "{width_key} is {w}; with no {key} that is the rotated width of a head, which must be even"
                ));
            }
        }
        Some(n) if n == 0 || n % 2 == 1 => {
            return Err(format!("{key} is {n}; expected an even number of rotated dimensions per head (2 or more)"));
        }
        Some(n) => {
            if let Some(w) = width.filter(|&w| n > w) {
                return Err(format!("{key} is {n}, wider than a key head ({width_key}: {w}); expected at most {w}"));
            }
        }
    }
    if k.arch == "gpt-oss" {
        // gpt-oss's tensors and graph take every head as wide as the rotated width.
        let (rot_key, rotated) = match k.uint("rope.dimension_count")? {
            Some(n) => (key.clone(), Some(n)),
            None => (width_key.clone(), width),
        };
        let value = k.uint("attention.value_length")?.or_else(|| k.uint("embedding_length").ok()?.map(|d| d / n_head));
        for (len_key, len) in [(width_key.clone(), width), (k.name("attention.value_length"), value)] {
            if let (Some(len), Some(rot)) = (len, rotated)
                && len != rot
            {
                return Err(format!(
                    "{len_key} is {len} but {rot_key} is {rot}; gpt-oss's attention needs key and value heads as \
                     wide as the rotated width"
                ));
            }
        }
    }
    let sections_key = k.name("rope.dimension_sections");
    if MROPE_ARCHS.contains(&k.arch)
        && let Some(v) = k.meta.get(&sections_key)
    {
        let sections: Option<Vec<u64>> = v.as_array().and_then(|items| items.iter().map(Value::as_u64).collect());
        match sections {
            Some(s) if s.len() >= 3 && s[..3].iter().any(|&w| w > 0) => {}
            _ => {
                return Err(format!(
                    "{sections_key} is {v}; expected four non-negative widths, one of the first three above 0"
                ));
            }
        }
    }
    Ok(())
}

/// Grouped-query attention: each layer's key/value heads are shared by its
/// query heads evenly (ggml broadcasts them, and asserts that it can).
fn check_kv_heads(k: &Keys) -> Result<(), String> {
    let (heads, kv_heads) = (k.per_layer("attention.head_count")?, k.per_layer("attention.head_count_kv")?);
    if heads.is_empty() || kv_heads.is_empty() {
        return Ok(());
    }
    for layer in 0..heads.len().max(kv_heads.len()) {
        let h = heads[layer.min(heads.len() - 1)];
        let kv = kv_heads[layer.min(kv_heads.len() - 1)];
        // No key/value heads: a layer without attention (recurrent, convolution).
        if kv > 0 && !h.is_multiple_of(kv) {
            return Err(format!(
                "{} is {kv} but {} is {h} (layer {layer}); expected a divisor of the query heads",
                k.name("attention.head_count_kv"),
                k.name("attention.head_count")
            ));
        }
    }
    Ok(())
}

/// Norm epsilons: the CPU norms assert `eps >= 0`.
fn check_norm_eps(k: &Keys) -> Result<(), String> {
    for suffix in ["attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon"] {
        let key = k.name(suffix);
        if let Some(v) = k.meta.get(&key)
            && let Some(eps) = v.as_f64()
            && (eps.is_nan() || eps < 0.0)
        {
            return Err(format!("{key} is {v}; expected a small non-negative number such as 1e-6"));
        }
    }
    Ok(())
}

/// llama.cpp's token types (`LLAMA_TOKEN_TYPE_UNDEFINED` to `_BYTE`).
const TOKEN_TYPES: std::ops::RangeInclusive<u64> = 0..=6;

/// Vocabulary strings: llama.cpp maps each text to one id and asserts that
/// no two tokens share one. The token types must match the tokens one for
/// one, and the BOS and EOS ids must be tokens: llama.cpp reads past a
/// short type list and quietly swaps an id past the vocabulary for another,
/// so such a file would run with a tokenizer other than its own.
fn check_vocabulary(meta: &GgufFile) -> Result<(), String> {
    let Some(Value::Array(_, tokens)) = meta.get("tokenizer.ggml.tokens") else { return Ok(()) };
    if let Some(types) = meta.get("tokenizer.ggml.token_type") {
        let Some(types) = types.as_array() else {
            return Err(format!("tokenizer.ggml.token_type is {types}; expected one token type per token"));
        };
        if types.len() != tokens.len() {
            return Err(format!(
                "tokenizer.ggml.token_type holds {} types for {} tokens; expected one per token",
                types.len(),
                tokens.len()
            ));
        }
        if let Some((id, bad)) =
            types.iter().enumerate().find(|(_, t)| !t.as_u64().is_some_and(|t| TOKEN_TYPES.contains(&t)))
        {
            return Err(format!(
                "tokenizer.ggml.token_type holds {bad} for token {id}; expected a token type (0 to 6: normal 1, \
                 control 3, byte 6, ...)"
            ));
        }
    }
    for key in ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"] {
        if let Some(v) = meta.get(key)
            && v.as_u64().is_none_or(|id| id >= tokens.len() as u64)
        {
            return Err(format!("{key} is {v}, past the vocabulary ({} tokens); expected a token id", tokens.len()));
        }
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        let Some(text) = token.as_str() else {
            return Err(format!("tokenizer.ggml.tokens holds {token} at token {id}; expected strings"));
        };
        if let Some(first) = seen.insert(text, id) {
            return Err(format!(
                "tokenizer.ggml.tokens holds {} twice (tokens {first} and {id}); expected each token text once",
                Value::String(text.to_string())
            ));
        }
    }
    Ok(())
}

/// Whether the CPU backend has a dot-product kernel (`vec_dot`) for `ty`:
/// every type but q8_1 and q8_K (the activations' own formats), the
/// integers and f64. The same types have a row lookup (`get_rows`).
pub fn has_cpu_kernel(ty: GgmlType) -> bool {
    !matches!(ty.name(), "q8_1" | "q8_K" | "i8" | "i16" | "i32" | "i64" | "f64")
}

/// Whether llama.cpp combines the tensor element by element with f32
/// activations (norms, biases, scales, state-space and convolution
/// parameters), which the CPU backend does only in f32.
pub fn is_elementwise(name: &str, dims: &[u64]) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    let stem = match parts.last() {
        Some(&"weight") | Some(&"bias") => &parts[..parts.len() - 1],
        _ => &parts[..],
    };
    dims.len() == 1
        || name.ends_with(".bias")
        || stem.iter().any(|p| p.contains("norm"))
        || stem.last().is_some_and(|p| {
            matches!(*p, "ssm_a" | "ssm_d" | "ssm_conv1d" | "attn_sinks" | "rope_freqs" | "exp_probs_b" | "scale")
        })
        || name.contains(".shortconv.conv.")
}

/// Each tensor's type by its role: norms and biases f32, everything else
/// (matrix weights, embeddings) a type the CPU can multiply by and look rows
/// up in. In a split model the error names the shard holding the tensor.
fn check_tensor_types(files: &ModelFiles) -> Result<(), String> {
    let split = files.paths().len() > 1;
    for t in files.tensors() {
        check_tensor_type(&t).map_err(|e| match split {
            true => {
                format!("{} (shard {} of {}): {e}", files.paths()[t.shard].display(), t.shard + 1, files.paths().len())
            }
            false => e,
        })?;
    }
    Ok(())
}

/// One tensor's type by its role (see [`check_tensor_types`]).
fn check_tensor_type(t: &super::TensorLocation<'_>) -> Result<(), String> {
    let (name, ty) = (t.info.name.as_str(), t.info.ty);
    if is_elementwise(name, &t.info.dims) {
        if ty != GgmlType::F32 {
            return Err(format!(
                "tensor {name} has type {ty}; expected f32 (norms, biases and other element-wise weights \
                 combine with f32 activations)"
            ));
        }
    } else if !has_cpu_kernel(ty) {
        let role = if name == "token_embd.weight" || name.ends_with("embed_tokens.weight") {
            "llama.cpp's CPU backend has no row lookup (or dot product) for it"
        } else {
            "llama.cpp's CPU backend has no dot-product kernel to multiply by it"
        };
        return Err(format!(
            "tensor {name} has type {ty}: {role}; expected f32, f16, bf16 or a quantized weight type (q4_0, \
             q8_0, q4_K, iq4_xs, mxfp4, ...)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_kernels_by_type() {
        for name in ["f32", "f16", "bf16", "q4_0", "q8_0", "q4_K", "q6_K", "iq2_xxs", "iq4_xs", "mxfp4", "tq2_0"] {
            assert!(has_cpu_kernel(GgmlType::from_name(name).unwrap()), "{name}");
        }
        for name in ["q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64"] {
            assert!(!has_cpu_kernel(GgmlType::from_name(name).unwrap()), "{name}");
        }
    }

    #[test]
    fn element_wise_roles_by_name() {
        for (name, dims) in [
            ("blk.0.attn_norm.weight", &[64][..]),
            ("blk.3.ssm_norm.weight", &[16, 4][..]),
            ("blk.1.attn_q.bias", &[64][..]),
            ("blk.1.ffn_gate_up_exps.bias", &[128, 8][..]),
            ("blk.2.ssm_a", &[1, 8][..]),
            ("blk.2.ssm_conv1d.weight", &[4, 96][..]),
            ("blk.2.shortconv.conv.weight", &[3, 64][..]),
            ("blk.4.nextn.enorm.weight", &[64][..]),
            ("blk.0.ffn_gate_inp_shexp.weight", &[64][..]),
        ] {
            assert!(is_elementwise(name, dims), "{name}");
        }
        for (name, dims) in [
            ("blk.0.attn_q.weight", &[64, 64][..]),
            ("blk.0.ffn_up_exps.weight", &[64, 32, 8][..]),
            ("token_embd.weight", &[64, 1000][..]),
            ("blk.4.nextn.eh_proj.weight", &[128, 64][..]),
        ] {
            assert!(!is_elementwise(name, dims), "{name}");
        }
    }
}
