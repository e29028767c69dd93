//! Several sequences decoded together: a session opened with
//! `sequences > 1` holds one token history per sequence in one KV cache,
//! and one decode call can carry a part of each (a server's concurrent
//! requests: each step is one batch, so the dense weights are passed over
//! once for all of them and an expert two sequences route to is read and
//! computed once). The caller drives generation (sampling, stopping); the
//! session decodes, keeps the histories and reports each step as
//! [`Session::generate`] does. Sequence 0 is the one `generate` uses: a
//! caller of these methods uses them for every sequence.

use super::{Batch, Session};
use crate::engine::{EngineError, Phase, StepReport};
use crate::llama::{SeqPart, batch_index_of_last};

impl Session {
    /// Sequences the session decodes together.
    pub fn sequences(&self) -> usize {
        self.other_seqs.len() + 1
    }

    /// The context length of one sequence: an equal share of the whole
    /// (the spare sequence's stream, where each has its own, not counted).
    pub fn seq_ctx(&self) -> u32 {
        (self.ctx.n_ctx() / self.sequences() as u32).min(self.ctx.n_ctx_seq())
    }

    /// The tokens sequence `seq` holds in the KV cache.
    pub fn seq_tokens(&self, seq: usize) -> &[i32] {
        if seq == 0 { &self.history } else { &self.other_seqs[seq - 1] }
    }

    pub(super) fn seq_history_mut(&mut self, seq: usize) -> &mut Vec<i32> {
        if seq == 0 { &mut self.history } else { &mut self.other_seqs[seq - 1] }
    }

    /// Keeps the longest prefix of `tokens` that sequence `seq` holds,
    /// leaving at least one token of `tokens` to decode (for the logits of
    /// the next), and forgets the rest of the sequence. Returns how many
    /// tokens were kept.
    pub fn seq_keep_prefix(&mut self, seq: usize, tokens: &[i32]) -> usize {
        if seq == 0 {
            // Generation's undecoded last token is no part of this use.
            self.pending = None;
        }
        let held = self.seq_tokens(seq);
        let common = held.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let keep = common.min(tokens.len().saturating_sub(1));
        if keep < self.seq_tokens(seq).len() {
            self.roll_back_seq(seq, keep as i32);
        }
        self.seq_tokens(seq).len()
    }

    /// Whether two sequences can exchange what they hold
    /// ([`Session::seq_swap`]): a KV cache of several sequences can, a
    /// recurrent state cannot.
    pub fn seqs_swap(&self) -> bool {
        self.spare_seq.is_some()
    }

    /// Exchanges what sequences `a` and `b` hold (their KV cells, bit for
    /// bit, and their tokens), through the spare sequence: three copies,
    /// and neither forgets what it held. False (and nothing done) where
    /// [`Session::seqs_swap`] is false.
    pub fn seq_swap(&mut self, a: usize, b: usize) -> bool {
        let Some(spare) = self.spare_seq else { return false };
        if a == b {
            return true;
        }
        // The cells move now; where the sequences have KV streams of their
        // own, the buffers are copied at the next decode, in this order.
        self.ctx.truncate_kv_seq(spare as i32, 0);
        self.ctx.copy_kv_seq(a as i32, spare as i32);
        self.ctx.truncate_kv_seq(a as i32, 0);
        self.ctx.copy_kv_seq(b as i32, a as i32);
        self.ctx.truncate_kv_seq(b as i32, 0);
        self.ctx.copy_kv_seq(spare as i32, b as i32);
        self.ctx.truncate_kv_seq(spare as i32, 0);
        let held_a = std::mem::take(self.seq_history_mut(a));
        let held_b = std::mem::replace(self.seq_history_mut(b), held_a);
        *self.seq_history_mut(a) = held_b;
        if a == 0 || b == 0 {
            // Generation's undecoded last token is no part of this use.
            self.pending = None;
        }
        true
    }

    /// Forgets positions `pos..` of sequence `seq` (all of it where the
    /// cache cannot drop a tail).
    pub(super) fn roll_back_seq(&mut self, seq: usize, pos: i32) {
        self.abort.store(false, std::sync::atomic::Ordering::Relaxed);
        let pos = pos.max(0);
        if self.ctx.truncate_kv_seq(seq as i32, pos) {
            self.seq_history_mut(seq).truncate(pos as usize);
        } else {
            self.ctx.truncate_kv_seq(seq as i32, 0);
            self.seq_history_mut(seq).clear();
        }
    }

    /// Decodes `parts` in one batch: each part's tokens after what its
    /// sequence holds, its last token's logits kept where it asks. The
    /// step is reported as `phase`, numbered `step` of `turn`. Returns
    /// None when stopped by the abort handle (the batch is rolled back).
    /// Read the logits with [`Session::part_logits`].
    pub fn decode_seqs(
        &mut self,
        parts: &[(usize, &[i32], bool)],
        turn: u32,
        phase: Phase,
        step: u32,
    ) -> Result<Option<StepReport>, EngineError> {
        let n_ctx = self.ctx.n_ctx_seq() as usize;
        let mut seq_parts = Vec::with_capacity(parts.len());
        for &(seq, tokens, logits) in parts {
            if seq >= self.sequences() {
                return Err(EngineError::Request(format!("no sequence {seq}: the session holds {}", self.sequences())));
            }
            if parts.iter().filter(|p| p.0 == seq).count() > 1 || tokens.is_empty() {
                return Err(EngineError::Request("each sequence's part of a batch is one non-empty run".into()));
            }
            let first_pos = self.seq_tokens(seq).len();
            if first_pos + tokens.len() > n_ctx {
                return Err(EngineError::ContextFull {
                    needed: first_pos + tokens.len(),
                    held: first_pos,
                    prompt: tokens.len(),
                    n_predict: 0,
                    n_ctx: n_ctx as u32,
                });
            }
            seq_parts.push(SeqPart { seq: seq as i32, first_pos: first_pos as i32, tokens, logits });
        }
        if seq_parts.is_empty() {
            return Err(EngineError::Request("an empty batch".into()));
        }
        if seq_parts.iter().any(|p| p.seq == 0) {
            self.pending = None;
        }
        self.decode_batch(Batch::Seqs(&seq_parts), turn, phase, step)
    }

    /// The logits of the last token of `parts[part]` after
    /// [`Session::decode_seqs`] decoded `parts` (empty where it kept none).
    pub fn part_logits(&self, parts: &[(usize, &[i32], bool)], part: usize) -> &[f32] {
        let seq_parts: Vec<SeqPart<'_>> = parts
            .iter()
            .map(|&(seq, tokens, logits)| SeqPart { seq: seq as i32, first_pos: 0, tokens, logits })
            .collect();
        self.ctx.logits_at(batch_index_of_last(&seq_parts, part))
    }
}
