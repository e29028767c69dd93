//! Drafting with a model's own next-token-prediction (MTP) layers: a
//! second context of llama.cpp's MTP type over the same model, whose graph
//! is the MTP block alone and whose KV cache holds only that layer. Each of
//! its positions takes the token there and the target context's last
//! hidden state at the position before (llama.cpp's `h_nextn`, which the
//! target keeps for every position once drafting is attached). A draft
//! runs the head on the last token, then on its own output hidden state and
//! drafted token, for as many tokens as asked or until its top choice is
//! less likely than the floor.
//!
//! Positions are fed lazily: the target's hidden states are copied after
//! each of its decodes, and the positions the draft context lacks go in
//! one batch with the next draft's first token. A step thus costs one
//! draft-context decode however many drafts were accepted, and nothing
//! while the prompt is decoded. A head that keeps drafting nothing, or
//! nothing the target accepts, rests for a growing number of steps (up to
//! [`MAX_REST`]); it then resumes on the last [`RESUME_WINDOW`] positions
//! only. The draft context shares the target's eval hook, so the MTP
//! layer's experts stream through the same expert cache.
//!
//! A [`super::Context`] owns its drafter ([`super::Context::attach_mtp`]),
//! so the drafter never outlives the context or the hook it points to.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

// llama.cpp's staging API for MTP (`src/llama-ext.h`), declared without C
// linkage there: reached by its C++ names.
unsafe extern "C" {
    #[link_name = "_Z26llama_set_embeddings_nextnP13llama_contextbb"]
    fn llama_set_embeddings_nextn(ctx: *mut sys::llama_context, value: bool, masked: bool);
    #[link_name = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"]
    fn llama_get_embeddings_nextn_ith(ctx: *mut sys::llama_context, i: i32) -> *mut f32;
}

/// Most steps a useless head rests before it drafts again.
pub const MAX_REST: u32 = 16;

/// Positions a head is fed again after a rest (its cache restarts there).
pub const RESUME_WINDOW: usize = 4;

/// What the MTP drafter is asked to do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MtpParams {
    /// Most tokens one draft may hold.
    pub draft_max: u32,
    /// A draft stops before a token the head gives less probability than this.
    pub p_min: f32,
    /// Which of its routed experts the MTP layer drafts with when experts stream.
    pub experts: MtpExperts,
}

/// Which of its routed experts a streamed MTP layer computes a draft with.
/// A draft need not be exact (the target verifies it), so it can make do
/// with the experts at hand instead of waiting for reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MtpExperts {
    /// The routed experts the expert cache holds, their weights scaled up
    /// to the routed total; a token none of whose experts are cached reads
    /// its top one. A draft token reads at most one expert.
    #[default]
    Cached,
    /// Every routed expert, read like the trunk's.
    All,
}

impl MtpExperts {
    /// Every choice.
    pub const ALL: [MtpExperts; 2] = [MtpExperts::Cached, MtpExperts::All];

    /// Its name in configuration and reports.
    pub fn name(self) -> &'static str {
        match self {
            MtpExperts::Cached => "cached",
            MtpExperts::All => "all",
        }
    }

    /// The choice called `name`.
    pub fn parse(name: &str) -> Option<MtpExperts> {
        MtpExperts::ALL.into_iter().find(|e| e.name() == name)
    }
}

/// The draft context and what it has been fed.
pub(super) struct MtpDraft {
    ctx: NonNull<sys::llama_context>,
    target: NonNull<sys::llama_context>,
    threadpool: *mut sys::ggml_threadpool,
    draft_max: u32,
    p_min: f32,
    n_embd: usize,
    n_vocab: usize,
    n_batch: usize,
    /// The tokens the draft context's cache holds, by position from
    /// `cache_start`.
    cached: Vec<i32>,
    /// The first position the draft context's cache holds.
    cache_start: usize,
    /// Drafts in a row that drafted nothing or had nothing accepted.
    useless: u32,
    /// Steps left to skip drafting.
    rest: u32,
    /// The next draft starts the cache again on a short window.
    resume: bool,
    /// The target's tokens by position, as far as it has decoded.
    tokens: Vec<i32>,
    /// The target's hidden state by position (`n_embd` each), as far as it
    /// has decoded.
    hidden: Vec<f32>,
    /// Scratch for one draft-context batch.
    batch: OwnBatch,
}

/// A `llama_batch` over vectors we own, carrying a token and an embedding
/// (the hidden state it is paired with) per entry.
#[derive(Default)]
struct OwnBatch {
    token: Vec<i32>,
    embd: Vec<f32>,
    pos: Vec<i32>,
    n_seq_id: Vec<i32>,
    seq_id_value: Vec<i32>,
    seq_id: Vec<*mut i32>,
    logits: Vec<i8>,
}

impl OwnBatch {
    fn clear(&mut self) {
        self.token.clear();
        self.embd.clear();
        self.pos.clear();
        self.logits.clear();
    }

    fn push(&mut self, token: i32, pos: usize, embd: &[f32], output: bool) {
        self.token.push(token);
        self.embd.extend_from_slice(embd);
        self.pos.push(pos as i32);
        self.logits.push(i8::from(output));
    }

    /// The batch, valid until `self` changes.
    fn raw(&mut self) -> sys::llama_batch {
        let n = self.token.len();
        self.n_seq_id.resize(n, 1);
        self.seq_id_value.resize(n, 0);
        self.seq_id.clear();
        let base = self.seq_id_value.as_mut_ptr();
        // SAFETY: pointers into seq_id_value, which has n elements.
        self.seq_id.extend((0..n).map(|i| unsafe { base.add(i) }));
        sys::llama_batch {
            n_tokens: n as i32,
            token: self.token.as_mut_ptr(),
            embd: self.embd.as_mut_ptr(),
            pos: self.pos.as_mut_ptr(),
            n_seq_id: self.n_seq_id.as_mut_ptr(),
            seq_id: self.seq_id.as_mut_ptr(),
            logits: self.logits.as_mut_ptr(),
        }
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
        let target = NonNull::new(target).ok_or("no target context")?;
        cp.ctx_type = sys::LLAMA_CONTEXT_TYPE_MTP;
        // SAFETY: the caller keeps the model alive; cp is a valid parameter set.
        let raw = unsafe { sys::llama_init_from_model(model, cp) };
        let ctx = NonNull::new(raw).ok_or_else(|| {
            format!("llama.cpp could not create the MTP draft context: {}", super::last_errors().join("; "))
        })?;
        let threadpool = super::context::new_threadpool(ctx, threads, 0);
        // SAFETY: live model and contexts; plain setters and getters. The
        // target keeps every position's hidden state, the draft context
        // only its outputs'.
        let (n_embd, n_vocab) = unsafe {
            llama_set_embeddings_nextn(target.as_ptr(), true, false);
            llama_set_embeddings_nextn(ctx.as_ptr(), true, true);
            let vocab = sys::llama_model_get_vocab(model);
            (sys::llama_model_n_embd_out(model).max(1) as usize, sys::llama_vocab_n_tokens(vocab).max(1) as usize)
        };
        Ok(MtpDraft {
            ctx,
            target,
            threadpool,
            draft_max: params.draft_max.clamp(1, 64),
            p_min: params.p_min,
            n_embd,
            n_vocab,
            n_batch: cp.n_batch.max(1) as usize,
            cached: Vec::new(),
            cache_start: 0,
            useless: 0,
            rest: 0,
            resume: false,
            tokens: Vec::new(),
            hidden: Vec::new(),
            batch: OwnBatch::default(),
        })
    }

    /// Records what the target just decoded: `batch`'s tokens at their
    /// positions and the hidden states the decode left for them.
    pub(super) fn follow(&mut self, batch: &sys::llama_batch) -> Result<(), String> {
        let n = batch.n_tokens.max(0) as usize;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: the target's batch arrays hold n_tokens entries.
        let (first, tokens) = unsafe { (*batch.pos as usize, std::slice::from_raw_parts(batch.token, n)) };
        // The draft cache's entries stay where the tokens are the same (the
        // position a draft was fed before the target verified it).
        let same = tokens.iter().enumerate().take_while(|&(i, &t)| self.cached_at(first + i) == Some(t)).count();
        if self.cache_end() > first + same {
            self.truncate_cache(first + same);
        }
        if first < self.tokens.len() {
            self.tokens.truncate(first);
            self.hidden.truncate(first * self.n_embd);
        }
        if first != self.tokens.len() {
            return Err(format!("MTP follow: position {first}, but {} are known", self.tokens.len()));
        }
        self.tokens.extend_from_slice(tokens);
        for i in 0..n {
            // SAFETY: the target kept a row for every entry of its last batch
            // (unmasked), valid until its next decode; n_embd floats each.
            let row = unsafe { llama_get_embeddings_nextn_ith(self.target.as_ptr(), i as i32) };
            if row.is_null() {
                return Err("MTP follow: the target kept no hidden state".into());
            }
            // SAFETY: see above.
            self.hidden.extend_from_slice(unsafe { std::slice::from_raw_parts(row, self.n_embd) });
        }
        Ok(())
    }

    /// Drafts after `last`, the token at position `pos` (right after what
    /// the target holds): first every position the draft context lacks,
    /// then the drafts one by one. Keeps `last`'s position, paired with the
    /// target's hidden state before it; drops the drafted ones.
    pub(super) fn draft(&mut self, pos: usize, last: i32) -> Result<Vec<i32>, String> {
        if pos != self.tokens.len() {
            return Err(format!("MTP draft at {pos}: the target holds {} positions", self.tokens.len()));
        }
        if self.rest > 0 {
            self.rest -= 1;
            return Ok(Vec::new());
        }
        // `last` may already be in the cache (a draft before a decode that
        // stopped), else it goes after the positions the cache lacks.
        if self.cached_at(pos).is_some_and(|t| t != last) {
            self.truncate_cache(pos);
        }
        if std::mem::take(&mut self.resume) && pos + 1 > self.cache_end() + RESUME_WINDOW {
            // Back from a rest: a short window, not every position missed.
            self.truncate_cache(0);
            self.cache_start = pos + 1 - RESUME_WINDOW;
        }
        let zeros = vec![0f32; self.n_embd];
        let mut p = self.cache_end().min(pos + 1);
        let fed_before = p == pos + 1;
        let mut out_row = Vec::new();
        while p <= pos {
            let end = (p + self.n_batch).min(pos + 1);
            self.batch.clear();
            for q in p..end {
                let token = if q == pos { last } else { self.tokens[q] };
                let h = if q == 0 { &zeros[..] } else { &self.hidden[(q - 1) * self.n_embd..q * self.n_embd] };
                self.batch.push(token, q, h, q == pos);
            }
            self.decode()?;
            self.cached.extend(self.batch.token.iter().copied());
            p = end;
        }
        if fed_before {
            // Its logits are gone: feed it again.
            self.truncate_cache(pos);
            return self.draft(pos, last);
        }
        let mut drafts = Vec::new();
        let mut at = pos;
        loop {
            let (token, p_top) = self.top_choice()?;
            if p_top < self.p_min {
                break;
            }
            drafts.push(token);
            if drafts.len() as u32 >= self.draft_max {
                break;
            }
            // SAFETY: the draft context kept a row for its one output.
            let row = unsafe { llama_get_embeddings_nextn_ith(self.ctx.as_ptr(), -1) };
            if row.is_null() {
                return Err("MTP draft: the head kept no hidden state".into());
            }
            // SAFETY: n_embd floats, valid until the next decode.
            out_row.clear();
            out_row.extend_from_slice(unsafe { std::slice::from_raw_parts(row, self.n_embd) });
            at += 1;
            self.batch.clear();
            self.batch.push(token, at, &out_row, true);
            self.decode()?;
        }
        // Drafted positions go: the target's own states replace them.
        self.truncate_cache(pos + 1);
        if drafts.is_empty() {
            self.note_useless();
        }
        Ok(drafts)
    }

    /// Runs the head once on `last` at `pos` and drafts nothing: the
    /// warm-up capture sees the draft graph exactly once (a second pass
    /// would record its nodes out of order). Leaves the rest state alone.
    pub(super) fn warm_up(&mut self, pos: usize, last: i32) -> Result<(), String> {
        let p_min = std::mem::replace(&mut self.p_min, f32::INFINITY);
        let (useless, rest, resume) = (self.useless, self.rest, self.resume);
        let result = self.draft(pos, last);
        (self.p_min, self.useless, self.rest, self.resume) = (p_min, useless, rest, resume);
        result.map(drop)
    }

    /// How the target judged the last non-empty draft.
    pub(super) fn verified(&mut self, accepted: usize) {
        if accepted > 0 {
            self.useless = 0;
        } else {
            self.note_useless();
        }
    }

    /// A draft that gained nothing: from the second in a row, rest 1, 2,
    /// 4... steps, up to [`MAX_REST`].
    fn note_useless(&mut self) {
        self.useless += 1;
        if self.useless >= 2 {
            self.rest = (1u32 << (self.useless - 2).min(4)).min(MAX_REST);
            self.resume = true;
        }
    }

    fn cache_end(&self) -> usize {
        self.cache_start + self.cached.len()
    }

    /// The token the draft cache holds at `pos`, if it holds it.
    fn cached_at(&self, pos: usize) -> Option<i32> {
        pos.checked_sub(self.cache_start).and_then(|i| self.cached.get(i).copied())
    }

    /// The head's top token and its probability, from the last decode.
    fn top_choice(&self) -> Result<(i32, f32), String> {
        // SAFETY: after a successful decode with one output, llama.cpp keeps
        // n_vocab logits for it until the next decode.
        let logits = unsafe {
            let p = sys::llama_get_logits_ith(self.ctx.as_ptr(), -1);
            if p.is_null() {
                return Err("MTP draft: no logits".into());
            }
            std::slice::from_raw_parts(p, self.n_vocab)
        };
        let (best, &max) =
            logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).ok_or("MTP draft: empty logits")?;
        let total: f32 = logits.iter().map(|&l| (l - max).exp()).sum();
        Ok((best as i32, 1.0 / total))
    }

    fn decode(&mut self) -> Result<(), String> {
        let batch = self.batch.raw();
        // SAFETY: live context; the batch's arrays are ours and alive for the call.
        let rc = unsafe { sys::llama_decode(self.ctx.as_ptr(), batch) };
        if rc == 0 {
            return Ok(());
        }
        // Whatever the failed batch left goes; `cached` is still what is whole.
        self.truncate_cache(self.cache_end());
        Err(if rc == 2 {
            "MTP draft: aborted".into()
        } else {
            format!("MTP draft: llama_decode failed with code {rc}")
        })
    }

    /// Forgets positions `from..`: the target rolled back to `from`.
    pub(super) fn truncate(&mut self, from: usize) {
        self.forget_from(from);
    }

    fn forget_from(&mut self, from: usize) {
        if from < self.tokens.len() {
            self.tokens.truncate(from);
            self.hidden.truncate(from * self.n_embd);
        }
        if from < self.cache_end() {
            self.truncate_cache(from);
        }
    }

    fn truncate_cache(&mut self, from: usize) {
        // SAFETY: live context; sequence 0 is the only sequence.
        let memory = unsafe { sys::llama_get_memory(self.ctx.as_ptr()) };
        // SAFETY: as above.
        if from <= self.cache_start || !unsafe { sys::llama_memory_seq_rm(memory, 0, from as i32, -1) } {
            // SAFETY: as above.
            unsafe { sys::llama_memory_clear(memory, true) };
            self.cached.clear();
            self.cache_start = 0;
            return;
        }
        self.cached.truncate(from - self.cache_start);
    }

    /// Sets the compute threads of the draft decodes.
    pub(super) fn set_threads(&mut self, n: u32) {
        // SAFETY: live context, no decode running (&mut self).
        unsafe { sys::llama_set_n_threads(self.ctx.as_ptr(), n as i32, n as i32) };
    }
}

impl Drop for MtpDraft {
    fn drop(&mut self) {
        // SAFETY: created in `new` and freed once.
        unsafe { free_context(self.ctx, self.threadpool) };
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
