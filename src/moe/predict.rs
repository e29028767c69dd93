//! Read-ahead of the next layers' experts while a layer computes: temporal
//! (the experts the previous token routed in the next N layers) and
//! predictive (the next layer's router run early on this layer's input,
//! which the residual stream keeps close to the next layer's). Either is
//! only a guess about what to read; the routing itself never changes, so
//! output stays byte-identical whatever the guess.

use std::collections::BTreeMap;

use crate::llama::{RowScorer, TensorHandle};

/// What to read ahead while a layer computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadAhead {
    /// Read the experts the previous token routed in this many next layers.
    pub layers: u32,
    /// Run the routers of this many next layers on this layer's input and
    /// read their choice (0 = off): 1 gives the next layer's reads the time
    /// of one layer's compute, 2 lets them start a layer earlier.
    pub router: u32,
    /// In prompt chunks too (needs `router`): run the next layer's router on
    /// every token of the ubatch and read the union of their choices while
    /// the layer computes. A long ubatch routes to most of each layer's
    /// bank, so this is where a prompt's reads hide behind its compute.
    pub prefill: bool,
}

impl ReadAhead {
    /// True when anything is read ahead during decode.
    pub fn any(&self) -> bool {
        self.layers > 0 || self.router > 0
    }
}

/// A layer's router weights as seen at capture.
#[derive(Debug, Clone, Copy)]
pub struct RouterWeights {
    /// `ffn_gate_inp`: one row of `n_embd` per expert.
    pub router: TensorHandle,
    /// The RMS-norm weight applied to the router's input (`rms_norm(x) * weight`).
    pub norm: TensorHandle,
    /// A bias added to the router's logits (gpt-oss), if any.
    pub bias: Option<TensorHandle>,
}

/// One layer's router: the model's own weight, scored in place by ggml's
/// dot product for its type, and the norm weight before it as f32.
struct Router {
    weights: RowScorer,
    norm: Vec<f32>,
    bias: Vec<f32>,
}

/// Predicts a layer's experts from the previous layer's hidden state.
pub struct RouterPredictor {
    routers: Vec<Option<Router>>,
    scores: Vec<(f32, u32)>,
    /// The hidden state times the norm weight.
    scaled: Vec<f32>,
    /// `scaled` in the type the router's dot product takes.
    converted: Vec<u8>,
    logits: Vec<f32>,
}

impl RouterPredictor {
    /// Checks every layer's router and converts its norm weight (and bias)
    /// to f32; the router weights themselves stay where the model keeps
    /// them.
    pub fn build(weights: &BTreeMap<usize, RouterWeights>) -> Result<RouterPredictor, String> {
        let mut routers = Vec::new();
        for (&il, w) in weights {
            let weights = w.router.row_scorer()?;
            let [n_embd, n_expert, ..] = w.router.ne().map(|n| n.max(0) as usize);
            let norm = w.norm.to_f32()?;
            if norm.len() != n_embd {
                return Err(format!("{}: {} values for a router of width {n_embd}", w.norm.name(), norm.len()));
            }
            let bias = match w.bias {
                Some(b) => b.to_f32()?,
                None => Vec::new(),
            };
            if !bias.is_empty() && bias.len() != n_expert {
                return Err(format!("{}: {} values for {n_expert} experts", w.router.name(), bias.len()));
            }
            if routers.len() <= il {
                routers.resize_with(il + 1, || None);
            }
            routers[il] = Some(Router { weights, norm, bias });
        }
        Ok(RouterPredictor {
            routers,
            scores: Vec::new(),
            scaled: Vec::new(),
            converted: Vec::new(),
            logits: Vec::new(),
        })
    }

    /// Bytes the predictor holds beside the model (norm weights and biases
    /// as f32).
    pub fn bytes(&self) -> usize {
        self.routers.iter().flatten().map(|r| (r.norm.len() + r.bias.len()) * 4).sum()
    }

    /// Hidden-state width layer `il`'s router takes, if it has one.
    pub fn width(&self, il: usize) -> Option<usize> {
        self.routers.get(il)?.as_ref().map(|r| r.weights.cols())
    }

    /// Appends to `out` the `k` experts layer `il`'s router scores highest
    /// for `hidden`: one token's `n_embd` values, before the norm, whose
    /// scale `rms` the norm divides by. False when layer `il` has no router
    /// or the width does not match.
    pub fn predict(&mut self, il: usize, hidden: &[f32], rms: f32, k: usize, out: &mut Vec<u32>) -> bool {
        let Some(Some(router)) = self.routers.get(il) else { return false };
        if hidden.len() != router.weights.cols() {
            return false;
        }
        // rms_norm(x) * g · w = (x * g · w) / rms.
        self.scaled.clear();
        self.scaled.extend(hidden.iter().zip(&router.norm).map(|(x, g)| x * g));
        if router.weights.dot_rows(&self.scaled, &mut self.converted, &mut self.logits).is_err() {
            return false;
        }
        self.scores.clear();
        for (e, logit) in self.logits.iter().enumerate() {
            self.scores.push((logit / rms + router.bias.get(e).copied().unwrap_or(0.0), e as u32));
        }
        let k = k.min(self.scores.len());
        if k == 0 {
            return true;
        }
        // Highest score first; ties keep the lower expert id first.
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        self.scores.select_nth_unstable_by(k - 1, order);
        out.extend(self.scores[..k].iter().map(|&(_, e)| e));
        true
    }
}

/// How often the router guessed right, per layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PredictionScore {
    /// Layer.
    pub layer: u32,
    /// Distinct experts the layer routed.
    pub routed: u32,
    /// Of those, how many the prediction named.
    pub right: u32,
}
