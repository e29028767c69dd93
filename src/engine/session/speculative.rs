//! Speculative decoding: drafts from a plugin or the model's MTP layers,
//! verified in one batch against greedy argmax.

use super::*;

impl Session {
    /// Speculative decoding: the drafter guesses, one batch verifies the
    /// guesses against greedy argmax, the longest agreeing prefix is kept and
    /// the KV cache is rolled back past it. The emitted tokens are exactly
    /// those of plain greedy decoding (as long as a batched forward pass
    /// gives the same argmax as one-token passes, which the tests check).
    pub(super) fn decode_speculative(
        &mut self,
        req: &GenerateRequest,
        turn: u32,
        emit: &mut Emitter<'_>,
        out: &mut Generation,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), EngineError> {
        let mut token = argmax(self.ctx.last_logits());
        if !emit.token(token, self.ctx.last_logits(), out, on_event) {
            return Ok(());
        }
        // Like every emitted token, it stays undecoded until the next step (or turn).
        self.pending = Some(token);
        let mut context = self.history.clone();
        context.push(token);
        if let Some(d) = self.drafter.as_mut() {
            d.reset(&context);
        }
        let mut step = 0;
        while emit.index < req.n_predict {
            let remaining = req.n_predict - emit.index;
            let drafting = Instant::now();
            // What the MTP layer's experts cost to draft, added to the step.
            let mut draft_trace = None;
            let drafts = match self.drafter.as_mut() {
                Some(d) => d.draft(self.draft_max.min(remaining - 1)),
                None if self.ctx.has_mtp() => {
                    if let Some(h) = self.ctx.hook_mut() {
                        h.begin_side_batch(1);
                    }
                    let mut drafts = match self.ctx.mtp_draft(self.history.len(), token) {
                        Ok(drafts) => drafts,
                        // Stopped by Ctrl-C: the verify decode below stops too.
                        Err(_) if self.abort.load(Ordering::Relaxed) => Vec::new(),
                        Err(e) => return Err(EngineError::Llama(e)),
                    };
                    draft_trace = self.ctx.hook_mut().map(MoeHook::take_trace);
                    drafts.truncate(remaining as usize - 1);
                    drafts
                }
                None => Vec::new(),
            };
            let draft_ns = drafting.elapsed().as_nanos() as u64;
            let mut batch = Vec::with_capacity(drafts.len() + 1);
            batch.push(token);
            batch.extend_from_slice(&drafts);
            step += 1;
            let first_pos = self.history.len();
            let Some(mut report) = self.decode_step(&batch, Logits::All, turn, Phase::Decode, step)? else {
                self.pending = Some(token);
                out.aborted = true;
                return Ok(());
            };
            report.wall_ns += draft_ns;
            if let Some(t) = draft_trace {
                report.trace.absorb(t);
            }
            self.pending = None;
            // Accept drafts while they equal greedy argmax; the first
            // disagreement (or the position after the last draft) gives the next token.
            let mut accepted = 0;
            let mut chosen = Vec::with_capacity(batch.len());
            let mut logits_of = Vec::new();
            for i in 0..batch.len() {
                let logits = self.ctx.logits_at(i);
                let best = argmax(logits);
                chosen.push(best);
                if req.keep_logits {
                    logits_of.push(logits.to_vec());
                }
                if i < drafts.len() && best == drafts[i] {
                    accepted += 1;
                } else {
                    break;
                }
            }
            if self.drafts_with_mtp() && !drafts.is_empty() {
                self.ctx.mtp_verified(accepted);
            }
            // Positions past the accepted drafts hold guesses the model rejected.
            let keep = first_pos + 1 + accepted;
            if keep < self.history.len() {
                self.roll_back_to(keep);
            }
            report.drafted = drafts.len() as u32;
            report.accepted = accepted as u32;
            out.summary.add(&report);
            on_event(Event::Step(&report));
            if let Some(d) = self.drafter.as_mut() {
                d.observe(&chosen);
            }
            self.drain_notices(out, on_event);
            for (i, &t) in chosen.iter().enumerate() {
                let logits = logits_of.get(i).map_or(&[][..], Vec::as_slice);
                if !emit.token(t, logits, out, on_event) {
                    // An end-of-generation token: nothing from it on belongs to the conversation.
                    self.roll_back_to(first_pos + 1 + i);
                    return Ok(());
                }
                token = t;
                if emit.index == req.n_predict {
                    // The last token shown stays undecoded, as in plain decoding.
                    self.roll_back_to(first_pos + 1 + i);
                    break;
                }
            }
            self.pending = Some(token);
        }
        Ok(())
    }
}
