//! Route traces (`--route-trace`): one row per (token, layer, slot) in the
//! format of the reference engine's traces, and an analyser that measures
//! how skewed and how stable routing is in any such trace.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::engine::{OpenReport, StepReport};
use crate::gguf::ModelFiles;
use crate::moe::recipe::parse_expert_tensor;

/// Expert and dense bytes of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerBytes {
    /// Layer index.
    pub layer: u32,
    /// Bytes of one expert (all projections).
    pub expert_bytes: u64,
    /// Bytes of the layer's other tensors.
    pub dense_bytes: u64,
}

/// Per-layer byte split, from the tensor table.
pub fn layer_bytes(files: &ModelFiles, n_expert: u64) -> Vec<LayerBytes> {
    let mut by_layer: HashMap<u32, (u64, u64)> = HashMap::new();
    for t in files.tensors() {
        let Some(rest) = t.info.name.strip_prefix("blk.") else { continue };
        let Some(layer) = rest.split('.').next().and_then(|l| l.parse::<u32>().ok()) else { continue };
        let slot = by_layer.entry(layer).or_default();
        if parse_expert_tensor(&t.info.name).is_some() {
            slot.0 += t.info.size / n_expert.max(1);
        } else {
            slot.1 += t.info.size;
        }
    }
    let mut v: Vec<LayerBytes> =
        by_layer.into_iter().map(|(layer, (e, d))| LayerBytes { layer, expert_bytes: e, dense_bytes: d }).collect();
    v.sort_by_key(|l| l.layer);
    v
}

/// Writes a route trace.
pub struct RouteTraceSink {
    out: BufWriter<File>,
}

impl RouteTraceSink {
    /// Creates the file and writes the header.
    pub fn create(path: &Path, model: &Path, open: &OpenReport) -> io::Result<RouteTraceSink> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "# route_trace v1")?;
        writeln!(out, "# engine={}", super::engine_version().replace(' ', "_"))?;
        writeln!(
            out,
            "# model={} arch={} n_layer={} n_expert={} n_expert_used={}",
            model.display(),
            open.arch,
            open.n_layer,
            open.n_expert,
            open.n_expert_used
        )?;
        for l in &open.layers {
            writeln!(out, "# layer={} expert_bytes={} dense_bytes={}", l.layer, l.expert_bytes, l.dense_bytes)?;
        }
        writeln!(out, "turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped")?;
        Ok(RouteTraceSink { out })
    }

    /// Appends the routing rows of one decode call and flushes them, so the
    /// file never ends inside a token's rows, even if the process is killed.
    pub fn rows(&mut self, r: &StepReport) -> io::Result<()> {
        use std::fmt::Write as _;
        // One write per decode call: the rows of a call land whole or not at all.
        let mut text = String::with_capacity(r.trace.rows.len() * 40);
        for row in &r.trace.rows {
            let weight = if row.weight.is_nan() { "nan".to_string() } else { format!("{:.6}", row.weight) };
            let _ = writeln!(
                text,
                "{},{},{},{},{},{},{},{},{},{}",
                r.turn,
                r.phase.code(),
                r.first_pos + row.token as i32,
                row.layer,
                row.slot,
                row.expert,
                weight,
                u8::from(row.hit),
                row.bytes,
                u8::from(row.dropped)
            );
        }
        self.out.write_all(text.as_bytes())?;
        self.out.flush()
    }

    /// Flushes the file.
    pub fn finish(mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// How routing behaves in a trace (decode rows only, first `tokens` steps).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStats {
    /// Layers with routing rows.
    pub layers: usize,
    /// Experts per layer (from the header).
    pub n_expert: usize,
    /// Experts per token (from the header).
    pub k: usize,
    /// Decode tokens analysed.
    pub decode_tokens: usize,
    /// Mean over layers of distinct experts used in the window.
    pub distinct_mean: f64,
    /// Fewest distinct experts in one layer.
    pub distinct_min: usize,
    /// Most distinct experts in one layer.
    pub distinct_max: usize,
    /// Mean share of a token's experts also used by the previous token (same layer).
    pub prev_overlap: f64,
    /// Share of routings that went to each layer's most used 10% of experts.
    pub top10_share: f64,
    /// (cache size as a fraction of all (layer, expert) entries, LRU hit rate on decode).
    pub lru_hits: Vec<(f64, f64)>,
}

/// The most experts per layer a trace may declare (real models have up to 512).
const MAX_EXPERTS: usize = 1 << 16;

/// One row of a route trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRow {
    /// Conversation turn.
    pub turn: u32,
    /// 0 prefill, 1 decode.
    pub phase: u8,
    /// Context position of the row's token.
    pub step: i64,
    /// Layer.
    pub layer: u32,
    /// Expert routed.
    pub expert: u32,
    /// The expert was in the cache (the `residency` column).
    pub hit: bool,
    /// A drop policy skipped it (bmoe's `dropped` column; absent in the reference's traces).
    pub dropped: bool,
}

/// A route trace's header and rows, checked against each other.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedTrace {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts per token.
    pub k: usize,
    /// Bytes of one expert of each layer, from the `# layer=` lines.
    pub expert_bytes: HashMap<u32, u64>,
    /// The rows, in file order.
    pub rows: Vec<TraceRow>,
}

/// Parses a route trace (ours or the reference engine's): `#` header lines,
/// then `turn,phase,step,layer,slot,expert,weight,residency,expert_bytes[,dropped]` rows.
pub fn parse(text: &str) -> Result<ParsedTrace, String> {
    let mut n_expert = None;
    let mut k = None;
    let mut expert_bytes = HashMap::new();
    let mut rows = Vec::new();
    for (no, line) in text.lines().enumerate() {
        if let Some(h) = line.strip_prefix('#') {
            let mut layer = None;
            for kv in h.split_whitespace() {
                match kv.split_once('=') {
                    Some(("n_expert", v)) => n_expert = v.parse().ok(),
                    Some(("n_expert_used", v)) => k = v.parse().ok(),
                    Some(("layer", v)) => layer = v.parse::<u32>().ok(),
                    Some(("expert_bytes", v)) => {
                        if let (Some(l), Ok(b)) = (layer, v.parse::<u64>()) {
                            expert_bytes.insert(l, b);
                        }
                    }
                    _ => {}
                }
            }
            continue;
        }
        if line.starts_with("turn") || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        let bad = || format!("line {}: not a route-trace row: {line:?}", no + 1);
        if f.len() < 9 {
            return Err(bad());
        }
        rows.push(TraceRow {
            turn: f[0].parse().map_err(|_| bad())?,
            phase: f[1].parse().map_err(|_| bad())?,
            step: f[2].parse().map_err(|_| bad())?,
            layer: f[3].parse().map_err(|_| bad())?,
            expert: f[5].parse().map_err(|_| bad())?,
            hit: f[7] == "1",
            dropped: f.get(9).is_some_and(|d| *d == "1"),
        });
    }
    let n_expert: usize = n_expert.ok_or("header has no n_expert")?;
    let k: usize = k.ok_or("header has no n_expert_used")?;
    if !(1..=MAX_EXPERTS).contains(&n_expert) {
        return Err(format!("header: n_expert={n_expert} is not a plausible expert count (1..={MAX_EXPERTS})"));
    }
    if !(1..=n_expert).contains(&k) {
        return Err(format!("header: n_expert_used={k} must be in 1..={n_expert}"));
    }
    if let Some(r) = rows.iter().find(|r| r.expert as usize >= n_expert) {
        return Err(format!("a row routes expert {} but the header says n_expert={n_expert}", r.expert));
    }
    Ok(ParsedTrace { n_expert, k, expert_bytes, rows })
}

/// One trace row for the analysis: (phase, step, layer, expert).
type Row = (u8, i64, u32, u32);

/// Parses and analyses a route trace (ours or the reference engine's).
pub fn analyze(text: &str, max_decode_tokens: usize, fractions: &[f64]) -> Result<TraceStats, String> {
    let ParsedTrace { n_expert, k, rows, .. } = parse(text)?;
    let rows: Vec<Row> = rows.iter().map(|r| (r.phase, r.step, r.layer, r.expert)).collect();
    let mut decode_steps: Vec<i64> = rows.iter().filter(|r| r.0 == 1).map(|r| r.1).collect();
    decode_steps.dedup();
    let window: HashSet<i64> = decode_steps.iter().copied().take(max_decode_tokens).collect();
    let in_window = |r: &Row| r.0 == 1 && window.contains(&r.1);

    // Per layer: experts per decode step.
    let mut per_layer: HashMap<u32, HashMap<i64, Vec<u32>>> = HashMap::new();
    for r in rows.iter().filter(|r| in_window(r)) {
        per_layer.entry(r.2).or_default().entry(r.1).or_default().push(r.3);
    }
    if per_layer.is_empty() {
        return Err("the trace has no decode rows".into());
    }
    let mut distinct = Vec::new();
    let mut overlaps = Vec::new();
    let mut top10 = Vec::new();
    let mut steps: Vec<i64> = window.iter().copied().collect();
    steps.sort_unstable();
    for by_step in per_layer.values() {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for experts in by_step.values() {
            for &e in experts {
                *counts.entry(e).or_default() += 1;
            }
        }
        distinct.push(counts.len());
        let mut c: Vec<usize> = counts.values().copied().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let total: usize = c.iter().sum();
        let top: usize = c.iter().take((n_expert / 10).max(1)).sum();
        top10.push(top as f64 / total.max(1) as f64);
        for pair in steps.windows(2) {
            if let (Some(a), Some(b)) = (by_step.get(&pair[0]), by_step.get(&pair[1])) {
                let shared = b.iter().filter(|e| a.contains(e)).count();
                overlaps.push(shared as f64 / k as f64);
            }
        }
    }
    let layers = per_layer.len();
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let lru_hits = fractions
        .iter()
        .map(|&frac| {
            let cap = ((frac * layers as f64 * n_expert as f64) as usize).max(1);
            (frac, lru_hit_rate(&rows, cap, &in_window))
        })
        .collect();
    Ok(TraceStats {
        layers,
        n_expert,
        k,
        decode_tokens: window.len(),
        distinct_mean: distinct.iter().sum::<usize>() as f64 / layers as f64,
        distinct_min: distinct.iter().copied().min().unwrap_or(0),
        distinct_max: distinct.iter().copied().max().unwrap_or(0),
        prev_overlap: mean(&overlaps),
        top10_share: mean(&top10),
        lru_hits,
    })
}

/// Replays prefill and the decode window through a global LRU of `cap`
/// (layer, expert) entries; returns the hit rate over decode rows.
fn lru_hit_rate(rows: &[Row], cap: usize, in_window: &dyn Fn(&Row) -> bool) -> f64 {
    // Recency stamps with lazy deletion from a queue: O(rows) amortized.
    let mut stamp: HashMap<(u32, u32), u64> = HashMap::new();
    let mut queue: VecDeque<((u32, u32), u64)> = VecDeque::new();
    let (mut clock, mut hits, mut lookups) = (0u64, 0u64, 0u64);
    for r in rows.iter().filter(|r| r.0 == 0 || in_window(r)) {
        let key = (r.2, r.3);
        clock += 1;
        let hit = stamp.contains_key(&key);
        stamp.insert(key, clock);
        queue.push_back((key, clock));
        while stamp.len() > cap {
            let (old, at) = queue.pop_front().expect("queue holds every live key");
            if stamp.get(&old) == Some(&at) {
                stamp.remove(&old);
            }
        }
        if r.0 == 1 {
            lookups += 1;
            hits += u64::from(hit);
        }
    }
    hits as f64 / lookups.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn analyses_a_small_trace() {
        // 2 layers, 10 experts, k=2; three decode steps.
        let mut t = String::from("# route_trace v1\n# model=x arch=qwen3moe n_layer=2 n_expert=10 n_expert_used=2\n");
        t.push_str("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes\n");
        let steps = [[1, 2], [1, 3], [1, 2]];
        for (i, s) in steps.iter().enumerate() {
            for layer in 0..2 {
                for (slot, e) in s.iter().enumerate() {
                    t.push_str(&format!("0,1,{},{layer},{slot},{},0.5,0,0\n", 10 + i, e + layer * 4));
                }
            }
        }
        let st = analyze(&t, 100, &[0.1, 0.5]).unwrap();
        assert_eq!(st.layers, 2);
        assert_eq!(st.decode_tokens, 3);
        assert_eq!(st.distinct_mean, 3.0);
        assert!((st.prev_overlap - 0.5).abs() < 1e-9);
        // Top 10% of 10 experts = 1 expert per layer, used in all 3 steps of 6 routings.
        assert!((st.top10_share - 0.5).abs() < 1e-9);
        // Cap of 2 entries (10%): hits only when the expert was just used.
        // Cap of 10 (50%): misses only on first use (6 of 12 are first uses? 3 distinct per layer).
        assert!((st.lru_hits[1].1 - 6.0 / 12.0).abs() < 1e-9);
        assert!(analyze("garbage\n", 10, &[0.1]).is_err());
        // Absurd headers and rows are refused, not overflowed on.
        let huge = t.replace("n_expert=10 ", "n_expert=99999999999999 ");
        assert!(analyze(&huge, 100, &[0.5]).unwrap_err().contains("not a plausible expert count"));
        let zero_k = t.replace("n_expert_used=2", "n_expert_used=0");
        assert!(analyze(&zero_k, 100, &[0.5]).unwrap_err().contains("n_expert_used=0"));
        let out_of_range = format!("{t}0,1,99,0,0,12,0.5,0,0\n");
        assert!(analyze(&out_of_range, 100, &[0.5]).unwrap_err().contains("routes expert 12"));
    }
}
