//! A file's bytes into the cache: continued from what an earlier, cut pull
//! left, hashed as they arrive and checked against the hub's SHA-256 before
//! the file is used, with a progress bar (bytes, rate, time left).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{Context as _, Result, bail};
use sha2::{Digest, Sha256};

use super::{HubClient, RepoCache, RepoFile, parallel};
use crate::interrupt;
use crate::progress::progress_bar;
use crate::units::{size, sizes};

/// Reads and writes go in pieces of this size.
const CHUNK: usize = 1 << 20;

/// Downloads `file` into its blob, continuing a partial download; returns
/// the bytes fetched. A file of [`parallel::MIN_PARALLEL_BYTES`] or more
/// comes over `connections` byte ranges at once (unless a one-stream pull
/// left a partial file, which continues as one). A hash that differs from
/// the hub's removes the download (nothing corrupt is used or kept) and is
/// an error.
pub fn fetch(
    client: &HubClient,
    cache: &RepoCache,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    label: &str,
    connections: usize,
) -> Result<u64> {
    interrupt::install()?;
    let partial = cache.partial(file);
    let folder = partial.parent().expect("a blob has a folder");
    fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
    let record = parallel::ranges_path(&partial);
    let recorded = parallel::read_ranges(&record, file.size);
    if recorded.is_none() && record.exists() {
        // A record that does not describe this file: its bytes cannot be trusted.
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&record);
    }
    let partial_len = fs::metadata(&partial).map_or(0, |m| m.len());
    // Ranges recorded continue as ranges whatever `connections` says now.
    let (fetched, digest) =
        if recorded.is_some() || (connections > 1 && file.size >= parallel::MIN_PARALLEL_BYTES && partial_len == 0) {
            let ranges = recorded.unwrap_or_else(|| parallel::split(file.size, connections));
            let bar = progress_bar(file.size, label);
            bar.set_position(ranges.iter().map(|r| r.done - r.start).sum());
            let fetched = parallel::fetch_ranges(client, repo, commit, file, &partial, ranges, &|n| bar.inc(n))
                .inspect_err(|_| bar.abandon())?;
            bar.set_position(0);
            bar.set_message(format!("{label}: checking its SHA-256"));
            let mut hasher = Sha256::new();
            hash_existing(&partial, file.size, &mut hasher, &bar)?;
            bar.finish_and_clear();
            (fetched, hasher.finalize())
        } else {
            fetch_stream(client, repo, commit, file, &partial, label)?
        };
    let digest: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    match &file.sha256 {
        Some(expected) if *expected != digest => {
            let _ = fs::remove_file(&partial);
            bail!(
                "{}: its SHA-256 is {digest}, the hub lists {expected}: the download is corrupt and was removed \
                 (run the same command to fetch it again)",
                file.name
            );
        }
        Some(_) => {}
        None => eprintln!("bmoe: {}: the hub lists no SHA-256 for it (not an LFS file): not checked", file.name),
    }
    let blob = cache.blob(file);
    fs::rename(&partial, &blob).with_context(|| format!("moving {} to {}", partial.display(), blob.display()))?;
    Ok(fetched)
}

/// One stream from where the partial file ends (a server that ignores
/// ranges restarts it), hashed as it arrives: the bytes fetched and the
/// whole file's SHA-256.
fn fetch_stream(
    client: &HubClient,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    partial: &Path,
    label: &str,
) -> Result<(u64, sha2::digest::Output<Sha256>)> {
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .read(true)
        .open(partial)
        .with_context(|| format!("opening {}", partial.display()))?;
    let mut have = out.metadata()?.len();
    if have > file.size {
        out.set_len(0)?;
        have = 0;
    }
    let bar = progress_bar(file.size, label);
    let mut hasher = Sha256::new();
    if have > 0 {
        bar.set_message(format!("{label}: checking the {} on disk", size(have)));
        hash_existing(partial, have, &mut hasher, &bar)?;
        bar.set_message(format!("{label}: continuing"));
    }
    let mut fetched = 0;
    if have < file.size {
        let (body, from_offset) = client.open(repo, commit, &file.name, have)?;
        if !from_offset {
            // The server sent the whole file: start over.
            out.set_len(0)?;
            hasher = Sha256::new();
            have = 0;
        }
        bar.set_position(have);
        let mut reader = body.into_reader();
        let mut buf = vec![0u8; CHUNK];
        while have < file.size {
            if interrupt::requested() {
                bar.abandon();
                out.flush()?;
                let [have, total] = sizes([have, file.size]);
                bail!(
                    "interrupted with {have} of {total} of {} downloaded (kept in {}): run the same command to continue",
                    file.name,
                    partial.display()
                );
            }
            let n = reader.read(&mut buf).with_context(|| cut_off(&file.name, have, file.size))?;
            if n == 0 {
                bail!("{}", cut_off(&file.name, have, file.size));
            }
            let n = n.min((file.size - have) as usize);
            out.write_all(&buf[..n]).with_context(|| format!("writing {}", partial.display()))?;
            hasher.update(&buf[..n]);
            have += n as u64;
            fetched += n as u64;
            bar.set_position(have);
        }
    }
    out.sync_all().with_context(|| format!("writing {}", partial.display()))?;
    drop(out);
    bar.finish_and_clear();
    Ok((fetched, hasher.finalize()))
}

/// Feeds the first `len` bytes of `path` (an earlier pull's) to `hasher`.
fn hash_existing(path: &Path, len: u64, hasher: &mut Sha256, bar: &indicatif::ProgressBar) -> Result<()> {
    let mut file = File::open(path).with_context(|| format!("reading {}", path.display()))?.take(len);
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0;
    loop {
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        done += n as u64;
        bar.set_position(done);
    }
    Ok(())
}

/// The error of a connection that ended early.
fn cut_off(name: &str, have: u64, size: u64) -> String {
    let [have, size] = sizes([have, size]);
    format!(
        "the download of {name} was cut off at {have} of {size}: the bytes so far are kept; run the same command to continue"
    )
}

/// Refuses to start when `needed` more bytes do not fit where the cache
/// is; warns when the model (`model_size`) would leave no room for its
/// repacked copy (which then is not written: experts are repacked as read).
pub fn check_space(cache: &Path, needed: u64, model_size: u64) -> Result<()> {
    if needed == 0 {
        return Ok(());
    }
    let mut probe = cache.to_path_buf();
    while !probe.exists() {
        if !probe.pop() {
            return Ok(());
        }
    }
    let Some(free) = free_bytes(&probe) else { return Ok(()) };
    if needed > free {
        let [needed, free] = sizes([needed, free]);
        bail!(
            "{needed} more is needed in {} and its file system has {free} free: free space there, or point \
             HF_HOME (or HF_HUB_CACHE) at a disk with room",
            cache.display()
        );
    }
    let left = free - needed;
    if left < model_size {
        let [left, model] = sizes([left, model_size]);
        eprintln!(
            "bmoe: after this download {left} stays free: a repacked copy of the model's experts (up to {model}) \
             will not fit there, so runs repack experts as they read them (slower on CPUs that repack)"
        );
    }
    Ok(())
}

/// Free bytes of the file system holding `path` (for an unprivileged user).
pub fn free_bytes(path: &Path) -> Option<u64> {
    let stat = rustix::fs::statvfs(path).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}
