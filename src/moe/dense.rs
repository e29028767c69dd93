//! How the dense (non-expert) weights are held while experts stream:
//! `mmap` leaves them in llama.cpp's file mapping, where memory pressure can
//! evict them and every later use faults them back in; `warm` touches every
//! page of them once at open; `anon` copies them into bmoe's own anonymous
//! memory and rebinds the tensors, so the page cache can no longer take
//! them away; `auto` (the default) is `anon` for a small set and `mmap`
//! otherwise. The bytes are the same in every mode: output is identical.

use std::sync::Arc;

use super::{MoeHook, ReadLanes};
use crate::gguf::ModelFiles;
use crate::llama::memory::Region;

/// The most bytes of dense weights `auto` copies into bmoe's memory.
///
/// A set this small is what is left in the mapping when most dense weights
/// live elsewhere (the batch-invariant kernels hold f16 and f32 ones in
/// their own buffer): norms and biases among pages nothing reads any more.
/// Under a cap, each fault on one of them reads ahead into those dead pages
/// and pushes the others out, every token: measured on the bench preset
/// under a third of its size, a batch-invariant server read about 295 MB of
/// such pages a token and decoded 3.9 tok/s, and 16.0 with its 4.4 MiB held
/// (docs/benchmarks.md, "Paired under a cap"). Holding them costs their
/// size, already counted in the cache budget.
pub const AUTO_ANON_MAX_BYTES: u64 = 64 << 20;

/// `--dense-weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseWeights {
    /// `Anon` when the dense weights the graph reads take at most
    /// [`AUTO_ANON_MAX_BYTES`] whole, `Mmap` otherwise.
    #[default]
    Auto,
    /// llama.cpp's memory map of the file, as loaded.
    Mmap,
    /// The mapping, with every page touched once at open.
    Warm,
    /// A copy in bmoe's own memory.
    Anon,
}

impl DenseWeights {
    /// Parses `auto`, `mmap`, `warm` or `anon`.
    pub fn from_name(name: &str) -> Option<DenseWeights> {
        match name {
            "auto" => Some(DenseWeights::Auto),
            "mmap" => Some(DenseWeights::Mmap),
            "warm" => Some(DenseWeights::Warm),
            "anon" => Some(DenseWeights::Anon),
            _ => None,
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            DenseWeights::Auto => "auto",
            DenseWeights::Mmap => "mmap",
            DenseWeights::Warm => "warm",
            DenseWeights::Anon => "anon",
        }
    }

    /// The mode a run takes when its dense weights take `whole_bytes`
    /// (every tensor whole, as `Anon` would hold them): `Auto` decides, the
    /// others are themselves.
    pub fn resolve(self, whole_bytes: u64) -> DenseWeights {
        match self {
            DenseWeights::Auto if whole_bytes <= AUTO_ANON_MAX_BYTES => DenseWeights::Anon,
            DenseWeights::Auto => DenseWeights::Mmap,
            mode => mode,
        }
    }

    /// Whether this mode makes a run stream (`warm` and `anon` apply only
    /// to a streamed run; `auto` and `mmap` apply to any).
    pub fn needs_streaming(self) -> bool {
        matches!(self, DenseWeights::Warm | DenseWeights::Anon)
    }
}

/// Applies `mode` (resolved: `Auto` leaves them mapped) to the dense
/// weights the hook saw at capture: every non-expert tensor the graph reads
/// that is in the model files, whatever its name (`blk.N.ssm_a`, `blk.N.ssm_d`, gemma4's
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
        DenseWeights::Auto | DenseWeights::Mmap => return Ok((0, 0)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_holds_a_small_set_and_maps_a_large_one() {
        let auto = DenseWeights::Auto;
        assert_eq!(auto.resolve(0), DenseWeights::Anon);
        assert_eq!(auto.resolve(AUTO_ANON_MAX_BYTES), DenseWeights::Anon);
        assert_eq!(auto.resolve(AUTO_ANON_MAX_BYTES + 1), DenseWeights::Mmap);
        // An explicit mode is kept whatever the size.
        for mode in [DenseWeights::Mmap, DenseWeights::Warm, DenseWeights::Anon] {
            assert_eq!(mode.resolve(1), mode);
            assert_eq!(mode.resolve(u64::MAX), mode);
        }
    }

    #[test]
    fn names_round_trip_and_only_warm_and_anon_need_streaming() {
        for mode in [DenseWeights::Auto, DenseWeights::Mmap, DenseWeights::Warm, DenseWeights::Anon] {
            assert_eq!(DenseWeights::from_name(mode.name()), Some(mode));
        }
        assert_eq!(DenseWeights::from_name("Anon"), None);
        assert_eq!(DenseWeights::default(), DenseWeights::Auto);
        assert!(!DenseWeights::Auto.needs_streaming() && !DenseWeights::Mmap.needs_streaming());
        assert!(DenseWeights::Warm.needs_streaming() && DenseWeights::Anon.needs_streaming());
    }
}
