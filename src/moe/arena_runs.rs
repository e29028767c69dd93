//! Which page runs of the expert cache's arena are free. An entry's slice
//! takes a run for its whole pages when it is read and gives it back when
//! evicted; runs of the size asked are reused first, then the arena's
//! untouched tail, then a larger free run is split.

use std::sync::Arc;

use crate::llama::memory::Arena;

/// The arena and its free runs, in bytes (page multiples).
pub struct ArenaRuns {
    arena: Arc<Arena>,
    free: Vec<(usize, usize)>,
    /// Start of the part never handed out.
    untouched: usize,
}

impl ArenaRuns {
    /// Every byte of `arena` free.
    pub fn new(arena: Arc<Arena>) -> ArenaRuns {
        ArenaRuns { arena, free: Vec::new(), untouched: 0 }
    }

    /// The arena itself.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// A free run of `len` bytes, as its offset and whether its pages
    /// were used before (a run from the untouched part has none yet);
    /// `None` when no free run is large enough.
    pub fn take(&mut self, len: usize) -> Option<(usize, bool)> {
        if let Some(i) = self.free.iter().rposition(|&(_, l)| l == len) {
            return Some((self.free.swap_remove(i).0, true));
        }
        if self.arena.len() - self.untouched >= len {
            self.untouched += len;
            return Some((self.untouched - len, false));
        }
        let i = self.free.iter().rposition(|&(_, l)| l > len)?;
        let (at, l) = self.free[i];
        self.free[i] = (at + len, l - len);
        Some((at, true))
    }

    /// Gives back a run [`Self::take`] handed out.
    pub fn give(&mut self, at: usize, len: usize) {
        self.free.push((at, len));
    }

    /// Bytes free.
    #[cfg(test)]
    fn free_bytes(&self) -> usize {
        self.arena.len() - self.untouched + self.free.iter().map(|&(_, l)| l).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::memory::page;

    #[test]
    fn runs_are_reused_carved_and_split() {
        let mut runs = ArenaRuns::new(Arc::new(Arena::new(10 * page()).unwrap()));
        let (a, _) = runs.take(4 * page()).unwrap();
        let (b, used) = runs.take(4 * page()).unwrap();
        assert_eq!((a, b, used), (0, 4 * page(), false));
        assert_eq!(runs.take(3 * page()), None, "two pages left untouched");
        runs.give(a, 4 * page());
        // A run of the same size comes back as it was, its pages used.
        assert_eq!(runs.take(4 * page()), Some((a, true)));
        runs.give(a, 4 * page());
        // Smaller: the untouched tail first, then a split of the free run.
        assert_eq!(runs.take(2 * page()), Some((8 * page(), false)));
        assert_eq!(runs.take(3 * page()), Some((a, true)));
        assert_eq!(runs.take(page()), Some((a + 3 * page(), true)));
        assert_eq!(runs.free_bytes(), 0);
        assert_eq!(runs.take(page()), None);
        runs.give(b, 4 * page());
        assert_eq!(runs.free_bytes(), 4 * page());
    }
}
