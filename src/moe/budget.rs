//! The expert cache budget: `auto` sizes it from the memory the machine and
//! the process's cgroup allow, minus what bmoe holds besides the cache;
//! fixed budgets are checked against one token's working set and the cgroup
//! limit. The arithmetic is pure; [`MemoryLimits::read`] reads `/proc` and
//! `/sys/fs/cgroup` (v1 and v2).

use std::path::{Path, PathBuf};

/// How the cache budget is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheBudget {
    /// No cache: routed experts are read again for every token.
    Off,
    /// A fixed number of bytes; `force` accepts a budget below one token's
    /// working set.
    Fixed {
        /// Budget in bytes.
        bytes: u64,
        /// Accept a budget that cannot hold one token's experts.
        force: bool,
    },
    /// Sized at open from the memory available, up to `ceil` bytes.
    Auto {
        /// Upper bound in bytes.
        ceil: Option<u64>,
    },
}

/// What limits memory for this process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryLimits {
    /// The machine's `MemAvailable` (reclaimable page cache counts as available).
    pub available: Option<u64>,
    /// The tightest memory limit of the process's cgroup and its ancestors.
    pub cgroup_limit: Option<u64>,
    /// Which cgroup sets it.
    pub cgroup: Option<String>,
}

/// Sizes of what bmoe holds, as the budget needs them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Holdings {
    /// Every streamed expert of every layer.
    pub bank: u64,
    /// One token's routed experts over all layers (k per layer).
    pub working_set: u64,
    /// Non-expert weights, which stay resident.
    pub dense: u64,
    /// KV cache, compute buffers and the rest of the process's own memory.
    pub context: u64,
}

/// The chosen budget and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Bytes.
    pub bytes: u64,
    /// A line for the user: how the budget was chosen, or a warning.
    pub note: Option<String>,
}

fn mib(b: u64) -> String {
    let m = b as f64 / 1048576.0;
    if m < 10.0 { format!("{m:.2} MiB") } else { format!("{m:.0} MiB") }
}

/// Headroom kept free: 5% of the memory limit, at least 64 MiB. Measured
/// on the bench model under a 1926 MiB cap (docs/benchmarks.md, "The auto
/// budget's margin"): 10% left 296 MiB unused and read 12% more bytes per
/// token; a budget 300 MiB over this margin's pushed the dense weights out.
pub fn margin(limit: u64) -> u64 {
    (limit / 20).max(64 << 20)
}

/// Resolves `budget` for `held`, given `limits`. Errors are refusals with
/// their reason (a fixed budget below the working set without `force`).
pub fn decide(budget: CacheBudget, held: &Holdings, limits: &MemoryLimits) -> Result<Decision, String> {
    let limit = match (limits.available, limits.cgroup_limit) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    };
    match budget {
        CacheBudget::Off => Ok(Decision { bytes: 0, note: None }),
        CacheBudget::Auto { ceil } => {
            let Some(limit) = limit else {
                let bytes = ceil.unwrap_or(0).min(held.bank);
                return Ok(Decision {
                    bytes,
                    note: Some(format!("cache auto: {}: the memory available is unknown here", mib(bytes))),
                });
            };
            let spare = limit.saturating_sub(held.dense + held.context + margin(limit));
            let mut bytes = spare.min(held.bank);
            let mut why = format!(
                "cache auto: {} = {} {} - dense weights {} - context {} - margin {}",
                mib(bytes),
                if limits.cgroup_limit == Some(limit) { "cgroup limit" } else { "available" },
                mib(limit),
                mib(held.dense),
                mib(held.context),
                mib(margin(limit)),
            );
            if spare >= held.bank {
                why.push_str(&format!(", capped at the whole bank {}", mib(held.bank)));
            }
            if let Some(c) = ceil.filter(|&c| c < bytes) {
                bytes = c;
                why = format!("{why}, capped by --cache-ceil-mb at {}", mib(c));
            }
            if bytes < held.working_set {
                why.push_str(&format!(
                    "; below one token's working set ({}): expect few hits; a cache this small is slower \
                     than none, so it is turned off",
                    mib(held.working_set)
                ));
                bytes = 0;
            }
            Ok(Decision { bytes, note: Some(why) })
        }
        CacheBudget::Fixed { bytes, force } => {
            if bytes < held.working_set && !force {
                return Err(format!(
                    "a cache budget of {} is below one token's working set ({}): it would evict each layer's \
                     experts before they come round again and run slower than no cache; use a larger budget, \
                     --cache-mb 0, auto, or --force-cache",
                    mib(bytes),
                    mib(held.working_set)
                ));
            }
            let mut note = None;
            if let Some(c) = limits.cgroup_limit
                && bytes.min(held.bank) + held.dense + held.context > c
            {
                note = Some(format!(
                    "the cache budget {} beside the dense weights {} and context {} exceeds the cgroup limit {} \
                     ({}): the mapped dense weights will be evicted and fault back in; `--cache-mb auto` fits",
                    mib(bytes),
                    mib(held.dense),
                    mib(held.context),
                    mib(c),
                    limits.cgroup.as_deref().unwrap_or("?")
                ));
            } else if bytes >= held.bank {
                note = Some(format!(
                    "cache budget {} holds every expert ({}): nothing will be evicted",
                    mib(bytes),
                    mib(held.bank)
                ));
            } else if bytes < held.working_set {
                note = Some(format!(
                    "cache budget {} is below one token's working set ({}): expect a hit rate near 0%",
                    mib(bytes),
                    mib(held.working_set)
                ));
            }
            Ok(Decision { bytes, note })
        }
    }
}

impl MemoryLimits {
    /// Reads `MemAvailable` and the process's cgroup memory limit.
    pub fn read() -> MemoryLimits {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let available = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kib| kib * 1024);
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let (cgroup_limit, cgroup) = match cgroup_limit(&cgroups, Path::new("/sys/fs/cgroup")) {
            Some((limit, path)) => (Some(limit), Some(path)),
            None => (None, None),
        };
        MemoryLimits { available, cgroup_limit, cgroup }
    }

    /// The smaller of the memory available and the cgroup limit, if known.
    pub fn tightest(&self) -> Option<u64> {
        self.available.into_iter().chain(self.cgroup_limit).min()
    }
}

/// No limit: v1 writes the largest page-aligned i64 instead.
const V1_UNLIMITED: u64 = 1 << 62;

/// The tightest memory limit on the cgroup path in `proc_cgroup` (the text
/// of `/proc/self/cgroup`), under the mount `root`: v1's
/// `hierarchical_memory_limit`, or the smallest `memory.max` from the
/// cgroup up to the root in v2.
pub fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<(u64, String)> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        if controllers.split(',').any(|c| c == "memory") {
            let dir = root.join("memory").join(path.trim_start_matches('/'));
            let stat = std::fs::read_to_string(dir.join("memory.stat")).ok()?;
            let limit = stat
                .lines()
                .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                .and_then(|v| v.trim().parse::<u64>().ok())?;
            return (limit < V1_UNLIMITED).then(|| (limit, format!("v1 {path}")));
        }
    }
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let mut best: Option<(u64, String)> = None;
    let mut dir: PathBuf = root.join(path.trim_start_matches('/'));
    loop {
        if let Some(limit) =
            std::fs::read_to_string(dir.join("memory.max")).ok().and_then(|t| t.trim().parse::<u64>().ok())
            && best.as_ref().is_none_or(|(b, _)| limit < *b)
        {
            let name =
                dir.strip_prefix(root).map_or_else(|_| dir.display().to_string(), |p| format!("/{}", p.display()));
            best = Some((limit, format!("v2 {name}")));
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            break;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn held() -> Holdings {
        Holdings { bank: 5184 * MIB, working_set: 340 * MIB, dense: 600 * MIB, context: 140 * MIB }
    }

    #[test]
    fn auto_fits_under_the_cgroup_limit() {
        let limits = MemoryLimits { available: Some(20_000 * MIB), cgroup_limit: Some(2048 * MIB), cgroup: None };
        let d = decide(CacheBudget::Auto { ceil: None }, &held(), &limits).unwrap();
        // 2048 - 600 - 140 - 102.4 (5%)
        assert_eq!(d.bytes / MIB, 1205);
        assert!(d.note.unwrap().contains("cgroup limit 2048 MiB"));
        let d = decide(CacheBudget::Auto { ceil: Some(500 * MIB) }, &held(), &limits).unwrap();
        assert_eq!(d.bytes, 500 * MIB);
        // Plenty of memory: the whole bank.
        let roomy = MemoryLimits { available: Some(64_000 * MIB), cgroup_limit: None, cgroup: None };
        assert_eq!(decide(CacheBudget::Auto { ceil: None }, &held(), &roomy).unwrap().bytes, held().bank);
        // Too little for one token: off.
        let tight = MemoryLimits { available: Some(1100 * MIB), cgroup_limit: None, cgroup: None };
        let d = decide(CacheBudget::Auto { ceil: None }, &held(), &tight).unwrap();
        assert_eq!(d.bytes, 0);
        assert!(d.note.unwrap().contains("turned off"));
    }

    #[test]
    fn fixed_budgets_are_checked() {
        let limits = MemoryLimits {
            available: Some(20_000 * MIB),
            cgroup_limit: Some(2048 * MIB),
            cgroup: Some("v1 /x".into()),
        };
        let e = decide(CacheBudget::Fixed { bytes: 250 * MIB, force: false }, &held(), &limits).unwrap_err();
        assert!(e.contains("below one token's working set (340 MiB)") && e.contains("--force-cache"), "{e}");
        let d = decide(CacheBudget::Fixed { bytes: 250 * MIB, force: true }, &held(), &limits).unwrap();
        assert_eq!(d.bytes, 250 * MIB);
        let d = decide(CacheBudget::Fixed { bytes: 1800 * MIB, force: false }, &held(), &limits).unwrap();
        assert!(d.note.unwrap().contains("exceeds the cgroup limit 2048 MiB (v1 /x)"));
        assert!(
            decide(CacheBudget::Fixed { bytes: 1000 * MIB, force: false }, &held(), &limits).unwrap().note.is_none()
        );
    }

    #[test]
    fn reads_cgroup_limits() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // v1: the hierarchical limit of the process's memory cgroup.
        std::fs::create_dir_all(root.join("memory/bench")).unwrap();
        std::fs::write(root.join("memory/bench/memory.stat"), "cache 1\nhierarchical_memory_limit 2147483648\n")
            .unwrap();
        assert_eq!(cgroup_limit("4:memory:/bench\n0::/\n", root), Some((2 << 30, "v1 /bench".into())));
        std::fs::write(root.join("memory/bench/memory.stat"), "hierarchical_memory_limit 9223372036854771712\n")
            .unwrap();
        assert_eq!(cgroup_limit("4:memory:/bench\n", root), None);
        // v2: the smallest memory.max from the cgroup up.
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/memory.max"), "1073741824\n").unwrap();
        std::fs::write(root.join("a/b/memory.max"), "max\n").unwrap();
        assert_eq!(cgroup_limit("0::/a/b\n", root), Some((1 << 30, "v2 /a".into())));
        assert_eq!(cgroup_limit("garbage", root), None);
    }
}
