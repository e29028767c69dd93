//! Lean open. llama.cpp maps a model with `MAP_POPULATE`, so opening reads
//! every byte of the file, experts included, although a streaming session
//! rebinds every expert tensor to its own memory before using it. A lean
//! copy is the model file with each expert tensor's bytes left out as a hole
//! (a sparse file): the same header, the same offsets and the same dense
//! bytes, so llama.cpp loads it like the model and computes the same
//! results, but populating its expert ranges reads nothing from storage.
//! The copy takes the dense bytes' room on disk; it is written once into the
//! cache directory and reused while the model's size, modification time and
//! header stay the same.

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::gguf::ModelFiles;

/// A lean copy ready to load.
#[derive(Debug, Clone)]
pub struct LeanCopy {
    /// The copy's shard paths, in the model's order (load the first).
    pub paths: Vec<PathBuf>,
    /// Bytes written now (0 when an earlier copy was reused).
    pub written: u64,
    /// Bytes left out as holes, per shard: `(offset, len)` ranges.
    pub holes: Vec<Vec<(u64, u64)>>,
}

/// Finds or writes the lean copy of `files` under `dir`, leaving out the
/// bytes of every tensor `is_expert` accepts.
pub fn prepare(files: &ModelFiles, is_expert: impl Fn(&str) -> bool, dir: &Path) -> io::Result<LeanCopy> {
    let mut holes: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.paths().len()];
    for t in files.tensors().filter(|t| is_expert(&t.info.name)) {
        holes[t.shard].push((t.file_offset, t.info.size));
    }
    for h in &mut holes {
        h.sort_unstable();
    }
    let name = key(files)?;
    let source = fs::canonicalize(&files.paths()[0]).map_err(|e| at(&files.paths()[0], e))?;
    remove_stale(dir, &name, &source);
    let home = dir.join(&name);
    fs::create_dir_all(&home).map_err(|e| at(&home, e))?;
    let record = home.join(SOURCE_FILE);
    fs::write(&record, source.as_os_str().as_encoded_bytes()).map_err(|e| at(&record, e))?;
    let mut paths = Vec::with_capacity(files.paths().len());
    let mut written = 0;
    for (shard, source) in files.paths().iter().enumerate() {
        let name = source.file_name().ok_or_else(|| io::Error::other(format!("{}: no file name", source.display())))?;
        let target = home.join(name);
        let header = files.shards()[shard].data_offset;
        if !is_current(source, &target, header)? {
            written += write_copy(source, &target, &holes[shard])?;
        }
        paths.push(target);
    }
    Ok(LeanCopy { paths, written, holes })
}

/// The file in each copy's directory naming the model it copies.
const SOURCE_FILE: &str = "source";

/// Removes the copies of models that are gone, and older copies of
/// `source` (the model changed since). Best effort: a copy in use by
/// another process stays readable until that process closes it.
fn remove_stale(dir: &Path, current: &str, source: &Path) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == current || !path.is_dir() {
            continue;
        }
        let Ok(recorded) = fs::read(path.join(SOURCE_FILE)) else { continue };
        let recorded = PathBuf::from(String::from_utf8_lossy(&recorded).into_owned());
        if !recorded.exists() || recorded == source {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Names a copy after the model's file name, path, sizes and modification
/// times, so a changed or moved model gets a new copy.
fn key(files: &ModelFiles) -> io::Result<String> {
    let mut h = DefaultHasher::new();
    for p in files.paths() {
        let canonical = fs::canonicalize(p).map_err(|e| at(p, e))?;
        let meta = fs::metadata(p).map_err(|e| at(p, e))?;
        canonical.hash(&mut h);
        (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).hash(&mut h);
    }
    let stem = files.paths()[0].file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stem: String = stem.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).take(48).collect();
    Ok(format!("{stem}-{:016x}", h.finish()))
}

/// True when `target` exists, has the source's size and starts with the
/// same header bytes (metadata and tensor table).
fn is_current(source: &Path, target: &Path, header: u64) -> io::Result<bool> {
    let Ok(meta) = fs::metadata(target) else { return Ok(false) };
    if meta.len() != fs::metadata(source).map_err(|e| at(source, e))?.len() {
        return Ok(false);
    }
    let (mut a, mut b) =
        (File::open(source).map_err(|e| at(source, e))?, File::open(target).map_err(|e| at(target, e))?);
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut left = header;
    while left > 0 {
        let n = left.min(x.len() as u64) as usize;
        a.read_exact(&mut x[..n]).map_err(|e| at(source, e))?;
        b.read_exact(&mut y[..n]).map_err(|e| at(target, e))?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
        left -= n as u64;
    }
    Ok(true)
}

/// Writes `target` as `source` with `holes` (sorted, `(offset, len)`) left
/// unwritten, through a temporary name; returns the bytes written.
fn write_copy(source: &Path, target: &Path, holes: &[(u64, u64)]) -> io::Result<u64> {
    let size = fs::metadata(source).map_err(|e| at(source, e))?.len();
    let partial = target.with_extension(format!("partial-{}", std::process::id()));
    let result = (|| {
        let mut src = File::open(source).map_err(|e| at(source, e))?;
        let dst = File::create(&partial).map_err(|e| at(&partial, e))?;
        dst.set_len(size).map_err(|e| at(&partial, e))?;
        let mut written = 0;
        let mut buf = vec![0u8; 4 << 20];
        let mut copy = |from: u64, to: u64| -> io::Result<()> {
            src.seek(SeekFrom::Start(from)).map_err(|e| at(source, e))?;
            let mut at_ = from;
            while at_ < to {
                let n = (to - at_).min(buf.len() as u64) as usize;
                src.read_exact(&mut buf[..n]).map_err(|e| at(source, e))?;
                dst.write_all_at(&buf[..n], at_).map_err(|e| at(&partial, e))?;
                at_ += n as u64;
            }
            written += to - from;
            Ok(())
        };
        let mut next = 0;
        for &(offset, len) in holes {
            if offset > next {
                copy(next, offset)?;
            }
            next = next.max(offset + len);
        }
        if next < size {
            copy(next, size)?;
        }
        // On disk before the rename makes it current: after a crash a copy
        // must be whole or absent, never a header over zeros.
        dst.sync_all().map_err(|e| at(&partial, e))?;
        Ok(written)
    })();
    match result {
        Ok(written) => {
            fs::rename(&partial, target).map_err(|e| at(target, e))?;
            Ok(written)
        }
        Err(e) => {
            let _ = fs::remove_file(&partial);
            Err(e)
        }
    }
}

fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_are_left_out_and_everything_else_copied() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("m.bin");
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8 + 1).collect();
        fs::write(&source, &data).unwrap();
        let target = dir.path().join("lean.bin");
        let holes = [(100_000, 1_000_000), (1_500_000, 1_200_000)];
        let written = write_copy(&source, &target, &holes).unwrap();
        assert_eq!(written, 3_000_000 - 2_200_000);
        let copy = fs::read(&target).unwrap();
        assert_eq!(copy.len(), data.len());
        for (i, (&a, &b)) in data.iter().zip(&copy).enumerate() {
            let in_hole = holes.iter().any(|&(o, l)| (o..o + l).contains(&(i as u64)));
            assert_eq!(b, if in_hole { 0 } else { a }, "byte {i}");
        }
        // Sparse where the file system allows: far fewer blocks than bytes.
        let blocks = fs::metadata(&target).unwrap().blocks() * 512;
        assert!(blocks < 2_000_000, "{blocks} bytes allocated");
        assert!(is_current(&source, &target, 100_000).unwrap());
        fs::write(&source, [&[0u8][..], &data[1..]].concat()).unwrap();
        assert!(!is_current(&source, &target, 100_000).unwrap());
    }
}
