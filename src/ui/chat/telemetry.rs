//! The telemetry the chat screen shows, aggregated as step reports arrive:
//! a tok/s history for the sparkline, the last token's read / cache
//! management / compute split, MiB read, cache fill, draft acceptance and
//! memory.

use std::collections::VecDeque;

use crate::engine::{Phase, StepReport};

/// Tokens kept for the sparkline.
const HISTORY: usize = 120;
const MIB: f64 = 1024.0 * 1024.0;

/// The last decode step, reduced to what the screen shows.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LastStep {
    /// Tokens per second of this step.
    pub tok_s: f64,
    /// Time blocked on reads, ms.
    pub read_ms: f64,
    /// Cache management, ms.
    pub mgmt_ms: f64,
    /// Compute (the residual), ms.
    pub compute_ms: f64,
    /// MiB read for this step, per token.
    pub mib_read: f64,
    /// Cache hits of this step, percent (None with no lookups).
    pub hit_pct: Option<f64>,
    /// Evictions in this step.
    pub evictions: u64,
}

/// Telemetry of the chat so far.
#[derive(Debug, Clone, Default)]
pub struct Telemetry {
    /// Tok/s of the last decode steps, oldest first.
    pub history: VecDeque<f64>,
    /// The last decode step.
    pub last: Option<LastStep>,
    /// Cache budget and fill, bytes.
    pub cache_budget: u64,
    /// Bytes the cache holds.
    pub cache_resident: u64,
    /// Draft tokens verified and accepted in this turn.
    pub drafted: u64,
    /// Of those, accepted.
    pub accepted: u64,
    /// Resident set and available memory, MiB.
    pub rss_mib: Option<f64>,
    /// `MemAvailable`, MiB.
    pub available_mib: Option<f64>,
    /// Prompt tokens decoded in this turn.
    pub prefilled: u64,
}

impl Telemetry {
    /// Empty telemetry for a cache of `budget_mib` (0 = off).
    pub fn for_budget(budget_mib: f64) -> Telemetry {
        let mut t = Telemetry::default();
        t.set_budget(budget_mib);
        t
    }

    /// A new cache budget (a setting changed).
    pub fn set_budget(&mut self, budget_mib: f64) {
        self.cache_budget = (budget_mib * MIB) as u64;
    }

    /// Takes in one decode call.
    pub fn observe(&mut self, r: &StepReport) {
        self.cache_budget = r.cache_budget;
        self.cache_resident = r.cache_resident;
        self.rss_mib = r.mem.rss_mib.or(self.rss_mib);
        self.available_mib = r.mem.available_mib.or(self.available_mib);
        if r.phase == Phase::Prefill {
            self.prefilled += u64::from(r.tokens);
            return;
        }
        let tokens = f64::from(r.tokens.max(1));
        let ms = |ns: u64| ns as f64 / 1e6;
        let tok_s = if r.wall_ns > 0 { tokens / (r.wall_ns as f64 / 1e9) } else { 0.0 };
        let t = &r.trace;
        self.last = Some(LastStep {
            tok_s,
            read_ms: ms(t.read_ns),
            mgmt_ms: ms(t.mgmt_ns),
            compute_ms: ms(r.compute_residual_ns()),
            mib_read: t.bytes_read as f64 / MIB / tokens,
            hit_pct: (t.lookups > 0).then(|| 100.0 * t.hits as f64 / t.lookups as f64),
            evictions: t.evictions,
        });
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(tok_s);
        self.drafted += u64::from(r.drafted);
        self.accepted += u64::from(r.accepted);
    }

    /// A new turn starts: its draft and prefill counts restart.
    pub fn start_turn(&mut self) {
        self.drafted = 0;
        self.accepted = 0;
        self.prefilled = 0;
    }

    /// Draft acceptance of this turn, percent.
    pub fn acceptance_pct(&self) -> Option<f64> {
        (self.drafted > 0).then(|| 100.0 * self.accepted as f64 / self.drafted as f64)
    }

    /// Cache budget and fill in MiB.
    pub fn cache_mib(&self) -> (f64, f64) {
        (self.cache_resident as f64 / MIB, self.cache_budget as f64 / MIB)
    }
}
