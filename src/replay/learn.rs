//! What a replay learns before it scores a trace: the route profile (for
//! `default`, `prior-decay`, `prior` and the warm start), FlashMoE's
//! recency-frequency mix and fMoE's expert maps, from other traces or from
//! the scored trace's own prompt.

use std::collections::{BTreeSet, HashMap};

use super::{Load, Trace};
use crate::moe::profile::RouteProfile;

/// Most expert maps kept (fMoE's store holds 1,000).
const MAX_MAPS: usize = 1000;

/// What was learned.
#[derive(Debug, Clone, Default)]
pub struct Learned {
    /// The route profile.
    pub profile: Option<RouteProfile>,
    /// FlashMoE's fitted mix.
    pub mix: Option<RecencyFrequencyMix>,
    /// fMoE's expert maps.
    pub maps: Option<ExpertMaps>,
}

/// One token's routing: per layer, the experts it routed.
type TokenRoutes = Vec<(u32, Vec<u32>)>;

impl Learned {
    /// Learns from every load of `traces` (prompts and decodes).
    pub fn from_traces(traces: &[&Trace]) -> Learned {
        let tokens: Vec<TokenRoutes> = traces.iter().flat_map(|t| by_token(&t.loads)).collect();
        Learned::from_tokens(traces.first().map(|t| (t.n_expert, t.k)), &tokens, traces.iter().map(|t| max_layer(t)))
    }

    /// Learns from `trace`'s prompt alone (its prefill loads).
    pub fn from_prompt(trace: &Trace) -> Learned {
        let prompt: Vec<Load> = trace.loads.iter().filter(|l| !l.decode).cloned().collect();
        Learned::from_tokens(Some((trace.n_expert, trace.k)), &by_token(&prompt), [max_layer(trace)].into_iter())
    }

    fn from_tokens(
        shape: Option<(usize, usize)>,
        tokens: &[TokenRoutes],
        layers: impl Iterator<Item = u32>,
    ) -> Learned {
        let Some((n_expert, k)) = shape else { return Learned::default() };
        let n_layer = layers.max().map_or(0, |l| l as usize + 1);
        let mut profile = RouteProfile::new("replay", n_layer, n_expert, k);
        for token in tokens {
            for (layer, experts) in token {
                profile.observe(*layer as usize, experts.iter().copied());
            }
        }
        Learned {
            profile: Some(profile),
            mix: Some(RecencyFrequencyMix::fit(tokens, n_expert)),
            maps: Some(ExpertMaps::new(tokens, n_layer, n_expert)),
        }
    }
}

fn max_layer(trace: &Trace) -> u32 {
    trace.loads.iter().map(|l| l.layer).max().unwrap_or(0)
}

/// Splits loads into tokens: a decode load is one token's layer; a prompt
/// load's rows go to their own tokens by position.
fn by_token(loads: &[Load]) -> Vec<TokenRoutes> {
    let mut out: Vec<TokenRoutes> = Vec::new();
    let mut prompt: Vec<(i64, TokenRoutes)> = Vec::new();
    let mut last_layer = None;
    let flush = |prompt: &mut Vec<(i64, TokenRoutes)>, out: &mut Vec<TokenRoutes>| {
        prompt.sort_by_key(|p| p.0);
        out.extend(prompt.drain(..).map(|p| p.1));
    };
    for load in loads {
        if load.decode {
            flush(&mut prompt, &mut out);
            if last_layer.is_none_or(|l| load.layer <= l) || out.is_empty() {
                out.push(Vec::new());
            }
            out.last_mut().expect("pushed").push((load.layer, load.experts.clone()));
        } else {
            let mut rows: HashMap<i64, Vec<u32>> = HashMap::new();
            for (&e, &step) in load.experts.iter().zip(&load.steps) {
                rows.entry(step).or_default().push(e);
            }
            for (step, experts) in rows {
                match prompt.iter_mut().find(|p| p.0 == step) {
                    Some(p) => p.1.push((load.layer, experts)),
                    None => prompt.push((step, vec![(load.layer, experts)])),
                }
            }
        }
        last_layer = Some(load.layer);
    }
    flush(&mut prompt, &mut out);
    out
}

/// FlashMoE's score, linear: the predicted distance to an expert's next use
/// (scaled to 0..=1 over a horizon) from its recency and frequency.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecencyFrequencyMix {
    /// Weight of `1 / (tokens since the last use + 1)`.
    pub recency: f64,
    /// Weight of `uses / the layer's most uses`.
    pub frequency: f64,
    /// Constant.
    pub bias: f64,
}

impl RecencyFrequencyMix {
    /// The predicted next-use distance of an entry.
    pub fn predict(&self, since_last: f64, uses_share: f64) -> f64 {
        self.recency / (since_last + 1.0) + self.frequency * uses_share + self.bias
    }

    /// Fits the weights by least squares to the next-use distances of the
    /// learning tokens (clamped to a horizon of about 0.77 of the experts,
    /// as the paper's), over every expert used before at its layer. With
    /// too little to fit, recency and frequency weigh alike.
    fn fit(tokens: &[TokenRoutes], n_expert: usize) -> RecencyFrequencyMix {
        let horizon = ((n_expert as f64 * 0.77).round()).max(2.0);
        // Each (layer, expert)'s token indices of use.
        let mut uses: HashMap<(u32, u32), Vec<usize>> = HashMap::new();
        for (t, token) in tokens.iter().enumerate() {
            for (layer, experts) in token {
                for &e in experts.iter().collect::<BTreeSet<_>>() {
                    uses.entry((*layer, e)).or_default().push(t);
                }
            }
        }
        // Normal equations of y = a x1 + b x2 + c.
        let mut m = [[0.0f64; 3]; 3];
        let mut v = [0.0f64; 3];
        let mut most: HashMap<u32, usize> = HashMap::new();
        for ((layer, _), at) in &uses {
            let top = most.entry(*layer).or_default();
            *top = (*top).max(at.len());
        }
        for ((layer, _), at) in &uses {
            for (i, pair) in at.windows(2).enumerate() {
                // At the token of a use: recency 0 since that use, `i + 1` uses.
                let (t, next) = (pair[0], pair[1]);
                let x = [1.0, (i + 1) as f64 / most[layer] as f64, 1.0];
                let d = ((next - t) as f64).clamp(1.0, horizon);
                let y = (d - 1.0) / (horizon - 1.0);
                for r in 0..3 {
                    for c in 0..3 {
                        m[r][c] += x[r] * x[c];
                    }
                    v[r] += x[r] * y;
                }
                // And a few tokens on: recency decays while the next use waits.
                for gap in [2usize, 4, 8] {
                    if t + gap >= next {
                        break;
                    }
                    let x = [1.0 / (gap as f64 + 1.0), x[1], 1.0];
                    let y = (((next - t - gap) as f64).clamp(1.0, horizon) - 1.0) / (horizon - 1.0);
                    for r in 0..3 {
                        for c in 0..3 {
                            m[r][c] += x[r] * x[c];
                        }
                        v[r] += x[r] * y;
                    }
                }
            }
        }
        solve3(m, v)
            .map(|w| RecencyFrequencyMix { recency: w[0], frequency: w[1], bias: w[2] })
            .unwrap_or(RecencyFrequencyMix { recency: -0.5, frequency: -0.5, bias: 1.0 })
    }
}

/// Solves a 3x3 system by Cramer's rule; `None` when it is singular.
fn solve3(m: [[f64; 3]; 3], v: [f64; 3]) -> Option<[f64; 3]> {
    let det = |a: [[f64; 3]; 3]| {
        a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1]) - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
    };
    let d = det(m);
    if d.abs() < 1e-9 {
        return None;
    }
    let mut out = [0.0; 3];
    for (c, o) in out.iter_mut().enumerate() {
        let mut a = m;
        for r in 0..3 {
            a[r][c] = v[r];
        }
        *o = det(a) / d;
    }
    Some(out)
}

/// fMoE's expert maps on routing alone: each learning token's experts per
/// layer, as bit sets.
#[derive(Debug, Clone)]
pub struct ExpertMaps {
    words: usize,
    n_layer: usize,
    /// Per map, per layer, the experts' bits.
    maps: Vec<Vec<u64>>,
}

impl ExpertMaps {
    fn new(tokens: &[TokenRoutes], n_layer: usize, n_expert: usize) -> ExpertMaps {
        let words = n_expert.div_ceil(64);
        let from = tokens.len().saturating_sub(MAX_MAPS);
        let maps = tokens[from..]
            .iter()
            .map(|token| {
                let mut bits = vec![0u64; n_layer * words];
                for (layer, experts) in token {
                    for &e in experts {
                        bits[*layer as usize * words + e as usize / 64] |= 1 << (e % 64);
                    }
                }
                bits
            })
            .collect();
        ExpertMaps { words, n_layer, maps }
    }

    /// Maps held.
    pub fn len(&self) -> usize {
        self.maps.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Experts of `layer` this token shares with map `m`.
    pub fn overlap(&self, m: usize, layer: usize, experts: &[u32]) -> u32 {
        if layer >= self.n_layer {
            return 0;
        }
        let bits = &self.maps[m][layer * self.words..(layer + 1) * self.words];
        experts.iter().filter(|&&e| bits.get(e as usize / 64).is_some_and(|w| w >> (e % 64) & 1 == 1)).count() as u32
    }

    /// True when map `m` routes `expert` at `layer`.
    pub fn routes(&self, m: usize, layer: usize, expert: usize) -> bool {
        layer < self.n_layer && self.maps[m][layer * self.words + expert / 64] >> (expert % 64) & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_fitted_to_regular_reuse_prefers_recent_and_frequent_experts() {
        // Expert 0 every token, expert 1 every fourth, expert 2 every tenth.
        let tokens: Vec<TokenRoutes> = (0..400)
            .map(|t| {
                let mut e = vec![0u32];
                if t % 4 == 0 {
                    e.push(1);
                }
                if t % 10 == 0 {
                    e.push(2);
                }
                vec![(0u32, e)]
            })
            .collect();
        let mix = RecencyFrequencyMix::fit(&tokens, 16);
        // The farther predicted next use is the rarer expert's.
        assert!(mix.predict(0.0, 1.0) < mix.predict(0.0, 0.1), "{mix:?}");
        let maps = ExpertMaps::new(&tokens, 1, 16);
        assert_eq!(maps.len(), 400);
        assert_eq!(maps.overlap(0, 0, &[0, 1, 2, 5]), 3);
        assert!(maps.routes(4, 0, 1) && !maps.routes(5, 0, 1));
    }

    #[test]
    fn solves_a_linear_system_and_refuses_a_singular_one() {
        let w = solve3([[2.0, 0.0, 0.0], [0.0, 4.0, 0.0], [1.0, 0.0, 1.0]], [2.0, 8.0, 4.0]).unwrap();
        assert_eq!(w, [1.0, 2.0, 3.0]);
        assert!(solve3([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]], [1.0, 1.0, 1.0]).is_none());
    }
}
