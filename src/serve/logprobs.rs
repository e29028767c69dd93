//! Log-probabilities of generated tokens, as the OpenAI API reports them
//! (`logprobs` / `top_logprobs` of chat, `logprobs` of completions): the
//! log-softmax of the engine's own logits at each step, before any
//! temperature or grammar, with the most likely alternatives.

use serde_json::{Value, json};

use crate::llama::Model;

/// The most alternatives a request may ask for per token.
pub const MAX_TOP: u32 = 20;

/// One candidate token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The token's bytes (a piece of a character where it splits one).
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
}

impl Candidate {
    /// The token's text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// A generated token with its log-probability and the `top` most likely
/// tokens of its step (highest first, ties by token id).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token chosen.
    pub chosen: Candidate,
    /// The step's most likely tokens.
    pub top: Vec<Candidate>,
}

/// The log-softmax of `logits` at `token`, with the `top` most likely tokens.
pub fn token_logprob(model: &Model, logits: &[f32], token: i32, top: u32) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
    let log_norm = f64::from(max) + sum.ln();
    let logprob = |x: f32| (f64::from(x) - log_norm) as f32;
    let candidate = |id: usize| Candidate { bytes: model.token_bytes(id as i32), logprob: logprob(logits[id]) };
    let chosen = Candidate { bytes: model.token_bytes(token), logprob: logprob(logits[token as usize]) };
    TokenLogprob { chosen, top: top_ids(logits, top as usize).into_iter().map(candidate).collect() }
}

/// The ids of the `n` largest logits, highest first (ties: lower id first).
fn top_ids(logits: &[f32], n: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(n + 1);
    for (id, &x) in logits.iter().enumerate() {
        if n == 0 || best.len() == n && x <= logits[best[n - 1]] {
            continue;
        }
        let at = best.partition_point(|&b| logits[b] >= x);
        best.insert(at, id);
        best.truncate(n);
    }
    best
}

/// Chat's `logprobs` object for `tokens`: `{"content": [...], "refusal": null}`.
pub fn chat_json(tokens: &[TokenLogprob]) -> Value {
    let entry = |c: &Candidate| json!({"token": c.text(), "logprob": c.logprob, "bytes": c.bytes});
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(&t.chosen);
            e["top_logprobs"] = t.top.iter().map(entry).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// A completion's `logprobs` object for `tokens`, whose text begins at
/// byte `offset` of the completion.
pub fn completion_json(tokens: &[TokenLogprob], offset: usize) -> Value {
    let mut at = offset;
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(at);
        at += t.chosen.bytes.len();
    }
    let top: Vec<Value> =
        tokens.iter().map(|t| Value::Object(t.top.iter().map(|c| (c.text(), json!(c.logprob))).collect())).collect();
    json!({
        "tokens": tokens.iter().map(|t| t.chosen.text()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.chosen.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_top_ids_are_the_largest_highest_first() {
        let logits = [0.5, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_ids(&logits, 3), [1, 3, 4]);
        assert_eq!(top_ids(&logits, 0), Vec::<usize>::new());
        assert_eq!(top_ids(&logits, 9), [1, 3, 4, 0, 2]);
    }

    #[test]
    fn completion_offsets_count_bytes() {
        let c = |s: &str, lp: f32| Candidate { bytes: s.as_bytes().to_vec(), logprob: lp };
        let tokens = vec![
            TokenLogprob { chosen: c("hé", -0.5), top: vec![c("hé", -0.5), c("a", -1.5)] },
            TokenLogprob { chosen: c("!", -0.25), top: vec![] },
        ];
        let v = completion_json(&tokens, 4);
        assert_eq!(v["text_offset"], json!([4, 7]));
        assert_eq!(v["token_logprobs"], json!([-0.5, -0.25]));
        assert_eq!(v["top_logprobs"][0]["a"], json!(-1.5));
        let chat = chat_json(&tokens);
        assert_eq!(chat["content"][0]["bytes"], json!([104, 195, 169]));
        assert_eq!(chat["content"][0]["top_logprobs"][1]["token"], "a");
    }
}
