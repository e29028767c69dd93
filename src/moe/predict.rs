//! Read-ahead of the next layers' experts while a layer computes: temporal
//! (the experts the previous token routed in the next N layers) and
//! predictive (the next layer's router run early on this layer's input,
//! which the residual stream keeps close to the next layer's). Either is
//! only a guess about what to read; the routing itself never changes, so
//! output stays byte-identical whatever the guess.

use std::collections::BTreeMap;

use crate::llama::TensorHandle;

/// What to read ahead while a layer computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadAhead {
    /// Read the experts the previous token routed in this many next layers.
    pub layers: u32,
    /// Run the routers of this many next layers on this layer's input and
    /// read their choice (0 = off): 1 gives the next layer's reads the time
    /// of one layer's compute, 2 lets them start a layer earlier.
    pub router: u32,
}

impl ReadAhead {
    /// True when anything is read ahead.
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

/// One layer's router as f32 rows with the layer's norm weight folded in.
struct Router {
    n_embd: usize,
    rows: Vec<f32>,
    bias: Vec<f32>,
}

/// Predicts a layer's experts from the previous layer's hidden state.
pub struct RouterPredictor {
    routers: Vec<Option<Router>>,
    scores: Vec<(f32, u32)>,
}

impl RouterPredictor {
    /// Converts every layer's router (and norm weight) to f32 once.
    pub fn build(weights: &BTreeMap<usize, RouterWeights>) -> Result<RouterPredictor, String> {
        let mut routers = Vec::new();
        for (&il, w) in weights {
            let mut rows = w.router.to_f32()?;
            let n_embd = w.router_width();
            if n_embd == 0 || rows.len() % n_embd != 0 {
                return Err(format!("{}: unexpected router shape", w.router.name()));
            }
            let g = w.norm.to_f32()?;
            if g.len() != n_embd {
                return Err(format!("{}: {} values for a router of width {n_embd}", w.norm.name(), g.len()));
            }
            for row in rows.chunks_exact_mut(n_embd) {
                row.iter_mut().zip(&g).for_each(|(x, g)| *x *= g);
            }
            let bias = match w.bias {
                Some(b) => b.to_f32()?,
                None => Vec::new(),
            };
            if !bias.is_empty() && bias.len() * n_embd != rows.len() {
                return Err(format!("{}: {} values for {} experts", w.router.name(), bias.len(), rows.len() / n_embd));
            }
            if routers.len() <= il {
                routers.resize_with(il + 1, || None);
            }
            routers[il] = Some(Router { n_embd, rows, bias });
        }
        Ok(RouterPredictor { routers, scores: Vec::new() })
    }

    /// Bytes the converted routers hold.
    pub fn bytes(&self) -> usize {
        self.routers.iter().flatten().map(|r| r.rows.len() * 4).sum()
    }

    /// Hidden-state width layer `il`'s router takes, if it has one.
    pub fn width(&self, il: usize) -> Option<usize> {
        self.routers.get(il)?.as_ref().map(|r| r.n_embd)
    }

    /// Appends to `out` the `k` experts layer `il`'s router scores highest
    /// for `hidden`: one token's `n_embd` values, before the norm, whose
    /// scale `rms` the norm divides by. False when layer `il` has no router
    /// or the width does not match.
    pub fn predict(&mut self, il: usize, hidden: &[f32], rms: f32, k: usize, out: &mut Vec<u32>) -> bool {
        let Some(Some(router)) = self.routers.get(il) else { return false };
        if hidden.len() != router.n_embd {
            return false;
        }
        self.scores.clear();
        for (e, row) in router.rows.chunks_exact(router.n_embd).enumerate() {
            self.scores.push((dot(row, hidden) / rms + router.bias.get(e).copied().unwrap_or(0.0), e as u32));
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

/// A dot product in eight independent sums, which the compiler turns into
/// vector instructions (one running sum would have to stay sequential).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

impl RouterWeights {
    fn router_width(&self) -> usize {
        self.router.ne()[0].max(0) as usize
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

#[cfg(test)]
mod tests {
    use super::dot;

    #[test]
    fn dot_matches_the_plain_sum_for_every_length() {
        for n in [0, 1, 7, 8, 9, 64, 100, 2048] {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            assert!((f64::from(dot(&a, &b)) - plain).abs() < 1e-3, "n={n}");
        }
    }
}
