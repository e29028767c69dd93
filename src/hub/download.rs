//! A file's bytes into the cache: continued from what an earlier, cut pull
//! left, one pull of a file at a time (a lock in the repository's `.locks`), and the
//! file on disk checked against the hub's hash before it is used, with a
//! progress bar (bytes, rate, time left).

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use sha1::Sha1;
use sha2::{Digest, Sha256};

use super::{HubClient, RepoCache, RepoFile, parallel, validate};
use crate::interrupt;
use crate::progress::progress_bar;
use crate::units::sizes;

/// Reads and writes go in pieces of this size.
const CHUNK: usize = 1 << 20;

/// How long a wait for bytes (or for another pull's lock) goes before
/// Ctrl-C is looked at again.
const POLL: Duration = Duration::from_millis(100);

/// Downloads `file` into its blob, continuing a partial download; returns
/// the bytes fetched. A file of [`parallel::MIN_PARALLEL_BYTES`] or more
/// comes over `connections` byte ranges at once (unless a one-stream pull
/// left a partial file, which continues as one). Another pull of the same
/// file (another process) is waited for: the blob's lock is held from the
/// first byte to the last. The file on disk is hashed once complete and
/// becomes the blob only when it matches the listing (its SHA-256, or the
/// git blob id of a file outside LFS); one that differs is removed and is
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
    cache.make_folder(folder)?;
    let lock = lock_blob(cache, file, label)?;
    if cache.blob_if_complete(file).is_some() {
        // Another pull finished it while this one waited.
        let _ = fs::remove_file(lock.path());
        return Ok(0);
    }
    let record = parallel::ranges_path(&partial);
    let recorded = parallel::read_ranges(&record, file.size);
    if recorded.is_none() && fs::symlink_metadata(&record).is_ok() {
        // A record that does not describe this file: its bytes cannot be trusted.
        let _ = fs::remove_file(&partial);
        let _ = fs::remove_file(&record);
    }
    let partial_len = fs::symlink_metadata(&partial).map_or(0, |m| m.len());
    // Ranges recorded continue as ranges whatever `connections` says now.
    let fetched =
        if recorded.is_some() || (connections > 1 && file.size >= parallel::MIN_PARALLEL_BYTES && partial_len == 0) {
            let ranges = recorded.unwrap_or_else(|| parallel::split(file.size, connections));
            let bar = progress_bar(file.size, label);
            bar.set_position(ranges.iter().map(|r| r.done - r.start).sum());
            let fetched = parallel::fetch_ranges(client, repo, commit, file, &partial, ranges, &|n| bar.inc(n))
                .inspect_err(|_| bar.abandon())?;
            bar.finish_and_clear();
            fetched
        } else {
            fetch_stream(client, repo, commit, file, &partial, label)?
        };
    verify(file, &partial, label)?;
    let blob = cache.blob(file);
    fs::rename(&partial, &blob).with_context(|| format!("moving {} to {}", partial.display(), blob.display()))?;
    let _ = fs::remove_file(lock.path());
    Ok(fetched)
}

/// A pull's hold on one blob: an exclusive `flock` on `BLOB.lock`, freed
/// when dropped (or when the process ends).
struct BlobLock {
    file: File,
    path: std::path::PathBuf,
}

impl BlobLock {
    fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for BlobLock {
    fn drop(&mut self) {
        let _ = rustix::fs::flock(&self.file, rustix::fs::FlockOperation::Unlock);
    }
}

/// Takes `file`'s lock (`.locks/BLOB.lock` in the repository's folder, as
/// `huggingface_hub` keeps them apart from the blobs), waiting while
/// another pull holds it (Ctrl-C stops the wait). A pull that fails leaves
/// the lock file; one that ends with the blob removes it.
fn lock_blob(cache: &RepoCache, file: &RepoFile, label: &str) -> Result<BlobLock> {
    use rustix::fs::{FlockOperation, flock};
    let folder = cache.root().join(".locks");
    cache.make_folder(&folder)?;
    let path = &folder.join(format!("{}.lock", file.blob));
    let file = open_no_follow(OpenOptions::new().create(true).truncate(false).write(true), path)?;
    let mut said = false;
    loop {
        match flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(BlobLock { file, path: path.to_path_buf() }),
            Err(rustix::io::Errno::WOULDBLOCK) => {
                if !said {
                    eprintln!("bmoe: {label}: another pull is fetching it; waiting for it to finish");
                    said = true;
                }
                if interrupt::requested() {
                    return Err(anyhow::Error::new(interrupt::Interrupted)
                        .context(format!("stopped waiting for another pull of {label}")));
                }
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(std::io::Error::from(e)).with_context(|| format!("locking {}", path.display())),
        }
    }
}

/// Opens `path` with `options`, refusing to follow a symbolic link there
/// (a link planted in the cache cannot send a write elsewhere).
pub(super) fn open_no_follow(options: &mut OpenOptions, path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(libc::O_NOFOLLOW).open(path).with_context(|| {
        if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            format!("{} is a symbolic link: refused (remove it)", path.display())
        } else {
            format!("opening {}", path.display())
        }
    })
}

/// Hashes the downloaded file on disk and checks it against the listing:
/// its SHA-256, or for a file outside LFS its git blob id (the SHA-1 of
/// `blob SIZE\0` and the bytes). A mismatch removes the file.
fn verify(file: &RepoFile, partial: &Path, label: &str) -> Result<()> {
    let bar = progress_bar(file.size, label);
    bar.set_message(format!("{label}: checking the file against the hub's hash"));
    let (digest, expected, kind) = match &file.sha256 {
        Some(sha) => {
            let mut hasher = Sha256::new();
            hash_file(partial, file.size, &mut |b| hasher.update(b), &bar)?;
            (hex(&hasher.finalize()), sha.as_str(), "SHA-256")
        }
        None => {
            let mut hasher = Sha1::new();
            hasher.update(format!("blob {}\0", file.size).as_bytes());
            hash_file(partial, file.size, &mut |b| hasher.update(b), &bar)?;
            (hex(&hasher.finalize()), file.blob.as_str(), "git blob id")
        }
    };
    bar.finish_and_clear();
    if digest != expected {
        let _ = fs::remove_file(partial);
        bail!(
            "{}: its {kind} is {digest}, the hub lists {expected}: the download is corrupt and was removed (run the \
             same command to fetch it again)",
            validate::printable(&file.name)
        );
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One stream from where the partial file ends (a server that ignores
/// ranges restarts it); the bytes fetched. The body is read on a thread of
/// its own, so Ctrl-C stops a stalled download at once.
fn fetch_stream(
    client: &HubClient,
    repo: &str,
    commit: &str,
    file: &RepoFile,
    partial: &Path,
    label: &str,
) -> Result<u64> {
    let mut out = open_no_follow(OpenOptions::new().create(true).append(true).read(true), partial)?;
    let mut have = out.metadata()?.len();
    if have > file.size {
        out.set_len(0)?;
        have = 0;
    }
    let bar = progress_bar(file.size, label);
    let mut fetched = 0;
    if have < file.size {
        let (body, from_offset) = client.open(repo, commit, &file.name, have)?;
        if !from_offset {
            // The server sent the whole file: start over.
            out.set_len(0)?;
            have = 0;
        }
        bar.set_position(have);
        let pieces = read_in_background(body);
        while have < file.size {
            let Some(piece) = next_piece(&pieces, &|| false) else {
                bar.abandon();
                out.flush()?;
                let [have, total] = sizes([have, file.size]);
                return Err(anyhow::Error::new(interrupt::Interrupted).context(format!(
                    "stopped with {have} of {total} of {} downloaded (kept in {}): run the same command to continue",
                    validate::printable(&file.name),
                    partial.display()
                )));
            };
            let piece = piece.with_context(|| cut_off(&file.name, have, file.size))?;
            if piece.is_empty() {
                bail!("{}", cut_off(&file.name, have, file.size));
            }
            let n = piece.len().min((file.size - have) as usize);
            out.write_all(&piece[..n]).with_context(|| format!("writing {}", partial.display()))?;
            have += n as u64;
            fetched += n as u64;
            bar.set_position(have);
        }
    }
    out.sync_all().with_context(|| format!("writing {}", partial.display()))?;
    drop(out);
    bar.finish_and_clear();
    Ok(fetched)
}

/// A body's bytes, read on a thread of their own and sent in pieces (an
/// empty piece at its end): the reader waits on the channel a little at a
/// time and can look at Ctrl-C between waits however long the connection
/// stalls. Dropping the receiver ends the thread at its next piece.
pub(super) fn read_in_background(body: ureq::Body) -> Receiver<std::io::Result<Vec<u8>>> {
    let (send, receive) = sync_channel(4);
    std::thread::spawn(move || {
        let mut reader = body.into_reader();
        loop {
            let mut buf = vec![0u8; CHUNK];
            let piece = reader.read(&mut buf).map(|n| {
                buf.truncate(n);
                buf
            });
            let last = !matches!(&piece, Ok(b) if !b.is_empty());
            if send.send(piece).is_err() || last {
                return;
            }
        }
    });
    receive
}

/// The next piece from [`read_in_background`]; None once Ctrl-C is pressed
/// or `stopped` says so (another connection of the same pull failed).
pub(super) fn next_piece(
    pieces: &Receiver<std::io::Result<Vec<u8>>>,
    stopped: &dyn Fn() -> bool,
) -> Option<std::io::Result<Vec<u8>>> {
    loop {
        if interrupt::requested() || stopped() {
            return None;
        }
        match pieces.recv_timeout(POLL) {
            Ok(piece) => return Some(piece),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Some(Ok(Vec::new())),
        }
    }
}

/// Feeds the first `len` bytes of `path` to `update`.
fn hash_file(path: &Path, len: u64, update: &mut dyn FnMut(&[u8]), bar: &indicatif::ProgressBar) -> Result<()> {
    let mut file = open_no_follow(OpenOptions::new().read(true), path)?.take(len);
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0;
    loop {
        if interrupt::requested() {
            return Err(anyhow::Error::new(interrupt::Interrupted)
                .context(format!("stopped checking {} (the download is kept)", path.display())));
        }
        let n = file.read(&mut buf).with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        update(&buf[..n]);
        done += n as u64;
        bar.set_position(done);
    }
    Ok(())
}

/// The error of a connection that ended early.
fn cut_off(name: &str, have: u64, size: u64) -> String {
    let [have, size] = sizes([have, size]);
    format!(
        "the download of {} was cut off at {have} of {size}: the bytes so far are kept; run the same command to continue",
        validate::printable(name)
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
