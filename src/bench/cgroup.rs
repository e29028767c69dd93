//! A memory-capped cgroup for benchmark runs, created and removed by the
//! harness: v2 (`memory.max`) where the unified hierarchy has the memory
//! controller, else v1 (`memory.limit_in_bytes`); reads from one block
//! device can be throttled too (v2 `io.max`, v1
//! `blkio.throttle.read_bps_device`), to emulate a slower disk. Needs root.

use std::path::{Path, PathBuf};

/// Which cgroup interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// cgroup v1 memory controller.
    V1,
    /// The unified hierarchy.
    V2,
}

/// A cgroup with a memory limit; removed when dropped.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    version: Version,
    /// v1's blkio group beside the memory one, when reads are throttled.
    blkio: Option<PathBuf>,
}

/// A read throttle on one block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadThrottle {
    /// The whole disk's `major:minor` (throttles apply to disks, not partitions).
    pub device: (u32, u32),
    /// Bytes per second.
    pub bytes_per_s: u64,
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("writing {value} to {}: {e}", path.display()))
}

/// Reads `key N` from a flat keyed file.
fn keyed(path: &Path, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

impl Cgroup {
    /// Creates `bmoe-bench-<pid>` limited to `limit` bytes (no swap).
    pub fn create(limit: u64) -> Result<Cgroup, String> {
        Cgroup::with_limits(Some(limit), None)
    }

    /// Creates `bmoe-bench-<pid>` with a memory limit (`None`: none) and a
    /// read throttle (`None`: none).
    pub fn with_limits(limit: Option<u64>, throttle: Option<ReadThrottle>) -> Result<Cgroup, String> {
        if !rustix::process::geteuid().is_root() {
            return Err("a memory cap or a disk throttle needs a cgroup, and creating one needs root: run the \
                        harness with sudo, or without --cap-mb and --disk-mbps"
                .into());
        }
        let root = Path::new("/sys/fs/cgroup");
        let name = format!("bmoe-bench-{}", std::process::id());
        let unified = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| unified.split_whitespace().any(|x| x == c);
        let (dir, version) = if has("memory") {
            // Let children of the root use the memory (and io) controllers.
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            if throttle.is_some() {
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+io");
            }
            (root.join(&name), Version::V2)
        } else if root.join("memory").is_dir() {
            (root.join("memory").join(&name), Version::V1)
        } else {
            return Err("no cgroup memory controller found under /sys/fs/cgroup (v1 or v2)".into());
        };
        std::fs::create_dir(&dir).map_err(|e| format!("creating cgroup {}: {e}", dir.display()))?;
        let mut cgroup = Cgroup { dir, version, blkio: None };
        if let Some(limit) = limit {
            let limit = limit.to_string();
            match version {
                Version::V2 => {
                    write(&cgroup.dir.join("memory.max"), &limit)?;
                    let _ = std::fs::write(cgroup.dir.join("memory.swap.max"), "0");
                }
                Version::V1 => {
                    write(&cgroup.dir.join("memory.limit_in_bytes"), &limit)?;
                    // Where swap accounting exists, swap must not stretch the cap.
                    let _ = std::fs::write(cgroup.dir.join("memory.memsw.limit_in_bytes"), &limit);
                }
            }
        }
        if let Some(t) = throttle {
            let (major, minor) = t.device;
            match version {
                Version::V2 => {
                    write(&cgroup.dir.join("io.max"), &format!("{major}:{minor} rbps={}", t.bytes_per_s))?;
                }
                Version::V1 => {
                    let blkio = root.join("blkio").join(&name);
                    std::fs::create_dir(&blkio).map_err(|e| format!("creating cgroup {}: {e}", blkio.display()))?;
                    cgroup.blkio = Some(blkio.clone());
                    write(
                        &blkio.join("blkio.throttle.read_bps_device"),
                        &format!("{major}:{minor} {}", t.bytes_per_s),
                    )?;
                }
            }
        }
        Ok(cgroup)
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Which interface it uses.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The files a process writes its pid into to join (v1: the memory
    /// group's, and the blkio group's when reads are throttled).
    pub fn procs_files(&self) -> Vec<PathBuf> {
        std::iter::once(&self.dir).chain(&self.blkio).map(|d| d.join("cgroup.procs")).collect()
    }

    /// Processes the kernel's OOM killer has killed in this cgroup so far.
    pub fn oom_kills(&self) -> u64 {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        keyed(&self.dir.join(file), "oom_kill").unwrap_or(0)
    }

    /// Peak memory use since the last [`Cgroup::reset_peak`], where the kernel reports it.
    pub fn peak(&self) -> Option<u64> {
        let file = match self.version {
            Version::V2 => "memory.peak",
            Version::V1 => "memory.max_usage_in_bytes",
        };
        std::fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }

    /// Starts a new peak measurement.
    pub fn reset_peak(&self) {
        match self.version {
            Version::V1 => {
                let _ = std::fs::write(self.dir.join("memory.max_usage_in_bytes"), "0");
            }
            // memory.peak resets per open file description on new kernels; the
            // harness then reads the run's peak RSS from the run itself.
            Version::V2 => {
                let _ = std::fs::write(self.dir.join("memory.peak"), "0");
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The runs have exited; an empty cgroup can be removed.
        'group: for dir in std::iter::once(&self.dir).chain(&self.blkio) {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() {
                    continue 'group;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            eprintln!("bmoe: note: could not remove cgroup {}", dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keyed_files() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("memory.events");
        std::fs::write(&f, "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\n").unwrap();
        assert_eq!(keyed(&f, "oom_kill"), Some(1));
        assert_eq!(keyed(&f, "oom"), Some(2));
        assert_eq!(keyed(&f, "nothing"), None);
    }
}
