//! Prompts rendered and tokenized away from the engine's thread. The
//! server prepares each request's prompt on a thread of its own, with a
//! copy of the host's chat format, so a long prompt holds up no decoding;
//! the engine then starts the reply from the tokens as they are.

use super::{HostError, prompt_tokens};
use crate::chat::{ChatFormat, ChatPrompt, Message};
use crate::llama::Model;

/// A prompt rendered and tokenized.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The rendered text.
    pub prompt: ChatPrompt,
    /// Its tokens, as the host would tokenize it.
    pub tokens: Vec<i32>,
}

/// Renders and tokenizes prompts exactly as its host does, on any thread.
pub struct Prompter {
    format: ChatFormat,
    model: std::sync::Arc<Model>,
    markers_in_content: bool,
}

impl Prompter {
    pub(super) fn new(format: ChatFormat, model: std::sync::Arc<Model>, markers_in_content: bool) -> Prompter {
        Prompter { format, model, markers_in_content }
    }

    /// The prompt for a reply to `messages` (the system prompt first), with
    /// `tools` shown and `effort`, as [`super::Host::begin_reply`] renders
    /// it after [`super::Host::show_for_request`] with the same.
    pub fn chat(
        &self,
        messages: &[Message],
        thinking: bool,
        tools: Option<serde_json::Value>,
        effort: Option<String>,
    ) -> Result<Prepared, HostError> {
        let prompt = self.format.prompt_for(messages, thinking, tools, effort)?;
        chat_prepared(&self.model, prompt, messages, self.markers_in_content)
    }

    /// A raw completion's prompt: special tokens read, BOS added once.
    pub fn completion(&self, text: &str) -> Prepared {
        Prepared { prompt: ChatPrompt::plain(text), tokens: self.model.tokenize_rendered(text) }
    }
}

/// `prompt`, rendered for `messages`, with its tokens: the messages' own
/// text stays text unless `markers_in_content` (no forged turns).
pub(super) fn chat_prepared(
    model: &Model,
    prompt: ChatPrompt,
    messages: &[Message],
    markers_in_content: bool,
) -> Result<Prepared, HostError> {
    let tokens = if markers_in_content {
        model.tokenize_rendered(&prompt.text)
    } else {
        let contents: Vec<&str> = messages
            .iter()
            .flat_map(|m| m.reasoning.as_deref().into_iter().chain([m.content.as_str()]))
            .filter(|c| !c.is_empty())
            .collect();
        prompt_tokens::tokenize_prompt(model, &prompt.text, &contents).map_err(HostError::Setting)?
    };
    Ok(Prepared { prompt, tokens })
}
