//! Writing a planned model to one or more GGUF files at disk speed: tensor
//! data is generated on all cores one tensor ahead of the writer.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::ModelSpec;
use super::fill::{RowPools, render_into};
use super::plan::{Planned, plan};
use crate::gguf::{GgufWriter, Value, split_path};

/// What was written.
#[derive(Debug, Clone)]
pub struct WriteReport {
    /// The files, first shard first.
    pub paths: Vec<PathBuf>,
    /// Total bytes written.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// Writes the model described by `spec` to `out` (or to
/// `<out without .gguf>-0000i-of-0000N.gguf` when `spec.split > 1`).
/// `progress(done, total)` is called as bytes are written; returning
/// `ControlFlow::Break` stops the write with an error. Each file is written
/// under a `.partial` name and renamed when complete; a write that stops
/// (an error or a `Break`) removes its partial file.
pub fn write_model(
    spec: &ModelSpec,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64) -> ControlFlow<()>,
) -> Result<WriteReport> {
    if let Err(e) = spec.validate() {
        bail!("invalid model shape: {e}");
    }
    write_plan(&plan(spec), spec, out, progress)
}

/// Writes an already planned model (the spec gives the seed and the shard
/// count): [`write_model`] for a plan a caller has edited, such as a test
/// that needs a deliberately broken file.
pub fn write_plan(
    planned: &Planned,
    spec: &ModelSpec,
    out: &Path,
    progress: &mut dyn FnMut(u64, u64) -> ControlFlow<()>,
) -> Result<WriteReport> {
    let start = Instant::now();
    let n_shards = spec.split as usize;
    let paths: Vec<PathBuf> = if n_shards == 1 {
        vec![out.to_path_buf()]
    } else {
        let s = out.to_str().context("output path is not valid UTF-8")?;
        let prefix = s.strip_suffix(".gguf").unwrap_or(s);
        (1..=n_shards as u32).map(|i| split_path(Path::new(prefix), i, n_shards as u32)).collect()
    };

    // Shard boundaries: contiguous runs of tensors with roughly equal bytes.
    let total_data: u64 = planned.tensors.iter().map(|(t, _)| t.size()).sum();
    let mut shard_of = Vec::with_capacity(planned.tensors.len());
    let mut acc = 0u64;
    for (t, _) in &planned.tensors {
        let shard = ((acc * n_shards as u64) / total_data.max(1)) as usize;
        shard_of.push(shard.min(n_shards - 1));
        acc += t.size();
    }
    let mut writers: Vec<GgufWriter> = (0..n_shards).map(|_| GgufWriter::new()).collect();
    for (k, v) in &planned.metadata {
        writers[0].set(k, v.clone());
    }
    if n_shards > 1 {
        for (i, w) in writers.iter_mut().enumerate() {
            w.set("split.no", Value::U16(i as u16));
            w.set("split.count", Value::U16(n_shards as u16));
            w.set("split.tensors.count", Value::I32(planned.tensors.len() as i32));
        }
    }
    for ((t, _), &s) in planned.tensors.iter().zip(&shard_of) {
        writers[s].add_tensor(t.clone());
    }
    if let Some(i) = writers.iter().position(|w| w.tensors().is_empty()) {
        bail!("--split {n_shards} leaves shard {} without tensors; use fewer shards", i + 1);
    }
    let total: u64 = writers.iter().map(GgufWriter::file_size).sum();
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    check_room(dir, total, out)?;
    if let Some((t, _)) = planned.tensors.iter().max_by_key(|(t, _)| t.size()) {
        check_memory(&t.name, t.size(), crate::moe::budget::MemoryLimits::read().tightest())?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;

    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Two tensors may wait rendered, so that a slow one to render (the
    // quantizer's pools) and a slow one to write overlap.
    let (tx, rx) = mpsc::sync_channel::<Result<Vec<u8>, String>>(2);
    // Written buffers go back to the generator to be filled again.
    let (recycle, recycled) = mpsc::channel::<Vec<u8>>();
    let tensors = &planned.tensors;
    let seed = spec.seed;
    let mut done = 0u64;
    std::thread::scope(|scope| -> Result<()> {
        // Owned here, so that a writer that stops early drops it and the
        // generator's next send fails instead of blocking the scope forever.
        let rx = rx;
        scope.spawn(move || {
            let mut pools = RowPools::new(seed);
            for (t, fill) in tensors {
                let mut bytes = recycled.try_recv().unwrap_or_default();
                let rendered = render_into(t, fill, seed, threads, &mut pools, &mut bytes).map(|()| bytes);
                if tx.send(rendered).is_err() {
                    return; // the writer stopped on an error
                }
            }
        });
        let mut index = 0;
        for (w, path) in writers.iter().zip(&paths) {
            let partial = PartialFile(path.with_extension("gguf.partial"));
            let partial = &partial.0;
            let file = File::create(partial).with_context(|| format!("creating {}", partial.display()))?;
            let mut out = BufWriter::with_capacity(8 << 20, file);
            let header = w.header();
            out.write_all(&header).with_context(|| format!("writing {}", partial.display()))?;
            done += header.len() as u64;
            for t in w.tensors() {
                let bytes = rx.recv().context("tensor generator stopped")?.map_err(|e| anyhow::anyhow!(e))?;
                crate::gguf::write_tensor_padded(&mut out, t, &bytes)
                    .with_context(|| format!("writing {}", partial.display()))?;
                let _ = recycle.send(bytes);
                done += t.size().next_multiple_of(32);
                index += 1;
                if progress(done.min(total), total).is_break() {
                    bail!("stopped before {} was complete", path.display());
                }
            }
            out.into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .with_context(|| format!("writing {}", partial.display()))?;
            fs::rename(partial, path).with_context(|| format!("renaming {}", partial.display()))?;
        }
        debug_assert_eq!(index, tensors.len());
        Ok(())
    })?;
    let _ = progress(total, total);
    Ok(WriteReport { paths, bytes: total, seconds: start.elapsed().as_secs_f64() })
}

/// Refuses a write the disk cannot hold before any byte is written, rather
/// than minutes into a multi-GiB file. A file being replaced counts as
/// taken: it is removed only by the rename at the end. When the free space
/// cannot be read, the write goes ahead and a full disk is its error.
fn check_room(dir: &Path, need: u64, out: &Path) -> Result<()> {
    // The folder may not exist yet: its nearest existing parent is on the
    // same disk (a relative path's last ancestor is "", the current folder).
    let existing = dir.ancestors().find(|d| d.is_dir()).unwrap_or(Path::new("."));
    let Ok(stat) = rustix::fs::statvfs(existing) else { return Ok(()) };
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    if free < need {
        bail!(
            "{} would take {}, but {} has {} free; write it elsewhere (-o) or make room",
            out.display(),
            indicatif::HumanBytes(need),
            existing.display(),
            indicatif::HumanBytes(free)
        );
    }
    Ok(())
}

/// Buffers of one tensor's size the writer may hold at once: the one being
/// rendered, two rendered and waiting, and the one being written.
const BUFFERS_IN_FLIGHT: u64 = 4;

/// Refuses a model whose largest tensor cannot be rendered in `available`
/// bytes of memory (when known): each tensor is generated whole, and an
/// allocation that fails aborts the process.
fn check_memory(name: &str, size: u64, available: Option<u64>) -> Result<()> {
    let need = size.saturating_mul(BUFFERS_IN_FLIGHT);
    match available {
        Some(free) if need > free => bail!(
            "the model's largest tensor, {name}, is {}: writing holds up to {BUFFERS_IN_FLIGHT} of that size in memory \
             ({}), and {} is available; make the experts narrower (--expert-ff, --embd) or fewer (--experts)",
            indicatif::HumanBytes(size),
            indicatif::HumanBytes(need),
            indicatif::HumanBytes(free)
        ),
        _ => Ok(()),
    }
}

/// A file being written; removed when dropped unless it was renamed away.
struct PartialFile(PathBuf);

impl Drop for PartialFile {
    fn drop(&mut self) {
        // After the rename there is nothing left to remove.
        let _ = fs::remove_file(&self.0);
    }
}

/// Overwrites the data of tensor `name` of the model `files` in place,
/// row by row: `row(i, values)` fills row `i` (`ne[0]` values), which is
/// encoded in the tensor's own type. The file keeps its layout.
pub fn rewrite_tensor(
    files: &crate::gguf::ModelFiles,
    name: &str,
    row: &mut dyn FnMut(usize, &mut [f32]),
) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let at = files.locate(name).with_context(|| format!("{}: no tensor {name}", files.paths()[0].display()))?;
    let (ty, width) = (at.info.ty, at.info.dims[0] as usize);
    let rows = (at.info.elements() / width as u64) as usize;
    let row_bytes = (at.info.size / rows as u64) as usize;
    let file = fs::OpenOptions::new().write(true).open(&files.paths()[at.shard])?;
    // A few MiB of rows at a time.
    let chunk = (4 << 20) / (width * 4).max(1) + 1;
    let mut values = Vec::new();
    let mut bytes = Vec::new();
    for first in (0..rows).step_by(chunk) {
        let n = chunk.min(rows - first);
        values.clear();
        values.resize(n * width, 0.0);
        for (i, v) in values.chunks_mut(width).enumerate() {
            row(first + i, v);
        }
        bytes.clear();
        bytes.resize(n * row_bytes, 0);
        super::fill::encode_rows(ty, &values, width, &mut bytes).map_err(anyhow::Error::msg)?;
        file.write_all_at(&bytes, at.file_offset + (first * row_bytes) as u64)?;
    }
    file.sync_data()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{Arch, Preset};

    #[test]
    fn a_stopped_write_leaves_no_file_behind() {
        let dir = tempfile::tempdir().unwrap();
        let spec = ModelSpec { split: 2, ..ModelSpec::preset(Preset::Tiny, Arch::Qwen3Moe) };
        let out = dir.path().join("m.gguf");
        // Stop after some bytes of the second shard, as Ctrl-C does.
        let mut calls = 0;
        let err = write_model(&spec, &out, &mut |done, total| {
            calls += 1;
            if done > total * 3 / 4 { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })
        .unwrap_err();
        assert!(err.to_string().contains("stopped before"), "{err}");
        assert!(calls > 1);
        // The finished first shard stays (it is complete); no partial file does.
        let names: Vec<String> =
            fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
        assert_eq!(names, ["m-00001-of-00002.gguf"]);
    }

    #[test]
    fn a_model_larger_than_the_free_disk_is_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        // 22 TiB of experts: no disk this runs on has that free.
        let spec = ModelSpec {
            layers: 16,
            experts: 2,
            experts_used: 1,
            embd: 64,
            expert_ff: 1_000_000_000,
            ..ModelSpec::preset(Preset::Tiny, Arch::Qwen3Moe)
        };
        // Into a folder not yet made, which the refusal does not make.
        let out = dir.path().join("models/huge.gguf");
        let mut calls = 0;
        let err = write_model(&spec, &out, &mut |_, _| {
            calls += 1;
            ControlFlow::Continue(())
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("would take 22") && err.contains("TiB") && err.contains("free"), "{err}");
        assert_eq!(calls, 0, "nothing was written");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_tensor_too_large_to_render_in_memory_is_refused() {
        const GIB: u64 = 1 << 30;
        let err = check_memory("blk.0.ffn_up_exps.weight", 3 * GIB, Some(8 * GIB)).unwrap_err().to_string();
        assert!(err.contains("blk.0.ffn_up_exps.weight") && err.contains("12.00 GiB"), "{err}");
        assert!(err.contains("8.00 GiB is available"), "{err}");
        check_memory("t", 2 * GIB, Some(8 * GIB)).unwrap();
        // Memory that cannot be read does not stop a write.
        check_memory("t", 3 * GIB, None).unwrap();
    }
}
