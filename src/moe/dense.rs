//! How the dense (non-expert) weights are held while experts stream:
//! `mmap` leaves them in llama.cpp's file mapping, where memory pressure can
//! evict them and every later use faults them back in; `warm` touches every
//! page of them once at open; `anon` copies them into bmoe's own anonymous
//! memory and rebinds the tensors, so the page cache can no longer take
//! them away. The bytes are the same in every mode: output is identical.

use std::sync::Arc;

use super::{MoeHook, ReadLanes};
use crate::gguf::ModelFiles;
use crate::llama::memory::Region;

/// `--dense-weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseWeights {
    /// llama.cpp's memory map of the file, as loaded.
    #[default]
    Mmap,
    /// The mapping, with every page touched once at open.
    Warm,
    /// A copy in bmoe's own memory.
    Anon,
}

impl DenseWeights {
    /// Parses `mmap`, `warm` or `anon`.
    pub fn from_name(name: &str) -> Option<DenseWeights> {
        match name {
            "mmap" => Some(DenseWeights::Mmap),
            "warm" => Some(DenseWeights::Warm),
            "anon" => Some(DenseWeights::Anon),
            _ => None,
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            DenseWeights::Mmap => "mmap",
            DenseWeights::Warm => "warm",
            DenseWeights::Anon => "anon",
        }
    }
}

/// Applies `mode` to the dense weights the hook saw at capture: every
/// non-expert tensor the graph reads that is in the model files, whatever
/// its name (`blk.N.ssm_a`, `blk.N.ssm_d`, gemma4's
/// `blk.N.ffn_gate_inp.scale`: no `.weight` or `.bias`; one left in the
/// mapping would fault with SIGBUS once the file is truncated). A graph
/// tensor whose size differs from the file's tensor of that name is not that
/// tensor (an input or a cache that a hostile file names). Returns (tensors,
/// bytes) handled.
pub fn apply(
    mode: DenseWeights,
    hook: &mut MoeHook,
    files: &ModelFiles,
    lanes: &ReadLanes,
) -> Result<(usize, u64), String> {
    let weights: Vec<_> = hook
        .dense()
        .iter()
        .filter_map(|(name, handle)| Some((*handle, files.locate(name)?)))
        .filter(|(handle, loc)| handle.nbytes() as u64 == loc.info.size)
        .map(|(handle, loc)| (handle, loc.shard, loc.file_offset))
        .collect();
    let mut bytes = 0u64;
    match mode {
        DenseWeights::Mmap => return Ok((0, 0)),
        DenseWeights::Warm => {
            for (handle, _, _) in &weights {
                bytes += handle.prefault() as u64;
            }
        }
        DenseWeights::Anon => {
            let mut bindings = Vec::with_capacity(weights.len());
            for (handle, shard, offset) in &weights {
                let len = handle.nbytes();
                let region =
                    Region::reserve(len).map_err(|e| format!("reserving {len} bytes for {}: {e}", handle.name()))?;
                handle.copy_into(&region).map_err(|e| format!("copying {}: {e}", handle.name()))?;
                let binding = handle.bind(Arc::new(region), 0, None)?;
                // The mapped copy is no longer read: give its pages back.
                binding.release_original_pages().map_err(|e| format!("releasing {}: {e}", handle.name()))?;
                lanes
                    .drop_cached(*shard, *offset, len as u64)
                    .map_err(|e| format!("dropping cached {}: {e}", handle.name()))?;
                bytes += len as u64;
                bindings.push(binding);
            }
            hook.hold_dense(bindings);
        }
    }
    Ok((weights.len(), bytes))
}
