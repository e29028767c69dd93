//! What each configuration of the matrix costs in quality: `bmoe eval` run
//! once under the same memory cap (a drop policy drops cache misses, so
//! what it drops depends on the memory it finds), every configuration
//! teacher-forced against the exact run (the model streamed with only the
//! common flags: streaming is lossless, and fast under a cap), and summed up
//! per configuration as KL divergence and top-1 agreement for the table
//! beside its speed and bytes read.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::process::Stdio;

use super::{Plan, Summary};
use crate::eval::{KlStats, Position, kl_text};

/// One configuration's quality against the exact run.
#[derive(Debug, Clone, PartialEq)]
pub struct Quality {
    /// Configuration name.
    pub config: String,
    /// Its KL figures; `None` for a configuration with no flags of its own
    /// (the exact run itself) or none of whose timed runs finished.
    pub stats: Option<KlStats>,
    /// None of its timed runs finished, so it was not scored.
    pub failed: bool,
}

/// Runs `bmoe eval` over `positions` tokens of the bundled sample text,
/// under the plan's cap, with one `--against` per configuration that has
/// flags of its own and is not in `failed` (configurations none of whose
/// timed runs finished; their error is in the table above), its progress
/// on stderr, and reads its per-position CSV back.
pub fn measure(plan: &Plan, positions: usize, failed: &[String]) -> Result<Vec<Quality>, String> {
    let csv = plan.work.join(format!("{}-quality.csv", plan.pass));
    let _ = std::fs::remove_file(&csv);
    let mut args: Vec<String> = vec![
        "eval".into(),
        "-m".into(),
        plan.model.display().to_string(),
        "--tokens".into(),
        positions.to_string(),
        "--csv".into(),
        csv.display().to_string(),
        "--moe-stream".into(),
    ];
    args.extend(plan.common.iter().cloned());
    // Configuration names are unique (`bmoe bench` refuses two alike).
    let scored: Vec<_> = plan.configs.iter().filter(|c| !c.flags.is_empty() && !failed.contains(&c.name)).collect();
    for c in &scored {
        args.push("--against".into());
        args.push(format!("{}={}", c.name, c.flags.join(" ")));
    }
    if !scored.is_empty() {
        let cgroup = plan.cgroup()?;
        let status = super::bmoe_command(&plan.bmoe, cgroup.as_ref())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("starting {}: {e}", plan.bmoe.display()))?;
        if !status.success() {
            return Err(format!("bmoe eval failed ({status}); its message is above"));
        }
    }
    let per_setting = match scored.is_empty() {
        true => BTreeMap::new(),
        false => read_csv(&std::fs::read_to_string(&csv).map_err(|e| format!("{}: {e}", csv.display()))?)?,
    };
    Ok(plan
        .configs
        .iter()
        .map(|c| Quality {
            config: c.name.clone(),
            stats: per_setting.get(&c.name).and_then(|p| KlStats::of(p)),
            failed: failed.contains(&c.name),
        })
        .collect())
}

/// Parses `bmoe eval --csv` (`setting,position,kl,same_top1`) into each
/// setting's positions.
fn read_csv(text: &str) -> Result<BTreeMap<String, Vec<Position>>, String> {
    let mut out: BTreeMap<String, Vec<Position>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let [setting, _, kl, top1] = fields[..] else {
            return Err(format!("eval CSV line {}: {line:?} is not setting,position,kl,same_top1", i + 1));
        };
        let kl: f64 = kl.parse().map_err(|_| format!("eval CSV line {}: kl {kl:?} is not a number", i + 1))?;
        out.entry(setting.to_string()).or_default().push(Position { kl, same_top1: top1 == "1" });
    }
    Ok(out)
}

/// The quality table: each configuration's KL and top-1 agreement beside
/// its median decode speed and MiB read per token in `summaries`.
pub fn table(quality: &[Quality], summaries: &[Summary], pass: &str, positions: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "quality: against the exact run (streamed, common flags only), {positions} positions of the bundled \
         sample text, teacher-forced under the same cap"
    );
    let _ = writeln!(
        out,
        "  {:<18} {:>9} {:>9} {:>9} {:>7} {:>12} {:>8}",
        "config", "mean KL", "p99", "max", "top-1", "decode tok/s", "MiB/tok"
    );
    for q in quality {
        let summary = summaries.iter().find(|s| s.pass == pass && s.config == q.config);
        let decode = summary.and_then(|s| s.decode).map_or_else(|| "-".into(), |d| format!("{:.2}", d.0));
        let mib = summary.and_then(|s| s.mib_per_token).map_or_else(|| "-".into(), |m| format!("{m:.1}"));
        let (mean, p99, max, top1) = match &q.stats {
            Some(s) => (kl_text(s.mean), kl_text(s.p99), kl_text(s.max), format!("{:.1}%", 100.0 * s.top1_agreement)),
            None if q.failed => ("failed".into(), "".into(), "".into(), "".into()),
            None => ("exact".into(), "".into(), "".into(), "".into()),
        };
        let _ = writeln!(out, "  {:<18} {mean:>9} {p99:>9} {max:>9} {top1:>7} {decode:>12} {mib:>8}", q.config);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eval_csv_is_read_per_setting() {
        let text = "setting,position,kl,same_top1\ntop4,0,0.010000000,1\ntop4,1,0.030000000,0\nc0,0,0.000000000,1\n";
        let parsed = read_csv(text).unwrap();
        let top4 = KlStats::of(&parsed["top4"]).unwrap();
        assert!((top4.mean - 0.02).abs() < 1e-12);
        assert_eq!(top4.top1_agreement, 0.5);
        assert_eq!(KlStats::of(&parsed["c0"]).unwrap().max, 0.0);
        assert!(read_csv("setting,position,kl,same_top1\ntop4,0,x,1\n").unwrap_err().contains("line 2"));
        assert!(read_csv("h\na,b\n").is_err());
    }
}
