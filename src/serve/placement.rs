//! Which sequence (slot) a request runs in. A batch-invariant server gives
//! each sequence its own KV buffer, and llama.cpp decodes a batch's
//! sequences in one pass only when their ids are consecutive: running
//! sequences 0 and 2 cost two passes over the weights a step where 0 and 1
//! cost one. So the running requests are kept in one block of ids: a new
//! request takes a free slot that keeps the block whole, and a request that
//! ends inside the block has its place taken by one from the block's edge.
//! Every such move is an exchange of two slots' cells
//! (`Session::seq_swap`): a request brought into the block trades places
//! with the conversation cached there, which stays cached where the request
//! was. So the server forgets a conversation only to make room for a new
//! one, as it would if nothing moved. An exchange moves cells bit for bit,
//! so no reply changes; it costs three copies of a sequence's KV buffer,
//! far less than a pass over the weights or a prompt's prefill.

/// Where a new request runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// The slot it runs in.
    pub slot: usize,
    /// The free slot whose cells it starts from, exchanged with `slot`'s
    /// first.
    pub bring_from: Option<usize>,
}

/// The fewest cached tokens worth a slot's place: below it, a request
/// starts from the slot holding the least, so another conversation's cache
/// is not given up for a few shared tokens (a chat template's opening).
pub const MIN_REUSE: usize = 8;

/// How many blocks of consecutive slots `busy` holds.
fn blocks(busy: impl Iterator<Item = bool>) -> usize {
    let mut previous = false;
    let mut count = 0;
    for b in busy {
        count += usize::from(b && !previous);
        previous = b;
    }
    count
}

/// Where a new request goes: `busy[s]` says whether slot `s` runs a
/// request, `shared[s]` how many tokens of its prompt slot `s` holds,
/// `held[s]` how many tokens it holds. A slot is ranked by the prompt it
/// holds (counted from [`MIN_REUSE`] tokens), then by holding the least,
/// then by its number, and the request starts from the best-ranked free
/// slot's cells. Without `exchanges` (a recurrent state, which cannot
/// move) it runs there. With them it runs in the best-ranked of the free
/// slots that leave the fewest blocks of busy slots, brought there by an
/// exchange where that is another slot. None when every slot is busy.
pub fn place(busy: &[bool], shared: &[usize], held: &[usize], exchanges: bool) -> Option<Placement> {
    let free = || (0..busy.len()).filter(|&s| !busy[s]);
    let useful = |s: usize| if shared[s] >= MIN_REUSE { shared[s] } else { 0 };
    let rank = |&s: &usize| (useful(s), std::cmp::Reverse(held[s]), std::cmp::Reverse(s));
    let best = free().max_by_key(rank)?;
    if !exchanges {
        return Some(Placement { slot: best, bring_from: None });
    }
    let blocks_with = |slot: usize| blocks(busy.iter().enumerate().map(|(s, &b)| b || s == slot));
    let fewest = free().map(blocks_with).min()?;
    let slot = free().filter(|&s| blocks_with(s) == fewest).max_by_key(rank)?;
    Some(Placement { slot, bring_from: (best != slot).then_some(best) })
}

/// Moves (from, to) that gather the busy slots into one block of
/// consecutive slots: the window of `busy.len()`'s busy count that already
/// holds the most of them (the lowest such), each busy slot outside it
/// moved to a free slot inside it, in order. None needed: empty.
pub fn gather(busy: &[bool]) -> Vec<(usize, usize)> {
    let n = busy.iter().filter(|&&b| b).count();
    if blocks(busy.iter().copied()) <= 1 {
        return Vec::new();
    }
    let inside = |start: usize| busy[start..start + n].iter().filter(|&&b| b).count();
    let start = (0..=busy.len() - n).max_by_key(|&w| (inside(w), std::cmp::Reverse(w))).unwrap_or(0);
    let window = start..start + n;
    let outside = (0..busy.len()).filter(|s| busy[*s] && !window.contains(s));
    let holes = window.clone().filter(|&s| !busy[s]);
    outside.zip(holes).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn busy(slots: usize, running: &[usize]) -> Vec<bool> {
        (0..slots).map(|s| running.contains(&s)).collect()
    }

    #[test]
    fn a_new_request_joins_the_block_and_nothing_is_forgotten() {
        let empty = [0; 8];
        // Nothing runs: the slot holding the most of the prompt, in place.
        assert_eq!(place(&busy(4, &[]), &[0, 9, 20, 20], &empty, true), Some(Placement { slot: 2, bring_from: None }));
        // A few shared tokens do not give another conversation's cache up:
        // the slot holding the least.
        assert_eq!(
            place(&busy(4, &[]), &[1, 1, 0, 0], &[30, 40, 5, 0], true),
            Some(Placement { slot: 3, bring_from: None })
        );
        // 1 and 2 run: 0 or 3 keeps one block; 3 holds the most of the
        // prompt, so nothing moves.
        assert_eq!(
            place(&busy(4, &[1, 2]), &[9, 0, 0, 12], &empty, true),
            Some(Placement { slot: 3, bring_from: None })
        );
        // 0 and 1 run, 5 holds the prompt: it runs in 2, whose
        // conversation goes to 5.
        let placed = place(&busy(6, &[0, 1]), &[0, 0, 1, 0, 0, 30], &empty, true);
        assert_eq!(placed, Some(Placement { slot: 2, bring_from: Some(5) }));
        // A hole in the block is filled first.
        let placed = place(&busy(5, &[0, 2]), &[0, 0, 0, 9, 0], &empty, true);
        assert_eq!(placed, Some(Placement { slot: 1, bring_from: Some(3) }));
        // A prompt no slot holds gives up the least held conversation (3's
        // 5 tokens), not 2's 40, which goes where 3's was.
        let placed = place(&busy(5, &[0, 1]), &[0; 5], &[50, 50, 40, 5, 20], true);
        assert_eq!(placed, Some(Placement { slot: 2, bring_from: Some(3) }));
        // Without exchanges (a recurrent state), the slot holding the most.
        let placed = place(&busy(6, &[0, 1]), &[0, 0, 1, 0, 0, 30], &empty, false);
        assert_eq!(placed, Some(Placement { slot: 5, bring_from: None }));
        assert_eq!(place(&busy(2, &[0, 1]), &[0, 0], &empty, true), None);
    }

    #[test]
    fn gathering_moves_the_fewest_into_the_fullest_window() {
        assert!(gather(&busy(8, &[])).is_empty());
        assert!(gather(&busy(8, &[3, 4, 5])).is_empty());
        assert_eq!(gather(&busy(8, &[0, 2, 3])), [(3, 1)]);
        assert_eq!(gather(&busy(8, &[0, 6, 7])), [(0, 5)]);
        assert_eq!(gather(&busy(8, &[0, 1, 2, 7])), [(7, 3)]);
        assert_eq!(gather(&busy(4, &[0, 3])), [(3, 1)]);
    }

    proptest! {
        /// Whatever runs where, the moves end with one block, move only
        /// busy slots into free ones, and move each at most once.
        #[test]
        fn gathering_always_ends_in_one_block(running in proptest::collection::btree_set(0usize..12, 0..12)) {
            let running: Vec<usize> = running.into_iter().collect();
            let mut slots = busy(12, &running);
            let moves = gather(&slots);
            prop_assert!(moves.len() <= running.len());
            for (from, to) in moves {
                prop_assert!(slots[from] && !slots[to]);
                slots.swap(from, to);
            }
            prop_assert!(blocks(slots.iter().copied()) <= 1);
            prop_assert_eq!(slots.iter().filter(|&&b| b).count(), running.len());
        }

        /// A new request never splits the block when a free slot keeps it
        /// whole, and starts from the cells a server that never moves
        /// anything would run it on: the best-ranked free slot's.
        #[test]
        fn placing_keeps_one_block_and_brings_the_best_cells(
            running in proptest::collection::btree_set(0usize..8, 0..7),
            shared in proptest::collection::vec(0usize..30, 8),
            held in proptest::collection::vec(0usize..30, 8),
        ) {
            let running: Vec<usize> = running.into_iter().collect();
            let slots = busy(8, &running);
            prop_assume!(blocks(slots.iter().copied()) <= 1);
            let p = place(&slots, &shared, &held, true).unwrap();
            prop_assert!(!slots[p.slot]);
            prop_assert!(p.bring_from.is_none_or(|b| !slots[b] && b != p.slot));
            let mut after = slots.clone();
            after[p.slot] = true;
            prop_assert_eq!(blocks(after.iter().copied()), 1);
            let unmoved = place(&slots, &shared, &held, false).unwrap();
            prop_assert_eq!(p.bring_from.unwrap_or(p.slot), unmoved.slot);
        }
    }
}
