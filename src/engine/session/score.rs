//! Teacher-forced scoring: a text's tokens decoded one at a time, as
//! decode steps, handing the caller the logits after each. Two runs of the
//! same tokens, one with a lossy setting and one exact, see the same
//! context at every position, so their next-token distributions can be
//! compared position by position (`crate::eval`).

use std::ops::ControlFlow;

use super::Session;
use crate::engine::{EngineError, Phase};
use crate::llama::Logits;
use crate::telemetry::summary::RunSummary;

/// What a scoring run did.
#[derive(Debug, Clone, Default)]
pub struct Scored {
    /// Totals of the run's decode steps (the first token counts as prefill).
    pub summary: RunSummary,
    /// Stopped early: by an abort request, or by the caller.
    pub stopped: bool,
}

impl Session {
    /// Forgets the conversation, then decodes `tokens` one per step and
    /// calls `on_logits(i, logits)` with the logits after token `i` (the
    /// model's distribution for token `i + 1`), for every token but the
    /// last. One token per step, so a lossy setting acts as it does while
    /// generating (per-token drops, the decode thread tuning, read-ahead).
    pub fn score(
        &mut self,
        tokens: &[i32],
        on_logits: &mut dyn FnMut(usize, &[f32]) -> ControlFlow<()>,
    ) -> Result<Scored, EngineError> {
        self.abort.store(false, std::sync::atomic::Ordering::Relaxed);
        if let Some(gone) = self.remote_gone() {
            return Err(gone);
        }
        if tokens.len() < 2 {
            return Err(EngineError::Request("scoring needs at least two tokens".into()));
        }
        if tokens.len() > self.ctx.n_ctx() as usize {
            return Err(EngineError::Request(format!(
                "{} tokens to score exceed the context size {}: score fewer or raise --ctx-size",
                tokens.len(),
                self.ctx.n_ctx()
            )));
        }
        self.reset();
        let turn = self.turn;
        self.turn += 1;
        let mut out = Scored::default();
        out.summary.load_s = self.info.load_s;
        out.summary.streaming = self.options.stream.is_some();
        out.summary.cached = self.info.cache_budget > 0;
        for (i, &token) in tokens[..tokens.len() - 1].iter().enumerate() {
            let phase = if i == 0 { Phase::Prefill } else { Phase::Decode };
            match self.decode_step(&[token], Logits::Last, turn, phase, i as u32)? {
                Some(report) => out.summary.add(&report),
                None => {
                    out.stopped = true;
                    break;
                }
            }
            if on_logits(i, self.ctx.last_logits()).is_break() {
                out.stopped = true;
                break;
            }
        }
        Ok(out)
    }
}
