//! The HTTP endpoints: each reads its body (capped in size and time),
//! checks the key, queues the request on the engine and answers whole or
//! as server-sent events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::engine::{Engine, Finished, Job, Out, Status, Ticket};
use super::error::{ApiError, Dialect};
use super::reply::{self, ChatChunks, CompletionChunks, Header};
use super::request::{self, Parsed, Work};

/// How long a client may take to send its body once its headers arrived.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of an oversized body read (and dropped) before answering 413.
const DRAIN_LIMIT: usize = 64 << 20;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The engine thread's side.
    pub engine: Arc<Engine>,
    /// The key clients must send, if any.
    pub api_key: Option<String>,
    /// Largest body, in bytes.
    pub body_limit: usize,
}

/// The origins allowed to call the API from a browser app served
/// elsewhere (CORS): none, any, or a list.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Cors {
    /// Same-origin only (the chat page at `/`).
    #[default]
    None,
    /// Any origin (`*`).
    Any,
    /// These origins (`scheme://host[:port]`).
    Origins(Vec<HeaderValue>),
}

impl Cors {
    /// Reads `serve.cors`: comma-separated origins, `*`, or empty.
    pub fn parse(text: &str) -> Result<Cors, String> {
        let items: Vec<&str> = text.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        if items.is_empty() {
            return Ok(Cors::None);
        }
        if items == ["*"] {
            return Ok(Cors::Any);
        }
        let origin = |s: &str| {
            let (scheme, rest) = s.split_once("://").unwrap_or(("", ""));
            let ok = matches!(scheme, "http" | "https") && !rest.is_empty() && !rest.contains('/');
            ok.then(|| HeaderValue::from_str(s).ok()).flatten().ok_or_else(|| {
                format!("serve.cors: `{s}` is not an origin (scheme://host[:port], e.g. http://localhost:3000, or *)")
            })
        };
        items.into_iter().map(origin).collect::<Result<_, _>>().map(Cors::Origins)
    }

    /// The layer that answers preflights and marks responses, if any.
    fn layer(&self) -> Option<tower_http::cors::CorsLayer> {
        use tower_http::cors::{AllowOrigin, CorsLayer};
        let origins = match self {
            Cors::None => return None,
            Cors::Any => AllowOrigin::any(),
            Cors::Origins(list) => AllowOrigin::list(list.clone()),
        };
        Some(
            CorsLayer::new()
                .allow_origin(origins)
                .allow_methods([Method::GET, Method::POST])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    // Anthropic's clients send these.
                    header::HeaderName::from_static("x-api-key"),
                    header::HeaderName::from_static("anthropic-version"),
                    header::HeaderName::from_static("anthropic-beta"),
                ])
                .max_age(Duration::from_secs(600)),
        )
    }
}

/// The router of every endpoint, answering `cors` origins.
pub fn router(state: AppState, cors: &Cors) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/models/{id}", get(model))
        .route("/metrics", get(metrics))
        .route("/bmoe/model", get(model_shape))
        .route("/bmoe/events", get(events))
        .route("/v1/messages", post(super::anthropic::messages))
        .route("/v1/messages/count_tokens", post(super::anthropic::count_tokens))
        .route("/v1/responses", post(super::responses::create))
        .route("/responses", post(super::responses::create))
        .route("/api/chat", post(super::ollama::chat))
        .route("/api/generate", post(super::ollama::generate))
        .route("/api/tags", get(super::ollama::tags))
        .route("/api/show", post(super::ollama::show))
        .route("/api/ps", get(super::ollama::ps))
        .route("/api/version", get(super::ollama::version))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), check_key));
    let router = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/", get(page))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(access_log));
    let router = match cors.layer() {
        Some(layer) => router.layer(layer),
        None => router,
    };
    router.with_state(state)
}

async fn method_not_allowed(request: Request) -> Response {
    let path = request.uri().path();
    ApiError::method_not_allowed(request.method().as_str(), path).response_in(Dialect::of_path(path))
}

/// A request's line in the access log: what was asked and when.
#[derive(Debug, Clone)]
pub(super) struct Access {
    method: String,
    path: String,
    started: Instant,
}

/// Tokens of a reply, put on its response for the access log.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tokens {
    prompt: u64,
    generated: u64,
}

impl Access {
    /// Writes the line to stderr (unless `-q`): method, path, status,
    /// prompt and generated tokens, milliseconds.
    fn log(&self, status: u16, tokens: Option<Tokens>) {
        if crate::notes::verbosity() == crate::notes::Verbosity::Quiet {
            return;
        }
        let tokens = tokens.map_or_else(|| "-".to_string(), |t| format!("{}+{}", t.prompt, t.generated));
        let ms = self.started.elapsed().as_secs_f64() * 1e3;
        eprintln!("bmoe serve: {} {} {status} tokens {tokens} {ms:.0} ms", self.method, self.path);
    }
}

/// Logs each request once its answer is ready; a streamed answer is
/// logged by its stream when it ends.
async fn access_log(mut request: Request, next: Next) -> Response {
    let access = Access {
        method: request.method().to_string(),
        path: request.uri().path().to_string(),
        started: Instant::now(),
    };
    request.extensions_mut().insert(access.clone());
    let response = next.run(request).await;
    let streamed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == b"text/event-stream" || v.as_bytes() == NDJSON.as_bytes());
    if !streamed || response.status() != StatusCode::OK {
        access.log(response.status().as_u16(), response.extensions().get::<Tokens>().copied());
    }
    response
}

/// Refuses a request without the server's key (when it has one): sent
/// as `Authorization: Bearer KEY`, or as `x-api-key: KEY` (Anthropic's).
async fn check_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let headers = request.headers();
        let bearer = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        // The scheme's name is case-insensitive (RFC 7235).
        let bearer = bearer.and_then(|v| v.split_once(' ')).filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
        let bearer = bearer.map(|(_, token)| token.trim());
        let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim);
        if bearer != Some(key.as_str()) && x_api_key != Some(key.as_str()) {
            let endpoint = request.uri().path().to_string();
            state.engine.metrics.request(&endpoint, 401);
            return ApiError::unauthorized().response_in(Dialect::of_path(&endpoint));
        }
    }
    next.run(request).await
}

async fn not_found(request: Request) -> Response {
    let path = request.uri().path();
    ApiError::not_found(path).response_in(Dialect::of_path(path))
}

/// `GET /health`: 200 once the model is ready, 503 before (or if it failed).
async fn health(State(state): State<AppState>) -> Response {
    match state.engine.status() {
        Status::Ready(_) => Json::ok(json!({"status": "ok"})),
        Status::Loading => {
            (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "loading model"}))).into_response()
        }
        Status::Failed(e) => ApiError::unavailable(format!("the model failed to load: {e}")).into_response(),
    }
}

/// The chat page.
async fn page() -> Html<&'static str> {
    Html(super::PAGE)
}

/// The model object of the model served as `id`: OpenAI's fields, and
/// Anthropic's (`type`, `display_name`, `created_at`) beside them.
fn model_object(state: &AppState, id: String) -> Value {
    let n_ctx = state.engine.n_ctx();
    let (parallel, kv_bytes) = state.engine.kv_memory();
    let created_at = state.engine.about()["modified_at"].as_str().unwrap_or("").to_string();
    let meta = json!({"n_ctx": n_ctx, "n_parallel": parallel, "kv_cache_bytes": kv_bytes});
    json!({
        "id": id, "object": "model", "created": 0, "owned_by": "bmoe", "meta": meta,
        "type": "model", "display_name": id, "created_at": created_at,
    })
}

/// `GET /v1/models`: the one model (a list as OpenAI's and Anthropic's
/// clients read it).
async fn models(State(state): State<AppState>) -> Response {
    let answer = state.engine.ready().map(|id| {
        json!({
            "object": "list", "data": [model_object(&state, id.clone())],
            "has_more": false, "first_id": id, "last_id": id,
        })
    });
    respond(&state, "/v1/models", answer.map(Json::ok))
}

/// `GET /v1/models/{id}`: the model, when `id` is its id.
async fn model(State(state): State<AppState>, Path(asked): Path<String>) -> Response {
    let answer = state.engine.ready().and_then(|id| {
        if asked == id { Ok(Json::ok(model_object(&state, id))) } else { Err(ApiError::no_model(&asked, &id)) }
    });
    respond(&state, "/v1/models/{id}", answer)
}

/// `GET /bmoe/model`: the model's layers and experts, for the page.
async fn model_shape(State(state): State<AppState>) -> Response {
    let answer = state.engine.ready().map(|id| {
        let mut shape = state.engine.shape();
        shape["id"] = json!(id);
        Json::ok(shape)
    });
    respond(&state, "/bmoe/model", answer)
}

/// `GET /bmoe/events`: every decode step's telemetry as server-sent
/// events, while the client listens (a client too slow to keep up misses
/// steps rather than holding the engine back).
async fn events(State(state): State<AppState>) -> Response {
    let mut steps = state.engine.steps.subscribe();
    let (tx, events) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        loop {
            let step = match steps.recv().await {
                Ok(step) => step,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            if tx.send(Ok(Event::default().event("step").data(step))).await.is_err() {
                return;
            }
        }
    });
    Sse::new(tokio_stream::wrappers::ReceiverStream::new(events)).keep_alive(KeepAlive::default()).into_response()
}

/// `GET /metrics`: Prometheus text.
async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.engine.metrics.render(state.engine.waiting());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// `POST /v1/chat/completions`.
async fn chat(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let (body, model) = body_and_model(&state, &headers, body).await?;
        let parsed = request::chat(&body, &state.engine.config, state.engine.default_max_tokens)?;
        let parsed = prepare(&state, parsed).await?;
        let openings = call_openings(&state, &parsed);
        let stream = parsed.stream;
        let include_usage = parsed.include_usage;
        let header = Header::new("chatcmpl", model)
            .reporting(parsed.logprobs.is_some(), parsed.logits_digest)
            .seeded(parsed.settings.sampling.seed);
        let rx = submit(&state, parsed)?;
        if stream {
            let mut chunks = ChatChunks::new(header, &openings);
            Ok(sse(rx, access, move |out| match out {
                Out::Started => Vec::new(),
                Out::Token(t) => chunks.token(t),
                Out::Text(kind, text) => chunks.text(kind, &text),
                Out::Done(Ok(f)) => chunks.finish(&f, include_usage),
                Out::Done(Err(e)) => vec![e.body()],
            }))
        } else {
            let f = finished(rx).await?;
            Ok(with_tokens(Json::ok(reply::chat_completion(&header, &f)), &f))
        }
    };
    let answer = answer.await;
    respond(&state, "/v1/chat/completions", answer)
}

/// `POST /v1/completions`.
async fn completion(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let body = read_json(&headers, body, state.body_limit).await?;
        let model = state.engine.ready()?;
        let read = request::completion(&body, &state.engine.config, state.engine.default_max_tokens)?;
        for p in &read {
            state.engine.refuse_oversized(p)?;
        }
        let mut prompts = Vec::with_capacity(read.len());
        for p in read {
            prompts.push(state.engine.prepare(p).await?);
        }
        let first = &prompts[0];
        let (stream, include_usage) = (first.stream, first.include_usage);
        let header = Header::new("cmpl", model)
            .reporting(first.logprobs.is_some(), first.logits_digest)
            .seeded(first.settings.sampling.seed);
        if stream {
            // A streamed completion has one prompt (request::completion).
            let rx = submit(&state, prompts.remove(0))?;
            let mut chunks = CompletionChunks::new(header);
            Ok(sse(rx, access, move |out| match out {
                Out::Started => Vec::new(),
                Out::Token(t) => chunks.token(t),
                Out::Text(_, text) => chunks.text(&text),
                Out::Done(Ok(f)) => chunks.finish(&f, include_usage),
                Out::Done(Err(e)) => vec![e.body()],
            }))
        } else {
            // One choice per prompt: each is a request of its own, decoded
            // beside the others.
            let receivers: Vec<_> = prompts.into_iter().map(|p| submit(&state, p)).collect::<Result<_, _>>()?;
            let mut replies = Vec::with_capacity(receivers.len());
            for rx in receivers {
                replies.push(finished(rx).await?);
            }
            let total = Finished::total(&replies);
            Ok(with_tokens(Json::ok(reply::text_completion(&header, &replies, &total)), &total))
        }
    };
    let answer = answer.await;
    respond(&state, "/v1/completions", answer)
}

/// `response` marked with the reply's tokens, for the access log.
pub(super) fn with_tokens(mut response: Response, f: &Finished) -> Response {
    response.extensions_mut().insert(Tokens { prompt: f.prompt_tokens, generated: f.completion_tokens });
    response
}

/// Counts the answer's status and turns an error into its response.
fn respond(state: &AppState, endpoint: &str, answer: Result<Response, ApiError>) -> Response {
    respond_in(state, endpoint, Dialect::OpenAi, answer)
}

/// [`respond`] with errors in `dialect`'s shape.
pub(super) fn respond_in(
    state: &AppState,
    endpoint: &str,
    dialect: Dialect,
    answer: Result<Response, ApiError>,
) -> Response {
    let response = answer.unwrap_or_else(|e| e.response_in(dialect));
    state.engine.metrics.request(endpoint, response.status().as_u16());
    response
}

/// JSON with status 200.
pub(super) struct Json;

impl Json {
    /// `value` as a 200 answer.
    pub(super) fn ok(value: Value) -> Response {
        axum::Json(value).into_response()
    }
}

/// Reads a body of at most `limit` bytes within [`BODY_TIMEOUT`] and
/// parses it as JSON; a body declared larger is refused before it is read.
pub(super) async fn read_json(headers: &HeaderMap, body: Body, limit: usize) -> Result<Value, ApiError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        // Answered now; the body is still read (and dropped) behind the
        // answer, up to DRAIN_LIMIT, so a client that sends it all before
        // it reads gets the 413 rather than a broken connection.
        tokio::spawn(tokio::time::timeout(BODY_TIMEOUT, read_body(body, 0)));
        return Err(ApiError::too_large(limit));
    }
    let bytes = match tokio::time::timeout(BODY_TIMEOUT, read_body(body, limit)).await {
        Err(_) => return Err(ApiError::bad_request("the request body did not arrive in time")),
        Ok(result) => result?,
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// The body's bytes, or 413 past `limit`. A body somewhat over the limit
/// is read to its end (and dropped) before the answer, so the client,
/// still sending, gets the 413 rather than a reset connection; past
/// [`DRAIN_LIMIT`] the connection is simply closed.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt as _;
    let mut body = body;
    let mut kept = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        seen += data.len();
        if seen <= limit {
            kept.extend_from_slice(&data);
        } else if seen > DRAIN_LIMIT {
            break;
        }
    }
    if seen > limit {
        return Err(ApiError::too_large(limit));
    }
    Ok(Bytes::from(kept))
}

/// A request's body, read as JSON, and the id of the model that will
/// answer it (an error while the model is not ready).
pub(super) async fn body_and_model(
    state: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Value, String), ApiError> {
    let body = read_json(headers, body, state.body_limit).await?;
    Ok((body, state.engine.ready()?))
}

/// `parsed` checked against the context and prepared (its prompt rendered
/// and counted on a thread of its own): what every endpoint does before it
/// queues a request.
pub(super) async fn prepare(state: &AppState, parsed: Parsed) -> Result<Parsed, ApiError> {
    state.engine.refuse_oversized(&parsed)?;
    state.engine.prepare(parsed).await
}

/// The texts a reply's tool calls begin with, when its request shows tools.
pub(super) fn call_openings(state: &AppState, parsed: &Parsed) -> Vec<&'static str> {
    match &parsed.work {
        Work::Chat(w) if w.tools.is_some() => state.engine.tool_openings(),
        _ => Vec::new(),
    }
}

/// A queued request's output, and its place among the requests in flight.
pub(super) struct Pending {
    rx: UnboundedReceiver<Out>,
    _ticket: Ticket,
}

/// Queues `parsed`; the receiver of its output.
pub(super) fn submit(state: &AppState, parsed: Parsed) -> Result<Pending, ApiError> {
    let (out, rx) = unbounded_channel();
    let ticket = state.engine.submit(Job { request: parsed, out, received: Instant::now() })?;
    Ok(Pending { rx, _ticket: ticket })
}

/// Waits for the finished reply.
pub(super) async fn finished(pending: Pending) -> Result<Box<Finished>, ApiError> {
    finished_watching(pending, |_| {}).await
}

/// Waits for the finished reply, showing `watch` each piece of output.
pub(super) async fn finished_watching(
    mut pending: Pending,
    mut watch: impl FnMut(&Out),
) -> Result<Box<Finished>, ApiError> {
    while let Some(out) = pending.rx.recv().await {
        watch(&out);
        if let Out::Done(result) = out {
            return result;
        }
    }
    Err(ApiError::internal("the engine stopped before the reply was complete"))
}

/// Streams the engine's output as server-sent events, each `chunks` turns
/// into one `data:` line, ending with `data: [DONE]`. A client that goes
/// away drops the stream, and with it the receiver: the engine stops.
fn sse(pending: Pending, access: Access, mut chunks: impl FnMut(Out) -> Vec<Value> + Send + 'static) -> Response {
    let events = move |out: Out| {
        let done = matches!(out, Out::Done(_));
        let mut events: Vec<Event> = chunks(out).into_iter().map(|c| Event::default().data(c.to_string())).collect();
        if done {
            events.push(Event::default().data("[DONE]"));
        }
        events
    };
    sse_events(pending, access, events)
}

/// Streams the engine's output as the server-sent events `events` makes
/// of each piece (named or not), ending after those of [`Out::Done`].
pub(super) fn sse_events(
    pending: Pending,
    access: Access,
    mut events: impl FnMut(Out) -> Vec<Event> + Send + 'static,
) -> Response {
    let (tx, stream) = tokio::sync::mpsc::channel::<Result<Event, Infallible>>(64);
    tokio::spawn(async move {
        // The whole of `pending` lives in the task: its ticket counts the
        // request in flight until the stream ends.
        let Pending { mut rx, _ticket } = pending;
        let mut log = StreamLog { access, written: false };
        while let Some(out) = rx.recv().await {
            let done = log.if_done(&out);
            for event in events(out) {
                if tx.send(Ok(event)).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(stream);
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

/// Named server-sent events: each `(name, data)` as `event: name` and
/// its data as JSON (Anthropic's and the Responses API's streams).
pub(super) fn named(events: Vec<(&'static str, Value)>) -> Vec<Event> {
    events.into_iter().map(|(name, data)| Event::default().event(name).data(data.to_string())).collect()
}

/// Newline-delimited JSON's media type (Ollama's streams).
pub(super) const NDJSON: &str = "application/x-ndjson";

/// Streams the engine's output as newline-delimited JSON: one line per
/// object `lines` makes of each piece, ending after those of [`Out::Done`].
pub(super) fn ndjson(
    pending: Pending,
    access: Access,
    mut lines: impl FnMut(Out) -> Vec<Value> + Send + 'static,
) -> Response {
    let (tx, stream) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(64);
    tokio::spawn(async move {
        let Pending { mut rx, _ticket } = pending;
        let mut log = StreamLog { access, written: false };
        while let Some(out) = rx.recv().await {
            let done = log.if_done(&out);
            for line in lines(out) {
                let mut text = line.to_string();
                text.push('\n');
                if tx.send(Ok(Bytes::from(text))).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(stream));
    ([(header::CONTENT_TYPE, NDJSON)], body).into_response()
}

/// A stream's access-log line, written once: when its reply ends, or, if
/// the client leaves first, as the stream is dropped, with status 499 (the
/// client closed the request, as nginx writes it).
struct StreamLog {
    access: Access,
    written: bool,
}

impl StreamLog {
    /// Writes the line when `out` ends the reply; whether it does.
    fn if_done(&mut self, out: &Out) -> bool {
        let Out::Done(result) = out else { return false };
        let tokens = result.as_ref().ok().map(|f| Tokens { prompt: f.prompt_tokens, generated: f.completion_tokens });
        self.access.log(result.as_ref().map_or_else(|e| e.status.as_u16(), |_| 200), tokens);
        self.written = true;
        true
    }
}

impl Drop for StreamLog {
    fn drop(&mut self) {
        if !self.written {
            self.access.log(CLIENT_CLOSED, None);
        }
    }
}

/// The status an access-log line gives a stream its client left (nginx's).
const CLIENT_CLOSED: u16 = 499;
