//! How many newcomers' prompt tokens a step may carry beside the running
//! streams' tokens. A step is one batch, so a long prompt decoded whole
//! beside a running stream holds that stream's next token back for the
//! prompt's whole prefill. The pacer learns what a plain decode step costs
//! (by how many streams it carries) and what each prompt token adds to
//! one, and gives prompts the tokens that keep a running stream's step
//! within `target` times its plain decode step. With nothing decoding a
//! prompt takes the whole batch, as it always did.

use std::collections::VecDeque;
use std::time::Duration;

/// Measurements a figure is the median of: enough that one step slowed by
/// the machine moves it little, few enough that it follows a change.
const RECENT: usize = 15;

/// Learns step costs and sizes the prompt tokens a step may carry.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// A running stream's step may take this many times its plain decode
    /// step; 0 = no budget.
    target: f64,
    /// Milliseconds of recent plain decode steps, by the number of
    /// streams they carried (index 0 unused).
    decode_ms: Vec<Recent>,
    /// Milliseconds a prompt token added to recent steps beside streams.
    prompt_token_ms: Recent,
}

/// The last [`RECENT`] measurements of a figure.
#[derive(Debug, Clone, Default)]
struct Recent(VecDeque<f64>);

impl Recent {
    fn push(&mut self, value: f64) {
        if self.0.len() == RECENT {
            self.0.pop_front();
        }
        self.0.push_back(value);
    }

    /// The median, once there is a measurement.
    fn median(&self) -> Option<f64> {
        let mut sorted: Vec<f64> = self.0.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied()
    }
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
        Pacer { target, decode_ms: Vec::new(), prompt_token_ms: Recent::default() }
    }

    /// The most prompt tokens the next step may carry beside `decoding`
    /// running streams' tokens while `joining` requests' prompts wait;
    /// `None` when nothing limits them (no budget, or nothing decoding).
    /// The step may take `target` times the plain step of the streams it
    /// carries once the waiting requests decode beside them (the widest
    /// such step measured so far), the pace those streams will share.
    /// It is 0 until a plain decode step of as many streams as now was
    /// measured (that step measures it: once for each number of streams),
    /// and 1 until a first prompt token beside streams was.
    pub fn budget(&self, decoding: usize, joining: usize) -> Option<usize> {
        if self.target <= 0.0 || decoding == 0 {
            return None;
        }
        let Some(now) = self.plain_step_ms(decoding) else { return Some(0) };
        let Some(per_token) = self.prompt_token_ms.median() else { return Some(1) };
        let shared = (decoding..=decoding + joining).filter_map(|k| self.plain_step_ms(k)).fold(now, f64::max);
        // A prompt token that seemed free (steps noisier than its cost)
        // counts as a hundredth of a plain step, so one noisy stretch does
        // not hand a long prompt the whole batch.
        let room = (self.target * shared - now).max(0.0) / per_token.max(now / 100.0);
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
                self.decode_ms.resize(cost.decoding + 1, Recent::default());
            }
            self.decode_ms[cost.decoding].push(ms);
        } else if let Some(plain) = self.plain_step_ms(cost.decoding) {
            // What the prompt tokens added to a plain step of these streams.
            self.prompt_token_ms.push((ms - plain).max(0.0) / cost.prompt as f64);
        }
    }

    /// The plain decode step of `decoding` streams, once measured.
    fn plain_step_ms(&self, decoding: usize) -> Option<f64> {
        self.decode_ms.get(decoding).and_then(Recent::median)
    }
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
        assert_eq!(off.budget(1, 1), None);
        let on = Pacer::new(3.0);
        assert_eq!(on.budget(0, 1), None);
    }

    #[test]
    fn a_plain_step_is_measured_before_prompts_join_it() {
        let mut pacer = Pacer::new(3.0);
        // A prompt alone (100 tokens in 200 ms) teaches nothing.
        pacer.record(step(0, 100, 200));
        assert_eq!(pacer.budget(1, 1), Some(0), "no plain step of one stream yet");
        pacer.record(step(1, 0, 10));
        assert_eq!(pacer.budget(1, 1), Some(1), "no prompt token beside a stream yet");
        pacer.record(step(1, 1, 12));
        // (3 - 1) x 10 ms at 2 ms a token.
        assert_eq!(pacer.budget(1, 1), Some(10));
    }

    #[test]
    fn the_budget_follows_what_prompt_tokens_cost_beside_streams() {
        let mut pacer = Pacer::new(3.0);
        pacer.record(step(2, 0, 20));
        assert_eq!(pacer.budget(2, 1), Some(1), "no prompt token measured yet");
        // Each prompt token beside two streams adds 4 ms.
        for _ in 0..RECENT {
            pacer.record(step(2, 10, 60));
        }
        assert_eq!(pacer.budget(2, 1), Some(10));
        // One step the machine slowed moves nothing.
        pacer.record(step(2, 10, 600));
        assert_eq!(pacer.budget(2, 1), Some(10));
        // Never below one token, so a prompt always moves.
        for _ in 0..RECENT {
            pacer.record(step(2, 1, 1000));
        }
        assert_eq!(pacer.budget(2, 1), Some(1));
    }

    #[test]
    fn each_number_of_streams_gets_its_plain_step_measured() {
        let mut pacer = Pacer::new(2.0);
        pacer.record(step(1, 0, 10));
        pacer.record(step(1, 5, 20));
        assert_eq!(pacer.budget(1, 1), Some(5));
        // Three streams: one plain step first, then their own budget.
        assert_eq!(pacer.budget(3, 1), Some(0));
        pacer.record(step(3, 0, 30));
        assert_eq!(pacer.budget(3, 1), Some(15));
    }

    #[test]
    fn a_prompt_token_that_seemed_free_still_counts() {
        let mut pacer = Pacer::new(3.0);
        pacer.record(step(1, 0, 10));
        for _ in 0..RECENT {
            pacer.record(step(1, 4, 9));
        }
        // (3 - 1) x 10 ms at 0.1 ms a token, not the whole batch.
        let budget = pacer.budget(1, 0).unwrap();
        assert!((199..=200).contains(&budget), "{budget}");
    }

    #[test]
    fn waiting_requests_set_the_pace_the_streams_will_share() {
        let mut pacer = Pacer::new(3.0);
        pacer.record(step(1, 0, 10));
        pacer.record(step(1, 2, 14));
        // Alone the stream's step may take 30 ms: 10 tokens of 2 ms.
        assert_eq!(pacer.budget(1, 0), Some(10));
        // Three streams step in 25 ms: with two requests waiting, the step
        // may take 75 ms.
        pacer.record(step(3, 0, 25));
        assert_eq!(pacer.budget(1, 2), Some(32));
        // Four were never measured: three are the widest known.
        assert_eq!(pacer.budget(1, 3), Some(32));
    }
}
