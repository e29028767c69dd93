//! Weight repacking for the CPU's matrix kernels. llama.cpp's CPU backend
//! can keep a quantized weight with its rows interleaved in groups (q4_0,
//! q4_K, iq4_nl, mxfp4 in 8s with AVX2, q2_K with AVX-512; on ARM more
//! types in 4s or 8s by dotprod and i8mm: [`super::cpu_layouts`]), which its faster
//! `gemv`/`gemm` kernels read; such a weight lives in the backend's
//! `CPU_REPACK` buffer type, whose `set_tensor` does the interleaving.
//!
//! A streamed expert bank cannot live in such a buffer (llama.cpp would load
//! and keep the whole bank), so bmoe repacks each expert slice itself as it
//! lands in the cache, through the same `set_tensor` on a one-slice tensor
//! that points at the destination, and marks the bank tensor as a repacked
//! one (its buffer and kernel traits), exactly as llama.cpp marks a bank it
//! loads resident. The bytes and the kernels are then the same either way.

use std::ffi::CStr;
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;

/// The process's handle on the `CPU_REPACK` buffer type: one small buffer of
/// that type, never freed, that repacked tensors name as theirs.
struct RepackBuffer(sys::ggml_backend_buffer_t);

// SAFETY: the buffer is created once and never freed or mutated after;
// ggml only reads its type and interface through it.
unsafe impl Send for RepackBuffer {}
// SAFETY: see Send.
unsafe impl Sync for RepackBuffer {}

static REPACK_BUFFER: OnceLock<Option<RepackBuffer>> = OnceLock::new();

/// Name of the CPU backend's repacking buffer type.
const REPACK_BUFT: &CStr = c"CPU_REPACK";

/// The `CPU_REPACK` buffer type, when the linked CPU backend has one.
pub(super) fn repack_buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
    super::init();
    // SAFETY: registry lookups on the initialized backend; the returned list
    // is a static, NULL-terminated array owned by the CPU backend.
    unsafe {
        let reg = sys::ggml_backend_reg_by_name(c"CPU".as_ptr());
        if reg.is_null() {
            return None;
        }
        let dev = sys::ggml_backend_reg_dev_get(reg, 0);
        let f = sys::ggml_backend_reg_get_proc_address(reg, c"ggml_backend_dev_get_extra_bufts".as_ptr());
        if dev.is_null() || f.is_null() {
            return None;
        }
        let get: sys::ggml_backend_dev_get_extra_bufts_t = std::mem::transmute(f);
        let mut list = get?(dev);
        while !list.is_null() && !(*list).is_null() {
            if CStr::from_ptr(sys::ggml_backend_buft_name(*list)) == REPACK_BUFT {
                return Some(*list);
            }
            list = list.add(1);
        }
        None
    }
}

fn repack_buffer() -> Option<sys::ggml_backend_buffer_t> {
    REPACK_BUFFER
        .get_or_init(|| {
            let buft = repack_buffer_type()?;
            // SAFETY: allocates a small buffer of the repack type; llama.cpp's
            // own weight buffers carry the WEIGHTS usage, so this one does too.
            unsafe {
                let buf = sys::ggml_backend_buft_alloc_buffer(buft, 64);
                if buf.is_null() {
                    return None;
                }
                sys::ggml_backend_buffer_set_usage(buf, sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
                Some(RepackBuffer(buf))
            }
        })
        .as_ref()
        .map(|b| b.0)
}

/// Repacks one expert slice of a bank (`ne0` x `ne1` of one type) into the
/// layout the CPU's repacked kernels read; the same number of bytes.
pub struct Repacker {
    /// A one-slice tensor of the repack buffer type, with its kernel traits
    /// set; each call copies it and points the copy at the destination.
    template: sys::ggml_tensor,
    slice_bytes: usize,
}

// SAFETY: the template is only read (copied) after construction; the
// pointers it holds (buffer, traits) are process-wide statics of ggml.
unsafe impl Send for Repacker {}
// SAFETY: see Send.
unsafe impl Sync for Repacker {}

impl Repacker {
    /// The repacker for slices of `ne0` x `ne1` values of ggml type
    /// `type_id`, or `None` when the CPU backend has no repacked kernel
    /// for them.
    pub fn new(type_id: u32, ne0: i64, ne1: i64) -> Option<Repacker> {
        // ggml aborts on a shape that is not whole blocks: refuse it first.
        if type_id >= sys::GGML_TYPE_COUNT || ne0 <= 0 || ne1 <= 0 {
            return None;
        }
        // SAFETY: a table lookup for a valid type id (checked above).
        let block = unsafe { sys::ggml_blck_size(type_id) };
        if block <= 0 || ne0 % block != 0 {
            return None;
        }
        let buf = repack_buffer()?;
        // SAFETY: a metadata-only ggml context sized for one tensor; the
        // tensor struct is copied out before the context is freed. The
        // repack buffer's init_tensor only picks the kernel traits from the
        // type and shape (`extra`), touching no memory.
        unsafe {
            let ctx = sys::ggml_init(sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead(),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            });
            if ctx.is_null() {
                return None;
            }
            let t = sys::ggml_new_tensor_2d(ctx, type_id, ne0, ne1);
            let template = if t.is_null() {
                None
            } else {
                let mut template = *t;
                template.buffer = buf;
                let ok = sys::ggml_backend_buffer_init_tensor(buf, &mut template) == sys::GGML_STATUS_SUCCESS;
                (ok && !template.extra.is_null() && ne0 % 8 == 0).then_some(template)
            };
            sys::ggml_free(ctx);
            let template = template?;
            let slice_bytes = sys::ggml_nbytes(&template);
            Some(Repacker { template, slice_bytes })
        }
    }

    /// Bytes of one slice, before and after.
    pub fn slice_bytes(&self) -> usize {
        self.slice_bytes
    }

    /// Writes `src` (one slice in the file's layout) into `dst` repacked.
    pub fn repack(&self, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
        if src.len() != self.slice_bytes || dst.len() != self.slice_bytes {
            return Err(format!(
                "repacking a slice of {} bytes into {} bytes; a slice has {}",
                src.len(),
                dst.len(),
                self.slice_bytes
            ));
        }
        let mut t = self.template;
        t.data = dst.as_mut_ptr().cast();
        // SAFETY: `t` is a one-slice tensor of the repack buffer type whose
        // data is `dst` (exactly its size, checked); set_tensor reads `src`
        // (the same size) and writes the interleaved blocks into `dst`. Its
        // preconditions (whole rows in groups of 8, offset 0, full size)
        // were checked when the repacker was made.
        unsafe { sys::ggml_backend_tensor_set(&mut t, src.as_ptr().cast(), 0, src.len()) };
        Ok(())
    }

    /// The buffer and kernel traits that make a bank tensor of this shape
    /// compute with the repacked kernels.
    pub(super) fn marks(&self) -> (sys::ggml_backend_buffer_t, *mut std::ffi::c_void) {
        (self.template.buffer, self.template.extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q4_0: u32 = 2;
    const F32: u32 = 0;

    #[test]
    fn a_repacked_slice_differs_from_the_file_layout_and_keeps_its_size() {
        let Some(r) = Repacker::new(Q4_0, 64, 16) else {
            // No repacked q4_0 kernel on this CPU (needs AVX2 or SVE).
            return;
        };
        assert_eq!(r.slice_bytes(), 16 * 2 * 18);
        let src: Vec<u8> = (0..r.slice_bytes()).map(|i| (i * 7 % 251) as u8).collect();
        let mut dst = vec![0u8; r.slice_bytes()];
        r.repack(&src, &mut dst).unwrap();
        assert_ne!(src, dst);
        let mut again = vec![0u8; r.slice_bytes()];
        r.repack(&src, &mut again).unwrap();
        assert_eq!(dst, again);
        assert!(r.repack(&src[1..], &mut dst).is_err());
    }

    #[test]
    fn types_without_a_repacked_kernel_have_no_repacker() {
        assert!(Repacker::new(F32, 64, 16).is_none());
        // Rows not in whole groups cannot be interleaved.
        assert!(Repacker::new(Q4_0, 64, 6).is_none());
        // Shapes ggml would abort on are refused before it sees them.
        assert!(Repacker::new(Q4_0, 48, 16).is_none());
        assert!(Repacker::new(Q4_0, 0, 16).is_none());
        assert!(Repacker::new(9999, 64, 16).is_none());
    }
}
