//! Expert streaming: the recipe registry, the capture/stream eval hook, the
//! expert store (slots or LRU cache) and the read lanes.

mod arena_runs;
pub mod budget;
pub mod capability;
pub mod copies;
pub mod dense;
pub mod duel;
pub mod evict;
mod hook;
pub mod inspect;
mod lanes;
pub mod lean;
pub mod partial;
pub mod predict;
pub mod profile;
pub mod recipe;
pub mod repack;
pub mod repacked;
mod store;

pub use hook::{CapturedTensor, MoeHook, RouteRow, StepTrace};
pub use lanes::{LANE_THREAD_PREFIX, ReadJob, ReadLanes, ReadStats};
pub use store::{ExpertStore, LoadReport, PrefetchReport, Projection};

use std::collections::BTreeMap;

use std::sync::Arc;

use crate::gguf::ModelFiles;
use crate::llama::Repacker;
use crate::llama::memory::page;

/// The expert banks found at capture, resolved to file locations.
pub struct Banks {
    /// Projections per layer (empty for layers without experts).
    pub layers: Vec<Vec<Projection>>,
    /// Experts per layer.
    pub n_expert: usize,
    /// Some slice does not start on a page boundary in its file.
    pub unaligned: bool,
}

/// Matches captured tensors to their bytes in the model files and checks
/// that the live layout is the file layout (`slice = nb[2]`). With
/// `repack`, each bank the CPU has repacked kernels for gets a repacker.
pub fn resolve_banks(
    captured: &BTreeMap<(u32, usize), CapturedTensor>,
    files: &ModelFiles,
    repack: bool,
) -> Result<Banks, String> {
    let mut n_expert = None;
    let mut layers: Vec<Vec<Projection>> = Vec::new();
    let mut unaligned = false;
    for t in captured.values() {
        let loc = files.locate(&t.name).ok_or_else(|| format!("expert tensor {} is not in the model files", t.name))?;
        let experts = usize::try_from(t.ne[2]).map_err(|_| format!("{}: bad expert count", t.name))?;
        if *n_expert.get_or_insert(experts) != experts {
            return Err(format!("{} has {experts} experts, other layers have {}", t.name, n_expert.unwrap_or(0)));
        }
        let slice = t.nb[2];
        let live = t.handle.nbytes() as u64;
        if loc.info.size != live || (slice * experts) as u64 != live || loc.info.ty.id() != t.type_id {
            return Err(format!(
                "{}: live tensor ({live} bytes, {experts} x {slice}) does not match the file ({} bytes, {}); \
                 was it repacked?",
                t.name, loc.info.size, loc.info.ty
            ));
        }
        unaligned |= loc.file_offset % page() as u64 != 0 || slice % page() != 0;
        let il = t.layer as usize;
        if layers.len() <= il {
            layers.resize_with(il + 1, Vec::new);
        }
        layers[il].push(Projection {
            tensor: t.handle,
            slice_bytes: slice,
            shard: loc.shard,
            file_offset: loc.file_offset,
            repacker: repack.then(|| Repacker::new(t.type_id, t.ne[0], t.ne[1])).flatten().map(Arc::new),
            stored_repacked: false,
        });
    }
    let n_expert = n_expert.ok_or("no expert tensors were captured")?;
    Ok(Banks { layers, n_expert, unaligned })
}
