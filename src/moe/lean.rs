//! Lean open. llama.cpp maps a model with `MAP_POPULATE`, so opening reads
//! every byte of the file, experts included, although a streaming session
//! rebinds every expert tensor to its own memory before using it. A lean
//! copy is the model with each expert tensor's bytes left out as a hole (a
//! sparse file): the same metadata and the same tensors with the same dense
//! bytes, so llama.cpp loads it like the model and computes the same
//! results, but populating its expert ranges reads nothing from storage.
//!
//! The copy lays the expert tensors out first and the dense ones after them.
//! The populate walks the file in order and maps a zero page for every page
//! of a hole; under a memory limit those pages are reclaimed oldest first,
//! so with the dense tensors last the dense pages, read last, are the ones
//! that stay. In the model's own order the dense tensors sit between the
//! layers' experts, the later holes' zero pages pushed the earlier dense
//! pages out, and the first decode read them a second time.
//!
//! The copy takes the dense bytes' room on disk; it is written once into the
//! cache directory and reused while the model's size, modification time and
//! header stay the same.

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::{self, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::gguf::{GgufFile, GgufWriter, ModelFiles, TensorSpec};

/// A lean copy ready to load.
#[derive(Debug, Clone)]
pub struct LeanCopy {
    /// The copy's shard paths, in the model's order (load the first).
    pub paths: Vec<PathBuf>,
    /// Bytes written now (0 when an earlier copy was reused).
    pub written: u64,
    /// Bytes left out as holes, per shard: `(offset, len)` ranges of the
    /// copy (not of the model: the copy orders its tensors differently).
    pub holes: Vec<Vec<(u64, u64)>>,
}

/// Finds or writes the lean copy of `files` under `dir`, leaving out the
/// bytes of every tensor `is_expert` accepts.
pub fn prepare(files: &ModelFiles, is_expert: impl Fn(&str) -> bool, dir: &Path) -> io::Result<LeanCopy> {
    let home = copy_home(files, dir, &key(files)?)?;
    let mut paths = Vec::with_capacity(files.paths().len());
    let mut holes = Vec::with_capacity(files.paths().len());
    let mut written = 0;
    for (shard, source) in files.paths().iter().enumerate() {
        let name = source.file_name().ok_or_else(|| io::Error::other(format!("{}: no file name", source.display())))?;
        let target = home.join(name);
        let layout = Layout::of(&files.shards()[shard], &is_expert).map_err(|e| at(source, e))?;
        if !layout.is_written_at(&target)? {
            written += write_copy(source, &target, &layout)?;
        }
        paths.push(target);
        holes.push(layout.holes);
    }
    Ok(LeanCopy { paths, written, holes })
}

/// Where everything goes in one shard's copy.
#[derive(Debug)]
struct Layout {
    /// Header, metadata and tensor table, padded to the alignment.
    header: Vec<u8>,
    /// Bytes of the whole copy.
    size: u64,
    /// Each dense tensor: (offset in the model, offset in the copy, bytes).
    dense: Vec<(u64, u64, u64)>,
    /// Each expert tensor's range in the copy, left as a hole.
    holes: Vec<(u64, u64)>,
}

impl Layout {
    /// The copy of `shard`: its metadata, then the tensors `is_expert`
    /// accepts, then the others, each group in the model's order.
    fn of(shard: &GgufFile, is_expert: &impl Fn(&str) -> bool) -> io::Result<Layout> {
        let mut writer = GgufWriter::new();
        for (key, value) in shard.metadata() {
            writer.set(key, value.clone());
        }
        let (experts, dense): (Vec<_>, Vec<_>) = shard.tensors().iter().partition(|t| is_expert(&t.name));
        let ordered: Vec<_> = experts.iter().chain(&dense).collect();
        for t in &ordered {
            let spec = TensorSpec::new(t.name.clone(), &t.dims, t.ty);
            if spec.size() != t.size {
                return Err(io::Error::other(format!(
                    "{}: {} bytes in the table, {} by its shape",
                    t.name,
                    t.size,
                    spec.size()
                )));
            }
            writer.add_tensor(spec);
        }
        let header = writer.header();
        let start = header.len() as u64;
        let mut layout = Layout { size: writer.file_size(), header, dense: Vec::new(), holes: Vec::new() };
        for (t, offset) in ordered.iter().zip(writer.data_offsets()) {
            if is_expert(&t.name) {
                layout.holes.push((start + offset, t.size));
            } else {
                layout.dense.push((shard.data_offset + t.offset, start + offset, t.size));
            }
        }
        Ok(layout)
    }

    /// True when `target` exists with this layout's size and header (its
    /// directory's name already pins the model it was copied from).
    fn is_written_at(&self, target: &Path) -> io::Result<bool> {
        let Ok(meta) = fs::metadata(target) else { return Ok(false) };
        if meta.len() != self.size {
            return Ok(false);
        }
        let mut head = vec![0u8; self.header.len()];
        File::open(target).and_then(|mut f| f.read_exact(&mut head)).map_err(|e| at(target, e))?;
        Ok(head == self.header)
    }
}

/// The directory `dir/name` for a copy of `files`, made if missing, with the
/// model it copies recorded in it; older copies of that model (and copies of
/// models that are gone) in `dir` are removed first.
pub(super) fn copy_home(files: &ModelFiles, dir: &Path, name: &str) -> io::Result<PathBuf> {
    let source = fs::canonicalize(&files.paths()[0]).map_err(|e| at(&files.paths()[0], e))?;
    remove_stale(dir, name, &source);
    let home = dir.join(name);
    fs::create_dir_all(&home).map_err(|e| at(&home, e))?;
    let record = home.join(SOURCE_FILE);
    let bytes = source.as_os_str().as_encoded_bytes();
    if fs::read(&record).ok().as_deref() != Some(bytes) {
        // Through a temporary name: another process's `remove_stale` reads
        // the record, and must never see it empty or half written.
        let partial = record.with_extension(format!("partial-{}", std::process::id()));
        fs::write(&partial, bytes).map_err(|e| at(&partial, e))?;
        fs::rename(&partial, &record).map_err(|e| at(&record, e))?;
    }
    Ok(home)
}

/// The file in each copy's directory naming the model it copies.
pub(super) const SOURCE_FILE: &str = "source";

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
        // No record, or an empty one: a copy another process is making.
        let Ok(recorded) = fs::read(path.join(SOURCE_FILE)) else { continue };
        if recorded.is_empty() {
            continue;
        }
        let recorded = PathBuf::from(String::from_utf8_lossy(&recorded).into_owned());
        if !recorded.exists() || recorded == source {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// Names a copy after the model's file name, path, sizes and modification
/// times, so a changed or moved model gets a new copy.
pub(super) fn key(files: &ModelFiles) -> io::Result<String> {
    let mut h = DefaultHasher::new();
    for p in files.paths() {
        let canonical = fs::canonicalize(p).map_err(|e| at(p, e))?;
        let meta = fs::metadata(p).map_err(|e| at(p, e))?;
        canonical.hash(&mut h);
        // The change time too: an in-place edit that sets the mtime back
        // cannot set it back.
        (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino(), meta.ctime(), meta.ctime_nsec()).hash(&mut h);
    }
    let stem = files.paths()[0].file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let stem: String = stem.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).take(48).collect();
    Ok(format!("{stem}-{:016x}", h.finish()))
}

/// Writes the copy of `source` laid out as `layout` at `target`, through a
/// temporary name; returns the bytes written.
fn write_copy(source: &Path, target: &Path, layout: &Layout) -> io::Result<u64> {
    let partial = target.with_extension(format!("partial-{}", std::process::id()));
    let result = (|| {
        let src = File::open(source).map_err(|e| at(source, e))?;
        let dst = File::create(&partial).map_err(|e| at(&partial, e))?;
        dst.set_len(layout.size).map_err(|e| at(&partial, e))?;
        dst.write_all_at(&layout.header, 0).map_err(|e| at(&partial, e))?;
        let mut written = layout.header.len() as u64;
        let mut buf = vec![0u8; 4 << 20];
        for &(from, to, len) in &layout.dense {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(buf.len() as u64) as usize;
                src.read_exact_at(&mut buf[..n], from + done).map_err(|e| at(source, e))?;
                dst.write_all_at(&buf[..n], to + done).map_err(|e| at(&partial, e))?;
                done += n as u64;
            }
            written += len;
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

pub(super) fn at(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::gguf::{GgmlType, Value};

    /// A GGUF of dense and expert tensors in layer order, each filled with
    /// bytes naming it; returns its path.
    fn model(dir: &Path, tag: u8) -> PathBuf {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("test".into()));
        w.set("test.tag", Value::U32(u32::from(tag)));
        for layer in 0..2 {
            w.add_tensor(TensorSpec::new(format!("blk.{layer}.attn.weight"), &[64, 10], GgmlType::F32));
            w.add_tensor(TensorSpec::new(format!("blk.{layer}.ffn_up_exps.weight"), &[256, 1024], GgmlType::F32));
        }
        let path = dir.join("m.gguf");
        let mut out = io::BufWriter::new(File::create(&path).unwrap());
        let tensors = w.tensors().to_vec();
        w.write(&mut out, &mut |i| Ok(vec![tag.wrapping_add(i as u8 + 1); tensors[i].size() as usize])).unwrap();
        drop(out);
        path
    }

    fn bytes_of(path: &Path, name: &str) -> Vec<u8> {
        let f = GgufFile::open(path).unwrap();
        let t = f.tensor(name).unwrap();
        let mut buf = vec![0u8; t.size as usize];
        File::open(path).unwrap().read_exact_at(&mut buf, f.data_offset + t.offset).unwrap();
        buf
    }

    #[test]
    fn experts_become_holes_first_and_dense_tensors_follow_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let source = model(dir.path(), 7);
        let files = ModelFiles::open(&source).unwrap();
        let is_expert = |name: &str| name.contains("_exps");
        let lean_dir = dir.path().join("lean");
        let copy = prepare(&files, is_expert, &lean_dir).unwrap();
        let (src, lean) = (GgufFile::open(&source).unwrap(), GgufFile::open(&copy.paths[0]).unwrap());
        assert_eq!(lean.metadata(), src.metadata());
        // The same tensors, experts first.
        let names =
            |f: &GgufFile| f.tensors().iter().map(|t| (t.name.clone(), t.dims.clone(), t.ty)).collect::<Vec<_>>();
        let (mut a, mut b) = (names(&src), names(&lean));
        assert_ne!(a, b, "the copy keeps the model's order");
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(a, b);
        let last_expert = lean.tensors().iter().filter(|t| is_expert(&t.name)).map(|t| t.offset).max().unwrap();
        let first_dense = lean.tensors().iter().filter(|t| !is_expert(&t.name)).map(|t| t.offset).min().unwrap();
        assert!(last_expert < first_dense);
        // Dense bytes copied, expert bytes zero holes where the copy says.
        for t in src.tensors() {
            let bytes = bytes_of(&copy.paths[0], &t.name);
            if is_expert(&t.name) {
                assert!(bytes.iter().all(|&x| x == 0), "{}", t.name);
                let at = lean.data_offset + lean.tensor(&t.name).unwrap().offset;
                assert!(copy.holes[0].contains(&(at, t.size)), "{}", t.name);
            } else {
                assert_eq!(bytes, bytes_of(&source, &t.name), "{}", t.name);
            }
        }
        assert_eq!(copy.holes[0].len(), 2);
        let dense: u64 = src.tensors().iter().filter(|t| !is_expert(&t.name)).map(|t| t.size).sum();
        assert_eq!(copy.written, lean.data_offset + dense);
        // Sparse where the file system allows: far fewer blocks than bytes.
        let blocks = fs::metadata(&copy.paths[0]).unwrap().blocks() * 512;
        assert!(blocks < 1_000_000, "{blocks} bytes allocated");
        // Reused as it is; rewritten once the model changes.
        assert_eq!(prepare(&files, is_expert, &lean_dir).unwrap().written, 0);
        let changed = ModelFiles::open(&model(dir.path(), 9)).unwrap();
        let again = prepare(&changed, is_expert, &lean_dir).unwrap();
        assert!(again.written > 0);
        assert_eq!(bytes_of(&again.paths[0], "blk.1.attn.weight"), bytes_of(&source, "blk.1.attn.weight"));
    }

    #[test]
    fn a_copy_another_process_is_making_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let files = ModelFiles::open(&model(dir.path(), 3)).unwrap();
        let lean_dir = dir.path().join("lean");
        // Another model's copy just begun (its record not written yet, or
        // empty), and a copy of a model that is gone.
        for name in ["begun-1", "begun-2", "gone-3"] {
            fs::create_dir_all(lean_dir.join(name)).unwrap();
        }
        fs::write(lean_dir.join("begun-2").join(SOURCE_FILE), b"").unwrap();
        fs::write(
            lean_dir.join("gone-3").join(SOURCE_FILE),
            dir.path().join("missing.gguf").as_os_str().as_encoded_bytes(),
        )
        .unwrap();
        let copy = prepare(&files, |n| n.contains("_exps"), &lean_dir).unwrap();
        assert!(lean_dir.join("begun-1").is_dir() && lean_dir.join("begun-2").is_dir());
        assert!(!lean_dir.join("gone-3").exists());
        // The record names the model, and no temporary file is left beside it.
        let home = copy.paths[0].parent().unwrap();
        let record = fs::read(home.join(SOURCE_FILE)).unwrap();
        assert_eq!(record, fs::canonicalize(&files.paths()[0]).unwrap().as_os_str().as_encoded_bytes());
        let names: Vec<_> = fs::read_dir(home).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }
}
