//! Which cached expert goes first when the budget is full. Two policies
//! share one ordered set of eviction keys:
//!
//! - `lru`: least recently used (every routed row refreshes recency);
//! - `decay`: fewest *decayed* uses, ties by least recent. Each load that
//!   routes an expert adds one use; uses halve every
//!   [`DECAY_HALF_LIFE_TOKENS`] decode steps, so an expert several recent
//!   tokens chose outranks one chosen once a moment ago, and a burst long
//!   past fades instead of pinning the cache like plain LFU.
//!
//! Measured with `bmoe replay` on the shared real-model traces and the bench
//! model's own, at 5-50% of the bank: `decay` moves 2-36% fewer bytes than
//! LRU in 14 of 20 cases, the same in 2 and at most 1.1% more in 4
//! (docs/benchmarks.md). It is the default. With a route profile, decay
//! weighs the profile's prior while that misses less ([`super::duel`]).

use std::collections::BTreeSet;

/// A cache eviction policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CachePolicy {
    /// Least recently used.
    Lru,
    /// Fewest decayed uses, ties by least recent (the default).
    #[default]
    Decay,
}

/// Decode steps after which a use counts half in [`CachePolicy::Decay`].
pub const DECAY_HALF_LIFE_TOKENS: f64 = 12.0;

impl CachePolicy {
    /// Every live policy.
    pub const ALL: [CachePolicy; 2] = [CachePolicy::Lru, CachePolicy::Decay];

    /// The eviction key of an entry last used at `last` (a clock ticking
    /// per use) with `decayed` uses.
    pub fn key(self, decayed: &DecayedCount, last: u64) -> EvictionKey {
        match self {
            CachePolicy::Lru => (last, 0),
            CachePolicy::Decay => (decayed.rank(), last),
        }
    }

    /// Its name in configuration and reports.
    pub fn name(self) -> &'static str {
        match self {
            CachePolicy::Lru => "lru",
            CachePolicy::Decay => "decay",
        }
    }
}

impl std::str::FromStr for CachePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<CachePolicy, String> {
        CachePolicy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown cache policy `{s}`: lru or decay"))
    }
}

/// An eviction key: the smallest goes first.
pub type EvictionKey = (u64, u64);

/// A use count that halves every [`DECAY_HALF_LIFE_TOKENS`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DecayedCount {
    count: f64,
    at: f64,
}

impl DecayedCount {
    /// Adds one use at time `now` (in decode steps).
    pub fn add_use(&mut self, now: f64) {
        self.count = self.count * (-(now - self.at) / DECAY_HALF_LIFE_TOKENS).exp2() + 1.0;
        self.at = now;
    }

    /// The count as it stands at time `now` (in decode steps, not before
    /// the last use).
    pub fn count_at(&self, now: f64) -> f64 {
        self.count * (-(now - self.at).max(0.0) / DECAY_HALF_LIFE_TOKENS).exp2()
    }

    /// A rank that orders counts as they would compare at any common later
    /// time: `log2(count) + at / half-life`, non-negative once used.
    pub fn rank(&self) -> u64 {
        let rank = self.count.max(1.0).log2() + self.at / DECAY_HALF_LIFE_TOKENS;
        // Non-negative floats order like their bit patterns.
        rank.max(0.0).to_bits()
    }
}

/// The entries of a cache ordered by eviction key.
#[derive(Debug, Clone)]
pub struct EvictionOrder {
    keys: Vec<Option<EvictionKey>>,
    order: BTreeSet<(EvictionKey, u32)>,
}

impl EvictionOrder {
    /// An empty order over entry ids `0..entries`.
    pub fn new(entries: usize) -> EvictionOrder {
        EvictionOrder { keys: vec![None; entries], order: BTreeSet::new() }
    }

    /// Inserts `id` with `key`, or moves it there.
    pub fn set(&mut self, id: u32, key: EvictionKey) {
        if let Some(old) = self.keys[id as usize].replace(key) {
            self.order.remove(&(old, id));
        }
        self.order.insert((key, id));
    }

    /// Removes `id` (no-op when absent).
    pub fn remove(&mut self, id: u32) {
        if let Some(old) = self.keys[id as usize].take() {
            self.order.remove(&(old, id));
        }
    }

    /// The entry to evict first, skipping those `spared` says to keep.
    pub fn victim(&self, mut spared: impl FnMut(u32) -> bool) -> Option<u32> {
        self.order.iter().map(|&(_, id)| id).find(|&id| !spared(id))
    }

    /// The entries held, first to evict first.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.order.iter().map(|&(_, id)| id)
    }

    /// True when `id` is held.
    pub fn contains(&self, id: u32) -> bool {
        self.keys[id as usize].is_some()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when no entry is held.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_moves_removes_and_skips_spared_entries() {
        let mut o = EvictionOrder::new(4);
        o.set(0, (5, 0));
        o.set(1, (3, 0));
        o.set(2, (9, 0));
        assert_eq!(o.victim(|_| false), Some(1));
        o.set(1, (10, 0));
        assert_eq!(o.victim(|_| false), Some(0));
        assert_eq!(o.victim(|id| id == 0), Some(2));
        o.remove(0);
        o.remove(0);
        assert_eq!((o.len(), o.victim(|_| false)), (2, Some(2)));
        assert_eq!(o.victim(|_| true), None);
    }

    #[test]
    fn decayed_uses_outrank_a_single_recent_use_until_they_fade() {
        let count = |uses: &[f64]| {
            let mut c = DecayedCount::default();
            uses.iter().for_each(|&t| c.add_use(t));
            c
        };
        // Three uses over the last few steps beat one use just now.
        assert!(count(&[1.0, 2.0, 3.0]).rank() > count(&[4.0]).rank());
        // Long past, the same three uses lose to one recent use.
        assert!(count(&[1.0, 2.0, 3.0]).rank() < count(&[3.0 + 3.0 * DECAY_HALF_LIFE_TOKENS]).rank());
        // One use a half-life later counts like two uses now.
        let (a, b) = (count(&[0.0, 0.0]), count(&[DECAY_HALF_LIFE_TOKENS]));
        assert_eq!(a.rank(), b.rank());
        // The count itself halves: two uses then one more a half-life on is 2.
        assert_eq!(count(&[0.0, 0.0, DECAY_HALF_LIFE_TOKENS]).count, 2.0);
    }
}
