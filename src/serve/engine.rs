//! The engine thread of the server: it opens the model, then runs queued
//! requests on the session host one at a time, sending each request's text
//! as it is generated to the handler that waits for it. A request whose
//! client went away is skipped, or stopped at its next step.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::logprobs::TokenLogprob;
use super::metrics::Metrics;
use super::request::{CompletionPrompt, Parsed, Work};
use crate::chat::{Kind, ToolCall};
use crate::config::RunConfig;
use crate::host::{Host, HostError, HostEvent, Prompter};

/// What the engine sends a waiting handler.
#[derive(Debug)]
pub enum Out {
    /// The request left the queue and its prompt is being read.
    Started,
    /// Generated text: reasoning or answer.
    Text(Kind, String),
    /// A generated token's log-probability (when the request asked).
    Token(TokenLogprob),
    /// The request is done.
    Done(Result<Box<Finished>, ApiError>),
}

/// A finished reply.
#[derive(Debug, Clone, Default)]
pub struct Finished {
    /// The reasoning, markers removed.
    pub reasoning: String,
    /// The answer (tool calls removed), or the completion's text.
    pub answer: String,
    /// The calls the reply made.
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    /// The stop string that ended a chat reply, if one did.
    pub stop_sequence: Option<String>,
    /// Tokens of the prompt (reused and decoded).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
    /// Each generated token's log-probability (when asked).
    pub logprobs: Vec<TokenLogprob>,
    /// Each step's logits digest (when asked).
    pub logits_digest: Vec<u64>,
}

impl Finished {
    /// The token counts of `replies` together.
    pub fn total(replies: &[Box<Finished>]) -> Finished {
        Finished {
            prompt_tokens: replies.iter().map(|f| f.prompt_tokens).sum(),
            completion_tokens: replies.iter().map(|f| f.completion_tokens).sum(),
            ..Finished::default()
        }
    }
}

/// One queued request.
pub struct Job {
    /// The request, read.
    pub request: Parsed,
    /// Where its output goes; closed when the client went away.
    pub out: UnboundedSender<Out>,
    /// When it was received.
    pub received: Instant,
}

/// Whether the model can answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Opening the model.
    Loading,
    /// Ready to answer (shared: every request reads it).
    Ready(Arc<Ready>),
    /// Opening failed (said in every answer).
    Failed(String),
}

/// What a ready server knows of its model.
#[derive(Debug, PartialEq)]
pub struct Ready {
    /// The model's id in `/v1/models`.
    pub model_id: String,
    /// Context size in tokens.
    pub n_ctx: u32,
    /// The texts the template's tool calls begin with (none: bmoe does
    /// not read its call format).
    pub tool_openings: Vec<&'static str>,
    /// What the page's routing panel needs to know of the model.
    pub shape: serde_json::Value,
    /// The longest token's bytes: a text of `n` bytes is at least
    /// `n / max_token_bytes` tokens.
    pub max_token_bytes: usize,
    /// The model file's size, date and details, as Ollama's listings
    /// give them.
    pub about: serde_json::Value,
    /// Tokens in the vocabulary.
    pub n_vocab: usize,
    /// Requests decoded at once, each with a context of `n_ctx`.
    pub parallel: usize,
    /// Bytes of the KV caches llama.cpp allocated for them all.
    pub kv_bytes: u64,
}

/// The engine's side shared with the HTTP handlers.
pub struct Engine {
    jobs: SyncSender<Job>,
    status: Mutex<Status>,
    waiting: AtomicUsize,
    queue: usize,
    /// Requests accepted and not yet answered (queued or running).
    in_flight: AtomicUsize,
    /// Set when the server is stopping: new requests are refused.
    draining: AtomicBool,
    /// Set when the grace period is over: running requests end now.
    stopping: AtomicBool,
    /// Renders and tokenizes prompts on the requests' side (set once the
    /// model is open).
    prompter: OnceLock<Arc<Prompter>>,
    /// The server's counters.
    pub metrics: Metrics,
    /// Each decode step's telemetry as JSON, for `/bmoe/events` (the page's
    /// routing panel); sent only while someone listens.
    pub steps: tokio::sync::broadcast::Sender<String>,
    /// The configuration requests are read against.
    pub config: RunConfig,
    /// The token limit of a request that sets none (`None`: the room left
    /// in the context).
    pub default_max_tokens: Option<u32>,
}

impl Engine {
    /// Starts the engine thread, which opens the model with `open` and then
    /// serves `options.parallel` requests at once (decoded together) with
    /// up to `options.queue` more waiting.
    pub fn start(
        config: RunConfig,
        options: &super::ServeOptions,
        open: impl FnOnce() -> Result<Host, String> + Send + 'static,
    ) -> std::io::Result<Arc<Engine>> {
        let (queue, slots) = (options.queue, options.parallel);
        let (jobs, inbox) = std::sync::mpsc::sync_channel(queue.max(1));
        let engine = Arc::new(Engine {
            jobs,
            status: Mutex::new(Status::Loading),
            waiting: AtomicUsize::new(0),
            queue: queue.max(1),
            in_flight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            prompter: OnceLock::new(),
            metrics: Metrics::default(),
            steps: tokio::sync::broadcast::channel(64).0,
            config,
            default_max_tokens: options.default_max_tokens,
        });
        let shared = engine.clone();
        std::thread::Builder::new().name("bmoe-engine".into()).spawn(move || {
            // Counted from here: the caches this open allocates.
            crate::llama::take_kv_cache_bytes();
            let opened = open();
            match opened {
                Ok(mut host) => {
                    let kv_bytes = crate::llama::take_kv_cache_bytes();
                    let model_id = model_id(host.model());
                    let tool_openings = host.chat_format().tool_format().map(|f| f.openings()).unwrap_or_default();
                    let info = host.info();
                    let shape = serde_json::json!({
                        "arch": info.arch, "n_layer": info.n_layer, "n_expert": info.n_expert,
                        "n_expert_used": info.n_expert_used, "streaming": host.info().streaming,
                        "cache_budget_mib": info.cache_budget as f64 / 1048576.0,
                    });
                    let about = super::ollama::describe(host.model(), &info.arch);
                    let n_ctx = host.slot_ctx();
                    let model = host.session_mut().model().clone();
                    let max_token_bytes =
                        (0..model.n_vocab()).map(|t| model.token_bytes(t as i32).len()).max().unwrap_or(1).max(1);
                    // Without a prompter (it compiles the template again, which
                    // worked once already) the engine prepares prompts itself.
                    if let Ok(prompter) = host.prompter() {
                        let _ = shared.prompter.set(Arc::new(prompter));
                    }
                    let n_vocab = model.n_vocab();
                    shared.set_status(Status::Ready(Arc::new(Ready {
                        model_id,
                        n_ctx,
                        tool_openings,
                        shape,
                        max_token_bytes,
                        about,
                        n_vocab,
                        parallel: slots,
                        kv_bytes,
                    })));
                    // Drafts are verified one sequence at a time, by the host.
                    if host.session_mut().drafts() {
                        run(host, &inbox, &shared);
                    } else {
                        super::slots::run(host, &inbox, &shared, slots);
                    }
                }
                Err(e) => shared.set_status(Status::Failed(e)),
            }
        })?;
        Ok(engine)
    }

    /// Whether the model can answer now.
    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn set_status(&self, status: Status) {
        *self.status.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// Refuses a request whose prompt cannot fit in a slot's context, from
    /// its size alone (before the engine thread renders or tokenizes it: a
    /// many-megabyte prompt refused anyway holds up no other request).
    /// A `logit_bias` naming a token outside the vocabulary is refused here
    /// too.
    pub fn refuse_oversized(&self, request: &Parsed) -> Result<(), ApiError> {
        let Status::Ready(ready) = self.status() else { return Ok(()) };
        let (n_ctx, max_token_bytes, n_vocab) = (ready.n_ctx, ready.max_token_bytes, ready.n_vocab);
        if let Some(&(token, _)) = request.settings.sampling.logit_bias.iter().find(|(t, _)| *t as usize >= n_vocab) {
            return Err(ApiError::bad_param(
                "logit_bias",
                format!("token {token} is not in the vocabulary (ids 0 to {})", n_vocab - 1),
            ));
        }
        let at_least = match &request.work {
            Work::Chat(work) => {
                let c = &work.conversation;
                let bytes = c.system.as_ref().map_or(0, String::len)
                    + c.messages
                        .iter()
                        .map(|m| m.content.len() + m.reasoning.as_ref().map_or(0, String::len))
                        .sum::<usize>();
                bytes / max_token_bytes
            }
            Work::Complete { prompt: CompletionPrompt::Text(text) } => text.len() / max_token_bytes,
            Work::Complete { prompt: CompletionPrompt::Tokens(ids) } => ids.len(),
        };
        if at_least + 1 > n_ctx as usize {
            return Err(ApiError::context_full(format!(
                "the prompt is at least {at_least} tokens, more than the context's {n_ctx}: shorten it, or start the \
                 server with a larger --ctx-size"
            )));
        }
        Ok(())
    }

    /// Renders and tokenizes `request`'s prompt on a blocking thread (never
    /// the engine's: a long prompt holds up no decoding), then refuses it
    /// when it cannot fit a slot's context. A prompt of token ids is taken
    /// as it is.
    pub async fn prepare(&self, mut request: Parsed) -> Result<Parsed, ApiError> {
        let Some(prompter) = self.prompter.get().cloned() else { return Ok(request) };
        if matches!(request.work, Work::Complete { prompt: CompletionPrompt::Tokens(_) }) {
            return Ok(request);
        }
        let request = tokio::task::spawn_blocking(move || -> Result<Parsed, ApiError> {
            let prepared = match &request.work {
                Work::Chat(work) => prompter
                    .chat(
                        &work.conversation.rendered_messages(),
                        request.settings.think,
                        work.tools.clone(),
                        work.effort.clone(),
                    )
                    .map_err(host_error)?,
                Work::Complete { prompt: CompletionPrompt::Text(text) } => prompter.completion(text),
                Work::Complete { prompt: CompletionPrompt::Tokens(_) } => return Ok(request),
            };
            request.prepared = Some(prepared);
            Ok(request)
        })
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))??;
        if let (Status::Ready(ready), Some(prepared)) = (self.status(), &request.prepared)
            && prepared.tokens.len() + 2 > ready.n_ctx as usize
        {
            let n_ctx = ready.n_ctx;
            return Err(host_error(HostError::ContextFull { needed: prepared.tokens.len() + 2, n_ctx }));
        }
        Ok(request)
    }

    /// Requests waiting for the engine (not the one running).
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// The model's id, or the error to answer while it is not ready.
    pub fn ready(&self) -> Result<String, ApiError> {
        match self.status() {
            Status::Ready(ready) => Ok(ready.model_id.clone()),
            Status::Loading => Err(ApiError::unavailable("the model is still loading: try again shortly")),
            Status::Failed(e) => Err(ApiError::unavailable(format!("the model failed to load: {e}"))),
        }
    }

    /// The texts the model's tool calls begin with.
    pub fn tool_openings(&self) -> Vec<&'static str> {
        match self.status() {
            Status::Ready(ready) => ready.tool_openings.clone(),
            _ => Vec::new(),
        }
    }

    /// The model file's size, date and details (null until it is ready).
    pub fn about(&self) -> serde_json::Value {
        match self.status() {
            Status::Ready(ready) => ready.about.clone(),
            _ => serde_json::Value::Null,
        }
    }

    /// Requests decoded at once and the bytes of their KV caches (0 until
    /// the model is ready).
    pub fn kv_memory(&self) -> (usize, u64) {
        match self.status() {
            Status::Ready(ready) => (ready.parallel, ready.kv_bytes),
            _ => (0, 0),
        }
    }

    /// A request's context in tokens (0 until the model is ready).
    pub fn n_ctx(&self) -> u32 {
        match self.status() {
            Status::Ready(ready) => ready.n_ctx,
            _ => 0,
        }
    }

    /// What the page's routing panel needs to know of the model (null
    /// until it is ready).
    pub fn shape(&self) -> serde_json::Value {
        match self.status() {
            Status::Ready(ready) => ready.shape.clone(),
            _ => serde_json::Value::Null,
        }
    }

    /// Takes `job` off the queue to run it now: false (and counted as
    /// cancelled) when its client has gone.
    pub(super) fn admit(&self, job: &Job) -> bool {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        if job.out.is_closed() {
            self.metrics.cancelled();
            return false;
        }
        self.metrics.queued_for(job.received.elapsed());
        let _ = job.out.send(Out::Started);
        true
    }

    /// Refuses new requests from now on (503): the server is stopping.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Ends the requests still running, each with an error saying why.
    pub fn stop_running(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// Whether running requests are to end now.
    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Requests accepted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// The error a request ended by the server's stop gets.
    pub(super) fn stopped_error() -> ApiError {
        ApiError::unavailable("the server was stopped before the reply was complete")
    }

    /// Queues a request; 429 when the queue is full, 503 while the server
    /// stops. The ticket counts it as in flight until it is dropped.
    pub fn submit(self: &Arc<Self>, job: Job) -> Result<Ticket, ApiError> {
        self.ready()?;
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                Ok(Ticket(self.clone()))
            }
            Err(TrySendError::Full(_)) => {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(ApiError::queue_full(self.queue))
            }
            Err(TrySendError::Disconnected(_)) => {
                self.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(ApiError::unavailable("the engine has stopped"))
            }
        }
    }
}

/// A request in flight, from its submission until its answer is sent.
pub struct Ticket(Arc<Engine>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The name a model goes by: its file name without `.gguf`, and for a
/// split set without the shard's `-00001-of-0000N`.
fn model_id(path: &std::path::Path) -> String {
    let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let name = crate::hub::set_of(&name);
    name.strip_suffix(".gguf").map(str::to_string).unwrap_or(name)
}

/// Runs jobs one at a time, each through the host (speculative
/// decoding), until every sender is gone.
fn run(mut host: Host, inbox: &Receiver<Job>, engine: &Engine) {
    while let Ok(job) = inbox.recv() {
        if !engine.admit(&job) {
            continue;
        }
        // A reply the server's stop cut short ends with the error saying so.
        let result = answer(&mut host, &job, engine);
        let result = if engine.stopping() { Err(Engine::stopped_error()) } else { result };
        if job.out.is_closed() {
            engine.metrics.cancelled();
        }
        if let Ok(f) = &result {
            engine.metrics.finished(f.prompt_tokens, f.completion_tokens);
        }
        let _ = job.out.send(Out::Done(result.map(Box::new)));
    }
}

/// Runs one request on the host.
fn answer(host: &mut Host, job: &Job, engine: &Engine) -> Result<Finished, ApiError> {
    let abort = host.abort_handle();
    let out = &job.out;
    let mut on_event = |event: HostEvent<'_>| {
        match event {
            HostEvent::Text { kind, text } if !text.is_empty() => {
                let _ = out.send(Out::Text(kind, text.to_string()));
            }
            HostEvent::Step(report) | HostEvent::Prefill(report) => {
                engine.metrics.step(report);
                if engine.steps.receiver_count() > 0 {
                    let _ = engine.steps.send(step_json(report));
                }
            }
            _ => {}
        }
        // The client went away, or the server stops: stop at the next graph node.
        if out.is_closed() || engine.stopping() {
            abort.abort();
        }
    };
    if job.request.logprobs.is_some() || job.request.logits_digest {
        return Err(ApiError::bad_request(
            "logprobs and logits digests are not reported while the server decodes speculatively (a draft plugin \
             or MTP): start it without them",
        ));
    }
    let settings = &job.request.settings;
    match &job.request.work {
        Work::Chat(work) => {
            host.show_for_request(work.tools.clone(), work.effort.clone());
            let prepared = job.request.prepared.clone();
            let turn =
                host.reply_to(work.conversation.clone(), prepared, settings, &mut on_event).map_err(host_error)?;
            let summary = &turn.generation.summary;
            Ok(Finished {
                reasoning: turn.reasoning,
                answer: turn.answer,
                tool_calls: turn.tool_calls,
                finish_reason: finish_reason(turn.ending.reason),
                stop_sequence: turn.stop_sequence,
                prompt_tokens: summary.prompt_tokens + turn.generation.reused_tokens as u64,
                completion_tokens: turn.generation.tokens.len() as u64,
                ..Finished::default()
            })
        }
        Work::Complete { prompt: CompletionPrompt::Tokens(_) } => Err(ApiError::bad_param(
            "prompt",
            "token-id prompts are not taken while the server decodes speculatively (a draft plugin or MTP)",
        )),
        Work::Complete { prompt: CompletionPrompt::Text(prompt) } => {
            let prepared = job.request.prepared.clone();
            let generation = host.complete_with(prompt, prepared, settings, &mut on_event).map_err(host_error)?;
            let reason = host.last_ending().map_or(crate::host::FinishReason::Stop, |e| e.reason);
            Ok(Finished {
                answer: generation.text.clone(),
                finish_reason: finish_reason(reason),
                prompt_tokens: generation.summary.prompt_tokens + generation.reused_tokens as u64,
                completion_tokens: generation.tokens.len() as u64,
                ..Finished::default()
            })
        }
    }
}

/// One step's telemetry for the routing panel: its phase, timings split
/// into read / cache / compute, the cache's hits, evictions and size, the
/// slots a drop plugin skipped, the experts the batch's last token routed
/// to per layer (with whether each was cached), and which experts the
/// cache holds (`1`/`0` per layer and expert).
pub(super) fn step_json(r: &crate::engine::StepReport) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    // The batch's last token: a prompt chunk's first token skips the last
    // layer (only the last position's output is needed there).
    let last = r.trace.rows.iter().map(|row| row.token).max().unwrap_or(0);
    let routes: Vec<[u64; 3]> = r
        .trace
        .rows
        .iter()
        .filter(|row| row.token == last)
        .map(|row| [u64::from(row.layer), u64::from(row.expert), u64::from(row.hit)])
        .collect();
    let residency: String = r.residency.iter().map(|&held| if held { '1' } else { '0' }).collect();
    serde_json::json!({
        "phase": if r.phase == crate::engine::Phase::Prefill { "prefill" } else { "decode" },
        "tokens": r.tokens,
        "wall_ms": ms(r.wall_ns),
        "read_ms": ms(r.trace.read_ns),
        "cache_ms": ms(r.trace.mgmt_ns),
        "bytes_read": r.trace.bytes_read,
        "lookups": r.trace.lookups,
        "hits": r.trace.hits,
        "evictions": r.trace.evictions,
        "dropped": r.trace.dropped,
        "cache_mib": r.cache_resident as f64 / 1048576.0,
        "threads": r.threads,
        "routes": routes,
        "residency": residency,
    })
    .to_string()
}

/// OpenAI's name for how a reply ended (a stopped one was stopped by its
/// client, which no longer reads it).
pub(super) fn finish_reason(reason: crate::host::FinishReason) -> &'static str {
    match reason {
        crate::host::FinishReason::Aborted => "stop",
        other => other.as_str(),
    }
}

/// The answer for a turn the host refused or failed.
pub(super) fn host_error(e: HostError) -> ApiError {
    match e {
        HostError::ContextFull { needed, n_ctx } => ApiError::context_full(format!(
            "the prompt needs {needed} tokens with room for a reply, more than the context's {n_ctx}: shorten the \
             conversation, or start the server with a larger --ctx-size"
        )),
        HostError::Template(_) | HostError::Setting(_) => ApiError::bad_request(e.to_string()),
        HostError::Engine(crate::engine::EngineError::Request(m)) => ApiError::bad_request(m),
        HostError::Engine(crate::engine::EngineError::ContextFull { needed, n_ctx, .. }) => {
            host_error(HostError::ContextFull { needed, n_ctx })
        }
        HostError::Engine(e) => ApiError::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_model_goes_by_its_sets_name() {
        assert_eq!(model_id(std::path::Path::new("/m/BF16/Tiny-BF16-00001-of-00002.gguf")), "Tiny-BF16");
        assert_eq!(model_id(std::path::Path::new("Qwen3-30B-A3B-Q4_K_M.gguf")), "Qwen3-30B-A3B-Q4_K_M");
    }
}
