//! `ngram`: the reference prompt-lookup drafter. Finds the longest suffix of
//! the context (at most `max_match` tokens, at least `min_match`) that
//! occurred before, preferring the most recent occurrence on ties, and
//! proposes the tokens that followed it. An index from each `min_match`-gram
//! to the positions where it ends keeps a draft call independent of the
//! context length in the common case.

use std::cell::RefCell;
use std::collections::HashMap;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "../wit" });

struct Ngram;

struct State {
    min_match: usize,
    max_match: usize,
    context: Vec<i32>,
    /// Hash of a `min_match`-gram -> positions where it ends, in order.
    index: HashMap<u64, Vec<u32>>,
}

impl State {
    fn new() -> State {
        State { min_match: 3, max_match: 12, context: Vec::new(), index: HashMap::new() }
    }
}

impl support::Incremental for State {
    fn clear(&mut self) {
        self.context.clear();
        self.index.clear();
    }

    fn push(&mut self, token: i32) {
        self.context.push(token);
        let end = self.context.len();
        if end >= self.min_match {
            let key = hash(&self.context[end - self.min_match..]);
            self.index.entry(key).or_default().push((end - 1) as u32);
        }
    }

    fn draft(&self, max: usize) -> Vec<i32> {
        let c = &self.context;
        if max == 0 || c.len() < self.min_match + 1 {
            return Vec::new();
        }
        let end = c.len() - 1;
        let Some(ends) = self.index.get(&hash(&c[c.len() - self.min_match..])) else { return Vec::new() };
        let (mut best, mut best_len) = (0usize, 0usize);
        // Most recent first, so the first of equal length wins.
        for &j in ends.iter().rev() {
            let j = j as usize;
            if j >= end {
                continue;
            }
            let cap = self.max_match.min(j + 1);
            let mut m = 0;
            while m < cap && c[j - m] == c[end - m] {
                m += 1;
            }
            if m > best_len {
                (best, best_len) = (j, m);
                if m == self.max_match {
                    break;
                }
            }
        }
        if best_len < self.min_match {
            return Vec::new();
        }
        c[best + 1..c.len().min(best + 1 + max)].to_vec()
    }
}

/// FNV-1a over the tokens' bytes.
fn hash(tokens: &[i32]) -> u64 {
    tokens
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::new());
}

impl Guest for Ngram {
    fn describe() -> Info {
        Info {
            name: "ngram".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "longest earlier match of the context's suffix; proposes what followed it".into(),
            params: vec![
                Param {
                    name: "min_match".into(),
                    default: "3".into(),
                    description: "shortest suffix match that may draft".into(),
                },
                Param { name: "max_match".into(), default: "12".into(), description: "longest suffix compared".into() },
            ],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        STATE.with_borrow_mut(|s| {
            let (mut min, mut max) = (s.min_match, s.max_match);
            support::apply(&params, |name, value| {
                match name {
                    "min_match" => min = support::parse(name, value)?,
                    "max_match" => max = support::parse(name, value)?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?;
            if min == 0 || max < min || max > 64 {
                return Err(format!("need 1 <= min_match <= max_match <= 64 (got {min} and {max})"));
            }
            *s = State { min_match: min, max_match: max, ..State::new() };
            Ok(())
        })
    }

    support::drafter_calls!(STATE);
}

export!(Ngram);
