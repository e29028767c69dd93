//! The repacked copy: a model's expert banks stored already repacked for
//! the CPU's kernels, so a streamed run reads each expert straight into
//! place with no pass over its bytes (repacking while reading costs a pass
//! on the read lanes for every expert a token misses: `super::repack`).
//!
//! Each shard's copy is a sparse file of the shard's size with every
//! expert bank at the bank's own offset (repacked where the CPU has a
//! kernel for it, as the file has it otherwise) and holes elsewhere, so
//! the reads keep the model's offsets and page windows. It is written once
//! into the cache directory, through a temporary name, and reused while the
//! model, the CPU's features and bmoe stay the same. The model counts as
//! the same while its path, inode, sizes, modification times and change
//! times are: an edit in place that keeps the size and sets the
//! modification time back still moves the change time (which no one sets
//! back), so its copy is written again. At every open, the first and last
//! expert of one bank of each distinct shape, and a few experts drawn at
//! random from all the banks, are checked against a fresh repack.
//!
//! A copy over its disk budget is made partial instead ([`super::partial`]):
//! the files stay holes, and each expert repacked as it is read is written
//! into the copy while the budget lasts, so the experts read most are the
//! ones the copy comes to hold.

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io;
use std::ops::ControlFlow;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rand::Rng;

use super::lean::{at, copy_home, key};
use super::partial::{CopyBank, PRESENT_FILE, PartialCopy};
use super::store::Projection;
use crate::gguf::ModelFiles;
use crate::llama::memory::drop_file_cache;

/// Room left free on the copy's file system beyond a copy of `need`
/// bytes: an eighth of it, at least 64 MiB and at most 1 GiB (a small
/// model's copy does not ask for a gigabyte to spare).
fn disk_margin(need: u64) -> u64 {
    (need / 8).clamp(64 << 20, 1 << 30)
}

/// A repacked copy ready to read.
#[derive(Debug, Clone)]
pub struct RepackedCopy {
    /// The copy's shard paths, in the model's order.
    pub paths: Vec<PathBuf>,
    /// Expert bytes written now (0 when an earlier copy was reused).
    pub written: u64,
    /// Expert bytes the copy holds.
    pub bytes: u64,
    /// Set when the copy is partial: which slices it holds, and where the
    /// rest are written as they are read.
    pub partial: Option<Arc<PartialCopy>>,
}

/// Told of a copy being written: (bytes written, bytes to write); `Break`
/// stops the writing (the open then repacks as it reads).
pub type CopyProgress = Box<dyn FnMut(u64, u64) -> ControlFlow<()> + Send>;

static PROGRESS: Mutex<Option<CopyProgress>> = Mutex::new(None);

/// What a front end says before it writes a repacked copy of `total`
/// bytes: its size, where it goes and how to manage copies.
pub fn copy_announcement(total: u64) -> String {
    format!(
        "writing a repacked copy of the experts, once: {} into {} (`bmoe cache` lists and removes copies; \
         --repacked-copy-max-gb caps them, --no-repacked-copy goes without)",
        crate::units::size(total),
        super::copies::cache_root().display()
    )
}

/// Sets what this process tells of a repacked copy's progress while one is
/// written (a front end's progress bar); `None` tells nothing.
pub fn report_progress(progress: Option<CopyProgress>) {
    *PROGRESS.lock().unwrap_or_else(|e| e.into_inner()) = progress;
}

/// Passes progress on; false when the receiver asked to stop.
pub(crate) fn tell(done: u64, total: u64) -> bool {
    match PROGRESS.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        Some(f) => f(done, total).is_continue(),
        None => true,
    }
}

/// Where repacked copies live by default: beside the lean copies.
pub fn repacked_dir() -> PathBuf {
    super::copies::cache_root().join("repacked")
}

/// Finds or writes the repacked copy of the banks `layers` (as resolved at
/// capture, with their repackers) of `files` under `dir`. A new copy may
/// take at most `max_bytes` (`None`: half the free space of `dir`'s file
/// system), and leaves a margin free beyond it.
pub fn prepare(
    files: &ModelFiles,
    layers: &[Vec<Projection>],
    n_expert: usize,
    dir: &Path,
    max_bytes: Option<u64>,
) -> io::Result<RepackedCopy> {
    let banks: Vec<&Projection> = layers.iter().flatten().collect();
    let home = copy_home(files, dir, &format!("{}-{:016x}", key(files)?, layout_key(files, &banks)?))?;
    let bank_bytes = |p: &Projection| (p.slice_bytes * n_expert) as u64;
    let whole: u64 = banks.iter().map(|p| bank_bytes(p)).sum();
    if home.join(PRESENT_FILE).exists() && check_room(&home, whole, max_bytes).is_ok() {
        // The budget holds the whole copy now: written whole in place of the partial one.
        for name in files.paths().iter().filter_map(|p| p.file_name()) {
            let _ = fs::remove_file(home.join(name));
        }
        fs::remove_file(home.join(PRESENT_FILE)).map_err(|e| at(&home, e))?;
    }
    let mut paths = Vec::with_capacity(files.paths().len());
    let mut todo = Vec::new();
    for (shard, model) in files.paths().iter().enumerate() {
        let file_name =
            model.file_name().ok_or_else(|| io::Error::other(format!("{}: no file name", model.display())))?;
        let target = home.join(file_name);
        let size = fs::metadata(model).map_err(|e| at(model, e))?.len();
        if fs::metadata(&target).map(|m| m.len()).ok() != Some(size) {
            todo.push((shard, size, target.clone()));
        }
        paths.push(target);
    }
    let need: u64 = banks.iter().filter(|p| todo.iter().any(|t| t.0 == p.shard)).map(|p| bank_bytes(p)).sum();
    let partial_before = home.join(PRESENT_FILE).exists();
    if partial_before || need > 0 && check_room(&home, need, max_bytes).is_err_and(|e| over_budget(&e)) {
        return partial(files, &banks, n_expert, &home, paths, max_bytes).inspect_err(|_| {
            if !partial_before {
                let _ = fs::remove_dir_all(&home);
            }
        });
    }
    if need > 0
        && let Err(e) = check_room(&home, need, max_bytes)
    {
        if todo.len() == paths.len() {
            // Nothing of this copy is on disk: leave no empty directory.
            let _ = fs::remove_dir_all(&home);
        }
        return Err(e);
    }
    let mut done = 0;
    if need > 0 {
        // Said before the first byte is written (a front end names the size).
        tell(0, need);
    }
    for (shard, size, target) in &todo {
        let shard_banks: Vec<&Projection> = banks.iter().copied().filter(|p| p.shard == *shard).collect();
        write_copy(&files.paths()[*shard], target, *size, &shard_banks, n_expert, &mut |n| {
            done += n;
            tell(done, need)
        })?;
    }
    if let Err(e) = check_sample(files, &paths, &banks) {
        // Written again at the next open.
        let _ = fs::remove_dir_all(&home);
        return Err(e);
    }
    Ok(RepackedCopy { paths, written: need, bytes: banks.iter().map(|p| bank_bytes(p)).sum(), partial: None })
}

/// Whether a streamed run of `files` will read a whole repacked copy from
/// `dir`: one is there already (a copy directory of this model with no
/// bitmap of a partial one), or one of all its repackable banks fits its
/// budget. `--repack auto` streams repacked only then: repacking as read
/// the experts a partial copy lacks costs the lanes more than the repacked
/// kernels save (`docs/benchmarks.md`, "The partial copy").
pub fn whole_copy_expected(files: &ModelFiles, dir: &Path, max_bytes: Option<u64>) -> bool {
    let Ok(prefix) = key(files) else { return false };
    let existing = fs::read_dir(dir).into_iter().flatten().flatten().any(|entry| {
        let home = entry.path();
        entry.file_name().to_string_lossy().starts_with(&format!("{prefix}-"))
            && !home.join(PRESENT_FILE).exists()
            && files.paths().iter().all(|m| {
                let copy = m.file_name().map(|n| home.join(n));
                copy.and_then(|c| fs::metadata(c).ok()).map(|c| c.len()) == fs::metadata(m).ok().map(|m| m.len())
            })
    });
    if existing {
        return true;
    }
    let names = super::repack::repackable_banks(files);
    let need: u64 = files.tensors().filter(|t| names.contains(&t.info.name)).map(|t| t.info.size).sum();
    let _ = fs::create_dir_all(dir);
    check_room(dir, need, max_bytes).is_ok()
}

/// True for [`check_room`]'s refusal of a copy over its budget (as opposed
/// to a disk too full to leave its margin).
fn over_budget(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull && e.to_string().contains("over its budget")
}

/// Opens (or starts) the partial copy in `home`: what it holds is checked
/// on a sample like a whole copy's, and it may grow to its budget: the
/// copy's budget (`max_bytes`, or half the free space counting what it
/// holds already), less the margin the disk keeps free.
fn partial(
    files: &ModelFiles,
    banks: &[&Projection],
    n_expert: usize,
    home: &Path,
    paths: Vec<PathBuf>,
    max_bytes: Option<u64>,
) -> io::Result<RepackedCopy> {
    let sizes: Vec<u64> = files
        .paths()
        .iter()
        .map(|p| fs::metadata(p).map(|m| m.len()).map_err(|e| at(p, e)))
        .collect::<io::Result<_>>()?;
    let held: u64 = paths.iter().filter_map(|p| fs::metadata(p).ok()).map(|m| m.blocks() * 512).sum();
    let free = rustix::fs::statvfs(home)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .map_err(|e| at(home, io::Error::from(e)))?;
    let whole: u64 = banks.iter().map(|p| (p.slice_bytes * n_expert) as u64).sum();
    let budget = max_bytes.unwrap_or((free + held) / 2).min((free + held).saturating_sub(disk_margin(whole)));
    let copy_banks = banks
        .iter()
        .map(|p| CopyBank { shard: p.shard, file_offset: p.file_offset, slice_bytes: p.slice_bytes })
        .collect();
    let copy = PartialCopy::open(home, &paths, &sizes, copy_banks, n_expert, budget)?;
    let mut rng = rand::thread_rng();
    let held_slices: Vec<(usize, usize)> =
        (0..banks.len()).flat_map(|b| (0..n_expert).map(move |e| (b, e))).filter(|&(b, e)| copy.holds(b, e)).collect();
    let picks = (0..DRAWN.min(held_slices.len())).map(|_| held_slices[rng.gen_range(0..held_slices.len())]);
    let picks: Vec<(&Projection, usize)> = picks.map(|(b, e)| (banks[b], e)).collect();
    check_slices(files, &paths, &picks)?;
    Ok(RepackedCopy { paths, written: 0, bytes: copy.used(), partial: Some(Arc::new(copy)) })
}

/// Whether a copy of `need` bytes may be written under `home`: within its
/// budget (`max_bytes`, or half the free space) and leaving a margin free.
fn check_room(home: &Path, need: u64, max_bytes: Option<u64>) -> io::Result<()> {
    let free = rustix::fs::statvfs(home)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .map_err(|e| at(home, io::Error::from(e)))?;
    let budget = max_bytes.unwrap_or(free / 2);
    if need > budget {
        let [need, budget, free] = crate::units::sizes([need, budget, free]);
        let whose = match max_bytes {
            Some(_) => "moe.repacked_copy_max_gb".to_string(),
            None => format!("half the {free} free on {}; moe.repacked_copy_max_gb sets it", home.display()),
        };
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("it would take {need}, over its budget of {budget} ({whose})"),
        ));
    }
    let margin = disk_margin(need);
    if free < need + margin {
        let [free, need, margin] = crate::units::sizes([free, need, margin]);
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            format!("{} has {free} free; the copy needs {need} and {margin} to spare", home.display()),
        ));
    }
    Ok(())
}

/// What the copy's bytes depend on besides what [`key`] names of the
/// model: its change times (an edit in place moves them even when it sets
/// the modification time back), the CPU features the kernels were chosen
/// for, bmoe's version, and which banks are repacked, at which offsets and
/// shapes.
fn layout_key(files: &ModelFiles, banks: &[&Projection]) -> io::Result<u64> {
    let mut h = DefaultHasher::new();
    for p in files.paths() {
        let meta = fs::metadata(p).map_err(|e| at(p, e))?;
        (meta.ctime(), meta.ctime_nsec()).hash(&mut h);
    }
    crate::llama::cpu_features().hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    for p in banks {
        (p.shard, p.file_offset, p.slice_bytes, p.repacker.as_ref().map(|r| r.slice_bytes())).hash(&mut h);
    }
    Ok(h.finish())
}

/// Writes one shard's copy through a temporary name: the file's size, each
/// bank at its offset, repacked slice by slice where it has a repacker.
/// `wrote` hears of each bank's bytes and may stop the writing.
fn write_copy(
    model: &Path,
    target: &Path,
    size: u64,
    banks: &[&Projection],
    n_expert: usize,
    wrote: &mut dyn FnMut(u64) -> bool,
) -> io::Result<()> {
    let partial = target.with_extension(format!("partial-{}", std::process::id()));
    let result = (|| {
        let src = File::open(model).map_err(|e| at(model, e))?;
        let dst = File::create(&partial).map_err(|e| at(&partial, e))?;
        dst.set_len(size).map_err(|e| at(&partial, e))?;
        let mut raw = Vec::new();
        let mut packed = Vec::new();
        for p in banks {
            raw.resize(p.slice_bytes, 0);
            packed.resize(p.slice_bytes, 0);
            for e in 0..n_expert {
                let offset = p.file_offset + (e * p.slice_bytes) as u64;
                src.read_exact_at(&mut raw, offset).map_err(|e| at(model, e))?;
                let out = match &p.repacker {
                    Some(r) => {
                        r.repack(&raw, &mut packed).map_err(io::Error::other)?;
                        &packed
                    }
                    None => &raw,
                };
                dst.write_all_at(out, offset).map_err(|e| at(&partial, e))?;
            }
            if !wrote((p.slice_bytes * n_expert) as u64) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopped while writing it"));
            }
        }
        // Whole on disk before the rename makes it current; then out of the
        // page cache, which the reads bypass anyway.
        dst.sync_all().map_err(|e| at(&partial, e))?;
        let _ = drop_file_cache(&dst, 0, size);
        let _ = drop_file_cache(&src, 0, size);
        Ok(())
    })();
    match result {
        Ok(()) => fs::rename(&partial, target).map_err(|e| at(target, e)),
        Err(e) => {
            let _ = fs::remove_file(&partial);
            Err(e)
        }
    }
}

/// Experts drawn at random from all the banks at each open, besides the
/// first and last of one bank per shape: over many opens the check covers
/// every slice, at the cost of a few slices' reads per open.
const DRAWN: usize = 8;

/// Repacks the first and last slices of one bank of each distinct shape,
/// and [`DRAWN`] slices drawn at random from all the banks (a new draw at
/// every open), afresh and compares them with the copy: a copy written by
/// another build of the kernels, or damaged, or of a model since changed,
/// is refused rather than computed with.
fn check_sample(files: &ModelFiles, paths: &[PathBuf], banks: &[&Projection]) -> io::Result<()> {
    let experts = |p: &Projection| p.tensor.ne()[2].max(1) as usize;
    let mut picks = Vec::new();
    let mut seen = Vec::new();
    for p in banks.iter().copied().filter(|p| p.repacker.is_some()) {
        if !seen.contains(&(p.slice_bytes, p.tensor.ne())) {
            seen.push((p.slice_bytes, p.tensor.ne()));
            picks.extend([(p, 0), (p, experts(p) - 1)]);
        }
    }
    let mut rng = rand::thread_rng();
    for _ in 0..if banks.is_empty() { 0 } else { DRAWN } {
        let p = banks[rng.gen_range(0..banks.len())];
        picks.push((p, rng.gen_range(0..experts(p))));
    }
    check_slices(files, paths, &picks)
}

/// Compares each picked slice of the copy with a fresh repack of the
/// model's bytes.
fn check_slices(files: &ModelFiles, paths: &[PathBuf], picks: &[(&Projection, usize)]) -> io::Result<()> {
    for &(p, e) in picks {
        let (model_path, copy_path) = (&files.paths()[p.shard], &paths[p.shard]);
        let model = File::open(model_path).map_err(|e| at(model_path, e))?;
        let copy = File::open(copy_path).map_err(|e| at(copy_path, e))?;
        let (mut raw, mut fresh, mut stored) = (vec![0; p.slice_bytes], vec![0; p.slice_bytes], vec![0; p.slice_bytes]);
        let offset = p.file_offset + (e * p.slice_bytes) as u64;
        model.read_exact_at(&mut raw, offset).map_err(|e| at(model_path, e))?;
        copy.read_exact_at(&mut stored, offset).map_err(|e| at(copy_path, e))?;
        // A bank with no repacked kernel is stored as the file has it.
        match &p.repacker {
            Some(r) => r.repack(&raw, &mut fresh).map_err(io::Error::other)?,
            None => fresh.copy_from_slice(&raw),
        }
        if fresh != stored {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: expert {e} of {} differs from a fresh repack (written by another build, or damaged)",
                    copy_path.display(),
                    p.tensor.name()
                ),
            ));
        }
    }
    Ok(())
}
