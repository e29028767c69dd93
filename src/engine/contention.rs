//! How long this process's threads waited for a CPU: the kernel's per-thread
//! run-queue delay (`/proc/self/task/*/schedstat`, second field), summed over
//! every thread but the read lanes (which mostly sleep in reads). Near zero
//! while the cores are free; a large share of a step when another process
//! competes for them. The step tuner tries giving cores up (fewer threads,
//! read-ahead off) only then, so a quiet machine pays no probes for it.

use crate::moe::LANE_THREAD_PREFIX;

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
}
