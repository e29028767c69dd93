//! Replies as the OpenAI API writes them: whole completions, and the
//! chunks of a streamed one. A streamed chat reply sends its reasoning and
//! answer as they are generated, but holds the answer back from the first
//! text that can begin a tool call in the template's format: calls are
//! sent whole, parsed, once the reply is complete.

use serde_json::{Value, json};

use super::engine::Finished;
use super::logprobs::{self, TokenLogprob};
use crate::chat::{Kind, ToolCall};
use crate::host::StopScan;

/// What every object of one reply shares.
#[derive(Debug, Clone)]
pub struct Header {
    /// `chatcmpl-...` or `cmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: String,
    /// Whether the request asked for log-probabilities.
    pub logprobs: bool,
    /// Whether the request asked for the logits digests.
    pub logits_digest: bool,
    /// The sampling seed the reply was drawn with (the request's, or a
    /// fresh one), reported so a sampled reply can be reproduced.
    pub seed: Option<u32>,
}

impl Header {
    /// A new reply's header: a fresh id with `prefix`.
    pub fn new(prefix: &str, model: String) -> Header {
        let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let id = format!("{prefix}-{:016x}", rand::random::<u64>());
        Header { id, created, model, logprobs: false, logits_digest: false, seed: None }
    }

    /// This header for a reply drawn with `seed`.
    pub fn seeded(self, seed: u32) -> Header {
        Header { seed: Some(seed), ..self }
    }

    /// This header for a request that asks for log-probabilities and/or digests.
    pub fn reporting(self, logprobs: bool, logits_digest: bool) -> Header {
        Header { logprobs, logits_digest, ..self }
    }

    /// Adds what a reply reports beyond OpenAI's fields: the seed, and the
    /// logits digests when asked (a bmoe extension: one 16-digit hex XXH3
    /// per step, as `bmoe generate --logits-digest` writes them).
    fn add_reported(&self, object: &mut Value, f: &Finished) {
        if let Some(seed) = self.seed {
            object["seed"] = json!(seed);
        }
        if self.logits_digest {
            object["logits_digest"] = f.logits_digest.iter().map(|d| format!("{d:016x}")).collect();
        }
    }
}

/// `usage` of a finished reply.
fn usage(f: &Finished) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// The calls as the API writes them: arguments as JSON text.
fn calls(calls: &[ToolCall]) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut call = c.to_api(i);
            call["index"] = json!(i);
            call
        })
        .collect()
}

/// A whole `chat.completion`.
pub fn chat_completion(h: &Header, f: &Finished) -> Value {
    let mut message = json!({"role": "assistant", "content": f.answer});
    if f.answer.is_empty() && !f.tool_calls.is_empty() {
        message["content"] = Value::Null;
    }
    if !f.reasoning.is_empty() {
        message["reasoning_content"] = json!(f.reasoning);
    }
    if !f.tool_calls.is_empty() {
        message["tool_calls"] = json!(calls(&f.tool_calls));
    }
    let logprobs = if h.logprobs { logprobs::chat_json(&f.logprobs) } else { Value::Null };
    let mut object = json!({
        "id": h.id,
        "object": "chat.completion",
        "created": h.created,
        "model": h.model,
        "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": f.finish_reason}],
        "usage": usage(f),
    });
    h.add_reported(&mut object, f);
    object
}

/// A whole `text_completion`: one choice per prompt, in order, and the
/// usage of them all (`total`). The digests (when asked) are those of the
/// first prompt's reply.
pub fn text_completion(h: &Header, replies: &[Box<Finished>], total: &Finished) -> Value {
    let choices: Vec<Value> = replies
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let logprobs = if h.logprobs { logprobs::completion_json(&f.logprobs, 0) } else { Value::Null };
            json!({"index": i, "text": f.answer, "logprobs": logprobs, "finish_reason": f.finish_reason})
        })
        .collect();
    let mut object = json!({
        "id": h.id,
        "object": "text_completion",
        "created": h.created,
        "model": h.model,
        "choices": choices,
        "usage": usage(total),
    });
    if let Some(first) = replies.first() {
        h.add_reported(&mut object, first);
    }
    object
}

/// Turns a chat reply's events into `chat.completion.chunk` objects.
pub struct ChatChunks {
    header: Header,
    /// Holds the answer back from where a tool call can begin.
    calls: Option<StopScan>,
    /// Answer text sent so far.
    sent: String,
    opened: bool,
    /// Log-probabilities of tokens whose text has not been sent yet.
    pending: Vec<TokenLogprob>,
}

impl ChatChunks {
    /// Chunks for a reply whose calls begin with one of `openings` (none:
    /// no tools are shown).
    pub fn new(header: Header, openings: &[&str]) -> ChatChunks {
        let stops: Vec<String> = openings.iter().map(|s| s.to_string()).collect();
        let calls = (!stops.is_empty()).then(|| StopScan::new(&stops));
        ChatChunks { header, calls, sent: String::new(), opened: false, pending: Vec::new() }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.header.id,
            "object": "chat.completion.chunk",
            "created": self.header.created,
            "model": self.header.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    }

    /// A chunk of `delta` carrying the log-probabilities of the tokens
    /// generated since the last chunk that carried some.
    fn chunk_with_logprobs(&mut self, delta: Value) -> Value {
        let mut chunk = self.chunk(delta, None);
        if self.header.logprobs {
            chunk["choices"][0]["logprobs"] = logprobs::chat_json(&std::mem::take(&mut self.pending));
        }
        chunk
    }

    /// A generated token's log-probability, sent with the next text.
    pub fn token(&mut self, token: TokenLogprob) -> Vec<Value> {
        self.pending.push(token);
        Vec::new()
    }

    /// The first chunk (the assistant's role), once.
    fn open(&mut self, out: &mut Vec<Value>) {
        if !self.opened {
            self.opened = true;
            out.push(self.chunk(json!({"role": "assistant", "content": null}), None));
        }
    }

    /// The chunks for generated text.
    pub fn text(&mut self, kind: Kind, text: &str) -> Vec<Value> {
        let mut out = Vec::new();
        self.open(&mut out);
        let (field, text) = match kind {
            Kind::Reasoning => ("reasoning_content", text.to_string()),
            Kind::Answer => ("content", self.calls.as_mut().map_or_else(|| text.to_string(), |c| c.push(text))),
        };
        if !text.is_empty() {
            if kind == Kind::Answer {
                self.sent.push_str(&text);
            }
            out.push(self.chunk_with_logprobs(json!({ field: text })));
        }
        out
    }

    /// The closing chunks of a finished reply: answer text held back that
    /// was no call, the calls, the finish reason, and the usage when asked.
    pub fn finish(&mut self, f: &Finished, include_usage: bool) -> Vec<Value> {
        let mut out = Vec::new();
        self.open(&mut out);
        let sent = self.sent.trim_start();
        let answer = f.answer.trim_start();
        if let Some(rest) = answer.strip_prefix(sent).filter(|r| !r.is_empty())
            && (f.tool_calls.is_empty() || !rest.trim().is_empty())
        {
            out.push(self.chunk_with_logprobs(json!({"content": rest})));
        }
        if !f.tool_calls.is_empty() {
            out.push(self.chunk(json!({"tool_calls": calls(&f.tool_calls)}), None));
        }
        if !self.pending.is_empty() {
            out.push(self.chunk_with_logprobs(json!({})));
        }
        let mut last = self.chunk(json!({}), Some(f.finish_reason));
        self.header.add_reported(&mut last, f);
        out.push(last);
        if include_usage {
            out.push(json!({
                "id": self.header.id,
                "object": "chat.completion.chunk",
                "created": self.header.created,
                "model": self.header.model,
                "choices": [],
                "usage": usage(f),
            }));
        }
        out
    }
}

/// A `text_completion` chunk of streamed text (`finish` on the last).
pub fn completion_chunk(h: &Header, text: &str, finish: Option<&str>) -> Value {
    json!({
        "id": h.id,
        "object": "text_completion",
        "created": h.created,
        "model": h.model,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
    })
}

/// Turns a completion's events into `text_completion` chunks, each text
/// chunk with the log-probabilities of the tokens generated since the last.
pub struct CompletionChunks {
    header: Header,
    pending: Vec<TokenLogprob>,
    /// Bytes of text sent so far (the next tokens' text offset).
    offset: usize,
}

impl CompletionChunks {
    /// Chunks for one reply.
    pub fn new(header: Header) -> CompletionChunks {
        CompletionChunks { header, pending: Vec::new(), offset: 0 }
    }

    fn with_logprobs(&mut self, text: &str, finish: Option<&str>) -> Value {
        let mut chunk = completion_chunk(&self.header, text, finish);
        if self.header.logprobs && !self.pending.is_empty() {
            let tokens = std::mem::take(&mut self.pending);
            chunk["choices"][0]["logprobs"] = logprobs::completion_json(&tokens, self.offset);
            self.offset += tokens.iter().map(|t| t.chosen.bytes.len()).sum::<usize>();
        }
        chunk
    }

    /// A generated token's log-probability, sent with the next text.
    pub fn token(&mut self, token: TokenLogprob) -> Vec<Value> {
        self.pending.push(token);
        Vec::new()
    }

    /// The chunk of generated text.
    pub fn text(&mut self, text: &str) -> Vec<Value> {
        vec![self.with_logprobs(text, None)]
    }

    /// The closing chunks: the finish reason (with what log-probabilities
    /// are left, and the digests when asked), then the usage when asked.
    pub fn finish(&mut self, f: &Finished, include_usage: bool) -> Vec<Value> {
        let mut last = self.with_logprobs("", Some(f.finish_reason));
        self.header.add_reported(&mut last, f);
        let mut out = vec![last];
        out.extend(include_usage.then(|| completion_usage(&self.header, f)));
        out
    }
}

/// The last chunk of a streamed completion with its usage.
pub fn completion_usage(h: &Header, f: &Finished) -> Value {
    json!({
        "id": h.id,
        "object": "text_completion",
        "created": h.created,
        "model": h.model,
        "choices": [],
        "usage": usage(f),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
            logprobs: false,
            logits_digest: false,
            seed: None,
        }
    }

    #[test]
    fn a_streamed_call_is_held_back_and_sent_parsed() {
        let mut chunks = ChatChunks::new(header(), &["<tool_call>"]);
        let mut all = chunks.text(Kind::Answer, "Let me check. <tool");
        all.extend(chunks.text(Kind::Answer, "_call>{\"name\": \"f\"}</tool_call>"));
        let finished = Finished {
            answer: "Let me check.".into(),
            tool_calls: vec![ToolCall::new(Some("call_0".into()), "f", json!({"a": 1}))],
            finish_reason: "tool_calls",
            ..Finished::default()
        };
        all.extend(chunks.finish(&finished, true));
        let text: String = all.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text, "Let me check. ");
        let call = all.iter().find_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned()).unwrap();
        assert_eq!(call[0]["function"]["arguments"], "{\"a\":1}");
        assert_eq!(all[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(all.iter().rev().nth(1).unwrap()["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(all.last().unwrap()["usage"]["total_tokens"], 0);
    }

    #[test]
    fn held_text_that_was_no_call_is_sent_at_the_end() {
        let mut chunks = ChatChunks::new(header(), &["<tool_call>"]);
        let mut all = chunks.text(Kind::Reasoning, "hmm");
        all.extend(chunks.text(Kind::Answer, "a <tool_call> b"));
        let finished = Finished { answer: "a <tool_call> b".into(), finish_reason: "stop", ..Finished::default() };
        all.extend(chunks.finish(&finished, false));
        let text: String = all.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
        assert_eq!(text, "a <tool_call> b");
        assert_eq!(all[1]["choices"][0]["delta"]["reasoning_content"], "hmm");
    }
}
