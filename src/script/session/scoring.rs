//! `s.score(text, n)` and `kl(exact, run)`: what a lossy setting costs,
//! from a script. A score run is teacher-forced over the text's first `n`
//! tokens and keeps every position's next-token distribution; `kl` compares
//! two of them position by position (`crate::eval`).

use std::ops::ControlFlow;
use std::rc::Rc;

use rhai::{Dynamic, Map};

use super::{Fallible, Session, fail};
use crate::eval::{self, KlStats, Position, Reference};
use crate::interrupt;
use crate::telemetry::summary::RunSummary;

/// A teacher-forced run's distributions (a script value of type `Scores`).
#[derive(Clone)]
pub struct Scores {
    tokens: Rc<Vec<i32>>,
    positions: Rc<Vec<Reference>>,
    summary: RunSummary,
}

impl Scores {
    /// `scores.positions`: how many positions were scored.
    pub fn len(&mut self) -> i64 {
        self.positions.len() as i64
    }
}

impl Session {
    /// `s.score(text, n)`: the model's next-token distribution at each of
    /// the text's first `n` tokens ("" scores the bundled sample text).
    pub fn score(&mut self, text: &str, n: i64) -> Fallible<Scores> {
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| fail("score", format!("n = {n}: want 1 or more")))?;
        let text = if text.is_empty() { eval::text::SAMPLE } else { text };
        let mut host = self.host.borrow_mut();
        let session = host.session_mut();
        let mut tokens = session.model().tokenize(text, true);
        tokens.truncate(n.saturating_add(1).min(session.n_ctx() as usize));
        if tokens.len() < 2 {
            return Err(fail("score", "the text is a single token: nothing to score"));
        }
        let mut positions = Vec::with_capacity(tokens.len() - 1);
        let scored = session
            .score(&tokens, &mut |_, logits| {
                positions.push(Reference::new(logits));
                if interrupt::requested() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            })
            .map_err(|e| fail("score", e))?;
        drop(host);
        if scored.stopped {
            return Err(fail("score", if interrupt::requested() { "interrupted by Ctrl-C" } else { "stopped" }));
        }
        // The progress line counts the positions scored as its tokens.
        let shown = RunSummary { generated: positions.len() as u64, ..scored.summary.clone() };
        self.progress("score", &shown);
        Ok(Scores { tokens: Rc::new(tokens), positions: Rc::new(positions), summary: scored.summary })
    }
}

/// `kl(exact, run)`: how far `run`'s distributions are from `exact`'s: a
/// map of `mean`, `median`, `p99`, `max` (KL divergence in nats),
/// `top1` (share of positions with the same first token), `positions`,
/// and `run`'s `tok_s` and `mib_per_token`.
pub fn kl(exact: &mut Scores, run: Scores) -> Fallible<Map> {
    if exact.tokens != run.tokens {
        return Err(fail(
            "kl",
            "the two runs scored different tokens: score the same text and n with the same model in both",
        ));
    }
    if exact.positions.first().map(Reference::vocab) != run.positions.first().map(Reference::vocab) {
        return Err(fail("kl", "the two runs have different vocabularies"));
    }
    let positions: Vec<Position> =
        exact.positions.iter().zip(run.positions.iter()).map(|(p, q)| eval::compare_references(p, q)).collect();
    let s = KlStats::of(&positions).ok_or_else(|| fail("kl", "no positions"))?;
    let opt = |v: Option<f64>| v.map_or(Dynamic::UNIT, Dynamic::from_float);
    let mut m = Map::new();
    m.insert("mean".into(), Dynamic::from_float(s.mean));
    m.insert("median".into(), Dynamic::from_float(s.median));
    m.insert("p99".into(), Dynamic::from_float(s.p99));
    m.insert("max".into(), Dynamic::from_float(s.max));
    m.insert("top1".into(), Dynamic::from_float(s.top1_agreement));
    m.insert("positions".into(), Dynamic::from(s.positions as i64));
    m.insert("tok_s".into(), opt(run.summary.decode_tps()));
    m.insert("mib_per_token".into(), opt(run.summary.mib_per_token()));
    Ok(m)
}
