//! ARC (Megiddo and Modha, 2003) over a byte budget: resident entries seen
//! once (T1) and more than once (T2), ghosts of those evicted from each (B1,
//! B2), and a target for T1's bytes that a ghost hit moves: toward T1 when a
//! B1 ghost returns, toward T2 when a B2 ghost does.

use crate::moe::evict::EvictionOrder;

/// ARC's lists and target.
#[derive(Debug, Clone)]
pub struct ArcLists {
    /// T1, T2, B1, B2, each least recent first.
    lists: [EvictionOrder; 4],
    bytes: [u64; 4],
    /// Target bytes of T1.
    target: f64,
    budget: u64,
    clock: u64,
}

const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

impl ArcLists {
    /// Empty lists over `entries` ids for a cache of `budget` bytes.
    pub fn new(entries: usize, budget: u64) -> ArcLists {
        ArcLists {
            lists: std::array::from_fn(|_| EvictionOrder::new(entries)),
            bytes: [0; 4],
            target: 0.0,
            budget,
            clock: 0,
        }
    }

    fn put(&mut self, list: usize, id: u32, bytes: u64) {
        self.clock += 1;
        self.lists[list].set(id, (self.clock, 0));
        self.bytes[list] += bytes;
    }

    fn take(&mut self, list: usize, id: u32, bytes: u64) -> bool {
        let held = self.lists[list].contains(id);
        if held {
            self.lists[list].remove(id);
            self.bytes[list] -= bytes;
        }
        held
    }

    /// An entry admitted without a use (a warm start): T1.
    pub fn admit(&mut self, id: u32, bytes: u64) {
        self.put(T1, id, bytes);
    }

    /// A load's first use of `id`: a hit moves it to T2's recent end; a miss
    /// whose ghost is in B1 or B2 moves the target and enters T2; any other
    /// miss enters T1.
    pub fn access(&mut self, id: u32, hit: bool, bytes: u64) {
        let step = bytes as f64;
        if hit {
            if !self.take(T1, id, bytes) {
                self.take(T2, id, bytes);
            }
            self.put(T2, id, bytes);
        } else if self.take(B1, id, bytes) {
            let ratio = self.bytes[B2] as f64 / (self.bytes[B1] as f64).max(step);
            self.target = (self.target + step.max(step * ratio)).min(self.budget as f64);
            self.put(T2, id, bytes);
        } else if self.take(B2, id, bytes) {
            let ratio = self.bytes[B1] as f64 / (self.bytes[B2] as f64).max(step);
            self.target = (self.target - step.max(step * ratio)).max(0.0);
            self.put(T2, id, bytes);
        } else {
            self.put(T1, id, bytes);
        }
    }

    /// The entry to evict, skipping `spared`: T1's least recent while T1
    /// holds more than its target, else T2's (the other list when the
    /// first has none to give).
    pub fn victim(&self, spared: impl Fn(u32) -> bool) -> Option<u32> {
        let first = if self.bytes[T1] as f64 > self.target { T1 } else { T2 };
        self.lists[first].victim(&spared).or_else(|| self.lists[T1 + T2 - first].victim(&spared))
    }

    /// Moves an evicted entry to its ghost list and trims the ghosts.
    pub fn evicted(&mut self, id: u32, bytes: u64, bytes_of: impl Fn(u32) -> u64) {
        let ghost = if self.take(T1, id, bytes) { B1 } else { B2 };
        if ghost == B2 {
            self.take(T2, id, bytes);
        }
        self.put(ghost, id, bytes);
        while self.bytes[T1] + self.bytes[B1] > self.budget {
            let Some(old) = self.lists[B1].victim(|_| false) else { break };
            self.take(B1, old, bytes_of(old));
        }
        while self.bytes.iter().sum::<u64>() > 2 * self.budget {
            let Some(old) = self.lists[B2].victim(|_| false) else { break };
            self.take(B2, old, bytes_of(old));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returning_ghost_moves_the_target_and_enters_t2() {
        let mut arc = ArcLists::new(8, 2);
        arc.access(0, false, 1);
        arc.access(1, false, 1);
        // T1 over its target (0): its least recent goes, to B1.
        assert_eq!(arc.victim(|_| false), Some(0));
        arc.evicted(0, 1, |_| 1);
        arc.access(0, false, 1);
        assert!(arc.target >= 1.0 && arc.lists[T2].contains(0) && !arc.lists[B1].contains(0));
        // A hit on T1's entry moves it to T2.
        arc.access(1, true, 1);
        assert!(arc.lists[T2].contains(1) && arc.bytes[T1] == 0);
        assert_eq!(arc.victim(|id| id == 0), Some(1));
    }
}
