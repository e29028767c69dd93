//! `ngram-multi`: looks at several n-gram lengths at once. For the longest n
//! (from `n_max` down to `n_min`) whose last n tokens occurred before, it
//! proposes the token that most often followed them (the most recent one on
//! ties), appends it and repeats, up to `max` tokens. Follower counts are
//! kept per n-gram as the context grows, so a draft costs a few lookups.

use std::cell::RefCell;
use std::collections::HashMap;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "../wit" });

struct NgramMulti;

/// How often `token` followed an n-gram, and where it last did.
#[derive(Clone, Copy)]
struct Follower {
    token: i32,
    count: u32,
    last: u32,
}

struct State {
    n_min: usize,
    n_max: usize,
    min_count: u32,
    context: Vec<i32>,
    /// One map per n (index n - n_min): n-gram -> its followers.
    maps: Vec<HashMap<Vec<i32>, Vec<Follower>>>,
}

impl State {
    fn new(n_min: usize, n_max: usize, min_count: u32) -> State {
        State { n_min, n_max, min_count, context: Vec::new(), maps: vec![HashMap::new(); n_max - n_min + 1] }
    }

    fn next(&self, seq: &[i32]) -> Option<i32> {
        for n in (self.n_min..=self.n_max).rev() {
            if seq.len() < n {
                continue;
            }
            if let Some(followers) = self.maps[n - self.n_min].get(&seq[seq.len() - n..]) {
                let best = followers.iter().max_by_key(|f| (f.count, f.last))?;
                return (best.count >= self.min_count).then_some(best.token);
            }
        }
        None
    }
}

impl support::Incremental for State {
    fn clear(&mut self) {
        *self = State::new(self.n_min, self.n_max, self.min_count);
    }

    fn push(&mut self, token: i32) {
        let p = self.context.len();
        for n in self.n_min..=self.n_max {
            if p >= n {
                let followers = self.maps[n - self.n_min].entry(self.context[p - n..p].to_vec()).or_default();
                match followers.iter_mut().find(|f| f.token == token) {
                    Some(f) => {
                        f.count += 1;
                        f.last = p as u32;
                    }
                    None => followers.push(Follower { token, count: 1, last: p as u32 }),
                }
            }
        }
        self.context.push(token);
    }

    fn draft(&self, max: usize) -> Vec<i32> {
        let tail = self.context.len().saturating_sub(self.n_max);
        let mut seq = self.context[tail..].to_vec();
        let start = seq.len();
        while seq.len() - start < max {
            match self.next(&seq) {
                Some(t) => seq.push(t),
                None => break,
            }
        }
        seq.split_off(start)
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::new(2, 4, 1));
}

impl Guest for NgramMulti {
    fn describe() -> Info {
        Info {
            name: "ngram-multi".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "longest of several n-gram lengths; the follower seen most often wins".into(),
            params: vec![
                Param { name: "n_min".into(), default: "2".into(), description: "shortest n-gram consulted".into() },
                Param { name: "n_max".into(), default: "4".into(), description: "longest n-gram consulted".into() },
                Param {
                    name: "min_count".into(),
                    default: "1".into(),
                    description: "times a follower must have been seen to be drafted".into(),
                },
            ],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        STATE.with_borrow_mut(|s| {
            let (mut n_min, mut n_max, mut min_count) = (s.n_min, s.n_max, s.min_count);
            support::apply(&params, |name, value| {
                match name {
                    "n_min" => n_min = support::parse(name, value)?,
                    "n_max" => n_max = support::parse(name, value)?,
                    "min_count" => min_count = support::parse(name, value)?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?;
            if n_min == 0 || n_max < n_min || n_max > 16 || min_count == 0 {
                return Err(format!(
                    "need 1 <= n_min <= n_max <= 16 and min_count >= 1 (got {n_min}, {n_max}, {min_count})"
                ));
            }
            *s = State::new(n_min, n_max, min_count);
            Ok(())
        })
    }

    support::drafter_calls!(STATE);
}

export!(NgramMulti);
