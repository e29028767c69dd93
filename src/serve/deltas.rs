//! A streamed chat reply's text as the APIs beside chat completions send
//! it: reasoning and answer as they are generated, the answer held back
//! from the first text that can begin a tool call in the template's
//! format (calls are sent whole, parsed, once the reply is complete).

use super::engine::Finished;
use crate::chat::Kind;
use crate::host::StopScan;

/// Generated text to send now.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// Reasoning (thinking) text.
    Reasoning(String),
    /// Answer text.
    Answer(String),
}

/// Splits a reply's generated text into deltas.
pub struct Deltas {
    /// Holds the answer back from where a tool call can begin.
    calls: Option<StopScan>,
    /// Answer text sent so far.
    sent: String,
}

impl Deltas {
    /// Deltas of a reply whose calls begin with one of `openings` (none:
    /// no tools are shown).
    pub fn new(openings: &[&str]) -> Deltas {
        let stops: Vec<String> = openings.iter().map(|s| s.to_string()).collect();
        Deltas { calls: (!stops.is_empty()).then(|| StopScan::new(&stops)), sent: String::new() }
    }

    /// The delta to send for generated `text` of `kind`, if any.
    pub fn text(&mut self, kind: Kind, text: &str) -> Option<Delta> {
        match kind {
            Kind::Reasoning => (!text.is_empty()).then(|| Delta::Reasoning(text.to_string())),
            Kind::Answer => {
                let text = self.calls.as_mut().map_or_else(|| text.to_string(), |c| c.push(text));
                if text.is_empty() {
                    return None;
                }
                self.sent.push_str(&text);
                Some(Delta::Answer(text))
            }
        }
    }

    /// The answer text held back that turned out to be no call, once the
    /// reply `f` is complete.
    pub fn rest(&mut self, f: &Finished) -> Option<String> {
        let sent = self.sent.trim_start();
        let answer = f.answer.trim_start();
        let rest = answer.strip_prefix(sent).filter(|r| !r.is_empty())?;
        (f.tool_calls.is_empty() || !rest.trim().is_empty()).then(|| rest.to_string())
    }

    /// Whether any answer text was sent.
    pub fn answered(&self) -> bool {
        !self.sent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_is_held_back_and_text_that_was_none_comes_at_the_end() {
        let mut d = Deltas::new(&["<tool_call>"]);
        assert_eq!(d.text(Kind::Reasoning, "hmm"), Some(Delta::Reasoning("hmm".into())));
        assert_eq!(d.text(Kind::Answer, "Sure. <tool"), Some(Delta::Answer("Sure. ".into())));
        assert_eq!(d.text(Kind::Answer, "_call>{}"), None);
        let called = Finished {
            answer: "Sure.".into(),
            tool_calls: vec![crate::chat::ToolCall::new(None, "f", serde_json::json!({}))],
            ..Finished::default()
        };
        assert_eq!(d.rest(&called), None);
        let mut d = Deltas::new(&["<tool_call>"]);
        d.text(Kind::Answer, "a <tool_call> b");
        let plain = Finished { answer: "a <tool_call> b".into(), ..Finished::default() };
        assert_eq!(d.rest(&plain).as_deref(), Some("<tool_call> b"));
    }
}
