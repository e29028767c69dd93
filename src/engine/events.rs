//! What a session reports while it works: one event per prefill chunk, per
//! generated token, and per decode step. Front ends and telemetry sinks
//! consume the same events.

use crate::moe::StepTrace;
use crate::telemetry::mem::MemSnapshot;

/// Prefill or decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Prompt tokens, many per batch.
    Prefill,
    /// One generated token per batch.
    Decode,
}

impl Phase {
    /// 0 for prefill, 1 for decode (the route-trace encoding).
    pub fn code(self) -> u8 {
        match self {
            Phase::Prefill => 0,
            Phase::Decode => 1,
        }
    }
}

/// One `llama_decode` call and what the expert layers did during it.
#[derive(Debug, Clone)]
pub struct StepReport {
    /// Conversation turn (0-based) within the session.
    pub turn: u32,
    /// Prefill or decode.
    pub phase: Phase,
    /// Decode step within the turn (1-based), or prefill chunk index.
    pub step: u32,
    /// Context position of the batch's first token.
    pub first_pos: i32,
    /// Tokens in the batch.
    pub tokens: u32,
    /// Wall time of the decode call.
    pub wall_ns: u64,
    /// Routing, bytes and timings from the expert hook (empty when not streaming).
    pub trace: StepTrace,
    /// Memory after the decode.
    pub mem: MemSnapshot,
    /// Cache budget and resident bytes after the decode (0 with the cache off).
    pub cache_budget: u64,
    /// Bytes held by the expert cache.
    pub cache_resident: u64,
    /// Which experts the cache holds after the decode, `layer * n_expert +
    /// expert` (empty with the cache off or when not streaming).
    pub residency: Vec<bool>,
    /// Draft tokens verified in this batch (speculative decoding).
    pub drafted: u32,
    /// Of those, accepted.
    pub accepted: u32,
    /// Compute threads the decode ran with.
    pub threads: u32,
    /// Whether the decode read ahead (configured, and chosen by the tuner).
    pub read_ahead: bool,
    /// Time the decode waited for RPC servers: their compute of the layers
    /// they hold, and the network (part of the compute residual).
    pub remote_ns: u64,
}

impl StepReport {
    /// Compute time: a residual (wall minus read and cache-management time),
    /// not a measurement; it absorbs page faults and everything else.
    pub fn compute_residual_ns(&self) -> u64 {
        self.wall_ns.saturating_sub(self.trace.read_ns + self.trace.mgmt_ns)
    }
}

/// An event from a running generation.
#[derive(Debug)]
pub enum Event<'a> {
    /// A prompt chunk was processed.
    Prefill(&'a StepReport),
    /// A token was chosen; `text` is its printable piece (may be empty while
    /// a multi-byte character is incomplete).
    Token {
        /// Index of the token within this generation (0-based).
        index: u32,
        /// Token id.
        token: i32,
        /// Text to append.
        text: &'a str,
    },
    /// A generated token was decoded (its routing and costs).
    Step(&'a StepReport),
    /// Something the user should know now, e.g. a plugin was disabled.
    Notice(&'a str),
}
