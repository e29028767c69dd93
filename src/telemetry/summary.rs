//! The end-of-run summary: decode and prefill speed, bytes read per token,
//! cache hit rate and load time.

use std::fmt;

use crate::engine::{Phase, StepReport};

/// Totals over one generation.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Seconds to open the session (model load, capture, lanes).
    pub load_s: f64,
    /// Prompt tokens processed.
    pub prompt_tokens: u64,
    /// Wall nanoseconds of prefill decodes.
    pub prefill_ns: u64,
    /// Tokens generated.
    pub generated: u64,
    /// Decode calls after prefill.
    pub decode_steps: u64,
    /// Wall nanoseconds of those decodes.
    pub decode_ns: u64,
    /// Bytes requested from storage during decode steps.
    pub decode_bytes: u64,
    /// Read time during decode steps.
    pub decode_read_ns: u64,
    /// Cache-management time during decode steps.
    pub decode_mgmt_ns: u64,
    /// Distinct (layer, expert) lookups during decode steps.
    pub lookups: u64,
    /// Lookups that hit the cache.
    pub hits: u64,
    /// Evictions during decode steps.
    pub evictions: u64,
    /// Bytes read during prefill.
    pub prefill_bytes: u64,
    /// Whether experts were streamed.
    pub streaming: bool,
    /// Whether the LRU cache was on.
    pub cached: bool,
    /// Largest resident set seen, MiB.
    pub peak_rss_mib: Option<f64>,
}

const MIB: f64 = 1024.0 * 1024.0;

impl RunSummary {
    /// Adds one decode call.
    pub fn add(&mut self, r: &StepReport) {
        self.peak_rss_mib = match (self.peak_rss_mib, r.mem.rss_mib) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        match r.phase {
            Phase::Prefill => {
                self.prompt_tokens += u64::from(r.tokens);
                self.prefill_ns += r.wall_ns;
                self.prefill_bytes += r.trace.bytes_read;
            }
            Phase::Decode => {
                self.decode_steps += 1;
                self.decode_ns += r.wall_ns;
                self.decode_bytes += r.trace.bytes_read;
                self.decode_read_ns += r.trace.read_ns;
                self.decode_mgmt_ns += r.trace.mgmt_ns;
                self.lookups += r.trace.lookups;
                self.hits += r.trace.hits;
                self.evictions += r.trace.evictions;
            }
        }
    }

    /// Decode tokens per second (None before any decode step).
    pub fn decode_tps(&self) -> Option<f64> {
        (self.decode_steps > 0 && self.decode_ns > 0).then(|| self.decode_steps as f64 / (self.decode_ns as f64 / 1e9))
    }

    /// Prefill tokens per second.
    pub fn prefill_tps(&self) -> Option<f64> {
        (self.prompt_tokens > 0 && self.prefill_ns > 0)
            .then(|| self.prompt_tokens as f64 / (self.prefill_ns as f64 / 1e9))
    }

    /// MiB read per decode step.
    pub fn mib_per_token(&self) -> Option<f64> {
        (self.decode_steps > 0).then(|| self.decode_bytes as f64 / MIB / self.decode_steps as f64)
    }

    /// Cache hit rate in percent (None with the cache off or no lookups).
    pub fn hit_rate_pct(&self) -> Option<f64> {
        (self.cached && self.lookups > 0).then(|| 100.0 * self.hits as f64 / self.lookups as f64)
    }
}

fn opt(v: Option<f64>, digits: usize, unit: &str) -> String {
    v.map_or_else(|| "n/a".to_string(), |x| format!("{x:.digits$}{unit}"))
}

impl fmt::Display for RunSummary {
    /// A few lines for stderr.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "decode:  {} tokens in {:.2} s ({} tok/s) | prefill: {} tokens ({} tok/s) | load {:.2} s",
            self.decode_steps,
            self.decode_ns as f64 / 1e9,
            opt(self.decode_tps(), 2, ""),
            self.prompt_tokens,
            opt(self.prefill_tps(), 1, ""),
            self.load_s
        )?;
        if self.streaming {
            let per = |ns: u64| {
                if self.decode_steps == 0 { 0.0 } else { ns as f64 / 1e6 / self.decode_steps as f64 }
            };
            let compute = self.decode_ns.saturating_sub(self.decode_read_ns + self.decode_mgmt_ns);
            writeln!(
                f,
                "stream:  {} MiB/token read | per token: read {:.2} ms, cache mgmt {:.2} ms, compute {:.2} ms (residual)",
                opt(self.mib_per_token(), 2, ""),
                per(self.decode_read_ns),
                per(self.decode_mgmt_ns),
                per(compute)
            )?;
            if self.cached {
                writeln!(f, "cache:   {} hit rate, {} evictions", opt(self.hit_rate_pct(), 1, "%"), self.evictions)?;
            }
        }
        if let Some(rss) = self.peak_rss_mib {
            writeln!(f, "memory:  peak RSS {rss:.0} MiB")?;
        }
        Ok(())
    }
}
