//! OpenAI's Responses API (`POST /v1/responses`), stateless: `input` as
//! text or items (messages, function calls and their outputs, reasoning),
//! `instructions`, function tools, `reasoning` and `text.format`; output
//! items whole or as the API's named stream events. Nothing is stored: a
//! request that names an earlier response is refused.

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::Response;
use serde_json::{Value, json};

use super::deltas::{Delta, Deltas};
use super::engine::{Finished, Out};
use super::error::{ApiError, Dialect};
use super::request::{self, ChatWork, Parsed};
use super::routes::{self, Access, AppState, Json};
use crate::chat::{Conversation, Message, ToolCall};
use crate::config::RunConfig;

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let answer = async {
        let (body, model) = routes::body_and_model(&state, &headers, body).await?;
        let parsed = parse(&body, &state.engine.config, state.engine.default_max_tokens)?;
        let parsed = routes::prepare(&state, parsed).await?;
        let openings = routes::call_openings(&state, &parsed);
        let shell = Shell::new(&body, model, parsed.logits_digest);
        let stream = parsed.stream;
        let pending = routes::submit(&state, parsed)?;
        if stream {
            let mut events = Events::new(shell, &openings);
            Ok(routes::sse_events(pending, access, move |out| routes::named(events.next(out))))
        } else {
            let f = routes::finished(pending).await?;
            let items = Items::new(&shell.id).whole(&f);
            Ok(routes::with_tokens(Json::ok(shell.response(&f, items)), &f))
        }
    };
    let answer = answer.await;
    routes::respond_in(&state, "/v1/responses", Dialect::OpenAi, answer)
}

/// What this stateless server cannot do: refused by name.
const REFUSED: [&str; 4] = ["previous_response_id", "conversation", "background", "prompt"];

/// Reads a Responses body.
pub fn parse(body: &Value, config: &RunConfig, default_max: Option<u32>) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    request::refuse_fields(body, &REFUSED)?;
    let mut settings = request::base_settings(config, default_max);
    if let Some(n) = request::integer_in(body, "max_output_tokens", 1, i64::from(u32::MAX))? {
        settings.n_predict = n as u32;
    }
    if let Some(t) = request::number_in(body, "temperature", 0.0, 2.0)? {
        settings.sampling.temp = t as f32;
    }
    if let Some(p) = request::number_in(body, "top_p", 0.0, 1.0)? {
        settings.sampling.top_p = p as f32;
    }
    if body.get("top_logprobs").is_some_and(|v| !v.is_null() && v != &json!(0)) {
        return Err(ApiError::bad_param("top_logprobs", "`top_logprobs` is not supported on /v1/responses"));
    }
    settings.constraint = match body.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => None,
        Some(format) => request::response_schema(format).map_err(|e| rename(e, "text.format"))?,
    };
    let (think, effort) = reasoning(body.get("reasoning"), config)?;
    settings.think = think;
    let (tools, require_call) = tools(body)?;
    settings.require_call = require_call;
    let conversation = conversation(body)?;
    let stream = request::bool_field(body, "stream")?.unwrap_or(false);
    let digest = request::bool_field(body, "logits_digest")?.unwrap_or(false);
    Ok(request::chat_request(ChatWork { conversation, tools, effort }, settings, stream, digest))
}

/// `e` naming `field` instead.
fn rename(e: ApiError, field: &str) -> ApiError {
    ApiError { param: Some(field.to_string()), ..e }
}

/// `reasoning.effort`: `none` turns thinking off, the others set the
/// effort; `summary` is accepted (the reasoning item carries the whole
/// reasoning as its summary).
fn reasoning(value: Option<&Value>, config: &RunConfig) -> Result<(bool, Option<String>), ApiError> {
    let effort = Some(config.chat.reasoning_effort.clone()).filter(|e| !e.is_empty());
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok((config.chat.think, effort)) };
    if !value.is_object() {
        return Err(ApiError::bad_param("reasoning", "`reasoning` must be an object"));
    }
    match value.get("effort") {
        None | Some(Value::Null) => Ok((config.chat.think, effort)),
        Some(Value::String(level)) => match level.as_str() {
            "none" => Ok((false, effort)),
            "minimal" | "low" => Ok((true, Some("low".into()))),
            "medium" => Ok((true, Some("medium".into()))),
            "high" | "xhigh" => Ok((true, Some("high".into()))),
            other => Err(ApiError::bad_param(
                "reasoning.effort",
                format!("unknown effort `{other}` (none, minimal, low, medium, high)"),
            )),
        },
        Some(_) => Err(ApiError::bad_param("reasoning.effort", "`reasoning.effort` must be a string")),
    }
}

/// `tools` (function tools only) as chat completions' list, and whether
/// the reply must call one.
fn tools(body: &Value) -> Result<(Option<Value>, bool), ApiError> {
    let list = request::tool_list(body)?;
    let mut functions = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                let kind = other.unwrap_or("?");
                return Err(ApiError::bad_param(
                    &at,
                    format!("tools of type `{kind}` are not supported by this server: function tools only"),
                ));
            }
        }
        let name = tool.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let name = name.ok_or_else(|| ApiError::bad_param(&at, "a function tool needs a `name`"))?;
        let parameters = tool.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object"}));
        let description = tool.get("description").and_then(Value::as_str);
        functions.push(request::function_tool(name, description, parameters));
    }
    let tools = request::checked_tools(functions, "tools")?;
    let bad = |m: String| ApiError::bad_param("tool_choice", m);
    match body.get("tool_choice") {
        None | Some(Value::Null) => Ok((tools, false)),
        Some(Value::String(s)) if s == "auto" => Ok((tools, false)),
        Some(Value::String(s)) if s == "none" => Ok((None, false)),
        Some(Value::String(s)) if s == "required" => {
            tools.map(|t| (Some(t), true)).ok_or_else(|| bad("`required` needs `tools`".into()))
        }
        Some(choice @ Value::Object(_)) if choice.get("type").and_then(Value::as_str) == Some("function") => {
            let name = choice.get("name").and_then(Value::as_str);
            let name = name.ok_or_else(|| bad("a function choice needs a `name`".into()))?;
            request::choose_tool(tools, name)
        }
        Some(other) => Err(bad(format!("unsupported tool_choice {other} (auto, none, required or a function)"))),
    }
}

/// `instructions` and `input` as a conversation: a function call joins the
/// assistant message before it (or makes one), a reasoning item gives the
/// next assistant message its reasoning, a call's output is a tool message.
fn conversation(body: &Value) -> Result<Conversation, ApiError> {
    let mut system = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::bad_param("instructions", "`instructions` must be text")),
    };
    let items = match body.get("input") {
        None | Some(Value::Null) => return Err(ApiError::bad_param("input", "`input` is required")),
        Some(Value::String(text)) => vec![json!({"role": "user", "content": text})],
        Some(Value::Array(items)) if items.is_empty() => return Err(ApiError::bad_param("input", "`input` is empty")),
        Some(Value::Array(items)) => items.clone(),
        Some(_) => return Err(ApiError::bad_param("input", "`input` must be text or a list of items")),
    };
    if items.len() > request::MAX_MESSAGES {
        return Err(ApiError::bad_param(
            "input",
            format!("more than the {} items this server reads", request::MAX_MESSAGES),
        ));
    }
    let mut messages: Vec<Message> = Vec::with_capacity(items.len());
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn still taking calls.
    let mut assistant_open = false;
    let mut called: Vec<(String, String)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                let text = content_text(item.get("content"), &at)?;
                match role {
                    "system" | "developer" if messages.is_empty() => {
                        system = Some(match system.take() {
                            Some(s) => format!("{s}\n\n{text}"),
                            None => text,
                        });
                    }
                    "system" | "developer" => messages.push(Message::new("system", &text)),
                    "user" => messages.push(Message::new("user", &text)),
                    "assistant" => {
                        let mut m = Message::new("assistant", &text);
                        m.reasoning = reasoning.take();
                        messages.push(m);
                        assistant_open = true;
                        continue;
                    }
                    other => {
                        return Err(ApiError::bad_param(
                            &at,
                            format!("unknown role `{other}` (user, assistant, system or developer)"),
                        ));
                    }
                }
            }
            // A reasoning item begins an assistant turn.
            "reasoning" => reasoning = Some(reasoning_text(item)).filter(|r| !r.is_empty()),
            "function_call" => {
                let name = item.get("name").and_then(Value::as_str).filter(|n| !n.is_empty());
                let name = name.ok_or_else(|| ApiError::bad_param(&at, "a `function_call` needs a `name`"))?;
                let call_id = item.get("call_id").and_then(Value::as_str).map(str::to_string);
                let arguments = match item.get("arguments") {
                    Some(Value::String(text)) if serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()) => {
                        Value::String(text.clone())
                    }
                    None | Some(Value::Null) => json!({}),
                    _ => return Err(ApiError::bad_param(&at, "`arguments` must be JSON text holding an object")),
                };
                if !assistant_open {
                    let mut m = Message::new("assistant", "");
                    m.content_null = true;
                    m.reasoning = reasoning.take();
                    messages.push(m);
                }
                let last = messages.last_mut().expect("an assistant message was just made");
                called.push((call_id.clone().unwrap_or_default(), name.to_string()));
                last.tool_calls.push(ToolCall::new(call_id, name, arguments));
                assistant_open = true;
                continue;
            }
            "function_call_output" => {
                let id = item.get("call_id").and_then(Value::as_str);
                let id = id.ok_or_else(|| ApiError::bad_param(&at, "a `function_call_output` needs its `call_id`"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    other => content_text(other, &at)?,
                };
                let mut m = Message::new("tool", &output);
                m.tool_call_id = Some(id.to_string());
                m.name = called.iter().rev().find(|(c, _)| c == id).map(|(_, n)| n.clone());
                messages.push(m);
            }
            other => {
                return Err(ApiError::bad_param(
                    &at,
                    format!("input items of type `{other}` are not supported by this server"),
                ));
            }
        }
        assistant_open = false;
    }
    if messages.is_empty() {
        return Err(ApiError::bad_param("input", "`input` holds no message"));
    }
    Ok(Conversation { system, messages })
}

/// A reasoning item's text: its content, or else its summary.
fn reasoning_text(item: &Value) -> String {
    let texts = |field: &str| -> String {
        let parts = item.get(field).and_then(Value::as_array).cloned().unwrap_or_default();
        parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join("\n\n")
    };
    let content = texts("content");
    if content.is_empty() { texts("summary") } else { content }
}

/// A message's content as text: a string, or a list of text parts
/// (`input_text`, `output_text`, `text`).
fn content_text(content: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                    }
                    other => {
                        return Err(ApiError::bad_param(
                            at,
                            format!(
                                "content parts of type `{}` are not supported by this server (text only)",
                                other.unwrap_or("?")
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        Some(_) => Err(ApiError::bad_param(at, "`content` must be text or a list of text parts")),
    }
}

/// What every state of one response shares: its id, the request's
/// settings echoed back, and when it was made.
struct Shell {
    id: String,
    created_at: u64,
    model: String,
    /// The request's fields a response object repeats.
    echo: Value,
    digest: bool,
}

impl Shell {
    fn new(body: &Value, model: String, digest: bool) -> Shell {
        let created_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let field = |name: &str, default: Value| body.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(default);
        let echo = json!({
            "instructions": field("instructions", Value::Null),
            "max_output_tokens": field("max_output_tokens", Value::Null),
            "metadata": field("metadata", json!({})),
            "parallel_tool_calls": field("parallel_tool_calls", json!(true)),
            "reasoning": field("reasoning", json!({"effort": null, "summary": null})),
            "temperature": field("temperature", json!(1.0)),
            "text": field("text", json!({"format": {"type": "text"}})),
            "tool_choice": field("tool_choice", json!("auto")),
            "tools": field("tools", json!([])),
            "top_p": field("top_p", json!(1.0)),
        });
        let id = format!("resp_{:024x}", rand::random::<u128>() >> 32);
        Shell { id, created_at, model, echo, digest }
    }

    /// The response object: `in_progress` (no reply yet) or finished.
    fn object(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let mut object = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": null, "incomplete_details": null, "model": self.model, "output": output,
            "store": false, "usage": usage,
        });
        if let (Some(map), Some(echo)) = (object.as_object_mut(), self.echo.as_object()) {
            map.extend(echo.clone());
        }
        object
    }

    /// The finished response with `output`.
    fn response(&self, f: &Finished, output: Vec<Value>) -> Value {
        let incomplete = f.finish_reason == "length";
        let mut object = self.object(if incomplete { "incomplete" } else { "completed" }, output, usage(f));
        if incomplete {
            object["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        if self.digest {
            object["logits_digest"] = f.logits_digest.iter().map(|d| format!("{d:016x}")).collect();
        }
        object
    }
}

fn usage(f: &Finished) -> Value {
    json!({
        "input_tokens": f.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": f.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// The output items of one response, with ids derived from its own.
struct Items {
    base: String,
}

impl Items {
    fn new(response_id: &str) -> Items {
        Items { base: response_id.trim_start_matches("resp_").to_string() }
    }

    fn reasoning_id(&self) -> String {
        format!("rs_{}", self.base)
    }

    fn message_id(&self) -> String {
        format!("msg_{}", self.base)
    }

    fn call_id(&self, i: usize) -> String {
        format!("fc_{}_{i}", self.base)
    }

    fn reasoning(&self, text: &str) -> Value {
        json!({
            "type": "reasoning", "id": self.reasoning_id(),
            "summary": [{"type": "summary_text", "text": text}],
            "content": [{"type": "reasoning_text", "text": text}],
        })
    }

    fn message(&self, text: &str, status: &str) -> Value {
        json!({
            "type": "message", "id": self.message_id(), "status": status, "role": "assistant",
            "content": [output_text(text)],
        })
    }

    fn call(&self, i: usize, call: &ToolCall, status: &str, arguments: &str) -> Value {
        json!({
            "type": "function_call", "id": self.call_id(i),
            "call_id": call.id.clone().unwrap_or_else(|| format!("call_{i}")),
            "name": call.function.name, "arguments": arguments, "status": status,
        })
    }

    /// The items of a finished reply: reasoning, answer, calls.
    fn whole(&self, f: &Finished) -> Vec<Value> {
        let mut items = Vec::new();
        if !f.reasoning.is_empty() {
            items.push(self.reasoning(&f.reasoning));
        }
        if !f.answer.is_empty() || f.tool_calls.is_empty() {
            items.push(self.message(&f.answer, "completed"));
        }
        for (i, call) in f.tool_calls.iter().enumerate() {
            items.push(self.call(i, call, "completed", &arguments_text(call)));
        }
        items
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// A call's arguments as JSON text.
fn arguments_text(call: &ToolCall) -> String {
    match &call.function.arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The open output item of a stream.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Open {
    None,
    Reasoning,
    Message,
}

/// Turns a reply's output into the Responses API's stream events.
struct Events {
    shell: Shell,
    items: Items,
    deltas: Deltas,
    open: Open,
    /// The text of the open item so far.
    text: String,
    /// Finished output items.
    done: Vec<Value>,
    sequence: u64,
    started: bool,
}

impl Events {
    fn new(shell: Shell, openings: &[&str]) -> Events {
        let items = Items::new(&shell.id);
        Events {
            shell,
            items,
            deltas: Deltas::new(openings),
            open: Open::None,
            text: String::new(),
            done: Vec::new(),
            sequence: 0,
            started: false,
        }
    }

    fn event(&mut self, name: &'static str, mut data: Value, out: &mut Vec<(&'static str, Value)>) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push((name, data));
    }

    fn index(&self) -> usize {
        self.done.len()
    }

    fn start(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let response = self.shell.object("in_progress", Vec::new(), Value::Null);
        self.event("response.created", json!({"response": response}), out);
        self.event("response.in_progress", json!({"response": response}), out);
    }

    /// Opens an item of `kind` (closing the open one, if another).
    fn switch(&mut self, kind: Open, out: &mut Vec<(&'static str, Value)>) {
        if self.open == kind {
            return;
        }
        self.close(out);
        let index = self.index();
        match kind {
            Open::Reasoning => {
                let item = json!({"type": "reasoning", "id": self.items.reasoning_id(), "summary": []});
                self.event("response.output_item.added", json!({"output_index": index, "item": item}), out);
                let part = json!({"type": "summary_text", "text": ""});
                let data = json!({"item_id": self.items.reasoning_id(), "output_index": index, "summary_index": 0, "part": part});
                self.event("response.reasoning_summary_part.added", data, out);
            }
            Open::Message => {
                let mut item = self.items.message("", "in_progress");
                item["content"] = json!([]);
                self.event("response.output_item.added", json!({"output_index": index, "item": item}), out);
                let data = json!({"item_id": self.items.message_id(), "output_index": index, "content_index": 0, "part": output_text("")});
                self.event("response.content_part.added", data, out);
            }
            Open::None => return,
        }
        self.open = kind;
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        let index = self.index();
        let text = std::mem::take(&mut self.text);
        let item = match self.open {
            Open::None => return,
            Open::Reasoning => {
                let id = self.items.reasoning_id();
                let data = json!({"item_id": id, "output_index": index, "summary_index": 0, "text": text});
                self.event("response.reasoning_summary_text.done", data, out);
                let part = json!({"type": "summary_text", "text": text});
                let data = json!({"item_id": id, "output_index": index, "summary_index": 0, "part": part});
                self.event("response.reasoning_summary_part.done", data, out);
                self.items.reasoning(&text)
            }
            Open::Message => {
                let id = self.items.message_id();
                let data =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []});
                self.event("response.output_text.done", data, out);
                let data =
                    json!({"item_id": id, "output_index": index, "content_index": 0, "part": output_text(&text)});
                self.event("response.content_part.done", data, out);
                self.items.message(&text, "completed")
            }
        };
        self.event("response.output_item.done", json!({"output_index": index, "item": item}), out);
        self.done.push(item);
        self.open = Open::None;
    }

    fn answer(&mut self, text: String, out: &mut Vec<(&'static str, Value)>) {
        self.switch(Open::Message, out);
        self.text.push_str(&text);
        let data = json!({
            "item_id": self.items.message_id(), "output_index": self.index(), "content_index": 0,
            "delta": text, "logprobs": [],
        });
        self.event("response.output_text.delta", data, out);
    }

    /// The events for one piece of the engine's output.
    fn next(&mut self, piece: Out) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        self.start(&mut out);
        match piece {
            Out::Started | Out::Token(_) => {}
            Out::Text(kind, text) => match self.deltas.text(kind, &text) {
                Some(Delta::Reasoning(t)) => {
                    self.switch(Open::Reasoning, &mut out);
                    self.text.push_str(&t);
                    let data = json!({
                        "item_id": self.items.reasoning_id(), "output_index": self.index(),
                        "summary_index": 0, "delta": t,
                    });
                    self.event("response.reasoning_summary_text.delta", data, &mut out);
                }
                Some(Delta::Answer(t)) => self.answer(t, &mut out),
                None => {}
            },
            Out::Done(Ok(f)) => self.finish(&f, &mut out),
            Out::Done(Err(e)) => {
                let data = json!({"code": e.code, "message": e.message, "param": e.param});
                self.event("error", data, &mut out);
            }
        }
        out
    }

    fn finish(&mut self, f: &Finished, out: &mut Vec<(&'static str, Value)>) {
        if let Some(rest) = self.deltas.rest(f) {
            self.answer(rest, out);
        }
        if !self.deltas.answered() && f.tool_calls.is_empty() {
            self.switch(Open::Message, out);
        }
        self.close(out);
        for (i, call) in f.tool_calls.iter().enumerate() {
            let index = self.index();
            let arguments = arguments_text(call);
            let item = self.items.call(i, call, "in_progress", "");
            self.event("response.output_item.added", json!({"output_index": index, "item": item}), out);
            let id = self.items.call_id(i);
            let data = json!({"item_id": id, "output_index": index, "delta": arguments});
            self.event("response.function_call_arguments.delta", data, out);
            let data =
                json!({"item_id": id, "output_index": index, "arguments": arguments, "name": call.function.name});
            self.event("response.function_call_arguments.done", data, out);
            let item = self.items.call(i, call, "completed", &arguments);
            self.event("response.output_item.done", json!({"output_index": index, "item": item}), out);
            self.done.push(item);
        }
        let response = self.shell.response(f, self.done.clone());
        let name = if response["status"] == "incomplete" { "response.incomplete" } else { "response.completed" };
        self.event(name, json!({"response": response}), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_of(body: Value) -> Result<Parsed, ApiError> {
        parse(&body, &RunConfig::default(), None)
    }

    #[test]
    fn items_become_a_conversation_with_calls_and_outputs() {
        let parsed = parse_of(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 12,
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Call it."}]},
                {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
            ],
            "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
            "reasoning": {"effort": "high", "summary": "auto"}, "store": false
        }))
        .unwrap();
        let request::Work::Chat(work) = &parsed.work else { panic!("a chat") };
        assert_eq!(work.conversation.system.as_deref(), Some("Be brief."));
        let m = &work.conversation.messages;
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool"]);
        assert_eq!(m[1].reasoning.as_deref(), Some("Call it."));
        assert!(m[1].content_null && m[1].tool_calls[0].function.name == "weather");
        assert_eq!(m[2].name.as_deref(), Some("weather"));
        assert!(parsed.settings.constraint.is_some() && parsed.settings.n_predict == 12);
        assert_eq!(work.effort.as_deref(), Some("high"));
    }

    #[test]
    fn what_cannot_be_honoured_is_refused_by_name() {
        let param = |body: Value| parse_of(body).unwrap_err().param;
        assert_eq!(
            param(json!({"input": "x", "previous_response_id": "resp_1"})).as_deref(),
            Some("previous_response_id")
        );
        assert_eq!(param(json!({"input": "x", "tools": [{"type": "web_search"}]})).as_deref(), Some("tools[0]"));
        assert_eq!(param(json!({"input": "x", "temperature": 3})).as_deref(), Some("temperature"));
        assert_eq!(param(json!({"input": [{"type": "item_reference", "id": "x"}]})).as_deref(), Some("input[0]"));
        assert_eq!(param(json!({"input": "x", "reasoning": {"effort": "huge"}})).as_deref(), Some("reasoning.effort"));
        assert_eq!(param(json!({"input": "x", "text": {"format": {"type": "yaml"}}})).as_deref(), Some("text.format"));
        assert_eq!(param(json!({})).as_deref(), Some("input"));
    }

    #[test]
    fn a_stream_numbers_its_events_and_ends_with_the_whole_response() {
        let shell = Shell::new(&json!({"input": "x"}), "m".into(), false);
        let mut events = Events::new(shell, &["<tool_call>"]);
        let mut all = events.next(Out::Started);
        all.extend(events.next(Out::Text(crate::chat::Kind::Reasoning, "hm".into())));
        all.extend(events.next(Out::Text(crate::chat::Kind::Answer, "Hi".into())));
        let f = Finished {
            reasoning: "hm".into(),
            answer: "Hi".into(),
            tool_calls: vec![ToolCall::new(Some("c0".into()), "f", json!({"a": 1}))],
            finish_reason: "tool_calls",
            ..Finished::default()
        };
        all.extend(events.next(Out::Done(Ok(Box::new(f)))));
        for (i, (name, data)) in all.iter().enumerate() {
            assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(*name), Some(i as u64)));
        }
        let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
        assert_eq!(names[..2], ["response.created", "response.in_progress"]);
        assert!(
            names.contains(&"response.output_text.delta") && names.contains(&"response.function_call_arguments.delta")
        );
        let last = &all.last().unwrap().1["response"];
        assert_eq!(all.last().unwrap().0, "response.completed");
        let kinds: Vec<&str> = last["output"].as_array().unwrap().iter().map(|i| i["type"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(last["output"][2]["arguments"], r#"{"a":1}"#);
        assert_eq!(last["output"][1]["content"][0]["text"], "Hi");
    }
}
