//! A small SentencePiece-style ("llama") vocabulary with byte fallback, so any
//! text prompt tokenizes, plus letter pieces so generated text reads as
//! word-like fragments rather than raw bytes, and filler pieces up to a real
//! model's vocabulary size.

use crate::gguf::{Value, ValueType};

/// llama.cpp token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const BYTE: i32 = 6;

/// Id of `<unk>`.
pub const UNK_ID: u32 = 0;
/// Id of `<s>`.
pub const BOS_ID: u32 = 1;
/// Id of `</s>`.
pub const EOS_ID: u32 = 2;

/// The synthetic vocabulary.
pub struct Vocab {
    /// Token strings by id.
    pub tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
    /// Tokens before the filler pieces.
    natural: usize,
}

/// Letters in a filler piece: 26^4 names, more than any real vocabulary.
const FILLER_LETTERS: u32 = 4;

impl Vocab {
    /// Builds the vocabulary: specials, 256 byte tokens, printable ASCII,
    /// `▁`, then `▁x`, `xy` letter pieces when `pieces` is set, then
    /// `markers` as special (control) tokens, then filler pieces `▁xxxx`
    /// up to `size` tokens (0, or a size below the natural one: none).
    ///
    /// A filler piece is a normal token no text tokenizes to (no merge of
    /// shorter pieces reaches four letters), so prompts tokenize exactly as
    /// with the natural vocabulary; the fillers give the embedding and output
    /// matrices a real model's row count.
    pub fn new(pieces: bool, markers: &[String], size: u32) -> Vocab {
        let mut v = Vocab { tokens: Vec::new(), scores: Vec::new(), types: Vec::new(), natural: 0 };
        v.push("<unk>", 0.0, UNKNOWN);
        v.push("<s>", 0.0, CONTROL);
        v.push("</s>", 0.0, CONTROL);
        for b in 0..=255u8 {
            v.push(&format!("<0x{b:02X}>"), 0.0, BYTE);
        }
        v.push("\u{2581}", -1.0, NORMAL);
        for c in b'!'..=b'~' {
            v.push(&(c as char).to_string(), -1.0, NORMAL);
        }
        if pieces {
            let letters = b'a'..=b'z';
            for a in letters.clone() {
                v.push(&format!("\u{2581}{}", a as char), -2.0, NORMAL);
            }
            for a in letters.clone() {
                for b in letters.clone() {
                    v.push(&format!("{}{}", a as char, b as char), -3.0, NORMAL);
                }
            }
        }
        for m in markers {
            v.push(m, 0.0, CONTROL);
        }
        v.natural = v.len();
        for i in 0..(size as usize).saturating_sub(v.natural) as u32 {
            let mut name = String::from("\u{2581}");
            for p in (0..FILLER_LETTERS).rev() {
                name.push(char::from(b'a' + (i / 26u32.pow(p) % 26) as u8));
            }
            v.push(&name, -4.0, NORMAL);
        }
        v
    }

    /// The largest vocabulary [`Vocab::new`] can build.
    pub const MAX_SIZE: u32 = 26u32.pow(FILLER_LETTERS);

    /// Tokens before the filler pieces: the rows the model's structure
    /// shapes one by one (see [`super::structure`]).
    pub fn natural_len(&self) -> usize {
        self.natural
    }

    fn push(&mut self, s: &str, score: f32, ty: i32) {
        self.tokens.push(s.to_string());
        self.scores.push(score);
        self.types.push(ty);
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: the vocabulary has at least the specials.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Ids of the tokens a generated sequence should walk through: every
    /// normal (text) token before the fillers.
    pub fn text_tokens(&self) -> Vec<u32> {
        (0..self.natural).filter(|&i| self.is_text(i)).map(|i| i as u32).collect()
    }

    /// Whether token `t` is a natural text token (neither special, byte
    /// nor filler).
    pub fn is_text(&self, t: usize) -> bool {
        t < self.natural && self.types[t] == NORMAL
    }

    /// The `tokenizer.ggml.*` metadata entries.
    pub fn metadata(&self) -> Vec<(&'static str, Value)> {
        let strings = self.tokens.iter().map(|t| Value::String(t.clone())).collect();
        let scores = self.scores.iter().map(|&s| Value::F32(s)).collect();
        let types = self.types.iter().map(|&t| Value::I32(t)).collect();
        vec![
            ("tokenizer.ggml.model", Value::String("llama".into())),
            ("tokenizer.ggml.pre", Value::String("default".into())),
            ("tokenizer.ggml.tokens", Value::Array(ValueType::String, strings)),
            ("tokenizer.ggml.scores", Value::Array(ValueType::F32, scores)),
            ("tokenizer.ggml.token_type", Value::Array(ValueType::I32, types)),
            ("tokenizer.ggml.unknown_token_id", Value::U32(UNK_ID)),
            ("tokenizer.ggml.bos_token_id", Value::U32(BOS_ID)),
            ("tokenizer.ggml.eos_token_id", Value::U32(EOS_ID)),
            ("tokenizer.ggml.add_bos_token", Value::Bool(true)),
            ("tokenizer.ggml.add_eos_token", Value::Bool(false)),
            ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
        ]
    }
}

/// The special markers a chat template writes: `<|...|>`-style tags
/// (`<|im_start|>`, `<|channel|>`, `<|turn>`, `<channel|>`, DeepSeek's
/// `<｜User｜>`) and the `<think>` tags, each once, in order of appearance.
pub fn template_markers(source: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (start, _) in source.match_indices('<') {
        let rest = &source[start..];
        let Some(end) = rest.char_indices().take(48).find(|(_, c)| *c == '>').map(|(i, _)| i) else { continue };
        let inner = &rest[1..end];
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_|./-:▁｜".contains(c);
        let barred = inner.contains('|') || inner.contains('｜');
        let think = matches!(inner, "think" | "/think");
        if !inner.is_empty() && inner.chars().all(allowed) && (barred || think) {
            let marker = rest[..=end].to_string();
            if !out.contains(&marker) {
                out.push(marker);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fillers_reach_the_size_and_stay_out_of_the_walk() {
        let small = Vocab::new(true, &["<|im_start|>".into()], 0);
        let big = Vocab::new(true, &["<|im_start|>".into()], 151_936);
        assert_eq!(big.len(), 151_936);
        assert_eq!(big.natural_len(), small.len());
        assert_eq!(big.tokens[..small.len()], small.tokens[..]);
        assert_eq!(big.text_tokens(), small.text_tokens());
        assert_eq!(big.tokens[small.len()], "\u{2581}aaaa");
        let distinct: std::collections::HashSet<&String> = big.tokens.iter().collect();
        assert_eq!(distinct.len(), big.len(), "token strings must be unique");
        // A size below the natural one adds nothing.
        assert_eq!(Vocab::new(false, &[], 10).len(), Vocab::new(false, &[], 0).len());
    }

    #[test]
    fn markers_of_real_templates() {
        let qwen = template_markers("{{- '<|im_start|>' + m.role }}{{ '<think>\\n' }}</think><|im_end|><tool_call>");
        assert_eq!(qwen, ["<|im_start|>", "<think>", "</think>", "<|im_end|>"]);
        let gemma = template_markers("<|turn>model\n<|channel>thought\n<channel|><turn|>");
        assert_eq!(gemma, ["<|turn>", "<|channel>", "<channel|>", "<turn|>"]);
        assert_eq!(template_markers("<｜User｜>{% if a < b %}<｜Assistant｜>"), ["<｜User｜>", "<｜Assistant｜>"]);
    }
}
