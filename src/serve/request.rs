//! Reading OpenAI-style request bodies into the work the engine runs:
//! messages into a conversation, sampling fields, stop strings, tools,
//! structured output and thinking switches into a turn's settings. Fields
//! this server does not know are ignored, as other OpenAI-compatible
//! servers do; fields it knows with values it cannot honour are refused
//! with an error naming them.

use serde::Deserialize;
use serde_json::Value;

use super::error::ApiError;
use crate::chat::{Conversation, Message, ReasoningKey, ToolCall};
use crate::config::RunConfig;
use crate::host::{Prepared, TurnSettings};
use crate::llama::{Constraint, Sampling};

/// Most stop strings a request may give.
pub(super) const MAX_STOPS: usize = 16;
/// Most messages a conversation may hold.
pub const MAX_MESSAGES: usize = 4096;

/// What a request asks the engine for.
#[derive(Debug, Clone)]
pub enum Work {
    /// A chat reply.
    Chat(ChatWork),
    /// A raw completion of a prompt.
    Complete {
        /// The prompt.
        prompt: CompletionPrompt,
    },
}

/// A completion's prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionPrompt {
    /// Text (special tokens in it are read).
    Text(String),
    /// Token ids, decoded as they are.
    Tokens(Vec<i32>),
}

/// A chat request, read.
#[derive(Debug, Clone)]
pub struct ChatWork {
    /// The conversation to reply to.
    pub conversation: Conversation,
    /// The tools shown to the model (none when `tool_choice` is `none`).
    pub tools: Option<Value>,
    /// The reasoning effort asked for.
    pub effort: Option<String>,
}

/// A request, read and checked.
#[derive(Debug, Clone)]
pub struct Parsed {
    /// What to run.
    pub work: Work,
    /// How to run it.
    pub settings: TurnSettings,
    /// Stream the reply as server-sent events.
    pub stream: bool,
    /// End a stream with a chunk of token counts.
    pub include_usage: bool,
    /// Report each token's log-probability with this many alternatives.
    pub logprobs: Option<u32>,
    /// Report each step's logits digest (a bmoe extension: the digests
    /// `bmoe generate --logits-digest` writes, to check exactness).
    pub logits_digest: bool,
    /// The prompt rendered and tokenized on the request's side (`None`:
    /// not yet; the engine does it).
    pub prepared: Option<Prepared>,
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The fields chat and completion requests share.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Common {
    stream: bool,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n_predict: Option<i64>,
    stop: Option<Stop>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
    min_p: Option<f64>,
    typical_p: Option<f64>,
    repeat_penalty: Option<f64>,
    repeat_last_n: Option<i64>,
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    logit_bias: Option<Value>,
    seed: Option<i64>,
    n: Option<i64>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    logits_digest: Option<bool>,
    response_format: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamOptions {
    include_usage: bool,
}

/// A chat message as OpenAI clients send it.
#[derive(Debug, Deserialize)]
struct ApiMessage {
    role: String,
    #[serde(default)]
    content: Value,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ApiToolCall>>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default, alias = "reasoning")]
    reasoning_content: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ApiToolCall {
    #[serde(default)]
    id: Option<String>,
    function: ApiFunction,
}

#[derive(Debug, Deserialize)]
struct ApiFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// Reads a `POST /v1/chat/completions` body; `default_max` limits a
/// request that sets no `max_tokens` (`None`: the room in the context).
pub fn chat(body: &Value, config: &RunConfig, default_max: Option<u32>) -> Result<Parsed, ApiError> {
    let common = common(body)?;
    let messages = body.get("messages").ok_or_else(|| ApiError::bad_param("messages", "`messages` is required"))?;
    let conversation = conversation(messages)?;
    continuation(body, &conversation)?;
    let (tools, require_call) = tools(body)?;
    let (think, effort) = thinking(body, config)?;
    let mut settings = settings(&common, config, default_max)?;
    settings.think = think;
    settings.require_call = require_call;
    let work = Work::Chat(ChatWork { conversation, tools, effort });
    let logprobs = chat_logprobs(&common)?;
    Ok(Parsed {
        work,
        settings,
        stream: common.stream,
        include_usage: include_usage(&common),
        logprobs,
        logits_digest: common.logits_digest.unwrap_or(false),
        prepared: None,
    })
}

/// Reads a `POST /v1/completions` body (`default_max` as for [`chat`]):
/// one request per prompt of `prompt` (a string, token ids, or a list of
/// either).
pub fn completion(body: &Value, config: &RunConfig, default_max: Option<u32>) -> Result<Vec<Parsed>, ApiError> {
    let common = common(body)?;
    for field in ["echo", "suffix", "best_of"] {
        if body.get(field).is_some_and(|v| !v.is_null() && v != &Value::Bool(false) && v != &Value::from(1)) {
            return Err(ApiError::bad_param(field, format!("`{field}` is not supported by this server")));
        }
    }
    let prompts = prompts(body.get("prompt"))?;
    if common.stream && prompts.len() > 1 {
        return Err(ApiError::bad_param("prompt", "a streamed completion takes one prompt"));
    }
    let settings = settings(&common, config, default_max)?;
    let logprobs = match &common.logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::Bool(true)) => Some(0),
        Some(v) => Some(top_count(v, "logprobs")?),
    };
    let parsed = prompts.into_iter().map(|prompt| Parsed {
        work: Work::Complete { prompt },
        settings: settings.clone(),
        stream: common.stream,
        include_usage: include_usage(&common),
        logprobs,
        logits_digest: common.logits_digest.unwrap_or(false),
        prepared: None,
    });
    Ok(parsed.collect())
}

/// Most prompts one completion request may hold.
const MAX_PROMPTS: usize = 64;

/// A completion request's `prompt`: a string, a list of token ids, or a
/// list of either (one choice each).
fn prompts(value: Option<&Value>) -> Result<Vec<CompletionPrompt>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("prompt", m);
    let one = |v: &Value| -> Result<CompletionPrompt, ApiError> {
        match v {
            Value::String(text) if text.is_empty() => Err(bad("`prompt` is empty")),
            Value::String(text) => Ok(CompletionPrompt::Text(text.clone())),
            Value::Array(ids) if ids.is_empty() => Err(bad("`prompt` is an empty list of token ids")),
            Value::Array(ids) => ids
                .iter()
                .map(|id| id.as_i64().and_then(|n| i32::try_from(n).ok()))
                .collect::<Option<Vec<i32>>>()
                .map(CompletionPrompt::Tokens)
                .ok_or_else(|| bad("a list of token ids holds only integers")),
            _ => Err(bad("`prompt` must be a string, a list of token ids, or a list of those")),
        }
    };
    match value {
        None | Some(Value::Null) => Err(bad("`prompt` is required")),
        Some(Value::Array(list)) if list.iter().any(|v| v.is_string() || v.is_array()) => {
            if list.len() > MAX_PROMPTS {
                return Err(bad(&format!("{} prompts, more than the {MAX_PROMPTS} one request may hold", list.len())));
            }
            if list.is_empty() {
                return Err(bad("`prompt` is an empty list"));
            }
            list.iter().map(one).collect()
        }
        Some(v) => Ok(vec![one(v)?]),
    }
}

impl Parsed {
    /// The prompt of a completion request.
    pub fn work_prompt(&self) -> Option<&CompletionPrompt> {
        match &self.work {
            Work::Complete { prompt } => Some(prompt),
            Work::Chat(_) => None,
        }
    }
}

/// What a known field must hold (`null` is always taken as absent).
#[derive(Debug, Clone, Copy)]
enum FieldType {
    Bool,
    Integer,
    Number,
    Object,
    StringOrStrings,
}

/// The fields both endpoints read, with their types.
const FIELD_TYPES: [(&str, FieldType); 21] = [
    ("min_p", FieldType::Number),
    ("typical_p", FieldType::Number),
    ("repeat_penalty", FieldType::Number),
    ("repeat_last_n", FieldType::Integer),
    ("frequency_penalty", FieldType::Number),
    ("presence_penalty", FieldType::Number),
    ("logit_bias", FieldType::Object),
    ("stream", FieldType::Bool),
    ("stream_options", FieldType::Object),
    ("max_tokens", FieldType::Integer),
    ("max_completion_tokens", FieldType::Integer),
    ("n_predict", FieldType::Integer),
    ("temperature", FieldType::Number),
    ("top_p", FieldType::Number),
    ("top_k", FieldType::Integer),
    ("seed", FieldType::Integer),
    ("n", FieldType::Integer),
    ("stop", FieldType::StringOrStrings),
    ("response_format", FieldType::Object),
    ("logits_digest", FieldType::Bool),
    ("top_logprobs", FieldType::Integer),
];

/// Refuses a known field of the wrong type, naming it in plain words.
fn check_types(body: &Value) -> Result<(), ApiError> {
    for (field, kind) in FIELD_TYPES {
        let Some(v) = body.get(field).filter(|v| !v.is_null()) else { continue };
        let (ok, what) = match kind {
            FieldType::Bool => (v.is_boolean(), "true or false"),
            FieldType::Integer => (v.is_i64() || v.is_u64(), "an integer"),
            FieldType::Number => (v.is_number(), "a number"),
            FieldType::Object => (v.is_object(), "an object"),
            FieldType::StringOrStrings => (
                v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                "a string or a list of strings",
            ),
        };
        if !ok {
            return Err(ApiError::bad_param(field, format!("`{field}` must be {what} (got {v})")));
        }
    }
    Ok(())
}

fn common(body: &Value) -> Result<Common, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    check_types(body)?;
    let common: Common = serde_json::from_value(body.clone()).map_err(|e| ApiError::bad_request(e.to_string()))?;
    refuse_samplers(body)?;
    if common.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_param("n", "`n` must be 1: this server writes one choice per request"));
    }
    Ok(common)
}

/// Chat's `logprobs` (true or false) and `top_logprobs` (0 to 20, with
/// `logprobs` true) as the alternatives to report, if any.
fn chat_logprobs(common: &Common) -> Result<Option<u32>, ApiError> {
    let on = match &common.logprobs {
        None | Some(Value::Null) => false,
        Some(Value::Bool(on)) => *on,
        Some(_) => return Err(ApiError::bad_param("logprobs", "`logprobs` must be true or false")),
    };
    let top = match &common.top_logprobs {
        None | Some(Value::Null) => 0,
        Some(v) if on => top_count(v, "top_logprobs")?,
        Some(_) => return Err(ApiError::bad_param("top_logprobs", "`top_logprobs` needs `logprobs: true`")),
    };
    Ok(on.then_some(top))
}

/// A count of alternatives per token: an integer from 0 to [`MAX_TOP`].
fn top_count(v: &Value, field: &str) -> Result<u32, ApiError> {
    let max = super::logprobs::MAX_TOP;
    v.as_u64()
        .filter(|&n| n <= u64::from(max))
        .map(|n| n as u32)
        .ok_or_else(|| ApiError::bad_param(field, format!("`{field}` must be an integer from 0 to {max} (got {v})")))
}

fn include_usage(common: &Common) -> bool {
    common.stream_options.as_ref().is_some_and(|o| o.include_usage)
}

/// The sampling, length, stop and output-format settings of a request
/// over the configuration's.
fn settings(common: &Common, config: &RunConfig, default_max: Option<u32>) -> Result<TurnSettings, ApiError> {
    let mut settings = base_settings(config, default_max);
    let limit = common.max_completion_tokens.or(common.max_tokens).or(common.n_predict.filter(|&n| n >= 0));
    if let Some(n) = limit {
        if n < 1 {
            return Err(ApiError::bad_param("max_tokens", format!("`max_tokens` must be at least 1 (got {n})")));
        }
        settings.n_predict = u32::try_from(n).unwrap_or(u32::MAX);
    }
    if let Some(t) = common.temperature {
        if !t.is_finite() || !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad_param("temperature", format!("`temperature` must be 0 to 2 (got {t})")));
        }
        settings.sampling.temp = t as f32;
    }
    if let Some(p) = common.top_p {
        if !p.is_finite() || !(0.0..=1.0).contains(&p) {
            return Err(ApiError::bad_param("top_p", format!("`top_p` must be 0 to 1 (got {p})")));
        }
        settings.sampling.top_p = p as f32;
    }
    if let Some(k) = common.top_k {
        settings.sampling.top_k = i32::try_from(k.max(0)).unwrap_or(i32::MAX);
    }
    // No seed: a fresh one, which the reply reports (`seed`).
    settings.sampling.seed = common.seed.map_or_else(rand::random, |seed| seed.rem_euclid(1 << 32) as u32);
    penalties(
        &mut settings.sampling,
        Penalties {
            min_p: common.min_p,
            typical_p: common.typical_p,
            repeat_penalty: common.repeat_penalty,
            repeat_last_n: common.repeat_last_n,
            frequency_penalty: common.frequency_penalty,
            presence_penalty: common.presence_penalty,
        },
        "",
    )?;
    if let Some(bias) = &common.logit_bias {
        settings.sampling.logit_bias = logit_bias(bias)?;
    }
    settings.stop = match &common.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(list)) if list.len() > MAX_STOPS => {
            return Err(ApiError::bad_param("stop", format!("at most {MAX_STOPS} stop strings (got {})", list.len())));
        }
        Some(Stop::Many(list)) => list.clone(),
    };
    settings.constraint = match &common.response_format {
        None => None,
        Some(format) => response_schema(format)?,
    };
    Ok(settings)
}

/// The JSON schema a `response_format` asks for, checked.
pub(super) fn response_schema(format: &Value) -> Result<Option<Constraint>, ApiError> {
    let bad = |m: String| ApiError::bad_param("response_format", m);
    let kind = format.get("type").and_then(Value::as_str).unwrap_or("text");
    let schema = match kind {
        "text" => return Ok(None),
        // llama-server's extension: a schema beside `json_object`.
        "json_object" => format.get("schema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
        "json_schema" => {
            let inner = format.get("json_schema").unwrap_or(format);
            inner.get("schema").cloned().ok_or_else(|| bad("`json_schema` has no `schema`".into()))?
        }
        other => return Err(bad(format!("unknown type `{other}` (text, json_object or json_schema)"))),
    };
    Constraint::json_schema_value(schema).map(Some).map_err(bad)
}

/// The penalty and filter fields of a request (each `None` when not given).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Penalties {
    pub min_p: Option<f64>,
    pub typical_p: Option<f64>,
    pub repeat_penalty: Option<f64>,
    pub repeat_last_n: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
}

/// `given` over `sampling`, each checked (OpenAI's ranges for the
/// frequency and presence penalties, llama-server's for the others); a
/// bad one is named with `prefix` before it (`options.`).
pub(super) fn penalties(sampling: &mut Sampling, given: Penalties, prefix: &str) -> Result<(), ApiError> {
    let bad = |field: &str, range: &str, v: f64| {
        ApiError::bad_param(&format!("{prefix}{field}"), format!("`{field}` must be {range} (got {v})"))
    };
    if let Some(v) = given.min_p {
        (0.0..=1.0).contains(&v).then_some(()).ok_or_else(|| bad("min_p", "0 to 1", v))?;
        sampling.min_p = v as f32;
    }
    if let Some(v) = given.typical_p {
        (v > 0.0 && v <= 1.0).then_some(()).ok_or_else(|| bad("typical_p", "above 0, at most 1", v))?;
        sampling.typical_p = v as f32;
    }
    if let Some(v) = given.repeat_penalty {
        (v.is_finite() && v > 0.0).then_some(()).ok_or_else(|| bad("repeat_penalty", "positive", v))?;
        sampling.penalties.repeat = v as f32;
    }
    for (field, value, target) in [
        ("frequency_penalty", given.frequency_penalty, &mut sampling.penalties.frequency),
        ("presence_penalty", given.presence_penalty, &mut sampling.penalties.presence),
    ] {
        if let Some(v) = value {
            (-2.0..=2.0).contains(&v).then_some(()).ok_or_else(|| bad(field, "-2 to 2", v))?;
            *target = v as f32;
        }
    }
    if let Some(n) = given.repeat_last_n {
        // -1: the whole context (no slot holds more than i32::MAX tokens).
        let n = if n == -1 { i32::MAX } else { i32::try_from(n).unwrap_or(-2) };
        (n >= 0).then_some(()).ok_or_else(|| bad("repeat_last_n", "-1 (the context), 0 or more", n as f64))?;
        sampling.penalties.last_n = n;
    }
    Ok(())
}

/// llama-server's sampler fields bmoe does not have, each with the value
/// that turns it off (clients send those values routinely).
const SAMPLERS_REFUSED: [(&str, f64); 8] = [
    ("mirostat", 0.0),
    ("tfs_z", 1.0),
    ("dry_multiplier", 0.0),
    ("xtc_probability", 0.0),
    ("top_n_sigma", -1.0),
    ("dynatemp_range", 0.0),
    ("ignore_eos", 0.0),
    ("penalize_nl", 0.0),
];

/// Refuses a sampler field of llama-server's that would change the reply
/// here (one sent with the value that turns it off is taken).
fn refuse_samplers(body: &Value) -> Result<(), ApiError> {
    for (field, off) in SAMPLERS_REFUSED {
        let value = match body.get(field) {
            None | Some(Value::Null) => continue,
            Some(Value::Bool(b)) => f64::from(u8::from(*b)),
            Some(v) => v.as_f64().unwrap_or(f64::NAN),
        };
        if value != off {
            return Err(ApiError::bad_param(
                field,
                format!("`{field}` is not supported by this server (only {off} is taken: the sampler off)"),
            ));
        }
    }
    Ok(())
}

/// Most entries a `logit_bias` may hold.
const MAX_BIASES: usize = 1024;

/// `logit_bias` as OpenAI writes it: token ids (as strings) to biases from
/// -100 to 100.
pub(super) fn logit_bias(value: &Value) -> Result<Vec<(i32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_param("logit_bias", m);
    let map = value.as_object().ok_or_else(|| bad("`logit_bias` must be an object of token ids to biases".into()))?;
    if map.len() > MAX_BIASES {
        return Err(bad(format!("at most {MAX_BIASES} biases (got {})", map.len())));
    }
    map.iter()
        .map(|(id, bias)| {
            let token = id.trim().parse::<i32>().ok().filter(|&t| t >= 0);
            let token = token.ok_or_else(|| bad(format!("`{id}` is not a token id")))?;
            let bias = bias.as_f64().filter(|b| (-100.0..=100.0).contains(b));
            let bias = bias.ok_or_else(|| bad(format!("token {id}'s bias must be a number from -100 to 100")))?;
            Ok((token, bias as f32))
        })
        .collect()
}

/// The settings of a request that sets nothing: the configuration's, with
/// `default_max` as its token limit (`None`: the room in the context), and
/// a fresh seed.
pub(super) fn base_settings(config: &RunConfig, default_max: Option<u32>) -> TurnSettings {
    let mut sampling = config.sampling();
    sampling.seed = rand::random();
    TurnSettings {
        n_predict: default_max.unwrap_or(u32::MAX),
        sampling,
        constraint: None,
        think: config.chat.think,
        require_call: false,
        stop: Vec::new(),
    }
}

/// A request of the APIs beside chat completions: `work` run with
/// `settings`.
pub(super) fn chat_request(work: ChatWork, settings: TurnSettings, stream: bool, logits_digest: bool) -> Parsed {
    Parsed {
        work: Work::Chat(work),
        settings,
        stream,
        include_usage: false,
        logprobs: None,
        logits_digest,
        prepared: None,
    }
}

/// The number `field` of `body` within `lo..=hi`, if given (`null` is
/// absent).
pub(super) fn number_in(body: &Value, field: &str, lo: f64, hi: f64) -> Result<Option<f64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_f64().filter(|x| x.is_finite() && (lo..=hi).contains(x)).map(Some).ok_or_else(|| {
            ApiError::bad_param(field, format!("`{field}` must be a number from {lo} to {hi} (got {v})"))
        }),
    }
}

/// The integer `field` of `body` within `lo..=hi`, if given.
pub(super) fn integer_in(body: &Value, field: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().filter(|x| (lo..=hi).contains(x)).map(Some).ok_or_else(|| {
            ApiError::bad_param(field, format!("`{field}` must be an integer from {lo} to {hi} (got {v})"))
        }),
    }
}

/// The boolean `field` of `body`, if given.
pub(super) fn bool_field(body: &Value, field: &str) -> Result<Option<bool>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::bad_param(field, format!("`{field}` must be true or false (got {v})"))),
    }
}

/// Stop strings: one string or a list of at most [`MAX_STOPS`].
pub(super) fn stop_strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => return Ok(vec![s.clone()]),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(ApiError::bad_param(field, format!("`{field}` must be a list of strings (got {v})"))),
    };
    if list.len() > MAX_STOPS {
        return Err(ApiError::bad_param(field, format!("at most {MAX_STOPS} stop strings (got {})", list.len())));
    }
    list.iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ApiError::bad_param(field, format!("`{field}` must be a list of strings")))
}

/// Refuses each of `fields` that `body` sets: features this server does
/// not have, named rather than ignored.
pub(super) fn refuse_fields(body: &Value, fields: &[&str]) -> Result<(), ApiError> {
    for field in fields {
        let set = body.get(*field).is_some_and(|v| match v {
            Value::Null | Value::Bool(false) => false,
            Value::Array(a) => !a.is_empty(),
            Value::Object(o) => !o.is_empty(),
            _ => true,
        });
        if set {
            return Err(ApiError::bad_param(field, format!("`{field}` is not supported by this server")));
        }
    }
    Ok(())
}

/// A request's `tools`: the list, empty when absent.
pub(super) fn tool_list(body: &Value) -> Result<Vec<Value>, ApiError> {
    match body.get("tools") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => Ok(list.clone()),
        Some(_) => Err(ApiError::bad_param("tools", "`tools` must be a list")),
    }
}

/// A function tool as chat completions writes it, from the `name`,
/// `description` (if any) and `parameters` another API gives.
pub(super) fn function_tool(name: &str, description: Option<&str>, parameters: Value) -> Value {
    let mut function = serde_json::json!({"name": name, "parameters": parameters});
    if let Some(d) = description {
        function["description"] = Value::from(d);
    }
    serde_json::json!({"type": "function", "function": function})
}

/// `tools` narrowed to the function `name` a `tool_choice` names, which the
/// reply must call; a name not among them is a 400 on `tool_choice`.
pub(super) fn choose_tool(tools: Option<Value>, name: &str) -> Result<(Option<Value>, bool), ApiError> {
    let list = tools.as_ref().and_then(Value::as_array).cloned().unwrap_or_default();
    let chosen: Vec<Value> = list.into_iter().filter(|t| t["function"]["name"].as_str() == Some(name)).collect();
    if chosen.is_empty() {
        return Err(ApiError::bad_param("tool_choice", format!("no tool named `{name}` in `tools`")));
    }
    Ok((Some(Value::Array(chosen)), true))
}

/// An OpenAI-style list of function tools, checked as chat completions
/// checks `tools` (`None`: an empty list).
pub(super) fn checked_tools(list: Vec<Value>, field: &str) -> Result<Option<Value>, ApiError> {
    if list.is_empty() {
        return Ok(None);
    }
    crate::chat::parse_tools(&Value::Array(list).to_string()).map(Some).map_err(|e| ApiError::bad_param(field, e))
}

/// The messages of a chat request as a conversation: a leading system (or
/// developer) message is its system prompt, content parts are joined.
fn conversation(messages: &Value) -> Result<Conversation, ApiError> {
    let list = messages.as_array().ok_or_else(|| ApiError::bad_param("messages", "`messages` must be a list"))?;
    if list.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    if list.len() > MAX_MESSAGES {
        return Err(ApiError::bad_param(
            "messages",
            format!("{} messages, more than the {MAX_MESSAGES} this server reads", list.len()),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, value) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let m: ApiMessage =
            serde_json::from_value(value.clone()).map_err(|e| ApiError::bad_param(&at, e.to_string()))?;
        let role = match m.role.as_str() {
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => {
                return Err(ApiError::bad_param(
                    &at,
                    format!("unknown role `{other}` (system, developer, user, assistant or tool)"),
                ));
            }
        };
        let mut message = Message::new(role, &content_text(&m.content, &at)?);
        message.content_null = m.content.is_null();
        // Only the key the client sent reaches the template, as the message
        // was written (transformers 4 passed it so; 5 adds the other name,
        // and gpt-oss then refuses a reply with text, reasoning and calls).
        // `reasoning`, OpenRouter's name, reads as `reasoning_content`.
        let (key, reasoning) = match (m.reasoning_content, m.thinking) {
            (Some(r), _) => (ReasoningKey::ReasoningContent, Some(r)),
            (None, Some(t)) => (ReasoningKey::Thinking, Some(t)),
            (None, None) => (ReasoningKey::ReasoningContent, None),
        };
        message.reasoning = reasoning.filter(|r| !r.is_empty());
        message.reasoning_key = Some(key);
        message.tool_call_id = m.tool_call_id;
        message.name = m.name;
        for call in m.tool_calls.unwrap_or_default() {
            let arguments = match call.function.arguments {
                Value::Null => Value::Object(Default::default()),
                Value::String(text) if serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()) => {
                    Value::String(text)
                }
                v @ Value::Object(_) => v,
                _ => {
                    return Err(ApiError::bad_param(
                        &at,
                        "a tool call's `arguments` must be a JSON object or JSON text holding one",
                    ));
                }
            };
            message.tool_calls.push(ToolCall::new(call.id, &call.function.name, arguments));
        }
        out.push(message);
    }
    let system = (out[0].role == "system").then(|| out.remove(0).content);
    Ok(Conversation { system, messages: out })
}

/// A message's content as text: a string, `null`, or a list of text parts.
fn content_text(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::Null => Ok(String::new()),
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_param(
                            at,
                            format!("content parts of type `{}` are not supported (text only)", kind.unwrap_or("?")),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::bad_param(at, "`content` must be a string, a list of text parts, or null")),
    }
}

/// Checks `continue_final_message` and `add_generation_prompt` (as
/// transformers names them) against the conversation: a final assistant
/// message with text is continued, so a request may confirm that, but not
/// ask for a new turn after it, or for no generation prompt without one.
fn continuation(body: &Value, conversation: &Conversation) -> Result<(), ApiError> {
    let continues = crate::chat::continued_text(&conversation.messages).is_some();
    let flag = |field: &str| match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::bad_param(field, format!("`{field}` must be true or false (got {v})"))),
    };
    let (cont, gen_prompt) = (flag("continue_final_message")?, flag("add_generation_prompt")?);
    if cont == Some(true) && !continues {
        return Err(ApiError::bad_param(
            "continue_final_message",
            "`continue_final_message` needs the conversation to end in an assistant message with text",
        ));
    }
    if cont == Some(true) && gen_prompt == Some(true) {
        return Err(ApiError::bad_param(
            "add_generation_prompt",
            "`add_generation_prompt` and `continue_final_message` cannot both be true",
        ));
    }
    if continues && (cont == Some(false) || gen_prompt == Some(true)) {
        let field = if cont == Some(false) { "continue_final_message" } else { "add_generation_prompt" };
        return Err(ApiError::bad_param(
            field,
            "this server continues a final assistant message (prefill); for a new turn, end the conversation \
             with a user message",
        ));
    }
    if !continues && gen_prompt == Some(false) {
        return Err(ApiError::bad_param(
            "add_generation_prompt",
            "without a generation prompt there is no reply to open: end the conversation with an assistant message \
             to continue it",
        ));
    }
    Ok(())
}

/// The tools a request shows the model, and whether the reply must call
/// one (`tool_choice` `required`, or a named function).
fn tools(body: &Value) -> Result<(Option<Value>, bool), ApiError> {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(list) => {
            let checked = crate::chat::parse_tools(&list.to_string()).map_err(|e| ApiError::bad_param("tools", e))?;
            Some(checked).filter(|t| t.as_array().is_some_and(|a| !a.is_empty()))
        }
    };
    let choice = body.get("tool_choice").unwrap_or(&Value::Null);
    match choice {
        Value::Null => Ok((tools, false)),
        Value::String(s) if s == "auto" => Ok((tools, false)),
        Value::String(s) if s == "none" => Ok((None, false)),
        Value::String(s) if s == "required" => match tools {
            Some(t) => Ok((Some(t), true)),
            None => Err(ApiError::bad_param("tool_choice", "`required` needs `tools`")),
        },
        Value::Object(_) => {
            let name = choice.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let name =
                name.ok_or_else(|| ApiError::bad_param("tool_choice", "a named choice needs `function.name`"))?;
            choose_tool(tools, name)
        }
        other => Err(ApiError::bad_param("tool_choice", format!("unknown tool_choice {other} (auto, none, required)"))),
    }
}

/// Whether the model thinks, and at what effort: `reasoning_effort`
/// (`none` turns thinking off) and `chat_template_kwargs` (a thinking
/// switch set to false turns it off; `reasoning_effort` in it sets the
/// effort).
fn thinking(body: &Value, config: &RunConfig) -> Result<(bool, Option<String>), ApiError> {
    let mut think = config.chat.think;
    let mut effort = Some(config.chat.reasoning_effort.clone()).filter(|e| !e.is_empty());
    let kwargs = body.get("chat_template_kwargs").unwrap_or(&Value::Null);
    if !kwargs.is_null() && !kwargs.is_object() {
        return Err(ApiError::bad_param("chat_template_kwargs", "`chat_template_kwargs` must be an object"));
    }
    for switch in ["enable_thinking", "thinking", "reasoning"] {
        if let Some(on) = kwargs.get(switch).and_then(Value::as_bool) {
            think = on;
        }
    }
    let asked = body.get("reasoning_effort").or_else(|| kwargs.get("reasoning_effort"));
    match asked {
        None | Some(Value::Null) => {}
        Some(Value::String(level)) => match level.as_str() {
            "none" => think = false,
            "minimal" | "low" => effort = Some("low".into()),
            "medium" => effort = Some("medium".into()),
            "high" | "xhigh" => effort = Some("high".into()),
            other => {
                return Err(ApiError::bad_param(
                    "reasoning_effort",
                    format!("unknown reasoning_effort `{other}` (none, minimal, low, medium, high)"),
                ));
            }
        },
        Some(_) => return Err(ApiError::bad_param("reasoning_effort", "`reasoning_effort` must be a string")),
    }
    Ok((think, effort))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat_of(body: Value) -> Result<Parsed, ApiError> {
        chat(&body, &RunConfig::default(), None)
    }

    #[test]
    fn messages_become_a_conversation_with_its_system_prompt() {
        let parsed = chat_of(json!({
            "model": "x",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": {"a": 2}}}]}
            ],
            "some_future_field": true
        }))
        .unwrap();
        let Work::Chat(work) = parsed.work else { panic!("a chat") };
        assert_eq!(work.conversation.system.as_deref(), Some("Be brief."));
        let m = &work.conversation.messages;
        assert_eq!((m[0].role.as_str(), m[0].content.as_str()), ("user", "Hi there"));
        // Arguments stay as the client sent them: text.
        assert_eq!(m[1].tool_calls[0].function.arguments, json!("{\"a\":1}"));
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
        // A null content stays null for the template; an empty one stays text.
        assert!(m[1].content_null && !m[3].content_null && m[3].content.is_empty());
        assert_eq!(parsed.settings.n_predict, u32::MAX);
    }

    #[test]
    fn bad_fields_are_named() {
        let err = |body: Value| chat_of(body).unwrap_err();
        assert_eq!(
            err(json!({"messages": [{"role": "wizard", "content": "x"}]})).param.as_deref(),
            Some("messages[0]")
        );
        assert_eq!(err(json!({"messages": []})).param.as_deref(), Some("messages"));
        assert_eq!(
            err(json!({"messages": [{"role": "user", "content": "x"}], "temperature": 9})).param.as_deref(),
            Some("temperature")
        );
        assert_eq!(
            err(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})).param.as_deref(),
            Some("max_tokens")
        );
        assert_eq!(err(json!({"messages": [{"role": "user", "content": "x"}], "n": 2})).param.as_deref(), Some("n"));
        let bad_schema = json!({"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object", "not": {}}}}});
        assert_eq!(err(bad_schema).param.as_deref(), Some("response_format"));
        assert!(err(json!([1, 2])).message.contains("JSON object"));
        // A field of the wrong type is named, in plain words.
        let typed = err(json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "12"}));
        assert_eq!(typed.param.as_deref(), Some("max_tokens"));
        assert!(typed.message.contains("must be an integer"), "{}", typed.message);
        let stop = err(json!({"messages": [{"role": "user", "content": "x"}], "stop": 5}));
        assert_eq!(stop.param.as_deref(), Some("stop"));
    }

    #[test]
    fn sampling_stop_and_format_fields_reach_the_settings() {
        let parsed = chat_of(json!({
            "messages": [{"role": "user", "content": "x"}],
            "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "seed": -1,
            "stop": ["A", "B"], "response_format": {"type": "json_object"},
            "chat_template_kwargs": {"enable_thinking": false}, "stream": true,
            "stream_options": {"include_usage": true}
        }))
        .unwrap();
        let s = &parsed.settings;
        assert_eq!((s.n_predict, s.sampling.temp, s.sampling.top_k, s.sampling.seed), (7, 0.5, 3, u32::MAX));
        assert_eq!(s.stop, ["A", "B"]);
        assert!(s.constraint.is_some() && !s.think && parsed.stream && parsed.include_usage);
    }

    #[test]
    fn a_final_assistant_message_is_continued_and_the_flags_must_agree() {
        let prefilled = json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "Sure"}]);
        let plain = json!([{"role": "user", "content": "x"}]);
        let with = |messages: &Value, extra: Value| {
            let mut body = json!({"messages": messages});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat_of(body).err().and_then(|e| e.param)
        };
        assert_eq!(with(&prefilled, json!({})), None);
        assert_eq!(with(&prefilled, json!({"continue_final_message": true, "add_generation_prompt": false})), None);
        assert_eq!(with(&prefilled, json!({"add_generation_prompt": true})).as_deref(), Some("add_generation_prompt"));
        assert_eq!(
            with(&prefilled, json!({"continue_final_message": false})).as_deref(),
            Some("continue_final_message")
        );
        assert_eq!(with(&plain, json!({"continue_final_message": true})).as_deref(), Some("continue_final_message"));
        assert_eq!(with(&plain, json!({"add_generation_prompt": false})).as_deref(), Some("add_generation_prompt"));
        assert_eq!(with(&plain, json!({"add_generation_prompt": true})), None);
    }

    #[test]
    fn tool_choice_picks_and_requires() {
        let tools = json!([
            {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}
        ]);
        let msgs = json!([{"role": "user", "content": "x"}]);
        let named =
            json!({"messages": msgs, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "b"}}});
        let parsed = chat_of(named).unwrap();
        let Work::Chat(work) = parsed.work else { panic!() };
        assert_eq!(work.tools.unwrap().as_array().unwrap().len(), 1);
        assert!(parsed.settings.require_call);
        let none = chat_of(json!({"messages": msgs, "tools": tools, "tool_choice": "none"})).unwrap();
        let Work::Chat(work) = none.work else { panic!() };
        assert!(work.tools.is_none());
        assert!(chat_of(json!({"messages": msgs, "tool_choice": "required"})).is_err());
    }

    #[test]
    fn completion_prompts() {
        let config = RunConfig::default();
        let parsed = completion(&json!({"prompt": ["Once"], "max_tokens": 4, "stop": "\n"}), &config, None).unwrap();
        assert_eq!(parsed.len(), 1);
        assert!(matches!(&parsed[0].work, Work::Complete { prompt: CompletionPrompt::Text(p) } if p == "Once"));
        assert_eq!(parsed[0].settings.stop, ["\n"]);
        // -n of the server limits a request that sets no max_tokens.
        assert_eq!(completion(&json!({"prompt": "a"}), &config, Some(9)).unwrap()[0].settings.n_predict, 9);
        assert_eq!(completion(&json!({"prompt": ["a", "b"]}), &config, None).unwrap().len(), 2);
        let ids = completion(&json!({"prompt": [[1, 2], [3]]}), &config, None).unwrap();
        assert_eq!(ids[1].work_prompt(), Some(&CompletionPrompt::Tokens(vec![3])));
        let one = completion(&json!({"prompt": [5, 6, 7]}), &config, None).unwrap();
        assert_eq!(one[0].work_prompt(), Some(&CompletionPrompt::Tokens(vec![5, 6, 7])));
        assert!(completion(&json!({"prompt": ["a", "b"], "stream": true}), &config, None).is_err());
        assert!(completion(&json!({"prompt": [1.5]}), &config, None).is_err());
        assert!(completion(&json!({"prompt": "a", "echo": true}), &config, Some(9)).is_err());
        // llama-server's samplers bmoe lacks: refused when on, taken when off.
        let err = completion(&json!({"prompt": "a", "mirostat": 2}), &config, None).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("mirostat"));
        assert!(
            completion(&json!({"prompt": "a", "mirostat": 0, "tfs_z": 1.0, "ignore_eos": false}), &config, None)
                .is_ok()
        );
        assert!(completion(&json!({"prompt": "a", "ignore_eos": true}), &config, None).is_err());
    }
}
