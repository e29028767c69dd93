//! The structured tensors every architecture shares: token embeddings, the
//! output head and the routers, shaped so that routing behaves like a
//! trained model's (see the module docs of [`super`]).

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ModelSpec;
use super::fill::{Fill, mix};
use super::tied::{Layout, TiedHead, Tokens, tie};
use super::vocab::{EOS_ID, Vocab};

/// The structured tensors: embeddings, output head and routers.
///
/// Only the natural vocabulary's rows are shaped one by one; the rows of
/// filler tokens (see [`Vocab::new`]) repeat a few shaped rows, so a real
/// vocabulary of 150-260k tokens costs no more memory or time than the
/// natural one, and its matrices render at memory speed.
pub(super) struct Structure {
    /// Shared unit direction `u` (zero on the reserved coordinates).
    common: Vec<f32>,
    /// Coordinates the embeddings' input parts and the routers leave out:
    /// the expert band ([`super::expert_band`]) and a tied head's own.
    reserved: usize,
    /// `token_embd`: the natural tokens' rows, then a pool of filler rows.
    pub(super) embedding: Fill,
    /// `output`: the natural tokens' rows, then the one filler row.
    pub(super) output: Fill,
    /// A tied-embedding model's successor lookup and final norm.
    pub(super) tied: Option<TiedHead>,
    /// The text tokens in cycle order: each one's successors are the next two.
    #[cfg(test)]
    pub(super) cycle: Vec<u32>,
}

/// Distinct embedding rows the filler tokens draw from.
const FILLER_POOL: usize = 256;

impl Structure {
    pub(super) fn new(spec: &ModelSpec, vocab: &Vocab) -> Structure {
        let d = spec.embd as usize;
        let band = super::expert_band(d);
        let layout = Layout::new(d, band, spec.tied_embeddings);
        let reserved = layout.reserved();
        let n = vocab.natural_len();
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x5eed_0001));
        // Embeddings and routers leave the expert band out: only the
        // experts write there, and only the output head reads it.
        let common = unit_outside(&mut rng, d, reserved);
        // Token-specific parts: independent for specials and bytes, an AR(1)
        // chain along a random cycle through the text tokens.
        let mut specific: Vec<Vec<f32>> = (0..n).map(|_| outside(gaussian_vec(&mut rng, d), reserved)).collect();
        let mut cycle = vocab.text_tokens();
        shuffle(&mut rng, &mut cycle);
        let rho = spec.routing.token_corr;
        let fresh = (1.0 - rho * rho).sqrt();
        for w in 1..cycle.len() {
            let (prev, cur) = (cycle[w - 1] as usize, cycle[w] as usize);
            let step: Vec<f32> = specific[prev].iter().zip(&specific[cur]).map(|(p, z)| rho * p + fresh * z).collect();
            specific[cur] = step;
        }
        let sqrt_d = (d as f32).sqrt();
        let mut embedding = Vec::with_capacity(n * d);
        for s in &specific {
            embedding.extend(s.iter().zip(&common).map(|(a, u)| a + sqrt_d * u));
        }
        // Output row of a text token = the sum of its two predecessors'
        // specific parts, so after token t the two tokens that follow t on
        // the cycle tie for first place: greedy decoding walks the cycle in
        // steps of one or two tokens, which never loops, and what decides
        // each step is the experts (below).
        let out_scale = 8.0 / d as f32 / (1.0 + rho);
        // Rows of non-text tokens point against `u`, so they are never chosen.
        let mut output: Vec<f32> = (0..n).flat_map(|_| common.iter().map(|u| -8.0 / sqrt_d * u)).collect();
        // A text token's row also reads the expert band along a random
        // direction of its own: what the routed experts wrote there moves
        // every text token's logit, which breaks the tie between the two
        // successors (and, teacher-forced over other text, decides between
        // any close tokens).
        let mut reads = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x5eed_0003));
        let read_scale = HEAD_READ * depth_factor(spec) * band_factor(band) / sqrt_d;
        let len = cycle.len();
        for w in 0..len {
            let prev = cycle[(w + len - 1) % len] as usize;
            let prev2 = cycle[(w + len - 2) % len] as usize;
            let row = &mut output[cycle[w] as usize * d..][..d];
            for ((x, a), b) in row.iter_mut().zip(&specific[prev]).zip(&specific[prev2]) {
                *x = out_scale * (a + b);
            }
            for x in &mut row[..band] {
                *x = read_scale * gaussian(&mut reads);
            }
        }
        // End-of-sequence is never preferred: a random model should not stop.
        for (x, u) in output[EOS_ID as usize * d..][..d].iter_mut().zip(&common) {
            *x = -16.0 / sqrt_d * u;
        }
        // Filler rows: an embedding like any token's (its own random part
        // plus `u`), and an output row that, like end-of-sequence's, is never
        // preferred, so fillers neither steer routing nor get sampled.
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x5eed_0002));
        let mut embedding_filler: Vec<f32> = (0..FILLER_POOL)
            .flat_map(|_| {
                let own = outside(gaussian_vec(&mut rng, d), reserved);
                own.into_iter().zip(&common).map(|(a, u)| a + sqrt_d * u).collect::<Vec<_>>()
            })
            .collect();
        let output_filler: Vec<f32> = common.iter().map(|u| -16.0 / sqrt_d * u).collect();
        // A tied model's head is its embedding: the embedding rows gain the
        // head's parts, and the first dense layer the lookup that reads them
        // (one unit per natural token: `ModelSpec::validate` holds a tied
        // model's dense layer to that width).
        let tied = (spec.tied_embeddings && spec.dense_ff as usize >= n).then(|| {
            let is_text = |t: usize| vocab.is_text(t);
            let tokens = Tokens { cycle: &cycle, natural: n, is_text: &is_text, eos: EOS_ID as usize };
            let width = spec.dense_ff as usize;
            tie(layout, rho, spec.seed, &tokens, &common, &output, &mut embedding, &mut embedding_filler, width)
        });
        Structure {
            embedding: Fill::Rows { head: Arc::new(embedding), filler: Arc::new(embedding_filler) },
            output: Fill::Rows { head: Arc::new(output), filler: Arc::new(output_filler) },
            common,
            reserved,
            tied,
            #[cfg(test)]
            cycle,
        }
    }

    /// Router of layer `l`, the first MoE layer being `first_moe`: a
    /// per-expert bias along `u` plus a random part, both zero on the
    /// expert band (what the experts add never moves a ranking).
    pub(super) fn router(&self, spec: &ModelSpec, l: u32, first_moe: u32) -> Arc<Vec<f32>> {
        let d = spec.embd as usize;
        let r = &spec.routing;
        let depth = l.saturating_sub(first_moe) as f32 / (spec.layers as f32 / 4.0).max(1.0);
        let skew = r.skew_first + (r.skew - r.skew_first) * depth.min(1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x0007_0000 ^ u64::from(l)));
        let sqrt_d = (d as f32).sqrt();
        // The random part spans d - reserved coordinates: scaled up so its
        // logits spread as a full-width one's would.
        let widen = (d as f32 / (d - self.reserved).max(1) as f32).sqrt();
        let mut w = Vec::with_capacity(d * spec.experts as usize);
        for _ in 0..spec.experts {
            let bias = skew * gaussian(&mut rng);
            // The random part must not lean on `u`, or it adds a hidden bias.
            let mut random: Vec<f32> =
                outside(gaussian_vec(&mut rng, d), self.reserved).iter().map(|z| z * widen).collect();
            let along: f32 = random.iter().zip(&self.common).map(|(z, u)| z * u).sum();
            for (z, u) in random.iter_mut().zip(&self.common) {
                *z -= along * u;
            }
            w.extend(random.iter().zip(&self.common).map(|(z, u)| r.gain * (bias / sqrt_d * u + z / sqrt_d)));
        }
        Arc::new(w)
    }
}

/// Scale of the output head's reads of the expert band: each text token's
/// logit moves with what the experts wrote by about this much times the
/// band's share of the final hidden state (a standard deviation). Any read
/// breaks the tie between a token's two successors; it must stay well below
/// their margin over every other token, or the experts' choice reaches past
/// them and greedy text can loop (as it did at 1.25 with the one-successor
/// head this replaced). Set on the demo model, where at 1.1 one expert fewer
/// per layer changes the top token at about 4% of positions and greedy text
/// does not loop (`docs/architecture.md`, "Experts that matter").
const HEAD_READ: f32 = 1.1;

/// MoE layers the head's band reads are set for ([`HEAD_READ`]: the demo's).
const READS_SET_FOR_LAYERS: f32 = 8.0;

/// How much weaker the head reads the band in a model with more MoE layers
/// than the demo's: each layer adds its experts' output to the band, so the
/// band's size against the embedding's grows with the square root of their
/// number, and so would the experts' sway over the head, until it reaches
/// past the two successors (with the one-successor head, the 16-layer bench
/// preset's greedy text then followed the experts into loops). Scaling the reads by sqrt(8 / MoE layers) keeps that
/// sway at the demo's for any depth; shallower models keep the demo's reads.
fn depth_factor(spec: &ModelSpec) -> f32 {
    let moe_layers = spec.layers.saturating_sub(spec.dense_layers).max(1) as f32;
    (READS_SET_FOR_LAYERS / moe_layers).sqrt().min(1.0)
}

/// Band width the head's reads are set for ([`HEAD_READ`]: the demo's).
const READS_SET_FOR_BAND: f32 = 64.0;

/// How much weaker the head reads a band narrower than the demo's: the
/// experts' output in a few coordinates lines up with some token's read
/// direction almost fully (of a hundred random directions in 8 dimensions,
/// one lies within about 25 degrees of any vector; in 64, none comes near),
/// so their sway over the best-placed token grows as the band narrows, and
/// on the 64-wide tiny model it pulled greedy text into a two-token loop.
/// Scaling the reads by sqrt(band / 64) keeps that sway near the demo's;
/// wider bands keep the demo's reads.
fn band_factor(band: usize) -> f32 {
    (band as f32 / READS_SET_FOR_BAND).sqrt().min(1.0)
}

/// `v` with the reserved coordinates (the first `reserved`: the expert band
/// and a tied head's) zeroed.
fn outside(mut v: Vec<f32>, reserved: usize) -> Vec<f32> {
    let reserved = reserved.min(v.len());
    v[..reserved].fill(0.0);
    v
}

/// A random unit vector that is zero on the reserved coordinates.
fn unit_outside(rng: &mut ChaCha8Rng, d: usize, reserved: usize) -> Vec<f32> {
    let v = outside(gaussian_vec(rng, d), reserved);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

/// One standard normal sample (Box-Muller).
fn gaussian(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.r#gen();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

pub(super) fn gaussian_vec(rng: &mut ChaCha8Rng, d: usize) -> Vec<f32> {
    (0..d).map(|_| gaussian(rng)).collect()
}

fn shuffle(rng: &mut ChaCha8Rng, v: &mut [u32]) {
    for i in (1..v.len()).rev() {
        let j = rng.gen_range(0..=i);
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Arch, Preset};
    use super::*;

    fn rows(fill: &Fill) -> &[f32] {
        match fill {
            Fill::Rows { head, .. } => head,
            _ => unreachable!("the structure's vocabulary matrices are row fills"),
        }
    }

    /// Only the experts write to the expert band: embeddings and routers
    /// are zero there (so nothing an expert adds moves a ranking), and the
    /// output head reads it for text tokens only.
    #[test]
    fn the_expert_band_is_read_by_the_head_alone() {
        let spec = ModelSpec::preset(Preset::Tiny, Arch::Qwen3Moe);
        let vocab = Vocab::new(spec.pieces, &[], spec.vocab);
        let s = Structure::new(&spec, &vocab);
        let d = spec.embd as usize;
        let band = crate::synth::expert_band(d);
        assert!(band > 0 && band < d);
        let on_band = |row: &[f32]| row[..band].iter().any(|x| *x != 0.0);
        assert!(rows(&s.embedding).chunks(d).all(|r| !on_band(r)), "an embedding row writes to the band");
        let router = s.router(&spec, 0, 0);
        assert!(router.chunks(d).all(|r| !on_band(r)), "a router reads the band");
        assert!(router.chunks(d).all(|r| r[band..].iter().any(|x| *x != 0.0)));
        let output = rows(&s.output);
        for t in vocab.text_tokens() {
            assert!(on_band(&output[t as usize * d..][..d]), "text token {t} does not read the band");
        }
        assert!(!on_band(&output[EOS_ID as usize * d..][..d]), "end-of-sequence reads the band");
    }
}
