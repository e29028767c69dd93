//! How much each layer's MoE branch moves the residual stream: the RMS of
//! the branch's output (`ffn_moe_out-<il>` in llama.cpp's graph) against the
//! RMS of the residual entering the FFN (`ffn_inp-<il>`, or where an
//! architecture's graph does not name it, the previous layer's output
//! `l_out-<il-1>`), per token, as the model runs over a text. This is the
//! figure the synthetic models' experts are sized by (`docs/architecture.md`,
//! "Experts that matter").

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::llama::{Context, ContextParams, EvalHook, Logits, Model, RemoteLayers, Tensor};

/// One layer's branch and residual sizes, averaged over the tokens seen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LayerBranch {
    /// Tokens measured.
    pub tokens: usize,
    /// Mean RMS of the MoE branch's output.
    pub moe_rms: f64,
    /// Mean RMS of the residual entering the FFN.
    pub residual_rms: f64,
    /// Mean of the per-token ratio of the two.
    pub ratio: f64,
}

/// The graph nodes the measurement reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    MoeOut,
    Residual,
}

/// Parses `ffn_moe_out-12` / `ffn_inp-12` / `l_out-11` (the residual
/// entering layer 12).
fn parse(name: &str) -> Option<(Node, usize)> {
    let (stem, layer) = name.rsplit_once('-')?;
    let layer: usize = layer.parse().ok()?;
    match stem {
        "ffn_moe_out" => Some((Node::MoeOut, layer)),
        "ffn_inp" => Some((Node::Residual, layer)),
        "l_out" => Some((Node::Residual, layer + 1)),
        _ => None,
    }
}

/// The eval hook that records per-token RMS of the two nodes.
#[derive(Default)]
struct BranchHook {
    /// Per layer: the residual RMS of each token of the current batch.
    residual: Vec<Vec<f64>>,
    /// Per layer: running sums.
    sums: Vec<LayerBranch>,
}

/// Per-row RMS of a node laid out `[width, rows]` (f32).
fn row_rms(node: Tensor<'_>) -> Vec<f64> {
    let [width, rows, ..] = node.ne();
    let [_, row_stride, ..] = node.nb();
    (0..rows.max(0) as usize)
        .map(|r| {
            let sum: f64 = (0..width.max(0) as usize)
                .filter_map(|i| node.read_f32(r * row_stride + 4 * i))
                .map(|x| f64::from(x) * f64::from(x))
                .sum();
            (sum / width.max(1) as f64).sqrt()
        })
        .collect()
}

impl EvalHook for BranchHook {
    fn ask(&mut self, node: Tensor<'_>) -> bool {
        parse(node.name()).is_some() && node.type_id() == 0
    }

    fn observe(&mut self, node: Tensor<'_>) {
        let Some((which, layer)) = parse(node.name()) else { return };
        if self.sums.len() <= layer {
            self.sums.resize(layer + 1, LayerBranch::default());
            self.residual.resize(layer + 1, Vec::new());
        }
        let rms = row_rms(node);
        match which {
            Node::Residual => self.residual[layer] = rms,
            Node::MoeOut => {
                let sums = &mut self.sums[layer];
                for (moe, res) in rms.iter().zip(&self.residual[layer]) {
                    sums.tokens += 1;
                    sums.moe_rms += moe;
                    sums.residual_rms += res;
                    sums.ratio += if *res > 0.0 { moe / res } else { 0.0 };
                }
            }
        }
    }
}

/// The branch sizes a model run showed: per layer (`None` for layers
/// without an MoE branch: dense, recurrent), over `tokens` tokens.
pub struct Branches {
    /// Tokens the model ran over.
    pub tokens: usize,
    /// Per layer, by index.
    pub layers: Vec<Option<LayerBranch>>,
}

/// Runs the first `positions + 1` tokens of `text` through the model at
/// `path`, resident on `threads` threads, and returns each layer's branch
/// sizes.
pub fn measure(path: &std::path::Path, text: &str, positions: usize, threads: u32) -> Result<Branches, String> {
    let model = Arc::new(Model::load(path, &[], &[], &[], false, &RemoteLayers::default()).map_err(|e| e.to_string())?);
    let mut tokens = model.tokenize(text, true);
    tokens.truncate(positions.saturating_add(1));
    let n_ctx = (tokens.len() as u32 + 8).max(64);
    let params = ContextParams {
        n_ctx,
        n_batch: 64,
        n_ubatch: 64,
        n_threads: threads.max(1),
        n_seq: 1,
        spare_seq: false,
        batch_invariant: true,
    };
    let mut ctx = Context::new(model, params, Some(Box::new(BranchHook::default())), Arc::new(AtomicBool::new(false)))?;
    for (i, chunk) in tokens.chunks(64).enumerate() {
        ctx.decode(chunk, (i * 64) as i32, Logits::Last).map_err(|e| e.to_string())?;
    }
    let hook = ctx.hook_mut().ok_or("the context lost its hook")?;
    let layers = hook
        .sums
        .iter()
        .map(|s| {
            (s.tokens > 0).then(|| {
                let n = s.tokens as f64;
                LayerBranch {
                    tokens: s.tokens,
                    moe_rms: s.moe_rms / n,
                    residual_rms: s.residual_rms / n,
                    ratio: s.ratio / n,
                }
            })
        })
        .collect();
    Ok(Branches { tokens: tokens.len(), layers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_parse_to_their_layer() {
        assert_eq!(parse("ffn_moe_out-3"), Some((Node::MoeOut, 3)));
        assert_eq!(parse("ffn_inp-12"), Some((Node::Residual, 12)));
        assert_eq!(parse("l_out-11"), Some((Node::Residual, 12)));
        assert_eq!(parse("ffn_moe_out"), None);
        assert_eq!(parse("ffn_moe_topk-3"), None);
        assert_eq!(parse("ffn_inp-x"), None);
    }
}
