//! Eviction with a route profile's prior ([`super::profile`]), and the duel
//! that decides, as the run goes, whether to trust it.
//!
//! With the prior, an entry's worth is its decayed uses in this run plus
//! the uses the profile expects of it: an expert routed for a share `q` of
//! tokens settles at `q * half-life / ln 2` decayed uses, and the prior is
//! [`PRIOR_WEIGHT`] times that many uses that never fade. The entry worth least goes first, ties
//! by least recent. A profile from the same model and workload keeps the
//! experts the model favours through a burst of others; one from another
//! workload would keep the wrong ones, so two shadow caches (entry ids
//! only, no data) replay the run's routing beside the real one, one under
//! plain decay and one with the prior, and the real cache follows the one
//! that missed fewer bytes over the last [`DUEL_HALF_LIFE_TOKENS`] tokens.
//! Without a profile the real cache is plain decay.

use super::evict::{CachePolicy, DECAY_HALF_LIFE_TOKENS, DecayedCount, EvictionOrder};
use super::profile::RouteProfile;

/// Tokens after which a shadow's missed bytes count half in the duel.
pub const DUEL_HALF_LIFE_TOKENS: f64 = 32.0;

/// How much the prior weighs against this run's uses: measured with `bmoe
/// replay --learn-from-others` on six prompts of the qwen3-30b-a3b preset,
/// 1 read 0.876x/0.758x of decay's bytes at 10%/19% of the bank, 2 read
/// 0.866x/0.738x, 4 read 0.859x/0.732x but trusts a stale profile longer.
pub const PRIOR_WEIGHT: f64 = 2.0;

/// Uses the prior adds per unit of share: [`PRIOR_WEIGHT`] times the steady
/// decayed count of an expert routed every token.
fn uses_per_share() -> f64 {
    PRIOR_WEIGHT * DECAY_HALF_LIFE_TOKENS / std::f64::consts::LN_2
}

/// The entry worth least under the prior among `ids`, skipping `spared`:
/// fewest decayed uses at `now` plus the prior's, ties by least recent.
pub fn prior_victim(
    ids: impl Iterator<Item = u32>,
    prior: &[f64],
    decayed: &[DecayedCount],
    last: &[u64],
    now: f64,
    mut spared: impl FnMut(u32) -> bool,
) -> Option<u32> {
    let worth = |id: u32| (prior[id as usize] + decayed[id as usize].count_at(now), last[id as usize]);
    ids.filter(|&id| !spared(id)).min_by(|&a, &b| {
        let (wa, la) = worth(a);
        let (wb, lb) = worth(b);
        wa.total_cmp(&wb).then(la.cmp(&lb)).then(a.cmp(&b))
    })
}

/// A cache of entry ids replaying the routing under one policy.
#[derive(Debug, Clone)]
struct Shadow {
    with_prior: bool,
    valid: Vec<bool>,
    stamp: Vec<u64>,
    last: Vec<u64>,
    decayed: Vec<DecayedCount>,
    /// Resident entries, in decay's order (the prior's shadow scans them).
    order: EvictionOrder,
    resident: u64,
    clock: u64,
}

impl Shadow {
    fn new(entries: usize, with_prior: bool) -> Shadow {
        Shadow {
            with_prior,
            valid: vec![false; entries],
            stamp: vec![0; entries],
            last: vec![0; entries],
            decayed: vec![DecayedCount::default(); entries],
            order: EvictionOrder::new(entries),
            resident: 0,
            clock: 0,
        }
    }

    /// Puts `id` in without a use (a warm start).
    fn admit(&mut self, id: u32, bytes: u64) {
        if !std::mem::replace(&mut self.valid[id as usize], true) {
            self.resident += bytes;
            self.order.set(id, CachePolicy::Decay.key(&self.decayed[id as usize], 0));
        }
    }

    /// One load of distinct experts `ids`; returns the bytes it missed.
    fn load(&mut self, ids: &[u32], load: u64, now: f64, duel: &Duel) -> u64 {
        let mut missed = 0;
        for &id in ids {
            let i = id as usize;
            self.clock += 1;
            self.decayed[i].add_use(now);
            self.last[i] = self.clock;
            self.stamp[i] = load;
            if !std::mem::replace(&mut self.valid[i], true) {
                let bytes = duel.bytes_of(id);
                self.resident += bytes;
                missed += bytes;
            }
            self.order.set(id, CachePolicy::Decay.key(&self.decayed[i], self.clock));
        }
        while self.resident > duel.budget {
            let spared = |id: u32| self.stamp[id as usize] == load;
            let victim = match self.with_prior {
                true => prior_victim(self.order.ids(), &duel.prior, &self.decayed, &self.last, now, spared),
                false => self.order.victim(spared),
            };
            let Some(id) = victim else { break };
            self.order.remove(id);
            self.valid[id as usize] = false;
            self.resident -= duel.bytes_of(id);
        }
        missed
    }
}

/// The prior of a route profile and the duel over trusting it.
#[derive(Debug, Clone)]
pub struct Duel {
    n_expert: usize,
    /// Bytes of one entry of each layer.
    entry_bytes: Vec<u64>,
    /// Uses the profile expects of each entry.
    prior: Vec<f64>,
    budget: u64,
    /// Plain decay, then decay with the prior.
    shadows: [Shadow; 2],
    /// Each shadow's missed bytes, halving every [`DUEL_HALF_LIFE_TOKENS`].
    missed: [f64; 2],
    loads: u64,
    /// Loads a token makes (the streamed layers).
    layers: f64,
}

impl Duel {
    /// The duel for a cache of `budget` bytes over entries `layer *
    /// n_expert + expert` of `entry_bytes[layer]` bytes, `layers` loads a
    /// token, with `profile`'s prior; `None` when the profile is empty or
    /// of another shape.
    pub fn new(
        profile: &RouteProfile,
        entry_bytes: Vec<u64>,
        n_expert: usize,
        budget: u64,
        layers: usize,
    ) -> Option<Duel> {
        if profile.is_empty() || profile.n_expert != n_expert || profile.n_layer != entry_bytes.len() {
            return None;
        }
        let prior: Vec<f64> = profile.shares().into_iter().map(|q| q * uses_per_share()).collect();
        let entries = prior.len();
        Some(Duel {
            n_expert,
            entry_bytes,
            prior,
            budget,
            shadows: [Shadow::new(entries, false), Shadow::new(entries, true)],
            missed: [0.0; 2],
            loads: 0,
            layers: layers.max(1) as f64,
        })
    }

    fn bytes_of(&self, id: u32) -> u64 {
        self.entry_bytes[id as usize / self.n_expert]
    }

    /// The uses the profile expects of each entry.
    pub fn prior(&self) -> &[f64] {
        &self.prior
    }

    /// Changes the budget the shadows hold.
    pub fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
    }

    /// Tells the shadows the real cache started with `ids` (a warm start).
    pub fn warm(&mut self, ids: &[u32]) {
        for &id in ids {
            let bytes = self.bytes_of(id);
            self.shadows.iter_mut().for_each(|s| s.admit(id, bytes));
        }
    }

    /// Replays one load (distinct experts of one layer, as entry ids) in
    /// both shadows at time `now` (decode steps) and scores them.
    pub fn observe(&mut self, ids: &[u32], now: f64) {
        self.loads += 1;
        let keep = (-1.0 / (DUEL_HALF_LIFE_TOKENS * self.layers)).exp2();
        let mut shadows = std::mem::replace(&mut self.shadows, [Shadow::new(0, false), Shadow::new(0, true)]);
        for (i, s) in shadows.iter_mut().enumerate() {
            let missed = s.load(ids, self.loads, now, self) as f64;
            self.missed[i] = self.missed[i] * keep + missed;
        }
        self.shadows = shadows;
    }

    /// True while the prior's shadow has missed fewer bytes than plain
    /// decay's (so a run starts on plain decay until the prior proves itself).
    pub fn trusts_prior(&self) -> bool {
        self.missed[1] < self.missed[0]
    }

    /// Each shadow's recent missed bytes: (plain decay, with the prior).
    pub fn missed(&self) -> (f64, f64) {
        (self.missed[0], self.missed[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layer of eight one-byte experts, a budget of two entries,
    /// with a profile that has seen `favoured` routed for a fifth of tokens.
    fn duel(favoured: u32) -> Duel {
        let mut p = RouteProfile::new("m", 1, 8, 1);
        for t in 0..100u32 {
            p.observe(0, [if t % 5 == 0 { favoured } else { 2 + t % 5 }]);
        }
        Duel::new(&p, vec![1], 8, 2, 1).unwrap()
    }

    #[test]
    fn the_prior_wins_the_duel_when_it_is_right_and_loses_it_when_it_is_wrong() {
        // Expert 0 in bursts of 5 tokens every 25; between them, experts 1-7
        // two tokens each. Plain decay lets 0 fade during the gap and misses
        // it when the burst returns; a prior that knows 0 keeps it.
        let play = |d: &mut Duel| {
            for t in 0..500u32 {
                let phase = t % 25;
                let e = if phase < 5 { 0 } else { 1 + ((phase - 5) / 2) % 7 };
                d.observe(&[e], t as f64);
            }
        };
        let mut right = duel(0);
        play(&mut right);
        assert!(right.trusts_prior(), "{:?}", right.missed());
        // A prior for expert 1, which holds a slot it rarely earns.
        let mut wrong = duel(1);
        play(&mut wrong);
        assert!(!wrong.trusts_prior(), "{:?}", wrong.missed());
    }

    #[test]
    fn no_duel_without_a_profile_or_for_another_shape() {
        let p = RouteProfile::new("m", 2, 4, 1);
        assert!(Duel::new(&p, vec![1, 1], 4, 4, 2).is_none());
        let mut p = p;
        p.observe(0, [1]);
        assert!(Duel::new(&p, vec![1, 1, 1], 4, 4, 3).is_none());
        assert!(Duel::new(&p, vec![1, 1], 8, 4, 2).is_none());
    }

    #[test]
    fn the_victim_is_worth_least_with_the_prior() {
        let mut decayed = vec![DecayedCount::default(); 3];
        decayed[0].add_use(0.0);
        decayed[0].add_use(1.0);
        decayed[1].add_use(1.0);
        let prior = [0.0, 0.0, 5.0];
        let last = [2, 3, 1];
        // Entry 2 was never used but the prior expects it: entry 1 goes.
        assert_eq!(prior_victim(0..3, &prior, &decayed, &last, 1.0, |_| false), Some(1));
        assert_eq!(prior_victim(0..3, &prior, &decayed, &last, 1.0, |id| id == 1), Some(0));
        // Equal worth: the least recent goes.
        let same = [decayed[1], decayed[1]];
        assert_eq!(prior_victim(0..2, &[0.0, 0.0], &same, &[5, 4], 1.0, |_| false), Some(1));
    }
}
