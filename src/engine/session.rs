//! [`Session`]: one loaded model, many generations.

mod open;
mod score;
mod sequences;
mod speculative;

pub use score::Scored;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::contention::{OtherLoad, RunQueueDelay};
use super::events::{Event, Phase, StepReport};
use super::remote::{self, RpcOptions};
use super::threads::StepTuner;
use crate::gguf::{GgufError, ModelFiles};
use crate::llama::{
    Context, ContextParams, DecodeError, Logits, Model, MtpExperts, MtpParams, RemoteLayers, Sampler, Sampling, argmax,
};
use crate::llama::{SeqPart, rpc};
use crate::moe::budget::{self, CacheBudget, Holdings, MemoryLimits};
use crate::moe::dense::{self, DenseWeights};
use crate::moe::evict::CachePolicy;
use crate::moe::lean;
use crate::moe::predict::ReadAhead;
use crate::moe::profile::{self, RouteProfile};
use crate::moe::repack::{Repack, name_patterns, repackable_banks};
use crate::moe::repacked;
use crate::moe::{Banks, ExpertStore, MoeHook, Projection, ReadLanes, StepTrace, capability, recipe, resolve_banks};
use crate::policy::{Drafter, Dropper};
use crate::telemetry::mem::MemSnapshot;
use crate::telemetry::summary::RunSummary;
use crate::telemetry::trace::{LayerBytes, layer_bytes};

/// How experts are streamed.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamOptions {
    /// The expert cache: off (shared slots re-read every token), a fixed
    /// budget, or auto (sized at open from the memory available).
    pub cache: CacheBudget,
    /// Which cached expert is evicted first.
    pub cache_policy: CachePolicy,
    /// How the dense (non-expert) weights are held.
    pub dense: DenseWeights,
    /// Read lanes (the eval thread is one of them).
    pub io_threads: usize,
    /// Try O_DIRECT (verified at open, buffered fallback).
    pub o_direct: bool,
    /// With the cache on and O_DIRECT, read through io_uring into an arena
    /// of the budget's size registered at open, so no read pins pages;
    /// where io_uring is missing or refused, today's reads (said in the
    /// open's details).
    pub io_uring: bool,
    /// What to read ahead for the coming layers while one computes.
    pub read_ahead: ReadAhead,
    /// Load a lean copy of the model ([`crate::moe::lean`]), whose expert
    /// bytes are holes, so opening reads only the dense weights; `None`
    /// loads the model file itself.
    pub lean: Option<LeanOpen>,
    /// Move an evicted cache entry's pages under the next entry read
    /// (`mremap`) instead of releasing them and faulting fresh zeroed pages
    /// in at the read; Linux only, off by itself where unsupported.
    pub recycle_pages: bool,
    /// Where repacked copies of the expert banks are kept
    /// ([`crate::moe::repacked`]); `None` repacks each slice as it is read.
    pub repacked_copy: Option<PathBuf>,
    /// Most bytes a new repacked copy may take on disk; `None`: half the
    /// free space of its file system. Over it, each slice is repacked as it
    /// is read.
    pub repacked_copy_max_bytes: Option<u64>,
    /// The model's route profile: where profiles live and what the session
    /// does with this model's ([`crate::moe::profile`]).
    pub route_profile: RouteProfileOpen,
}

/// Where route profiles live, and what a session does with its model's.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteProfileOpen {
    /// The directory of profile files.
    pub dir: PathBuf,
    /// Read and update, read only, or neither.
    pub mode: crate::moe::profile::ProfileMode,
}

impl RouteProfileOpen {
    /// No route profile read or written.
    pub fn off() -> RouteProfileOpen {
        RouteProfileOpen { dir: PathBuf::new(), mode: crate::moe::profile::ProfileMode::Off }
    }
}

/// Where lean copies live, and for which models.
#[derive(Debug, Clone, PartialEq)]
pub struct LeanOpen {
    /// The directory holding the copies.
    pub dir: PathBuf,
    /// Only models with at least this many expert bytes get a copy: below
    /// that, reading the whole file at open costs little.
    pub min_expert_bytes: u64,
    /// Only when the model files are larger than the memory the process may
    /// use (`MemAvailable`, or a tighter cgroup limit). A file that fits
    /// opens faster whole on a fast disk: the kernel fills a copy's holes
    /// with zeros at about the speed it reads (measured: 7.7 s against 3.5 s
    /// for the 6 GB bench preset), but under memory pressure the whole-file
    /// open reads more than the file, evicting as it goes (9.9 GB read, 5.7 s,
    /// against 1.2 GB, 4.2 s, under a cap of a third of the file).
    pub only_when_larger_than_memory: bool,
}

/// Everything fixed at open.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionOptions {
    /// Model file (first shard of a split set).
    pub model: PathBuf,
    /// Compute threads (the most, when tuned).
    pub threads: u32,
    /// Tune decode steps while running (see [`super::StepTuner`]): the
    /// thread count between 1 and `threads`, and read-ahead (when set up)
    /// on or off. Off keeps `threads` and read-ahead as given.
    pub tune: bool,
    /// Context length.
    pub ctx_size: u32,
    /// Most tokens per decode call.
    pub batch: u32,
    /// Most tokens per graph computation.
    pub ubatch: u32,
    /// Route this many experts per token instead of the model's own count (lossy).
    pub n_expert_used: Option<u32>,
    /// Stream experts; `None` runs the plain memory-mapped model.
    pub stream: Option<StreamOptions>,
    /// Expert banks for the CPU's repacked kernels (streamed or resident).
    pub repack: Repack,
    /// Draft with the model's own MTP layers (speculative decoding).
    pub mtp: Option<MtpParams>,
    /// Hold the last layers on RPC servers (llama.cpp's RPC backend).
    pub rpc: Option<RpcOptions>,
    /// Sequences decoded together in one batch ([`Session::decode_seqs`]);
    /// 1 for one conversation at a time.
    pub sequences: u32,
    /// Batch-invariant kernels (see [`crate::llama::ContextParams`]): a
    /// sequence's logits are bitwise the same alone or beside others.
    pub batch_invariant: bool,
}

/// Why the engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model file is missing or malformed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// llama.cpp refused the model or context.
    #[error("{0}")]
    Llama(String),
    /// Streaming cannot work for this model.
    #[error("{0}")]
    Unsupported(String),
    /// A request does not fit this session.
    #[error("{0}")]
    Request(String),
    /// Reading experts failed; the decode was abandoned and rolled back.
    #[error("{0}")]
    Stream(String),
    /// The request does not fit in the context window.
    #[error(
        "{needed} tokens (context {held} + prompt {prompt} + {n_predict} to generate) exceed the context size {n_ctx}"
    )]
    ContextFull {
        /// Tokens the request needs.
        needed: usize,
        /// Tokens already held.
        held: usize,
        /// New prompt tokens.
        prompt: usize,
        /// Tokens asked for.
        n_predict: u32,
        /// The context size.
        n_ctx: u32,
    },
    /// llama_decode failed.
    #[error("decode failed: {0}")]
    Decode(#[from] DecodeError),
}

/// How often a running session saves its route profile.
pub const PROFILE_SAVE_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

impl Drop for Session {
    fn drop(&mut self) {
        // Best effort: a profile that cannot be written is only a lost prior.
        if let Err(e) = self.save_route_profile() {
            eprintln!("bmoe: note: {e}");
        }
    }
}

/// What `open` found.
#[derive(Debug, Clone, Default)]
pub struct OpenReport {
    /// `general.architecture`.
    pub arch: String,
    /// Transformer layers.
    pub n_layer: u32,
    /// Experts per MoE layer (0 for a dense model).
    pub n_expert: u32,
    /// Experts routed per token (after any override).
    pub n_expert_used: u32,
    /// Whether routed experts stream from disk (`moe.stream` as decided).
    pub streaming: bool,
    /// Layers whose experts are streamed.
    pub streamed_layers: u32,
    /// The last layers, held by RPC servers (0 without servers).
    pub remote_layers: u32,
    /// Bytes of all streamed experts.
    pub bank_bytes: u64,
    /// The expert cache budget in effect (0 = no cache).
    pub cache_budget: u64,
    /// What a cache budget must leave room for (when streaming).
    pub holdings: Option<Holdings>,
    /// Bytes read from storage while opening (`/proc/self/io`), if known.
    pub open_read_bytes: Option<u64>,
    /// The process's peak resident set when the open finished (`VmHWM`), MiB.
    pub open_peak_rss_mib: Option<f64>,
    /// Read lanes.
    pub io_threads: usize,
    /// Whether reads use O_DIRECT.
    pub o_direct: bool,
    /// Whether reads go through io_uring into registered memory.
    pub io_uring: bool,
    /// Seconds to open.
    pub load_s: f64,
    /// Per-layer bytes of one expert and of the layer's other tensors.
    pub layers: Vec<LayerBytes>,
    /// Expert bank tensors computed with the CPU's repacked kernels.
    pub repacked_banks: u32,
    /// The route profile file this session reads or writes, if any.
    pub route_profile: Option<PathBuf>,
    /// Bytes the warm start began reading into the cache at open.
    pub warm_bytes: u64,
    /// Things the user should know (fallbacks, refusals, the cache budget).
    pub notices: Vec<String>,
    /// How streaming was set up (alignment, read-ahead, cache policy,
    /// dense weights): shown with `-v`.
    pub details: Vec<String>,
}

/// What a generation starts from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text, tokenized with the model's vocabulary (BOS added at the start of
    /// a conversation); with `continue_context` it is appended to what the
    /// session holds.
    Text(String),
    /// The whole conversation so far as tokens (a rendered chat template):
    /// the session keeps the longest prefix it already holds in its KV cache
    /// and decodes only the rest, so an earlier turn is never decoded twice
    /// and a template that rewrites history costs only the changed suffix.
    Tokens(Vec<i32>),
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Prompt {
        Prompt::Text(text.to_string())
    }
}

/// One generation request.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// What to start from.
    pub prompt: Prompt,
    /// Tokens to generate.
    pub n_predict: u32,
    /// Token selection.
    pub sampling: Sampling,
    /// With a text prompt: continue the conversation (keep the KV cache)
    /// instead of starting over. Token prompts always reuse what matches.
    pub continue_context: bool,
    /// Keep a copy of the logits each token was chosen from.
    pub keep_logits: bool,
    /// What the generated text must follow: a GBNF grammar (llama.cpp's
    /// grammar sampler) or a JSON schema (llguidance), each masking every
    /// token it does not allow; or none.
    pub constraint: Option<crate::llama::Constraint>,
}

/// The result of a generation.
#[derive(Debug, Clone, Default)]
pub struct Generation {
    /// Generated token ids.
    pub tokens: Vec<i32>,
    /// Generated text.
    pub text: String,
    /// The logits each token was chosen from (with `keep_logits`).
    pub logits: Vec<Vec<f32>>,
    /// Stopped by an abort request.
    pub aborted: bool,
    /// Stopped by an end-of-generation token.
    pub stopped_at_eog: bool,
    /// Prompt tokens the session already held and did not decode again.
    pub reused_tokens: usize,
    /// Plugins disabled during this generation, with the reason.
    pub notices: Vec<String>,
    /// Totals.
    pub summary: RunSummary,
}

/// Stops a running generation from another thread.
#[derive(Clone)]
pub struct AbortHandle(Arc<AtomicBool>);

impl AbortHandle {
    /// Requests the running generation to stop at the next graph node.
    pub fn abort(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// The flag itself, for raising from a signal handler (storing `true`
    /// is all [`AbortHandle::abort`] does).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// What one decode call decodes.
enum Batch<'a> {
    /// Tokens at the end of sequence 0's history (the one-conversation path).
    One {
        /// The tokens.
        tokens: &'a [i32],
        /// Which positions keep their logits.
        logits: Logits,
    },
    /// Parts of several sequences ([`Session::decode_seqs`]).
    Seqs(&'a [SeqPart<'a>]),
}

/// Wall time between the tuner's reads of the run queue and the other
/// processes' load (several `/proc` files each).
const TUNER_READ_NS: u64 = 1_000_000;

/// A loaded model ready to generate.
pub struct Session {
    /// When the route profile was last saved.
    profile_saved: Instant,
    /// How often a running session saves its route profile.
    profile_save_every: std::time::Duration,
    ctx: Context<MoeHook>,
    abort: Arc<AtomicBool>,
    options: SessionOptions,
    info: OpenReport,
    /// Tokens in the KV cache, in order.
    history: Vec<i32>,
    /// The last generated token, not yet decoded (fed first next turn).
    pending: Option<i32>,
    turn: u32,
    drafter: Option<Drafter>,
    draft_max: u32,
    /// Chooses the decode thread count and read-ahead, when either is tuned.
    tuner: Option<StepTuner>,
    /// Run-queue delay of the process's threads, read after each step
    /// (`None`: tune as if the kernel did not report it).
    run_queue: Option<RunQueueDelay>,
    /// Cores other processes keep busy, read after each step for the tuner.
    other_load: OtherLoad,
    /// Wall time since the tuner's figures (run queue, other load) were
    /// last read: they are read once at least [`TUNER_READ_NS`] passed.
    unread_ns: u64,
    /// The run-queue delay's share of the steps when last read.
    queued_share: Option<f64>,
    /// The thread count the context runs with now.
    ctx_threads: u32,
    /// Polling set by a test instead of by the tuner.
    force_polling: Option<bool>,
    /// The RPC servers holding layers, and this process's connections to them.
    remote: Vec<(String, rpc::ConnectionWatch)>,
    /// The tokens sequences 1.. hold, when several are decoded together
    /// (sequence 0's are `history`).
    other_seqs: Vec<Vec<i32>>,
    /// The context's spare sequence id (empty between calls), through which
    /// [`Session::seq_swap`] exchanges two sequences' cells; None where the
    /// session holds one sequence or its cells cannot be copied.
    spare_seq: Option<usize>,
}

impl Session {
    /// Tunes as if the kernel did not report run-queue delay, so the cores
    /// always count as contended and the tuner tries fewer threads too:
    /// lets a test see thread changes on a quiet machine.
    #[doc(hidden)]
    pub fn tune_as_if_contended(&mut self) {
        self.run_queue = None;
        self.queued_share = None;
        // And start with every thread, whatever else the machine runs.
        if let Some(tuner) = self.tuner.as_mut() {
            tuner.start_with_load(None);
        }
    }

    /// Makes the compute threads poll between graph splits (or not) on
    /// every step, whatever the tuner says: lets a test check that polling
    /// changes no result.
    #[doc(hidden)]
    pub fn force_polling(&mut self, on: bool) {
        self.force_polling = Some(on);
    }

    /// Whether decode steps read each layer's applied routing weights into
    /// their route rows (on by default; only route traces use them, and
    /// off saves a graph split per layer). No effect when not streaming.
    pub fn set_record_weights(&mut self, on: bool) {
        if let Some(h) = self.ctx.hook_mut() {
            h.set_record_weights(on);
        }
    }

    /// What open found.
    pub fn info(&self) -> &OpenReport {
        &self.info
    }

    /// The options the session was opened with.
    pub fn options(&self) -> &SessionOptions {
        &self.options
    }

    /// A handle that aborts the running generation.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.abort.clone())
    }

    /// Uses `drafter` for speculative decoding, drafting up to `draft_max`
    /// tokens per step (None turns it off).
    pub fn set_drafter(&mut self, drafter: Option<Drafter>, draft_max: u32) {
        self.drafter = drafter;
        self.draft_max = draft_max;
    }

    /// Asks `dropper` which routed experts to skip at every MoE layer of
    /// every decoded token (None turns it off). Needs streaming.
    pub fn set_dropper(&mut self, dropper: Option<Dropper>) -> Result<(), EngineError> {
        let Some(hook) = self.ctx.hook_mut() else {
            return Err(EngineError::Request("a drop plugin needs --moe-stream".into()));
        };
        if dropper.is_some() && !hook.can_drop() {
            return Err(EngineError::Unsupported(format!(
                "{}: a layer runs its expert matmuls before its final routing weights, so experts cannot be dropped",
                self.info.arch
            )));
        }
        hook.set_dropper(dropper);
        Ok(())
    }

    /// An error naming the RPC server that has gone, if one holding layers
    /// has: ggml ends the process at the next message to it, so nothing
    /// that touches the context may run, and the session stays usable for
    /// its other calls and for dropping.
    fn remote_gone(&self) -> Option<EngineError> {
        let (endpoint, _) = self.remote.iter().find(|(_, watch)| watch.closed())?;
        Some(EngineError::Request(format!(
            "the RPC server at {endpoint} has gone (it holds some of this model's layers); restart `bmoe rpc-server` \
             there and open the model again, or open it without --rpc"
        )))
    }

    /// Forgets the conversation (the expert cache stays warm).
    pub fn reset(&mut self) {
        // The remote part of the KV cache cannot be cleared once its server has gone.
        if self.remote_gone().is_none() {
            self.ctx.clear_kv();
        }
        self.history.clear();
        self.other_seqs.iter_mut().for_each(Vec::clear);
        self.pending = None;
    }

    /// Writes the routing this session learned into its model's route
    /// profile file (with `update`); returns the file written, `None` when
    /// there is nothing to write.
    pub fn save_route_profile(&mut self) -> Result<Option<PathBuf>, EngineError> {
        self.profile_saved = Instant::now();
        let Some(dir) = self.options.stream.as_ref().map(|s| s.route_profile.dir.clone()) else { return Ok(None) };
        let Some(learned) = self.store().and_then(|s| s.learned_profile()) else { return Ok(None) };
        if learned.is_empty() {
            return Ok(None);
        }
        let path = profile::profile_path(&dir, &learned.model);
        learned
            .save(&path)
            .map_err(|e| EngineError::Stream(format!("saving the route profile {}: {e}", path.display())))?;
        Ok(Some(path))
    }

    /// Sets how often the session saves its route profile while it runs
    /// ([`PROFILE_SAVE_EVERY`] unless set; tests shorten it).
    #[doc(hidden)]
    pub fn set_profile_save_every(&mut self, every: std::time::Duration) {
        self.profile_save_every = every;
    }

    /// Saves the route profile when the save interval has passed since the
    /// last save (long chat and serve sessions), before a generation; a
    /// failure is a notice for the caller, never the generation's error.
    fn save_route_profile_when_due(&mut self) -> Option<String> {
        if self.profile_saved.elapsed() < self.profile_save_every {
            return None;
        }
        self.save_route_profile().err().map(|e| e.to_string())
    }

    /// Runs one generation, reporting progress to `on_event`.
    pub fn generate(
        &mut self,
        req: &GenerateRequest,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<Generation, EngineError> {
        if let Some(failed) = self.save_route_profile_when_due() {
            on_event(Event::Notice(&failed));
        }
        self.abort.store(false, Ordering::Relaxed);
        if let Some(gone) = self.remote_gone() {
            return Err(gone);
        }
        if self.drafter.is_some() && req.sampling.temp > 0.0 {
            return Err(EngineError::Request(
                "speculative decoding verifies drafts against greedy argmax: use --temp 0 with --draft-plugin".into(),
            ));
        }
        if (self.drafter.is_some() || self.drafts_with_mtp()) && req.sampling.reshapes_logits() {
            return Err(EngineError::Request(
                "repetition penalties and a logit bias change the greedy choice drafts are verified against: turn \
                 them off, or the draft plugin or MTP"
                    .into(),
            ));
        }
        if self.drafts_with_mtp() && req.sampling.temp > 0.0 {
            return Err(EngineError::Request(
                "MTP drafts are verified against greedy argmax: use --temp 0 with --mtp".into(),
            ));
        }
        let model = self.ctx.model().clone();
        // Built before anything is decoded, so a refused grammar leaves the
        // session as it was.
        let mut sampler = match &req.constraint {
            Some(_) if self.drafts_with_mtp() => {
                return Err(EngineError::Request(
                    "a grammar and MTP drafting do not go together (drafts are verified against unconstrained greedy \
                     choices): turn one of them off"
                        .into(),
                ));
            }
            Some(_) if self.drafter.is_some() => {
                return Err(EngineError::Request(
                    "a grammar and a draft plugin do not go together (drafts are verified against unconstrained \
                     greedy choices): turn one of them off"
                        .into(),
                ));
            }
            constraint => {
                Sampler::constrained(&req.sampling, &model, constraint.as_ref()).map_err(EngineError::Request)?
            }
        };
        let (input, turn_start, old_pending, reused) = match &req.prompt {
            Prompt::Text(text) => {
                if !req.continue_context {
                    self.reset();
                }
                let turn_start = self.history.len();
                let old_pending = self.pending;
                let mut input: Vec<i32> = self.pending.take().into_iter().collect();
                input.extend(model.tokenize(text, self.history.is_empty() && input.is_empty()));
                (input, turn_start, old_pending, 0)
            }
            Prompt::Tokens(all) => {
                if all.len() + req.n_predict as usize > self.ctx.n_ctx() as usize {
                    return Err(self.context_full(0, all.len(), req.n_predict));
                }
                let kept = self.keep_common_prefix(all);
                (all[kept..].to_vec(), kept, None, kept)
            }
        };
        if input.is_empty() {
            return Err(EngineError::Request("the prompt is empty".into()));
        }
        let needed = self.history.len() + input.len() + req.n_predict as usize;
        if needed > self.ctx.n_ctx() as usize {
            self.pending = old_pending;
            return Err(self.context_full(self.history.len(), input.len(), req.n_predict));
        }
        let mut out = Generation {
            summary: RunSummary {
                load_s: self.info.load_s,
                streaming: self.options.stream.is_some(),
                cached: self.info.cache_budget > 0,
                speculative: self.drafter.is_some() || self.drafts_with_mtp(),
                dropping: self.ctx.hook_mut().is_some_and(|h| h.dropper_mut().is_some()),
                ..RunSummary::default()
            },
            reused_tokens: reused,
            ..Generation::default()
        };
        let turn = self.turn;
        self.turn += 1;

        // Prefill in batch-sized chunks; logits only after the last.
        let chunks: Vec<&[i32]> = input.chunks(self.options.batch as usize).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            let logits = if last { Logits::Last } else { Logits::None };
            match self.decode_step(chunk, logits, turn, Phase::Prefill, i as u32) {
                Ok(Some(report)) => {
                    out.summary.add(&report);
                    on_event(Event::Prefill(&report));
                }
                Ok(None) => {
                    self.abandon_turn(turn_start, old_pending);
                    out.aborted = true;
                    return Ok(out);
                }
                Err(e) => {
                    self.abandon_turn(turn_start, old_pending);
                    return Err(e);
                }
            }
        }

        let mut emit = Emitter { model: &model, utf8: Utf8Stream::default(), keep_logits: req.keep_logits, index: 0 };
        if self.drafter.is_some() || self.drafts_with_mtp() {
            self.decode_speculative(req, turn, &mut emit, &mut out, on_event)?;
        } else {
            self.decode_plain(req, turn, &mut sampler, &mut emit, &mut out, on_event)?;
        }
        let tail = emit.utf8.finish();
        out.text.push_str(&tail);
        self.drain_notices(&mut out, on_event);
        Ok(out)
    }

    /// Reports plugins that were disabled since the last call.
    fn drain_notices(&mut self, out: &mut Generation, on_event: &mut dyn FnMut(Event<'_>)) {
        let drafter = self.drafter.as_mut().and_then(Drafter::take_notice);
        let dropper = self.ctx.hook_mut().and_then(|h| h.dropper_mut()).and_then(Dropper::take_notice);
        for notice in drafter.into_iter().chain(dropper) {
            on_event(Event::Notice(&notice));
            out.notices.push(notice);
        }
    }

    /// The loaded model.
    pub fn model(&self) -> &Arc<crate::llama::Model> {
        self.ctx.model()
    }

    /// Vocabulary size of the model.
    pub fn n_vocab(&self) -> usize {
        self.ctx.model().n_vocab()
    }

    /// One token per decode: sample, emit, decode it.
    fn decode_plain(
        &mut self,
        req: &GenerateRequest,
        turn: u32,
        sampler: &mut Sampler<'_>,
        emit: &mut Emitter<'_>,
        out: &mut Generation,
        on_event: &mut dyn FnMut(Event<'_>),
    ) -> Result<(), EngineError> {
        for index in 0..req.n_predict {
            let logits = self.ctx.last_logits();
            let Some(token) = sampler.sample(logits) else {
                if let Some(why) = sampler.failure() {
                    return Err(EngineError::Request(why.to_string()));
                }
                // The grammar is complete and allows no end token: the text is done.
                out.stopped_at_eog = true;
                break;
            };
            if !emit.token(token, logits, out, on_event) {
                break;
            }
            if index + 1 == req.n_predict {
                self.pending = Some(token);
                break;
            }
            match self.decode_step(&[token], Logits::Last, turn, Phase::Decode, index + 1)? {
                Some(report) => {
                    out.summary.add(&report);
                    on_event(Event::Step(&report));
                    self.drain_notices(out, on_event);
                }
                None => {
                    // The token was shown; keep it in the conversation.
                    self.pending = Some(token);
                    out.aborted = true;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Decodes one batch at the end of the history. Returns None when the
    /// user aborted (the batch is rolled back); a streaming failure is
    /// rolled back too and returned as an error.
    fn decode_step(
        &mut self,
        tokens: &[i32],
        logits: Logits,
        turn: u32,
        phase: Phase,
        step: u32,
    ) -> Result<Option<StepReport>, EngineError> {
        self.decode_batch(Batch::One { tokens, logits }, turn, phase, step)
    }

    /// Decodes one batch: one sequence's tokens at the end of its history,
    /// or parts of several sequences. Returns None when the user aborted
    /// (the batch is rolled back); a streaming failure is rolled back too
    /// and returned as an error.
    fn decode_batch(
        &mut self,
        batch: Batch<'_>,
        turn: u32,
        phase: Phase,
        step: u32,
    ) -> Result<Option<StepReport>, EngineError> {
        if let Some(gone) = self.remote_gone() {
            return Err(gone);
        }
        let (first_pos, n_tokens) = match &batch {
            Batch::One { tokens, .. } => (self.history.len() as i32, tokens.len()),
            Batch::Seqs(parts) => {
                (parts.first().map_or(0, |p| p.first_pos), parts.iter().map(|p| p.tokens.len()).sum())
            }
        };
        if let Some(h) = self.ctx.hook_mut() {
            h.begin_batch(n_tokens as u32, phase == Phase::Decode);
        }
        let can_read_ahead = self.ctx.hook_mut().is_some_and(|h| h.read_ahead_active());
        // Once the cache holds the whole bank the lanes idle: tune without them.
        if let Some(tuner) = self.tuner.as_mut() {
            tuner.set_can_read_ahead(can_read_ahead);
        }
        // Before the first step: start with a thread for each core other
        // processes leave free.
        if let Some(tuner) = self.tuner.as_mut().filter(|t| t.wants_start_load()) {
            tuner.start_with_load(super::contention::others_running_now());
        }
        let setting = self.tuner.as_ref().map(StepTuner::setting);
        let threads = setting.map_or(self.options.threads, |s| s.threads);
        if threads != self.ctx_threads {
            self.ctx.set_threads(threads);
            self.ctx_threads = threads;
        }
        let polls = self.force_polling.unwrap_or_else(|| self.tuner.as_ref().is_some_and(StepTuner::polls));
        self.ctx.set_polling(polls);
        // Untuned, read-ahead runs whenever it is set up.
        let read_ahead = can_read_ahead && setting.is_none_or(|s| s.read_ahead);
        if let Some(h) = self.ctx.hook_mut() {
            h.pause_read_ahead(!read_ahead);
        }
        let t0 = Instant::now();
        let result = match &batch {
            Batch::One { tokens, logits } => self.ctx.decode(tokens, first_pos, *logits),
            Batch::Seqs(parts) => self.ctx.decode_parts(parts),
        };
        // The MTP drafter keeps the tokens and the hidden states this decode
        // left, for the draft context to take with the next draft.
        if self.drafts_with_mtp()
            && result.is_ok()
            && let Err(e) = self.ctx.mtp_follow()
        {
            self.undo_batch(&batch, first_pos);
            return Err(EngineError::Llama(e));
        }
        let wall_ns = t0.elapsed().as_nanos() as u64;
        // The remote part: from its start, seen by the hook when streaming,
        // to the end of the decode; without a hook, the wait after llama.cpp
        // returned (which misses what llama.cpp itself waited).
        let remote_ns = match self.ctx.hook_mut().and_then(MoeHook::take_remote_start) {
            Some(start) => start.elapsed().as_nanos() as u64,
            None => self.ctx.remote_wait_ns(),
        };
        let (trace, stream_error, budget, resident, residency) = match self.ctx.hook_mut() {
            Some(h) => {
                let (budget, resident) = h.store().map_or((0, 0), |s| (s.budget(), s.resident_bytes()));
                let residency = h.store().map(ExpertStore::resident_map).unwrap_or_default();
                (h.take_trace(), h.take_error(), budget, resident, residency)
            }
            None => (StepTrace::default(), None, 0, 0, Vec::new()),
        };
        if let Some(msg) = stream_error {
            self.undo_batch(&batch, first_pos);
            return Err(EngineError::Stream(msg));
        }
        match result {
            Ok(()) => {}
            Err(DecodeError::Aborted) => {
                self.undo_batch(&batch, first_pos);
                return Ok(None);
            }
            Err(e) => {
                self.undo_batch(&batch, first_pos);
                return Err(e.into());
            }
        }
        match &batch {
            Batch::One { tokens, .. } => self.history.extend_from_slice(tokens),
            Batch::Seqs(parts) => {
                for p in parts.iter() {
                    self.seq_history_mut(p.seq as usize).extend_from_slice(p.tokens);
                }
            }
        }
        // Single-token decode steps are alike enough to compare settings by.
        // The run queue is read only for a tuner (a few /proc reads a step).
        // Steps shorter than a millisecond share one read (a tiny model's
        // steps take a quarter of one, and the reads about a tenth).
        self.unread_ns += wall_ns;
        let mut others = None;
        if self.tuner.is_some() && self.unread_ns >= TUNER_READ_NS {
            let span = std::mem::take(&mut self.unread_ns);
            let queued = self.run_queue.as_mut().and_then(RunQueueDelay::since_last);
            self.queued_share = queued.map(|q| q as f64 / span.max(1) as f64);
            others = self.other_load.since_last();
        }
        let queued_ns = self.queued_share.map(|share| (share * wall_ns as f64) as u64);
        if let Some(tuner) = self.tuner.as_mut().filter(|_| phase == Phase::Decode && n_tokens == 1) {
            tuner.note_other_load(others);
            tuner.record(wall_ns, trace.read_ns, queued_ns);
        }
        Ok(Some(StepReport {
            turn,
            phase,
            step,
            first_pos,
            tokens: n_tokens as u32,
            wall_ns,
            trace,
            mem: MemSnapshot::now(),
            cache_budget: budget,
            cache_resident: resident,
            residency,
            drafted: 0,
            accepted: 0,
            threads,
            read_ahead,
            remote_ns,
        }))
    }

    /// Drops what a failed or stopped batch may have left in the KV cache.
    fn undo_batch(&mut self, batch: &Batch<'_>, first_pos: i32) {
        match batch {
            Batch::One { .. } => self.roll_back(first_pos),
            Batch::Seqs(parts) => {
                for p in parts.iter() {
                    self.roll_back_seq(p.seq as usize, p.first_pos);
                }
            }
        }
    }

    /// Returns the context to where it was before a turn's prompt.
    fn abandon_turn(&mut self, turn_start: usize, pending: Option<i32>) {
        self.roll_back(turn_start as i32);
        self.history.truncate(turn_start);
        self.pending = pending;
    }

    /// Keeps the longest prefix of `all` the session holds (its history and
    /// the undecoded last token), rolling the KV cache back to it; at least
    /// one token of `all` is left to decode, for the logits of the next.
    /// Returns how many tokens were kept.
    fn keep_common_prefix(&mut self, all: &[i32]) -> usize {
        let held = self.history.iter().chain(self.pending.iter());
        let common = held.zip(all).take_while(|(a, b)| a == b).count();
        let keep = common.min(all.len().saturating_sub(1));
        self.roll_back_to(keep);
        // A matching undecoded token is decoded as part of the input.
        self.pending = None;
        self.history.len()
    }

    /// The error for a request that does not fit in the context.
    fn context_full(&self, held: usize, prompt: usize, n_predict: u32) -> EngineError {
        EngineError::ContextFull {
            needed: held + prompt + n_predict as usize,
            held,
            prompt,
            n_predict,
            n_ctx: self.ctx.n_ctx(),
        }
    }

    /// Changes the expert cache budget between generations (lossless: the
    /// cache decides only what is read again). Needs streaming with the
    /// cache on.
    /// A fixed budget is checked as at open (refused below one token's
    /// working set unless forced). Returns the evictions.
    pub fn set_cache_budget(&mut self, budget: CacheBudget) -> Result<u64, EngineError> {
        let not_streaming = || EngineError::Request("not streaming: there is no expert cache".into());
        let held = self.info.holdings.ok_or_else(not_streaming)?;
        let decision = budget::decide(budget, &held, &MemoryLimits::read()).map_err(EngineError::Request)?;
        let store = self.ctx.hook_mut().and_then(|h| h.store_mut()).ok_or_else(not_streaming)?;
        let evicted = store.set_budget(decision.bytes).map_err(|e| EngineError::Request(e.to_string()))?;
        self.info.cache_budget = decision.bytes;
        self.info.notices.extend(decision.note);
        Ok(evicted)
    }

    /// The number the next generation's turn will carry in reports.
    pub fn next_turn(&self) -> u32 {
        self.turn
    }

    /// Continues turn numbering from `turn` (a reopened session that writes
    /// to the same telemetry files).
    pub fn continue_turns_from(&mut self, turn: u32) {
        self.turn = turn;
    }

    /// Context size in tokens.
    pub fn n_ctx(&self) -> u32 {
        self.ctx.n_ctx()
    }

    /// Tokens the session holds (decoded, plus the last generated token,
    /// which is decoded with the next turn).
    pub fn context_len(&self) -> usize {
        self.history.len() + usize::from(self.pending.is_some())
    }

    /// The tokens the session holds, in order: its KV cache's, then the
    /// last generated token, which is decoded with the next turn.
    pub fn held_tokens(&self) -> Vec<i32> {
        self.history.iter().chain(self.pending.iter()).copied().collect()
    }

    /// Tokenizes text that continues a conversation: special tokens
    /// parsed, no BOS.
    pub fn tokenize_continuation(&self, text: &str) -> Vec<i32> {
        self.ctx.model().tokenize(text, false)
    }

    /// Tokenizes a rendered chat prompt: special tokens parsed, and BOS
    /// added only where the vocabulary wants one and the template did not
    /// already write it (no doubled BOS).
    pub fn tokenize_rendered(&self, text: &str) -> Vec<i32> {
        self.ctx.model().tokenize_rendered(text)
    }

    /// The text of the vocabulary's BOS and EOS tokens (empty when absent).
    pub fn special_texts(&self) -> (String, String) {
        let model = self.ctx.model();
        let text = |t: Option<i32>| t.map(|t| String::from_utf8_lossy(&model.token_bytes(t)).into_owned());
        (text(model.bos()).unwrap_or_default(), text(model.eos()).unwrap_or_default())
    }

    /// Forgets the KV cache and history from position `pos` on.
    fn roll_back_to(&mut self, pos: usize) {
        if pos < self.history.len() {
            self.roll_back(pos as i32);
            self.history.truncate(pos);
        }
    }

    /// Drops whatever a failed decode may have left past `pos`, so the
    /// session stays usable.
    fn roll_back(&mut self, pos: i32) {
        self.abort.store(false, Ordering::Relaxed);
        if !self.ctx.truncate_kv(pos) {
            // The cache cannot drop a tail (e.g. some sliding-window layouts): start over.
            self.ctx.clear_kv();
            self.history.clear();
        }
        self.pending = None;
    }

    /// Whether the session drafts with the model's MTP layers.
    pub fn drafts_with_mtp(&self) -> bool {
        self.ctx.has_mtp()
    }

    /// Whether the session decodes speculatively (a draft plugin or MTP).
    pub fn drafts(&self) -> bool {
        self.drafter.is_some() || self.drafts_with_mtp()
    }

    /// The expert store, when streaming (for tests and diagnostics).
    pub fn store(&mut self) -> Option<&mut ExpertStore> {
        self.ctx.hook_mut().and_then(|h| h.store_mut())
    }

    /// The eval hook, when streaming (for tests and diagnostics).
    #[doc(hidden)]
    pub fn hook_mut(&mut self) -> Option<&mut MoeHook> {
        self.ctx.hook_mut()
    }
}

/// Hands generated tokens to the caller: text, events, end-of-generation.
struct Emitter<'m> {
    model: &'m Model,
    utf8: Utf8Stream,
    keep_logits: bool,
    /// Tokens emitted so far.
    index: u32,
}

impl Emitter<'_> {
    /// Emits `token` (chosen from `logits`); false when it ends the generation.
    fn token(&mut self, token: i32, logits: &[f32], out: &mut Generation, on_event: &mut dyn FnMut(Event<'_>)) -> bool {
        if self.keep_logits {
            out.logits.push(logits.to_vec());
        }
        if self.model.is_eog(token) {
            out.stopped_at_eog = true;
            return false;
        }
        out.tokens.push(token);
        out.summary.generated += 1;
        let text = self.utf8.push(&self.model.token_bytes(token));
        out.text.push_str(&text);
        on_event(Event::Token { index: self.index, token, text: &text });
        self.index += 1;
        true
    }
}

/// Joins token bytes into valid UTF-8, holding back an incomplete character.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    held: Vec<u8>,
}

impl Utf8Stream {
    /// Adds a token's bytes; returns the text now complete.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.held.extend_from_slice(bytes);
        match std::str::from_utf8(&self.held) {
            Ok(s) => {
                let s = s.to_string();
                self.held.clear();
                s
            }
            Err(e) if e.error_len().is_none() => {
                // An incomplete sequence at the end: emit what is complete.
                let valid = e.valid_up_to();
                let s = String::from_utf8_lossy(&self.held[..valid]).into_owned();
                self.held.drain(..valid);
                s
            }
            Err(_) => {
                // Invalid bytes: show them as replacement characters.
                let s = String::from_utf8_lossy(&self.held).into_owned();
                self.held.clear();
                s
            }
        }
    }

    /// Whatever is held, invalid bytes replaced.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.held).into_owned();
        self.held.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8Stream;

    #[test]
    fn utf8_stream_holds_partial_characters() {
        let mut u = Utf8Stream::default();
        let e = "é".as_bytes();
        assert_eq!(u.push(b"a"), "a");
        assert_eq!(u.push(&e[..1]), "");
        assert_eq!(u.push(&e[1..]), "é");
        assert_eq!(u.push(&[0xff]), "\u{fffd}");
        assert_eq!(u.push(&e[..1]), "");
        assert_eq!(u.finish(), "\u{fffd}");
    }
}
