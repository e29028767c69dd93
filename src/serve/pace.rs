//! How many newcomers' prompt tokens a step may carry beside the running
//! streams' tokens. A step is one batch, so a long prompt decoded whole
//! beside a running stream holds that stream's next token back for the
//! prompt's whole prefill. The pacer learns what a plain decode step costs
//! (by how many streams it carries) and what each prompt token adds to
//! one, and gives prompts the tokens that keep a running stream's step
//! within `target` times its plain decode step. With nothing decoding a
//! prompt takes the whole batch, as it always did.

use std::time::Duration;

/// Weight of the newest measurement in the running averages.
const NEWEST: f64 = 0.25;

/// Learns step costs and sizes the prompt tokens a step may carry.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// A running stream's step may take this many times its plain decode
    /// step; 0 = no budget.
    target: f64,
    /// Average milliseconds of a plain decode step, by the number of
    /// streams it carries (index 0 unused).
    decode_ms: Vec<Option<f64>>,
    /// Average milliseconds one prompt token adds to a step.
    prompt_token_ms: Option<f64>,
}

/// What a step carried and how long it took.
#[derive(Debug, Clone, Copy)]
pub struct StepCost {
    /// Running streams' tokens.
    pub decoding: usize,
    /// Prompt tokens.
    pub prompt: usize,
    /// The step's time.
    pub elapsed: Duration,
}

impl Pacer {
    /// A pacer keeping steps within `target` times a plain decode step
    /// (0: prompts always take the whole batch).
    pub fn new(target: f64) -> Pacer {
        Pacer { target, decode_ms: Vec::new(), prompt_token_ms: None }
    }

    /// The most prompt tokens the next step may carry beside `decoding`
    /// running streams' tokens; `None` when nothing limits them (no budget,
    /// or nothing decoding). It is 0 until a first plain decode step was
    /// measured (that step measures it), and 1 until a first prompt token
    /// beside streams was.
    pub fn budget(&self, decoding: usize) -> Option<usize> {
        if self.target <= 0.0 || decoding == 0 {
            return None;
        }
        let Some(decode) = self.plain_step_ms(decoding) else { return Some(0) };
        let Some(per_token) = self.prompt_token_ms else { return Some(1) };
        let room = (self.target - 1.0).max(0.0) * decode / per_token.max(1e-6);
        Some((room.floor() as usize).max(1))
    }

    /// Learns from a step that carried `cost`.
    pub fn record(&mut self, cost: StepCost) {
        let ms = cost.elapsed.as_secs_f64() * 1000.0;
        if cost.decoding == 0 {
            // A prompt alone: in a wide batch a token costs less than beside
            // a few streams' tokens, so it says nothing of the budget.
            return;
        }
        if cost.prompt == 0 {
            if self.decode_ms.len() <= cost.decoding {
                self.decode_ms.resize(cost.decoding + 1, None);
            }
            average(&mut self.decode_ms[cost.decoding], ms);
        } else if let Some(plain) = self.plain_step_ms(cost.decoding) {
            // What the prompt tokens added to a plain step of these streams.
            average(&mut self.prompt_token_ms, (ms - plain).max(0.0) / cost.prompt as f64);
        }
    }

    /// The plain decode step of `decoding` streams: measured, or that of
    /// the widest narrower step measured (an underestimate, which keeps
    /// the budget small), or of the narrowest wider one.
    fn plain_step_ms(&self, decoding: usize) -> Option<f64> {
        let known = |k: &usize| self.decode_ms.get(*k).copied().flatten();
        (1..=decoding.min(self.decode_ms.len().saturating_sub(1)))
            .rev()
            .find_map(|k| known(&k))
            .or_else(|| (decoding + 1..self.decode_ms.len()).find_map(|k| known(&k)))
    }
}

/// Folds `value` into the running average `avg`.
fn average(avg: &mut Option<f64>, value: f64) {
    *avg = Some(match *avg {
        Some(old) => old + NEWEST * (value - old),
        None => value,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(decoding: usize, prompt: usize, ms: u64) -> StepCost {
        StepCost { decoding, prompt, elapsed: Duration::from_millis(ms) }
    }

    #[test]
    fn without_a_target_or_a_running_stream_prompts_take_the_whole_batch() {
        let mut off = Pacer::new(0.0);
        off.record(step(1, 0, 10));
        assert_eq!(off.budget(1), None);
        let on = Pacer::new(3.0);
        assert_eq!(on.budget(0), None);
    }

    #[test]
    fn a_plain_step_is_measured_before_prompts_join_it() {
        let mut pacer = Pacer::new(3.0);
        // A prompt alone (100 tokens in 200 ms) teaches nothing.
        pacer.record(step(0, 100, 200));
        assert_eq!(pacer.budget(1), Some(0), "no plain step of one stream yet");
        pacer.record(step(1, 0, 10));
        assert_eq!(pacer.budget(1), Some(1), "no prompt token beside a stream yet");
        pacer.record(step(1, 1, 12));
        // (3 - 1) x 10 ms at 2 ms a token.
        assert_eq!(pacer.budget(1), Some(10));
    }

    #[test]
    fn the_budget_follows_what_prompt_tokens_cost_beside_streams() {
        let mut pacer = Pacer::new(3.0);
        pacer.record(step(2, 0, 20));
        assert_eq!(pacer.budget(2), Some(1), "no prompt token measured yet");
        // Each prompt token beside two streams adds 4 ms.
        for _ in 0..40 {
            pacer.record(step(2, 10, 60));
        }
        assert_eq!(pacer.budget(2), Some(10));
        // Never below one token, so a prompt always moves.
        for _ in 0..40 {
            pacer.record(step(2, 1, 1000));
        }
        assert_eq!(pacer.budget(2), Some(1));
    }

    #[test]
    fn an_unmeasured_width_borrows_the_nearest_narrower_one() {
        let mut pacer = Pacer::new(2.0);
        pacer.record(step(1, 0, 10));
        pacer.record(step(4, 0, 40));
        pacer.record(step(1, 5, 20));
        assert_eq!(pacer.plain_step_ms(3), Some(10.0));
        assert_eq!(pacer.plain_step_ms(6), Some(40.0));
        let mut wide = Pacer::new(2.0);
        wide.record(step(4, 0, 40));
        assert_eq!(wide.plain_step_ms(2), Some(40.0));
    }
}
