//! Chat: the model's own Jinja chat template, thinking on and off, reasoning
//! split from the answer while streaming, and conversations saved as JSON.
//! Pure code: no llama.cpp; the session host ties it to a model.

mod conversation;
mod jinja_compat;
mod jinja_tags;
mod json;
mod markup;
mod reasoning;
mod template;
mod tools;

pub use conversation::Conversation;
pub use json::python_json;
pub use reasoning::{Family, Kind, Splitter, ThinkControl};
pub use template::{ArgumentsForm, ChatTemplate, Message, ReasoningKey, RenderOptions, TemplateError};
pub use tools::{FoundCall, FunctionCall, ToolCall, ToolFormat};

/// The template used when a model carries none: plain `User:` /
/// `Assistant:` lines after the system prompt.
pub const FALLBACK_TEMPLATE: &str = r#"{%- for m in messages -%}
{%- if m.role == 'system' -%}{{ m.content + '\n\n' }}
{%- elif m.role == 'user' -%}{{ 'User: ' + m.content + '\n' }}
{%- else -%}{{ 'Assistant: ' + m.content + '\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}Assistant:{%- endif -%}"#;

/// The chat templates bmoe carries, by family name (see
/// `assets/chat-templates/README.md`).
pub const NAMED_TEMPLATES: &[(&str, &str)] = &[
    ("qwen3", include_str!("../../assets/chat-templates/qwen3.jinja")),
    ("qwen3.5", include_str!("../../assets/chat-templates/qwen3.5.jinja")),
    ("qwen2.5", include_str!("../../assets/chat-templates/qwen2.5.jinja")),
    ("gpt-oss", include_str!("../../assets/chat-templates/gpt-oss.jinja")),
    ("gemma-4", include_str!("../../assets/chat-templates/gemma-4.jinja")),
    ("glm-4.7", include_str!("../../assets/chat-templates/glm-4.7.jinja")),
    ("lfm2", include_str!("../../assets/chat-templates/lfm2.jinja")),
    ("lfm2.5", include_str!("../../assets/chat-templates/lfm2.5.jinja")),
    ("nemotron-3", include_str!("../../assets/chat-templates/nemotron-3.jinja")),
    ("deepseek-v4", include_str!("../../assets/chat-templates/deepseek-v4.jinja")),
    ("granite-4.0", include_str!("../../assets/chat-templates/granite-4.0.jinja")),
    ("granite-3.3", include_str!("../../assets/chat-templates/granite-3.3.jinja")),
    ("kimi-k3", include_str!("../../assets/chat-templates/kimi-k3.jinja")),
    ("kimi-k2-thinking", include_str!("../../assets/chat-templates/kimi-k2-thinking.jinja")),
    ("hunyuan", include_str!("../../assets/chat-templates/hunyuan.jinja")),
    ("seed-oss", include_str!("../../assets/chat-templates/seed-oss.jinja")),
];

/// The source of a named template.
pub fn named_template(name: &str) -> Option<&'static str> {
    NAMED_TEMPLATES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
}

/// The bundled templates' names, comma-separated, for an error that lists them.
pub fn named_template_list() -> String {
    NAMED_TEMPLATES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// A model's chat format: its template, reasoning markers and how thinking
/// is turned off.
#[derive(Debug)]
pub struct ChatFormat {
    template: ChatTemplate,
    family: Family,
    think: ThinkControl,
    base: RenderOptions,
    fallback: bool,
    /// The empty reasoning block the template writes before an earlier
    /// answer given without reasoning (Kimi-K2-Thinking's `<think></think>`),
    /// used to turn thinking off where there is no switch.
    empty_block: Option<String>,
    /// How the template writes tool calls, where bmoe reads its format.
    tool_format: Option<ToolFormat>,
    /// The template renders differently for some effort level (low, medium,
    /// high): `--reasoning-effort` changes something.
    effort_matters: bool,
}

impl ChatFormat {
    /// Compiles `source` (or the fallback when `None`) and probes it.
    /// `bos` and `eos` are the vocabulary's BOS and EOS texts.
    pub fn new(name: &str, source: Option<&str>, bos: &str, eos: &str) -> Result<ChatFormat, TemplateError> {
        let fallback = source.is_none();
        let template = ChatTemplate::new(name, source.unwrap_or(FALLBACK_TEMPLATE))?;
        let base = RenderOptions { bos_token: bos.into(), eos_token: eos.into(), ..RenderOptions::default() };
        let family = Family::detect(&template, &base);
        let think = ThinkControl::probe(&template, family, &base)?;
        let empty_block = empty_block(&template, family, &base);
        let tool_format = ToolFormat::detect(&template, &base);
        let effort_matters = effort_matters(&template, &base);
        Ok(ChatFormat { template, family, think, base, fallback, empty_block, tool_format, effort_matters })
    }

    /// The same format rendering with an effort level for the templates
    /// that take one (gpt-oss and Hunyuan `reasoning_effort`, Kimi-K3
    /// `thinking_effort`).
    pub fn with_reasoning_effort(mut self, effort: Option<String>) -> ChatFormat {
        self.set_reasoning_effort(effort);
        self
    }

    /// Renders with `effort` from now on (`None`: the template's default).
    pub fn set_reasoning_effort(&mut self, effort: Option<String>) {
        self.base.reasoning_effort = effort;
    }

    /// The same format rendering `tools` (an OpenAI-style function list)
    /// into every prompt, where the template shows tools.
    pub fn with_tools(mut self, tools: Option<serde_json::Value>) -> ChatFormat {
        self.set_tools(tools);
        self
    }

    /// Renders `tools` into every prompt from now on (`None`: no tools).
    pub fn set_tools(&mut self, tools: Option<serde_json::Value>) {
        self.base.tools = tools;
    }

    /// The tools shown to the model, if any.
    pub fn tools(&self) -> Option<&serde_json::Value> {
        self.base.tools.as_ref()
    }

    /// How the template writes tool calls (`None`: in no format bmoe reads).
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.tool_format
    }

    /// The tool calls in `generated` (a reply's whole text, markers and
    /// all), when tools are shown and the format is known.
    pub fn find_calls(&self, generated: &str) -> Vec<FoundCall> {
        match (self.tool_format, self.tools()) {
            (Some(format), Some(tools)) => format.parse(generated, Some(tools)),
            _ => Vec::new(),
        }
    }

    /// The grammar that makes the reply after `prompt` one call of a shown
    /// tool, in the template's format; an error says why there is none.
    pub fn call_grammar(&self, prompt: &str) -> Result<String, String> {
        let tools = self.tools().ok_or("no tools are shown to the model (chat.tools, --tools)")?;
        let format = self.tool_format.ok_or_else(|| {
            format!("the chat template {} writes tool calls in no format bmoe reads", self.template.name())
        })?;
        format.call_grammar(tools, prompt)
    }

    /// The template.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The reasoning markers.
    pub fn family(&self) -> Family {
        self.family
    }

    /// How thinking is turned off.
    pub fn think_control(&self) -> ThinkControl {
        self.think
    }

    /// True when the model had no template and the fallback is used.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// The thinking switches the template gets with thinking on or off (and
    /// this format's effort), as JSON.
    pub fn variables(&self, thinking: bool) -> serde_json::Map<String, serde_json::Value> {
        self.template.variables(&RenderOptions { enable_thinking: thinking, ..self.base.clone() })
    }

    /// The prompt for the next assistant turn after `messages`.
    pub fn prompt(&self, messages: &[Message], thinking: bool) -> Result<ChatPrompt, TemplateError> {
        self.render_prompt(messages, thinking, self.base.clone())
    }

    /// The prompt [`ChatFormat::prompt`] renders with `tools` shown and
    /// `effort`, whatever this format shows: what one server request asks
    /// for, rendered on the request's own thread.
    pub fn prompt_for(
        &self,
        messages: &[Message],
        thinking: bool,
        tools: Option<serde_json::Value>,
        effort: Option<String>,
    ) -> Result<ChatPrompt, TemplateError> {
        let base = RenderOptions { tools, reasoning_effort: effort, ..self.base.clone() };
        self.render_prompt(messages, thinking, base)
    }

    fn render_prompt(
        &self,
        messages: &[Message],
        thinking: bool,
        base: RenderOptions,
    ) -> Result<ChatPrompt, TemplateError> {
        if let Some(start) = continued_text(messages) {
            return self.continuation(messages, thinking, base, start);
        }
        let opts = RenderOptions { add_generation_prompt: true, enable_thinking: thinking, ..base };
        let mut text = self.template.render(messages, &opts)?;
        let (reply_at, opened) = self.reply_start(messages, &opts, &text);
        // Only where the template opened an assistant turn (not after tool
        // outputs it answers with no header, as R1-Distill's does).
        if !thinking && self.think == ThinkControl::Prefill && opened {
            let opening = &text[reply_at..];
            let open = self.family.starts_in(opening) == Kind::Reasoning;
            let own = self.empty_block.as_deref().filter(|_| !open);
            if let Some(prefill) = own.or_else(|| self.family.no_think_prefill(opening)) {
                text.push_str(prefill);
            }
        }
        Ok(ChatPrompt { text, reply_at, continues: false })
    }

    /// The prompt that continues the final assistant message, whose text
    /// is `start` (what transformers renders with
    /// `continue_final_message`): the conversation rendered without a
    /// generation prompt and cut right after that text, so the turn stays
    /// open and the reply goes on from it, in its answer.
    fn continuation(
        &self,
        messages: &[Message],
        thinking: bool,
        base: RenderOptions,
        start: &str,
    ) -> Result<ChatPrompt, TemplateError> {
        let opts = RenderOptions { add_generation_prompt: false, enable_thinking: thinking, ..base };
        let mut text = self.template.render(messages, &opts)?;
        // A template that trims messages (Llama 3's) writes the text trimmed.
        let found = [start, start.trim()].into_iter().find_map(|s| text.rfind(s).map(|at| at + s.len()));
        let end = found.ok_or_else(|| TemplateError {
            template: self.template.name().to_string(),
            line: None,
            message: "the template does not write the final assistant message's text, so it cannot be continued".into(),
        })?;
        text.truncate(end);
        Ok(ChatPrompt { reply_at: text.len(), text, continues: true })
    }

    /// Where the text the template appends after the last message begins
    /// in `text` (rendered with the generation prompt): where the render
    /// without it stops agreeing; and whether the generation prompt wrote
    /// anything (opened a turn). A template that ignores
    /// `add_generation_prompt` opens the reply after the last message's
    /// text.
    fn reply_start(&self, messages: &[Message], opts: &RenderOptions, text: &str) -> (usize, bool) {
        let without = RenderOptions { add_generation_prompt: false, ..opts.clone() };
        let without = self.template.render(messages, &without).unwrap_or_default();
        let common = text
            .char_indices()
            .zip(without.chars())
            .find(|((_, a), b)| a != b)
            .map_or(text.len().min(without.len()), |((at, _), _)| at);
        if common < text.len() {
            return (common, true);
        }
        let last = messages.last().map_or("", |m| m.content.as_str());
        (text.rfind(last).filter(|_| !last.is_empty()).map_or(0, |at| at + last.len()), false)
    }

    /// The thinking switches the template reads (`enable_thinking`,
    /// `thinking`, `reasoning_effort`...).
    pub fn think_switches(&self) -> &[&'static str] {
        self.template.think_switches()
    }

    /// What to tell a user who turns thinking off on a template with no
    /// switch bmoe knows ([`ThinkControl::None`]): that it changes nothing,
    /// and which variables the template reads that may be its switch.
    pub fn no_switch_notice(&self) -> String {
        let unknown = self.template.unknown_switches();
        let reads = match unknown {
            [] => String::new(),
            names => format!(
                " (it reads {}, which bmoe does not know how to set)",
                names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
            ),
        };
        format!(
            "thinking off changes nothing here: the chat template {} has no thinking switch bmoe knows{reads} and \
             writes no reasoning markers",
            self.template.name()
        )
    }

    /// What to tell a user who asks for an effort level the template does
    /// not read (it renders the same for low, medium and high), if they do.
    pub fn effort_notice(&self) -> Option<String> {
        let effort = self.base.reasoning_effort.as_deref()?;
        (!self.effort_matters).then(|| {
            format!(
                "reasoning effort `{effort}` changes nothing here: the chat template {} renders the same for every \
                 effort level",
                self.template.name()
            )
        })
    }

    /// A splitter for the text generated after `prompt`, starting in the
    /// kind of text the reply's opening leaves it in (never decided by a
    /// marker in the conversation's own text).
    pub fn splitter(&self, prompt: &ChatPrompt) -> Splitter {
        Splitter::new(self.family, prompt.reply_opening())
    }
}

/// True when `template` renders a conversation differently for some effort
/// level (low, medium, high).
fn effort_matters(template: &ChatTemplate, base: &RenderOptions) -> bool {
    let messages = [Message::new("system", "S"), Message::new("user", "U")];
    let render = |effort: &str| {
        template.render(&messages, &RenderOptions { reasoning_effort: Some(effort.into()), ..base.clone() }).ok()
    };
    let low = render("low");
    ["medium", "high"].iter().any(|e| render(e) != low)
}

/// A rendered prompt for the next assistant turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The whole prompt.
    pub text: String,
    /// Where the text the template appends after the last message begins.
    reply_at: usize,
    /// The reply continues the final assistant message (its text is the
    /// rest of that message, leading spaces kept).
    pub continues: bool,
}

impl ChatPrompt {
    /// A prompt written by hand, no template: the reply opens after it.
    pub fn plain(text: &str) -> ChatPrompt {
        ChatPrompt { text: text.to_string(), reply_at: text.len(), continues: false }
    }

    /// What the template appends after the last message to open the reply
    /// (and any empty reasoning block bmoe appends to turn thinking off).
    pub fn reply_opening(&self) -> &str {
        &self.text[self.reply_at..]
    }
}

/// The text of a final assistant message the reply continues (prefill),
/// if the conversation ends in one: an assistant message with text and no
/// tool calls.
pub fn continued_text(messages: &[Message]) -> Option<&str> {
    let last = messages.last()?;
    (last.role == "assistant" && !last.content.is_empty() && last.tool_calls.is_empty())
        .then_some(last.content.as_str())
}

/// The empty reasoning block `template` writes before an earlier answer
/// given without reasoning, if it writes one: the family's opening and
/// closing markers with only whitespace between them.
fn empty_block(template: &ChatTemplate, family: Family, opts: &RenderOptions) -> Option<String> {
    const ANSWER: &str = "PROBE-ANSWER";
    let history = [Message::new("user", "Hello"), Message::new("assistant", ANSWER), Message::new("user", "Again")];
    let text = template.render(&history, &RenderOptions { add_generation_prompt: false, ..opts.clone() }).ok()?;
    let before = &text[..text.find(ANSWER)?];
    let (open, close) = family.block_markers()?;
    let block = &before[before.rfind(open)?..];
    let inside = block[open.len()..].trim_start();
    (inside.strip_prefix(close)?.trim().is_empty()).then(|| block.to_string())
}

/// Reads an OpenAI-style tool list (`[{"type": "function", "function":
/// {"name": ..., "parameters": ...}}, ...]`) from JSON text, checking each
/// entry names its function.
pub fn parse_tools(text: &str) -> Result<serde_json::Value, String> {
    let tools: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let list = tools.as_array().ok_or("a tool list is a JSON array")?;
    for (i, tool) in list.iter().enumerate() {
        let name = tool.get("function").and_then(|f| f.get("name")).and_then(serde_json::Value::as_str);
        if name.is_none_or(str::is_empty) {
            return Err(format!("tool {}: no function.name", i + 1));
        }
    }
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_renders_plain_lines() {
        let f = ChatFormat::new("none", None, "<s>", "</s>").unwrap();
        let msgs = [Message::new("system", "Be brief."), Message::new("user", "Hi")];
        let prompt = f.prompt(&msgs, true).unwrap();
        assert_eq!(prompt.text, "Be brief.\n\nUser: Hi\nAssistant:");
        assert_eq!(prompt.reply_opening(), "Assistant:");
        assert_eq!(f.think_control(), ThinkControl::None);
        assert!(f.is_fallback());
    }

    #[test]
    fn named_templates_compile() {
        for (name, source) in NAMED_TEMPLATES {
            ChatFormat::new(name, Some(source), "<s>", "</s>").unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
