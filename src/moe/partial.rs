//! A partial repacked copy: when the whole repacked copy would pass its
//! disk budget, the copy's shard files are made sparse and empty, and each
//! expert slice repacked as it is read from the model is also written into
//! the copy (at the same offset) while the budget lasts. The experts read
//! first and most are the ones copied, and from then on read from the copy
//! in place, with no repacking. Which slices the copy holds is a bitmap file
//! beside it, saved only after the slices' bytes are on disk: a crash
//! leaves slices unmarked (written again later), never marked and missing.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use super::lean::at;
use crate::llama::memory::drop_file_cache;

/// The name of the bitmap file in a partial copy's directory.
pub const PRESENT_FILE: &str = "present";

const ABSENT: u8 = 0;
const WRITING: u8 = 1;
const HELD: u8 = 2;

/// The bitmap is saved after this many slices are written (and at close).
const SAVE_EVERY: u64 = 64;

/// One bank of the copy: where its slices are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyBank {
    /// The shard holding it.
    pub shard: usize,
    /// File offset of expert 0.
    pub file_offset: u64,
    /// Bytes per expert.
    pub slice_bytes: usize,
}

/// A partial copy, open for reading (by the lanes, through its paths) and
/// for writing the slices it lacks.
pub struct PartialCopy {
    files: Vec<File>,
    banks: Vec<CopyBank>,
    n_expert: usize,
    /// Per (bank, expert): absent, being written, or held.
    state: Vec<AtomicU8>,
    budget: u64,
    used: AtomicU64,
    /// Slices marked held since the bitmap was last saved.
    unsaved: AtomicBool,
    /// Set once a write failed: no more are tried.
    stopped: AtomicBool,
    /// Slices written by this process.
    written: AtomicU64,
    bitmap: PathBuf,
    save_lock: Mutex<()>,
}

impl PartialCopy {
    /// Opens the partial copy in `home` (the shard files `paths`, each of
    /// `sizes`), creating the files and an empty bitmap if it has none, for
    /// `banks` of `n_expert` experts each, to hold at most `budget` bytes.
    pub fn open(
        home: &Path,
        paths: &[PathBuf],
        sizes: &[u64],
        banks: Vec<CopyBank>,
        n_expert: usize,
        budget: u64,
    ) -> io::Result<PartialCopy> {
        let bitmap = home.join(PRESENT_FILE);
        let slots = banks.len() * n_expert;
        let mut held = match fs::read(&bitmap) {
            Ok(bits) if bits.len() == slots.div_ceil(8) => bits,
            Ok(_) => return Err(io::Error::other(format!("{}: not this copy's bitmap", bitmap.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => vec![0; slots.div_ceil(8)],
            Err(e) => return Err(at(&bitmap, e)),
        };
        let mut files = Vec::with_capacity(paths.len());
        let mut reset = false;
        for (shard, (path, &size)) in paths.iter().zip(sizes).enumerate() {
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path);
            let file = file.map_err(|e| at(path, e))?;
            if file.metadata().map_err(|e| at(path, e))?.len() != size {
                // A new or damaged shard: empty again, and nothing in it held.
                file.set_len(0).and_then(|()| file.set_len(size)).map_err(|e| at(path, e))?;
                let in_shard = banks.iter().enumerate().filter(|(_, b)| b.shard == shard);
                for i in in_shard.flat_map(|(b, _)| b * n_expert..(b + 1) * n_expert) {
                    held[i / 8] &= !(1 << (i % 8));
                }
                reset = true;
            }
            files.push(file);
        }
        let state: Vec<AtomicU8> =
            (0..slots).map(|i| AtomicU8::new(if held[i / 8] & (1 << (i % 8)) != 0 { HELD } else { ABSENT })).collect();
        let used = (0..slots)
            .filter(|&i| state[i].load(Ordering::Relaxed) == HELD)
            .map(|i| banks[i / n_expert].slice_bytes as u64)
            .sum();
        Ok(PartialCopy {
            files,
            banks,
            n_expert,
            state,
            budget,
            used: AtomicU64::new(used),
            unsaved: AtomicBool::new(reset),
            stopped: AtomicBool::new(false),
            written: AtomicU64::new(0),
            bitmap,
            save_lock: Mutex::new(()),
        })
    }

    /// The banks, in the order slices are numbered.
    pub fn banks(&self) -> &[CopyBank] {
        &self.banks
    }

    /// Whether the copy holds expert `e` of bank `bank`.
    pub fn holds(&self, bank: usize, e: usize) -> bool {
        self.state.get(bank * self.n_expert + e).is_some_and(|s| s.load(Ordering::Acquire) == HELD)
    }

    /// Bytes of the slices the copy holds.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The most bytes it may hold.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Writes expert `e` of bank `bank`, `bytes` as repacked, into the copy
    /// if it lacks the slice and the budget has room, and marks it held
    /// once its bytes are on disk. Returns whether it was written. A failed
    /// write stops all further writing (the copy keeps what it holds).
    pub fn write(&self, bank: usize, e: usize, bytes: &[u8]) -> bool {
        let Some(b) = self.banks.get(bank).copied() else { return false };
        let Some(state) = self.state.get(bank * self.n_expert + e) else { return false };
        if bytes.len() != b.slice_bytes || self.stopped.load(Ordering::Relaxed) {
            return false;
        }
        let len = bytes.len() as u64;
        if state.compare_exchange(ABSENT, WRITING, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        if self.used.fetch_add(len, Ordering::AcqRel) + len > self.budget {
            self.used.fetch_sub(len, Ordering::AcqRel);
            state.store(ABSENT, Ordering::Release);
            return false;
        }
        let file = &self.files[b.shard];
        let offset = b.file_offset + (e * b.slice_bytes) as u64;
        let written = file.write_all_at(bytes, offset).and_then(|()| file.sync_data());
        if written.is_err() {
            self.stopped.store(true, Ordering::Relaxed);
            self.used.fetch_sub(len, Ordering::AcqRel);
            state.store(ABSENT, Ordering::Release);
            return false;
        }
        // On disk; the reads of it bypass the page cache.
        let _ = drop_file_cache(file, offset, len);
        state.store(HELD, Ordering::Release);
        self.unsaved.store(true, Ordering::Release);
        if (self.written.fetch_add(1, Ordering::AcqRel) + 1).is_multiple_of(SAVE_EVERY) {
            // Now and then, so a killed run keeps most of what it wrote.
            let _ = self.save();
        }
        true
    }

    /// Saves the bitmap (through a temporary name) if slices were marked
    /// held since the last save.
    pub fn save(&self) -> io::Result<()> {
        let _one = self.save_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !self.unsaved.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let mut bits = vec![0u8; self.state.len().div_ceil(8)];
        for (i, s) in self.state.iter().enumerate() {
            if s.load(Ordering::Acquire) == HELD {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        let tmp = self.bitmap.with_extension(format!("partial-{}", std::process::id()));
        fs::write(&tmp, &bits)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| fs::rename(&tmp, &self.bitmap))
            .map_err(|e| at(&self.bitmap, e))
    }
}

impl std::fmt::Debug for PartialCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartialCopy").field("used", &self.used()).field("budget", &self.budget).finish()
    }
}

impl Drop for PartialCopy {
    fn drop(&mut self) {
        let _ = self.save();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path, budget: u64) -> PartialCopy {
        let banks = vec![
            CopyBank { shard: 0, file_offset: 100, slice_bytes: 10 },
            CopyBank { shard: 0, file_offset: 200, slice_bytes: 20 },
        ];
        PartialCopy::open(dir, &[dir.join("m.gguf")], &[400], banks, 4, budget).unwrap()
    }

    #[test]
    fn slices_are_written_once_within_the_budget_and_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let copy = open(dir.path(), 40);
        assert!(!copy.holds(1, 2));
        assert!(copy.write(1, 2, &[7; 20]));
        assert!(copy.holds(1, 2));
        assert!(!copy.write(1, 2, &[7; 20]), "held already");
        assert!(!copy.write(0, 0, &[1; 9]), "the wrong size");
        assert!(copy.write(0, 3, &[5; 10]));
        assert!(!copy.write(1, 0, &[3; 20]), "over the budget (30 of 40 used)");
        assert!(copy.write(0, 1, &[4; 10]));
        assert_eq!(copy.used(), 40);
        drop(copy);
        let bytes = fs::read(dir.path().join("m.gguf")).unwrap();
        assert_eq!(bytes.len(), 400);
        assert_eq!(&bytes[240..260], &[7; 20]);
        assert_eq!(&bytes[130..140], &[5; 10]);
        assert_eq!(&bytes[100..110], &[0; 10], "never written: a hole");
        // Reopened: the bitmap says what the copy holds.
        let copy = open(dir.path(), 40);
        assert!(copy.holds(1, 2) && copy.holds(0, 3) && copy.holds(0, 1) && !copy.holds(0, 0));
        assert_eq!(copy.used(), 40);
    }

    #[test]
    fn a_shard_of_the_wrong_size_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let copy = open(dir.path(), 100);
        assert!(copy.write(0, 0, &[1; 10]));
        drop(copy);
        File::options().write(true).open(dir.path().join("m.gguf")).unwrap().set_len(300).unwrap();
        let copy = open(dir.path(), 100);
        assert!(!copy.holds(0, 0));
        assert_eq!(copy.used(), 0);
    }
}
