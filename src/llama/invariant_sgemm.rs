//! Fast batch-invariant dense matmuls: f16 and f32 weights in llamafile's
//! sgemm order at every width.
//!
//! In a batch-invariant context ggml's CPU backend runs in reference mode,
//! where every matmul takes `vec_dot`, column by column: invariant, but a
//! prompt's dense matmuls lose the sgemm's speed. The sgemm itself sums each
//! output cell in one order whatever tile holds it (one vector accumulator, a
//! fused multiply-add per vector, a horizontal sum), so a column gets the
//! same bits in every call of two columns or more; only a lone column, which
//! ggml gives to `vec_dot`, gets other bits (`bmoe kernels --pad 2` shows
//! both). `invariant_sgemm.cpp` is a CPU extra buffer type whose weights, in
//! a reference-mode backend, go through the sgemm from two columns and
//! through a matvec that sums each cell in the sgemm's order for one.
//!
//! The buffer holds the weights in their plain layout, so every other op, and
//! every matmul outside reference mode, reads them as from a CPU buffer.
//! Only x86-64 builds with llamafile's sgemm, FMA and F16C have it (on ARM
//! the sgemm's narrowest call is wider and its order another; there the
//! weights stay plain and take `vec_dot`).

use llama_cpp_sys_2 as sys;

use crate::gguf::{GgmlType, ModelFiles};

unsafe extern "C" {
    /// The invariant-sgemm buffer type, registered with the CPU backend on the
    /// first call; null where this build cannot have it.
    fn bmoe_invariant_sgemm_buffer_type() -> sys::ggml_backend_buffer_type_t;
}

/// The invariant-sgemm buffer type, when this build and CPU have it. Registers
/// it with the CPU backend on the first call; [`super::init`] makes that call
/// before anything computes.
pub(super) fn buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
    // SAFETY: takes no arguments; registration is once and internally
    // synchronized, and init calls it before any graph computes.
    let buft = unsafe { bmoe_invariant_sgemm_buffer_type() };
    (!buft.is_null()).then_some(buft)
}

/// Whether batch-invariant contexts on this build and CPU run dense f16 and
/// f32 matmuls in the sgemm's order at every width. `BMOE_INVARIANT_SGEMM=off`
/// in the environment turns it off (those weights then take `vec_dot`), to
/// measure what it gains.
pub fn available() -> bool {
    super::init();
    let off = std::env::var("BMOE_INVARIANT_SGEMM").is_ok_and(|v| v.trim() == "off");
    !off && buffer_type().is_some()
}

/// The tensors of `files` a batch-invariant run loads into the invariant-sgemm
/// buffer: two-dimensional f16 and f32 weights whose row count the sgemm's
/// tiles divide (a multiple of 4) and whose rows are whole vectors of 16
/// values, but the token embedding, which is only
/// looked up by rows.
pub fn invariant_weights(files: &ModelFiles) -> Vec<String> {
    files
        .tensors()
        .filter(|t| matches!(t.info.ty, GgmlType::F16 | GgmlType::F32))
        .filter(|t| t.info.dims.len() == 2 && t.info.dims[1] % 4 == 0 && t.info.dims[0] % 16 == 0 && t.info.dims[0] > 0)
        .filter(|t| t.info.name.ends_with(".weight") && t.info.name != "token_embd.weight")
        .map(|t| t.info.name.clone())
        .collect()
}

/// Regular expressions matching exactly `names`: the layers' tensors as one
/// alternation per name within a layer, every other name on its own.
pub fn name_patterns(names: &[String]) -> Vec<String> {
    let mut patterns = crate::moe::repack::name_patterns(names);
    for name in names.iter().filter(|n| !n.starts_with("blk.")) {
        patterns.push(format!("^{}$", crate::moe::repack::escape(name)));
    }
    patterns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exactly_the_names() {
        let names: Vec<String> =
            ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "output.weight"].iter().map(|s| s.to_string()).collect();
        let patterns: Vec<regex::Regex> = name_patterns(&names).iter().map(|p| regex::Regex::new(p).unwrap()).collect();
        let matched = |n: &str| patterns.iter().any(|p| p.is_match(n));
        for n in &names {
            assert!(matched(n), "{n}");
        }
        for n in
            ["blk.2.attn_q.weight", "blk.0.attn_k.weight", "output_norm.weight", "token_embd.weight", "xoutput.weight"]
        {
            assert!(!matched(n), "{n}");
        }
    }
}
