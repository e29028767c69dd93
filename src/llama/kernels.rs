//! Which of the linked llama.cpp's CPU matrix kernels give a column the same
//! bits whatever the width of the call. A batch-invariant run needs every
//! matmul a token takes to compute its column in an order that does not
//! depend on how many other columns (tokens of other sequences, other
//! tokens of its prompt chunk, other rows routed to its expert) share the
//! call; ggml picks its kernel by the width, the weight's type and buffer,
//! and build and environment switches, so this probes each choice directly:
//! one weight, the same random columns computed one at a time and then
//! together, compared bit for bit.
//!
//! A probe runs one real ggml graph on a CPU backend of its own (`bmoe
//! kernels` prints the table; docs/architecture.md, "Where batch invariance
//! comes from", says what it found).

use std::ffi::CStr;
use std::ptr::{NonNull, null_mut};

use llama_cpp_sys_2 as sys;
use rand::{Rng, SeedableRng};

/// How the probe lets ggml compute a matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFamily {
    /// The weight in a plain CPU buffer: ggml's per-type `vec_dot`, or
    /// whatever faster path the build and the environment enable for the
    /// width (llamafile's sgemm, the tiled K-quant matmul).
    Plain,
    /// The weight in the `CPU_REPACK` buffer, rows interleaved: the
    /// repacked `gemm` for groups of four columns, `gemv` for the rest.
    Repacked,
    /// The backend in reference mode (`ggml_backend_cpu_set_use_ref`):
    /// `vec_dot` only, no sgemm, no tiling.
    Reference,
    /// The backend in reference mode with an f16 or f32 dense weight in
    /// bmoe's invariant-sgemm buffer (`super::invariant_sgemm`): llamafile's
    /// sgemm from two columns, a matvec in its order for one. What a
    /// batch-invariant context runs for such weights.
    InvariantSgemm,
}

impl KernelFamily {
    /// Short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            KernelFamily::Plain => "plain",
            KernelFamily::Repacked => "repacked",
            KernelFamily::Reference => "reference",
            KernelFamily::InvariantSgemm => "sgemm-all",
        }
    }
}

/// Which operation a probe computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOp {
    /// A dense weight times the batch's columns (`ggml_mul_mat`).
    MulMat,
    /// An expert bank: every column routed to the same expert
    /// (`ggml_mul_mat_id`), so the width is the expert's row count.
    MulMatId,
}

/// One probe: a weight of `rows` x `k` of a type, computed by a family.
#[derive(Debug, Clone, Copy)]
pub struct ProbeCase {
    /// ggml type id of the weight.
    pub type_id: u32,
    /// Output rows (the weight's `ne[1]`).
    pub rows: i64,
    /// Inner dimension (the weight's `ne[0]`), a multiple of the type's block.
    pub k: i64,
    /// How ggml computes it.
    pub family: KernelFamily,
    /// Dense or expert matmul.
    pub op: ProbeOp,
    /// Compute threads.
    pub threads: i32,
    /// Columns a solo column is computed in: 1 computes it alone; more
    /// repeats it that many times in one call and keeps the first result
    /// (a lone column padded into a kernel that needs several).
    pub pad: i64,
}

/// What one width gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WidthOutcome {
    /// Columns in the call.
    pub width: i64,
    /// Columns whose result differs (in any bit) from the same column computed alone.
    pub differing_columns: usize,
}

/// The result of a probe over several widths.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Whether the weight really took the family's layout (a type with no
    /// repacked layout on this CPU stays plain in the repack buffer; the
    /// invariant sgemm takes only f16 and f32 dense weights, on x86-64 builds
    /// with llamafile's sgemm).
    pub layout_taken: bool,
    /// One outcome per width probed, in the order asked.
    pub widths: Vec<WidthOutcome>,
}

impl ProbeReport {
    /// The widths at which some column differed from its solo result.
    pub fn differing_widths(&self) -> Vec<i64> {
        self.widths.iter().filter(|w| w.differing_columns > 0).map(|w| w.width).collect()
    }
}

/// A ggml context (tensor metadata only), freed on drop.
struct GgmlContext(NonNull<sys::ggml_context>);

impl GgmlContext {
    fn new(tensors: usize) -> Result<GgmlContext, String> {
        // SAFETY: size queries with no arguments.
        let mem_size = unsafe { sys::ggml_tensor_overhead() * tensors + sys::ggml_graph_overhead() + 1024 };
        let params = sys::ggml_init_params { mem_size, mem_buffer: null_mut(), no_alloc: true };
        // SAFETY: ggml allocates its own metadata arena of mem_size bytes.
        NonNull::new(unsafe { sys::ggml_init(params) }).map(GgmlContext).ok_or_else(|| "ggml_init failed".into())
    }
}

impl Drop for GgmlContext {
    fn drop(&mut self) {
        // SAFETY: made by ggml_init, freed once; its buffers are freed first (declared later, dropped earlier).
        unsafe { sys::ggml_free(self.0.as_ptr()) };
    }
}

/// A backend buffer, freed on drop.
struct Buffer(NonNull<sys::ggml_backend_buffer>);

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated by ggml_backend_alloc_ctx_tensors*, freed once.
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) };
    }
}

/// A CPU backend of the probe's own, freed on drop.
struct Backend(NonNull<sys::ggml_backend>);

impl Drop for Backend {
    fn drop(&mut self) {
        // SAFETY: made by ggml_backend_cpu_init, freed once.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) };
    }
}

/// The weight of a probe, resident in its family's buffer.
struct Weight {
    tensor: *mut sys::ggml_tensor,
    _buffer: Buffer,
    _ctx: GgmlContext,
}

/// Experts in a probed bank (all columns route to the first).
const EXPERTS: i64 = 2;

/// Turns ggml's tiled K-quant matmul on or off for this process
/// (`GGML_CPU_TILED_MM`). ggml reads the switch once, at the process's
/// first matmul: call this before any model or probe computes.
pub fn choose_tiled_matmul(on: bool) {
    // SAFETY: called from the main thread before any matmul, the variable's
    // only reader (ggml's getenv, once); Rust's own readers take the
    // environment lock set_var takes.
    unsafe { std::env::set_var("GGML_CPU_TILED_MM", if on { "1" } else { "0" }) };
}

/// The type's name as ggml spells it.
pub fn type_name(type_id: u32) -> String {
    // SAFETY: ggml_type_name returns a static string (or "NONE") for any id.
    unsafe { CStr::from_ptr(sys::ggml_type_name(type_id)) }.to_string_lossy().into_owned()
}

fn random_values(count: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..count).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}

/// The case's weight, filled with random values in its type; `None` when
/// the family's layout does not exist for this type on this CPU.
fn make_weight(case: &ProbeCase) -> Result<Option<Weight>, String> {
    let (block, _) = super::ggml_type_geometry(case.type_id);
    if block == 0 || case.k % block as i64 != 0 {
        return Err(format!("k = {} is not a multiple of {}'s block", case.k, type_name(case.type_id)));
    }
    let float_type = matches!(case.type_id, sys::GGML_TYPE_F16 | sys::GGML_TYPE_F32);
    if case.family == KernelFamily::InvariantSgemm && (case.op != ProbeOp::MulMat || !float_type) {
        return Ok(None);
    }
    let ctx = GgmlContext::new(1)?;
    let planes = if case.op == ProbeOp::MulMatId { EXPERTS } else { 1 };
    // SAFETY: a metadata-only tensor in our context.
    let tensor = unsafe { sys::ggml_new_tensor_3d(ctx.0.as_ptr(), case.type_id, case.k, case.rows, planes) };
    if tensor.is_null() {
        return Err("ggml_new_tensor_3d failed".into());
    }
    let buft = match case.family {
        KernelFamily::Repacked => {
            super::repack::repack_buffer_type().ok_or("this CPU backend has no CPU_REPACK buffer")?
        }
        KernelFamily::InvariantSgemm => match super::invariant_sgemm::buffer_type() {
            Some(buft) => buft,
            None => return Ok(None),
        },
        // SAFETY: a static buffer type.
        _ => unsafe { sys::ggml_backend_cpu_buffer_type() },
    };
    // SAFETY: allocates every tensor of our context in one buffer of that type.
    let buffer = NonNull::new(unsafe { sys::ggml_backend_alloc_ctx_tensors_from_buft(ctx.0.as_ptr(), buft) })
        .map(Buffer)
        .ok_or("could not allocate the weight")?;
    // SAFETY: reads the tensor's `extra`, which the repack buffer's
    // init_tensor set to the layout's kernels (null: the type has none here).
    if case.family == KernelFamily::Repacked && unsafe { (*tensor).extra.is_null() } {
        return Ok(None);
    }
    let n = (case.k * case.rows * planes) as usize;
    let values = random_values(n, 0x5eed ^ u64::from(case.type_id));
    // SAFETY: the tensor's bytes as ggml sizes them.
    let bytes = unsafe { sys::ggml_nbytes(tensor) };
    let mut quantized = vec![0u8; bytes];
    // SAFETY: `values` holds rows * planes rows of k floats; `quantized` is
    // the tensor's byte size, which is what quantize_chunk writes for them.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            case.type_id,
            values.as_ptr(),
            quantized.as_mut_ptr().cast(),
            0,
            case.rows * planes,
            case.k,
            std::ptr::null(),
        )
    };
    if written != bytes {
        return Err(format!("quantizing to {} wrote {written} of {bytes} bytes", type_name(case.type_id)));
    }
    // SAFETY: the whole tensor, from a buffer of its size; the repack
    // buffer interleaves the rows as it copies them in.
    unsafe { sys::ggml_backend_tensor_set(tensor, quantized.as_ptr().cast(), 0, bytes) };
    Ok(Some(Weight { tensor, _buffer: buffer, _ctx: ctx }))
}

/// Computes the weight times `columns` (each `k` floats) in one call, and
/// returns each column's `rows` results.
fn compute(backend: &Backend, weight: &Weight, case: &ProbeCase, columns: &[f32]) -> Result<Vec<f32>, String> {
    let width = columns.len() as i64 / case.k;
    let ctx = GgmlContext::new(4)?;
    let c = ctx.0.as_ptr();
    // SAFETY: metadata-only tensors and ops in our context; every pointer
    // passed is one ggml just returned.
    let (input, ids, out) = unsafe {
        match case.op {
            ProbeOp::MulMat => {
                let x = sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_F32, case.k, width);
                (x, null_mut(), sys::ggml_mul_mat(c, weight.tensor, x))
            }
            ProbeOp::MulMatId => {
                let x = sys::ggml_new_tensor_3d(c, sys::GGML_TYPE_F32, case.k, 1, width);
                let ids = sys::ggml_new_tensor_2d(c, sys::GGML_TYPE_I32, 1, width);
                (x, ids, sys::ggml_mul_mat_id(c, weight.tensor, x, ids))
            }
        }
    };
    if out.is_null() {
        return Err("could not build the matmul".into());
    }
    // SAFETY: allocates our context's tensors (input, ids, output) in one CPU buffer.
    let _buffer = NonNull::new(unsafe { sys::ggml_backend_alloc_ctx_tensors(c, backend.0.as_ptr()) })
        .map(Buffer)
        .ok_or("could not allocate the probe's activations")?;
    // SAFETY: sizes match the tensors just allocated; the graph lives in our context.
    unsafe {
        sys::ggml_backend_tensor_set(input, columns.as_ptr().cast(), 0, std::mem::size_of_val(columns));
        if !ids.is_null() {
            let routes = vec![0i32; width as usize];
            sys::ggml_backend_tensor_set(ids, routes.as_ptr().cast(), 0, std::mem::size_of_val(routes.as_slice()));
        }
        let graph = sys::ggml_new_graph(c);
        sys::ggml_build_forward_expand(graph, out);
        let status = sys::ggml_backend_graph_compute(backend.0.as_ptr(), graph);
        if status != sys::GGML_STATUS_SUCCESS {
            return Err(format!("the graph failed (ggml status {status})"));
        }
        let mut result = vec![0f32; (case.rows * width) as usize];
        sys::ggml_backend_tensor_get(out, result.as_mut_ptr().cast(), 0, std::mem::size_of_val(result.as_slice()));
        Ok(result)
    }
}

/// A CPU backend of its own for the case: its threads, and reference mode
/// for the families that run in it.
fn backend_for(case: &ProbeCase) -> Result<Backend, String> {
    // SAFETY: a fresh CPU backend, ours alone.
    let backend = NonNull::new(unsafe { sys::ggml_backend_cpu_init() }).map(Backend).ok_or("no CPU backend")?;
    // SAFETY: setters on our own live backend.
    unsafe {
        sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), case.threads.max(1));
        let reference = matches!(case.family, KernelFamily::Reference | KernelFamily::InvariantSgemm);
        sys::ggml_backend_cpu_set_use_ref(backend.0.as_ptr(), reference);
    }
    Ok(backend)
}

/// Probes one case at each width: computes the widest call's columns one
/// at a time (each padded to `case.pad` copies of itself), then each width's
/// first columns together, and counts the columns whose bits differ from
/// their solo result.
pub fn probe(case: &ProbeCase, widths: &[i64]) -> Result<ProbeReport, String> {
    super::init();
    let widest = widths.iter().copied().max().unwrap_or(1).max(1);
    let Some(weight) = make_weight(case)? else {
        return Ok(ProbeReport { layout_taken: false, widths: Vec::new() });
    };
    let backend = backend_for(case)?;
    let k = case.k as usize;
    let rows = case.rows as usize;
    let columns = random_values(k * widest as usize, 0xc01 ^ case.k as u64);
    let mut solo = Vec::with_capacity(rows * widest as usize);
    let pad = case.pad.max(1) as usize;
    for col in columns.chunks(k) {
        let padded = col.repeat(pad);
        solo.extend_from_slice(&compute(&backend, &weight, case, &padded)?[..rows]);
    }
    let mut outcomes = Vec::with_capacity(widths.len());
    for &width in widths {
        let together = compute(&backend, &weight, case, &columns[..k * width as usize])?;
        let differing_columns = together
            .chunks(rows)
            .zip(solo.chunks(rows))
            .filter(|(a, b)| a.iter().zip(b.iter()).any(|(x, y)| x.to_bits() != y.to_bits()))
            .count();
        outcomes.push(WidthOutcome { width, differing_columns });
    }
    Ok(ProbeReport { layout_taken: true, widths: outcomes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(type_id: u32, family: KernelFamily, op: ProbeOp) -> ProbeCase {
        ProbeCase { type_id, rows: 64, k: 512, family, op, threads: 2, pad: 1 }
    }

    const WIDTHS: [i64; 6] = [1, 2, 3, 4, 8, 17];

    #[test]
    fn the_reference_kernels_are_column_invariant() {
        // vec_dot computes each column on its own: what a batch-invariant context runs.
        for type_id in [sys::GGML_TYPE_F32, sys::GGML_TYPE_F16, sys::GGML_TYPE_Q8_0, sys::GGML_TYPE_Q4_K] {
            for op in [ProbeOp::MulMat, ProbeOp::MulMatId] {
                let report = probe(&case(type_id, KernelFamily::Reference, op), &WIDTHS).unwrap();
                assert!(report.differing_widths().is_empty(), "{} {op:?}: {:?}", type_name(type_id), report.widths);
            }
        }
    }

    #[test]
    fn repacked_expert_banks_are_column_invariant() {
        // llama.cpp's repacked MUL_MAT_ID runs gemv row by row: a batch-invariant
        // context keeps the repacked banks of every type.
        for type_id in [sys::GGML_TYPE_Q4_0, sys::GGML_TYPE_Q4_K, sys::GGML_TYPE_IQ4_NL, sys::GGML_TYPE_MXFP4] {
            let report = probe(&case(type_id, KernelFamily::Repacked, ProbeOp::MulMatId), &WIDTHS).unwrap();
            assert!(report.differing_widths().is_empty(), "{}: {:?}", type_name(type_id), report.widths);
        }
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_probe_sees_the_kernels_that_depend_on_the_width() {
        // On x86-64 with AVX2, llama.cpp's repacked q4_K matmul takes its gemm for
        // four columns and its gemv for one, which sum in other orders; and
        // llamafile's sgemm (when built) takes f16 weights from two columns.
        // The probe must see both, or its "same bits" would prove nothing.
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let q4k = probe(&case(sys::GGML_TYPE_Q4_K, KernelFamily::Repacked, ProbeOp::MulMat), &WIDTHS).unwrap();
        assert!(q4k.layout_taken);
        assert_eq!(q4k.differing_widths(), vec![4, 8, 17], "{:?}", q4k.widths);
        if super::super::cpu_features().split(' ').any(|f| f == "LLAMAFILE") {
            let f16 = probe(&case(sys::GGML_TYPE_F16, KernelFamily::Plain, ProbeOp::MulMat), &WIDTHS).unwrap();
            assert_eq!(f16.differing_widths(), vec![2, 3, 4, 8, 17], "{:?}", f16.widths);
            // The sgemm sums every cell in one order whatever its tile: a lone
            // column padded to two gets the bits it has in any wider call.
            let padded = ProbeCase { pad: 2, ..case(sys::GGML_TYPE_F16, KernelFamily::Plain, ProbeOp::MulMat) };
            let f16 = probe(&padded, &WIDTHS).unwrap();
            assert_eq!(f16.differing_widths(), vec![1], "{:?}", f16.widths);
        }
    }

    #[test]
    fn the_invariant_sgemm_is_column_invariant() {
        // What a batch-invariant context runs for f16 and f32 dense weights:
        // the sgemm from two columns, a matvec in its order for one.
        if !super::super::invariant_sgemm::available() {
            return;
        }
        for type_id in [sys::GGML_TYPE_F16, sys::GGML_TYPE_F32] {
            let report = probe(&case(type_id, KernelFamily::InvariantSgemm, ProbeOp::MulMat), &WIDTHS).unwrap();
            assert!(report.layout_taken, "{}", type_name(type_id));
            assert!(report.differing_widths().is_empty(), "{}: {:?}", type_name(type_id), report.widths);
        }
        // Other types and expert banks stay with the reference kernels.
        let q8 = probe(&case(sys::GGML_TYPE_Q8_0, KernelFamily::InvariantSgemm, ProbeOp::MulMat), &WIDTHS).unwrap();
        assert!(!q8.layout_taken);
    }

    #[test]
    fn the_invariant_sgemm_gives_a_lone_column_the_sgemms_bits() {
        // Invariant is not enough: vec_dot is too. The family must really
        // take the sgemm's order (the plain family's bits from two columns),
        // for one column as well, whatever the thread count.
        if !super::super::invariant_sgemm::available() {
            return;
        }
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let run = |family: KernelFamily, threads: i32, columns: &[f32]| {
            let c = ProbeCase { threads, ..case(sys::GGML_TYPE_F16, family, ProbeOp::MulMat) };
            let weight = make_weight(&c).unwrap().unwrap();
            bits(compute(&backend_for(&c).unwrap(), &weight, &c, columns).unwrap())
        };
        let columns = random_values(512 * 3, 7);
        assert_eq!(run(KernelFamily::InvariantSgemm, 2, &columns), run(KernelFamily::Plain, 2, &columns));
        let lone = &columns[..512];
        let alone = run(KernelFamily::InvariantSgemm, 2, lone);
        assert_ne!(alone, run(KernelFamily::Reference, 2, lone));
        assert_eq!(alone, run(KernelFamily::Plain, 2, &columns[..1024])[..64]);
        assert_eq!(alone, run(KernelFamily::InvariantSgemm, 1, lone));
        assert_eq!(run(KernelFamily::InvariantSgemm, 3, &columns), run(KernelFamily::InvariantSgemm, 1, &columns));
    }

    #[test]
    fn a_type_without_a_repacked_layout_is_reported_not_probed() {
        let report = probe(&case(sys::GGML_TYPE_F16, KernelFamily::Repacked, ProbeOp::MulMat), &WIDTHS).unwrap();
        assert!(!report.layout_taken);
        assert!(report.widths.is_empty());
    }
}
