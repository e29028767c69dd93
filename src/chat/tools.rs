//! Tool calls: the calls a model writes in its template's own syntax,
//! found by what the template writes for a call in its history, parsed
//! back into OpenAI-style calls, and the grammar that makes a reply one.

use serde::{Deserialize, Serialize};

/// One function call of an assistant message, OpenAI-style.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The call's id, which its result names (`tool_call_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function a call names and the arguments it passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments as the message holds them: an object, or JSON text
    /// holding one (as the OpenAI API writes it), kept as text so a
    /// template that writes the text gets it unchanged.
    #[serde(default = "empty_object", deserialize_with = "arguments_as_sent")]
    pub arguments: serde_json::Value,
}

impl FunctionCall {
    /// The arguments as an object, whichever form the message holds
    /// (text that is not a JSON object reads as an empty one).
    pub fn arguments_object(&self) -> serde_json::Value {
        match &self.arguments {
            serde_json::Value::String(text) => parse_object(text).unwrap_or_else(empty_object),
            other => other.clone(),
        }
    }
}

fn function_kind() -> String {
    "function".into()
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// `text` parsed as a JSON object.
fn parse_object(text: &str) -> Option<serde_json::Value> {
    serde_json::from_str(text).ok().filter(serde_json::Value::is_object)
}

/// An object, or text that parses as one (kept as the text), or `null` (no
/// arguments); anything else is an error.
fn arguments_as_sent<'de, D: serde::Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
    let value = serde_json::Value::deserialize(d)?;
    match value {
        serde_json::Value::String(ref text) if parse_object(text).is_some() => Ok(value),
        serde_json::Value::String(_) => Err(serde::de::Error::custom("`arguments` text is not a JSON object")),
        serde_json::Value::Object(_) => Ok(value),
        serde_json::Value::Null => Ok(empty_object()),
        _ => Err(serde::de::Error::custom("`arguments` is an object")),
    }
}

impl ToolCall {
    /// A call of `name` with `arguments` (an object) and `id`.
    pub fn new(id: Option<String>, name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall { id, kind: function_kind(), function: FunctionCall { name: name.into(), arguments } }
    }

    /// The call as the OpenAI API writes it (a `tool_calls` entry): its id
    /// (`call_{index}` when it has none), `type` `function`, and the
    /// function's name and arguments as JSON text.
    pub fn to_api(&self, index: usize) -> serde_json::Value {
        let arguments = match &self.function.arguments {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        serde_json::json!({
            "id": self.id.clone().unwrap_or_else(|| format!("call_{index}")),
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        })
    }
}

impl std::fmt::Display for ToolCall {
    /// `name({"key": value})`, as a front end shows a call.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let arguments = self.function.arguments_object();
        write!(f, "{}({})", self.function.name, super::python_json(&arguments, None, false, false))
    }
}

/// How a template writes a tool call, found by rendering one
/// ([`ToolFormat::detect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
    /// (Hermes: Qwen3, Qwen2.5, Granite 4).
    HermesJson,
    /// `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n
    /// </function>\n</tool_call>` (Qwen3.5, Qwen3-Coder, Nemotron 3);
    /// `seed`: Seed-OSS's `<seed:tool_call>`, values without newlines.
    XmlFunction {
        /// Seed-OSS's tags.
        seed: bool,
    },
    /// `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>
    /// </tool_call>` (GLM-4.5 and later); `hunyuan`: the same with
    /// `:opensource` tags, a `<tool_sep>` after the name and newlines.
    ArgKeys {
        /// Hunyuan's tags.
        hunyuan: bool,
    },
    /// gpt-oss channels: `to=functions.NAME<|channel|>commentary
    /// json<|message|>{...}<|call|>`.
    Harmony,
    /// DeepSeek's `<｜DSML｜invoke name="NAME">` with
    /// `<｜DSML｜parameter name="KEY" string="true|false">` values.
    Dsml,
    /// Kimi K2: `<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}<|tool_call_end|>`.
    KimiSections,
    /// Kimi K3: `<|open|>call tool="NAME" index="1"<|sep|>` with
    /// `<|open|>argument key="KEY" type="..."<|sep|>VALUE<|close|>argument<|sep|>`.
    KimiK3,
}

/// A call found in generated text, with the text that wrote it.
#[derive(Debug, Clone, PartialEq)]
pub struct FoundCall {
    /// The call (its `id` only where the format writes one: Kimi K2).
    pub call: ToolCall,
    /// The text of the call as generated.
    pub raw: String,
}

const PROBE_NAME: &str = "probe_fn";

impl ToolFormat {
    /// Every format, in the order [`ToolFormat::detect`] tries them.
    const ALL: [ToolFormat; 9] = [
        ToolFormat::Dsml,
        ToolFormat::KimiSections,
        ToolFormat::KimiK3,
        ToolFormat::Harmony,
        ToolFormat::ArgKeys { hunyuan: true },
        ToolFormat::ArgKeys { hunyuan: false },
        ToolFormat::XmlFunction { seed: true },
        ToolFormat::XmlFunction { seed: false },
        ToolFormat::HermesJson,
    ];

    /// The format `template` writes an assistant's tool call in, found by
    /// rendering a conversation with one (`None`: it writes none bmoe reads).
    pub fn detect(template: &super::ChatTemplate, opts: &super::RenderOptions) -> Option<ToolFormat> {
        use super::Message;
        let call = ToolCall::new(
            Some("functions.probe_fn:0".into()),
            PROBE_NAME,
            serde_json::json!({"probe_key": "probe value"}),
        );
        let messages = [
            Message::new("user", "Hello"),
            Message::reply("", None, vec![call.clone()]),
            Message::tool_result(&call, "probe result"),
        ];
        let opts = super::RenderOptions { add_generation_prompt: true, ..opts.clone() };
        let text = template.render(&messages, &opts).ok()?;
        ToolFormat::ALL.into_iter().find(|f| f.parse(&text, None).iter().any(|c| c.call.function.name == PROBE_NAME))
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::HermesJson => "hermes <tool_call> JSON",
            ToolFormat::XmlFunction { seed: false } => "<tool_call><function=...> (qwen3.5)",
            ToolFormat::XmlFunction { seed: true } => "<seed:tool_call><function=...> (seed-oss)",
            ToolFormat::ArgKeys { hunyuan: false } => "<tool_call> with <arg_key> (glm)",
            ToolFormat::ArgKeys { hunyuan: true } => "<tool_call:opensource> with <arg_key> (hunyuan)",
            ToolFormat::Harmony => "gpt-oss commentary channel",
            ToolFormat::Dsml => "deepseek DSML",
            ToolFormat::KimiSections => "kimi-k2 tool call sections",
            ToolFormat::KimiK3 => "kimi-k3 call tags",
        }
    }

    /// The text that begins one call in this format.
    fn call_opening(self) -> &'static str {
        match self {
            ToolFormat::HermesJson
            | ToolFormat::XmlFunction { seed: false }
            | ToolFormat::ArgKeys { hunyuan: false } => "<tool_call>",
            ToolFormat::XmlFunction { seed: true } => "<seed:tool_call>",
            ToolFormat::ArgKeys { hunyuan: true } => "<tool_call:opensource>",
            ToolFormat::Harmony => "to=functions.",
            ToolFormat::Dsml => "<｜DSML｜invoke name=",
            ToolFormat::KimiSections => "<|tool_call_begin|>",
            ToolFormat::KimiK3 => "<|open|>call tool=",
        }
    }

    /// The texts a reply's calls can begin with (a call's opening, and the
    /// marker opening a section of calls where the format has one): a
    /// front end streaming the answer holds its text back from there.
    pub fn openings(self) -> Vec<&'static str> {
        let mut openings = vec![self.call_opening()];
        openings.extend(self.section_markers().first());
        openings
    }

    /// True when `text` begins more calls than the `complete` ones found in
    /// it: a call was begun and not finished (cut off, or malformed).
    pub fn has_unfinished_call(self, text: &str, complete: usize) -> bool {
        text.matches(self.call_opening()).count() > complete
    }

    /// Markers around a reply's calls that belong to no single call.
    fn section_markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::ArgKeys { hunyuan: true } => &["<tool_calls:opensource>", "</tool_calls:opensource>"],
            ToolFormat::Dsml => &["<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"],
            ToolFormat::KimiSections => &["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"],
            ToolFormat::KimiK3 => &["<|open|>tools<|sep|>", "<|close|>tools<|sep|>"],
            _ => &[],
        }
    }

    /// The complete calls in `text`, in order. `tools` (the list the model
    /// was shown) types the values of formats that write them as text: a
    /// parameter declared a string stays text, any other is read as JSON
    /// where it parses. A call cut off before its end is not one.
    pub fn parse(self, text: &str, tools: Option<&serde_json::Value>) -> Vec<FoundCall> {
        let typed = |name: &str, key: &str, value: &str| typed_value(tools, name, key, value);
        let mut found = Vec::new();
        let mut push = |raw: &str, name: &str, arguments: Option<serde_json::Value>, id: Option<String>| {
            if let Some(arguments @ serde_json::Value::Object(_)) = arguments
                && !name.is_empty()
            {
                found.push(FoundCall { call: ToolCall::new(id, name, arguments), raw: raw.to_string() });
            }
        };
        match self {
            ToolFormat::HermesJson => {
                for (raw, inner) in blocks(text, "<tool_call>", "</tool_call>") {
                    let Ok(value) = serde_json::from_str::<serde_json::Value>(inner.trim()) else { continue };
                    let name = value.get("name").and_then(serde_json::Value::as_str).unwrap_or("");
                    push(raw, name, json_arguments(value.get("arguments")), None);
                }
            }
            ToolFormat::XmlFunction { seed } => {
                let (open, close) =
                    if seed { ("<seed:tool_call>", "</seed:tool_call>") } else { ("<tool_call>", "</tool_call>") };
                for (raw, inner) in blocks(text, open, close) {
                    for (_, function) in blocks(inner, "<function=", "</function>") {
                        let Some((name, body)) = function.split_once('>') else { continue };
                        let mut args = serde_json::Map::new();
                        for (_, param) in blocks(body, "<parameter=", "</parameter>") {
                            if let Some((key, value)) = param.split_once('>') {
                                let value = value.strip_prefix('\n').unwrap_or(value);
                                let value = value.strip_suffix('\n').unwrap_or(value);
                                args.insert(key.to_string(), typed(name, key, value));
                            }
                        }
                        push(raw, name.trim(), Some(args.into()), None);
                    }
                }
            }
            ToolFormat::ArgKeys { hunyuan } => {
                let s = if hunyuan { ":opensource" } else { "" };
                for (raw, inner) in blocks(text, &format!("<tool_call{s}>"), &format!("</tool_call{s}>")) {
                    let name = inner[..inner.find('<').unwrap_or(inner.len())].trim();
                    let keys = blocks(inner, &format!("<arg_key{s}>"), &format!("</arg_key{s}>"));
                    let values = blocks(inner, &format!("<arg_value{s}>"), &format!("</arg_value{s}>"));
                    let args: serde_json::Map<_, _> =
                        keys.iter().zip(&values).map(|((_, k), (_, v))| (k.to_string(), typed(name, k, v))).collect();
                    push(raw, name, Some(args.into()), None);
                }
            }
            ToolFormat::Harmony => {
                let mut from = 0;
                while let Some(at) = text[from..].find("to=functions.").map(|i| i + from) {
                    let name_at = at + "to=functions.".len();
                    let name_end = text[name_at..]
                        .find(|c: char| c.is_whitespace() || c == '<')
                        .map_or(text.len(), |i| i + name_at);
                    let Some(body) = text[name_end..].find("<|message|>").map(|i| i + name_end + "<|message|>".len())
                    else {
                        break;
                    };
                    let end = text[body..].find("<|call|>").map_or(text.len(), |i| i + body);
                    let raw_end = if end < text.len() { end + "<|call|>".len() } else { end };
                    // The call's header starts at its channel when that comes first.
                    let start = text[from..at].rfind("<|channel|>").map_or(at, |i| i + from);
                    let args = serde_json::from_str(text[body..end].trim()).ok();
                    push(&text[start..raw_end], &text[name_at..name_end], args, None);
                    from = raw_end;
                }
            }
            ToolFormat::Dsml => {
                for (raw, inner) in blocks(text, "<｜DSML｜invoke name=\"", "</｜DSML｜invoke>") {
                    let Some((name, body)) = inner.split_once("\">") else { continue };
                    let tags = ("<｜DSML｜parameter name=\"", ">", "</｜DSML｜parameter>");
                    push(raw, name, Some(tagged_arguments(body, tags, "string=\"true\"").into()), None);
                }
            }
            ToolFormat::KimiSections => {
                for (raw, inner) in blocks(text, "<|tool_call_begin|>", "<|tool_call_end|>") {
                    let Some((id, args)) = inner.split_once("<|tool_call_argument_begin|>") else { continue };
                    let id = id.trim();
                    let name = id.strip_prefix("functions.").unwrap_or(id);
                    let name = name.rsplit_once(':').map_or(name, |(n, _)| n);
                    push(raw, name, serde_json::from_str(args.trim()).ok(), Some(id.to_string()));
                }
            }
            ToolFormat::KimiK3 => {
                for (raw, inner) in blocks(text, "<|open|>call tool=\"", "<|close|>call<|sep|>") {
                    let Some((name, body)) = inner.split_once('"') else { continue };
                    let tags = ("<|open|>argument key=\"", "<|sep|>", "<|close|>argument<|sep|>");
                    push(raw, name, Some(tagged_arguments(body, tags, "type=\"string\"").into()), None);
                }
            }
        }
        found
    }

    /// `text` without the calls found in it and their section markers.
    pub fn strip_calls(self, text: &str, calls: &[FoundCall]) -> String {
        let mut out = text.to_string();
        for call in calls {
            out = out.replacen(&call.raw, "", 1);
        }
        for marker in self.section_markers() {
            out = out.replace(marker, "");
        }
        out.trim().to_string()
    }
}

/// Each complete `open ... close` block of `text`: the whole block and
/// what lies between the markers.
fn blocks<'a>(text: &'a str, open: &str, close: &str) -> Vec<(&'a str, &'a str)> {
    let mut out = Vec::new();
    let mut rest = 0;
    while let Some(start) = text[rest..].find(open).map(|i| i + rest) {
        let inner = start + open.len();
        let Some(end) = text[inner..].find(close).map(|i| i + inner) else { break };
        out.push((&text[start..end + close.len()], &text[inner..end]));
        rest = end + close.len();
    }
    out
}

/// Arguments written one tagged block each, `OPEN KEY" ATTRIBUTES START
/// VALUE CLOSE` (`tags` = open, start, close): the value is text where the
/// attributes hold `text_attribute`, else JSON.
fn tagged_arguments(
    body: &str,
    tags: (&str, &str, &str),
    text_attribute: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let (open, start, close) = tags;
    let mut args = serde_json::Map::new();
    for (_, block) in blocks(body, open, close) {
        let Some((key, rest)) = block.split_once('"') else { continue };
        let Some((attributes, value)) = rest.split_once(start) else { continue };
        let value = if attributes.contains(text_attribute) { text_value(value) } else { json_or_text(value) };
        args.insert(key.to_string(), value);
    }
    args
}

/// Arguments given as an object, or as JSON text holding one.
fn json_arguments(value: Option<&serde_json::Value>) -> Option<serde_json::Value> {
    match value {
        Some(serde_json::Value::String(text)) => serde_json::from_str(text).ok(),
        Some(object @ serde_json::Value::Object(_)) => Some(object.clone()),
        None => Some(serde_json::Value::Object(serde_json::Map::new())),
        Some(_) => None,
    }
}

fn text_value(text: &str) -> serde_json::Value {
    serde_json::Value::String(text.to_string())
}

fn json_or_text(text: &str) -> serde_json::Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|_| text_value(text))
}

/// A value written as text: a string where the tool declares the
/// parameter one (or declares nothing and it is not JSON), else its JSON.
fn typed_value(tools: Option<&serde_json::Value>, function: &str, key: &str, value: &str) -> serde_json::Value {
    match parameter_schema(tools, function, key).and_then(|s| s.get("type")).and_then(serde_json::Value::as_str) {
        Some("string") => text_value(value),
        _ => json_or_text(value),
    }
}

/// The schema `tools` gives parameter `key` of `function`.
fn parameter_schema<'a>(
    tools: Option<&'a serde_json::Value>,
    function: &str,
    key: &str,
) -> Option<&'a serde_json::Value> {
    let tool =
        tools?.as_array()?.iter().find(|t| t.pointer("/function/name").and_then(|n| n.as_str()) == Some(function))?;
    tool.pointer("/function/parameters/properties")?.get(key)
}

/// One tool of a list, as a call grammar needs it: its name and its
/// required parameters, in the order the schema lists them.
struct ToolShape<'a> {
    name: &'a str,
    /// The whole parameters schema (`None`: the tool takes none).
    parameters: Option<&'a serde_json::Value>,
    required: Vec<(&'a str, &'a serde_json::Value)>,
}

impl<'a> ToolShape<'a> {
    fn of(tool: &'a serde_json::Value) -> Result<ToolShape<'a>, String> {
        let name =
            tool.pointer("/function/name").and_then(serde_json::Value::as_str).ok_or("a tool without function.name")?;
        let parameters = tool.pointer("/function/parameters");
        let properties = parameters.and_then(|p| p.get("properties")).and_then(serde_json::Value::as_object);
        let required: Vec<&str> = parameters
            .and_then(|p| p.get("required"))
            .and_then(serde_json::Value::as_array)
            .map(|r| r.iter().filter_map(serde_json::Value::as_str).collect())
            .unwrap_or_default();
        let required = properties
            .map(|props| {
                props.iter().filter(|(k, _)| required.contains(&k.as_str())).map(|(k, v)| (k.as_str(), v)).collect()
            })
            .unwrap_or_default();
        Ok(ToolShape { name, parameters, required })
    }
}

/// How a value is written where a format writes values as text.
struct TextValue {
    /// The GBNF expression.
    expr: String,
    /// Written as plain text (a string), not JSON.
    is_text: bool,
    /// Kimi K3's `type` attribute for it.
    kind: &'static str,
}

impl ToolFormat {
    /// A GBNF grammar whose text is exactly one call of one of `tools` in
    /// this format, written as the template writes calls; arguments follow
    /// each tool's parameter schema (its required parameters; see
    /// [`crate::schema`] for what a schema may use). `prompt`, the
    /// rendered prompt the reply continues, decides how the call starts
    /// where a format needs it (a gpt-oss or Kimi K3 message left open).
    pub fn call_grammar(self, tools: &serde_json::Value, prompt: &str) -> Result<String, String> {
        use crate::schema::text_literal as lit;
        let list = tools.as_array().filter(|l| !l.is_empty()).ok_or("no tools to call")?;
        let mut rules = crate::schema::GrammarRules::default();
        let mut text_rule = false;
        let mut alternatives = Vec::new();
        for (i, tool) in list.iter().enumerate() {
            let shape = ToolShape::of(tool)?;
            let rule = format!("tool{i}");
            let at = |what: &str| format!("tool {:?}: {what}", shape.name);
            let body = if let Some((open, close)) = self.json_call(shape.name, prompt) {
                let args = match shape.parameters {
                    Some(p) => rules.schema(&format!("{rule}-args"), p).map_err(|e| at(&e))?,
                    None => "\"{}\"".into(),
                };
                format!("{} {args} {}", lit(&open), lit(&close))
            } else {
                let (open, close) = self.text_call(shape.name, prompt);
                let mut parts = vec![lit(&open)];
                for (j, (key, schema)) in shape.required.iter().enumerate() {
                    let root = shape.parameters.unwrap_or(schema);
                    let value = value_as_text(schema, root, &format!("{rule}-p{j}"), &mut rules).map_err(|e| at(&e))?;
                    text_rule |= value.expr == "raw-text";
                    let (before, after) = self.text_parameter(key, &value);
                    parts.extend([lit(&before), value.expr, lit(&after)]);
                }
                parts.push(lit(&close));
                parts.join(" ")
            };
            rules.push(&rule, body);
            alternatives.push(rule);
        }
        if text_rule {
            rules.push("raw-text", "[^<]*".into());
        }
        Ok(rules.finish(&alternatives.join(" | ")))
    }

    /// The text before and after a call's JSON arguments, for the formats
    /// that write arguments as one JSON object.
    fn json_call(self, name: &str, prompt: &str) -> Option<(String, String)> {
        match self {
            ToolFormat::HermesJson => {
                Some((format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": "), "}\n</tool_call>".into()))
            }
            ToolFormat::Harmony => {
                // Inside an open message (thinking turned off opens the final
                // channel), the message ends first.
                let lead = if prompt.ends_with("<|message|>") { "<|end|><|start|>assistant" } else { "" };
                Some((format!("{lead} to=functions.{name}<|channel|>commentary json<|message|>"), "<|call|>".into()))
            }
            ToolFormat::KimiSections => Some((
                format!(
                    "<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>"
                ),
                "<|tool_call_end|><|tool_calls_section_end|>".into(),
            )),
            _ => None,
        }
    }

    /// The text before a call's first parameter and after its last, for
    /// the formats that write parameters one by one.
    fn text_call(self, name: &str, prompt: &str) -> (String, String) {
        match self {
            ToolFormat::XmlFunction { seed: false } => {
                (format!("<tool_call>\n<function={name}>\n"), "</function>\n</tool_call>".into())
            }
            ToolFormat::XmlFunction { seed: true } => {
                (format!("<seed:tool_call>\n<function={name}>\n"), "</function>\n</seed:tool_call>".into())
            }
            ToolFormat::ArgKeys { hunyuan: false } => (format!("<tool_call>{name}"), "</tool_call>".into()),
            ToolFormat::ArgKeys { hunyuan: true } => (
                format!("<tool_calls:opensource>\n<tool_call:opensource>{name}<tool_sep:opensource>\n"),
                "</tool_call:opensource>\n</tool_calls:opensource>".into(),
            ),
            ToolFormat::Dsml => (
                format!("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"{name}\">\n"),
                "</｜DSML｜invoke>\n</｜DSML｜tool_calls>".into(),
            ),
            _ => {
                let lead = if prompt.ends_with("<|open|>response<|sep|>") { "<|close|>response<|sep|>" } else { "" };
                (
                    format!("{lead}<|open|>tools<|sep|><|open|>call tool=\"{name}\" index=\"1\"<|sep|>"),
                    "<|close|>call<|sep|><|close|>tools<|sep|>".into(),
                )
            }
        }
    }

    /// The text before and after one parameter's value.
    fn text_parameter(self, key: &str, value: &TextValue) -> (String, String) {
        match self {
            ToolFormat::XmlFunction { seed: false } => (format!("<parameter={key}>\n"), "\n</parameter>\n".into()),
            ToolFormat::XmlFunction { seed: true } => (format!("<parameter={key}>"), "</parameter>\n".into()),
            ToolFormat::ArgKeys { hunyuan: false } => {
                (format!("<arg_key>{key}</arg_key><arg_value>"), "</arg_value>".into())
            }
            ToolFormat::ArgKeys { hunyuan: true } => (
                format!("<arg_key:opensource>{key}</arg_key:opensource>\n<arg_value:opensource>"),
                "</arg_value:opensource>\n".into(),
            ),
            ToolFormat::Dsml => (
                format!("<｜DSML｜parameter name=\"{key}\" string=\"{}\">", value.is_text),
                "</｜DSML｜parameter>\n".into(),
            ),
            _ => (
                format!("<|open|>argument key=\"{key}\" type=\"{}\"<|sep|>", value.kind),
                "<|close|>argument<|sep|>".into(),
            ),
        }
    }
}

/// How `schema`'s values are written as text: strings (an enum or const of
/// strings, or any text without `<`) as they are, anything else as JSON
/// (`$ref`s resolved in `root`, the tool's parameters schema).
fn value_as_text(
    schema: &serde_json::Value,
    root: &serde_json::Value,
    rule: &str,
    rules: &mut crate::schema::GrammarRules,
) -> Result<TextValue, String> {
    use serde_json::Value;
    let choices: Option<Vec<&Value>> = match (schema.get("enum"), schema.get("const")) {
        (Some(Value::Array(values)), _) => Some(values.iter().collect()),
        (_, Some(value)) => Some(vec![value]),
        _ => None,
    };
    if let Some(texts) = choices.as_ref().and_then(|c| c.iter().map(|v| v.as_str()).collect::<Option<Vec<_>>>()) {
        let expr =
            format!("({})", texts.iter().map(|t| crate::schema::text_literal(t)).collect::<Vec<_>>().join(" | "));
        return Ok(TextValue { expr, is_text: true, kind: "string" });
    }
    let declared = schema.get("type").and_then(Value::as_str);
    if declared == Some("string") && choices.is_none() {
        if let Some(key) = ["pattern", "format"].into_iter().find(|k| schema.get(*k).is_some()) {
            return Err(format!(
                "{rule}: `{key}` on a string this template writes as text (not JSON) is not supported"
            ));
        }
        let bounds = match schema.as_object() {
            Some(object) => crate::schema::length_bounds(object, rule)?,
            None => None,
        };
        let expr = bounds.map_or_else(|| "raw-text".to_string(), |b| format!("[^<]{b}"));
        return Ok(TextValue { expr, is_text: true, kind: "string" });
    }
    let kind = match declared.or_else(|| choices.and_then(|c| c.first().copied()).map(json_kind)) {
        Some("integer" | "number") => "number",
        Some("boolean") => "boolean",
        Some("array") => "array",
        Some("null") => "null",
        _ => "object",
    };
    Ok(TextValue { expr: rules.schema_within(rule, schema, root)?, is_text: false, kind })
}

/// The JSON Schema type name of `value`.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::{ChatFormat, Message, NAMED_TEMPLATES};

    fn weather_tools() -> serde_json::Value {
        serde_json::json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "days", "unit"]}}}])
    }

    fn format_of(name: &str) -> Option<ToolFormat> {
        let source = NAMED_TEMPLATES.iter().find(|(n, _)| *n == name).unwrap().1;
        ChatFormat::new(name, Some(source), "<s>", "</s>").unwrap().tool_format()
    }

    #[test]
    fn each_template_family_is_known_by_what_it_writes() {
        use ToolFormat::*;
        let expected = [
            ("qwen3", Some(HermesJson)),
            ("qwen2.5", Some(HermesJson)),
            ("granite-4.0", Some(HermesJson)),
            ("qwen3.5", Some(XmlFunction { seed: false })),
            ("nemotron-3", Some(XmlFunction { seed: false })),
            ("seed-oss", Some(XmlFunction { seed: true })),
            ("glm-4.7", Some(ArgKeys { hunyuan: false })),
            ("hunyuan", Some(ArgKeys { hunyuan: true })),
            ("gpt-oss", Some(Harmony)),
            ("deepseek-v4", Some(Dsml)),
            ("kimi-k2-thinking", Some(KimiSections)),
            ("kimi-k3", Some(KimiK3)),
            // Formats bmoe does not read: pythonic lists, gemma's own, none written.
            ("lfm2", None),
            ("lfm2.5", None),
            ("gemma-4", None),
            ("granite-3.3", None),
        ];
        for (name, format) in expected {
            assert_eq!(format_of(name), format, "{name}");
        }
        assert_eq!(expected.len(), NAMED_TEMPLATES.len(), "every bundled template is listed");
    }

    #[test]
    fn a_call_in_the_history_parses_back_with_its_types() {
        // Strings stay text, numbers come back as numbers, in every format.
        let tools = weather_tools();
        let args = serde_json::json!({"city": "Oslo 7", "days": 3, "unit": "C"});
        for (name, source) in NAMED_TEMPLATES {
            let f = ChatFormat::new(name, Some(source), "<s>", "</s>").unwrap().with_tools(Some(tools.clone()));
            let Some(format) = f.tool_format() else { continue };
            let call = ToolCall::new(Some("functions.get_weather:0".into()), "get_weather", args.clone());
            let messages = [
                Message::new("user", "Weather?"),
                Message::reply("", None, vec![call.clone()]),
                Message::tool_result(&call, "sunny"),
            ];
            let text = f.template().render(&messages, &crate::chat::RenderOptions::default()).unwrap();
            let found = format.parse(&text, Some(&tools));
            assert_eq!(found.len(), 1, "{name}: {text}");
            assert_eq!(found[0].call.function, call.function, "{name}");
            assert!(text.contains(&found[0].raw), "{name}");
        }
    }

    #[test]
    fn calls_as_models_write_them() {
        // gpt-oss names the recipient after the channel; Kimi numbers its ids.
        let text = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let found = ToolFormat::Harmony.parse(text, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].call.function.arguments, serde_json::json!({"city": "Paris"}));
        assert!(found[0].raw.starts_with("<|channel|>commentary to="), "{}", found[0].raw);
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.search:2<|tool_call_argument_begin|>\
                    {\"q\": \"moe\"}<|tool_call_end|><|tool_calls_section_end|>";
        let found = ToolFormat::KimiSections.parse(text, None);
        assert_eq!(found[0].call.id.as_deref(), Some("functions.search:2"));
        assert_eq!(found[0].call.function.name, "search");
        assert_eq!(ToolFormat::KimiSections.strip_calls(&format!("Let me look.{text}"), &found), "Let me look.");
        // Two calls in one reply; one cut off before its end is not a call.
        let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \
                    \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call><tool_call>\n{\"name\": \"c\"";
        let names: Vec<_> =
            ToolFormat::HermesJson.parse(text, None).into_iter().map(|f| f.call.function.name).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(ToolFormat::HermesJson.parse("<tool_call>\nnot json\n</tool_call>", None).is_empty());
        // The third call was begun and cut off.
        assert!(ToolFormat::HermesJson.has_unfinished_call(text, 2));
        assert!(!ToolFormat::HermesJson.has_unfinished_call(text, 3));
    }

    #[test]
    fn call_grammars_write_each_format() {
        let tools = weather_tools();
        let g = ToolFormat::HermesJson.call_grammar(&tools, "").unwrap();
        assert!(g.starts_with("root ::= tool0\n"), "{g}");
        assert!(
            g.contains(
                r#"tool0 ::= "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " tool0-args "}\n</tool_call>""#
            ),
            "{g}"
        );
        let g = ToolFormat::ArgKeys { hunyuan: false }.call_grammar(&tools, "").unwrap();
        assert!(g.contains(r#""<arg_key>city</arg_key><arg_value>" raw-text "</arg_value>""#), "{g}");
        assert!(g.contains(r#""<arg_key>unit</arg_key><arg_value>" ("C" | "F") "</arg_value>""#), "{g}");
        assert!(g.contains("raw-text ::= [^<]*\n"), "{g}");
        let g = ToolFormat::Dsml.call_grammar(&tools, "").unwrap();
        assert!(g.contains(r#""<｜DSML｜parameter name=\"days\" string=\"false\">" tool0-p1 "#), "{g}");
        // gpt-oss: a final channel left open by thinking turned off ends first.
        let g = ToolFormat::Harmony.call_grammar(&tools, "...<|channel|>final<|message|>").unwrap();
        assert!(g.contains(r#""<|end|><|start|>assistant to=functions.get_weather"#), "{g}");
        let g = ToolFormat::KimiK3.call_grammar(&tools, "<|open|>response<|sep|>").unwrap();
        assert!(g.contains(r#"type=\"number\"<|sep|>" tool0-p1"#), "{g}");
        assert!(g.contains(r#"tool0 ::= "<|close|>response<|sep|><|open|>tools<|sep|>"#), "{g}");
        // What a schema cannot say is an error naming the tool.
        let bad = serde_json::json!([{"function": {"name": "f", "parameters": {"type": "object",
            "properties": {"n": {"type": "integer", "not": {}}}, "required": ["n"]}}}]);
        let e = ToolFormat::HermesJson.call_grammar(&bad, "").unwrap_err();
        assert!(e.contains("tool \"f\"") && e.contains("`not` is not supported"), "{e}");
        assert!(ToolFormat::HermesJson.call_grammar(&serde_json::json!([]), "").is_err());
        // A value written as text may point into the tool's own `$defs`; a
        // pattern on text it cannot keep is an error, not ignored.
        let refs = serde_json::json!([{"function": {"name": "f", "parameters": {"type": "object",
            "$defs": {"n": {"type": "integer", "minimum": 1, "maximum": 3}},
            "properties": {"n": {"$ref": "#/$defs/n"}, "s": {"type": "string", "pattern": "^a+$"}},
            "required": ["n"]}}}]);
        let g = ToolFormat::ArgKeys { hunyuan: false }.call_grammar(&refs, "").unwrap();
        assert!(g.contains("<arg_key>n</arg_key>"), "{g}");
        let mut pattern = refs.clone();
        pattern[0]["function"]["parameters"]["required"] = serde_json::json!(["n", "s"]);
        let e = ToolFormat::ArgKeys { hunyuan: false }.call_grammar(&pattern, "").unwrap_err();
        assert!(e.contains("`pattern`"), "{e}");
        assert!(ToolFormat::HermesJson.call_grammar(&pattern, "").is_ok(), "JSON formats keep the pattern");
    }

    #[test]
    fn arguments_read_as_openai_writes_them() {
        let m: Message = serde_json::from_str(
            r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": [1, 2]}"}}]}"#,
        )
        .unwrap();
        assert_eq!(m.content, "");
        // Kept as sent; read as an object where one is needed.
        assert_eq!(m.tool_calls[0].function.arguments, serde_json::json!("{\"a\": [1, 2]}"));
        assert_eq!(m.tool_calls[0].function.arguments_object(), serde_json::json!({"a": [1, 2]}));
        assert_eq!(m.tool_calls[0].to_string(), r#"f({"a": [1, 2]})"#);
        let e = serde_json::from_str::<Message>(
            r#"{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a JSON object"), "{e}");
    }
}
