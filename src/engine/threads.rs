//! The decode thread count, chosen at run time. ggml's compute threads
//! spin at every graph barrier, so when another process takes a core, each
//! barrier waits for whichever thread the kernel descheduled: one thread
//! more than the free cores can halve decode speed. The tuner measures the
//! compute time of decode steps at the current count and, now and then, at
//! one fewer or one more, and keeps whichever is faster. Thread counts do
//! not change results (ggml splits work by rows; the gates check it).

use std::collections::VecDeque;

/// Steps remembered per thread count.
const WINDOW: usize = 8;
/// Steps one probe runs.
const PROBE_STEPS: usize = 3;
/// Steps before the first probe.
const FIRST_PROBE: u32 = 4;
/// Steps between probes after one that switched; doubles after each probe
/// that did not, up to [`MAX_INTERVAL`].
const MIN_INTERVAL: u32 = 16;
const MAX_INTERVAL: u32 = 256;
/// A probe wins when its median is at least this much faster.
const MARGIN: f64 = 0.93;

/// Picks the compute thread count for each decode step.
#[derive(Debug, Clone)]
pub struct ThreadTuner {
    max: u32,
    current: u32,
    recent: Vec<VecDeque<u64>>,
    /// Thread count being tried and steps it still runs.
    probe: Option<(u32, usize)>,
    until_probe: u32,
    interval: u32,
    probe_down: bool,
    switches: u32,
}

impl ThreadTuner {
    /// A tuner choosing between 1 and `max` threads, starting at `max`.
    pub fn new(max: u32) -> ThreadTuner {
        let max = max.max(1);
        ThreadTuner {
            max,
            current: max,
            recent: vec![VecDeque::new(); max as usize + 1],
            probe: None,
            until_probe: FIRST_PROBE,
            interval: MIN_INTERVAL,
            probe_down: true,
            switches: 0,
        }
    }

    /// Threads for the next decode step.
    pub fn threads(&self) -> u32 {
        self.probe.map_or(self.current, |(t, _)| t)
    }

    /// The count the tuner settled on (not a probe).
    pub fn settled(&self) -> u32 {
        self.current
    }

    /// How many times the settled count changed.
    pub fn switches(&self) -> u32 {
        self.switches
    }

    /// Records the compute time of one single-token decode step run at
    /// [`Self::threads`].
    pub fn record(&mut self, compute_ns: u64) {
        let t = self.threads() as usize;
        let window = &mut self.recent[t];
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(compute_ns);
        match self.probe {
            Some((probe, left)) if left > 1 => self.probe = Some((probe, left - 1)),
            Some((probe, _)) => {
                self.probe = None;
                let tried = median(self.recent[probe as usize].iter().rev().take(PROBE_STEPS));
                let now = median(self.recent[self.current as usize].iter());
                if tried < now * MARGIN {
                    self.current = probe;
                    self.switches += 1;
                    self.interval = MIN_INTERVAL;
                    // What was measured at the old count is history now.
                    let window = &mut self.recent[probe as usize];
                    window.drain(..window.len() - PROBE_STEPS);
                } else {
                    self.interval = (self.interval * 2).min(MAX_INTERVAL);
                }
                self.until_probe = self.interval;
            }
            None if self.max > 1 => {
                self.until_probe = self.until_probe.saturating_sub(1);
                if self.until_probe == 0 {
                    self.probe = Some((self.neighbour(), PROBE_STEPS));
                }
            }
            None => {}
        }
    }

    /// One fewer or one more thread, alternating where both exist.
    fn neighbour(&mut self) -> u32 {
        let down = self.current > 1 && (self.probe_down || self.current == self.max);
        self.probe_down = !self.probe_down;
        if down { self.current - 1 } else { self.current + 1 }
    }
}

fn median<'a>(values: impl Iterator<Item = &'a u64>) -> f64 {
    let mut v: Vec<u64> = values.copied().collect();
    if v.is_empty() {
        return f64::INFINITY;
    }
    v.sort_unstable();
    v[v.len() / 2] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `steps` steps where a step at `t` threads costs `cost(t)`.
    fn run(tuner: &mut ThreadTuner, steps: usize, cost: impl Fn(u32) -> u64) -> Vec<u32> {
        (0..steps)
            .map(|_| {
                let t = tuner.threads();
                tuner.record(cost(t));
                t
            })
            .collect()
    }

    #[test]
    fn stays_at_the_faster_count_and_probes_less_and_less() {
        let mut t = ThreadTuner::new(2);
        let used = run(&mut t, 200, |t| if t == 2 { 50 } else { 80 });
        assert_eq!(t.settled(), 2);
        assert_eq!(t.switches(), 0);
        // Probes back off: after 4 steps, then 32 and 64 more (each failure doubles
        // the wait from 16): three probes of three steps in 200 steps.
        assert_eq!(used.iter().filter(|&&x| x == 1).count(), 3 * PROBE_STEPS);
    }

    #[test]
    fn moves_down_when_a_core_gets_busy_and_back_up_when_it_frees() {
        let mut t = ThreadTuner::new(2);
        run(&mut t, 10, |t| if t == 2 { 50 } else { 80 });
        assert_eq!(t.settled(), 2);
        // A hog takes a core: two spinning threads now lose to one.
        run(&mut t, 100, |t| if t == 2 { 150 } else { 85 });
        assert_eq!(t.settled(), 1);
        // The hog ends.
        run(&mut t, 300, |t| if t == 2 { 50 } else { 80 });
        assert_eq!(t.settled(), 2);
        assert_eq!(t.switches(), 2);
    }

    #[test]
    fn climbs_one_step_at_a_time_on_many_cores() {
        let mut t = ThreadTuner::new(8);
        // Best at 5 threads (three cores busy).
        run(&mut t, 2000, |t| 100 + 30 * u64::from(t.abs_diff(5)));
        assert_eq!(t.settled(), 5);
    }

    #[test]
    fn one_core_never_probes() {
        let mut t = ThreadTuner::new(1);
        assert!(run(&mut t, 50, |_| 10).iter().all(|&x| x == 1));
    }
}
