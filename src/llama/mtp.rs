//! Drafting with a model's own next-token-prediction (MTP) layers: a
//! second context of the MTP type over the same model, driven by llama.cpp's
//! MTP speculative code (the `llama_rs_mtp_speculative_*` wrapper the
//! crate builds around `common/speculative.cpp`). The draft context keeps a
//! KV cache of its own layer, fed each position's token with the target
//! context's last hidden state there; a draft runs the MTP head on its own
//! output for as many tokens as asked, or until its top choice is less
//! likely than the floor. The draft context shares the target's eval hook,
//! so the MTP layer's experts stream through the same expert cache.
//!
//! A [`super::Context`] owns its drafter ([`super::Context::attach_mtp`]),
//! so the drafter never outlives the context or the hook it points to.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

/// What the MTP drafter is asked to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MtpParams {
    /// Most tokens one draft may hold.
    pub draft_max: u32,
    /// A draft stops before a token the head gives less probability than this.
    pub p_min: f32,
}

/// The draft context and llama.cpp's drafting state.
pub(super) struct MtpDraft {
    spec: NonNull<sys::llama_rs_mtp_speculative>,
    ctx: NonNull<sys::llama_context>,
    threadpool: *mut sys::ggml_threadpool,
    pub(super) draft_max: u32,
}

pub(super) fn check(status: sys::llama_rs_status, what: &str) -> Result<(), String> {
    match status {
        sys::LLAMA_RS_STATUS_OK => Ok(()),
        sys::LLAMA_RS_STATUS_INVALID_ARGUMENT => Err(format!("MTP {what}: invalid argument")),
        sys::LLAMA_RS_STATUS_ALLOCATION_FAILED => Err(format!("MTP {what}: out of room")),
        other => Err(format!("MTP {what} failed ({other}): {}", super::last_errors().join("; "))),
    }
}

impl MtpDraft {
    /// A draft context over `model` with the target's settings `cp` (and
    /// its eval hook, abort flag and thread count), tied to `target`.
    ///
    /// # Safety
    /// `model` and `target` must be alive, and outlive the returned value;
    /// `cp`'s callback pointers must stay valid as long.
    pub(super) unsafe fn new(
        model: *mut sys::llama_model,
        target: *mut sys::llama_context,
        mut cp: sys::llama_context_params,
        threads: u32,
        params: MtpParams,
    ) -> Result<MtpDraft, String> {
        cp.ctx_type = sys::LLAMA_CONTEXT_TYPE_MTP;
        // SAFETY: the caller keeps the model alive; cp is a valid parameter set.
        let raw = unsafe { sys::llama_init_from_model(model, cp) };
        let ctx = NonNull::new(raw).ok_or_else(|| {
            format!("llama.cpp could not create the MTP draft context: {}", super::last_errors().join("; "))
        })?;
        let threadpool = super::context::new_threadpool(ctx, threads, 0);
        let n_max = params.draft_max.clamp(1, 64) as i32;
        // SAFETY: both contexts are alive (the caller's contract for the target).
        let spec = unsafe { sys::llama_rs_mtp_speculative_init(target, ctx.as_ptr(), n_max, 0, params.p_min) };
        let Some(spec) = NonNull::new(spec) else {
            // SAFETY: created above, not shared.
            unsafe { free_context(ctx, threadpool) };
            return Err(format!("llama.cpp could not start MTP drafting: {}", super::last_errors().join("; ")));
        };
        Ok(MtpDraft { spec, ctx, threadpool, draft_max: n_max as u32 })
    }

    /// Starts a generation whose context holds `tokens`.
    pub(super) fn begin(&mut self, tokens: &[i32]) -> Result<(), String> {
        // SAFETY: live state; `tokens` is valid for its length during the call.
        check(
            unsafe { sys::llama_rs_mtp_speculative_begin(self.spec.as_ptr(), tokens.as_ptr(), tokens.len()) },
            "begin",
        )
    }

    /// Feeds the draft context `batch`, which the target just decoded.
    pub(super) fn follow(&mut self, batch: &sys::llama_batch) -> Result<(), String> {
        // SAFETY: live state; the batch is only read during the call.
        check(unsafe { sys::llama_rs_mtp_speculative_process(self.spec.as_ptr(), batch) }, "follow")
    }

    /// Drafts after `last`, the token at position `pos`; the draft
    /// context's positions from `pos` on are dropped again afterwards.
    pub(super) fn draft(&mut self, pos: i32, last: i32) -> Result<Vec<i32>, String> {
        let mut out = vec![0i32; self.draft_max as usize];
        let mut n = 0usize;
        // SAFETY: live state; `out` has room for draft_max tokens, the
        // wrapper's n_max; `n` receives how many it wrote.
        let status = unsafe {
            sys::llama_rs_mtp_speculative_draft(
                self.spec.as_ptr(),
                pos,
                last,
                std::ptr::null(),
                0,
                out.as_mut_ptr(),
                out.len(),
                &mut n,
            )
        };
        check(status, "draft")?;
        out.truncate(n);
        // The target verifies from `pos` on, and `follow` feeds the draft
        // context those positions again with the target's hidden states.
        self.truncate(pos);
        Ok(out)
    }

    /// How many tokens of the last non-empty draft were accepted.
    pub(super) fn accept(&mut self, accepted: usize) -> Result<(), String> {
        let n = u16::try_from(accepted).map_err(|_| "MTP accept: too many tokens".to_string())?;
        // SAFETY: live state.
        check(unsafe { sys::llama_rs_mtp_speculative_accept(self.spec.as_ptr(), n) }, "accept")
    }

    /// Forgets positions `from..` (everything, when the cache cannot).
    pub(super) fn truncate(&mut self, from: i32) {
        // SAFETY: live context; sequence 0 is the only sequence.
        unsafe {
            let memory = sys::llama_get_memory(self.ctx.as_ptr());
            if !sys::llama_memory_seq_rm(memory, 0, from, -1) {
                sys::llama_memory_clear(memory, true);
            }
        }
    }

    /// Sets the compute threads of the draft decodes.
    pub(super) fn set_threads(&mut self, n: u32) {
        // SAFETY: live context, no decode running (&mut self).
        unsafe { sys::llama_set_n_threads(self.ctx.as_ptr(), n as i32, n as i32) };
    }
}

impl Drop for MtpDraft {
    fn drop(&mut self) {
        // SAFETY: created in `new` and freed once: the drafting state first,
        // then the context it drives.
        unsafe {
            sys::llama_rs_mtp_speculative_free(self.spec.as_ptr());
            free_context(self.ctx, self.threadpool);
        }
    }
}

/// Frees a context and then its threadpool.
///
/// # Safety
/// Both were created by this module and are not used again.
unsafe fn free_context(ctx: NonNull<sys::llama_context>, threadpool: *mut sys::ggml_threadpool) {
    // SAFETY: the caller's contract.
    unsafe {
        sys::llama_free(ctx.as_ptr());
        if !threadpool.is_null() {
            sys::ggml_threadpool_free(threadpool);
        }
    }
}
