//! Ollama's own API, as Open WebUI, Continue and the `ollama` package speak
//! it: `/api/chat` and `/api/generate` (newline-delimited JSON streams by
//! default, `options` mapped to the sampler, `format`, tools, `think`),
//! and the model listings `/api/tags`, `/api/show`, `/api/ps` and
//! `/api/version`. One model is served: every name reaches it.

use std::path::Path;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::deltas::{Delta, Deltas};
use super::engine::{Finished, Out};
use super::error::{ApiError, Dialect};
use super::request::{self, ChatWork, CompletionPrompt, Parsed, Work};
use super::routes::{self, Access, AppState, Json};
use crate::chat::{Conversation, Message, ToolCall};
use crate::config::RunConfig;
use crate::host::TurnSettings;

/// The Ollama version whose API this layer follows (`/api/version`).
pub const API_VERSION: &str = "0.12.0";

/// Options that choose how a model is loaded, which `bmoe serve` sets when
/// it starts: accepted, with no effect on a request.
const LOAD_OPTIONS: [&str; 12] = [
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "numa",
    "num_keep",
];

/// Sampler options bmoe does not have: refused by name.
const REFUSED_OPTIONS: [&str; 5] = ["tfs_z", "mirostat", "mirostat_tau", "mirostat_eta", "penalize_newline"];

/// The sampler options taken.
const SAMPLER_OPTIONS: [&str; 12] = [
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "num_predict",
    "stop",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
];

/// `POST /api/chat`.
pub async fn chat(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let (body, model) = routes::body_and_model(&state, &headers, body).await?;
        let name = body.get("model").and_then(Value::as_str).unwrap_or(&model).to_string();
        if body.get("messages").and_then(Value::as_array).is_some_and(Vec::is_empty) {
            return Ok(Json::ok(loaded(&name, "message")));
        }
        let parsed = parse_chat(&body, &state.engine.config, state.engine.default_max_tokens)?;
        run(&state, access, parsed, Reply { name, field: Field::Message }).await
    };
    let answer = answer.await;
    routes::respond_in(&state, "/api/chat", Dialect::Ollama, answer)
}

/// `POST /api/generate`.
pub async fn generate(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let (body, model) = routes::body_and_model(&state, &headers, body).await?;
        let name = body.get("model").and_then(Value::as_str).unwrap_or(&model).to_string();
        if body.get("prompt").is_none_or(|p| p.as_str() == Some("")) {
            return Ok(Json::ok(loaded(&name, "response")));
        }
        let parsed = parse_generate(&body, &state.engine.config, state.engine.default_max_tokens)?;
        run(&state, access, parsed, Reply { name, field: Field::Response }).await
    };
    let answer = answer.await;
    routes::respond_in(&state, "/api/generate", Dialect::Ollama, answer)
}

/// The answer to a request with nothing to generate: Ollama loads the
/// model and says so (`done_reason` `load`).
fn loaded(name: &str, field: &str) -> Value {
    let mut object = json!({"model": name, "created_at": now(), "done": true, "done_reason": "load"});
    object[field] = if field == "message" { json!({"role": "assistant", "content": ""}) } else { json!("") };
    object
}

/// Runs `parsed` and answers whole or as a stream of lines.
async fn run(state: &AppState, access: Access, parsed: Parsed, reply: Reply) -> Result<Response, ApiError> {
    let parsed = routes::prepare(state, parsed).await?;
    let openings = routes::call_openings(state, &parsed);
    let (stream, digest) = (parsed.stream, parsed.logits_digest);
    let mut clock = Clock::new();
    let pending = routes::submit(state, parsed)?;
    if stream {
        let mut lines = Lines { reply, deltas: Deltas::new(&openings), clock, digest };
        Ok(routes::ndjson(pending, access, move |out| lines.next(out)))
    } else {
        let f = routes::finished_watching(pending, |out| clock.saw(out)).await?;
        let mut object = reply.object(reply.whole(&f));
        reply.close(&mut object, &f, &clock, digest);
        Ok(routes::with_tokens(Json::ok(object), &f))
    }
}

/// A request's `options` over the server's settings.
fn options(body: &Value, settings: &mut TurnSettings) -> Result<(), ApiError> {
    let options = match body.get("options") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(ApiError::bad_param("options", "`options` must be an object")),
    };
    let options = Value::Object(options.clone());
    for (key, _) in options.as_object().into_iter().flatten() {
        let known = SAMPLER_OPTIONS.contains(&key.as_str()) || LOAD_OPTIONS.contains(&key.as_str());
        if REFUSED_OPTIONS.contains(&key.as_str()) {
            return Err(ApiError::bad_param(
                &format!("options.{key}"),
                format!("option `{key}` is not supported by this server"),
            ));
        }
        if !known {
            return Err(ApiError::bad_param(&format!("options.{key}"), format!("unknown option `{key}`")));
        }
    }
    let named = |e: ApiError| ApiError { param: e.param.map(|p| format!("options.{p}")), ..e };
    if let Some(t) = request::number_in(&options, "temperature", 0.0, 2.0).map_err(named)? {
        settings.sampling.temp = t as f32;
    }
    if let Some(p) = request::number_in(&options, "top_p", 0.0, 1.0).map_err(named)? {
        settings.sampling.top_p = p as f32;
    }
    if let Some(k) = request::integer_in(&options, "top_k", 0, i64::from(i32::MAX)).map_err(named)? {
        settings.sampling.top_k = k as i32;
    }
    if let Some(seed) = request::integer_in(&options, "seed", i64::MIN, i64::MAX).map_err(named)? {
        settings.sampling.seed = seed.rem_euclid(1 << 32) as u32;
    }
    // -1 (no limit) and -2 (until the context is full) leave the server's limit.
    if let Some(n) = request::integer_in(&options, "num_predict", -2, i64::from(u32::MAX)).map_err(named)? {
        if n == 0 {
            return Err(ApiError::bad_param("options.num_predict", "`num_predict` must be -2, -1 or at least 1"));
        }
        if n > 0 {
            settings.n_predict = n as u32;
        }
    }
    settings.stop = request::stop_strings(options.get("stop"), "options.stop")?;
    let number = |field: &str| request::number_in(&options, field, f64::MIN, f64::MAX).map_err(named);
    let given = request::Penalties {
        min_p: number("min_p")?,
        typical_p: number("typical_p")?,
        repeat_penalty: number("repeat_penalty")?,
        repeat_last_n: request::integer_in(&options, "repeat_last_n", i64::MIN, i64::MAX).map_err(named)?,
        frequency_penalty: number("frequency_penalty")?,
        presence_penalty: number("presence_penalty")?,
    };
    request::penalties(&mut settings.sampling, given, "options.")
}

/// `think`: true or false, or an effort (`low`, `medium`, `high`).
fn think(body: &Value, config: &RunConfig) -> Result<(bool, Option<String>), ApiError> {
    let effort = Some(config.chat.reasoning_effort.clone()).filter(|e| !e.is_empty());
    match body.get("think") {
        None | Some(Value::Null) => Ok((config.chat.think, effort)),
        Some(Value::Bool(on)) => Ok((*on, effort)),
        Some(Value::String(level)) if ["low", "medium", "high"].contains(&level.as_str()) => {
            Ok((true, Some(level.clone())))
        }
        Some(other) => {
            Err(ApiError::bad_param("think", format!("`think` must be true, false, low, medium or high (got {other})")))
        }
    }
}

/// `format`: `json`, or a JSON schema.
fn format(body: &Value, settings: &mut TurnSettings) -> Result<(), ApiError> {
    let spec = match body.get("format") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::String(s)) if s.is_empty() => return Ok(()),
        Some(Value::String(s)) if s == "json" => json!({"type": "json_object"}),
        Some(schema @ Value::Object(_)) => json!({"type": "json_schema", "json_schema": {"schema": schema}}),
        Some(other) => {
            return Err(ApiError::bad_param(
                "format",
                format!("`format` must be \"json\" or a JSON schema (got {other})"),
            ));
        }
    };
    settings.constraint =
        request::response_schema(&spec).map_err(|e| ApiError { param: Some("format".into()), ..e })?;
    Ok(())
}

/// The fields both endpoints share: options, format, think, stream.
fn common(
    body: &Value,
    config: &RunConfig,
    default_max: Option<u32>,
) -> Result<(TurnSettings, Option<String>, bool, bool), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let mut settings = request::base_settings(config, default_max);
    options(body, &mut settings)?;
    format(body, &mut settings)?;
    let (on, effort) = think(body, config)?;
    settings.think = on;
    // Ollama streams unless told not to.
    let stream = request::bool_field(body, "stream")?.unwrap_or(true);
    let digest = request::bool_field(body, "logits_digest")?.unwrap_or(false);
    Ok((settings, effort, stream, digest))
}

/// Reads an `/api/chat` body.
pub fn parse_chat(body: &Value, config: &RunConfig, default_max: Option<u32>) -> Result<Parsed, ApiError> {
    let (settings, effort, stream, digest) = common(body, config, default_max)?;
    let tools = request::checked_tools(request::tool_list(body)?, "tools")?;
    let conversation = conversation(body.get("messages"))?;
    // Ollama's API has no tool_choice: the server's (`chat.tool_choice`) holds.
    let mut settings = settings;
    settings.require_call = tools.is_some() && config.chat.tool_choice == "required";
    Ok(request::chat_request(ChatWork { conversation, tools, effort }, settings, stream, digest))
}

/// Reads an `/api/generate` body: the prompt as a user message under
/// `system`, or (`raw`) as it is.
pub fn parse_generate(body: &Value, config: &RunConfig, default_max: Option<u32>) -> Result<Parsed, ApiError> {
    request::refuse_fields(body, &["suffix", "template", "context", "images"])?;
    let (settings, effort, stream, digest) = common(body, config, default_max)?;
    let prompt = body.get("prompt").and_then(Value::as_str);
    let prompt = prompt.ok_or_else(|| ApiError::bad_param("prompt", "`prompt` must be text"))?.to_string();
    let system = match body.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()).filter(|s| !s.is_empty()),
        Some(_) => return Err(ApiError::bad_param("system", "`system` must be text")),
    };
    let raw = request::bool_field(body, "raw")?.unwrap_or(false);
    if raw {
        if system.is_some() {
            return Err(ApiError::bad_param("system", "a `raw` prompt takes no `system` (it is sent as it is)"));
        }
        return Ok(Parsed {
            work: Work::Complete { prompt: CompletionPrompt::Text(prompt) },
            settings,
            stream,
            include_usage: false,
            logprobs: None,
            logits_digest: digest,
            prepared: None,
        });
    }
    let conversation = Conversation { system, messages: vec![Message::new("user", &prompt)] };
    Ok(request::chat_request(ChatWork { conversation, tools: None, effort }, settings, stream, digest))
}

/// `messages` as a conversation: a leading system message is its system
/// prompt; an assistant's `thinking` is its reasoning; a tool message's
/// `tool_name` names the function it answers.
fn conversation(messages: Option<&Value>) -> Result<Conversation, ApiError> {
    let list = messages.and_then(Value::as_array);
    let list = list.ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a list"))?;
    if list.len() > request::MAX_MESSAGES {
        return Err(ApiError::bad_param(
            "messages",
            format!("more than the {} messages this server reads", request::MAX_MESSAGES),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let text = |field: &str| -> Result<String, ApiError> {
            match m.get(field) {
                None | Some(Value::Null) => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(ApiError::bad_param(&at, format!("`{field}` must be text"))),
            }
        };
        if m.get("images").and_then(Value::as_array).is_some_and(|a| !a.is_empty()) {
            return Err(ApiError::bad_param(&at, "images are not supported by this server (text only)"));
        }
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !["system", "user", "assistant", "tool"].contains(&role) {
            return Err(ApiError::bad_param(&at, format!("unknown role `{role}` (system, user, assistant or tool)")));
        }
        let mut message = Message::new(role, &text("content")?);
        message.reasoning = Some(text("thinking")?).filter(|t| !t.is_empty());
        message.reasoning_key = Some(crate::chat::ReasoningKey::Thinking);
        message.name = Some(text("tool_name")?).filter(|t| !t.is_empty());
        message.tool_call_id = Some(text("tool_call_id")?).filter(|t| !t.is_empty());
        for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let function = call.get("function").unwrap_or(&Value::Null);
            let name = function.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
            let name = name.ok_or_else(|| ApiError::bad_param(&at, "a tool call needs `function.name`"))?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(_) => return Err(ApiError::bad_param(&at, "a tool call's `arguments` must be an object")),
            };
            let id = call.get("id").and_then(Value::as_str).map(str::to_string);
            message.tool_calls.push(ToolCall::new(id, name, arguments));
        }
        message.content_null = message.content.is_empty() && !message.tool_calls.is_empty();
        out.push(message);
    }
    if out.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    let system = (out[0].role == "system").then(|| out.remove(0).content);
    Ok(Conversation { system, messages: out })
}

/// Now as Ollama writes times (RFC 3339, UTC).
fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// When a request's prompt began and its first text came.
struct Clock {
    received: Instant,
    started: Option<Instant>,
    first: Option<Instant>,
}

impl Clock {
    fn new() -> Clock {
        Clock { received: Instant::now(), started: None, first: None }
    }

    fn saw(&mut self, out: &Out) {
        match out {
            Out::Started => self.started = Some(Instant::now()),
            Out::Text(..) | Out::Token(_) if self.first.is_none() => self.first = Some(Instant::now()),
            _ => {}
        }
    }

    /// Ollama's durations, in nanoseconds: total, prompt, generation.
    fn durations(&self) -> (u128, u128, u128) {
        let end = Instant::now();
        let started = self.started.unwrap_or(self.received);
        let first = self.first.unwrap_or(end);
        (
            end.duration_since(self.received).as_nanos(),
            first.duration_since(started).as_nanos(),
            end.duration_since(first).as_nanos(),
        )
    }
}

/// Which field carries the text: `message` (chat) or `response` (generate).
#[derive(Clone, Copy, PartialEq)]
enum Field {
    Message,
    Response,
}

/// How one reply's objects are written.
struct Reply {
    /// The model name the client asked for (Ollama echoes it).
    name: String,
    field: Field,
}

impl Reply {
    /// An object carrying `body` (a message, or response and thinking).
    fn object(&self, body: Vec<(&'static str, Value)>) -> Value {
        let mut object = json!({"model": self.name, "created_at": now()});
        match self.field {
            Field::Message => {
                let mut message = json!({"role": "assistant", "content": ""});
                for (k, v) in body {
                    message[k] = v;
                }
                object["message"] = message;
            }
            Field::Response => {
                object["response"] = json!("");
                for (k, v) in body {
                    // `generate` carries no calls (it shows no tools).
                    if k != "tool_calls" {
                        object[if k == "content" { "response" } else { k }] = v;
                    }
                }
            }
        }
        object["done"] = json!(false);
        object
    }

    /// The whole reply's fields.
    fn whole(&self, f: &Finished) -> Vec<(&'static str, Value)> {
        let mut body = vec![("content", json!(f.answer))];
        if !f.reasoning.is_empty() {
            body.push(("thinking", json!(f.reasoning)));
        }
        if !f.tool_calls.is_empty() {
            body.push(("tool_calls", calls(&f.tool_calls)));
        }
        body
    }

    /// Marks `object` as the last: the reason, counts and durations.
    fn close(&self, object: &mut Value, f: &Finished, clock: &Clock, digest: bool) {
        let (total, prompt, generation) = clock.durations();
        object["done"] = json!(true);
        object["done_reason"] = json!(if f.finish_reason == "length" { "length" } else { "stop" });
        object["total_duration"] = json!(total as u64);
        object["load_duration"] = json!(0);
        object["prompt_eval_count"] = json!(f.prompt_tokens);
        object["prompt_eval_duration"] = json!(prompt as u64);
        object["eval_count"] = json!(f.completion_tokens);
        object["eval_duration"] = json!(generation as u64);
        if digest {
            object["logits_digest"] = f.logits_digest.iter().map(|d| format!("{d:016x}")).collect();
        }
    }
}

/// Calls as Ollama writes them: arguments as an object.
fn calls(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            json!({
                "id": c.id.clone().unwrap_or_else(|| format!("call_{i}")),
                "function": {"index": i, "name": c.function.name, "arguments": c.function.arguments_object()},
            })
        })
        .collect()
}

/// Turns a reply's output into stream lines.
struct Lines {
    reply: Reply,
    deltas: Deltas,
    clock: Clock,
    digest: bool,
}

impl Lines {
    fn next(&mut self, out: Out) -> Vec<Value> {
        self.clock.saw(&out);
        match out {
            Out::Started | Out::Token(_) => Vec::new(),
            Out::Text(kind, text) => match self.deltas.text(kind, &text) {
                Some(Delta::Reasoning(t)) => vec![self.reply.object(vec![("thinking", json!(t))])],
                Some(Delta::Answer(t)) => vec![self.reply.object(vec![("content", json!(t))])],
                None => Vec::new(),
            },
            Out::Done(Ok(f)) => {
                let mut lines = Vec::new();
                if let Some(rest) = self.deltas.rest(&f) {
                    lines.push(self.reply.object(vec![("content", json!(rest))]));
                }
                if !f.tool_calls.is_empty() && self.reply.field == Field::Message {
                    lines.push(self.reply.object(vec![("tool_calls", calls(&f.tool_calls))]));
                }
                let mut last = self.reply.object(Vec::new());
                self.reply.close(&mut last, &f, &self.clock, self.digest);
                lines.push(last);
                lines
            }
            Out::Done(Err(e)) => vec![e.body_in(Dialect::Ollama)],
        }
    }
}

/// What `/api/tags`, `/api/show` and `/api/ps` say of the model file at
/// `path`: its size, when it was written, and Ollama's `details`.
pub fn describe(path: &Path, arch: &str) -> Value {
    let files = crate::gguf::ModelFiles::open(path).ok();
    let size = files.as_ref().map_or(0, |f| f.total_bytes());
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let modified = modified.map(|t| chrono::DateTime::<chrono::Utc>::from(t).to_rfc3339()).unwrap_or_default();
    let (mut params, mut by_type) = (0u64, std::collections::BTreeMap::<&'static str, u64>::new());
    for t in files.iter().flat_map(|f| f.tensors()) {
        params += t.info.elements();
        *by_type.entry(t.info.ty.name()).or_default() += t.info.size;
    }
    // The type most of the bytes are in (Ollama names the file's quantization).
    let quant = by_type.iter().max_by_key(|(_, bytes)| **bytes).map_or("", |(name, _)| *name);
    let parameter_size = match params {
        p if p >= 1_000_000_000 => format!("{:.1}B", p as f64 / 1e9),
        p => format!("{:.1}M", p as f64 / 1e6),
    };
    json!({
        "size": size, "modified_at": modified, "parameter_count": params,
        "details": {
            "parent_model": "", "format": "gguf", "family": arch, "families": [arch],
            "parameter_size": parameter_size, "quantization_level": quant,
        },
    })
}

/// The model's entry in `/api/tags` and `/api/ps`.
fn entry(state: &AppState, id: &str) -> Value {
    let about = state.engine.about();
    json!({
        "name": id, "model": id, "modified_at": about["modified_at"], "size": about["size"],
        "digest": "", "details": about["details"],
    })
}

/// `GET /api/tags`: the one model.
pub async fn tags(State(state): State<AppState>) -> Response {
    let answer = state.engine.ready().map(|id| Json::ok(json!({"models": [entry(&state, &id)]})));
    routes::respond_in(&state, "/api/tags", Dialect::Ollama, answer)
}

/// `GET /api/ps`: the model, loaded for as long as the server runs.
pub async fn ps(State(state): State<AppState>) -> Response {
    let answer = state.engine.ready().map(|id| {
        let mut model = entry(&state, &id);
        model["expires_at"] = json!("9999-12-31T23:59:59Z");
        model["size_vram"] = json!(0);
        model["context_length"] = json!(state.engine.n_ctx());
        Json::ok(json!({"models": [model]}))
    });
    routes::respond_in(&state, "/api/ps", Dialect::Ollama, answer)
}

/// `GET /api/version`: the Ollama API version this layer follows, and bmoe's.
pub async fn version(State(state): State<AppState>) -> Response {
    let answer = Ok(Json::ok(json!({"version": API_VERSION, "bmoe": env!("CARGO_PKG_VERSION")})));
    routes::respond_in(&state, "/api/version", Dialect::Ollama, answer)
}

/// `POST /api/show`: the model's details, size and abilities.
pub async fn show(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        let body = routes::read_json(&headers, body, state.body_limit).await?;
        let id = state.engine.ready()?;
        let asked = body.get("model").or_else(|| body.get("name")).and_then(Value::as_str).unwrap_or(&id);
        if asked != id && asked.strip_suffix(":latest") != Some(id.as_str()) {
            return Err(ApiError::no_model(asked, &id));
        }
        let about = state.engine.about();
        let shape = state.engine.shape();
        let arch = shape["arch"].as_str().unwrap_or("");
        let mut info = Map::new();
        info.insert("general.architecture".into(), json!(arch));
        info.insert("general.parameter_count".into(), about["parameter_count"].clone());
        info.insert(format!("{arch}.context_length"), json!(state.engine.n_ctx()));
        info.insert(format!("{arch}.block_count"), shape["n_layer"].clone());
        info.insert(format!("{arch}.expert_count"), shape["n_expert"].clone());
        info.insert(format!("{arch}.expert_used_count"), shape["n_expert_used"].clone());
        let mut capabilities = vec!["completion"];
        if !state.engine.tool_openings().is_empty() {
            capabilities.push("tools");
        }
        Ok(Json::ok(json!({
            "license": "", "modelfile": "", "parameters": "", "template": "",
            "details": about["details"], "model_info": info, "capabilities": capabilities,
            "modified_at": about["modified_at"],
        })))
    };
    let answer = answer.await;
    routes::respond_in(&state, "/api/show", Dialect::Ollama, answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(body: Value) -> Result<Parsed, ApiError> {
        parse_chat(&body, &RunConfig::default(), None)
    }

    #[test]
    fn messages_options_and_format_reach_the_request() {
        let parsed = chat_of(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "thinking": "Call it.",
                 "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
                {"role": "tool", "content": "sunny", "tool_name": "weather"}
            ],
            "options": {"temperature": 0.25, "top_k": 3, "seed": 7, "num_predict": 9, "stop": ["END"], "num_ctx": 4096},
            "format": "json", "think": false, "keep_alive": "5m"
        }))
        .unwrap();
        let Work::Chat(work) = &parsed.work else { panic!("a chat") };
        assert_eq!(work.conversation.system.as_deref(), Some("Be brief."));
        let m = &work.conversation.messages;
        assert_eq!(m[1].reasoning.as_deref(), Some("Call it."));
        assert!(m[1].content_null && m[1].tool_calls[0].function.arguments == json!({"city": "Oslo"}));
        assert_eq!(m[2].name.as_deref(), Some("weather"));
        let s = &parsed.settings;
        assert_eq!((s.sampling.temp, s.sampling.top_k, s.sampling.seed, s.n_predict), (0.25, 3, 7, 9));
        assert_eq!(s.stop, ["END"]);
        assert!(s.constraint.is_some() && !s.think && parsed.stream);
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let msgs = json!([{"role": "user", "content": "x"}]);
        let param = |extra: Value| {
            let mut body = json!({"messages": msgs});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat_of(body).unwrap_err().param
        };
        assert_eq!(param(json!({"options": {"mirostat": 2}})).as_deref(), Some("options.mirostat"));
        assert_eq!(param(json!({"options": {"repeat_penalty": 0}})).as_deref(), Some("options.repeat_penalty"));
        assert_eq!(param(json!({"options": {"bogus": 1}})).as_deref(), Some("options.bogus"));
        assert_eq!(param(json!({"options": {"temperature": "hot"}})).as_deref(), Some("options.temperature"));
        assert_eq!(param(json!({"format": 5})).as_deref(), Some("format"));
        assert_eq!(param(json!({"think": "max"})).as_deref(), Some("think"));
        let image = json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]});
        assert_eq!(chat_of(image).unwrap_err().param.as_deref(), Some("messages[0]"));
        let config = RunConfig::default();
        let suffix = parse_generate(&json!({"prompt": "x", "suffix": "y"}), &config, None).unwrap_err();
        assert_eq!(suffix.param.as_deref(), Some("suffix"));
        let raw = parse_generate(&json!({"prompt": "x", "raw": true, "stream": false}), &config, None).unwrap();
        assert!(matches!(raw.work, Work::Complete { .. }) && !raw.stream);
    }

    #[test]
    fn a_stream_ends_with_a_done_line_after_the_calls() {
        let reply = Reply { name: "m".into(), field: Field::Message };
        let mut lines = Lines { reply, deltas: Deltas::new(&["<tool_call>"]), clock: Clock::new(), digest: false };
        let mut all = lines.next(Out::Started);
        all.extend(lines.next(Out::Text(crate::chat::Kind::Reasoning, "hm".into())));
        all.extend(lines.next(Out::Text(crate::chat::Kind::Answer, "Hi <tool_call>".into())));
        let f = Finished {
            answer: "Hi".into(),
            tool_calls: vec![ToolCall::new(None, "f", json!({"a": 1}))],
            finish_reason: "tool_calls",
            completion_tokens: 4,
            ..Finished::default()
        };
        all.extend(lines.next(Out::Done(Ok(Box::new(f)))));
        assert_eq!(all.len(), 4, "{all:#?}");
        assert_eq!(all[0]["message"]["thinking"], "hm");
        assert_eq!(all[1]["message"]["content"], "Hi ");
        assert_eq!(all[2]["message"]["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
        assert!(all[..3].iter().all(|l| l["done"] == false));
        assert_eq!(
            (&all[3]["done"], &all[3]["done_reason"], &all[3]["eval_count"]),
            (&json!(true), &json!("stop"), &json!(4))
        );
    }
}
