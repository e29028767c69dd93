//! `bmoe replay`: cache policies side by side on route traces.

use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::replay::{Policy, Trace, replay};

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
    /// Policies: decay and lru (the live cache's two), lfu, lru2, popular (offline: knows each expert's popularity, not the order), foresight[:N] (offline: decay that knows the next N loads, one token's worth without :N), belady (the offline optimum).
    #[arg(long, value_delimiter = ',', default_value = "decay,lru,lfu,lru2,popular,foresight,belady")]
    pub policy: Vec<Policy>,
    /// Also write the table as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

const MIB: f64 = 1024.0 * 1024.0;

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
    let mut csv = String::from("trace,budget_mib,bank_fraction,policy,decode_hit_pct,decode_mib_per_token,evictions\n");
    println!(
        "{:<22} {:>10} {:>7} {:<11} {:>8} {:>12} {:>10}",
        "trace", "budget MiB", "of bank", "policy", "hit %", "MiB/token", "evictions"
    );
    for path in &args.traces {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let trace = Trace::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
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
                let r = replay(&trace, budget, policy);
                let (mib, frac) = (budget as f64 / MIB, budget as f64 / bank.max(1) as f64);
                let hit = 100.0 * r.decode_hit_rate();
                let per_token = r.decode_bytes as f64 / MIB / tokens;
                println!(
                    "{name:<22} {mib:>10.1} {:>6.1}% {:<11} {hit:>8.1} {per_token:>12.1} {:>10}",
                    frac * 100.0,
                    policy.name(),
                    r.evictions
                );
                let _ = writeln!(
                    csv,
                    "{name},{mib:.3},{frac:.4},{},{hit:.3},{per_token:.3},{}",
                    policy.name(),
                    r.evictions
                );
            }
        }
    }
    if let Some(p) = &args.csv {
        std::fs::write(p, csv).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
