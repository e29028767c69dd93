//! The per-token CSV (`--csv`): a `#` preamble with the engine version and
//! the full resolved configuration, one row per decode call, a `# summary`
//! trailer. Columns are documented in `docs/telemetry.md`.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use crate::engine::{OpenReport, StepReport};
use crate::telemetry::summary::RunSummary;

/// Column names, in order.
pub const COLUMNS: &[&str] = &[
    "turn",
    "phase",
    "step",
    "pos",
    "tokens",
    "wall_ms",
    "read_ms",
    "mgmt_ms",
    "compute_ms_residual",
    "read_bytes",
    "window_bytes",
    "lookups",
    "hits",
    "evictions",
    "cache_budget_mib",
    "cache_resident_mib",
    "rss_mib",
    "rss_anon_mib",
    "rss_file_mib",
    "mem_available_mib",
    "drafted",
    "accepted",
    "dropped",
    "avoided_bytes",
    "threads",
    "read_ahead",
    "lane_cpu_ms",
];

/// Writes the metrics CSV.
pub struct CsvSink {
    out: BufWriter<File>,
}

fn ms(ns: u64) -> String {
    format!("{:.3}", ns as f64 / 1e6)
}

fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / 1048576.0)
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "nan".into(), |x| format!("{x:.1}"))
}

impl CsvSink {
    /// Creates the file and writes the preamble and header.
    pub fn create(path: &Path, config: &[(String, String)], open: &OpenReport) -> io::Result<CsvSink> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "# bmoe_metrics v1")?;
        writeln!(out, "# engine={}", super::engine_version().replace(' ', "_"))?;
        let cfg: Vec<String> = config.iter().map(|(k, v)| format!("{k}={}", v.replace(' ', "_"))).collect();
        writeln!(out, "# config {}", cfg.join(" "))?;
        writeln!(
            out,
            "# open arch={} n_layer={} n_expert={} n_expert_used={} streamed_layers={} bank_mib={} io_threads={} o_direct={} load_s={:.3} cache_budget_mib={} open_read_mib={} open_peak_rss_mib={}",
            open.arch,
            open.n_layer,
            open.n_expert,
            open.n_expert_used,
            open.streamed_layers,
            mib(open.bank_bytes),
            open.io_threads,
            open.o_direct,
            open.load_s,
            mib(open.cache_budget),
            open.open_read_bytes.map_or_else(|| "nan".into(), mib),
            open.open_peak_rss_mib.map_or_else(|| "nan".into(), |m| format!("{m:.1}"))
        )?;
        writeln!(out, "{}", COLUMNS.join(","))?;
        Ok(CsvSink { out })
    }

    /// Appends one row and flushes it, so the file holds every finished
    /// decode call even if the process is killed.
    pub fn row(&mut self, r: &StepReport) -> io::Result<()> {
        writeln!(self.out, "{}", row_fields(r).join(","))?;
        self.out.flush()
    }

    /// Writes the summary trailer and flushes.
    pub fn finish(mut self, s: &RunSummary) -> io::Result<()> {
        let f = |v: Option<f64>| v.map_or_else(|| "nan".into(), |x| format!("{x:.3}"));
        writeln!(
            self.out,
            "# summary tokens={} decode_tok_s={} prefill_tokens={} prefill_tok_s={} read_mib_per_token={} hit_pct={} evictions={} load_s={:.3} decode_steps={} drafted={} accepted={} verify_steps={} draft_extra_mib={:.3} routings={} dropped={} avoided_mib={:.3} decode_ms={:.3} read_ms={:.3} mgmt_ms={:.3} peak_rss_mib={} major_faults={} prefetched={} prefetch_used={} predict_pct={} threads={} read_ahead_steps={} recycled_mib={:.3} remote_ms={:.3} lane_cpu_ms={:.3}",
            s.decode_tokens,
            f(s.decode_tps()),
            s.prompt_tokens,
            f(s.prefill_tps()),
            f(s.mib_per_token()),
            f(s.hit_rate_pct()),
            s.evictions,
            s.load_s,
            s.decode_steps,
            s.drafted,
            s.accepted,
            s.verify_steps,
            s.draft_extra_bytes as f64 / 1048576.0,
            s.routings,
            s.dropped,
            s.avoided_bytes as f64 / 1048576.0,
            s.decode_ns as f64 / 1e6,
            s.decode_read_ns as f64 / 1e6,
            s.decode_mgmt_ns as f64 / 1e6,
            f(s.peak_rss_mib),
            super::mem::major_faults().map_or_else(|| "nan".into(), |m| m.to_string()),
            s.prefetched,
            s.prefetch_used,
            f(s.prediction_pct()),
            s.main_threads(),
            s.read_ahead_steps,
            s.recycled_bytes as f64 / 1048576.0,
            s.decode_remote_ns as f64 / 1e6,
            s.decode_lane_cpu_ns as f64 / 1e6
        )?;
        self.out.flush()
    }
}

/// The fields of one CSV row, in [`COLUMNS`] order, as the file writes them.
pub fn row_fields(r: &StepReport) -> [String; 27] {
    let t = &r.trace;
    [
        r.turn.to_string(),
        r.phase.code().to_string(),
        r.step.to_string(),
        r.first_pos.to_string(),
        r.tokens.to_string(),
        ms(r.wall_ns),
        ms(t.read_ns),
        ms(t.mgmt_ns),
        ms(r.compute_residual_ns()),
        t.bytes_read.to_string(),
        t.window_bytes.to_string(),
        t.lookups.to_string(),
        t.hits.to_string(),
        t.evictions.to_string(),
        mib(r.cache_budget),
        mib(r.cache_resident),
        opt(r.mem.rss_mib),
        opt(r.mem.rss_anon_mib),
        opt(r.mem.rss_file_mib),
        opt(r.mem.available_mib),
        r.drafted.to_string(),
        r.accepted.to_string(),
        t.dropped.to_string(),
        t.avoided_bytes.to_string(),
        r.threads.to_string(),
        u8::from(r.read_ahead).to_string(),
        ms(t.lane_cpu_ns),
    ]
}
