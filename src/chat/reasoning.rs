//! Reasoning ("thinking") apart from the answer: which markers a template
//! family uses, how to turn thinking off where the template has no switch,
//! and a streaming splitter that sorts generated text into reasoning and
//! answer token by token, with markers hidden and never split across pieces.

use super::template::{ChatTemplate, Message, RenderOptions, TemplateError};

/// How a model family marks reasoning in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `<think>` ... `</think>` (Qwen3, Qwen3.5, GLM, LFM2.5, Nemotron, DeepSeek).
    Think,
    /// gpt-oss "harmony" channels: `<|channel|>analysis<|message|>` ... `<|end|>`,
    /// then the answer on `<|channel|>final<|message|>`.
    Harmony,
    /// gemma-4: `<|channel>thought` ... `<channel|>`.
    Gemma,
    /// No reasoning markers (Qwen2.5, LFM2, granite, a plain fallback).
    Plain,
}

/// What a marker does: switch to a kind of text, or only disappear.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Enter(Kind),
    Hide,
}

/// Which part of the output a piece of text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The model's reasoning.
    Reasoning,
    /// The answer.
    Answer,
}

impl Family {
    /// The family a template's source belongs to, from the markers it writes.
    pub fn detect(source: &str) -> Family {
        if source.contains("<|channel|>") {
            Family::Harmony
        } else if source.contains("<|channel>") {
            Family::Gemma
        } else if source.contains("<think>") {
            Family::Think
        } else {
            Family::Plain
        }
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::Think => "<think> tags",
            Family::Harmony => "gpt-oss channels",
            Family::Gemma => "gemma thought channel",
            Family::Plain => "no reasoning markers",
        }
    }

    fn markers(self) -> &'static [(&'static str, Action)] {
        use Action::*;
        use Kind::*;
        match self {
            Family::Think => &[("<think>", Enter(Reasoning)), ("</think>", Enter(Answer))],
            Family::Harmony => &[
                ("<|channel|>analysis<|message|>", Enter(Reasoning)),
                ("<|channel|>final<|message|>", Enter(Answer)),
                ("<|start|>assistant", Hide),
                ("<|end|>", Hide),
                ("<|return|>", Hide),
            ],
            Family::Gemma => &[("<|channel>thought", Enter(Reasoning)), ("<channel|>", Enter(Answer))],
            Family::Plain => &[],
        }
    }

    /// The kind of text a generation starts in, given the prompt that
    /// precedes it: reasoning when the prompt opened a reasoning block and
    /// did not close it (Qwen3.5, GLM, DeepSeek open it themselves).
    pub fn starts_in(self, prompt: &str) -> Kind {
        let last = self
            .markers()
            .iter()
            .filter_map(|(m, a)| match a {
                Action::Enter(kind) => prompt.rfind(m).map(|at| (at, *kind)),
                Action::Hide => None,
            })
            .max_by_key(|(at, _)| *at);
        last.map_or(Kind::Answer, |(_, kind)| kind)
    }

    /// Text to append to a generation prompt so the model answers without
    /// reasoning, for templates that ignore `enable_thinking`: close the
    /// block the prompt opened, or write an empty one.
    pub fn no_think_prefill(self, prompt: &str) -> Option<&'static str> {
        let open = self.starts_in(prompt) == Kind::Reasoning;
        match self {
            Family::Think if open => Some("\n</think>\n\n"),
            Family::Think => Some("<think>\n\n</think>\n\n"),
            Family::Harmony => {
                Some("<|channel|>analysis<|message|>\n\n<|end|><|start|>assistant<|channel|>final<|message|>")
            }
            Family::Gemma if open => Some("\n<channel|>"),
            Family::Gemma => Some("<|channel>thought\n<channel|>"),
            Family::Plain => None,
        }
    }
}

/// How thinking is turned off for a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkControl {
    /// The template honours `enable_thinking`.
    Template,
    /// The template ignores it; bmoe appends the family's empty reasoning
    /// block to the prompt (the reference engine's continuation trick).
    Prefill,
    /// The model does not reason; nothing to turn off.
    None,
}

impl ThinkControl {
    /// Probes `template`: a one-message conversation rendered with thinking
    /// on and off.
    pub fn probe(template: &ChatTemplate, family: Family, opts: &RenderOptions) -> Result<ThinkControl, TemplateError> {
        let messages = [Message::new("user", "Hello")];
        let on = template.render(&messages, &RenderOptions { enable_thinking: true, ..opts.clone() })?;
        let off = template.render(&messages, &RenderOptions { enable_thinking: false, ..opts.clone() })?;
        Ok(if on != off {
            ThinkControl::Template
        } else if family == Family::Plain {
            ThinkControl::None
        } else {
            ThinkControl::Prefill
        })
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ThinkControl::Template => "template",
            ThinkControl::Prefill => "prefill",
            ThinkControl::None => "none",
        }
    }
}

/// Sorts streamed text into reasoning and answer. Markers are removed; text
/// that could be the start of a marker is held back until the next piece
/// shows whether it is one.
#[derive(Debug, Clone)]
pub struct Splitter {
    family: Family,
    kind: Kind,
    held: String,
}

impl Splitter {
    /// A splitter for text generated after `prompt`.
    pub fn new(family: Family, prompt: &str) -> Splitter {
        Splitter { family, kind: family.starts_in(prompt), held: String::new() }
    }

    /// The kind of text being generated now.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Feeds one piece of generated text; returns what can be shown now.
    pub fn push(&mut self, piece: &str) -> Vec<(Kind, String)> {
        self.held.push_str(piece);
        let mut out: Vec<(Kind, String)> = Vec::new();
        let markers = self.family.markers();
        loop {
            let first =
                markers.iter().filter_map(|(m, a)| self.held.find(m).map(|at| (at, *m, *a))).min_by_key(|x| x.0);
            let Some((at, marker, action)) = first else { break };
            emit(&mut out, self.kind, &self.held[..at]);
            if let Action::Enter(kind) = action {
                self.kind = kind;
            }
            self.held.drain(..at + marker.len());
        }
        // Keep back the longest tail that a marker could start with.
        let keep = markers
            .iter()
            .flat_map(|(m, _)| (1..m.len()).filter(|&n| m.is_char_boundary(n)).map(move |n| &m[..n]))
            .filter(|prefix| self.held.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        emit(&mut out, self.kind, &self.held[..cut]);
        self.held.drain(..cut);
        out
    }

    /// The end of the generation: whatever was held back is text after all
    /// (an unclosed reasoning block stays reasoning).
    pub fn finish(&mut self) -> Vec<(Kind, String)> {
        let mut out = Vec::new();
        emit(&mut out, self.kind, &self.held);
        self.held.clear();
        out
    }
}

fn emit(out: &mut Vec<(Kind, String)>, kind: Kind, text: &str) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some((k, s)) if *k == kind => s.push_str(text),
        _ => out.push((kind, text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Streams `pieces` and joins the result per kind.
    fn split(family: Family, prompt: &str, pieces: &[&str]) -> (String, String) {
        let mut s = Splitter::new(family, prompt);
        let mut parts: Vec<(Kind, String)> = pieces.iter().flat_map(|p| s.push(p)).collect();
        parts.extend(s.finish());
        let join = |k| parts.iter().filter(|(kind, _)| *kind == k).map(|(_, t)| t.as_str()).collect::<String>();
        (join(Kind::Reasoning), join(Kind::Answer))
    }

    /// Every way of cutting `text` into two pieces gives the same split.
    fn same_at_every_cut(family: Family, prompt: &str, text: &str, want: (&str, &str)) {
        for cut in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let got = split(family, prompt, &[&text[..cut], &text[cut..]]);
            assert_eq!((got.0.as_str(), got.1.as_str()), want, "cut at {cut}");
        }
    }

    #[test]
    fn think_tags() {
        let out = "<think>\nThe user greets me.\n</think>\n\nHello! How can I help?";
        same_at_every_cut(
            Family::Think,
            "<|im_start|>assistant\n",
            out,
            ("\nThe user greets me.\n", "\n\nHello! How can I help?"),
        );
    }

    #[test]
    fn think_opened_by_the_prompt() {
        // Qwen3.5, GLM, Nemotron, DeepSeek: the generation prompt ends inside the block.
        let prompt = "<|im_start|>assistant\n<think>\n";
        same_at_every_cut(Family::Think, prompt, "2+2 is 4.\n</think>\n\nIt is 4.", ("2+2 is 4.\n", "\n\nIt is 4."));
        // Thinking off: the prompt closed the block.
        let off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(split(Family::Think, off, &["It is 4."]), (String::new(), "It is 4.".into()));
    }

    #[test]
    fn harmony_channels() {
        let out = "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
        same_at_every_cut(Family::Harmony, "<|start|>assistant", out, ("User asks 2+2.", "4"));
    }

    #[test]
    fn gemma_thought_channel() {
        let out = "<|channel>thought\nsimple sum<channel|>The answer is 4.";
        same_at_every_cut(Family::Gemma, "<|turn>model\n", out, ("\nsimple sum", "The answer is 4."));
    }

    #[test]
    fn token_by_token_and_unclosed() {
        let pieces = ["<", "think", ">", "hm", "m", "</", "think", ">", "ok"];
        assert_eq!(split(Family::Think, "", &pieces), ("hmm".into(), "ok".into()));
        // Ran out of tokens while reasoning: it is all reasoning.
        assert_eq!(split(Family::Think, "", &["<think>still going"]), ("still going".into(), String::new()));
        // A held-back '<' that turns out not to be a marker is shown.
        assert_eq!(split(Family::Think, "", &["a <", " b"]), (String::new(), "a < b".into()));
        assert_eq!(split(Family::Plain, "", &["<think>x"]), (String::new(), "<think>x".into()));
    }

    #[test]
    fn detects_families_and_prefills() {
        assert_eq!(Family::detect("{{ '<think>' }}"), Family::Think);
        assert_eq!(Family::detect("<|start|>assistant<|channel|>final"), Family::Harmony);
        assert_eq!(Family::detect("<|channel>thought\n<channel|>"), Family::Gemma);
        assert_eq!(Family::detect("<|im_start|>"), Family::Plain);
        assert_eq!(Family::Think.no_think_prefill("assistant\n"), Some("<think>\n\n</think>\n\n"));
        assert_eq!(Family::Think.no_think_prefill("assistant\n<think>\n"), Some("\n</think>\n\n"));
        let p = format!("<|start|>assistant{}", Family::Harmony.no_think_prefill("<|start|>assistant").unwrap());
        assert_eq!(Family::Harmony.starts_in(&p), Kind::Answer);
    }
}
