//! A llama.cpp context: KV cache, persistent threadpool, the eval-callback
//! trampoline into an [`EvalHook`], and an abort flag.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use llama_cpp_sys_2 as sys;

use super::model::Model;
use super::mtp::{MtpDraft, MtpParams};
use super::tensor::Tensor;

/// Receives every graph node during decode (the seam with llama.cpp).
pub trait EvalHook: Send {
    /// Called for each node before it is scheduled; returning true isolates
    /// the node so that [`EvalHook::observe`] runs right after it is computed.
    fn ask(&mut self, node: Tensor<'_>) -> bool;
    /// Called after an isolated node is computed and before anything that
    /// depends on it runs.
    fn observe(&mut self, node: Tensor<'_>);
}

/// Context settings.
#[derive(Debug, Clone, Copy)]
pub struct ContextParams {
    /// Context length in tokens.
    pub n_ctx: u32,
    /// Most tokens per `decode` call.
    pub n_batch: u32,
    /// Most tokens per graph computation.
    pub n_ubatch: u32,
    /// Compute threads.
    pub n_threads: u32,
    /// Sequences the context holds at once (one per conversation decoded
    /// in the same batches).
    pub n_seq: u32,
    /// One more sequence id beside the `n_seq`, never decoded: scratch room
    /// through which two sequences exchange their cells (a server swapping
    /// slots keeps both conversations). Where each sequence has its own KV
    /// stream, the spare's stream is as large as the others'.
    pub spare_seq: bool,
    /// Batch-invariant kernels: a sequence's logits are bitwise the same
    /// whatever else the batch holds and however its prompt was split
    /// (docs/server.md, "Exactness"). Each sequence has its own KV stream,
    /// its cells in position order from cell 0 as when it runs alone, and
    /// the CPU backend computes in ggml's reference mode (each column on its
    /// own: no llamafile sgemm, no tiled matmul, flash attention one query
    /// row at a time over all its cells, neither tiled nor split across
    /// threads). Off: llama.cpp's fastest kernels, its tiled and split flash
    /// attention, and one KV buffer shared by all sequences.
    pub batch_invariant: bool,
}

/// One sequence's tokens in a batch of several ([`Context::decode_parts`]).
#[derive(Debug, Clone, Copy)]
pub struct SeqPart<'a> {
    /// The sequence (0 to `n_seq - 1`).
    pub seq: i32,
    /// Position of the first token in its sequence.
    pub first_pos: i32,
    /// The tokens.
    pub tokens: &'a [i32],
    /// Keep the logits of the last token.
    pub logits: bool,
}

/// Which positions of a batch keep their logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (warm-up, non-final prompt chunks).
    None,
    /// The last token only.
    Last,
    /// Every token (speculative verification).
    All,
}

/// Why a decode failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The abort flag was raised during the decode.
    #[error("decode aborted")]
    Aborted,
    /// The KV cache has no room for the batch.
    #[error("the context is full ({0} tokens)")]
    ContextFull(u32),
    /// llama.cpp reported another failure.
    #[error("llama_decode failed with code {0}")]
    Failed(i32),
}

/// A context over a model, optionally with an eval hook.
pub struct Context<H: EvalHook> {
    ptr: NonNull<sys::llama_context>,
    /// The threadpool whose idle threads sleep (attached unless polling).
    threadpool: *mut sys::ggml_threadpool,
    /// The one whose idle threads poll briefly first, made on first use.
    polling_pool: *mut sys::ggml_threadpool,
    /// Whether the polling pool is wanted (see [`Context::set_polling`]).
    polling: bool,
    /// A pool of one thread, made on first use: attached while decodes run
    /// one thread, since a larger pool wakes every idle thread of it at
    /// every graph (ggml's kickoff broadcasts to all).
    single_pool: *mut sys::ggml_threadpool,
    /// The compute threads of the next decodes.
    threads: u32,
    /// The pool attached now.
    attached: *mut sys::ggml_threadpool,
    max_threads: u32,
    hook: Option<NonNull<H>>,
    abort: Arc<AtomicBool>,
    batch: sys::llama_batch,
    n_batch: u32,
    n_ctx: u32,
    model: Arc<Model>,
    /// The parameters the context was made with (a draft context takes them).
    cp: sys::llama_context_params,
    /// Drafting with the model's MTP layers, when attached.
    mtp: Option<MtpDraft>,
    /// How long the last decode waited for its graph to finish after
    /// llama.cpp returned (layers on RPC servers).
    remote_wait_ns: u64,
}

// SAFETY: the context is used by one thread at a time (methods take &mut
// self); the hook is Send; the abort flag is shared through an Arc.
unsafe impl<H: EvalHook> Send for Context<H> {}

unsafe extern "C" fn eval_trampoline<H: EvalHook>(t: *mut sys::ggml_tensor, ask: bool, user: *mut c_void) -> bool {
    // SAFETY: `user` is the hook pointer installed in `Context::new`; the
    // hook is only reached through this pointer while llama_decode runs, and
    // no Rust reference to it is held across the decode call.
    let hook = unsafe { &mut *user.cast::<H>() };
    // SAFETY: the scheduler passes a live node for the duration of the call.
    let node = unsafe { Tensor::from_raw(t) };
    if ask {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.ask(node))).unwrap_or(false)
    } else {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook.observe(node)));
        // Returning false here would cancel the rest of the graph split.
        true
    }
}

unsafe extern "C" fn abort_trampoline(data: *mut c_void) -> bool {
    // SAFETY: `data` is the AtomicBool kept alive by the context's Arc.
    unsafe { &*data.cast::<AtomicBool>() }.load(Ordering::Relaxed)
}

impl<H: EvalHook> Context<H> {
    /// Creates a context; with `hook`, every graph node is shown to it.
    /// Setting `abort` (from any thread) makes a running decode stop early.
    pub fn new(
        model: Arc<Model>,
        params: ContextParams,
        hook: Option<Box<H>>,
        abort: Arc<AtomicBool>,
    ) -> Result<Context<H>, String> {
        let hook = hook.map(|h| NonNull::from(Box::leak(h)));
        // SAFETY: returns a plain struct of defaults.
        let mut cp = unsafe { sys::llama_context_default_params() };
        let n_seq = params.n_seq.max(1);
        let spare = u32::from(params.spare_seq);
        cp.n_ctx = params.n_ctx;
        cp.n_batch = params.n_batch;
        cp.n_ubatch = params.n_ubatch;
        cp.n_seq_max = n_seq + spare;
        if params.batch_invariant {
            // One KV stream per sequence, each of n_ctx / n_seq cells; the
            // spare's stream the same size.
            cp.kv_unified = false;
            cp.n_ctx = params.n_ctx / n_seq * (n_seq + spare);
        } else {
            // Every sequence may grow to the whole context, the total shared.
            cp.kv_unified = params.n_seq > 1;
        }
        cp.n_threads = params.n_threads as i32;
        cp.n_threads_batch = params.n_threads as i32;
        cp.no_perf = true;
        cp.abort_callback = Some(abort_trampoline);
        cp.abort_callback_data = Arc::as_ptr(&abort) as *mut c_void;
        if let Some(h) = hook {
            cp.cb_eval = Some(eval_trampoline::<H>);
            cp.cb_eval_user_data = h.as_ptr().cast();
        }
        let free_hook = |hook: Option<NonNull<H>>| {
            if let Some(h) = hook {
                // SAFETY: leaked above and not yet handed to a live context.
                drop(unsafe { Box::from_raw(h.as_ptr()) });
            }
        };
        // SAFETY: the model is alive (we hold an Arc) and params are valid.
        let raw = unsafe { sys::llama_init_from_model(model.raw(), cp) };
        let Some(ptr) = NonNull::new(raw) else {
            free_hook(hook);
            return Err(format!("llama.cpp could not create a context: {}", super::last_errors().join("; ")));
        };
        // A persistent threadpool: without one every isolated node would
        // start and join a fresh set of threads. Its idle threads sleep
        // instead of polling for work (`poll = 0`): a polling thread left
        // idle by a smaller thread count, or waiting between the graph
        // splits the hook makes, spins on a core that another process or
        // the read lanes need. Measured on the bench preset with a busy loop
        // on one of two cores: 4.3-4.9 tok/s at cache 0 against 1.8-3.5
        // polling; quiet, the same at cache 0 and 2.5% slower fully cached
        // (see `set_polling`).
        let threadpool = new_threadpool(ptr, params.n_threads, 0);
        if !use_reference_kernels(ptr, params.batch_invariant) && params.batch_invariant {
            // SAFETY: made above, not yet shared; freed once here, the
            // threadpool after the context that used it.
            unsafe {
                sys::llama_free(ptr.as_ptr());
                if !threadpool.is_null() {
                    sys::ggml_threadpool_free(threadpool);
                }
            }
            free_hook(hook);
            return Err("llama.cpp's context has no CPU backend whose kernels bmoe can make batch-invariant".into());
        }
        Ok(Context {
            ptr,
            threadpool,
            polling_pool: std::ptr::null_mut(),
            polling: false,
            single_pool: std::ptr::null_mut(),
            threads: params.n_threads,
            attached: threadpool,
            max_threads: params.n_threads,
            hook,
            abort,
            batch: Self::new_batch(params.n_batch),
            n_batch: params.n_batch,
            n_ctx: Self::context_length(ptr),
            model,
            cp,
            mtp: None,
            remote_wait_ns: 0,
        })
    }

    fn new_batch(n_batch: u32) -> sys::llama_batch {
        // SAFETY: allocates a batch with room for n_batch tokens and one sequence id each.
        unsafe { sys::llama_batch_init(n_batch as i32, 0, 1) }
    }

    fn context_length(ptr: NonNull<sys::llama_context>) -> u32 {
        // SAFETY: live context.
        unsafe { sys::llama_n_ctx(ptr.as_ptr()) }
    }

    /// Lets the compute threads poll for work briefly before they sleep
    /// (`on`), or sleep at once. Polling saves the wake-up at each graph
    /// split the hook makes, about 2% of a fully cached streamed token on
    /// the bench preset (streamed / resident 0.94-0.98 sleeping, 0.99-1.02
    /// polling, `examples/full-cache.rhai`), but a polling thread spins for
    /// up to a few milliseconds on a core another process or the read lanes
    /// may need: the session polls only while steps read nothing and the
    /// cores are quiet. Takes effect from the next decode; without a pool
    /// to switch to it stays as it is.
    pub fn set_polling(&mut self, on: bool) {
        self.polling = on;
        self.attach_wanted();
    }

    /// Attaches the pool the next decodes want: the one-thread pool for one
    /// thread, else the polling pool while polling, else the sleeping one
    /// (each made on first use; where ggml cannot make one, the sleeping
    /// pool serves). The others are paused: their threads wait on a
    /// condition variable, and ggml resumes a pool when it next computes
    /// with it.
    fn attach_wanted(&mut self) {
        if self.threadpool.is_null() {
            return;
        }
        let want = if self.threads == 1 && self.max_threads > 1 {
            if self.single_pool.is_null() {
                self.single_pool = new_threadpool(self.ptr, 1, 0);
            }
            self.single_pool
        } else if self.polling {
            if self.polling_pool.is_null() {
                // The least polling ggml offers (128Ki rounds) bridges the
                // splits; llama.cpp's default of 50 spins for a few hundred
                // milliseconds.
                self.polling_pool = new_threadpool(self.ptr, self.max_threads, 1);
            }
            self.polling_pool
        } else {
            self.threadpool
        };
        let want = if want.is_null() { self.threadpool } else { want };
        if want == self.attached {
            return;
        }
        // SAFETY: every pool is alive until Drop; &mut self means no decode
        // runs. (A pool just made attached itself; attaching again is harmless.)
        unsafe {
            for pool in [self.threadpool, self.polling_pool, self.single_pool] {
                if !pool.is_null() && pool != want && pool == self.attached {
                    sys::ggml_threadpool_pause(pool);
                }
            }
            sys::llama_attach_threadpool(self.ptr.as_ptr(), want, want);
        }
        self.attached = want;
    }

    /// Attaches drafting with the model's MTP layers (loaded with
    /// `Model::load(.., mtp: true)`): a draft context of the MTP type with
    /// this context's settings and eval hook. From here on this context's
    /// decodes keep every position's last hidden state for it, and
    /// [`Context::truncate_kv`] and [`Context::clear_kv`] apply to both.
    pub fn attach_mtp(&mut self, params: MtpParams) -> Result<(), String> {
        self.mtp = None;
        // SAFETY: the model (our Arc) and this context outlive the draft,
        // which Drop frees first; the hook and abort pointers in `cp` are
        // freed after it too.
        let draft = unsafe { MtpDraft::new(self.model.raw(), self.ptr.as_ptr(), self.cp, self.max_threads, params)? };
        self.mtp = Some(draft);
        Ok(())
    }

    fn draft_mut(&mut self) -> Result<&mut MtpDraft, String> {
        self.mtp.as_mut().ok_or_else(|| "no MTP drafting attached".to_string())
    }

    /// Whether MTP drafting is attached.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// Hands the drafter the batch this context decoded last, with the
    /// hidden states that decode left (call after every decode).
    pub fn mtp_follow(&mut self) -> Result<(), String> {
        let batch = self.batch;
        self.draft_mut()?.follow(&batch)
    }

    /// Drafts tokens after `last`, the token at position `pos` (right after
    /// what this context holds, not yet decoded).
    pub fn mtp_draft(&mut self, pos: usize, last: i32) -> Result<Vec<i32>, String> {
        self.draft_mut()?.draft(pos, last)
    }

    /// Runs the draft head once on `last` at `pos` without drafting (the
    /// warm-up capture of its graph).
    pub fn mtp_warm_up(&mut self, pos: usize, last: i32) -> Result<(), String> {
        self.draft_mut()?.warm_up(pos, last)
    }

    /// Tells the drafter how many tokens of its last non-empty draft the
    /// verification accepted (a head that keeps missing rests).
    pub fn mtp_verified(&mut self, accepted: usize) {
        if let Some(m) = self.mtp.as_mut() {
            m.verified(accepted);
        }
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context length: every sequence's together.
    pub fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// The context length one sequence may use (all of it when the
    /// sequences share one KV buffer, an equal share when each has its own).
    pub fn n_ctx_seq(&self) -> u32 {
        // SAFETY: live context.
        unsafe { sys::llama_n_ctx_seq(self.ptr.as_ptr()) }
    }

    /// Sets the compute threads of the next decodes (at most the count the
    /// context was created with: its threadpool has no more).
    pub fn set_threads(&mut self, n: u32) {
        // SAFETY: live context; &mut self means no decode is running.
        unsafe { sys::llama_set_n_threads(self.ptr.as_ptr(), n as i32, n as i32) };
        self.threads = n;
        self.attach_wanted();
        if let Some(m) = self.mtp.as_mut() {
            m.set_threads(n);
        }
    }

    /// The hook, between decodes.
    pub fn hook_mut(&mut self) -> Option<&mut H> {
        // SAFETY: &mut self guarantees no decode (the only other user of the
        // pointer) is running.
        self.hook.map(|h| unsafe { &mut *h.as_ptr() })
    }

    /// Decodes `tokens` at positions `first_pos..`, keeping the logits `which` asks for.
    pub fn decode(&mut self, tokens: &[i32], first_pos: i32, which: Logits) -> Result<(), DecodeError> {
        assert!(!tokens.is_empty() && tokens.len() <= self.n_batch as usize, "batch of {} tokens", tokens.len());
        for (i, &tok) in tokens.iter().enumerate() {
            let keep = match which {
                Logits::None => false,
                Logits::Last => i + 1 == tokens.len(),
                Logits::All => true,
            };
            self.set_batch_entry(i, tok, first_pos + i as i32, 0, keep);
        }
        self.run_batch(tokens.len())
    }

    /// Decodes the parts of several sequences in one batch (each part's
    /// tokens at its positions in its own sequence); the logits of part
    /// `i`'s last token, where kept, are [`Context::logits_at`] of the
    /// batch index [`batch_index_of_last`] gives.
    pub fn decode_parts(&mut self, parts: &[SeqPart<'_>]) -> Result<(), DecodeError> {
        let total: usize = parts.iter().map(|p| p.tokens.len()).sum();
        assert!(total > 0 && total <= self.n_batch as usize, "batch of {total} tokens");
        let mut i = 0;
        for part in parts {
            for (j, &tok) in part.tokens.iter().enumerate() {
                let last = j + 1 == part.tokens.len();
                self.set_batch_entry(i, tok, part.first_pos + j as i32, part.seq, part.logits && last);
                i += 1;
            }
        }
        self.run_batch(total)
    }

    /// Writes entry `i` of the batch.
    fn set_batch_entry(&mut self, i: usize, token: i32, pos: i32, seq: i32, logits: bool) {
        assert!(i < self.n_batch as usize);
        let b = &mut self.batch;
        // SAFETY: the batch arrays were allocated for n_batch tokens and one
        // sequence id each; i < n_batch.
        unsafe {
            *b.token.add(i) = token;
            *b.pos.add(i) = pos;
            *b.n_seq_id.add(i) = 1;
            *(*b.seq_id.add(i)) = seq;
            *b.logits.add(i) = i8::from(logits);
        }
    }

    /// Decodes the first `n` entries of the batch.
    fn run_batch(&mut self, n: usize) -> Result<(), DecodeError> {
        let b = &mut self.batch;
        b.n_tokens = n as i32;
        // SAFETY: live context and a batch filled by the caller; the hook
        // pointer is not borrowed by Rust during the call.
        let rc = unsafe { sys::llama_decode(self.ptr.as_ptr(), *b) };
        // A graph with layers on an RPC server may still be computing there
        // when llama_decode returns: wait here, so a decode's time is its own
        // (the CPU backend's is synchronous, and this returns at once). The
        // wait is the servers' compute and the network, as seen from here.
        let t0 = std::time::Instant::now();
        // SAFETY: live context.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) };
        self.remote_wait_ns = if self.model.has_remote_layers() { t0.elapsed().as_nanos() as u64 } else { 0 };
        match rc {
            0 => Ok(()),
            2 if self.abort.load(Ordering::Relaxed) => Err(DecodeError::Aborted),
            1 => Err(DecodeError::ContextFull(self.n_ctx)),
            rc => Err(DecodeError::Failed(rc)),
        }
    }

    /// Nanoseconds the last decode waited, after llama.cpp returned, for
    /// the part of its graph on RPC servers (0 without servers).
    pub fn remote_wait_ns(&self) -> u64 {
        self.remote_wait_ns
    }

    /// Logits of the last decoded token that asked for them.
    pub fn last_logits(&self) -> &[f32] {
        self.logits_ith(-1)
    }

    /// Logits of batch position `i` of the last decode (with [`Logits::All`]).
    pub fn logits_at(&self, i: usize) -> &[f32] {
        self.logits_ith(i as i32)
    }

    fn logits_ith(&self, i: i32) -> &[f32] {
        let n = self.model.n_vocab();
        // SAFETY: after a successful decode, llama.cpp returns either null
        // (no logits kept for that position) or a pointer to n_vocab floats
        // valid until the next decode (which needs &mut self, ending this borrow).
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i);
            if p.is_null() { &[] } else { std::slice::from_raw_parts(p, n) }
        }
    }

    /// Forgets every cached position.
    pub fn clear_kv(&mut self) {
        // SAFETY: live context; the memory handle belongs to it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) };
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(0);
        }
    }

    /// Forgets positions `from..` of sequence `seq` (of a context holding
    /// several); false if the cache cannot do it.
    pub fn truncate_kv_seq(&mut self, seq: i32, from: i32) -> bool {
        // SAFETY: live context; seq is below the context's n_seq_max.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), seq, from, -1) }
    }

    /// Makes sequence `dst` hold every position sequence `src` holds, in
    /// the same cells (clear `dst` first). Where each sequence has its own
    /// KV buffer, the whole buffer is copied at the start of the next
    /// decode, bit for bit.
    pub fn copy_kv_seq(&mut self, src: i32, dst: i32) {
        // SAFETY: live context; both ids are below the context's n_seq_max,
        // and -1..-1 is the whole range a cross-buffer copy requires.
        unsafe { sys::llama_memory_seq_cp(sys::llama_get_memory(self.ptr.as_ptr()), src, dst, -1, -1) }
    }

    /// Forgets positions `from..`; false if the cache cannot do it.
    pub fn truncate_kv(&mut self, from: i32) -> bool {
        if let Some(m) = self.mtp.as_mut() {
            m.truncate(from.max(0) as usize);
        }
        // SAFETY: live context; sequence 0 is the only sequence.
        unsafe { sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), 0, from, -1) }
    }
}

impl<H: EvalHook> Drop for Context<H> {
    fn drop(&mut self) {
        // SAFETY: context, batch and pool were created in `new` and are freed
        // once, context first; then the hook (whose bindings restore weight
        // pointers while the model, held by our Arc, is still alive). A
        // draft context, which reads this one and shares its hook, goes first.
        self.mtp = None;
        // A context whose RPC server has gone is left in memory, like its
        // model: freeing its remote buffers would end the process.
        let leave = self.model.remote_lost();
        unsafe {
            sys::llama_batch_free(self.batch);
            if !leave {
                sys::llama_free(self.ptr.as_ptr());
            }
            for pool in [self.threadpool, self.polling_pool, self.single_pool] {
                if !pool.is_null() {
                    sys::ggml_threadpool_free(pool);
                }
            }
            if let Some(h) = self.hook {
                drop(Box::from_raw(h.as_ptr()));
            }
        }
    }
}

// llama.cpp keeps a context's backend scheduler to itself; its C++ getter
// (`llama_context::get_sched() const`, `src/llama-context.h`) is reached by
// its mangled name, `this` passed first as in a C call.
unsafe extern "C" {
    #[link_name = "_ZNK13llama_context9get_schedEv"]
    fn llama_context_get_sched(ctx: *const sys::llama_context) -> sys::ggml_backend_sched_t;
}

/// Puts the context's CPU backend in ggml's reference mode (`on`) or out of
/// it, and says whether the context has a CPU backend. In reference mode
/// every matmul takes ggml's per-type `vec_dot`, which computes each column
/// on its own (no llamafile sgemm from two columns, no tiled K-quant matmul
/// from eight, no tiled or split flash attention, no op fusion): a token's
/// results no longer depend on how many tokens share its batch. Weights in
/// the repack buffer keep their repacked kernels: bmoe repacks only expert
/// banks, whose repacked matmul runs `gemv` row by row for every type
/// ([`super::kernels`] probes it). The mode is the backend's, so each
/// context has its own; layers held by an RPC server compute on that
/// server's backend, outside it.
fn use_reference_kernels(ctx: NonNull<sys::llama_context>, on: bool) -> bool {
    // SAFETY: a live context; the scheduler and its backends live as long
    // as it does, and the setter only stores a flag read when a graph is planned.
    unsafe {
        let sched = llama_context_get_sched(ctx.as_ptr());
        if sched.is_null() {
            return false;
        }
        let mut found = false;
        for i in 0..sys::ggml_backend_sched_get_n_backends(sched) {
            let backend = sys::ggml_backend_sched_get_backend(sched, i);
            if !backend.is_null() && sys::ggml_backend_is_cpu(backend) {
                sys::ggml_backend_cpu_set_use_ref(backend, on);
                found = true;
            }
        }
        found
    }
}

/// The batch index of the last token of `parts[part]` in a batch
/// [`Context::decode_parts`] decoded.
pub fn batch_index_of_last(parts: &[SeqPart<'_>], part: usize) -> usize {
    parts[..=part].iter().map(|p| p.tokens.len()).sum::<usize>() - 1
}

/// A threadpool of `threads` threads whose idle threads poll `poll` rounds
/// (ggml's 0-100 scale) before they sleep, attached to `ctx`; null when
/// ggml cannot make one (the context then uses its own threads).
pub(super) fn new_threadpool(ctx: NonNull<sys::llama_context>, threads: u32, poll: u32) -> *mut sys::ggml_threadpool {
    // SAFETY: plain constructor calls on a live context; the pool outlives
    // the context (freed after it, in Drop).
    unsafe {
        let mut tpp = sys::ggml_threadpool_params_default(threads as i32);
        tpp.poll = poll;
        let tp = sys::ggml_threadpool_new(&mut tpp);
        if !tp.is_null() {
            sys::llama_attach_threadpool(ctx.as_ptr(), tp, tp);
        }
        tp
    }
}

/// A hook that is never installed: the type for contexts without one.
pub enum NoHook {}

impl EvalHook for NoHook {
    fn ask(&mut self, _: Tensor<'_>) -> bool {
        match *self {}
    }
    fn observe(&mut self, _: Tensor<'_>) {
        match *self {}
    }
}
