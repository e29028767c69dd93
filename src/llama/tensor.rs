//! Views of ggml graph nodes inside the eval callback, and handles to model
//! weight tensors whose data pointer the engine rebinds.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use super::memory::Region;

/// A graph node as seen by the eval callback; valid only during the call.
#[derive(Clone, Copy)]
pub struct Tensor<'a> {
    raw: *mut sys::ggml_tensor,
    _call: PhantomData<&'a sys::ggml_tensor>,
}

impl<'a> Tensor<'a> {
    /// Wraps a node pointer the scheduler passed to the callback.
    ///
    /// # Safety
    /// `raw` must point to a live `ggml_tensor` for `'a`.
    pub(super) unsafe fn from_raw(raw: *mut sys::ggml_tensor) -> Tensor<'a> {
        Tensor { raw, _call: PhantomData }
    }

    fn t(&self) -> &'a sys::ggml_tensor {
        // SAFETY: from_raw's contract: the node is live for 'a.
        unsafe { &*self.raw }
    }

    /// The node's name (empty if not UTF-8).
    pub fn name(&self) -> &'a str {
        let t = self.t();
        // SAFETY: ggml keeps names NUL-terminated inside the fixed 64-byte array.
        unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_str().unwrap_or("")
    }

    /// Elements per dimension.
    pub fn ne(&self) -> [i64; 4] {
        self.t().ne
    }

    /// Byte strides per dimension.
    pub fn nb(&self) -> [usize; 4] {
        self.t().nb
    }

    /// ggml type id.
    pub fn type_id(&self) -> u32 {
        self.t().type_
    }

    /// True when the node is an expert matmul (`GGML_OP_MUL_MAT_ID`).
    pub fn is_mul_mat_id(&self) -> bool {
        self.t().op == sys::GGML_OP_MUL_MAT_ID
    }

    /// True when the node multiplies element-wise (`GGML_OP_MUL`), as a norm's weight does.
    pub fn is_mul(&self) -> bool {
        self.t().op == sys::GGML_OP_MUL
    }

    /// True when the node multiplies by a constant (`GGML_OP_SCALE`).
    pub fn is_scale(&self) -> bool {
        self.t().op == sys::GGML_OP_SCALE
    }

    /// True when the node is an RMS norm (`GGML_OP_RMS_NORM`).
    pub fn is_rms_norm(&self) -> bool {
        self.t().op == sys::GGML_OP_RMS_NORM
    }

    /// True when the node is a leaf holding data (no operation).
    pub fn is_leaf(&self) -> bool {
        self.t().op == sys::GGML_OP_NONE
    }

    /// True when the tensor's bytes are in this process's memory: not in
    /// a buffer of an RPC server (a layer held on another machine).
    pub fn is_host(&self) -> bool {
        let buffer = self.t().buffer;
        // SAFETY: a tensor's buffer, when set, lives as long as the graph or model it belongs to.
        buffer.is_null() || unsafe { sys::ggml_backend_buffer_is_host(buffer) }
    }

    /// The node's `i`-th source, if any.
    pub fn src(&self, i: usize) -> Option<Tensor<'a>> {
        let p = *self.t().src.get(i)?;
        // SAFETY: a non-null source of a live node is a live node of the same graph.
        (!p.is_null()).then(|| unsafe { Tensor::from_raw(p) })
    }

    /// All sources.
    pub fn srcs(&self) -> impl Iterator<Item = Tensor<'a>> + 'a {
        let me = *self;
        (0..me.t().src.len()).filter_map(move |i| me.src(i))
    }

    /// Bytes spanned by the node's data (views included).
    pub fn nbytes(&self) -> usize {
        // SAFETY: pure computation over the live node's shape.
        unsafe { sys::ggml_nbytes(self.raw) }
    }

    fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        let data = self.t().data as *const u8;
        if data.is_null() || offset.checked_add(N)? > self.nbytes() {
            return None;
        }
        let mut out = [0u8; N];
        // SAFETY: the node was computed before the non-ask callback, its data
        // spans nbytes() bytes and the range is inside it (checked above).
        unsafe { std::ptr::copy_nonoverlapping(data.add(offset), out.as_mut_ptr(), N) };
        Some(out)
    }

    /// The i32 at byte `offset` of the node's data (None if out of bounds).
    pub fn read_i32(&self, offset: usize) -> Option<i32> {
        self.read::<4>(offset).map(i32::from_ne_bytes)
    }

    /// The f32 at byte `offset` of the node's data (None if out of bounds).
    pub fn read_f32(&self, offset: usize) -> Option<f32> {
        self.read::<4>(offset).map(f32::from_ne_bytes)
    }

    fn write<const N: usize>(&self, offset: usize, bytes: [u8; N]) -> bool {
        let data = self.t().data as *mut u8;
        if data.is_null() || offset.checked_add(N).is_none_or(|end| end > self.nbytes()) {
            return false;
        }
        // SAFETY: in bounds of the node's data (checked above). The node was
        // computed and its consumers have not run yet (we are inside the
        // non-ask callback), so no one else reads or writes it now.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), data.add(offset), N) };
        true
    }

    /// Overwrites the i32 at byte `offset` (false if out of bounds).
    pub fn write_i32(&self, offset: usize, value: i32) -> bool {
        self.write(offset, value.to_ne_bytes())
    }

    /// Overwrites the f32 at byte `offset` (false if out of bounds).
    pub fn write_f32(&self, offset: usize, value: f32) -> bool {
        self.write(offset, value.to_ne_bytes())
    }

    /// The first node named `name` among this node's sources, searched
    /// breadth-first up to `depth` levels.
    pub fn find_source(&self, name: &str, depth: usize) -> Option<Tensor<'a>> {
        let mut level = vec![*self];
        for _ in 0..depth {
            let mut next = Vec::new();
            for n in level {
                for s in n.srcs() {
                    if s.name() == name {
                        return Some(s);
                    }
                    next.push(s);
                }
            }
            level = next;
        }
        None
    }

    /// A handle that outlives the callback. Only meaningful for model
    /// weights, which live as long as the model.
    pub fn handle(&self) -> TensorHandle {
        TensorHandle(self.raw)
    }
}

/// A model weight tensor remembered across calls (captured during warm-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TensorHandle(*mut sys::ggml_tensor);

// SAFETY: the handle is an address; it is only dereferenced on the eval
// thread or between decodes, while the model is alive.
unsafe impl Send for TensorHandle {}
// SAFETY: see Send.
unsafe impl Sync for TensorHandle {}

impl TensorHandle {
    /// Bytes of the tensor's data.
    pub fn nbytes(&self) -> usize {
        // SAFETY: weight tensors live as long as the model that owns them.
        unsafe { sys::ggml_nbytes(self.0) }
    }

    /// Elements per dimension.
    pub fn ne(&self) -> [i64; 4] {
        // SAFETY: weight tensors live as long as the model that owns them.
        unsafe { (*self.0).ne }
    }

    /// The tensor's name.
    pub fn name(&self) -> String {
        // SAFETY: weight tensors live as long as the model; the name is a
        // NUL-terminated array inside the tensor.
        let name = unsafe { std::ffi::CStr::from_ptr((*self.0).name.as_ptr()) };
        name.to_string_lossy().into_owned()
    }

    /// Copies the tensor's bytes to the start of `region`.
    pub fn copy_into(&self, region: &Region) -> std::io::Result<()> {
        let len = self.nbytes();
        // SAFETY: a live weight's data pointer is valid for nbytes() bytes
        // (llama.cpp's mapping of the file or its own buffer), read-only here,
        // between decodes.
        let bytes = unsafe { std::slice::from_raw_parts((*self.0).data as *const u8, len) };
        region.write(0, bytes)
    }

    /// Touches every page of the tensor's bytes so they are resident
    /// (faulting them in from the file where they are not). Returns the
    /// bytes touched.
    pub fn prefault(&self) -> usize {
        let len = self.nbytes();
        // SAFETY: as in copy_into: valid for len bytes, only read.
        let base = unsafe { (*self.0).data as *const u8 };
        let mut sum = 0u8;
        for off in (0..len).step_by(super::memory::page()) {
            // SAFETY: off < len; a volatile read so the touch is not optimised away.
            sum = sum.wrapping_add(unsafe { std::ptr::read_volatile(base.add(off)) });
        }
        std::hint::black_box(sum);
        len
    }

    /// The tensor's values as f32, row after row (`ne[0]` values per row,
    /// `ne[1]` rows), converted by ggml's own routine for its type. For
    /// 1-D and 2-D weights only.
    pub fn to_f32(&self) -> Result<Vec<f32>, String> {
        // SAFETY: a live weight tensor (see nbytes).
        let t = unsafe { &*self.0 };
        if t.ne[2] != 1 || t.ne[3] != 1 || t.ne[0] <= 0 || t.ne[1] <= 0 {
            return Err(format!("{}: only 1-D and 2-D weights convert (shape {:?})", self.name(), t.ne));
        }
        let (cols, rows) = (t.ne[0] as usize, t.ne[1] as usize);
        let mut out = vec![0f32; cols * rows];
        if t.type_ == sys::GGML_TYPE_F32 {
            for r in 0..rows {
                // SAFETY: row r of an f32 tensor holds `cols` f32 values at r * nb[1]
                // inside its data; copied bytewise, so alignment does not matter.
                unsafe {
                    let src = (t.data as *const u8).add(r * t.nb[1]);
                    std::ptr::copy_nonoverlapping(src, out.as_mut_ptr().add(r * cols).cast::<u8>(), cols * 4);
                }
            }
            return Ok(out);
        }
        // SAFETY: ggml returns static traits for any valid type id.
        let traits = unsafe { sys::ggml_get_type_traits(t.type_) };
        // SAFETY: non-null pointers to static data, checked before use.
        let Some(to_float) = (!traits.is_null()).then(|| unsafe { (*traits).to_float }).flatten() else {
            return Err(format!("{}: ggml cannot convert its type to f32", self.name()));
        };
        for r in 0..rows {
            // SAFETY: row r starts r * nb[1] bytes into the tensor's data, which
            // is valid for nbytes() bytes; `out` has room for `cols` values there.
            unsafe {
                let src = (t.data as *const u8).add(r * t.nb[1]);
                to_float(src.cast(), out.as_mut_ptr().add(r * cols), cols as i64);
            }
        }
        Ok(out)
    }

    /// A scorer of this weight's rows against a vector with ggml's CPU dot
    /// product for its type, checked and looked up once: the weight must be
    /// 2-D, of a type ggml's CPU backend has a dot product for, with rows a
    /// whole number of the type's blocks.
    pub fn row_scorer(&self) -> Result<RowScorer, String> {
        // SAFETY: a live weight tensor (see nbytes).
        let t = unsafe { &*self.0 };
        if t.ne[2] != 1 || t.ne[3] != 1 || t.ne[0] <= 0 || t.ne[1] <= 0 {
            return Err(format!("{}: only 2-D weights score rows (shape {:?})", self.name(), t.ne));
        }
        let kernel = DotKernel::of(t.type_).ok_or_else(|| {
            format!("{}: ggml's CPU backend has no dot product for its type ({})", self.name(), t.type_)
        })?;
        // SAFETY: plain queries of ggml's static type table.
        let (block, dot_block) = unsafe { (sys::ggml_blck_size(t.type_), sys::ggml_blck_size(kernel.takes)) };
        if block <= 0 || dot_block <= 0 || t.ne[0] % block != 0 || t.ne[0] % dot_block != 0 {
            return Err(format!("{}: rows of {} values are not whole blocks of its type", self.name(), t.ne[0]));
        }
        let (cols, rows) = (t.ne[0] as usize, t.ne[1] as usize);
        // SAFETY: a pure size computation.
        let converted_bytes = unsafe { sys::ggml_row_size(kernel.takes, cols as i64) };
        Ok(RowScorer { weight: *self, kernel, cols, rows, row_stride: t.nb[1], converted_bytes })
    }

    /// Points the tensor's data at `offset` bytes into `region` (which must
    /// hold `nbytes()` from there), keeping the region alive; with a
    /// `repacker`, also marks the tensor as repacked, so its matrix products
    /// read the region as the repacker writes it. The returned binding
    /// restores the original pointer (and marks) when dropped.
    pub fn bind(
        self,
        region: Arc<Region>,
        offset: usize,
        repacker: Option<&super::Repacker>,
    ) -> Result<TensorBinding, String> {
        let need = self.nbytes();
        if offset.checked_add(need).is_none_or(|end| end > region.len()) {
            return Err(format!(
                "region of {} bytes cannot hold the tensor ({need} bytes) at offset {offset}",
                region.len()
            ));
        }
        if let Some(r) = repacker {
            let ne = self.ne();
            let slice = if ne[2] > 0 { need / ne[2] as usize } else { 0 };
            if slice != r.slice_bytes() {
                return Err(format!(
                    "{}: slices of {slice} bytes, the repacker's are {} bytes",
                    self.name(),
                    r.slice_bytes()
                ));
            }
        }
        // SAFETY: the tensor is a live model weight; no graph is computing
        // while bindings change (called between decodes), and the region
        // stays alive for as long as the binding exists. The repack marks
        // are a process-wide buffer and ggml's static kernel traits.
        let (original, marks) = unsafe {
            let t = &mut *self.0;
            let marks = (t.buffer, t.extra);
            if let Some(r) = repacker {
                (t.buffer, t.extra) = r.marks();
            }
            (std::mem::replace(&mut t.data, region.base_ptr().add(offset).cast()), marks)
        };
        Ok(TensorBinding { tensor: self, original, marks, _region: region })
    }
}

/// A weight tensor rebound to engine memory; dropping it restores the
/// tensor's own data pointer (and its buffer, when it was marked repacked).
pub struct TensorBinding {
    tensor: TensorHandle,
    original: *mut std::ffi::c_void,
    marks: (sys::ggml_backend_buffer_t, *mut std::ffi::c_void),
    _region: Arc<Region>,
}

// SAFETY: holds only addresses, used under the same rules as TensorHandle.
unsafe impl Send for TensorBinding {}

impl TensorBinding {
    /// Drops this process's mapping of the tensor's own bytes (llama.cpp's
    /// memory map of the file), so they stop counting towards the resident
    /// set. They are only read again if the binding is dropped, in which
    /// case the kernel pages them back in from the file. Returns the bytes
    /// released.
    pub fn release_original_pages(&self) -> std::io::Result<usize> {
        let len = self.tensor.nbytes();
        let Some((start, whole)) = super::memory::whole_pages_in(super::memory::page(), self.original as usize, len)
        else {
            return Ok(0);
        };
        // SAFETY: [start, start + whole) lies inside the tensor's bytes in llama.cpp's
        // read-only file mapping, which nothing reads while the tensor is
        // rebound; MADV_DONTNEED on a file mapping only drops page-table
        // entries, and a later access re-reads the file.
        let rc = unsafe { libc::madvise(start as *mut libc::c_void, whole, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(whole)
    }
}

impl Drop for TensorBinding {
    fn drop(&mut self) {
        // SAFETY: the binding is dropped while the model is alive (the hook
        // that owns it is dropped before the model), between decodes.
        unsafe {
            let t = &mut *self.tensor.0;
            t.data = self.original;
            (t.buffer, t.extra) = self.marks;
        }
    }
}

/// Scores a 2-D weight's rows against a vector ([`TensorHandle::row_scorer`]).
#[derive(Debug, Clone, Copy)]
pub struct RowScorer {
    weight: TensorHandle,
    kernel: DotKernel,
    cols: usize,
    rows: usize,
    row_stride: usize,
    converted_bytes: usize,
}

impl RowScorer {
    /// Values per row (the length `dot_rows` takes).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `out[r]` = row r · x for every row, the arithmetic of ggml's own
    /// matrix products: x is first converted to the type the dot product
    /// takes (kept in `scratch`). Reads the weight's data pointer at each
    /// call, so it follows a rebinding; call it only while no graph
    /// computes. Err when x is not one row long.
    pub fn dot_rows(&self, x: &[f32], scratch: &mut Vec<u8>, out: &mut Vec<f32>) -> Result<(), String> {
        let cols = self.cols;
        if x.len() != cols {
            return Err(format!("{}: {} values against rows of {cols}", self.weight.name(), x.len()));
        }
        scratch.clear();
        match self.kernel.convert {
            Some(convert) => {
                scratch.resize(self.converted_bytes, 0);
                // SAFETY: `scratch` holds exactly one converted row of `cols`
                // values (ggml_row_size) and `x` has `cols`, whole blocks.
                unsafe { convert(x.as_ptr(), scratch.as_mut_ptr().cast(), cols as i64) }
            }
            // An f32 dot product takes f32 values as they are (DotKernel::of).
            None => scratch.extend(x.iter().flat_map(|v| v.to_ne_bytes())),
        }
        // SAFETY: the weight lives as long as the model (see nbytes).
        let data = unsafe { (*self.weight.0).data as *const u8 };
        out.clear();
        out.resize(self.rows, 0.0);
        for (r, score) in out.iter_mut().enumerate() {
            // SAFETY: row r starts r * nb[1] bytes into the weight's live data
            // and holds `cols` values of its type (checked in row_scorer);
            // `scratch` holds x in the type the kernel takes; one result goes
            // to `score`. ggml's kernels read unaligned data.
            unsafe {
                let row = data.add(r * self.row_stride);
                (self.kernel.dot)(cols as i32, score, 0, row.cast(), 0, scratch.as_ptr().cast(), 0, 1);
            }
        }
        Ok(())
    }
}

/// ggml's CPU dot product for one weight type.
#[derive(Debug, Clone, Copy)]
struct DotKernel {
    dot:
        unsafe extern "C" fn(i32, *mut f32, usize, *const std::ffi::c_void, usize, *const std::ffi::c_void, usize, i32),
    /// The type its second operand takes.
    takes: sys::ggml_type,
    /// Converts f32 values to `takes` (none when `takes` is f32 itself).
    convert: sys::ggml_from_float_t,
}

impl DotKernel {
    /// The kernel for weights of type `ty`, if ggml's CPU backend has one
    /// and can convert f32 values to what it takes.
    fn of(ty: sys::ggml_type) -> Option<DotKernel> {
        // SAFETY: ggml returns static traits (or null) for any type id.
        let traits = unsafe { sys::ggml_get_type_traits_cpu(ty).as_ref()? };
        let (dot, takes) = (traits.vec_dot?, traits.vec_dot_type);
        let convert = match takes {
            sys::GGML_TYPE_F32 => None,
            // SAFETY: as above, for the type the kernel takes.
            _ => Some(unsafe { sys::ggml_get_type_traits_cpu(takes).as_ref()? }.from_float?),
        };
        Some(DotKernel { dot, takes, convert })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ggml context that frees itself.
    struct Context(*mut sys::ggml_context);

    impl Context {
        fn new() -> Context {
            // SAFETY: ggml allocates and owns the context's memory.
            let ctx = unsafe {
                sys::ggml_cpu_init();
                sys::ggml_init(sys::ggml_init_params {
                    mem_size: 4 << 20,
                    mem_buffer: std::ptr::null_mut(),
                    no_alloc: false,
                })
            };
            assert!(!ctx.is_null());
            Context(ctx)
        }

        /// A `cols` x `rows` weight of type `ty` holding `values` (quantized by ggml).
        fn weight(&self, ty: sys::ggml_type, cols: usize, rows: usize, values: &[f32]) -> TensorHandle {
            // SAFETY: the context has room; the tensor's data holds `rows` rows
            // of `cols` values of `ty`, which the quantizer fills.
            unsafe {
                let t = sys::ggml_new_tensor_2d(self.0, ty, cols as i64, rows as i64);
                sys::ggml_quantize_chunk(ty, values.as_ptr(), (*t).data, 0, rows as i64, cols as i64, std::ptr::null());
                TensorHandle(t)
            }
        }
    }

    impl Drop for Context {
        fn drop(&mut self) {
            // SAFETY: created by ggml_init, freed once.
            unsafe { sys::ggml_free(self.0) }
        }
    }

    #[test]
    fn dot_rows_scores_each_row_like_the_converted_weights() {
        let ctx = Context::new();
        let (cols, rows) = (256, 5);
        let values: Vec<f32> = (0..cols * rows).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.11).cos()).collect();
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        for ty in
            [sys::GGML_TYPE_F32, sys::GGML_TYPE_F16, sys::GGML_TYPE_BF16, sys::GGML_TYPE_Q8_0, sys::GGML_TYPE_Q4_0]
        {
            let w = ctx.weight(ty, cols, rows, &values);
            w.row_scorer().unwrap().dot_rows(&x, &mut scratch, &mut out).unwrap();
            assert_eq!(out.len(), rows);
            // Against the weight as ggml reads it back, in f64: only the
            // rounding of x to the kernel's input type may differ.
            let back = w.to_f32().unwrap();
            for (r, got) in out.iter().enumerate() {
                let want: f64 =
                    back[r * cols..][..cols].iter().zip(&x).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                assert!(
                    (f64::from(*got) - want).abs() < 0.05 + want.abs() * 0.01,
                    "type {ty} row {r}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn dot_rows_refuses_what_it_cannot_score() {
        let ctx = Context::new();
        let (mut scratch, mut out) = (Vec::new(), Vec::new());
        // f32 rows may have any length...
        let w = ctx.weight(sys::GGML_TYPE_F32, 40, 2, &[0.5; 80]).row_scorer().unwrap();
        assert!(w.dot_rows(&[1.0; 40], &mut scratch, &mut out).is_ok());
        assert_eq!(out, [20.0, 20.0]);
        // ...q8_0 rows must be whole blocks of 32 values.
        // SAFETY: the context has room; the data is never read.
        let odd = unsafe { TensorHandle(sys::ggml_new_tensor_2d(ctx.0, sys::GGML_TYPE_Q8_0, 40, 2)) };
        assert!(odd.row_scorer().unwrap_err().contains("whole blocks"));
        // A vector of the wrong length.
        assert!(w.dot_rows(&[1.0; 39], &mut scratch, &mut out).unwrap_err().contains("39 values"));
        // A 3-D weight.
        // SAFETY: as above.
        let cube = unsafe { TensorHandle(sys::ggml_new_tensor_3d(ctx.0, sys::GGML_TYPE_F32, 8, 2, 2)) };
        assert!(cube.row_scorer().unwrap_err().contains("2-D"));
    }

    /// Shows `nodes` (ggml graph nodes) to a capturing hook, in order.
    fn capture(nodes: &[*mut sys::ggml_tensor]) -> crate::moe::MoeHook {
        let mut hook = crate::moe::MoeHook::new(Arc::new(std::sync::atomic::AtomicBool::new(false)));
        for &node in nodes {
            // SAFETY: the nodes live in a ggml context the caller keeps alive.
            assert!(!crate::llama::EvalHook::ask(&mut hook, unsafe { Tensor::from_raw(node) }));
        }
        hook
    }

    /// Capture's half of the capability check, on a real ggml graph: an
    /// expert matmul of layer 0 without llama.cpp's `ffn_moe_topk-0` node is
    /// refused with the tensor and node named; with the node it passes.
    #[test]
    fn a_layer_multiplying_experts_without_a_topk_node_is_refused() {
        let name = |t: *mut sys::ggml_tensor, n: &str| {
            let n = std::ffi::CString::new(n).unwrap();
            // SAFETY: `t` is a live tensor; ggml copies the name.
            unsafe { sys::ggml_set_name(t, n.as_ptr()) };
        };
        // SAFETY: a context with room for a few tensor headers (no data); freed below.
        unsafe {
            sys::ggml_cpu_init();
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: 1 << 20,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            assert!(!ctx.is_null());
            let experts = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, 16, 8, 4);
            name(experts, "blk.0.ffn_up_exps.weight");
            let x = sys::ggml_new_tensor_3d(ctx, sys::GGML_TYPE_F32, 16, 2, 1);
            let ids = sys::ggml_new_tensor_2d(ctx, sys::GGML_TYPE_I32, 2, 1);
            let matmul = sys::ggml_mul_mat_id(ctx, experts, x, ids);
            name(matmul, "ffn_moe_up-0");
            let gap = capture(&[ids, matmul]).routing_gap().expect("a layer without a topk node streams");
            assert!(gap.contains("blk.0.ffn_up_exps.weight") && gap.contains("ffn_moe_topk-0"), "{gap}");
            name(ids, "ffn_moe_topk-0");
            assert_eq!(capture(&[ids, matmul]).routing_gap(), None);
            let none = capture(&[ids]).routing_gap().expect("a graph without expert matmuls streams");
            assert!(none.contains("no expert tensor"), "{none}");
            sys::ggml_free(ctx);
        }
    }
}
