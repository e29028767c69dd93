//! The arithmetic of `bmoe fit`: from a model's shape and what this machine
//! measured (memory, disk and compute), whether the model runs resident or
//! streamed, the cache budget bmoe would choose, the bytes a token reads and
//! the tok/s that follow. Pure: the probes are elsewhere.

use super::ModelShape;
use crate::moe::budget::{CacheBudget, Holdings, MemoryLimits, decide, margin};

/// The process's own memory beside weights, KV cache and expert cache, less
/// the logits of a prompt batch: the runtime, llama.cpp's other compute
/// buffers, the read lanes' buffers. Measured as the context of the auto
/// budget's note on the bench preset (266 MiB with a 128 MiB KV cache, a
/// small vocabulary), and on qwen3-30b-a3b's 151,936 tokens with the
/// logits below (peak RSS 1600 MiB with 789 MiB dense, 384 MiB KV).
const OWN_MEMORY: u64 = 136 << 20;

/// Positions of a prompt batch whose logits llama.cpp's compute buffer
/// holds (`generate.ubatch`'s default).
const UBATCH: u64 = 512;

/// Decode hit rates of the live cache policy (`decay`) at a budget that is
/// a fraction of the expert bank, the lowest and highest over the three
/// real models' route traces (gemma, gpt-oss, qwen), as `bmoe replay
/// assets/route-traces/*.csv --fraction 0.05,0.1,0.19,0.25,0.5` measured
/// them (docs/benchmarks.md, "Cache policies on the real traces").
const HIT_RATES: [(f64, f64, f64); 7] = [
    (0.0, 0.0, 0.0),
    (0.05, 0.371, 0.452),
    (0.10, 0.554, 0.609),
    (0.19, 0.731, 0.753),
    (0.25, 0.769, 0.839),
    (0.50, 0.891, 0.963),
    (1.0, 1.0, 1.0),
];

/// What this machine gives, as measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    /// Memory available and the cgroup limit.
    pub memory: MemoryLimits,
    /// Expert reads from the model's disk, bytes per second (the bench
    /// probe's O_DIRECT reads of one slice over the read lanes).
    pub disk_bytes_s: Option<f64>,
    /// Weights multiplied per second in a decode step (llama.cpp on a probe
    /// model with the model's tensor types): the slowest and fastest runs.
    pub weights_s: Option<(f64, f64)>,
}

/// How the model would run.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// The whole file fits in memory beside the context.
    Resident,
    /// Experts stream from disk through a cache of `budget` bytes.
    Streamed {
        /// The auto cache budget.
        budget: u64,
        /// How the budget was chosen.
        why: Option<String>,
    },
    /// Not even the dense weights and the context fit: `need` bytes would.
    DoesNotFit {
        /// The least memory that would stream it.
        need: u64,
    },
}

/// The estimate for one model on one machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Resident, streamed or neither.
    pub mode: Mode,
    /// The memory the estimate had to fit in, if known.
    pub limit: Option<u64>,
    /// Memory beside the weights: KV cache at the context size and the
    /// process's own.
    pub context: u64,
    /// The dense weights resident at that context.
    pub dense: u64,
    /// Decode hit rate of the expert cache, lowest and highest.
    pub hit: (f64, f64),
    /// Bytes a decoded token reads from disk, most and fewest.
    pub read_per_token: (u64, u64),
    /// Compute seconds per token, most and least, if the rate is known.
    pub compute_s: Option<(f64, f64)>,
    /// Expected decode tok/s, slowest and fastest, when the probes allow.
    pub tok_s: Option<(f64, f64)>,
}

/// The cache's decode hit rate at `fraction` of the bank: (lowest, highest)
/// over the real traces, interpolated between the measured fractions.
pub fn hit_rates(fraction: f64) -> (f64, f64) {
    let f = fraction.clamp(0.0, 1.0);
    let i = HIT_RATES.iter().position(|&(x, _, _)| x >= f).unwrap_or(HIT_RATES.len() - 1).max(1);
    let ((x0, lo0, hi0), (x1, lo1, hi1)) = (HIT_RATES[i - 1], HIT_RATES[i]);
    let t = ((f - x0) / (x1 - x0)).clamp(0.0, 1.0);
    (lo0 + t * (lo1 - lo0), hi0 + t * (hi1 - hi0))
}

/// The least memory limit `l` that holds `bytes` beside the margin kept
/// free at that limit (`bytes + margin(l) <= l`).
pub fn least_limit(bytes: u64) -> u64 {
    // margin(l) is the larger of l / 20 and 64 MiB; l - l / 20 grows with l,
    // so from the larger of the two closed forms a few steps settle it.
    let mut l = (bytes + (64 << 20)).max(bytes.saturating_mul(20) / 19);
    while bytes + margin(l) > l {
        l += 1;
    }
    l
}

/// Estimates `shape` on `machine` with a context of `n_ctx` positions.
pub fn estimate(shape: &ModelShape, machine: &Machine, n_ctx: u32) -> Estimate {
    let limit = machine.memory.tightest();
    let context = shape.kv_per_position * u64::from(n_ctx) + OWN_MEMORY + shape.n_vocab * UBATCH * 4;
    let dense = shape.dense_with(n_ctx);
    let w = shape.active_weights as f64;
    let compute_s =
        machine.weights_s.filter(|&(slow, fast)| slow > 0.0 && fast > 0.0).map(|(slow, fast)| (w / slow, w / fast));
    // The least memory each way needs, the margin included: one verdict
    // per limit, and the limits in order (resident needs at least what
    // streaming does, since the file holds the dense weights and every expert).
    let resident_need = least_limit(shape.file_bytes + context);
    let stream_need = least_limit(dense + context + shape.working_set).min(resident_need);
    let mode = match limit {
        Some(l) if l >= resident_need => Mode::Resident,
        Some(l) if l < stream_need => Mode::DoesNotFit { need: stream_need },
        _ => {
            let held = Holdings { bank: shape.bank, working_set: shape.working_set, dense, context };
            let decision = decide(CacheBudget::Auto { ceil: None }, &held, &machine.memory)
                .unwrap_or(crate::moe::budget::Decision { bytes: 0, note: None });
            Mode::Streamed { budget: decision.bytes, why: decision.note }
        }
    };
    let (hit, read_per_token) = match &mode {
        Mode::Resident => ((1.0, 1.0), (0, 0)),
        Mode::Streamed { budget, .. } => {
            let (lo, hi) = hit_rates(*budget as f64 / shape.bank.max(1) as f64);
            let reads = |hit: f64| (shape.working_set as f64 * (1.0 - hit)) as u64;
            ((lo, hi), (reads(lo), reads(hi)))
        }
        Mode::DoesNotFit { .. } => ((0.0, 0.0), (shape.working_set, shape.working_set)),
    };
    let tok_s = match (&mode, compute_s) {
        (Mode::DoesNotFit { .. }, _) | (_, None) => None,
        (Mode::Resident, Some((most, least))) => Some((1.0 / most, 1.0 / least)),
        (Mode::Streamed { .. }, Some((c_most, c_least))) => machine.disk_bytes_s.filter(|&d| d > 0.0).map(|disk| {
            let (most, fewest) = (read_per_token.0 as f64 / disk, read_per_token.1 as f64 / disk);
            // Slowest: reads wait in full beside compute; fastest: reads
            // hidden behind compute, the longer of the two sets the pace.
            (1.0 / (c_most + most), 1.0 / c_least.max(fewest))
        }),
    };
    Estimate { mode, limit, context, dense, hit, read_per_token, compute_s, tok_s }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn shape() -> ModelShape {
        ModelShape {
            arch: "qwen3moe".into(),
            file_bytes: 6000 * MIB,
            bank: 5400 * MIB,
            working_set: 320 * MIB,
            dense: 500 * MIB,
            embedding_row: 4096,
            embeddings: 100 * MIB,
            kv_per_position: 65536,
            active_weights: 1_000_000_000,
            active_bytes: 900 * MIB,
            read_size: 1 << 20,
            expert_type: crate::gguf::GgmlType::Q4_0,
            dense_type: crate::gguf::GgmlType::F16,
            n_expert: 128,
            n_vocab: 1000,
            k: 8,
        }
    }

    fn machine(limit_mib: u64) -> Machine {
        Machine {
            memory: MemoryLimits { available: Some(limit_mib * MIB), cgroup_limit: None, cgroup: None },
            disk_bytes_s: Some(500.0 * MIB as f64),
            weights_s: Some((8e9, 10e9)),
        }
    }

    #[test]
    fn hit_rates_follow_the_table_and_stay_in_range() {
        assert_eq!(hit_rates(0.10), (0.554, 0.609));
        let (lo, hi) = hit_rates(0.15);
        assert!(lo > 0.554 && lo < 0.731 && hi > 0.609 && hi < 0.753);
        assert_eq!(hit_rates(2.0), (1.0, 1.0));
        assert_eq!(hit_rates(0.0), (0.0, 0.0));
    }

    #[test]
    fn a_model_that_fits_runs_resident_at_compute_speed() {
        let e = estimate(&shape(), &machine(16_000), 4096);
        assert_eq!(e.mode, Mode::Resident);
        let (lo, hi) = e.tok_s.unwrap();
        assert!((lo - 8.0).abs() < 1e-9 && (hi - 10.0).abs() < 1e-9);
    }

    #[test]
    fn a_model_over_memory_streams_and_reads_what_the_cache_misses() {
        let e = estimate(&shape(), &machine(2000), 4096);
        let Mode::Streamed { budget, .. } = e.mode else { panic!("{:?}", e.mode) };
        assert!(budget > 0 && budget < shape().bank);
        assert!(e.read_per_token.0 >= e.read_per_token.1 && e.read_per_token.0 < shape().working_set);
        let (slow, fast) = e.tok_s.unwrap();
        assert!(slow < fast && fast <= 10.0 + 1e-9);
    }

    #[test]
    fn a_cgroup_limit_below_the_memory_available_decides() {
        let mut m = machine(16_000);
        m.memory.cgroup_limit = Some(2000 * MIB);
        assert!(matches!(estimate(&shape(), &m, 4096).mode, Mode::Streamed { .. }));
    }

    /// Rank of a verdict: more memory never moves it down.
    fn rank(mode: &Mode) -> u8 {
        match mode {
            Mode::DoesNotFit { .. } => 0,
            Mode::Streamed { .. } => 1,
            Mode::Resident => 2,
        }
    }

    proptest::proptest! {
        /// At every memory size the verdict agrees with itself: more memory
        /// never gives a worse verdict or a smaller cache, a model that does
        /// not fit needs more than the memory given and runs once given it,
        /// and a streamed run's numbers add up to no more than the limit.
        #[test]
        fn the_verdict_and_the_budget_only_grow_with_memory(
            dense_mib in 1u64..2000,
            ctx_tokens in 16u32..65536,
            bank_mib in 10u64..20000,
            start_mib in 1u64..4000,
            step_mib in 1u64..64,
        ) {
            let s = ModelShape {
                dense: dense_mib * MIB,
                bank: bank_mib * MIB,
                working_set: (bank_mib * MIB / 16).max(MIB),
                file_bytes: (dense_mib + bank_mib) * MIB,
                ..shape()
            };
            let mut last: Option<Estimate> = None;
            let mut promised = None;
            for i in 0..200u64 {
                let limit = (start_mib + i * step_mib) * MIB;
                let e = estimate(&s, &machine(limit / MIB), ctx_tokens);
                // A verdict of "needs N" holds for every limit below N.
                if let Some(need) = promised.filter(|&n| limit < n) {
                    proptest::prop_assert!(
                        matches!(e.mode, Mode::DoesNotFit { .. }),
                        "{need} was said to be needed, yet {limit} gives {:?}", e.mode
                    );
                }
                match &e.mode {
                    Mode::DoesNotFit { need } => {
                        promised = Some(*need);
                        proptest::prop_assert!(*need > limit, "needs {need} yet {limit} is not enough");
                        let given = estimate(&s, &machine(need.div_ceil(MIB)), ctx_tokens);
                        proptest::prop_assert!(rank(&given.mode) >= 1, "{need} was said to be enough: {:?}", given.mode);
                    }
                    Mode::Streamed { budget, .. } => {
                        let held = e.dense + e.context + budget + margin(limit);
                        proptest::prop_assert!(held <= limit, "{held} held under a limit of {limit}");
                        proptest::prop_assert!(*budget == 0 || *budget >= s.working_set);
                    }
                    Mode::Resident => {
                        proptest::prop_assert!(s.file_bytes + e.context + margin(limit) <= limit);
                    }
                }
                if let Some(prev) = &last {
                    proptest::prop_assert!(rank(&e.mode) >= rank(&prev.mode), "{:?} then {:?}", prev.mode, e.mode);
                    if let (Mode::Streamed { budget: a, .. }, Mode::Streamed { budget: b, .. }) = (&prev.mode, &e.mode) {
                        proptest::prop_assert!(b >= a, "the cache shrank from {a} to {b} with more memory");
                    }
                }
                last = Some(e);
            }
        }
    }

    #[test]
    fn least_limit_is_the_least() {
        for bytes in [0, 1, MIB, 1000 * MIB, 1216 * MIB, 1217 * MIB, 5000 * MIB, 17 << 30] {
            let l = least_limit(bytes);
            assert!(bytes + margin(l) <= l, "{bytes}: {l}");
            assert!(bytes + margin(l - 1) > l - 1, "{bytes}: {l} is not the least");
        }
    }

    #[test]
    fn too_little_memory_for_the_dense_weights_does_not_fit() {
        let e = estimate(&shape(), &machine(600), 4096);
        let Mode::DoesNotFit { need } = e.mode else { panic!("{:?}", e.mode) };
        assert!(need > 600 * MIB);
        assert_eq!(e.tok_s, None);
    }
}
