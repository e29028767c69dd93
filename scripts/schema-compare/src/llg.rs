//! llguidance over the same token table: a schema compiled to a matcher,
//! then per step the mask computed, applied to the logits (as bmoe would
//! have to, in place of the grammar stage) and the token consumed.

use std::sync::Arc;
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use crate::llama::Run;

pub struct Engine {
    factory: ParserFactory,
}

impl Engine {
    /// The token trie and parser factory: built once per process.
    pub fn new(words: &[Vec<u8>], eos: u32) -> Result<Engine, String> {
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Engine { factory })
    }

    pub fn trie(&self) -> &TokTrie {
        self.factory.tok_env().tok_trie()
    }

    /// Compiles `schema`; llguidance's error when it refuses, and its
    /// warnings (keywords it reads loosely) when it does not.
    pub fn compile(&self, schema: &serde_json::Value) -> Result<(Matcher, Vec<String>), String> {
        let grammar = TopLevelGrammar::from_json_schema(schema.clone());
        let parser = self.factory.create_parser(grammar).map_err(|e| first_line(&e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(first_line(&e));
        }
        let warnings = matcher.grammar_warnings();
        Ok((matcher, warnings))
    }

    /// As [`crate::llama::Grammar::run`]: each step computes the mask,
    /// applies it to a logits row and consumes the token.
    pub fn run(&self, matcher: &mut Matcher, tokens: &[u32], eos: u32, logits: &mut [f32]) -> Run {
        let _ = matcher.reset();
        let mut step_s = Vec::with_capacity(tokens.len() + 1);
        for (i, &t) in tokens.iter().chain(std::iter::once(&eos)).enumerate() {
            logits.fill(0.0);
            let start = Instant::now();
            let allowed = match matcher.compute_mask_or_eos() {
                Ok(mask) => {
                    apply(&mask, logits);
                    logits[t as usize] > f32::NEG_INFINITY
                }
                Err(_) => false,
            };
            let ok = allowed && (i == tokens.len() || matcher.consume_token(t).is_ok());
            step_s.push(start.elapsed().as_secs_f64());
            if !ok {
                return Run { accepted: false, refused_at: Some(i), step_s };
            }
        }
        Run { accepted: true, refused_at: None, step_s }
    }
}

impl Engine {
    /// Feeds `prefix` and says, per token, whether the mask allows it next.
    pub fn allows_after(&self, matcher: &mut Matcher, prefix: &[u32], tokens: &[u32]) -> Vec<bool> {
        let _ = matcher.reset();
        if matcher.consume_tokens(prefix).is_err() {
            return vec![false; tokens.len()];
        }
        match matcher.compute_mask_or_eos() {
            Ok(mask) => tokens.iter().map(|&t| mask.is_allowed(t)).collect(),
            Err(_) => vec![false; tokens.len()],
        }
    }
}

/// Sets every token the mask leaves out to -inf, a 32-token word at a time.
fn apply(mask: &toktrie::SimpleVob, logits: &mut [f32]) {
    for (w, &word) in mask.as_slice().iter().enumerate() {
        if word == u32::MAX {
            continue;
        }
        let base = w * 32;
        let end = (base + 32).min(logits.len());
        for (bit, l) in logits[base..end].iter_mut().enumerate() {
            if word & (1 << bit) == 0 {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim();
    let mut out: String = line.chars().take(110).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}
