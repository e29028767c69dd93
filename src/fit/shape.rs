//! What `bmoe fit` needs to know of a model, from its GGUF header alone
//! (a file on disk, or one on the hub read by range requests): the bytes
//! that stay resident, the expert bank, what one token routes, and how many
//! weights one token multiplies.

use std::collections::HashMap;

use crate::gguf::{GgmlType, ModelFiles};
use crate::moe::recipe::parse_expert_tensor;

/// A model's sizes as the estimate uses them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    /// Bytes of every file of the model.
    pub file_bytes: u64,
    /// Bytes of every routed expert of the layers decoding runs.
    pub bank: u64,
    /// Bytes one token routes: k experts' slices in each of those layers.
    pub working_set: u64,
    /// Non-expert weights decoding reads, which stay resident while
    /// streaming (the token embeddings as the rows a context can touch,
    /// unless they are the output head too).
    pub dense: u64,
    /// The token embeddings' bytes per row (a context position's share).
    pub embedding_row: u64,
    /// Bytes the token embeddings take whole (0 when they are the head).
    pub embeddings: u64,
    /// KV-cache bytes per context position (f16 keys and values).
    pub kv_per_position: u64,
    /// Weights one decoded token multiplies: the dense matrices whole,
    /// one embedding row, k experts per MoE layer.
    pub active_weights: u64,
    /// Bytes of those weights.
    pub active_bytes: u64,
    /// The largest single read streaming makes: one expert's slice of one
    /// projection.
    pub read_size: u64,
    /// The experts' main tensor type (by bytes).
    pub expert_type: GgmlType,
    /// The dense matrices' main tensor type (by bytes; the vocabulary
    /// matrices left out).
    pub dense_type: GgmlType,
    /// Tokens in the vocabulary.
    pub n_vocab: u64,
    /// Experts per layer.
    pub n_expert: u64,
    /// Experts routed per token.
    pub k: u64,
}

/// The layer a `blk.N.` tensor belongs to.
fn layer_of(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

impl ModelShape {
    /// Reads the sizes from a model's headers. MTP layers (which decoding
    /// runs only when drafting with them) count in the file, not in what a
    /// token reads.
    pub fn of(files: &ModelFiles) -> Result<ModelShape, String> {
        let meta = files.meta();
        let arch = meta.architecture().ok_or("the file names no architecture")?.to_string();
        let n_layer = meta.arch_u64("block_count").ok_or("the file has no block_count")?;
        let trunk = n_layer.saturating_sub(meta.arch_u64("nextn_predict_layers").unwrap_or(0));
        let n_expert = meta.arch_u64("expert_count").filter(|&n| n > 0).ok_or("the model has no experts")?;
        let k = meta.arch_u64("expert_used_count").unwrap_or(1).clamp(1, n_expert);
        let tied = !files.tensors().any(|t| t.info.name == "output.weight");
        let mut shape = ModelShape {
            arch,
            file_bytes: files.total_bytes(),
            bank: 0,
            working_set: 0,
            dense: 0,
            embedding_row: 0,
            embeddings: 0,
            kv_per_position: kv_per_position(files, n_layer),
            active_weights: 0,
            active_bytes: 0,
            read_size: 0,
            expert_type: GgmlType::F32,
            dense_type: GgmlType::F32,
            n_vocab: meta
                .get("tokenizer.ggml.tokens")
                .and_then(|t| t.as_array())
                .map(|t| t.len() as u64)
                .or_else(|| files.locate("token_embd.weight").and_then(|t| t.info.dims.get(1).copied()))
                .unwrap_or(0),
            n_expert,
            k,
        };
        let (mut expert_types, mut dense_types) = (HashMap::new(), HashMap::new());
        for t in files.tensors() {
            let info = t.info;
            if layer_of(&info.name).is_some_and(|l| l >= trunk) {
                continue;
            }
            if parse_expert_tensor(&info.name).is_some() && info.dims.len() == 3 {
                *expert_types.entry(info.ty).or_insert(0u64) += info.size;
                shape.bank += info.size;
                shape.read_size = shape.read_size.max(info.size / n_expert);
                shape.working_set += info.size / n_expert * k;
                shape.active_weights += info.elements() / n_expert * k;
                shape.active_bytes += info.size / n_expert * k;
            } else if info.name == "token_embd.weight" && !tied {
                let rows = info.dims.get(1).copied().unwrap_or(1).max(1);
                shape.embeddings = info.size;
                shape.embedding_row = info.size / rows;
                shape.active_weights += info.elements() / rows;
                shape.active_bytes += info.size / rows;
            } else {
                if info.dims.len() >= 2 && !matches!(info.name.as_str(), "token_embd.weight" | "output.weight") {
                    *dense_types.entry(info.ty).or_insert(0u64) += info.size;
                }
                shape.dense += info.size;
                shape.active_weights += info.elements();
                shape.active_bytes += info.size;
            }
        }
        if shape.bank == 0 {
            return Err("no expert tensors found".into());
        }
        let main = |by: HashMap<GgmlType, u64>| by.into_iter().max_by_key(|&(ty, b)| (b, ty.id())).map(|(ty, _)| ty);
        shape.expert_type = main(expert_types).unwrap_or(GgmlType::F32);
        shape.dense_type = main(dense_types).unwrap_or(GgmlType::F32);
        Ok(shape)
    }

    /// The dense bytes resident with a context of `n_ctx` positions.
    pub fn dense_with(&self, n_ctx: u32) -> u64 {
        self.dense + self.embeddings.min(self.embedding_row * u64::from(n_ctx))
    }

    /// The same model in another quantization of `file_bytes`: every byte
    /// count scaled by the size ratio, the weights and the KV cache as they
    /// are (an estimate until its own header is read).
    pub fn scaled_to(&self, file_bytes: u64) -> ModelShape {
        let r = file_bytes as f64 / self.file_bytes.max(1) as f64;
        let s = |b: u64| (b as f64 * r) as u64;
        ModelShape {
            file_bytes,
            bank: s(self.bank),
            working_set: s(self.working_set),
            dense: s(self.dense),
            embedding_row: s(self.embedding_row),
            embeddings: s(self.embeddings),
            active_bytes: s(self.active_bytes),
            read_size: s(self.read_size),
            ..self.clone()
        }
    }
}

/// f16 keys and values of every attending layer, per context position, as
/// the cache budget counts them (hybrids give recurrent layers 0 heads).
fn kv_per_position(files: &ModelFiles, n_layer: u64) -> u64 {
    let meta = files.meta();
    let arch = meta.architecture().unwrap_or_default();
    let head_count = meta.arch_u64("attention.head_count").unwrap_or(0);
    let embd = meta.arch_u64("embedding_length").unwrap_or(0);
    let default_width = embd.checked_div(head_count).unwrap_or(0);
    let width = meta.arch_u64("attention.key_length").unwrap_or(default_width)
        + meta.arch_u64("attention.value_length").unwrap_or(default_width);
    let heads: u64 = match meta.get(&format!("{arch}.attention.head_count_kv")) {
        Some(v) => match v.as_array() {
            Some(per_layer) => per_layer.iter().filter_map(|h| h.as_u64()).sum(),
            None => v.as_u64().unwrap_or(0) * n_layer,
        },
        None => head_count * n_layer,
    };
    heads.saturating_mul(width).saturating_mul(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_read_from_block_names() {
        assert_eq!(layer_of("blk.12.ffn_up_exps.weight"), Some(12));
        assert_eq!(layer_of("output.weight"), None);
    }
}
