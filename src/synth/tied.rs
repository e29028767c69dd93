//! The output head of a model whose head is its token embedding (tied
//! embeddings, as LFM2 ships).
//!
//! An untied model's head row of token `w` reads the specific parts of
//! `w`'s two predecessors on the token cycle, so the token just read puts
//! its two successors first. A tied head cannot: its row of `w` is `w`'s
//! embedding, and a token's embedding is most like itself, so greedy text
//! would repeat one token. Trained models answer this as their early MLPs
//! do, with a bigram lookup: here the first dense FFN holds one unit per
//! natural token that fires on that token alone and writes the head's
//! reading of its two successors, having erased the token's own.
//!
//! The residual stream's coordinates split three ways: the expert band
//! (first), then `Q`, what the head reads, then `P`, what everything else
//! reads (the routers, and the lookup to recognise a token). The final norm
//! weighs `P` at zero, `Q` at a gain set from [`SUCCESSOR_LOGIT`] and the band at one, so a
//! token's logit is its embedding's `Q` part against the successors the
//! lookup wrote, plus the experts' band reads as in an untied head.

use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::fill::{Fill, mix};
use super::structure::gaussian_vec;

/// Pre-activation of a token's own lookup unit.
const FIRING: f32 = 6.0;

/// Bias every lookup unit's pre-activation carries: a unit sees its own
/// token at [`FIRING`], a cycle neighbour (embedding correlation `rho`) at
/// `rho * (FIRING + BIAS) - BIAS`, far below zero, so neighbours leak
/// under 1% of a unit's output.
const BIAS: f32 = 10.0;

/// Logit of each of the two successors before the final norm's scaling, as
/// the untied head gives them (its rows hold `8 / d / (1 + rho)` times two
/// specific parts of about `d` each, less the band).
const SUCCESSOR_LOGIT: f32 = 7.0;

/// Logit of a non-text token (end-of-sequence and fillers: twice this
/// far), as the untied head's rows against `u` give them.
const NON_TEXT_LOGIT: f32 = -8.0;

/// Size of the successors' pair in the head's coordinates, and of the
/// common direction every lookup writes, as shares of the head's width: the
/// residual's `Q` part is then about as large as its `P` part.
const PAIR_SCALE: f32 = 0.42;
const COMMON_SHARE: f32 = 0.5;

/// Where the coordinates of the residual stream go.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    /// Width of the residual stream.
    pub d: usize,
    /// The expert band: `0..band`.
    pub band: usize,
    /// The head's coordinates: `band..band + q_width`.
    pub q_width: usize,
}

impl Layout {
    /// The coordinates a tied model reserves for its head beside the band
    /// (`P` keeps the rest).
    pub(super) fn new(d: usize, band: usize, tied: bool) -> Layout {
        Layout { d, band, q_width: if tied { (d - band) / 2 } else { 0 } }
    }

    /// Coordinates before `P` (the band, then `Q`).
    pub(super) fn reserved(&self) -> usize {
        self.band + self.q_width
    }

    fn q(&self) -> std::ops::Range<usize> {
        self.band..self.reserved()
    }
}

/// What a tied model adds: the lookup FFN of its first dense layer and its
/// final norm's weights.
pub(super) struct TiedHead {
    /// `ffn_gate` `[d, width]`: unit `j` fires on natural token `j`.
    pub gate: Fill,
    /// `ffn_up` `[d, width]`: one for unit `j` on its token.
    pub up: Fill,
    /// `ffn_down` `[width, d]`: unit `j` writes its token's successors.
    pub down: Fill,
    /// Final norm weights: zero on `P`, the head's gain on `Q`, one on
    /// the band.
    pub final_norm: Fill,
}

/// The token structure [`tie`] works from.
pub(super) struct Tokens<'a> {
    /// The text tokens in cycle order.
    pub cycle: &'a [u32],
    /// Natural tokens (rows shaped one by one).
    pub natural: usize,
    /// Whether natural token `t` is a text token.
    pub is_text: &'a dyn Fn(usize) -> bool,
    /// End-of-sequence.
    pub eos: usize,
}

/// Gives the embedding rows (natural tokens, then the filler pool) their
/// head parts and builds the lookup that reads them: `embedding` holds
/// `P` parts already (zero on the reserved coordinates), `band_reads` each
/// natural token's band reads (zero for non-text ones), `u` the shared
/// direction on `P`. `width` is the first dense FFN's width (at least
/// `tokens.natural`).
#[allow(clippy::too_many_arguments)]
pub(super) fn tie(
    layout: Layout,
    rho: f32,
    seed: u64,
    tokens: &Tokens,
    u: &[f32],
    band_reads: &[f32],
    embedding: &mut [f32],
    filler: &mut [f32],
    width: usize,
) -> TiedHead {
    let Layout { d, band, .. } = layout;
    let q = layout.q();
    let n_q = layout.q_width as f32;
    let mut rng = ChaCha8Rng::seed_from_u64(mix(seed ^ 0x5eed_0004));
    // The head's common direction, and each text token's head part: an
    // AR(1) chain along the cycle, as the `P` parts are, both in `Q`.
    let common_q = unit_in(gaussian_vec(&mut rng, d), q.clone());
    let mut head: Vec<Vec<f32>> = vec![vec![0.0; d]; tokens.natural];
    let fresh = (1.0 - rho * rho).sqrt();
    for (i, &t) in tokens.cycle.iter().enumerate() {
        let z = in_range(gaussian_vec(&mut rng, d), q.clone());
        head[t as usize] = match i {
            0 => z,
            _ => head[tokens.cycle[i - 1] as usize].iter().zip(&z).map(|(p, z)| rho * p + fresh * z).collect(),
        };
    }
    for (i, row) in head.iter_mut().enumerate() {
        if (tokens.is_text)(i) {
            remove_along(row, &common_q);
        }
    }
    let pair = PAIR_SCALE;
    let gain = SUCCESSOR_LOGIT / (pair * (1.0 + rho) * n_q);
    let common = (COMMON_SHARE * n_q).sqrt();
    let against = -NON_TEXT_LOGIT / (gain * common);
    // Embedding rows: text tokens add their head part and band reads; the
    // others point against the common direction (end-of-sequence and the
    // fillers twice as far), so they are never chosen.
    for (t, row) in embedding.chunks_mut(d).enumerate().take(tokens.natural) {
        if (tokens.is_text)(t) {
            add(&mut row[q.clone()], &head[t][q.clone()], 1.0);
            row[..band].copy_from_slice(&band_reads[t * d..][..band]);
        } else {
            let far = if t == tokens.eos { 2.0 } else { 1.0 };
            add(&mut row[q.clone()], &common_q[q.clone()], -far * against);
        }
    }
    for row in filler.chunks_mut(d) {
        add(&mut row[q.clone()], &common_q[q.clone()], -2.0 * against);
    }
    // Lookup unit `j` for natural token `j`.
    let mut gate = vec![0.0; tokens.natural * d];
    let mut up = vec![0.0; tokens.natural * d];
    let mut down = vec![0.0; d * width];
    let inputs: Vec<Vec<f32>> = embedding.chunks(d).take(tokens.natural).map(rms_normed).collect();
    let mean_along_u = inputs.iter().map(|x| dot(x, u)).sum::<f32>() / tokens.natural as f32;
    let output = silu(FIRING);
    let mut successor = vec![0; tokens.natural];
    let len = tokens.cycle.len();
    for (i, &t) in tokens.cycle.iter().enumerate() {
        successor[t as usize] = i;
    }
    for (j, (row, x)) in embedding.chunks(d).zip(&inputs).enumerate() {
        // The token's own direction in `P`, without the shared `u`.
        let mut own: Vec<f32> = row.to_vec();
        own[..layout.reserved()].fill(0.0);
        remove_along(&mut own, u);
        let norm = dot(&own, &own).sqrt();
        own.iter_mut().for_each(|v| *v /= norm);
        let seen = dot(&own, x);
        let along_u = dot(x, u);
        let scale = (FIRING + BIAS * along_u / mean_along_u) / seen;
        for ((g, o), uu) in gate[j * d..][..d].iter_mut().zip(&own).zip(u) {
            *g = scale * o - BIAS / mean_along_u * uu;
        }
        for (v, o) in up[j * d..][..d].iter_mut().zip(&own) {
            *v = o / seen;
        }
        // What unit j writes: its token's head part erased, the common
        // direction, and (text tokens) the two successors' head parts.
        let mut target = vec![0.0; d];
        add(&mut target[q.clone()], &row[q.clone()], -1.0);
        add(&mut target[q.clone()], &common_q[q.clone()], common);
        if (tokens.is_text)(j) {
            let i = successor[j];
            for next in [tokens.cycle[(i + 1) % len], tokens.cycle[(i + 2) % len]] {
                add(&mut target[q.clone()], &head[next as usize][q.clone()], pair);
            }
        }
        for (i, v) in target.iter().enumerate() {
            down[i * width + j] = v / output;
        }
    }
    let mut norm = vec![0.0; d];
    norm[..band].fill(1.0);
    norm[q].fill(gain);
    TiedHead {
        gate: Fill::Rows { head: Arc::new(gate), filler: Arc::new(vec![0.0; d]) },
        up: Fill::Rows { head: Arc::new(up), filler: Arc::new(vec![0.0; d]) },
        down: Fill::Values(Arc::new(down)),
        final_norm: Fill::Values(Arc::new(norm)),
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn add(dst: &mut [f32], src: &[f32], scale: f32) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += scale * s;
    }
}

/// `v` less its component along the unit vector `unit`.
fn remove_along(v: &mut [f32], unit: &[f32]) {
    let along = dot(v, unit);
    add(v, unit, -along);
}

/// `v` zeroed outside `range`.
fn in_range(mut v: Vec<f32>, range: std::ops::Range<usize>) -> Vec<f32> {
    let (start, end) = (range.start, range.end);
    v[..start].fill(0.0);
    v[end..].fill(0.0);
    v
}

/// `v` zeroed outside `range`, scaled to unit length.
fn unit_in(v: Vec<f32>, range: std::ops::Range<usize>) -> Vec<f32> {
    let v = in_range(v, range);
    let norm = dot(&v, &v).sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// `x` scaled to a root mean square of one, as an RMS norm of unit
/// weights leaves a layer's input.
fn rms_normed(x: &[f32]) -> Vec<f32> {
    let rms = (dot(x, x) / x.len() as f32).sqrt();
    x.iter().map(|v| v / rms).collect()
}

#[cfg(test)]
mod tests {
    use super::super::structure::Structure;
    use super::super::vocab::Vocab;
    use super::super::{Arch, ModelSpec, Preset};
    use super::*;

    fn values(fill: &Fill) -> &[f32] {
        match fill {
            Fill::Rows { head, .. } | Fill::Values(head) => head,
            _ => unreachable!("the tied head's fills hold their values"),
        }
    }

    /// The lookup, run as llama.cpp runs the first dense FFN and the final
    /// norm, puts each text token's two successors first, close together
    /// (the experts decide between them), ahead of every other token
    /// (itself included) and with end-of-sequence far behind: what makes
    /// greedy text walk the cycle.
    #[test]
    fn the_lookup_puts_a_tokens_two_successors_first() {
        let mut spec = ModelSpec::preset(Preset::Demo, Arch::Lfm2Moe);
        spec.tied_embeddings = true;
        spec.fit_tied_head();
        spec.validate().unwrap();
        let vocab = Vocab::new(spec.pieces, &[], spec.vocab);
        let s = Structure::new(&spec, &vocab);
        let tied = s.tied.as_ref().expect("a tied model has a lookup");
        let (d, width, n) = (spec.embd as usize, spec.dense_ff as usize, vocab.natural_len());
        let embedding = values(&s.embedding);
        let (gate, up, down, norm) =
            (values(&tied.gate), values(&tied.up), values(&tied.down), values(&tied.final_norm));
        let cycle = &s.cycle;
        let (mut gaps, mut ties) = (Vec::new(), Vec::new());
        for (i, &t) in cycle.iter().enumerate().step_by(7) {
            let row = &embedding[t as usize * d..][..d];
            let x = rms_normed(row);
            let act: Vec<f32> =
                (0..n).map(|j| silu(dot(&gate[j * d..][..d], &x)) * dot(&up[j * d..][..d], &x)).collect();
            let h: Vec<f32> = (0..d).map(|k| row[k] + dot(&down[k * width..][..n], &act)).collect();
            let head: Vec<f32> = rms_normed(&h).iter().zip(norm).map(|(a, g)| a * g).collect();
            let logit = |w: usize| dot(&head, &embedding[w * d..][..d]);
            let successors = [cycle[(i + 1) % cycle.len()], cycle[(i + 2) % cycle.len()]].map(|w| logit(w as usize));
            let best_other = (0..n)
                .filter(|&w| w as u32 != cycle[(i + 1) % cycle.len()] && w as u32 != cycle[(i + 2) % cycle.len()])
                .map(logit)
                .fold(f32::MIN, f32::max);
            let gap = successors[0].min(successors[1]) - best_other;
            assert!(gap > 0.75, "token {t}: successors {successors:?}, best other {best_other}");
            gaps.push(gap);
            ties.push((successors[0] - successors[1]).abs());
            let eos = logit(super::super::vocab::EOS_ID as usize);
            assert!(eos < -5.0, "token {t}: end-of-sequence at {eos}");
        }
        let mean = |v: &[f32]| v.iter().sum::<f32>() / v.len() as f32;
        assert!(mean(&gaps) > 2.0, "the successors lead by {} on average", mean(&gaps));
        assert!(mean(&ties) < 0.6, "the successors differ by {} on average: not a tie", mean(&ties));
    }
}
