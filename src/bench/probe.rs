//! The disk probe: how fast this storage serves the reads streaming makes
//! (O_DIRECT positioned reads of one expert slice at random places in the
//! model file), with one lane and with several, so the harness can state
//! its own read speed as a fraction of what the disk gives.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::llama::memory::{AlignedBuf, page};

/// One probe's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// Parallel readers.
    pub lanes: usize,
    /// Bytes of each read (the slice, rounded out to pages).
    pub read_bytes: usize,
    /// MiB per second over all lanes.
    pub mib_s: f64,
    /// Whether O_DIRECT was used (else buffered reads after dropping the cache).
    pub o_direct: bool,
}

fn open(path: &Path) -> std::io::Result<(File, bool)> {
    match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(_) => Ok((File::open(path)?, false)),
    }
}

/// Reads `slice` bytes at random page-aligned offsets of `path` from `lanes`
/// threads for `duration`.
pub fn probe(path: &Path, slice: usize, lanes: usize, duration: Duration) -> std::io::Result<Probe> {
    let len = std::fs::metadata(path)?.len();
    let window = slice.max(1).next_multiple_of(page());
    if len < window as u64 * 2 {
        return Err(std::io::Error::other(format!("{} is too small to probe", path.display())));
    }
    let pages = (len - window as u64) / page() as u64;
    let start = Instant::now();
    let results: Vec<std::io::Result<(u64, bool)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..lanes.max(1))
            .map(|lane| {
                scope.spawn(move || -> std::io::Result<(u64, bool)> {
                    let (file, direct) = open(path)?;
                    let mut buf = AlignedBuf::new(window);
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(lane as u64);
                    let mut bytes = 0u64;
                    // At least one read per lane, however late the thread starts.
                    loop {
                        let at = rng.gen_range(0..pages) * page() as u64;
                        bytes += file.read_at(&mut buf.as_mut_slice()[..window], at)? as u64;
                        if start.elapsed() >= duration {
                            break;
                        }
                    }
                    Ok((bytes, direct))
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(std::io::Error::other("probe thread panicked"))))
            .collect()
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut total = 0u64;
    let mut o_direct = true;
    for r in results {
        let (bytes, direct) = r?;
        total += bytes;
        o_direct &= direct;
    }
    Ok(Probe { lanes, read_bytes: window, mib_s: total as f64 / 1048576.0 / seconds, o_direct })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        let p = probe(&path, 10_000, 2, Duration::from_millis(20)).unwrap();
        assert_eq!((p.lanes, p.read_bytes), (2, 10_000usize.next_multiple_of(page())));
        assert!(p.mib_s > 0.0);
        assert!(probe(&path, 900_000, 1, Duration::from_millis(1)).is_err(), "a window over half the file");
    }
}
