//! Decode settings chosen at run time: the compute thread count and whether
//! to read ahead. ggml's compute threads spin at every graph barrier, so
//! when another process takes a core, each barrier waits for whichever
//! thread the kernel descheduled: one thread more than the free cores can
//! halve decode speed. Read-ahead overlaps reads with compute on the read
//! lanes, which need little CPU now that evicted pages are recycled rather
//! than faulted in afresh (`moe::store`), so the tuner starts with a thread
//! per core. Measured on two cores, bench preset under a cap of a third of
//! it (`docs/benchmarks.md`): with read-ahead and recycled pages two threads
//! give 12.79 tok/s against 11.32 for one; before recycling, when each miss
//! cost the lanes ~0.4 ms of page faults, one thread won (8.04 against 7.28).
//! It starts with a thread for each core other processes leave free as the
//! first step begins ([`StepTuner::start_with_load`]): a short reply ends
//! before probes could find a busy core.
//! The tuner measures the wall time of single-token decode steps with the
//! current setting and, now and then, with a neighbouring one (one thread
//! fewer or more, read-ahead toggled), and keeps whichever is faster. A
//! setting that lost is tried again only once probing it would cost at most
//! 5% of the decode time (four steps at two threads on a tiny model cost
//! as much as nine at one), and steps under 2 ms try a thread fewer at once. It
//! tries giving cores up (a thread fewer, read-ahead off) only while the
//! process's threads wait for a CPU a large share of each step
//! ([`super::contention`]): quiet, on two cores, they queue for 5-10% of a
//! step; beside a busy loop on one core, 35-85%. So a quiet machine runs
//! every step at its best setting instead of paying for probes.
//! It tries one thread more only where other processes leave a core for it
//! ([`super::contention::OtherLoad`]): at one thread beside a busy loop its
//! threads no longer queue, and probing two cost 20% there. While steps
//! read nothing on quiet cores with every thread running, it lets the
//! threads poll between the graph's splits instead of sleeping
//! ([`StepTuner::polls`]), which makes a fully cached streamed step as fast
//! as a resident one.
//! None of this changes results (ggml splits work by rows; read-ahead only
//! changes when bytes arrive; polling only when threads start; the gates
//! check all three).

use std::collections::VecDeque;

/// Steps remembered per setting.
const WINDOW: usize = 8;
/// Steps one probe runs.
const PROBE_STEPS: usize = 4;
/// Steps before the first probe.
const FIRST_PROBE: u32 = 4;
/// Steps between probes after one that switched; doubles once every
/// neighbour has been tried and lost since, up to [`MAX_INTERVAL`].
const MIN_INTERVAL: u32 = 12;
const MAX_INTERVAL: u32 = 192;
/// A probe wins when its median is at least this much faster.
const MARGIN: f64 = 0.93;
/// Share of decode time that probing a slower setting may cost (see
/// [`StepTuner::wait_after`]).
const PROBE_BUDGET: f64 = 0.05;
/// A step is compute-bound when it waited for reads less than this
/// fraction (1/N) of its time.
const COMPUTE_BOUND_WAIT: u64 = 4;
/// Cores are contended when the threads' run-queue delay over recent steps
/// is at least this share of the steps' time (median).
const CONTENDED_SHARE: f64 = 0.25;
/// A thread count is tried only while others leave at least that many
/// cores minus this free (a hog on one of two cores leaves ~1.0).
const FREE_CORE_SLACK: f64 = 0.5;
/// A step shorter than this (ns) is tried with a thread fewer on quiet cores
/// too: on a tiny model one thread decoded 4,586 tok/s and two 784.
const SHORT_STEP_NS: u64 = 2_000_000;
/// Steps in a row that must read nothing before the compute threads poll.
const POLL_AFTER: u32 = 4;
/// A step reads nothing when it waited for reads less than this fraction
/// (1/N) of its time (the bookkeeping of a step that hit everything).
const READ_FREE_WAIT: u64 = 100;

/// One decode setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// Compute threads.
    pub threads: u32,
    /// Read ahead the coming layers' experts (when the session can).
    pub read_ahead: bool,
}

/// Picks the setting of each decode step.
#[derive(Debug, Clone)]
pub struct StepTuner {
    min: u32,
    max: u32,
    can_read_ahead: bool,
    current: Setting,
    /// Recent step times per setting, indexed by [`Self::slot`].
    recent: Vec<VecDeque<u64>>,
    /// Setting being tried and steps it still runs.
    probe: Option<(Setting, usize)>,
    until_probe: u32,
    interval: u32,
    /// Which neighbour the next probe tries (round robin).
    next_neighbour: usize,
    last_probe: Option<Setting>,
    /// Probes lost since the last switch (or the start).
    lost: usize,
    /// The last step waited for reads less than 1/[`COMPUTE_BOUND_WAIT`] of it.
    compute_bound: bool,
    /// Recent steps' run-queue delay as a share of their time (`None`:
    /// not reported, so cores count as contended).
    queued: VecDeque<Option<f64>>,
    switches: u32,
    /// Steps in a row that waited for no read (see [`READ_FREE_WAIT`]).
    read_free: u32,
    /// Recent steps' cores kept busy by other processes.
    others: VecDeque<f64>,
    /// The starting thread count was set from the load ([`Self::start_with_load`]).
    started: bool,
}

impl StepTuner {
    /// A tuner choosing between `min` and `max` threads, and read-ahead on
    /// or off where `can_read_ahead`; it starts at `max` threads with
    /// read-ahead on where it can.
    pub fn new(min: u32, max: u32, can_read_ahead: bool) -> StepTuner {
        let max = max.max(1);
        let min = min.clamp(1, max);
        StepTuner {
            min,
            max,
            can_read_ahead,
            current: Setting { threads: max, read_ahead: can_read_ahead },
            recent: vec![VecDeque::new(); (max as usize + 1) * 2],
            probe: None,
            until_probe: FIRST_PROBE,
            interval: MIN_INTERVAL,
            next_neighbour: 0,
            last_probe: None,
            lost: 0,
            compute_bound: false,
            queued: VecDeque::new(),
            switches: 0,
            read_free: 0,
            others: VecDeque::new(),
            started: false,
        }
    }

    /// Says whether read-ahead can run now (the cache may come to hold
    /// the whole bank, leaving nothing to read). A change starts over from
    /// that case's starting setting.
    pub fn set_can_read_ahead(&mut self, can: bool) {
        if can != self.can_read_ahead {
            let threads = self.current.threads;
            *self = StepTuner {
                switches: self.switches,
                read_free: self.read_free,
                others: std::mem::take(&mut self.others),
                started: self.started,
                ..StepTuner::new(self.min, self.max, can)
            };
            // The thread count chosen for the load carries over.
            self.current.threads = threads;
        }
    }

    /// The setting for the next decode step.
    pub fn setting(&self) -> Setting {
        self.probe.map_or(self.current, |(s, _)| s)
    }

    /// The setting the tuner settled on (not a probe).
    pub fn settled(&self) -> Setting {
        self.current
    }

    /// How many times the settled setting changed.
    pub fn switches(&self) -> u32 {
        self.switches
    }

    fn slot(s: Setting) -> usize {
        s.threads as usize * 2 + usize::from(s.read_ahead)
    }

    /// Records the wall time of one single-token decode step run with
    /// [`Self::setting`], how long of it decode waited for reads, and how
    /// long the process's threads waited for a CPU meanwhile (summed over
    /// threads; `None` where unknown).
    pub fn record(&mut self, step_ns: u64, read_wait_ns: u64, queued_ns: Option<u64>) {
        self.compute_bound = read_wait_ns < step_ns / COMPUTE_BOUND_WAIT;
        self.read_free = if read_wait_ns < step_ns / READ_FREE_WAIT { self.read_free.saturating_add(1) } else { 0 };
        if self.queued.len() == WINDOW {
            self.queued.pop_front();
        }
        self.queued.push_back(queued_ns.map(|q| q as f64 / step_ns.max(1) as f64));
        let slot = Self::slot(self.setting());
        let window = &mut self.recent[slot];
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(step_ns);
        match self.probe {
            Some((probe, left)) if left > 1 => self.probe = Some((probe, left - 1)),
            Some((probe, _)) => {
                self.probe = None;
                let tried = median(self.recent[Self::slot(probe)].iter().rev().take(PROBE_STEPS));
                let now = median(self.recent[Self::slot(self.current)].iter());
                if tried < now * MARGIN {
                    self.current = probe;
                    self.switches += 1;
                    self.interval = MIN_INTERVAL;
                    self.lost = 0;
                    // What was measured with this setting before is history now.
                    let window = &mut self.recent[Self::slot(probe)];
                    window.drain(..window.len() - PROBE_STEPS);
                    // The setting left behind is the slower one now.
                    self.until_probe = self.wait_after(now, tried);
                } else {
                    self.lost += 1;
                    if self.lost >= self.neighbours().len() {
                        self.interval = (self.interval * 2).min(MAX_INTERVAL);
                    }
                    self.until_probe = self.wait_after(tried, now);
                }
            }
            None => {
                let neighbours = self.neighbours();
                if neighbours.is_empty() {
                    return;
                }
                self.until_probe = self.until_probe.saturating_sub(1);
                // Short steps try a thread fewer at once: a tiny model's
                // reply is over before four steps at every thread pay back.
                let fewer = Setting { threads: self.current.threads.saturating_sub(1), ..self.current };
                if self.last_probe.is_none() && neighbours.contains(&fewer) && self.short_steps() {
                    self.until_probe = 0;
                }
                if self.until_probe == 0 {
                    // Compute-bound steps try one more thread first (a cache that
                    // came to hold what decode routes, read-ahead then idle).
                    let up = Setting { threads: self.current.threads + 1, ..self.current };
                    let next = if self.compute_bound && neighbours.contains(&up) && self.last_probe != Some(up) {
                        up
                    } else {
                        self.next_neighbour += 1;
                        neighbours[(self.next_neighbour - 1) % neighbours.len()]
                    };
                    self.last_probe = Some(next);
                    self.probe = Some((next, PROBE_STEPS));
                }
            }
        }
    }

    /// Steps to wait before the next probe after one where `slower` (a
    /// median step time) lost to `faster`: long enough that probing costs at
    /// most [`PROBE_BUDGET`] of the decode time, and at least the interval.
    /// On a tiny model two threads took 0.3 ms a step against one's 0.14:
    /// with a fixed wait of 12 steps a 128-token reply ran at 0.74-0.91x
    /// the speed of `-t 1`.
    fn wait_after(&self, slower: f64, faster: f64) -> u32 {
        let cost = PROBE_STEPS as f64 * (slower - faster).max(0.0);
        let wait = (cost / (PROBE_BUDGET * faster.max(1.0))).ceil().min(f64::from(MAX_INTERVAL));
        (wait as u32).max(self.interval)
    }

    /// Whether the current setting's recent steps are short (see [`SHORT_STEP_NS`]).
    fn short_steps(&self) -> bool {
        median(self.recent[Self::slot(self.current)].iter()) < SHORT_STEP_NS as f64
    }

    /// Whether the tuner still wants [`Self::start_with_load`] before its
    /// first step.
    pub fn wants_start_load(&self) -> bool {
        !self.started
    }

    /// Sets the starting thread count from the cores other processes keep
    /// busy as the first step begins (`None`: unknown, start with every
    /// core): a thread for each core they leave free. Two threads spinning
    /// at every barrier beside a busy loop on one of two cores run a tiny
    /// model's steps 25 times slower than one thread (`docs/benchmarks.md`),
    /// far more than probes could win back in a short reply.
    pub fn start_with_load(&mut self, cores: Option<f64>) {
        self.started = true;
        if let Some(cores) = cores.filter(|_| self.recent.iter().all(VecDeque::is_empty)) {
            let free = (f64::from(self.max) - cores + FREE_CORE_SLACK).floor().max(0.0) as u32;
            self.current.threads = free.clamp(self.min, self.max);
            self.note_other_load(Some(cores));
        }
    }

    /// Records the cores other processes kept busy during the last step
    /// (`OtherLoad` in `contention.rs`; `None`: unknown, which allows every
    /// thread count).
    /// `None` (no new figure yet) keeps the last ones.
    pub fn note_other_load(&mut self, cores: Option<f64>) {
        let Some(cores) = cores else { return };
        if self.others.len() == WINDOW {
            self.others.pop_front();
        }
        self.others.push_back(cores);
    }

    /// Whether `threads` compute threads would each find a core others
    /// leave free (by the recent steps' median; true when unknown).
    fn cores_free_for(&self, threads: u32) -> bool {
        if self.others.is_empty() {
            return true;
        }
        let mut v: Vec<f64> = self.others.iter().copied().collect();
        v.sort_by(f64::total_cmp);
        f64::from(self.max) - v[v.len() / 2] >= f64::from(threads) - FREE_CORE_SLACK
    }

    /// Whether the compute threads should poll for work briefly between the
    /// graph's splits instead of sleeping at once: only while the last
    /// four steps read nothing (the lanes idle), recent steps show
    /// the cores quiet, and the settled setting (not a probe) runs every
    /// thread (a thread the step leaves idle would spin too, on a core it
    /// does not use), so a spinning thread takes no core another process or
    /// a read lane needs.
    pub fn polls(&self) -> bool {
        self.read_free >= POLL_AFTER
            && self.probe.is_none()
            && self.current.threads == self.max
            && self.queued.len() >= POLL_AFTER as usize
            && !self.contended()
    }

    /// True unless recent steps show the threads rarely waited for a CPU.
    fn contended(&self) -> bool {
        let mut shares = Vec::with_capacity(self.queued.len());
        for q in &self.queued {
            match q {
                Some(share) => shares.push(*share),
                None => return true,
            }
        }
        if shares.is_empty() {
            return true;
        }
        shares.sort_by(f64::total_cmp);
        shares[shares.len() / 2] >= CONTENDED_SHARE
    }

    /// One thread fewer, one more, read-ahead toggled: those that exist;
    /// the two that give cores up only while cores are contended, and a
    /// thread fewer also while steps are short (a tiny model's step is
    /// mostly the threads meeting at barriers).
    fn neighbours(&self) -> Vec<Setting> {
        let c = self.current;
        let contended = self.contended();
        let short = self.short_steps();
        let mut out = Vec::with_capacity(3);
        if c.threads > self.min && (contended || short) {
            out.push(Setting { threads: c.threads - 1, ..c });
        }
        if self.can_read_ahead && (contended || !c.read_ahead) {
            out.push(Setting { read_ahead: !c.read_ahead, ..c });
        }
        // More threads only where they would find a free core: fewer threads
        // no longer queue, so run-queue delay cannot see the other process.
        if c.threads < self.max && self.cores_free_for(c.threads + 1) {
            out.push(Setting { threads: c.threads + 1, ..c });
        }
        out
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

    /// Runs `steps` steps where a step with setting `s` costs `cost(s)`,
    /// half of it waiting for reads.
    fn run(tuner: &mut StepTuner, steps: usize, cost: impl Fn(Setting) -> u64) -> Vec<Setting> {
        run_waiting(tuner, steps, cost, 2)
    }

    /// The same, waiting for reads 1/`wait_part` of each step (0: never).
    fn run_waiting(tuner: &mut StepTuner, steps: usize, cost: impl Fn(Setting) -> u64, wait_part: u64) -> Vec<Setting> {
        (0..steps)
            .map(|_| {
                let s = tuner.setting();
                let c = cost(s);
                tuner.record(c, c.checked_div(wait_part).unwrap_or(0), None);
                s
            })
            .collect()
    }

    #[test]
    fn polls_only_after_read_free_steps_on_quiet_cores() {
        let mut t = StepTuner::new(1, 2, false);
        // Steps of 10 ms (shorter ones would try a thread fewer).
        let quiet = Some(100_000);
        for _ in 0..POLL_AFTER - 1 {
            t.record(10_000_000, 0, quiet);
            assert!(!t.polls(), "too few steps yet");
        }
        t.record(10_000_000, 0, quiet);
        assert!(t.polls());
        // A step that waited for a read stops it until enough steps read nothing again.
        t.record(10_000_000, 200_000, quiet);
        assert!(!t.polls());
        for _ in 0..POLL_AFTER {
            t.record(10_000_000, 0, quiet);
        }
        assert!(t.polls());
        // Contended cores (threads queued for half of each step) stop it...
        for _ in 0..WINDOW {
            t.record(100_000, 0, Some(50_000));
        }
        assert!(!t.polls());
        // ...and so does running fewer threads than the pool has...
        let mut fewer = StepTuner::new(1, 2, false);
        fewer.current.threads = 1;
        for _ in 0..WINDOW {
            fewer.record(100_000, 0, quiet);
        }
        assert!(!fewer.polls());
        // ...and a kernel that does not report run-queue delay.
        let mut unknown = StepTuner::new(1, 2, false);
        for _ in 0..WINDOW {
            unknown.record(100_000, 0, None);
        }
        assert!(!unknown.polls());
    }

    fn threads(cost: impl Fn(u32) -> u64) -> impl Fn(Setting) -> u64 {
        move |s| cost(s.threads)
    }

    #[test]
    fn stays_at_the_faster_setting_and_probes_less_and_less() {
        let mut t = StepTuner::new(1, 2, false);
        let used = run(&mut t, 200, threads(|n| if n == 2 { 50 } else { 80 }));
        assert_eq!(t.settled().threads, 2);
        assert_eq!(t.switches(), 0);
        // Probes back off: at once (short steps), then twice 48 steps later
        // (four steps 60% slower cost 5% of 48), then after 96 (the interval
        // doubled past that): three probes of four steps in 200 steps.
        assert_eq!(used.iter().filter(|s| s.threads == 1).count(), 3 * PROBE_STEPS);
        assert!(used[1..1 + PROBE_STEPS].iter().all(|s| s.threads == 1));
    }

    #[test]
    fn a_tiny_models_reply_pays_few_probes() {
        // Quiet cores, a tiny model: one thread 0.14 ms a step, two 0.3 ms
        // (measured). It tries one thread after the first step, and two
        // again only once in a 128-token reply.
        let mut t = StepTuner::new(1, 2, false);
        let steps: Vec<Setting> = (0..128)
            .map(|_| {
                let s = t.setting();
                t.record(if s.threads == 2 { 300_000 } else { 140_000 }, 0, Some(0));
                s
            })
            .collect();
        assert_eq!(t.settled().threads, 1);
        assert!(steps[1..1 + PROBE_STEPS].iter().all(|s| s.threads == 1), "{steps:?}");
        assert!(steps.iter().filter(|s| s.threads == 2).count() <= 1 + PROBE_STEPS, "{steps:?}");
    }

    #[test]
    fn moves_down_when_a_core_gets_busy_and_back_up_when_it_frees() {
        let mut t = StepTuner::new(1, 2, false);
        run(&mut t, 10, threads(|n| if n == 2 { 50 } else { 80 }));
        assert_eq!(t.settled().threads, 2);
        // A hog takes a core: two spinning threads now lose to one.
        run(&mut t, 100, threads(|n| if n == 2 { 150 } else { 85 }));
        assert_eq!(t.settled().threads, 1);
        // The hog ends.
        run(&mut t, 300, threads(|n| if n == 2 { 50 } else { 80 }));
        assert_eq!(t.settled().threads, 2);
        assert_eq!(t.switches(), 2);
    }

    #[test]
    fn starts_with_the_cores_others_leave_free() {
        // One of two cores busy as the first step begins.
        let mut t = StepTuner::new(1, 2, true);
        assert!(t.wants_start_load());
        t.start_with_load(Some(0.8));
        assert!(!t.wants_start_load());
        assert_eq!(t.setting().threads, 1);
        // It does not probe two threads while the core stays taken.
        let steps = run(&mut t, 60, threads(|n| if n == 2 { 150 } else { 85 }));
        assert!(steps.iter().all(|s| s.threads == 1), "{steps:?}");
        // Quiet, or a little busy, or unknown: every core.
        for load in [Some(0.0), Some(0.3), None] {
            let mut t = StepTuner::new(1, 2, true);
            t.start_with_load(load);
            assert_eq!(t.setting().threads, 2, "{load:?}");
        }
        // Both cores busy: still one thread.
        let mut t = StepTuner::new(1, 2, true);
        t.start_with_load(Some(2.0));
        assert_eq!(t.setting().threads, 1);
        // A change of read-ahead keeps the count chosen for the load.
        t.set_can_read_ahead(false);
        assert_eq!(t.setting().threads, 1);
    }

    #[test]
    fn short_steps_try_a_thread_fewer_on_quiet_cores() {
        // Quiet cores (no run-queue delay), steps of a quarter millisecond
        // where one thread beats two.
        let mut t = StepTuner::new(1, 2, false);
        for _ in 0..60 {
            let s = t.setting();
            t.record(if s.threads == 2 { 1_000_000 } else { 250_000 }, 0, Some(0));
        }
        assert_eq!(t.settled().threads, 1);
        // Long steps on quiet cores never try it.
        let mut t = StepTuner::new(1, 2, false);
        let steps: Vec<Setting> = (0..60)
            .map(|_| {
                let s = t.setting();
                t.record(if s.threads == 2 { 50_000_000 } else { 20_000_000 }, 0, Some(0));
                s
            })
            .collect();
        assert!(steps.iter().all(|s| s.threads == 2));
    }

    #[test]
    fn tries_no_more_threads_while_others_keep_a_core_busy() {
        let mut t = StepTuner::new(1, 2, false);
        let hog = threads(|n| if n == 2 { 150 } else { 85 });
        run(&mut t, 100, hog);
        assert_eq!(t.settled().threads, 1);
        // Told a core is busy (one core of two), it stops probing two threads.
        let steps: Vec<Setting> = (0..200)
            .map(|_| {
                t.note_other_load(Some(0.97));
                let s = t.setting();
                t.record(85, 40, Some(0));
                s
            })
            .collect();
        assert!(steps[WINDOW..].iter().all(|s| s.threads == 1), "no probe while the core is taken");
        // The other process leaves: two threads are tried again and win.
        for _ in 0..300 {
            t.note_other_load(Some(0.02));
            let s = t.setting();
            t.record(if s.threads == 2 { 50 } else { 80 }, 25, Some(0));
        }
        assert_eq!(t.settled().threads, 2);
    }

    #[test]
    fn climbs_one_step_at_a_time_on_many_cores() {
        let mut t = StepTuner::new(1, 8, false);
        // Best at 5 threads (three cores busy).
        run(&mut t, 2000, threads(|n| 100 + 30 * u64::from(n.abs_diff(5))));
        assert_eq!(t.settled().threads, 5);
    }

    #[test]
    fn read_ahead_goes_off_when_it_costs_and_comes_back_when_it_pays() {
        let mut t = StepTuner::new(1, 2, true);
        assert!(t.setting().read_ahead);
        // Quiet: read-ahead hides reads (100 against 130).
        let quiet = |s: Setting| if s.read_ahead { 100 } else { 130 } + if s.threads == 2 { 0 } else { 20 };
        run(&mut t, 100, quiet);
        assert_eq!(t.settled(), Setting { threads: 2, read_ahead: true });
        // Busy: the lanes' work now slows compute more than overlap gains.
        let busy = |s: Setting| if s.read_ahead { 260 } else { 190 } + if s.threads == 2 { 60 } else { 0 };
        run(&mut t, 600, busy);
        assert_eq!(t.settled(), Setting { threads: 1, read_ahead: false });
        run(&mut t, 1200, quiet);
        assert_eq!(t.settled(), Setting { threads: 2, read_ahead: true });
    }

    #[test]
    fn starts_on_every_core_and_moves_down_when_the_lanes_need_one() {
        let mut t = StepTuner::new(1, 2, true);
        assert_eq!(t.setting(), Setting { threads: 2, read_ahead: true });
        // Read-bound, the lanes short of CPU: one thread with read-ahead wins.
        let read_bound = |s: Setting| if s.read_ahead { 100 } else { 140 } + if s.threads == 2 { 30 } else { 0 };
        run(&mut t, 100, read_bound);
        assert_eq!(t.settled(), Setting { threads: 1, read_ahead: true });
        // The cache comes to hold everything: all cores compute, no probes of read-ahead.
        t.set_can_read_ahead(false);
        let used = run(&mut t, 100, threads(|n| if n == 2 { 50 } else { 90 }));
        assert!(used.iter().all(|s| !s.read_ahead));
        assert_eq!(t.settled(), Setting { threads: 2, read_ahead: false });
        // At most three probes of one thread (45% slower) in 100 steps.
        assert!(used.iter().filter(|s| s.threads == 2).count() >= 100 - 3 * PROBE_STEPS);
    }

    #[test]
    fn compute_bound_steps_try_one_more_thread_first() {
        // Down at one thread while reads were the bottleneck (its first
        // probe, a thread fewer, won; the next is due at step 29).
        let mut t = StepTuner::new(1, 2, true);
        let read_bound = |s: Setting| if s.read_ahead { 100 } else { 140 } + if s.threads == 2 { 30 } else { 0 };
        run(&mut t, 28, read_bound);
        assert_eq!(t.settled(), Setting { threads: 1, read_ahead: true });
        // Then the cache holds what decode routes: nothing left to wait for.
        let cost = threads(|n| if n == 2 { 50 } else { 90 });
        let used = run_waiting(&mut t, 60, &cost, 0);
        let first_probe = used.iter().find(|s| **s != Setting { threads: 1, read_ahead: true });
        assert_eq!(first_probe, Some(&Setting { threads: 2, read_ahead: true }));
        assert_eq!(t.settled(), Setting { threads: 2, read_ahead: true });
    }

    #[test]
    fn every_neighbour_is_tried_and_a_costly_loser_waits_longer() {
        // Steps of 80 ms at the best setting, contended cores (run-queue
        // delay unknown): one thread fewer (25% slower) is tried at step 4,
        // read-ahead off (63% slower) 20 steps after that probe, then the
        // wait is 50 steps, so probing costs at most 5% of the time.
        const MS: u64 = 1_000_000;
        let mut t = StepTuner::new(1, 2, true);
        let cost = |s: Setting| {
            MS * if !s.read_ahead {
                130
            } else if s.threads == 2 {
                80
            } else {
                100
            }
        };
        let used = run(&mut t, 100, cost);
        let first = FIRST_PROBE as usize;
        let second = first + PROBE_STEPS + 20;
        let third = second + PROBE_STEPS + 50;
        assert!(used[first..first + PROBE_STEPS].iter().all(|s| *s == Setting { threads: 1, read_ahead: true }));
        assert!(used[second..second + PROBE_STEPS].iter().all(|s| *s == Setting { threads: 2, read_ahead: false }));
        let settled = Setting { threads: 2, read_ahead: true };
        assert!(used[second + PROBE_STEPS..third].iter().all(|s| *s == settled));
        assert_ne!(used[third], settled, "the third probe comes 50 steps later");
        assert_eq!(t.settled(), settled);
        let extra: u64 = used.iter().map(|&s| cost(s) - 80 * MS).sum();
        assert!(extra as f64 <= PROBE_BUDGET * 2.0 * (100 * 80 * MS) as f64, "probes cost {extra}");
    }

    #[test]
    fn a_quiet_machine_pays_no_probes_and_a_busy_one_gets_them() {
        // Steps in milliseconds: long enough that quiet cores try no thread fewer.
        const MS: u64 = 1_000_000;
        let mut t = StepTuner::new(1, 2, true);
        let best = Setting { threads: 2, read_ahead: true };
        // Quiet: the threads queue for 5% of each step; nothing is tried.
        let used: Vec<Setting> = (0..200)
            .map(|_| {
                let s = t.setting();
                t.record(80 * MS, 20 * MS, Some(4 * MS));
                s
            })
            .collect();
        assert!(used.iter().all(|s| *s == best));
        // Another process takes a core: two threads queue for half of each
        // step and lose to one; the tuner finds out within a few probes.
        for _ in 0..100 {
            let s = t.setting();
            let (cost, queued) = if s.threads == 2 { (200, 100) } else { (90, 5) };
            t.record(cost * MS, 20 * MS, Some(queued * MS));
        }
        assert_eq!(t.settled().threads, 1);
        // At one thread the threads no longer queue, but one more is always
        // tried: when the core frees up, the tuner climbs back.
        for _ in 0..300 {
            let s = t.setting();
            let cost = if s.threads == 2 { 70 } else { 90 };
            t.record(cost * MS, 20 * MS, Some(3 * MS));
        }
        assert_eq!(t.settled(), best);
    }

    #[test]
    fn fixed_threads_tune_read_ahead_only() {
        let mut t = StepTuner::new(2, 2, true);
        let used = run(&mut t, 300, |s| if s.read_ahead { 100 } else { 50 });
        assert!(used.iter().all(|s| s.threads == 2));
        assert!(!t.settled().read_ahead);
    }

    #[test]
    fn one_core_without_read_ahead_never_probes() {
        let mut t = StepTuner::new(1, 1, false);
        assert!(run(&mut t, 50, |_| 10).iter().all(|s| s.threads == 1 && !s.read_ahead));
    }
}
