//! Reasoning ("thinking") apart from the answer: which markers a template
//! family uses, how to turn thinking off where the template has no switch,
//! and a streaming splitter that sorts generated text into reasoning and
//! answer token by token, with markers hidden and never split across pieces.

use super::template::{ChatTemplate, Message, RenderOptions, TemplateError};

/// How a model family marks reasoning in its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `<think>` ... `</think>` (Qwen3, Qwen3.5, GLM, LFM2.5, Nemotron, DeepSeek, Kimi-K2).
    Think,
    /// `<seed:think>` ... `</seed:think>` (Seed-OSS).
    SeedThink,
    /// `<think:opensource>` ... `</think:opensource>` (Hunyuan).
    HunyuanThink,
    /// Kimi-K3's tags: `<|open|>think<|sep|>` ... `<|close|>think<|sep|>`,
    /// then the answer in `<|open|>response<|sep|>` ... `<|close|>response<|sep|>`.
    Kimi,
    /// gpt-oss "harmony" channels: `<|channel|>analysis<|message|>` ... `<|end|>`,
    /// then the answer on `<|channel|>final<|message|>`.
    Harmony,
    /// gemma-4: `<|channel>thought` ... `<channel|>`.
    Gemma,
    /// MiniMax-M3: `<mm:think>` ... `</mm:think>`.
    MiniMax,
    /// Cohere Command (Cohere2 MoE): `<|START_THINKING|>` ...
    /// `<|END_THINKING|>`, the answer in `<|START_RESPONSE|>` ... `<|END_RESPONSE|>`.
    Cohere,
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

/// Every family with markers, most specific first (no earlier family's
/// opening marker contains a later one's).
const MARKED: [Family; 8] = [
    Family::Harmony,
    Family::Gemma,
    Family::Kimi,
    Family::Cohere,
    Family::MiniMax,
    Family::SeedThink,
    Family::HunyuanThink,
    Family::Think,
];

/// The user's message in the conversations [`Family::detect`] renders:
/// markers count only after it.
const PROBE_USER: &str = "PROBE-USER";

impl Family {
    /// The family of `template`, from the markers it writes after a user's
    /// message: around (or in place of) an assistant's reasoning in its
    /// history, or in its generation prompt with thinking on or off. Text
    /// that only mentions a marker before the conversation (granite-3.3's
    /// system prompt asks for `<think>` tags in words) does not count.
    pub fn detect(template: &ChatTemplate, opts: &RenderOptions) -> Family {
        let reasoned =
            Message { reasoning: Some("PROBE-REASONING".into()), ..Message::new("assistant", "PROBE-ANSWER") };
        let history = [Message::new("user", PROBE_USER), reasoned];
        let renders = [
            RenderOptions { add_generation_prompt: false, ..opts.clone() },
            RenderOptions { add_generation_prompt: true, enable_thinking: true, ..opts.clone() },
            RenderOptions { add_generation_prompt: true, enable_thinking: false, ..opts.clone() },
        ]
        .map(|o| {
            let messages = if o.add_generation_prompt { &history[..1] } else { &history[..] };
            let text = template.render(messages, &o).unwrap_or_default();
            text.find(PROBE_USER).map(|at| text[at..].to_string()).unwrap_or_default()
        });
        MARKED.into_iter().find(|f| renders.iter().any(|t| t.contains(f.opening()))).unwrap_or(Family::Plain)
    }

    /// The markers that open and close a reasoning block, for the families
    /// that write one as a pair of tags.
    pub fn block_markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            Family::Think
            | Family::SeedThink
            | Family::HunyuanThink
            | Family::Kimi
            | Family::MiniMax
            | Family::Cohere => {
                let close = self.markers().iter().find(|(_, a)| *a == Action::Enter(Kind::Answer))?.0;
                Some((self.opening(), close))
            }
            Family::Harmony | Family::Gemma | Family::Plain => None,
        }
    }

    /// The marker that starts reasoning.
    fn opening(self) -> &'static str {
        self.markers().iter().find(|(_, a)| *a == Action::Enter(Kind::Reasoning)).map_or("", |(m, _)| m)
    }

    /// A short name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Family::Think => "<think> tags",
            Family::SeedThink => "<seed:think> tags",
            Family::HunyuanThink => "<think:opensource> tags",
            Family::Kimi => "Kimi think/response tags",
            Family::Harmony => "gpt-oss channels",
            Family::Gemma => "gemma thought channel",
            Family::MiniMax => "<mm:think> tags",
            Family::Cohere => "cohere THINKING/RESPONSE tags",
            Family::Plain => "no reasoning markers",
        }
    }

    fn markers(self) -> &'static [(&'static str, Action)] {
        use Action::*;
        use Kind::*;
        match self {
            Family::Think => &[("<think>", Enter(Reasoning)), ("</think>", Enter(Answer))],
            Family::SeedThink => &[("<seed:think>", Enter(Reasoning)), ("</seed:think>", Enter(Answer))],
            Family::HunyuanThink => &[("<think:opensource>", Enter(Reasoning)), ("</think:opensource>", Enter(Answer))],
            Family::Kimi => &[
                ("<|open|>think<|sep|>", Enter(Reasoning)),
                ("<|close|>think<|sep|>", Enter(Answer)),
                ("<|open|>response<|sep|>", Enter(Answer)),
                ("<|close|>response<|sep|>", Hide),
                ("<|close|>message<|sep|>", Hide),
                ("<|end_of_msg|>", Hide),
            ],
            Family::Harmony => &[
                ("<|channel|>analysis<|message|>", Enter(Reasoning)),
                ("<|channel|>final<|message|>", Enter(Answer)),
                ("<|start|>assistant", Hide),
                ("<|end|>", Hide),
                ("<|return|>", Hide),
            ],
            Family::Gemma => &[("<|channel>thought", Enter(Reasoning)), ("<channel|>", Enter(Answer))],
            Family::MiniMax => &[("<mm:think>", Enter(Reasoning)), ("</mm:think>", Enter(Answer))],
            Family::Cohere => &[
                ("<|START_THINKING|>", Enter(Reasoning)),
                ("<|END_THINKING|>", Enter(Answer)),
                ("<|START_RESPONSE|>", Enter(Answer)),
                ("<|END_RESPONSE|>", Hide),
            ],
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
    /// reasoning, for templates with no thinking switch: close the block
    /// the prompt opened, or write an empty one (a template's own empty
    /// block, where it writes one in its history, comes first:
    /// [`crate::chat::ChatFormat`]).
    pub fn no_think_prefill(self, prompt: &str) -> Option<&'static str> {
        let open = self.starts_in(prompt) == Kind::Reasoning;
        match self {
            Family::Think if open => Some("\n</think>\n\n"),
            Family::Think => Some("<think>\n\n</think>\n\n"),
            Family::SeedThink if open => Some("\n</seed:think>\n"),
            Family::SeedThink => Some("<seed:think>\n</seed:think>\n"),
            Family::HunyuanThink if open => Some("</think:opensource>"),
            Family::HunyuanThink => Some("<think:opensource></think:opensource>"),
            Family::Kimi if open => Some("<|close|>think<|sep|><|open|>response<|sep|>"),
            Family::Kimi => Some("<|open|>response<|sep|>"),
            Family::Harmony => {
                Some("<|channel|>analysis<|message|>\n\n<|end|><|start|>assistant<|channel|>final<|message|>")
            }
            Family::Gemma if open => Some("\n<channel|>"),
            Family::Gemma => Some("<|channel>thought\n<channel|>"),
            Family::MiniMax if open => Some("\n</mm:think>\n\n"),
            Family::MiniMax => Some("<mm:think>\n</mm:think>\n\n"),
            Family::Cohere if open => Some("<|END_THINKING|><|START_RESPONSE|>"),
            Family::Cohere => Some("<|START_THINKING|><|END_THINKING|><|START_RESPONSE|>"),
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
    fn kimi_seed_and_hunyuan_tags() {
        let prompt = "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
        let out = "2+2<|close|>think<|sep|><|open|>response<|sep|>4<|close|>response<|sep|><|close|>message<|sep|>";
        same_at_every_cut(Family::Kimi, prompt, out, ("2+2", "4"));
        // Thinking off: the prompt opened the response.
        let off = "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>";
        assert_eq!(split(Family::Kimi, off, &["4<|close|>response<|sep|>"]), (String::new(), "4".into()));
        same_at_every_cut(Family::SeedThink, "assistant\n", "<seed:think>sum</seed:think>\n4", ("sum", "\n4"));
        let hunyuan = "<｜hy_Assistant:opensource｜><think:opensource>";
        same_at_every_cut(Family::HunyuanThink, hunyuan, "sum</think:opensource>4", ("sum", "4"));
    }

    #[test]
    fn minimax_and_cohere_tags() {
        same_at_every_cut(Family::MiniMax, "<assistant>", "<mm:think>sum</mm:think>\n4", ("sum", "\n4"));
        let out = "<|START_THINKING|>sum<|END_THINKING|><|START_RESPONSE|>4<|END_RESPONSE|>";
        same_at_every_cut(Family::Cohere, "<|CHATBOT_TOKEN|>", out, ("sum", "4"));
        let off = format!("<assistant>{}", Family::MiniMax.no_think_prefill("<assistant>").unwrap());
        assert_eq!(Family::MiniMax.starts_in(&off), Kind::Answer);
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

    fn detect(source: &str) -> Family {
        Family::detect(&ChatTemplate::new("t", source).unwrap(), &RenderOptions::default())
    }

    #[test]
    fn detects_families_and_prefills() {
        // Markers around the history's reasoning, or in the generation prompt.
        let history = |open: &str, close: &str| {
            format!(
                "{{% for m in messages %}}{{{{ m.content }}}}{{% if m.reasoning_content %}}{open}{{{{ m.reasoning_content }}}}{close}{{% endif %}}{{% endfor %}}"
            )
        };
        let prompt = |tail: &str| {
            format!(
                "{{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}{{% if add_generation_prompt %}}{tail}{{% endif %}}"
            )
        };
        assert_eq!(detect(&history("<think>", "</think>")), Family::Think);
        assert_eq!(detect(&history("<seed:think>", "</seed:think>")), Family::SeedThink);
        assert_eq!(detect(&history("<think:opensource>", "</think:opensource>")), Family::HunyuanThink);
        assert_eq!(detect(&prompt("<|im_start|>assistant\n<think>\n")), Family::Think);
        assert_eq!(detect(&prompt("<|start|>assistant<|channel|>analysis<|message|>")), Family::Harmony);
        assert_eq!(
            detect(&prompt("{% if not enable_thinking %}<|channel>thought\n<channel|>{% endif %}")),
            Family::Gemma
        );
        assert_eq!(detect(&prompt("<|open|>think<|sep|>")), Family::Kimi);
        // Mentioned before the conversation, not written in it: plain.
        let mention = "Write your thoughts between <think></think>.{% for m in messages %}{{ m.content }}{% endfor %}";
        assert_eq!(detect(mention), Family::Plain);
        assert_eq!(detect(&prompt("<|im_start|>assistant\n")), Family::Plain);
        assert_eq!(Family::Think.no_think_prefill("assistant\n"), Some("<think>\n\n</think>\n\n"));
        assert_eq!(Family::Think.no_think_prefill("assistant\n<think>\n"), Some("\n</think>\n\n"));
        let p = format!("<|start|>assistant{}", Family::Harmony.no_think_prefill("<|start|>assistant").unwrap());
        assert_eq!(Family::Harmony.starts_in(&p), Kind::Answer);
    }
}
