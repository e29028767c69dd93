//! `ngram-multi` by its specification: for n from `n_max` down to `n_min`,
//! if the last n tokens (of context plus what was drafted so far) occurred
//! in the context followed by something, draft the follower seen most often
//! there (the most recent one on ties) if seen at least `min_count` times;
//! the first n that occurred decides. Repeat up to `max` tokens.

use super::History;
use crate::policy::DraftPolicy;

/// Native twin of the `ngram-multi` plugin.
#[derive(Debug, Clone)]
pub struct NgramMulti {
    /// Shortest n-gram consulted.
    pub n_min: usize,
    /// Longest n-gram consulted.
    pub n_max: usize,
    /// Times a follower must have been seen.
    pub min_count: u32,
    history: History,
}

impl Default for NgramMulti {
    fn default() -> NgramMulti {
        NgramMulti { n_min: 2, n_max: 4, min_count: 1, history: History::default() }
    }
}

impl NgramMulti {
    /// Twin with explicit parameters.
    pub fn new(n_min: usize, n_max: usize, min_count: u32) -> NgramMulti {
        NgramMulti { n_min, n_max, min_count, history: History::default() }
    }

    /// The token to draft after `seq`, scanning the whole context.
    fn next(&self, seq: &[i32]) -> Option<i32> {
        let c = &self.history.0;
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

impl DraftPolicy for NgramMulti {
    fn reset(&mut self, context: &[i32]) -> Result<(), String> {
        self.history.reset(context);
        Ok(())
    }

    fn observe(&mut self, accepted: &[i32]) -> Result<(), String> {
        self.history.observe(accepted);
        Ok(())
    }

    fn draft(&mut self, max: u32) -> Result<Vec<i32>, String> {
        let mut seq = self.history.0.clone();
        let start = seq.len();
        while seq.len() - start < max as usize {
            match self.next(&seq) {
                Some(t) => seq.push(t),
                None => break,
            }
        }
        Ok(seq.split_off(start))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_frequent_follower_then_recency() {
        let context = [1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2];
        // Bigrams only: after [1, 2] came 3 twice and 4 once -> 3; after [2, 3], 1.
        let mut p = NgramMulti::new(2, 2, 1);
        p.reset(&context).unwrap();
        assert_eq!(p.draft(2).unwrap(), [3, 1]);
        // The longest n decides: [2, 3, 1, 2] occurred once, followed by 4.
        let mut p = NgramMulti::default();
        p.reset(&context).unwrap();
        assert_eq!(p.draft(1).unwrap(), [4]);
        // Equal counts: the most recent follower wins.
        p.reset(&[5, 6, 7, 5, 6, 8, 5, 6]).unwrap();
        assert_eq!(p.draft(1).unwrap(), [8]);
        p.reset(&[1, 2, 3]).unwrap();
        assert!(p.draft(3).unwrap().is_empty());
    }
}
