//! Anthropic's Messages API (`POST /v1/messages` and
//! `/v1/messages/count_tokens`), as Claude Code and the `anthropic`
//! package speak it: content blocks in (text, tool results, thinking and
//! tool uses in history), content blocks out, whole or as its named
//! server-sent events.

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::deltas::{Delta, Deltas};
use super::engine::{Finished, Out};
use super::error::{ApiError, Dialect};
use super::request::{self, ChatWork, Parsed};
use super::routes::{self, Access, AppState, Json};
use crate::chat::{Conversation, Message, ToolCall};
use crate::config::RunConfig;

/// `POST /v1/messages`.
pub async fn messages(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let (body, model) = routes::body_and_model(&state, &headers, body).await?;
        let parsed = parse(&body, &state.engine.config, state.engine.default_max_tokens, true)?;
        let parsed = routes::prepare(&state, parsed).await?;
        let input_tokens = parsed.prepared.as_ref().map_or(0, |p| p.tokens.len());
        let openings = routes::call_openings(&state, &parsed);
        let (stream, digest) = (parsed.stream, parsed.logits_digest);
        let id = format!("msg_{:024x}", rand::random::<u128>() >> 32);
        let pending = routes::submit(&state, parsed)?;
        if stream {
            let mut events = Events::new(id, model, input_tokens, &openings, digest);
            Ok(routes::sse_events(pending, access, move |out| routes::named(events.next(out))))
        } else {
            let f = routes::finished(pending).await?;
            Ok(routes::with_tokens(Json::ok(message(&id, &model, &f, digest)), &f))
        }
    };
    let answer = answer.await;
    routes::respond_in(&state, "/v1/messages", Dialect::Anthropic, answer)
}

/// `POST /v1/messages/count_tokens`: the tokens the request's prompt
/// (system, messages and tools rendered by the template) takes.
pub async fn count_tokens(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let answer = async {
        let (body, _) = routes::body_and_model(&state, &headers, body).await?;
        let parsed = parse(&body, &state.engine.config, state.engine.default_max_tokens, false)?;
        let parsed = state.engine.prepare(parsed).await?;
        let tokens = parsed.prepared.as_ref().map_or(0, |p| p.tokens.len());
        Ok(Json::ok(json!({"input_tokens": tokens})))
    };
    let answer = answer.await;
    routes::respond_in(&state, "/v1/messages/count_tokens", Dialect::Anthropic, answer)
}

/// Features of the Messages API this server does not have: refused by name.
const REFUSED: [&str; 3] = ["mcp_servers", "container", "context_management"];

/// Reads a Messages body (`needs_max`: `max_tokens` is required, as it is
/// for `/v1/messages` but not for `count_tokens`).
pub fn parse(body: &Value, config: &RunConfig, default_max: Option<u32>, needs_max: bool) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    request::refuse_fields(body, &REFUSED)?;
    let mut settings = request::base_settings(config, default_max);
    match request::integer_in(body, "max_tokens", 1, i64::from(u32::MAX))? {
        Some(n) => settings.n_predict = n as u32,
        None if needs_max => return Err(ApiError::bad_param("max_tokens", "`max_tokens` is required")),
        None => {}
    }
    // Anthropic's temperature runs from 0 to 1.
    if let Some(t) = request::number_in(body, "temperature", 0.0, 1.0)? {
        settings.sampling.temp = t as f32;
    }
    if let Some(p) = request::number_in(body, "top_p", 0.0, 1.0)? {
        settings.sampling.top_p = p as f32;
    }
    if let Some(k) = request::integer_in(body, "top_k", 0, i64::from(i32::MAX))? {
        settings.sampling.top_k = k as i32;
    }
    settings.stop = request::stop_strings(body.get("stop_sequences"), "stop_sequences")?;
    let (think, effort) = thinking(body.get("thinking"), config)?;
    settings.think = think;
    let (tools, require_call) = tools(body)?;
    settings.require_call = require_call;
    let conversation = conversation(body)?;
    let stream = request::bool_field(body, "stream")?.unwrap_or(false);
    let digest = request::bool_field(body, "logits_digest")?.unwrap_or(false);
    Ok(request::chat_request(ChatWork { conversation, tools, effort }, settings, stream, digest))
}

/// `thinking`: `{"type": "enabled", "budget_tokens": N}` turns the
/// template's switch on (the budget picks the effort where the template
/// takes one), `{"type": "disabled"}` off; absent, the server's default.
fn thinking(value: Option<&Value>, config: &RunConfig) -> Result<(bool, Option<String>), ApiError> {
    let effort = Some(config.chat.reasoning_effort.clone()).filter(|e| !e.is_empty());
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok((config.chat.think, effort)) };
    let bad = |m: String| ApiError::bad_param("thinking", m);
    match value.get("type").and_then(Value::as_str) {
        Some("disabled") => Ok((false, effort)),
        Some("adaptive") => Ok((true, effort)),
        Some("enabled") => {
            let budget = value.get("budget_tokens").and_then(Value::as_u64);
            let budget = budget.ok_or_else(|| bad("`thinking.budget_tokens` is required with `enabled`".into()))?;
            let level = match budget {
                0..=4095 => "low",
                4096..=16383 => "medium",
                _ => "high",
            };
            Ok((true, Some(level.to_string())))
        }
        other => Err(bad(format!("unknown thinking type {} (enabled, disabled or adaptive)", json!(other)))),
    }
}

/// `tools` as an OpenAI-style list, and whether the reply must call one
/// (`tool_choice` `any` or `tool`).
fn tools(body: &Value) -> Result<(Option<Value>, bool), ApiError> {
    let list = request::tool_list(body)?;
    let mut functions = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or("custom");
        if kind != "custom" {
            return Err(ApiError::bad_param(
                &at,
                format!("server tools (`{kind}`) are not supported by this server: client tools only"),
            ));
        }
        let name = tool.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| ApiError::bad_param(&at, "a tool needs a `name`"))?;
        let schema = tool.get("input_schema").filter(|s| s.is_object());
        let schema = schema.ok_or_else(|| ApiError::bad_param(&at, "a tool needs an `input_schema` object"))?;
        let description = tool.get("description").and_then(Value::as_str);
        functions.push(request::function_tool(name, description, schema.clone()));
    }
    let tools = request::checked_tools(functions, "tools")?;
    let choice = match body.get("tool_choice") {
        None | Some(Value::Null) => return Ok((tools, false)),
        Some(c) => c,
    };
    let bad = |m: &str| ApiError::bad_param("tool_choice", m);
    match choice.get("type").and_then(Value::as_str) {
        Some("auto") => Ok((tools, false)),
        Some("none") => Ok((None, false)),
        Some("any") => tools.map(|t| (Some(t), true)).ok_or_else(|| bad("`any` needs `tools`")),
        Some("tool") => {
            let name = choice.get("name").and_then(Value::as_str).ok_or_else(|| bad("`tool` needs a `name`"))?;
            request::choose_tool(tools, name)
        }
        _ => Err(bad("`tool_choice.type` must be auto, any, tool or none")),
    }
}

/// `system` and `messages` as a conversation: tool results become tool
/// messages (named after the call they answer), thinking blocks an
/// assistant's reasoning, tool uses its calls.
fn conversation(body: &Value) -> Result<Conversation, ApiError> {
    let system = match body.get("system") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(blocks)) => Some(block_text(blocks, "system")?),
        Some(_) => return Err(ApiError::bad_param("system", "`system` must be text or a list of text blocks")),
    };
    let list = body.get("messages").ok_or_else(|| ApiError::bad_param("messages", "`messages` is required"))?;
    let list = list.as_array().ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a list"))?;
    if list.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    if list.len() > request::MAX_MESSAGES {
        return Err(ApiError::bad_param(
            "messages",
            format!("more than the {} messages this server reads", request::MAX_MESSAGES),
        ));
    }
    let mut messages = Vec::with_capacity(list.len());
    // Each call's name by its id, for the results that answer it.
    let mut called: Vec<(String, String)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let blocks = match m.get("content") {
            Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
            Some(Value::Array(blocks)) => blocks.clone(),
            _ => return Err(ApiError::bad_param(&at, "`content` must be text or a list of content blocks")),
        };
        match role {
            "user" => user_messages(&blocks, &at, &called, &mut messages)?,
            "assistant" => {
                let message = assistant_message(&blocks, &at)?;
                for call in &message.tool_calls {
                    called.push((call.id.clone().unwrap_or_default(), call.function.name.clone()));
                }
                messages.push(message);
            }
            other => {
                return Err(ApiError::bad_param(&at, format!("unknown role `{other}` (user or assistant)")));
            }
        }
    }
    Ok(Conversation { system, messages })
}

/// A user turn's blocks: a tool message per `tool_result`, then a user
/// message of its text, if any.
fn user_messages(
    blocks: &[Value],
    at: &str,
    called: &[(String, String)],
    out: &mut Vec<Message>,
) -> Result<(), ApiError> {
    let mut text = String::new();
    let mut has_text = false;
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                text.push_str(block.get("text").and_then(Value::as_str).unwrap_or(""));
                has_text = true;
            }
            Some("tool_result") => {
                let id = block.get("tool_use_id").and_then(Value::as_str);
                let id = id.ok_or_else(|| ApiError::bad_param(at, "a `tool_result` needs its `tool_use_id`"))?;
                let content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => block_text(parts, at)?,
                    Some(_) => return Err(ApiError::bad_param(at, "a `tool_result`'s content is text or text blocks")),
                };
                let mut message = Message::new("tool", &content);
                message.tool_call_id = Some(id.to_string());
                message.name = called.iter().rev().find(|(c, _)| c == id).map(|(_, name)| name.clone());
                out.push(message);
            }
            other => return Err(unsupported_block(other, at)),
        }
    }
    if has_text || out.last().is_none_or(|m| m.role != "tool") {
        out.push(Message::new("user", &text));
    }
    Ok(())
}

/// An assistant turn's blocks: its text, reasoning and calls.
fn assistant_message(blocks: &[Value], at: &str) -> Result<Message, ApiError> {
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") => reasoning.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or("")),
            // Encrypted reasoning of Anthropic's models: nothing a local model can read.
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let name = block.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
                let name = name.ok_or_else(|| ApiError::bad_param(at, "a `tool_use` needs a `name`"))?;
                let input = block.get("input").cloned().unwrap_or_else(|| Value::Object(Map::new()));
                if !input.is_object() {
                    return Err(ApiError::bad_param(at, "a `tool_use`'s `input` must be an object"));
                }
                let id = block.get("id").and_then(Value::as_str).map(str::to_string);
                calls.push(ToolCall::new(id, name, input));
            }
            other => return Err(unsupported_block(other, at)),
        }
    }
    let mut message = Message::new("assistant", &text);
    message.content_null = text.is_empty() && !calls.is_empty();
    message.reasoning = Some(reasoning).filter(|r| !r.is_empty());
    message.tool_calls = calls;
    Ok(message)
}

/// The text of a list of text blocks (`cache_control` and other fields of
/// a block are ignored).
fn block_text(blocks: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            other => return Err(unsupported_block(other, at)),
        }
    }
    Ok(text)
}

fn unsupported_block(kind: Option<&str>, at: &str) -> ApiError {
    let kind = kind.unwrap_or("?");
    ApiError::bad_param(
        at,
        format!(
            "content blocks of type `{kind}` are not supported by this server (text, tool_use, tool_result and thinking)"
        ),
    )
}

/// Anthropic's `stop_reason` and `stop_sequence` of a finished reply.
fn stop_reason(f: &Finished) -> (&'static str, Option<&str>) {
    match f.finish_reason {
        "length" => ("max_tokens", None),
        "tool_calls" => ("tool_use", None),
        _ => match &f.stop_sequence {
            Some(s) => ("stop_sequence", Some(s.as_str())),
            None => ("end_turn", None),
        },
    }
}

/// A call as a `tool_use` block (`input` given, or empty for a stream,
/// which sends it as JSON deltas).
fn tool_use(call: &ToolCall, index: usize, input: Value) -> Value {
    let id = call.id.clone().unwrap_or_else(|| format!("call_{index}"));
    json!({"type": "tool_use", "id": id, "name": call.function.name, "input": input})
}

fn usage(f: &Finished) -> Value {
    json!({"input_tokens": f.prompt_tokens, "output_tokens": f.completion_tokens})
}

/// A whole `message` object.
fn message(id: &str, model: &str, f: &Finished, digest: bool) -> Value {
    let mut content = Vec::new();
    if !f.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": f.reasoning, "signature": ""}));
    }
    if !f.answer.is_empty() || f.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": f.answer}));
    }
    for (i, call) in f.tool_calls.iter().enumerate() {
        content.push(tool_use(call, i, call.function.arguments_object()));
    }
    let (reason, sequence) = stop_reason(f);
    let mut object = json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence, "usage": usage(f),
    });
    if digest {
        object["logits_digest"] = digests(f);
    }
    object
}

fn digests(f: &Finished) -> Value {
    f.logits_digest.iter().map(|d| format!("{d:016x}")).collect()
}

/// The open content block of a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// Turns a reply's output into the Messages API's stream events.
struct Events {
    id: String,
    model: String,
    input_tokens: usize,
    deltas: Deltas,
    open: Open,
    /// Index of the next content block.
    index: usize,
    started: bool,
    digest: bool,
}

impl Events {
    fn new(id: String, model: String, input_tokens: usize, openings: &[&str], digest: bool) -> Events {
        let deltas = Deltas::new(openings);
        Events { id, model, input_tokens, deltas, open: Open::None, index: 0, started: false, digest }
    }

    fn event(name: &'static str, mut data: Value) -> (&'static str, Value) {
        data["type"] = json!(name);
        (name, data)
    }

    /// `message_start` and a `ping`, once.
    fn start(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        });
        out.push(Events::event("message_start", json!({"message": message})));
        out.push(Events::event("ping", json!({})));
    }

    /// Closes the open block and opens one of `kind`, if it is another.
    fn switch(&mut self, kind: Open, out: &mut Vec<(&'static str, Value)>) {
        if self.open == kind {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Open::Text => json!({"type": "text", "text": ""}),
            Open::None => return,
        };
        out.push(Events::event("content_block_start", json!({"index": self.index, "content_block": block})));
        self.open = kind;
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if self.open == Open::None {
            return;
        }
        if self.open == Open::Thinking {
            let delta = json!({"type": "signature_delta", "signature": ""});
            out.push(Events::event("content_block_delta", json!({"index": self.index, "delta": delta})));
        }
        out.push(Events::event("content_block_stop", json!({"index": self.index})));
        self.open = Open::None;
        self.index += 1;
    }

    fn delta(&self, delta: Value) -> (&'static str, Value) {
        Events::event("content_block_delta", json!({"index": self.index, "delta": delta}))
    }

    fn text(&mut self, text: String, out: &mut Vec<(&'static str, Value)>) {
        self.switch(Open::Text, out);
        out.push(self.delta(json!({"type": "text_delta", "text": text})));
    }

    /// The events for one piece of the engine's output.
    fn next(&mut self, piece: Out) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        self.start(&mut out);
        match piece {
            Out::Started | Out::Token(_) => {}
            Out::Text(kind, text) => match self.deltas.text(kind, &text) {
                Some(Delta::Reasoning(t)) => {
                    self.switch(Open::Thinking, &mut out);
                    out.push(self.delta(json!({"type": "thinking_delta", "thinking": t})));
                }
                Some(Delta::Answer(t)) => self.text(t, &mut out),
                None => {}
            },
            Out::Done(Ok(f)) => self.finish(&f, &mut out),
            Out::Done(Err(e)) => out.push(Events::event("error", e.body_in(Dialect::Anthropic))),
        }
        out
    }

    fn finish(&mut self, f: &Finished, out: &mut Vec<(&'static str, Value)>) {
        if let Some(rest) = self.deltas.rest(f) {
            self.text(rest, out);
        }
        if !self.deltas.answered() && f.tool_calls.is_empty() && self.open != Open::Text {
            // A reply with no text still has its (empty) text block.
            self.switch(Open::Text, out);
        }
        self.close(out);
        for (i, call) in f.tool_calls.iter().enumerate() {
            let block = tool_use(call, i, json!({}));
            out.push(Events::event("content_block_start", json!({"index": self.index, "content_block": block})));
            let input = call.function.arguments_object().to_string();
            out.push(self.delta(json!({"type": "input_json_delta", "partial_json": input})));
            out.push(Events::event("content_block_stop", json!({"index": self.index})));
            self.index += 1;
        }
        let (reason, sequence) = stop_reason(f);
        let mut delta = json!({
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"input_tokens": f.prompt_tokens, "output_tokens": f.completion_tokens},
        });
        if self.digest {
            delta["logits_digest"] = digests(f);
        }
        out.push(Events::event("message_delta", delta));
        out.push(Events::event("message_stop", json!({})));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_of(body: Value) -> Result<Parsed, ApiError> {
        parse(&body, &RunConfig::default(), None, true)
    }

    #[test]
    fn blocks_become_a_conversation_with_calls_and_results() {
        let parsed = parse_of(json!({
            "model": "m", "max_tokens": 9,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call it.", "signature": "x"},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Oslo"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And?"}]}
            ],
            "stop_sequences": ["END"], "temperature": 0.5, "metadata": {"user_id": "u"}
        }))
        .unwrap();
        let request::Work::Chat(work) = &parsed.work else { panic!("a chat") };
        assert_eq!(work.conversation.system.as_deref(), Some("Be brief."));
        let m = &work.conversation.messages;
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "user"]);
        assert_eq!(m[1].reasoning.as_deref(), Some("Call it."));
        assert_eq!(m[1].tool_calls[0].function.arguments, json!({"city": "Oslo"}));
        assert!(m[1].content_null);
        assert_eq!((m[2].content.as_str(), m[2].name.as_deref()), ("sunny", Some("weather")));
        assert_eq!(parsed.settings.stop, ["END"]);
        assert_eq!((parsed.settings.n_predict, parsed.settings.sampling.temp), (9, 0.5));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let base = || json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]});
        let param = |extra: Value| {
            let mut body = base();
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            parse_of(body).unwrap_err().param
        };
        assert_eq!(param(json!({"temperature": 1.5})).as_deref(), Some("temperature"));
        assert_eq!(param(json!({"max_tokens": null})).as_deref(), Some("max_tokens"));
        assert_eq!(param(json!({"mcp_servers": [{"url": "x"}]})).as_deref(), Some("mcp_servers"));
        assert_eq!(
            param(json!({"tools": [{"type": "web_search_20250305", "name": "s"}]})).as_deref(),
            Some("tools[0]")
        );
        let image = json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]});
        assert_eq!(param(image).as_deref(), Some("messages[0]"));
        assert_eq!(param(json!({"tool_choice": {"type": "any"}})).as_deref(), Some("tool_choice"));
        assert_eq!(param(json!({"thinking": {"type": "enabled"}})).as_deref(), Some("thinking"));
    }

    #[test]
    fn tool_choice_and_thinking_reach_the_settings() {
        let tools = json!([{"name": "a", "input_schema": {"type": "object"}}, {"name": "b", "input_schema": {"type": "object"}}]);
        let parsed = parse_of(json!({
            "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": tools,
            "tool_choice": {"type": "tool", "name": "b"}, "thinking": {"type": "enabled", "budget_tokens": 20000}
        }))
        .unwrap();
        let request::Work::Chat(work) = &parsed.work else { panic!("a chat") };
        assert_eq!(work.tools.as_ref().unwrap()[0]["function"]["name"], "b");
        assert_eq!(work.effort.as_deref(), Some("high"));
        assert!(parsed.settings.require_call && parsed.settings.think);
        let off = parse_of(json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
            "tools": tools, "tool_choice": {"type": "none"}, "thinking": {"type": "disabled"}}))
        .unwrap();
        let request::Work::Chat(work) = &off.work else { panic!("a chat") };
        assert!(work.tools.is_none() && !off.settings.think);
    }

    #[test]
    fn a_stream_opens_closes_and_numbers_its_blocks() {
        let mut events = Events::new("msg_1".into(), "m".into(), 5, &["<tool_call>"], false);
        let mut all = events.next(Out::Started);
        all.extend(events.next(Out::Text(crate::chat::Kind::Reasoning, "hm".into())));
        all.extend(events.next(Out::Text(crate::chat::Kind::Answer, "Hi <tool_call>".into())));
        let f = Finished {
            answer: "Hi".into(),
            tool_calls: vec![ToolCall::new(Some("c0".into()), "f", json!({"a": 1}))],
            finish_reason: "tool_calls",
            ..Finished::default()
        };
        all.extend(events.next(Out::Done(Ok(Box::new(f)))));
        let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert!(all.iter().all(|(n, d)| d["type"] == *n));
        assert_eq!(all[3].1["delta"]["thinking"], "hm");
        assert_eq!(all[7].1["delta"]["text"], "Hi ");
        assert_eq!(all[9].1["index"], 2);
        assert_eq!(all[10].1["delta"]["partial_json"], r#"{"a":1}"#);
        assert_eq!(all[12].1["delta"]["stop_reason"], "tool_use");
    }
}
