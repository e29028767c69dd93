//! Drafting with a model's own next-token-prediction (MTP) layers: a
//! second context of the MTP type over the same model, driven by llama.cpp's
//! MTP speculative code (the `llama_rs_mtp_speculative_*` wrapper the
//! crate builds around `common/speculative.cpp`). The draft context keeps a
//! KV cache of its own layer, fed each position's token with the target
//! context's last hidden state there; a draft runs the MTP head on its own
//! output for as many tokens as asked, or until its top choice is less
//! likely than the floor.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use super::context::{Context, EvalHook};

/// What the MTP drafter is asked to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MtpParams {
    /// Most tokens one draft may hold.
    pub draft_max: u32,
    /// A draft stops before a token the head gives less probability than this.
    pub p_min: f32,
}

/// An MTP draft context and llama.cpp's drafting state, tied to one target
/// context (whose hidden states it reads after each of its decodes).
pub struct MtpDrafter<H: EvalHook> {
    spec: NonNull<sys::llama_rs_mtp_speculative>,
    ctx: Context<H>,
    draft_max: u32,
}

// SAFETY: the drafting state is used by one thread at a time (methods take
// &mut self), like the contexts it points to.
unsafe impl<H: EvalHook> Send for MtpDrafter<H> {}

fn check(status: sys::llama_rs_status, what: &str) -> Result<(), String> {
    match status {
        sys::LLAMA_RS_STATUS_OK => Ok(()),
        sys::LLAMA_RS_STATUS_INVALID_ARGUMENT => Err(format!("MTP {what}: invalid argument")),
        sys::LLAMA_RS_STATUS_ALLOCATION_FAILED => Err(format!("MTP {what}: out of room")),
        other => Err(format!("MTP {what} failed ({other}): {}", super::last_errors().join("; "))),
    }
}

impl<H: EvalHook> MtpDrafter<H> {
    /// Ties the MTP context `ctx` (made with `ContextParams::mtp`) to
    /// `target`. Call before `target` decodes what the drafts will follow:
    /// from here on its decodes keep every position's hidden state.
    pub fn new<T: EvalHook>(target: &mut Context<T>, ctx: Context<H>, params: MtpParams) -> Result<Self, String> {
        let n_max = params.draft_max.clamp(1, 64) as i32;
        // SAFETY: both contexts are alive and outlive the state: `ctx` is
        // owned by the drafter (freed after the state, in Drop) and the
        // session drops its drafter before its target context.
        let raw = unsafe { sys::llama_rs_mtp_speculative_init(target.raw(), ctx.raw(), n_max, 0, params.p_min) };
        let spec = NonNull::new(raw)
            .ok_or_else(|| format!("llama.cpp could not start MTP drafting: {}", super::last_errors().join("; ")))?;
        Ok(MtpDrafter { spec, ctx, draft_max: n_max as u32 })
    }

    /// Most tokens a draft holds.
    pub fn draft_max(&self) -> u32 {
        self.draft_max
    }

    /// Starts a generation whose context holds `tokens`.
    pub fn begin(&mut self, tokens: &[i32]) -> Result<(), String> {
        // SAFETY: live state; `tokens` is valid for its length during the call.
        check(
            unsafe { sys::llama_rs_mtp_speculative_begin(self.spec.as_ptr(), tokens.as_ptr(), tokens.len()) },
            "begin",
        )
    }

    /// Feeds the draft context the batch `target` just decoded, paired with
    /// the hidden states that decode left.
    pub fn follow<T: EvalHook>(&mut self, target: &Context<T>) -> Result<(), String> {
        // SAFETY: live state; the batch belongs to `target`, whose last
        // decode it describes, and is only read during the call.
        check(unsafe { sys::llama_rs_mtp_speculative_process(self.spec.as_ptr(), target.last_batch()) }, "follow")
    }

    /// Drafts up to [`MtpDrafter::draft_max`] tokens after `last`, the
    /// token at position `pos` (not yet decoded by the target). The draft
    /// context's own positions past `pos` are dropped again afterwards.
    pub fn draft(&mut self, pos: i32, last: i32) -> Result<Vec<i32>, String> {
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
        // The target verifies from `pos` on; the draft context is fed those
        // positions again, with the target's hidden states, by `follow`.
        self.ctx.truncate_kv(pos);
        Ok(out)
    }

    /// Tells the drafter how many tokens of its last (non-empty) draft the
    /// target accepted.
    pub fn accept(&mut self, accepted: usize) -> Result<(), String> {
        let n = u16::try_from(accepted).map_err(|_| "MTP accept: too many tokens".to_string())?;
        // SAFETY: live state.
        check(unsafe { sys::llama_rs_mtp_speculative_accept(self.spec.as_ptr(), n) }, "accept")
    }

    /// Forgets the draft context's positions `from..` (the target rolled back).
    pub fn truncate(&mut self, from: i32) {
        if !self.ctx.truncate_kv(from) {
            self.ctx.clear_kv();
        }
    }

    /// Forgets every position.
    pub fn clear(&mut self) {
        self.ctx.clear_kv();
    }

    /// The draft context's eval hook, between decodes.
    pub fn hook_mut(&mut self) -> Option<&mut H> {
        self.ctx.hook_mut()
    }
}

impl<H: EvalHook> Drop for MtpDrafter<H> {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once, before the context it drives
        // (a field, dropped after this).
        unsafe { sys::llama_rs_mtp_speculative_free(self.spec.as_ptr()) };
    }
}
