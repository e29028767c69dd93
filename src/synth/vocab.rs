//! A small SentencePiece-style ("llama") vocabulary with byte fallback, so any
//! text prompt tokenizes, plus letter pieces so generated text reads as
//! word-like fragments rather than raw bytes.

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
}

impl Vocab {
    /// Builds the vocabulary: specials, 256 byte tokens, printable ASCII,
    /// `▁`, then `▁x`, `xy` letter pieces when `pieces` is set.
    pub fn new(pieces: bool) -> Vocab {
        let mut v = Vocab { tokens: Vec::new(), scores: Vec::new(), types: Vec::new() };
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
        v
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
    /// normal (text) token.
    pub fn text_tokens(&self) -> Vec<u32> {
        (0..self.len() as u32).filter(|&i| self.types[i as usize] == NORMAL).collect()
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
