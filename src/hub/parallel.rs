//! A large file over several connections at once, each fetching its own
//! byte range into its place in the partial file. What each range has
//! written is recorded beside the partial file (`SHA.incomplete.ranges`),
//! so a cut or interrupted pull continues every range where it stopped.
//! The SHA-256 is taken over the finished file before it is used.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use anyhow::{Context as _, Result, bail};

use super::download::{next_piece, open_no_follow, read_in_background};
use super::{HubClient, HubError, RepoFile, validate};
use crate::interrupt;
use crate::units::sizes;

/// Files below this size come in one stream: a few seconds either way.
pub const MIN_PARALLEL_BYTES: u64 = 64 << 20;

/// The ranges' progress is written down after this many bytes of a range.
const RECORD_EVERY: u64 = 16 << 20;

/// One connection's share: bytes `start..end`, of which `start..done` are
/// on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// Bytes up to here are written.
    pub done: u64,
    /// One past the last byte.
    pub end: u64,
}

/// The ranges file beside a partial download.
pub fn ranges_path(partial: &Path) -> PathBuf {
    let mut name = partial.as_os_str().to_owned();
    name.push(".ranges");
    PathBuf::from(name)
}

/// `size` split into `n` ranges (the last takes the remainder).
pub fn split(size: u64, n: usize) -> Vec<Range> {
    let n = (n.max(1) as u64).min(size.max(1));
    let step = size / n;
    (0..n)
        .map(|i| {
            let start = i * step;
            let end = if i + 1 == n { size } else { start + step };
            Range { start, done: start, end }
        })
        .collect()
}

/// The ranges an earlier pull recorded for a file of `size` bytes, when
/// they are whole and consistent (else none: the pull starts over).
pub fn read_ranges(path: &Path, size: u64) -> Option<Vec<Range>> {
    let text = fs::read_to_string(path).ok()?;
    let mut ranges = Vec::new();
    for line in text.lines() {
        let mut n = line.split_whitespace().map(|v| v.parse::<u64>().ok());
        let (Some(Some(start)), Some(Some(done)), Some(Some(end)), None) = (n.next(), n.next(), n.next(), n.next())
        else {
            return None;
        };
        ranges.push(Range { start, done, end });
    }
    let tiles = ranges.first().is_some_and(|r| r.start == 0)
        && ranges.last().is_some_and(|r| r.end == size)
        && ranges.windows(2).all(|w| w[0].end == w[1].start)
        && ranges.iter().all(|r| r.start <= r.done && r.done <= r.end);
    tiles.then_some(ranges)
}

fn write_ranges(path: &Path, ranges: &[Range]) -> Result<()> {
    let text: String = ranges.iter().map(|r| format!("{} {} {}\n", r.start, r.done, r.end)).collect();
    let tmp = path.with_extension("ranges.tmp");
    let mut out = open_no_follow(OpenOptions::new().create(true).truncate(true).write(true), &tmp)?;
    std::io::Write::write_all(&mut out, text.as_bytes()).with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Fetches what `ranges` still lack into `partial` over one connection per
/// range, `on_bytes` told of each piece written. On any failure every
/// range's progress is recorded and the error says how to continue.
pub fn fetch_ranges(
    client: &HubClient,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    partial: &Path,
    ranges: Vec<Range>,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<u64> {
    let record = ranges_path(partial);
    write_ranges(&record, &ranges).with_context(|| format!("writing {}", record.display()))?;
    let out = open_no_follow(OpenOptions::new().create(true).truncate(false).write(true), partial)?;
    let state = Mutex::new(ranges.clone());
    let stop = AtomicBool::new(false);
    let fetched = AtomicU64::new(0);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..ranges.len())
            .map(|i| {
                let (state, stop, fetched, out, record) = (&state, &stop, &fetched, &out, &record);
                scope.spawn(move || -> Result<()> {
                    let result = fetch_one(client, repo, commit, file, out, i, state, stop, fetched, record, on_bytes);
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    result
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a download thread panicked"))))
            .collect()
    });
    let _ = out.sync_all();
    let now = state.into_inner().unwrap_or_else(|e| e.into_inner());
    write_ranges(&record, &now).with_context(|| format!("writing {}", record.display()))?;
    let have: u64 = now.iter().map(|r| r.done - r.start).sum();
    let [have_text, total] = sizes([have, file.size]);
    if let Some(err) = results.into_iter().find_map(Result::err) {
        return Err(err.context(format!(
            "the download of {} stopped at {have_text} of {total}: the bytes so far are kept; run the same command \
             to continue",
            file.name
        )));
    }
    if have < file.size {
        return Err(anyhow::Error::new(interrupt::Interrupted).context(format!(
            "stopped with {have_text} of {total} of {} downloaded (kept in {}): run the same command to continue",
            validate::printable(&file.name),
            partial.display()
        )));
    }
    out.sync_all().with_context(|| format!("writing {}", partial.display()))?;
    let _ = fs::remove_file(&record);
    Ok(fetched.into_inner())
}

/// One connection: range `i` from where it stopped to its end.
#[allow(clippy::too_many_arguments)]
fn fetch_one(
    client: &HubClient,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    out: &File,
    i: usize,
    state: &Mutex<Vec<Range>>,
    stop: &AtomicBool,
    fetched: &AtomicU64,
    record: &Path,
    on_bytes: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let Range { mut done, end, .. } = state.lock().unwrap_or_else(|e| e.into_inner())[i];
    if done >= end {
        return Ok(());
    }
    let body = client.open_range(repo, commit, &file.name, done, end).map_err(|e| match e {
        HubError::NoRanges(why) => {
            anyhow::anyhow!("the server does not answer byte ranges ({why}); use --connections 1")
        }
        other => other.into(),
    })?;
    let pieces = read_in_background(body);
    let name = validate::printable(&file.name);
    let mut since_record = 0;
    while done < end {
        // Another range failed (its error is the one reported) or the user
        // interrupted: what this range has is recorded by the caller.
        let Some(piece) = next_piece(&pieces, &|| stop.load(Ordering::Relaxed)) else { return Ok(()) };
        let piece = piece.with_context(|| format!("{name}: connection {} cut", i + 1))?;
        if piece.is_empty() {
            bail!("{name}: connection {} ended early", i + 1);
        }
        let n = piece.len().min((end - done) as usize);
        out.write_all_at(&piece[..n], done).context("writing the download")?;
        done += n as u64;
        since_record += n as u64;
        fetched.fetch_add(n as u64, Ordering::Relaxed);
        on_bytes(n as u64);
        let mut ranges = state.lock().unwrap_or_else(|e| e.into_inner());
        ranges[i].done = done;
        if since_record >= RECORD_EVERY {
            since_record = 0;
            // Recorded only once the bytes are on disk: a crash leaves a
            // record at or behind what is written.
            out.sync_data().context("writing the download")?;
            write_ranges(record, &ranges).context("recording the download's progress")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_tile_the_file_and_a_bad_record_is_not_trusted() {
        let r = split(10, 4);
        assert_eq!(r.iter().map(|r| (r.start, r.end)).collect::<Vec<_>>(), [(0, 2), (2, 4), (4, 6), (6, 10)]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ranges");
        write_ranges(&path, &[Range { start: 0, done: 3, end: 5 }, Range { start: 5, done: 7, end: 10 }]).unwrap();
        assert_eq!(read_ranges(&path, 10).unwrap()[1].done, 7);
        assert_eq!(read_ranges(&path, 11), None, "another size");
        fs::write(&path, "0 3 5\n6 7 10\n").unwrap();
        assert_eq!(read_ranges(&path, 10), None, "a gap");
        fs::write(&path, "0 6 5\n5 7 10\n").unwrap();
        assert_eq!(read_ranges(&path, 10), None, "done past the end");
    }
}
