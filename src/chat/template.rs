//! Renders a model's own Jinja chat template (`tokenizer.chat_template`) with
//! minijinja, set up the way Hugging Face transformers renders them: blocks
//! trimmed, lenient undefined values, no escaping, Python string methods,
//! `raise_exception`, `strftime_now`, and a `tojson` that writes what
//! Python's `json.dumps` writes.

use std::fmt;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use super::json::python_json;
use super::tools::ToolCall;

/// How much work one render may do (minijinja fuel): far more than any real
/// template needs, so that a runaway template is an error, not a hang.
const RENDER_FUEL: u64 = 50_000_000;

/// One message of a conversation, as templates see it. Read from JSON with
/// these keys only (any other is an error naming it); the reasoning may
/// also come as `reasoning_content`, the name other tools write.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "WireMessage", into = "WireMessage")]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text (for an assistant, the answer without its reasoning and
    /// tool calls; for a tool, the function's result). `null` reads as empty.
    pub content: String,
    /// The content was `null`, not text (what the OpenAI API writes for a
    /// reply that only calls tools): templates see none, where they take it.
    pub content_null: bool,
    /// An assistant's reasoning, when it gave any.
    pub reasoning: Option<String>,
    /// The functions an assistant called.
    pub tool_calls: Vec<ToolCall>,
    /// A tool result's call id (the `id` of the call it answers).
    pub tool_call_id: Option<String>,
    /// A tool result's function name.
    pub name: Option<String>,
    /// The one key the reasoning came under from a client
    /// (`reasoning_content` or `thinking`), which alone reaches the template,
    /// as the client wrote the message; `None` (bmoe's own replies, saved
    /// conversations): both, as transformers 5 passes reasoning.
    pub reasoning_key: Option<ReasoningKey>,
}

/// The key a message's reasoning came under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningKey {
    /// `reasoning_content` (DeepSeek's and llama-server's name).
    ReasoningContent,
    /// `thinking` (gpt-oss's, LFM2.5's and Ollama's).
    Thinking,
}

impl ReasoningKey {
    /// The key's name.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningKey::ReasoningContent => "reasoning_content",
            ReasoningKey::Thinking => "thinking",
        }
    }
}

/// [`Message`] as JSON holds it.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "reasoning_content")]
    reasoning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

impl From<WireMessage> for Message {
    fn from(w: WireMessage) -> Message {
        Message {
            role: w.role,
            content_null: w.content.is_none(),
            content: w.content.unwrap_or_default(),
            reasoning: w.reasoning,
            tool_calls: w.tool_calls,
            tool_call_id: w.tool_call_id,
            name: w.name,
            reasoning_key: None,
        }
    }
}

impl From<Message> for WireMessage {
    fn from(m: Message) -> WireMessage {
        WireMessage {
            role: m.role,
            content: (!m.content_null || !m.content.is_empty()).then_some(m.content),
            reasoning: m.reasoning,
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
            name: m.name,
        }
    }
}

impl Message {
    /// A message with no reasoning.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
            content_null: false,
            reasoning: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_key: None,
        }
    }

    /// An assistant's reply: its answer (none when it only called tools and
    /// wrote nothing), reasoning and calls.
    pub fn reply(answer: &str, reasoning: Option<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message {
            content_null: answer.is_empty() && !tool_calls.is_empty(),
            reasoning,
            tool_calls,
            ..Message::new("assistant", answer)
        }
    }

    /// The `tool` message answering `call` with `result`.
    pub fn tool_result(call: &ToolCall, result: &str) -> Message {
        Message {
            tool_call_id: call.id.clone(),
            name: Some(call.function.name.clone()),
            ..Message::new("tool", result)
        }
    }
}

/// What a render needs besides the messages.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOptions {
    /// End with the assistant's turn opened, ready for generation.
    pub add_generation_prompt: bool,
    /// Passed to the template as `enable_thinking` (always explicitly:
    /// templates differ in their default).
    pub enable_thinking: bool,
    /// The vocabulary's BOS text, as `bos_token`.
    pub bos_token: String,
    /// The vocabulary's EOS text, as `eos_token`.
    pub eos_token: String,
    /// How much to think (low, medium, high), passed to the template's
    /// effort switch where it has one (`reasoning_effort` of gpt-oss and
    /// Hunyuan, `thinking_effort` of Kimi-K3).
    pub reasoning_effort: Option<String>,
    /// Functions the model may call, OpenAI-style (`[{"type": "function",
    /// "function": {"name", "description", "parameters"}}]`), passed as
    /// `tools`; none: `tools` is none, as transformers passes it.
    pub tools: Option<serde_json::Value>,
    /// The moment `strftime_now` reports; none: the local time now. Set it
    /// to render a dated template reproducibly.
    pub now: Option<chrono::NaiveDateTime>,
}

impl Default for RenderOptions {
    fn default() -> RenderOptions {
        RenderOptions {
            add_generation_prompt: true,
            enable_thinking: true,
            bos_token: String::new(),
            eos_token: String::new(),
            reasoning_effort: None,
            tools: None,
            now: None,
        }
    }
}

/// A template that failed to compile or render: which template, which line,
/// what went wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateError {
    /// The template's name (a model file or a .jinja path).
    pub template: String,
    /// 1-based line in the template source, when known.
    pub line: Option<usize>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for TemplateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "chat template {}, line {line}: {}", self.template, self.message),
            None => write!(f, "chat template {}: {}", self.template, self.message),
        }
    }
}

impl std::error::Error for TemplateError {}

/// The variables templates read to switch thinking on and off, or to set
/// how much to think, in the order bmoe names them.
pub const THINK_SWITCHES: [&str; 8] = [
    "enable_thinking",
    "thinking",
    "reasoning",
    "thinking_mode",
    "reasoning_effort",
    "thinking_budget",
    "thinking_effort",
    "reasoning_strength",
];

/// Words a string switch takes for "no thinking" (Hunyuan's
/// `reasoning_effort = no_think`, MiniMax's `thinking_mode = disabled`,
/// Solar-Open's `reasoning_effort = minimal`): the first one the template's
/// source spells as a string literal is its off value.
const OFF_WORDS: [&str; 5] = ["no_think", "disabled", "off", "none", "minimal"];

/// How far after a switch's name a literal it is compared with or set to
/// may stand (`reasoning_effort | lower == "none"`).
const COMPARED_WITHIN: usize = 60;

/// The first of [`OFF_WORDS`] that `source` spells as a quoted literal just
/// after one of `switches` (the value the template compares it with or sets
/// it to).
fn off_word(source: &str, switches: &[&str]) -> Option<&'static str> {
    let near: Vec<&str> = switches
        .iter()
        .flat_map(|name| mentions(source, name))
        .map(|at| &source[at..source.ceil_char_boundary((at + COMPARED_WITHIN).min(source.len()))])
        .collect();
    OFF_WORDS
        .into_iter()
        .find(|w| near.iter().any(|n| n.contains(&format!("'{w}'")) || n.contains(&format!("\"{w}\""))))
}

/// Where `name` stands in `source` as a variable of its own (not part of a
/// longer name or an attribute such as `message.thinking`).
fn mentions<'a>(source: &'a str, name: &'a str) -> impl Iterator<Item = usize> + 'a {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    source.match_indices(name).map(|(at, _)| at).filter(move |&at| {
        let before = source[..at].chars().next_back();
        let after = source[at + name.len()..].chars().next();
        !before.is_some_and(|c| ident(c) || c == '.') && !after.is_some_and(ident)
    })
}

/// True when the template reads `name` from its caller: minijinja finds it
/// undeclared, or the template tests whether it is defined (`set x = x if x
/// is defined else ...` declares it, yet reads the caller's value).
fn reads_switch(source: &str, undeclared: &std::collections::HashSet<String>, name: &str) -> bool {
    undeclared.contains(name)
        || mentions(source, name).any(|at| {
            let rest = source[at + name.len()..].trim_start();
            ["is defined", "is not defined", "is undefined", "is not undefined"].iter().any(|t| rest.starts_with(t))
        })
}

/// A compiled chat template.
pub struct ChatTemplate {
    name: String,
    source: String,
    env: Environment<'static>,
    /// The thinking switches ([`THINK_SWITCHES`]) the template reads.
    switches: Vec<&'static str>,
    /// Variables it reads that sound like a thinking switch but are none
    /// bmoe knows.
    unknown_switches: Vec<String>,
    /// The value that turns thinking off through its string switches
    /// (`reasoning_effort`, `thinking_mode`), where it spells one; without
    /// one, `reasoning_effort` only says how much to think (gpt-oss).
    off_word: Option<&'static str>,
    /// The effort given with thinking on when none is asked for, where the
    /// off word is the template's default: `high`, if it spells that.
    on_effort: Option<&'static str>,
    /// How tool-call messages reach the template.
    shape: CallShape,
}

/// How a template is given messages with tool calls, found by rendering
/// one each way ([`ChatTemplate::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CallShape {
    /// The form of a call's `arguments`.
    arguments: ArgumentsForm,
    /// The content of a reply that only calls tools is `none` (as OpenAI
    /// clients send it), unless the template fails on `none` and not on an
    /// empty string (Qwen3 tests `'</think>' in content`).
    null_content: bool,
}

/// The form of a tool call's `arguments` a template can write, found by
/// rendering a call with each ([`ChatTemplate::new`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgumentsForm {
    /// Either: arguments reach it as the message holds them (what
    /// transformers does with every template).
    Either,
    /// A mapping only (it iterates the arguments or writes them with
    /// `tojson`): JSON text is parsed into an object first.
    Object,
    /// Text only (it joins the arguments to strings with `+`): an object is
    /// written as compact JSON text first.
    Text,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate").field("name", &self.name).finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `name` identifies it in errors.
    pub fn new(name: &str, source: &str) -> Result<ChatTemplate, TemplateError> {
        // Line endings as Jinja2 reads a template: `\r\n` and `\r` become `\n`
        // (in text and string literals alike), so a CRLF file renders like its
        // LF twin.
        let source = strip_generation_tags(&source.replace("\r\n", "\n").replace('\r', "\n"));
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        super::jinja_compat::install(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_filter("from_json", from_json);
        env.add_filter(super::markup::ESCAPE_FILTER, super::markup::markup_escape);
        env.add_filter(super::markup::ESCAPE_IF_FILTER, super::markup::markup_escape_if);
        env.add_filter("escape", super::markup::markup_escape);
        env.add_filter("e", super::markup::markup_escape);
        let compiled = super::markup::escape_marked_sums(&super::jinja_tags::string_continuations(&source));
        env.add_template_owned(name.to_string(), compiled).map_err(|e| error(name, &e))?;
        let reads = env.get_template(name).map_err(|e| error(name, &e))?.undeclared_variables(false);
        let switches: Vec<&'static str> =
            THINK_SWITCHES.into_iter().filter(|v| reads_switch(&source, &reads, v)).collect();
        let mut unknown_switches: Vec<String> = reads
            .iter()
            .filter(|v| (v.contains("think") || v.contains("reason")) && !THINK_SWITCHES.contains(&v.as_str()))
            .cloned()
            .collect();
        unknown_switches.sort();
        let off_word = off_word(&source, &switches);
        let on_effort = ["'high'", "\"high\""].iter().any(|w| source.contains(w)).then_some("high");
        let mut template = ChatTemplate {
            name: name.to_string(),
            source,
            env,
            switches,
            unknown_switches,
            off_word,
            on_effort,
            shape: CallShape { arguments: ArgumentsForm::Either, null_content: true },
        };
        template.shape = template.probe_call_shape();
        Ok(template)
    }

    /// How the template takes tool calls: a reply that only calls a tool
    /// rendered with `none` and with empty content, then with its arguments
    /// as JSON text and as an object, each checked for the argument's key
    /// written unescaped (not inside a JSON string, as `tojson` of the text
    /// writes it).
    fn probe_call_shape(&self) -> CallShape {
        const KEY: &str = "probe_key";
        let render = |arguments: serde_json::Value, shape: CallShape| {
            let call = ToolCall::new(Some("call_0".into()), "probe_fn", arguments);
            let messages = [
                Message::new("user", "Hello"),
                Message::reply("", None, vec![call.clone()]),
                Message::tool_result(&call, "probe result"),
            ];
            let opts = RenderOptions { add_generation_prompt: false, ..RenderOptions::default() };
            self.render_as(&messages, &opts, shape)
        };
        let object = serde_json::json!({ KEY: "probe value" });
        let text = serde_json::Value::String(format!("{{\"{KEY}\":\"probe value\"}}"));
        let either = |null_content| CallShape { arguments: ArgumentsForm::Either, null_content };
        // None, unless no form of the arguments renders with it and one
        // renders with an empty string.
        let renders =
            |null_content| [&object, &text].iter().any(|a| render((*a).clone(), either(null_content)).is_ok());
        let null_content = renders(true) || !renders(false);
        let shows_key = |arguments: serde_json::Value| {
            render(arguments, either(null_content))
                .is_ok_and(|text| text.match_indices(KEY).any(|(at, _)| !text[..at].ends_with("\\\"")))
        };
        let arguments = match (shows_key(text), shows_key(object)) {
            (false, true) => ArgumentsForm::Object,
            (true, false) => ArgumentsForm::Text,
            _ => ArgumentsForm::Either,
        };
        CallShape { arguments, null_content }
    }

    /// The form of tool-call arguments the template writes.
    pub fn arguments_form(&self) -> ArgumentsForm {
        self.shape.arguments
    }

    /// True when a reply that only calls tools reaches the template with
    /// `content` none (as OpenAI clients send it), false when as an empty
    /// string (the template fails on none).
    pub fn takes_null_content(&self) -> bool {
        self.shape.null_content
    }

    /// The thinking switches the template reads, of [`THINK_SWITCHES`].
    pub fn think_switches(&self) -> &[&'static str] {
        &self.switches
    }

    /// Variables the template reads whose names sound like a thinking
    /// switch (`think`, `reason`) but that bmoe does not know how to set.
    pub fn unknown_switches(&self) -> &[String] {
        &self.unknown_switches
    }

    /// The template's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The source as compiled (transformers-only tags removed).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages`.
    pub fn render(&self, messages: &[Message], opts: &RenderOptions) -> Result<String, TemplateError> {
        self.render_as(messages, opts, self.shape)
    }

    /// Renders `messages` with tool calls given as `shape` says.
    fn render_as(&self, messages: &[Message], opts: &RenderOptions, shape: CallShape) -> Result<String, TemplateError> {
        let template = self.env.get_template(&self.name).map_err(|e| error(&self.name, &e))?;
        let messages: Vec<Value> = messages.iter().map(|m| message_value(m, shape)).collect();
        let mut ctx = vec![
            ("messages", Value::from(messages)),
            ("add_generation_prompt", Value::from(opts.add_generation_prompt)),
            ("bos_token", Value::from(opts.bos_token.clone())),
            ("eos_token", Value::from(opts.eos_token.clone())),
        ];
        ctx.extend(self.switch_values(opts));
        // Transformers defines `tools` and `documents` always, as none when
        // there are none.
        let tools = opts.tools.as_ref().map_or(Value::from(()), Value::from_serialize);
        ctx.push(("tools", tools));
        ctx.push(("documents", Value::from(())));
        let now = opts.now.unwrap_or_else(|| chrono::Local::now().naive_local());
        ctx.push(("strftime_now", Value::from_function(move |fmt: String| strftime(now, &fmt))));
        let ctx: Value = ctx.into_iter().collect();
        template.render(ctx).map_err(|e| error(&self.name, &e))
    }
}

impl ChatTemplate {
    /// The thinking switches this template gets for `opts`, by name, as
    /// JSON: what bmoe passes besides the conversation, tools and BOS/EOS.
    pub fn variables(&self, opts: &RenderOptions) -> serde_json::Map<String, serde_json::Value> {
        let value = |v: &Value| serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
        self.switch_values(opts).iter().map(|(name, v)| (name.to_string(), value(v))).collect()
    }

    /// What each thinking switch the template reads gets for `opts`.
    /// `enable_thinking` is always passed (templates disagree on its
    /// default); `thinking` and `reasoning` follow it; `thinking_budget` is
    /// 0 with thinking off and `thinking_mode` the template's off word,
    /// both the template's own default with it on; `reasoning_effort` is
    /// the off word with thinking off where the template spells one (else
    /// the effort asked for, or `high` when none is and the template spells
    /// it); `thinking_effort` is the effort asked for, if any.
    fn switch_values(&self, opts: &RenderOptions) -> Vec<(&'static str, Value)> {
        let think = opts.enable_thinking;
        let effort = opts.reasoning_effort.as_deref();
        let mut values = vec![("enable_thinking", Value::from(think))];
        for &switch in &self.switches {
            let value = match switch {
                "thinking" | "reasoning" => Some(Value::from(think)),
                "thinking_budget" if !think => Some(Value::from(0)),
                "thinking_mode" if !think => self.off_word.map(Value::from),
                "reasoning_effort" if !think && self.off_word.is_some() => self.off_word.map(Value::from),
                "reasoning_effort" if self.off_word.is_some() => effort.or(self.on_effort).map(Value::from),
                "reasoning_effort" | "thinking_effort" | "reasoning_strength" => effort.map(Value::from),
                _ => None,
            };
            values.extend(value.map(|v| (switch, v)));
        }
        values
    }
}

/// A message as a template sees it: reasoning under the key a client sent
/// it under, or else both names templates use (`reasoning_content`, and
/// `thinking` for gpt-oss and LFM2.5); tool
/// calls and the content of a reply that only calls tools as `shape`
/// says; other absent keys left out rather than null.
fn message_value(m: &Message, shape: CallShape) -> Value {
    let content = if m.content_null && shape.null_content && !m.tool_calls.is_empty() {
        Value::from(())
    } else {
        Value::from(m.content.clone())
    };
    let mut fields = vec![("role", Value::from(m.role.clone())), ("content", content)];
    if let Some(r) = &m.reasoning {
        for key in ["reasoning_content", "thinking"] {
            if m.reasoning_key.is_none_or(|k| k.name() == key) {
                fields.push((key, Value::from(r.clone())));
            }
        }
    }
    if !m.tool_calls.is_empty() {
        let calls: Vec<ToolCall> = m.tool_calls.iter().map(|c| arguments_in(c, shape.arguments)).collect();
        fields.push(("tool_calls", Value::from_serialize(&calls)));
    }
    if let Some(id) = &m.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.clone())));
    }
    if let Some(name) = &m.name {
        fields.push(("name", Value::from(name.clone())));
    }
    fields.into_iter().collect()
}

/// `call` with its arguments in `form`: text parsed for a template that
/// needs a mapping, an object written as compact JSON text for one that
/// needs text, otherwise as the message holds them.
fn arguments_in(call: &ToolCall, form: ArgumentsForm) -> ToolCall {
    let mut call = call.clone();
    let arguments = &call.function.arguments;
    let converted = match form {
        ArgumentsForm::Object if arguments.is_string() => Some(call.function.arguments_object()),
        ArgumentsForm::Text if arguments.is_object() => Some(arguments.to_string().into()),
        _ => None,
    };
    if let Some(arguments) = converted {
        call.function.arguments = arguments;
    }
    call
}

fn error(template: &str, e: &Error) -> TemplateError {
    let message = match e.kind() {
        ErrorKind::OutOfFuel => "the template ran too long (stopped after its work limit)".to_string(),
        _ => match e.detail() {
            Some(detail) => format!("{}: {detail}", kind_text(e.kind())),
            None => kind_text(e.kind()).to_string(),
        },
    };
    TemplateError { template: template.to_string(), line: e.line(), message }
}

fn kind_text(kind: ErrorKind) -> String {
    match kind {
        ErrorKind::SyntaxError => "syntax error".into(),
        ErrorKind::UndefinedError => "undefined value".into(),
        ErrorKind::UnknownFunction => "unknown function".into(),
        ErrorKind::UnknownFilter => "unknown filter".into(),
        ErrorKind::UnknownMethod => "unknown method".into(),
        ErrorKind::InvalidOperation => "invalid operation".into(),
        other => format!("{other}"),
    }
}

/// Removes transformers' `{% generation %}` and `{% endgeneration %}` tags
/// (dashed or not): they mark assistant text for training and mean nothing
/// when rendering.
fn strip_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}") else { break };
        let tag = &rest[start..start + len + 2];
        let inner = tag[2..tag.len() - 2].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        out.push_str(&rest[..start]);
        if inner != "generation" && inner != "endgeneration" {
            out.push_str(tag);
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    out
}

/// `raise_exception(msg)`: the template refuses the conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, format!("the template refused the conversation: {msg}")))
}

/// `strftime_now(fmt)`: `now`, formatted.
fn strftime(now: chrono::NaiveDateTime, fmt: &str) -> Result<Value, Error> {
    use std::fmt::Write as _;
    let mut out = String::new();
    write!(out, "{}", now.format(fmt))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {fmt:?}")))?;
    Ok(Value::from(out))
}

/// `x | tojson(indent=None, ensure_ascii=False, sort_keys=False)`, as
/// transformers defines it (Python's `json.dumps`).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    // Accepted for compatibility; Python's defaults are what we write.
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let json =
        serde_json::to_value(&value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from(python_json(&json, indent, ensure_ascii.unwrap_or(false), sort_keys.unwrap_or(false))))
}

/// `text | from_json`.
fn from_json(text: String) -> Result<Value, Error> {
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("from_json: {e}")))?;
    Ok(Value::from_serialize(&json))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[Message]) -> Result<String, TemplateError> {
        ChatTemplate::new("t", source)?.render(messages, &RenderOptions::default())
    }

    #[test]
    fn renders_with_python_methods_and_trimmed_blocks() {
        let src = "{% for m in messages %}\n{{ m.role.upper() }}:{{ m.content.strip() }}|{% endfor %}";
        assert_eq!(render(src, &[Message::new("user", "  hi ")]).unwrap(), "USER:hi|");
    }

    #[test]
    fn generation_tags_are_removed() {
        let src = "a{%- generation -%}b{% endgeneration %}c";
        assert_eq!(strip_generation_tags(src), "abc");
        assert_eq!(render(src, &[]).unwrap(), "abc");
    }

    #[test]
    fn tojson_writes_what_python_writes() {
        let src = "{{ {'a': 1, 'b': [1, 'é<>']} | tojson }}";
        assert_eq!(render(src, &[]).unwrap(), r#"{"a": 1, "b": [1, "é<>"]}"#);
    }

    #[test]
    fn crlf_templates_render_like_their_lf_twins() {
        let messages = [Message::new("system", "S"), Message::new("user", "U")];
        for name in ["qwen3", "gpt-oss", "granite-4.0"] {
            let lf = crate::chat::named_template(name).unwrap();
            assert!(!lf.contains('\r'));
            let crlf = lf.replace('\n', "\r\n");
            assert_eq!(render(&crlf, &messages).unwrap(), render(lf, &messages).unwrap(), "{name}");
        }
        // A lone `\r` too, in text and in a string literal; an escaped one stays.
        let out = render("a\rb{{ 'c\rd' }}{{ '\\r' }}", &[]).unwrap();
        assert_eq!(out, "a\nbc\nd\r");
    }

    #[test]
    fn errors_name_the_template_and_line() {
        let e = ChatTemplate::new("model.gguf", "line one\n{% if %}").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.to_string().starts_with("chat template model.gguf, line 2: syntax error"), "{e}");
        let e = render("x\ny\n{{ raise_exception('no system role') }}", &[]).unwrap_err();
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("no system role"), "{e}");
        let e = render("{{ messages[0].content.nope() }}", &[Message::new("user", "x")]).unwrap_err();
        assert!(e.message.contains("unknown method"), "{e}");
    }

    #[test]
    fn a_runaway_template_stops() {
        let e =
            render("{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}", &[]).unwrap_err();
        assert!(e.message.contains("ran too long"), "{e}");
    }

    #[test]
    fn reasoning_is_given_under_both_names() {
        let src = "{{ messages[0].reasoning_content }}/{{ messages[0].thinking }}/{{ messages[1].reasoning_content is defined }}";
        let with = Message { reasoning: Some("r".into()), ..Message::new("assistant", "a") };
        assert_eq!(render(src, &[with, Message::new("user", "u")]).unwrap(), "r/r/False");
    }
}
