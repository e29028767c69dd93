//! The harness's table and CSV: runs grouped by configuration, medians with
//! the spread of decode speed, and ratios to the mmap baseline and to the
//! disk probe.

use std::fmt::Write as _;
use std::path::Path;

use super::RunResult;
use super::probe::Probe;

/// One configuration's runs, summarized.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    /// Pass label.
    pub pass: String,
    /// Configuration name.
    pub config: String,
    /// Its runs were outside the memory cap.
    pub uncapped: bool,
    /// Runs that finished / all runs.
    pub ok: usize,
    /// All runs.
    pub runs: usize,
    /// Runs the OOM killer killed.
    pub oom_kills: usize,
    /// Decode tok/s: median, min, max over finished runs.
    pub decode: Option<(f64, f64, f64)>,
    /// Medians of the other figures.
    pub prefill_tok_s: Option<f64>,
    /// MiB read per decoded token.
    pub mib_per_token: Option<f64>,
    /// Cache hit rate, percent.
    pub hit_pct: Option<f64>,
    /// Per decoded token: read, cache management, compute (residual), ms.
    pub split_ms: Option<(f64, f64, f64)>,
    /// Expert read speed during decode, MiB/s.
    pub read_mib_s: Option<f64>,
    /// The read lanes' CPU time per decoded token, ms.
    pub lane_cpu_ms: Option<f64>,
    /// Peak RSS, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Major page faults of the run.
    pub major_faults: Option<f64>,
    /// Bytes read while opening, MiB.
    pub open_read_mib: Option<f64>,
    /// Peak resident set when the open finished, MiB.
    pub open_peak_rss_mib: Option<f64>,
    /// Load time, s.
    pub load_s: Option<f64>,
    /// The cache budget in effect, MiB.
    pub cache_budget_mib: Option<f64>,
    /// The first failure's reason.
    pub error: Option<String>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// Groups runs by (pass, configuration), in first-seen order.
pub fn summarize(results: &[RunResult]) -> Vec<Summary> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in results {
        let key = (r.pass.clone(), r.config.clone());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(pass, config)| {
            let runs: Vec<&RunResult> = results.iter().filter(|r| r.pass == pass && r.config == config).collect();
            let done: Vec<&RunResult> = runs.iter().copied().filter(|r| r.ok).collect();
            let med = |key: &str| median(done.iter().filter_map(|r| r.get(key)).collect());
            let per_token = |r: &RunResult, key: &str| Some(r.get(key)? / r.get("tokens").filter(|&t| t > 0.0)?);
            let split = {
                let read = median(done.iter().filter_map(|r| per_token(r, "read_ms")).collect());
                let mgmt = median(done.iter().filter_map(|r| per_token(r, "mgmt_ms")).collect());
                let wall = median(done.iter().filter_map(|r| per_token(r, "decode_ms")).collect());
                match (read, mgmt, wall) {
                    (Some(r), Some(m), Some(w)) => Some((r, m, (w - r - m).max(0.0))),
                    _ => None,
                }
            };
            let read_mib_s = median(
                done.iter()
                    // With read-ahead the read time is only the wait for reads
                    // that ran behind compute: no speed can be taken from it.
                    .filter(|r| r.get("prefetched").is_none_or(|n| n == 0.0))
                    .filter_map(|r| {
                        let mib = r.get("read_mib_per_token")? * r.get("tokens")?;
                        let s = r.get("read_ms")? / 1000.0;
                        (s > 0.0 && mib > 0.0).then(|| mib / s)
                    })
                    .collect(),
            );
            let decode: Vec<f64> = done.iter().filter_map(|r| r.get("decode_tok_s")).collect();
            let spread = median(decode.clone()).map(|m| {
                (m, decode.iter().copied().fold(f64::INFINITY, f64::min), decode.iter().copied().fold(0.0, f64::max))
            });
            Summary {
                ok: done.len(),
                runs: runs.len(),
                oom_kills: runs.iter().filter(|r| r.oom_killed).count(),
                decode: spread,
                prefill_tok_s: med("prefill_tok_s"),
                mib_per_token: med("read_mib_per_token"),
                hit_pct: med("hit_pct"),
                split_ms: split,
                read_mib_s,
                lane_cpu_ms: median(done.iter().filter_map(|r| per_token(r, "lane_cpu_ms")).collect()),
                peak_rss_mib: med("peak_rss_mib"),
                major_faults: med("major_faults"),
                open_read_mib: med("open_read_mib"),
                open_peak_rss_mib: med("open_peak_rss_mib"),
                load_s: med("load_s"),
                cache_budget_mib: med("cache_budget_mib"),
                error: runs.iter().find_map(|r| r.error.clone()),
                uncapped: runs.iter().any(|r| r.uncapped),
                pass,
                config,
            }
        })
        .collect()
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.digits$}"))
}

/// The table: one row per configuration, ratios to the pass's `mmap` row
/// and read speed as a share of the disk probe at the same lane count.
pub fn table(summaries: &[Summary], probes: &[Probe]) -> String {
    let mut out = String::new();
    for p in probes {
        let _ = writeln!(
            out,
            "disk probe: {} lane(s), {} KiB reads{}: {:.0} MiB/s",
            p.lanes,
            p.read_bytes / 1024,
            if p.o_direct { ", O_DIRECT" } else { ", buffered" },
            p.mib_s
        );
    }
    let best_probe = probes.iter().map(|p| p.mib_s).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "{:<6} {:<18} {:>5} {:>22} {:>7} {:>8} {:>8} {:>6} {:>22} {:>9} {:>9} {:>12} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
        "pass",
        "config",
        "runs",
        "decode tok/s med [min-max]",
        "vs mmap",
        "prefill",
        "MiB/tok",
        "hit%",
        "read/mgmt/compute ms",
        "read MiB/s",
        "vs probe",
        "lanes CPU ms",
        "peak RSS",
        "majflt",
        "open MiB",
        "open RSS",
        "load s",
        "OOM",
    );
    for s in summaries {
        let base =
            summaries.iter().find(|b| b.pass == s.pass && b.config == "mmap").and_then(|b| b.decode).map(|d| d.0);
        let decode = s.decode.map_or_else(|| "-".into(), |(m, lo, hi)| format!("{m:.2} [{lo:.2}-{hi:.2}]"));
        let ratio = match (s.decode, base) {
            (Some((m, _, _)), Some(b)) if b > 0.0 => format!("{:.1}x", m / b),
            _ => "-".into(),
        };
        let split = s.split_ms.map_or_else(|| "-".into(), |(r, m, c)| format!("{r:.1}/{m:.1}/{c:.1}"));
        let vs_probe = match s.read_mib_s {
            Some(r) if best_probe > 0.0 => format!("{:.0}%", 100.0 * r / best_probe),
            _ => "-".into(),
        };
        let _ = writeln!(
            out,
            "{:<6} {:<18} {:>5} {:>22} {:>7} {:>8} {:>8} {:>6} {:>22} {:>9} {:>9} {:>12} {:>9} {:>9} {:>8} {:>8} {:>6} {:>6}",
            s.pass,
            if s.uncapped { format!("{} (no cap)", s.config) } else { s.config.clone() },
            format!("{}/{}", s.ok, s.runs),
            decode,
            ratio,
            num(s.prefill_tok_s, 1),
            num(s.mib_per_token, 1),
            num(s.hit_pct, 1),
            split,
            num(s.read_mib_s, 0),
            vs_probe,
            num(s.lane_cpu_ms, 2),
            num(s.peak_rss_mib, 0),
            num(s.major_faults, 0),
            num(s.open_read_mib, 0),
            num(s.open_peak_rss_mib, 0),
            num(s.load_s, 1),
            s.oom_kills,
        );
        if let Some(e) = s.error.as_ref().filter(|_| s.ok < s.runs) {
            let _ = writeln!(out, "       {}: {e}", s.config);
        }
    }
    out.push_str(&against_baseline(summaries));
    out
}

/// Each capped configuration's decode and prefill speed as a fraction of
/// the pass's first uncapped one (the baseline), when the pass has one.
fn against_baseline(summaries: &[Summary]) -> String {
    let mut out = String::new();
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    };
    let mut passes: Vec<&str> = Vec::new();
    for s in summaries {
        if !passes.contains(&s.pass.as_str()) {
            passes.push(&s.pass);
        }
    }
    for pass in passes {
        let Some(base) = summaries.iter().find(|s| s.uncapped && s.pass == pass) else { continue };
        let _ = writeln!(out, "{}: against {} (no cap)", base.pass, base.config);
        for s in summaries.iter().filter(|s| s.pass == pass && !s.uncapped) {
            let _ = writeln!(
                out,
                "  {:<18} decode {:>6}  prefill {:>6}",
                s.config,
                ratio(s.decode.map(|d| d.0), base.decode.map(|d| d.0)),
                ratio(s.prefill_tok_s, base.prefill_tok_s),
            );
        }
    }
    out
}

/// Every run as a CSV row.
pub fn write_csv(path: &Path, results: &[RunResult]) -> std::io::Result<()> {
    const KEYS: &[&str] = &[
        "decode_tok_s",
        "prefill_tok_s",
        "tokens",
        "read_mib_per_token",
        "hit_pct",
        "decode_ms",
        "read_ms",
        "mgmt_ms",
        "remote_ms",
        "peak_rss_mib",
        "major_faults",
        "open_read_mib",
        "open_peak_rss_mib",
        "load_s",
        "cache_budget_mib",
        "evictions",
        "decode_steps",
        "drafted",
        "accepted",
        "lane_cpu_ms",
    ];
    let mut out = String::from("pass,config,rep,ok,oom_killed,cgroup_peak_mib");
    for k in KEYS {
        out.push(',');
        out.push_str(k);
    }
    out.push_str(",error\n");
    for r in results {
        let peak = r.cgroup_peak.map_or_else(|| "nan".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
        let _ = write!(out, "{},{},{},{},{},{peak}", r.pass, r.config, r.rep, r.ok, r.oom_killed);
        for k in KEYS {
            let _ = write!(out, ",{}", r.fields.get(*k).map_or("nan", String::as_str));
        }
        let error = r.error.as_deref().unwrap_or("").replace([',', '\n'], ";");
        let _ = writeln!(out, ",{error}");
    }
    std::fs::write(path, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: &str, rep: usize, tok_s: &str, ok: bool) -> RunResult {
        let mut r = RunResult { pass: "quiet".into(), config: config.into(), rep, ok, ..RunResult::default() };
        for (k, v) in [
            ("decode_tok_s", tok_s),
            ("tokens", "10"),
            ("decode_ms", "1000"),
            ("read_ms", "400"),
            ("mgmt_ms", "100"),
            ("read_mib_per_token", "20"),
        ] {
            r.fields.insert(k.into(), v.into());
        }
        r
    }

    #[test]
    fn summarizes_and_prints_ratios() {
        let results = vec![
            run("mmap", 1, "0.3", true),
            run("stream", 1, "6.0", true),
            run("mmap", 2, "0.2", true),
            run("stream", 2, "4.0", true),
            run("stream", 3, "9.0", true),
            RunResult {
                oom_killed: true,
                error: Some("killed by the OOM killer".into()),
                ..run("stream", 4, "nan", false)
            },
        ];
        let s = summarize(&results);
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].decode, Some((6.0, 4.0, 9.0)));
        assert_eq!((s[1].ok, s[1].runs, s[1].oom_kills), (3, 4, 1));
        assert_eq!(s[1].split_ms, Some((40.0, 10.0, 50.0)));
        // 200 MiB read in 0.4 s.
        assert_eq!(s[1].read_mib_s, Some(500.0));
        let probes = [Probe { lanes: 4, read_bytes: 1 << 20, mib_s: 1000.0, o_direct: true }];
        let t = table(&s, &probes);
        assert!(t.contains("24.0x"), "6.0 / median(0.3, 0.2) = 24x:\n{t}");
        assert!(t.contains("50%") && t.contains("killed by the OOM killer"), "{t}");
        assert!(!t.contains("no cap"), "no baseline, no ratios:\n{t}");
        let mut with_base = results.clone();
        let mut base = run("resident", 1, "12.0", true);
        base.uncapped = true;
        base.fields.insert("prefill_tok_s".into(), "40".into());
        with_base.push(base);
        with_base[1].fields.insert("prefill_tok_s".into(), "30".into());
        let t = table(&summarize(&with_base), &probes);
        assert!(t.contains("resident (no cap)"), "{t}");
        let line = t.lines().find(|l| l.trim_start().starts_with("stream ")).unwrap();
        assert!(line.contains("decode  0.50x") && line.contains("prefill  0.75x"), "6/12 and 30/40:\n{t}");
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("b.csv");
        write_csv(&csv, &results).unwrap();
        let text = std::fs::read_to_string(&csv).unwrap();
        assert_eq!(text.lines().count(), 7);
        assert!(
            text.starts_with("pass,config,rep,") && text.contains(",decode_steps,drafted,accepted,lane_cpu_ms,error\n"),
            "{text}"
        );
    }
}
