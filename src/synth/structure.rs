//! The structured tensors every architecture shares: token embeddings, the
//! output head and the routers, shaped so that routing behaves like a
//! trained model's (see the module docs of [`super`]).

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ModelSpec;
use super::fill::{Fill, mix};
use super::vocab::{EOS_ID, Vocab};

/// The structured tensors: embeddings, output head and routers.
///
/// Only the natural vocabulary's rows are shaped one by one; the rows of
/// filler tokens (see [`Vocab::new`]) repeat a few shaped rows, so a real
/// vocabulary of 150-260k tokens costs no more memory or time than the
/// natural one, and its matrices render at memory speed.
pub(super) struct Structure {
    /// Shared unit direction `u`.
    common: Vec<f32>,
    /// `token_embd`: the natural tokens' rows, then a pool of filler rows.
    pub(super) embedding: Fill,
    /// `output`: the natural tokens' rows, then the one filler row.
    pub(super) output: Fill,
}

/// Distinct embedding rows the filler tokens draw from.
const FILLER_POOL: usize = 256;

impl Structure {
    pub(super) fn new(spec: &ModelSpec, vocab: &Vocab) -> Structure {
        let d = spec.embd as usize;
        let n = vocab.natural_len();
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x5eed_0001));
        let common = unit(&mut rng, d);
        // Token-specific parts: independent for specials and bytes, an AR(1)
        // chain along a random cycle through the text tokens.
        let mut specific: Vec<Vec<f32>> = (0..n).map(|_| gaussian_vec(&mut rng, d)).collect();
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
        // Output row of a text token = its predecessor's specific part, so the
        // argmax after token t is the token that follows t on the cycle.
        let out_scale = 8.0 / d as f32;
        // Rows of non-text tokens point against `u`, so they are never chosen.
        let mut output: Vec<f32> = (0..n).flat_map(|_| common.iter().map(|u| -8.0 / sqrt_d * u)).collect();
        for w in 0..cycle.len() {
            let prev = cycle[(w + cycle.len() - 1) % cycle.len()] as usize;
            let row = &mut output[cycle[w] as usize * d..][..d];
            for (x, a) in row.iter_mut().zip(&specific[prev]) {
                *x = out_scale * a;
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
        let embedding_filler: Vec<f32> = (0..FILLER_POOL)
            .flat_map(|_| {
                gaussian_vec(&mut rng, d).into_iter().zip(&common).map(|(a, u)| a + sqrt_d * u).collect::<Vec<_>>()
            })
            .collect();
        let output_filler: Vec<f32> = common.iter().map(|u| -16.0 / sqrt_d * u).collect();
        Structure {
            embedding: Fill::Rows { head: Arc::new(embedding), filler: Arc::new(embedding_filler) },
            output: Fill::Rows { head: Arc::new(output), filler: Arc::new(output_filler) },
            common,
        }
    }

    /// Router of layer `l`, the first MoE layer being `first_moe`: a
    /// per-expert bias along `u` plus a random part.
    pub(super) fn router(&self, spec: &ModelSpec, l: u32, first_moe: u32) -> Arc<Vec<f32>> {
        let d = spec.embd as usize;
        let r = &spec.routing;
        let depth = l.saturating_sub(first_moe) as f32 / (spec.layers as f32 / 4.0).max(1.0);
        let skew = r.skew_first + (r.skew - r.skew_first) * depth.min(1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(mix(spec.seed ^ 0x0007_0000 ^ u64::from(l)));
        let sqrt_d = (d as f32).sqrt();
        let mut w = Vec::with_capacity(d * spec.experts as usize);
        for _ in 0..spec.experts {
            let bias = skew * gaussian(&mut rng);
            // The random part must not lean on `u`, or it adds a hidden bias.
            let mut random = gaussian_vec(&mut rng, d);
            let along: f32 = random.iter().zip(&self.common).map(|(z, u)| z * u).sum();
            for (z, u) in random.iter_mut().zip(&self.common) {
                *z -= along * u;
            }
            w.extend(random.iter().zip(&self.common).map(|(z, u)| r.gain * (bias / sqrt_d * u + z / sqrt_d)));
        }
        Arc::new(w)
    }
}

/// One standard normal sample (Box-Muller).
fn gaussian(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
    let u2: f64 = rng.r#gen();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

fn gaussian_vec(rng: &mut ChaCha8Rng, d: usize) -> Vec<f32> {
    (0..d).map(|_| gaussian(rng)).collect()
}

fn unit(rng: &mut ChaCha8Rng, d: usize) -> Vec<f32> {
    let v = gaussian_vec(rng, d);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / norm).collect()
}

fn shuffle(rng: &mut ChaCha8Rng, v: &mut [u32]) {
    for i in (1..v.len()).rev() {
        let j = rng.gen_range(0..=i);
        v.swap(i, j);
    }
}
