//! What a lossy setting costs, measured the way llama.cpp's perplexity tool
//! measures a quantization: for every position of a text, the KL divergence
//! of the setting's next-token distribution from the exact run's, and
//! whether both put the same token first. Both runs are teacher-forced over
//! the same tokens ([`crate::engine::Session::score`]), so every position
//! compares the two models on the same context.

pub mod branches;
pub mod text;

/// The exact run's next-token distribution at one position.
#[derive(Debug, Clone)]
pub struct Reference {
    /// Log-probabilities (log-softmax of the logits).
    log_probs: Vec<f32>,
    /// The most likely token.
    top1: usize,
}

impl Reference {
    /// From the exact run's logits at one position.
    pub fn new(logits: &[f32]) -> Reference {
        Reference { log_probs: log_softmax(logits), top1: argmax(logits) }
    }

    /// The most likely token.
    pub fn top1(&self) -> usize {
        self.top1
    }

    /// The vocabulary's size.
    pub fn vocab(&self) -> usize {
        self.log_probs.len()
    }
}

/// One position of a setting compared with the exact run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Position {
    /// KL(exact ‖ setting), nats.
    pub kl: f64,
    /// Both put the same token first.
    pub same_top1: bool,
}

/// Compares a setting's logits at one position with the exact run's.
pub fn compare(reference: &Reference, logits: &[f32]) -> Position {
    compare_references(reference, &Reference::new(logits))
}

/// Compares a setting's distribution at one position (`run`) with the
/// exact run's.
pub fn compare_references(exact: &Reference, run: &Reference) -> Position {
    assert_eq!(exact.log_probs.len(), run.log_probs.len(), "both runs have the model's vocabulary");
    // KL(P‖Q) = Σ p (log p − log q), in f64; tokens P gives no mass add nothing.
    let kl: f64 = exact
        .log_probs
        .iter()
        .zip(&run.log_probs)
        .filter(|(lp, _)| lp.is_finite())
        .map(|(&lp, &lq)| (lp as f64).exp() * (lp as f64 - lq as f64))
        .sum();
    // Rounding can leave an exact match a hair below zero.
    Position { kl: kl.max(0.0), same_top1: run.top1 == exact.top1 }
}

/// A KL divergence for the table: `0` only when exactly zero, small ones
/// in scientific notation so they do not read as zero.
pub fn kl_text(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v < 1e-3 {
        format!("{v:.2e}")
    } else {
        format!("{v:.5}")
    }
}

/// Log-softmax in f64 (stable: the largest logit is subtracted first).
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_sum = max + sum.ln();
    logits.iter().map(|&x| (x as f64 - log_sum) as f32).collect()
}

/// Index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in logits.iter().enumerate() {
        if x > logits[best] {
            best = i;
        }
    }
    best
}

/// The summary figures of a setting over a text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KlStats {
    /// Positions compared.
    pub positions: usize,
    /// Mean KL divergence, nats.
    pub mean: f64,
    /// Median KL divergence.
    pub median: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest KL divergence.
    pub max: f64,
    /// Share of positions where both runs put the same token first (0..1).
    pub top1_agreement: f64,
}

impl KlStats {
    /// The figures of `positions` (`None` when there are none).
    pub fn of(positions: &[Position]) -> Option<KlStats> {
        if positions.is_empty() {
            return None;
        }
        let mut kl: Vec<f64> = positions.iter().map(|p| p.kl).collect();
        kl.sort_by(f64::total_cmp);
        let n = kl.len();
        let rank = |q: f64| kl[((q * n as f64).ceil() as usize).clamp(1, n) - 1];
        let median = if n % 2 == 1 { kl[n / 2] } else { (kl[n / 2 - 1] + kl[n / 2]) / 2.0 };
        Some(KlStats {
            positions: n,
            mean: kl.iter().sum::<f64>() / n as f64,
            median,
            p99: rank(0.99),
            max: kl[n - 1],
            top1_agreement: positions.iter().filter(|p| p.same_top1).count() as f64 / n as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_exact_zero_reads_as_zero() {
        assert_eq!(kl_text(0.0), "0");
        assert_eq!(kl_text(2.1e-6), "2.10e-6");
        assert_eq!(kl_text(0.0123), "0.01230");
    }

    #[test]
    fn the_same_logits_diverge_by_nothing() {
        let logits = [1.0, 2.0, -3.0, 0.5];
        let p = compare(&Reference::new(&logits), &logits);
        assert_eq!(p, Position { kl: 0.0, same_top1: true });
        // A shift of every logit is the same distribution.
        let shifted: Vec<f32> = logits.iter().map(|x| x + 7.0).collect();
        assert!(compare(&Reference::new(&logits), &shifted).kl < 1e-6);
    }

    #[test]
    fn kl_matches_the_formula_and_is_not_symmetric() {
        // P = (0.5, 0.5), Q = (0.9, 0.1): KL = 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1).
        let p = [0.0f32, 0.0];
        let q = [(0.9f32).ln(), (0.1f32).ln()];
        let expected = 0.5 * (0.5f64 / 0.9).ln() + 0.5 * (0.5f64 / 0.1).ln();
        let got = compare(&Reference::new(&p), &q);
        assert!((got.kl - expected).abs() < 1e-6, "{} against {expected}", got.kl);
        // Ties go to the first token, so both name token 0 first.
        assert!(got.same_top1);
        let back = compare(&Reference::new(&q), &p);
        assert!((back.kl - got.kl).abs() > 0.05);
        // A token P gives no mass (a masked logit) adds nothing.
        let masked = [0.0f32, f32::NEG_INFINITY];
        assert!(compare(&Reference::new(&masked), &[0.0, 0.0]).kl.is_finite());
    }

    #[test]
    fn a_changed_first_token_is_counted() {
        let r = Reference::new(&[3.0, 1.0, 0.0]);
        assert!(!compare(&r, &[1.0, 3.0, 0.0]).same_top1);
        assert_eq!(r.top1(), 0);
    }

    #[test]
    fn the_figures_are_the_mean_median_rank_and_share() {
        let at = |kl: f64, same_top1: bool| Position { kl, same_top1 };
        let positions: Vec<Position> = (1..=100).map(|i| at(i as f64, i % 4 != 0)).collect();
        let s = KlStats::of(&positions).unwrap();
        assert_eq!(s.positions, 100);
        assert_eq!(s.mean, 50.5);
        assert_eq!(s.median, 50.5);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.max, 100.0);
        assert_eq!(s.top1_agreement, 0.75);
        assert_eq!(KlStats::of(&[]), None);
        assert_eq!(KlStats::of(&[at(2.0, true)]).unwrap().median, 2.0);
    }
}
