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
    /// Tokens those calls advanced the context by (more than the calls
    /// when speculative decoding accepts drafts).
    pub decode_tokens: u64,
    /// Wall nanoseconds of those decodes.
    pub decode_ns: u64,
    /// Bytes requested from storage during decode steps.
    pub decode_bytes: u64,
    /// Read time during decode steps.
    pub decode_read_ns: u64,
    /// Cache-management time during decode steps.
    pub decode_mgmt_ns: u64,
    /// CPU time the read lanes spent during decode steps.
    pub decode_lane_cpu_ns: u64,
    /// Slices read through io_uring into registered memory during decode steps.
    pub decode_fixed_slices: u64,
    /// Time decode steps waited for RPC servers (their compute and the network).
    pub decode_remote_ns: u64,
    /// Distinct (layer, expert) lookups during decode steps.
    pub lookups: u64,
    /// Lookups that hit the cache.
    pub hits: u64,
    /// Evictions during decode steps.
    pub evictions: u64,
    /// Bytes of evicted pages moved under new entries during decode steps.
    pub recycled_bytes: u64,
    /// Bytes read during prefill.
    pub prefill_bytes: u64,
    /// Whether experts were streamed.
    pub streaming: bool,
    /// Whether the LRU cache was on.
    pub cached: bool,
    /// Largest resident set seen, MiB.
    pub peak_rss_mib: Option<f64>,
    /// Speculative decoding was on.
    pub speculative: bool,
    /// Draft tokens verified.
    pub drafted: u64,
    /// Draft tokens accepted.
    pub accepted: u64,
    /// Decode steps that verified at least one draft token.
    pub verify_steps: u64,
    /// Bytes read for experts only the draft tokens routed.
    pub draft_extra_bytes: u64,
    /// A drop policy was armed.
    pub dropping: bool,
    /// Routed slots considered during decode.
    pub routings: u64,
    /// Routed slots the policy skipped.
    pub dropped: u64,
    /// Reads the skipped slots avoided.
    pub avoided_bytes: u64,
    /// Entries read ahead during decode.
    pub prefetched: u64,
    /// Lookups served by an entry read ahead.
    pub prefetch_used: u64,
    /// Per layer: (experts routed where a prediction was made, of those predicted).
    pub predictions: Vec<(u64, u64)>,
    /// Decode steps run with each compute thread count (index = threads).
    pub thread_steps: Vec<u64>,
    /// Decode steps that read ahead.
    pub read_ahead_steps: u64,
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
                self.decode_tokens += 1 + u64::from(r.accepted);
                self.decode_ns += r.wall_ns;
                self.decode_bytes += r.trace.bytes_read;
                self.decode_read_ns += r.trace.read_ns;
                self.decode_mgmt_ns += r.trace.mgmt_ns;
                self.decode_lane_cpu_ns += r.trace.lane_cpu_ns;
                self.decode_fixed_slices += r.trace.fixed_slices;
                self.decode_remote_ns += r.remote_ns;
                self.lookups += r.trace.lookups;
                self.hits += r.trace.hits;
                self.evictions += r.trace.evictions;
                self.recycled_bytes += r.trace.recycled_bytes;
                self.drafted += u64::from(r.drafted);
                self.accepted += u64::from(r.accepted);
                if r.drafted > 0 {
                    self.verify_steps += 1;
                    // Rows of the draft tokens come after the first token's in
                    // each layer, so bytes charged to them were read only for drafts.
                    self.draft_extra_bytes +=
                        r.trace.rows.iter().filter(|row| row.token > 0).map(|row| row.bytes).sum::<u64>();
                }
                self.routings += r.trace.rows.len() as u64;
                self.dropped += r.trace.dropped;
                self.avoided_bytes += r.trace.avoided_bytes;
                let t = r.threads as usize;
                if self.thread_steps.len() <= t {
                    self.thread_steps.resize(t + 1, 0);
                }
                self.thread_steps[t] += 1;
                self.read_ahead_steps += u64::from(r.read_ahead);
                self.prefetched += r.trace.prefetched;
                self.prefetch_used += r.trace.prefetch_used;
                for p in &r.trace.predictions {
                    let il = p.layer as usize;
                    if self.predictions.len() <= il {
                        self.predictions.resize(il + 1, (0, 0));
                    }
                    self.predictions[il].0 += u64::from(p.routed);
                    self.predictions[il].1 += u64::from(p.right);
                }
            }
        }
    }

    /// Decoded tokens per second (None before any decode step).
    pub fn decode_tps(&self) -> Option<f64> {
        (self.decode_tokens > 0 && self.decode_ns > 0)
            .then(|| self.decode_tokens as f64 / (self.decode_ns as f64 / 1e9))
    }

    /// Prefill tokens per second.
    pub fn prefill_tps(&self) -> Option<f64> {
        (self.prompt_tokens > 0 && self.prefill_ns > 0)
            .then(|| self.prompt_tokens as f64 / (self.prefill_ns as f64 / 1e9))
    }

    /// MiB read per decoded token.
    pub fn mib_per_token(&self) -> Option<f64> {
        (self.decode_tokens > 0).then(|| self.decode_bytes as f64 / MIB / self.decode_tokens as f64)
    }

    /// Share of routed experts the router prediction named, percent (None without predictions).
    pub fn prediction_pct(&self) -> Option<f64> {
        let (routed, right) = self.predictions.iter().fold((0, 0), |(a, b), (r, p)| (a + r, b + p));
        (routed > 0).then(|| 100.0 * right as f64 / routed as f64)
    }

    /// The compute thread count most decode steps ran with (0 before any).
    pub fn main_threads(&self) -> u32 {
        (self.thread_steps.iter().enumerate())
            .filter(|(_, n)| **n > 0)
            .max_by_key(|(t, n)| (**n, *t))
            .map_or(0, |(t, _)| t as u32)
    }

    /// Share of entries read ahead that a lookup then used, percent.
    pub fn prefetch_used_pct(&self) -> Option<f64> {
        (self.prefetched > 0).then(|| 100.0 * self.prefetch_used as f64 / self.prefetched as f64)
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
            "decode:  {} tokens, {} decoded in {:.2} s ({} tok/s) | prefill: {} tokens ({} tok/s) | load {:.2} s",
            // The first token comes from the prompt's logits, not a decode call.
            self.generated.max(self.decode_tokens),
            self.decode_tokens,
            self.decode_ns as f64 / 1e9,
            opt(self.decode_tps(), 2, ""),
            self.prompt_tokens,
            opt(self.prefill_tps(), 1, ""),
            self.load_s
        )?;
        if self.decode_remote_ns > 0 && self.decode_tokens > 0 {
            writeln!(
                f,
                "rpc:     {:.2} ms per token waiting for the RPC servers (their layers' compute and the network)",
                self.decode_remote_ns as f64 / 1e6 / self.decode_tokens as f64
            )?;
        }
        if self.streaming {
            let per = |ns: u64| {
                if self.decode_tokens == 0 { 0.0 } else { ns as f64 / 1e6 / self.decode_tokens as f64 }
            };
            let compute = self.decode_ns.saturating_sub(self.decode_read_ns + self.decode_mgmt_ns);
            writeln!(
                f,
                "stream:  {} MiB/token read | per token: read {:.2} ms, cache mgmt {:.2} ms, compute {:.2} ms \
                 (residual); read lanes' CPU {:.2} ms{}",
                opt(self.mib_per_token(), 2, ""),
                per(self.decode_read_ns),
                per(self.decode_mgmt_ns),
                per(compute),
                per(self.decode_lane_cpu_ns),
                if self.decode_fixed_slices > 0 { " (io_uring into registered memory)" } else { "" }
            )?;
            if self.cached {
                writeln!(
                    f,
                    "cache:   {} hit rate, {} evictions, {:.0} MiB of evicted pages moved to new entries",
                    opt(self.hit_rate_pct(), 1, "%"),
                    self.evictions,
                    self.recycled_bytes as f64 / MIB
                )?;
            }
            if self.prefetched > 0 {
                writeln!(
                    f,
                    "ahead:   {} entries read ahead, {} of them used ({})",
                    self.prefetched,
                    self.prefetch_used,
                    opt(self.prefetch_used_pct(), 1, "%")
                )?;
            }
            if let Some(pct) = self.prediction_pct() {
                let layers: Vec<String> = (self.predictions.iter().enumerate())
                    .filter(|(_, (routed, _))| *routed > 0)
                    .map(|(il, (routed, right))| format!("{il}:{:.0}", 100.0 * *right as f64 / *routed as f64))
                    .collect();
                writeln!(f, "predict: router named {pct:.1}% of routed experts; by layer (%): {}", layers.join(" "))?;
            }
        }
        if self.speculative {
            let rate = (self.drafted > 0).then(|| 100.0 * self.accepted as f64 / self.drafted as f64);
            let per_verify =
                (self.verify_steps > 0).then(|| (self.accepted + self.verify_steps) as f64 / self.verify_steps as f64);
            let extra = (self.verify_steps > 0).then(|| self.draft_extra_bytes as f64 / MIB / self.verify_steps as f64);
            writeln!(
                f,
                "draft:   {} drafted, {} accepted ({} acceptance), {} tokens per verify step, {} MiB extra read per verify step",
                self.drafted,
                self.accepted,
                opt(rate, 1, "%"),
                opt(per_verify, 2, ""),
                opt(extra, 2, "")
            )?;
        }
        if self.dropping {
            let share = (self.routings > 0).then(|| 100.0 * self.dropped as f64 / self.routings as f64);
            writeln!(
                f,
                "drop:    {} of {} routings dropped ({}), {:.2} MiB of reads avoided",
                self.dropped,
                self.routings,
                opt(share, 1, "%"),
                self.avoided_bytes as f64 / MIB
            )?;
        }
        let counts: Vec<String> = (self.thread_steps.iter().enumerate().rev())
            .filter(|(_, n)| **n > 0)
            .map(|(t, n)| format!("{t} threads for {n} steps"))
            .collect();
        if counts.len() > 1 {
            writeln!(f, "threads: tuned while decoding: {}", counts.join(", "))?;
        }
        if self.read_ahead_steps > 0 && self.read_ahead_steps < self.decode_steps {
            writeln!(
                f,
                "ahead:   tuned while decoding: read ahead on {} of {} steps",
                self.read_ahead_steps, self.decode_steps
            )?;
        }
        if let Some(rss) = self.peak_rss_mib {
            writeln!(f, "memory:  peak RSS {rss:.0} MiB")?;
        }
        Ok(())
    }
}
