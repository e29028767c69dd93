//! How long this process's threads waited for a CPU: the kernel's per-thread
//! run-queue delay (`/proc/self/task/*/schedstat`, second field), summed over
//! every thread but the read lanes (which mostly sleep in reads). Near zero
//! while the cores are free; a large share of a step when another process
//! competes for them. The step tuner tries giving cores up (fewer threads,
//! read-ahead off) only then, so a quiet machine pays no probes for it.
//!
//! Once it runs fewer threads than cores, its threads no longer queue, so
//! run-queue delay cannot tell whether the other process is still there:
//! [`OtherLoad`] measures the cores other processes keep busy, and the
//! tuner tries more threads only where they would find a free core.

use crate::moe::LANE_THREAD_PREFIX;

/// Clock ticks per CPU (10 ms each at the usual 100 Hz) a figure of
/// [`OtherLoad`] spans at least: one tick's rounding is a fifth of a core.
pub const MIN_TICKS_PER_CPU: u64 = 5;

/// Reads the summed run-queue delay between calls.
#[derive(Debug)]
pub struct RunQueueDelay {
    last: Option<u64>,
}

impl RunQueueDelay {
    /// Starts counting from now.
    pub fn new() -> RunQueueDelay {
        RunQueueDelay { last: total_delay_ns() }
    }

    /// Nanoseconds the threads spent runnable but not running since the
    /// last call (summed over threads); `None` where the kernel does not
    /// report it.
    pub fn since_last(&mut self) -> Option<u64> {
        let now = total_delay_ns()?;
        let before = self.last.replace(now)?;
        // A thread that exited takes its delay with it: never negative.
        Some(now.saturating_sub(before))
    }
}

impl Default for RunQueueDelay {
    fn default() -> Self {
        RunQueueDelay::new()
    }
}

/// The cores other processes kept busy between calls: the machine's busy
/// time (`/proc/stat`: user, nice and system time of every CPU) minus this
/// process's (`/proc/self/stat`: utime and stime), as a share of all the
/// CPUs' time times their number. Interrupt time is left out: much of it
/// is this process's own reads.
#[derive(Debug)]
pub struct OtherLoad {
    last: Option<CpuTimes>,
}

/// Clock ticks at one moment.
#[derive(Debug, Clone, Copy)]
struct CpuTimes {
    busy: u64,
    total: u64,
    cpus: u32,
    own: u64,
}

impl OtherLoad {
    /// Starts counting from now.
    pub fn new() -> OtherLoad {
        OtherLoad { last: cpu_times() }
    }

    /// Cores other processes used since the last figure (0 up to the CPU
    /// count); `None` where the kernel does not report it, or where fewer
    /// than [`MIN_TICKS_PER_CPU`] clock ticks per CPU passed since the last
    /// figure: it then goes on counting from there, so steps shorter than
    /// a tick still add up to a figure instead of rounding to nothing.
    pub fn since_last(&mut self) -> Option<f64> {
        let now = cpu_times()?;
        let Some(before) = self.last else {
            self.last = Some(now);
            return None;
        };
        let total = now.total.checked_sub(before.total)?;
        if total < MIN_TICKS_PER_CPU * u64::from(now.cpus) {
            return None;
        }
        self.last = Some(now);
        let busy = now.busy.saturating_sub(before.busy);
        let others = busy.saturating_sub(now.own.saturating_sub(before.own));
        Some((others as f64 / total as f64 * f64::from(now.cpus)).min(f64::from(now.cpus)))
    }
}

impl Default for OtherLoad {
    fn default() -> Self {
        OtherLoad::new()
    }
}

/// Threads of other processes runnable at this moment: the kernel's
/// `procs_running` (`/proc/stat`) less this process's own runnable threads,
/// the fewest of a few samples a fifth of a millisecond apart (`None` where
/// the kernel does not report it). Unlike [`OtherLoad`] it needs no clock
/// tick to pass: it tells a decode about to start whether another process
/// holds a core. The fewest, because the two counts are read one after the
/// other: a compute thread of this process that goes to sleep between them
/// (as ggml's do just after a graph) counts as another process's in that
/// sample (on a quiet machine, one of five samples in one of three demo
/// runs); a busy loop elsewhere is runnable in every sample.
pub fn others_running_now() -> Option<f64> {
    const SAMPLES: u32 = 5;
    let mut fewest = u64::MAX;
    for i in 0..SAMPLES {
        if i > 0 {
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let running: u64 = stat.lines().find_map(|l| l.strip_prefix("procs_running "))?.trim().parse().ok()?;
        fewest = fewest.min(running.saturating_sub(own_running_threads()?));
    }
    Some(fewest as f64)
}

/// This process's threads in state R (running or runnable).
fn own_running_threads() -> Option<u64> {
    let mut running = 0;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        let state = stat.rfind(')').and_then(|at| stat[at + 1..].split_whitespace().next());
        running += u64::from(state == Some("R"));
    }
    Some(running)
}

fn cpu_times() -> Option<CpuTimes> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, total, cpus) = parse_proc_stat(&stat)?;
    let own = parse_own_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(CpuTimes { busy, total, cpus, own })
}

/// Busy (user + nice + system) and total ticks of the `cpu` line, and the
/// number of `cpuN` lines.
fn parse_proc_stat(stat: &str) -> Option<(u64, u64, u32)> {
    let mut lines = stat.lines();
    let ticks: Vec<u64> =
        lines.next()?.strip_prefix("cpu ")?.split_whitespace().map_while(|v| v.parse().ok()).take(8).collect();
    if ticks.len() < 4 {
        return None;
    }
    let cpus =
        lines.filter(|l| l.strip_prefix("cpu").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))).count();
    Some((ticks[0] + ticks[1] + ticks[2], ticks.iter().sum(), u32::try_from(cpus).ok().filter(|&n| n > 0)?))
}

/// utime + stime of a `/proc/PID/stat` line (fields 14 and 15; the command
/// name before them may hold spaces and parentheses).
fn parse_own_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn total_delay_ns() -> Option<u64> {
    let mut sum = None;
    for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let dir = entry.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if name.starts_with(LANE_THREAD_PREFIX) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(dir.join("schedstat")) else { continue };
        if let Some(delay) = stat.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()) {
            *sum.get_or_insert(0) += delay;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_is_counted_between_calls_where_the_kernel_reports_it() {
        let mut d = RunQueueDelay::new();
        if std::fs::metadata("/proc/self/schedstat").is_err() {
            assert_eq!(d.since_last(), None);
            return;
        }
        // Two calls in a row: some non-negative amount, never a panic or a wrap.
        let first = d.since_last().expect("schedstat is readable");
        let second = d.since_last().expect("schedstat is readable");
        assert!(first < 60_000_000_000 && second < 60_000_000_000, "{first} {second}");
    }

    #[test]
    fn proc_stat_lines_parse() {
        let stat =
            "cpu  100 5 40 800 10 3 2 0 0 0\ncpu0 50 2 20 400 5 1 1 0 0 0\ncpu1 50 3 20 400 5 2 1 0 0 0\nintr 5\n";
        assert_eq!(parse_proc_stat(stat), Some((145, 960, 2)));
        assert_eq!(parse_proc_stat("intr 5\n"), None);
        let own = "4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 31 17 0 0 20 0 3";
        assert_eq!(parse_own_ticks(own), Some(48));
        assert_eq!(parse_own_ticks("4242 (x) S 1"), None);
    }

    #[test]
    fn other_load_is_a_share_of_the_cpus() {
        let mut load = OtherLoad::new();
        if std::fs::metadata("/proc/stat").is_err() {
            assert_eq!(load.since_last(), None);
            return;
        }
        // Let some ticks pass; whatever else runs, the figure stays in range.
        let until = std::time::Instant::now() + std::time::Duration::from_millis(50);
        while std::time::Instant::now() < until {
            std::hint::black_box(0u64);
        }
        if let Some(cores) = load.since_last() {
            let cpus = parse_proc_stat(&std::fs::read_to_string("/proc/stat").unwrap()).unwrap().2;
            assert!((0.0..=f64::from(cpus)).contains(&cores), "{cores}");
        }
    }
}
