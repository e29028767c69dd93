//! The server's counters, written as Prometheus text at `/metrics`:
//! requests by endpoint and status, tokens, decode speed, the expert
//! cache's hit rate, bytes read per token, the read / cache / compute
//! split of decode time, and the queue.

use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::engine::{Phase, StepReport};

/// Counters since the server started.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    /// (endpoint, status) → requests answered.
    requests: Vec<(String, u16, u64)>,
    cancelled: u64,
    prompt_tokens: u64,
    decoded_prompt_tokens: u64,
    generated_tokens: u64,
    decode_steps: u64,
    decode_tokens: u64,
    decode_ns: u64,
    read_ns: u64,
    mgmt_ns: u64,
    bytes_read: u64,
    lookups: u64,
    hits: u64,
    queued_ns: u64,
    beside_streams: u64,
    paced_steps: u64,
    prefix_copies: u64,
    slot_moves: u64,
}

impl Counts {
    /// Adds a decode call of which `prompt` tokens were prompts'.
    fn step(&mut self, r: &StepReport, prompt: u32) {
        self.decoded_prompt_tokens += u64::from(prompt);
        if r.phase == Phase::Prefill {
            return;
        }
        self.decode_steps += 1;
        self.decode_tokens += u64::from(r.tokens.saturating_sub(prompt));
        self.decode_ns += r.wall_ns;
        self.read_ns += r.trace.read_ns;
        self.mgmt_ns += r.trace.mgmt_ns;
        self.bytes_read += r.trace.bytes_read;
        self.lookups += r.trace.lookups;
        self.hits += r.trace.hits;
    }
}

impl Metrics {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a request answered with `status`.
    pub fn request(&self, endpoint: &str, status: u16) {
        let mut c = self.counts();
        match c.requests.iter_mut().find(|(e, s, _)| e == endpoint && *s == status) {
            Some(entry) => entry.2 += 1,
            None => c.requests.push((endpoint.to_string(), status, 1)),
        }
    }

    /// Counts a request whose client went away before it finished.
    pub fn cancelled(&self) {
        self.counts().cancelled += 1;
    }

    /// Adds the time a request waited in the queue.
    pub fn queued_for(&self, waited: Duration) {
        self.counts().queued_ns += waited.as_nanos() as u64;
    }

    /// Adds a finished request's prompt and generated tokens.
    pub fn finished(&self, prompt_tokens: u64, generated_tokens: u64) {
        let mut c = self.counts();
        c.prompt_tokens += prompt_tokens;
        c.generated_tokens += generated_tokens;
    }

    /// Adds one decode call.
    pub fn step(&self, r: &StepReport) {
        let prompt = if r.phase == Phase::Prefill { r.tokens } else { 0 };
        self.counts().step(r, prompt);
    }

    /// Adds one step of the server's slots: `prompt` of its tokens were
    /// prompts' (in a decode step, beside running streams' tokens), and
    /// the prompt budget held some back when `paced`.
    pub fn slots_step(&self, r: &StepReport, prompt: u32, paced: bool) {
        let mut c = self.counts();
        c.step(r, prompt);
        if r.phase == Phase::Decode {
            c.beside_streams += u64::from(prompt);
        }
        c.paced_steps += u64::from(paced);
    }

    /// Counts a cached prefix brought from one slot to another.
    pub fn prefix_copied(&self) {
        self.counts().prefix_copies += 1;
    }

    /// Counts a running request moved to another slot.
    pub fn slot_moved(&self) {
        self.counts().slot_moves += 1;
    }

    /// The counters as Prometheus text, with the queue's `waiting` depth.
    pub fn render(&self, waiting: usize) -> String {
        let c = self.counts();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, String)>| {
            let _ = writeln!(out, "# HELP bmoe_{name} {help}\n# TYPE bmoe_{name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "bmoe_{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        let requests =
            c.requests.iter().map(|(e, s, n)| (format!("{{endpoint=\"{e}\",status=\"{s}\"}}"), n.to_string()));
        metric("requests_total", "counter", "Requests answered, by endpoint and HTTP status.", requests.collect());
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests whose client went away first.",
            one(c.cancelled.to_string()),
        );
        metric("queue_waiting", "gauge", "Requests waiting for the model.", one(waiting.to_string()));
        metric("queue_wait_seconds_total", "counter", "Time requests waited in the queue.", one(secs(c.queued_ns)));
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            one(c.prompt_tokens.to_string()),
        );
        let decoded = c.decoded_prompt_tokens.to_string();
        metric("prompt_tokens_decoded_total", "counter", "Prompt tokens decoded (the rest were reused).", one(decoded));
        metric(
            "prompt_tokens_beside_streams_total",
            "counter",
            "Prompt tokens decoded in steps that carried running streams' tokens too.",
            one(c.beside_streams.to_string()),
        );
        metric(
            "paced_steps_total",
            "counter",
            "Steps whose prompt tokens the budget held back to keep running streams' pace (--step-target).",
            one(c.paced_steps.to_string()),
        );
        metric(
            "prefix_copies_total",
            "counter",
            "Cached prompt prefixes brought from the slot holding them to the slot a request runs in (the two slots' cells exchanged).",
            one(c.prefix_copies.to_string()),
        );
        metric(
            "slot_moves_total",
            "counter",
            "Running requests moved to another slot to keep the running slots consecutive (one pass a step).",
            one(c.slot_moves.to_string()),
        );
        metric(
            "generated_tokens_total",
            "counter",
            "Tokens generated by finished requests.",
            one(c.generated_tokens.to_string()),
        );
        metric(
            "decode_steps_total",
            "counter",
            "Decode steps (one token, or a verified draft).",
            one(c.decode_steps.to_string()),
        );
        metric("decode_seconds_total", "counter", "Wall time of decode steps.", one(secs(c.decode_ns)));
        let tps = if c.decode_ns > 0 { c.decode_tokens as f64 / (c.decode_ns as f64 / 1e9) } else { 0.0 };
        metric(
            "decode_tokens_per_second",
            "gauge",
            "Tokens decoded over decode time, since start.",
            one(format!("{tps:.3}")),
        );
        let split = vec![
            ("{part=\"read\"}".to_string(), secs(c.read_ns)),
            ("{part=\"cache\"}".to_string(), secs(c.mgmt_ns)),
            ("{part=\"compute\"}".to_string(), secs(c.decode_ns.saturating_sub(c.read_ns + c.mgmt_ns))),
        ];
        metric(
            "decode_split_seconds_total",
            "counter",
            "Decode time waiting for reads, managing the cache, computing.",
            split,
        );
        metric(
            "expert_bytes_read_total",
            "counter",
            "Expert bytes read from storage while decoding.",
            one(c.bytes_read.to_string()),
        );
        let per_token =
            if c.decode_tokens > 0 { c.bytes_read as f64 / c.decode_tokens as f64 / 1048576.0 } else { 0.0 };
        metric(
            "expert_mib_read_per_token",
            "gauge",
            "MiB of experts read per generated token, since start.",
            one(format!("{per_token:.4}")),
        );
        let rate = if c.lookups > 0 { c.hits as f64 / c.lookups as f64 } else { 0.0 };
        metric(
            "expert_cache_hit_ratio",
            "gauge",
            "Expert lookups that found the expert cached, since start.",
            one(format!("{rate:.4}")),
        );
        out
    }
}

fn secs(ns: u64) -> String {
    format!("{:.6}", ns as f64 / 1e9)
}
