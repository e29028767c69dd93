//! `bmoe replay`: cache policies side by side on route traces.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::replay::{Learned, Policy, ReplayOptions, Trace, replay_with};

/// Replays route traces through an expert cache under several policies and budgets.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Route traces (from --route-trace, or the reference engine's).
    #[arg(required = true)]
    pub traces: Vec<PathBuf>,
    /// Cache budgets as fractions of each trace's expert bank.
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.25,0.5")]
    pub fraction: Vec<f64>,
    /// Cache budgets in MiB (instead of fractions).
    #[arg(long, value_delimiter = ',', conflicts_with = "fraction")]
    pub cache_mb: Vec<f64>,
    /// Policies: default (the live one: decay with the route profile's prior while it misses less), decay and lru (live), lfu, lru2, prior-decay and prior (the profile's prior always, or alone), least-stale (SpecMD), flashmoe (a learned recency-frequency mix), fmoe (expert maps), arc; offline: popular (knows each expert's popularity, not the order), foresight[:N] (decay that knows the next N loads), belady (the optimum).
    #[arg(long, value_delimiter = ',', default_value = "default,decay,lru,lfu,lru2,popular,foresight,belady")]
    pub policy: Vec<Policy>,
    /// Learn a route profile (and the learned policies' models) from these traces first, then score
    /// every trace with it, starting warm.
    #[arg(long, num_args = 1.., value_name = "LEARN_TRACE")]
    pub learn_from: Vec<PathBuf>,
    /// Score each trace with what the other traces teach (leave one out), starting warm.
    #[arg(long, conflicts_with_all = ["learn_from", "learn_from_prompt"])]
    pub learn_from_others: bool,
    /// Learn from each trace's own prompt and score its decode alone, the cache cold at the decode's
    /// start (for traces of one prompt each).
    #[arg(long, conflicts_with = "learn_from")]
    pub learn_from_prompt: bool,
    /// Start cold even with a profile learned (no warm start).
    #[arg(long)]
    pub cold: bool,
    /// Also write the table as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// One row of the table: (trace, budget fraction, policy) → MiB read per decoded token.
type Scores = BTreeMap<(String, u64, String), f64>;

/// Runs `bmoe replay`.
pub fn replay_traces(args: ReplayArgs) -> Result<()> {
    for f in &args.fraction {
        if !(0.0..=1.0).contains(f) {
            bail!("--fraction {f}: a budget fraction must be in 0..=1");
        }
    }
    if let Some(bad) = args.cache_mb.iter().find(|m| !m.is_finite() || **m < 0.0) {
        bail!("--cache-mb {bad}: a budget must be a non-negative number of MiB");
    }
    if args.learn_from_others && args.traces.len() < 2 {
        bail!("--learn-from-others needs at least two traces: each is scored with what the others teach");
    }
    let read = |path: &PathBuf| -> Result<Trace> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Trace::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    };
    let traces: Vec<Trace> = args.traces.iter().map(read).collect::<Result<_>>()?;
    let learn: Vec<Trace> = args.learn_from.iter().map(read).collect::<Result<_>>()?;
    if let Some((i, t)) = learn.iter().enumerate().find(|(_, t)| traces.iter().any(|s| s.n_expert != t.n_expert)) {
        bail!(
            "{}: {} experts a layer, but the scored traces have {}: a profile is learned from the same model's traces",
            args.learn_from[i].display(),
            t.n_expert,
            traces[0].n_expert
        );
    }
    let mut csv = String::from(
        "trace,budget_mib,bank_fraction,policy,decode_hit_pct,decode_mib_per_token,evictions,warm_mib,prefill_mib\n",
    );
    println!(
        "{:<22} {:>10} {:>7} {:<12} {:>8} {:>12} {:>10} {:>9}",
        "trace", "budget MiB", "of bank", "policy", "hit %", "MiB/token", "evictions", "warm MiB"
    );
    let mut scores = Scores::new();
    for (i, (path, trace)) in args.traces.iter().zip(&traces).enumerate() {
        let learned = if !learn.is_empty() {
            Some(Learned::from_traces(&learn.iter().collect::<Vec<_>>()))
        } else if args.learn_from_others {
            let others: Vec<&Trace> = traces.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, t)| t).collect();
            Some(Learned::from_traces(&others))
        } else if args.learn_from_prompt {
            Some(Learned::from_prompt(trace))
        } else {
            None
        };
        let options = ReplayOptions {
            learned: learned.as_ref(),
            warm: learned.is_some() && !args.cold,
            decode_only: args.learn_from_prompt,
        };
        let bank = trace.bank_bytes();
        let budgets: Vec<u64> = if args.cache_mb.is_empty() {
            args.fraction.iter().map(|f| (f * bank as f64) as u64).collect()
        } else {
            args.cache_mb.iter().map(|m| (m * MIB) as u64).collect()
        };
        let name = path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let tokens = trace.decode_tokens().max(1) as f64;
        for &budget in &budgets {
            for &policy in &args.policy {
                let r = replay_with(trace, budget, policy, options);
                let (mib, frac) = (budget as f64 / MIB, budget as f64 / bank.max(1) as f64);
                let hit = 100.0 * r.decode_hit_rate();
                let per_token = r.decode_bytes as f64 / MIB / tokens;
                let warm = r.warm_bytes as f64 / MIB;
                println!(
                    "{name:<22} {mib:>10.1} {:>6.1}% {:<12} {hit:>8.1} {per_token:>12.1} {:>10} {warm:>9.0}",
                    frac * 100.0,
                    policy.name(),
                    r.evictions
                );
                let _ = writeln!(
                    csv,
                    "{name},{mib:.3},{frac:.4},{},{hit:.3},{per_token:.3},{},{warm:.3},{:.3}",
                    policy.name(),
                    r.evictions,
                    r.prefill_bytes as f64 / MIB
                );
                scores.insert((name.clone(), (frac * 1e4).round() as u64, policy.name()), per_token);
            }
        }
    }
    print!("{}", summary(&scores));
    if let Some(p) = &args.csv {
        std::fs::write(p, csv).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Per budget and policy, bytes per token against `decay`'s (mean over the
/// traces) and against `popular`'s (worst trace), where those ran.
fn summary(scores: &Scores) -> String {
    let mut ratios: BTreeMap<(u64, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    for ((trace, frac, policy), &mib) in scores {
        let of = |p: &str| scores.get(&(trace.clone(), *frac, p.to_string())).copied().filter(|v| *v > 0.0);
        let r = ratios.entry((*frac, policy.clone())).or_default();
        if let Some(decay) = of("decay") {
            r.0.push(mib / decay);
        }
        if let Some(popular) = of("popular") {
            r.1.push(mib / popular);
        }
    }
    let mut out = String::new();
    if ratios.values().all(|r| r.0.is_empty() && r.1.is_empty()) {
        return out;
    }
    let _ = writeln!(out, "\n{:>7} {:<12} {:>14} {:>18}", "of bank", "policy", "vs decay (mean)", "vs popular (worst)");
    for ((frac, policy), (decay, popular)) in &ratios {
        let mean = |v: &Vec<f64>| {
            if v.is_empty() { "-".to_string() } else { format!("{:.3}x", v.iter().sum::<f64>() / v.len() as f64) }
        };
        let worst = |v: &Vec<f64>| v.iter().copied().reduce(f64::max).map_or("-".to_string(), |w| format!("{w:.3}x"));
        let _ = writeln!(out, "{:>6.1}% {policy:<12} {:>14} {:>18}", *frac as f64 / 100.0, mean(decay), worst(popular));
    }
    out
}
