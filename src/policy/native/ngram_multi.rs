//! `ngram-multi` by its specification: for n from `n_max` down to `n_min`,
//! if the last n tokens (of context plus what was drafted so far) occurred
//! in the context followed by something, draft the follower seen most often
//! there (the most recent one on ties) if seen at least `min_count` times;
//! the first n that occurred decides. Repeat up to `max` tokens.

use super::ContextDraft;

/// Native twin of the `ngram-multi` plugin.
#[derive(Debug, Clone, Copy)]
pub struct NgramMulti {
    /// Shortest n-gram consulted.
    pub n_min: usize,
    /// Longest n-gram consulted.
    pub n_max: usize,
    /// Times a follower must have been seen.
    pub min_count: u32,
}

impl Default for NgramMulti {
    fn default() -> NgramMulti {
        NgramMulti { n_min: 2, n_max: 4, min_count: 1 }
    }
}

impl NgramMulti {
    /// The token to draft after `seq`, scanning the whole context `c`.
    fn next(&self, c: &[i32], seq: &[i32]) -> Option<i32> {
        for n in (self.n_min..=self.n_max).rev() {
            if seq.len() < n {
                continue;
            }
            let key = &seq[seq.len() - n..];
            // (token, count, last position) of every follower of `key`.
            let mut followers: Vec<(i32, u32, usize)> = Vec::new();
            for i in 0..c.len().saturating_sub(n) {
                if &c[i..i + n] == key {
                    let t = c[i + n];
                    match followers.iter_mut().find(|f| f.0 == t) {
                        Some(f) => {
                            f.1 += 1;
                            f.2 = i + n;
                        }
                        None => followers.push((t, 1, i + n)),
                    }
                }
            }
            if let Some(&(t, count, _)) = followers.iter().max_by_key(|f| (f.1, f.2)) {
                return (count >= self.min_count).then_some(t);
            }
        }
        None
    }
}

impl ContextDraft for NgramMulti {
    fn draft_from(&self, context: &[i32], max: usize) -> Vec<i32> {
        let mut seq = context.to_vec();
        while seq.len() - context.len() < max {
            match self.next(context, &seq) {
                Some(t) => seq.push(t),
                None => break,
            }
        }
        seq.split_off(context.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_frequent_follower_then_recency() {
        let context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2];
        // Bigrams only: after [1, 2] came 3 twice and 4 once -> 3; after [2, 3], 1.
        let bigrams = NgramMulti { n_min: 2, n_max: 2, min_count: 1 };
        assert_eq!(bigrams.draft_from(&context, 2), [3, 1]);
        // The longest n decides: [2, 3, 1, 2] occurred once, followed by 4.
        assert_eq!(NgramMulti::default().draft_from(&context, 1), [4]);
        // Equal counts: the most recent follower wins.
        assert_eq!(NgramMulti::default().draft_from(&[5, 6, 7, 5, 6, 8, 5, 6], 1), [8]);
        assert!(NgramMulti::default().draft_from(&[1, 2, 3], 3).is_empty());
    }
}
