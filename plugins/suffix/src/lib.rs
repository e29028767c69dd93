//! `suffix`: a frequency-scored suffix trie over the whole context, in the
//! spirit of SuffixDecoding. Every substring of up to `max_depth` tokens is
//! a trie node counting its occurrences. A draft starts from the longest
//! suffix of the context (shorter than `max_depth`) that occurred before,
//! then repeatedly takes the child seen most often (lowest token id on ties)
//! while its share of the continuations is at least `p_min`. Longer matches
//! earn longer drafts: at most `alpha` x the match length.

use std::cell::RefCell;
use std::collections::HashMap;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "../wit" });

struct Suffix;

struct Node {
    depth: u32,
    /// Occurrences of this substring followed by another token.
    continued: u32,
    /// Occurrences of this substring.
    count: u32,
    children: Vec<u32>,
    token: i32,
}

struct State {
    max_depth: usize,
    min_match: usize,
    p_min: f64,
    alpha: f64,
    nodes: Vec<Node>,
    edges: HashMap<(u32, i32), u32>,
    /// Nodes of the context's suffixes of length 1, 2, ... (up to max_depth).
    active: Vec<u32>,
}

impl State {
    fn new(max_depth: usize, min_match: usize, p_min: f64, alpha: f64) -> State {
        let root = Node { depth: 0, continued: 0, count: 0, children: Vec::new(), token: 0 };
        State { max_depth, min_match, p_min, alpha, nodes: vec![root], edges: HashMap::new(), active: Vec::new() }
    }

    fn child(&mut self, parent: u32, token: i32) -> u32 {
        if let Some(&c) = self.edges.get(&(parent, token)) {
            return c;
        }
        let id = self.nodes.len() as u32;
        let depth = self.nodes[parent as usize].depth + 1;
        self.nodes.push(Node { depth, continued: 0, count: 0, children: Vec::new(), token });
        self.nodes[parent as usize].children.push(id);
        self.edges.insert((parent, token), id);
        id
    }
}

impl support::Incremental for State {
    fn clear(&mut self) {
        *self = State::new(self.max_depth, self.min_match, self.p_min, self.alpha);
    }

    fn push(&mut self, token: i32) {
        let mut next = Vec::with_capacity(self.max_depth);
        // Extend the empty suffix and every suffix shorter than max_depth.
        let parents: Vec<u32> = std::iter::once(0).chain(self.active.iter().copied()).collect();
        for parent in parents {
            if self.nodes[parent as usize].depth as usize >= self.max_depth {
                continue;
            }
            if parent != 0 {
                self.nodes[parent as usize].continued += 1;
            }
            let c = self.child(parent, token);
            self.nodes[c as usize].count += 1;
            next.push(c);
        }
        self.active = next;
    }

    fn draft(&self, max: usize) -> Vec<i32> {
        // Deepest suffix (shorter than max_depth) with a continuation seen before.
        let Some(&start) = self.active.iter().rev().find(|&&n| {
            (self.nodes[n as usize].depth as usize) < self.max_depth && self.nodes[n as usize].continued > 0
        }) else {
            return Vec::new();
        };
        let matched = self.nodes[start as usize].depth as usize;
        if matched < self.min_match {
            return Vec::new();
        }
        let limit = max.min(((self.alpha * matched as f64).floor() as usize).max(1));
        let mut out = Vec::new();
        let mut node = start;
        while out.len() < limit {
            let n = &self.nodes[node as usize];
            if n.depth as usize >= self.max_depth {
                break;
            }
            let Some(&best) = n.children.iter().max_by(|&&a, &&b| {
                let (a, b) = (&self.nodes[a as usize], &self.nodes[b as usize]);
                a.count.cmp(&b.count).then(b.token.cmp(&a.token))
            }) else {
                break;
            };
            let b = &self.nodes[best as usize];
            // Children are counted only where the parent was continued.
            if (b.count as f64) / (n.continued as f64) < self.p_min {
                break;
            }
            out.push(b.token);
            node = best;
        }
        out
    }
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::new(24, 2, 0.3, 2.0));
}

impl Guest for Suffix {
    fn describe() -> Info {
        Info {
            name: "suffix".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "frequency-scored suffix trie; drafts longer runs after longer matches".into(),
            params: vec![
                Param {
                    name: "max_depth".into(),
                    default: "24".into(),
                    description: "longest substring indexed".into(),
                },
                Param {
                    name: "min_match".into(),
                    default: "2".into(),
                    description: "shortest suffix match that may draft".into(),
                },
                Param {
                    name: "p_min".into(),
                    default: "0.3".into(),
                    description: "least share of the continuations a drafted token must have".into(),
                },
                Param {
                    name: "alpha".into(),
                    default: "2.0".into(),
                    description: "draft at most alpha x match length".into(),
                },
            ],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        STATE.with_borrow_mut(|s| {
            let (mut depth, mut min, mut p, mut alpha) = (s.max_depth, s.min_match, s.p_min, s.alpha);
            support::apply(&params, |name, value| {
                match name {
                    "max_depth" => depth = support::parse(name, value)?,
                    "min_match" => min = support::parse(name, value)?,
                    "p_min" => p = support::parse(name, value)?,
                    "alpha" => alpha = support::parse(name, value)?,
                    _ => return Ok(false),
                }
                Ok(true)
            })?;
            if !(2..=64).contains(&depth) || min == 0 || min >= depth || !(0.0..=1.0).contains(&p) || !(alpha > 0.0) {
                return Err(format!(
                    "need 2 <= max_depth <= 64, 1 <= min_match < max_depth, 0 <= p_min <= 1, alpha > 0 \
                     (got {depth}, {min}, {p}, {alpha})"
                ));
            }
            *s = State::new(depth, min, p, alpha);
            Ok(())
        })
    }

    support::drafter_calls!(STATE);
}

export!(Suffix);
