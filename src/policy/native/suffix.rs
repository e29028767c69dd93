//! `suffix` by its specification, with plain scans instead of a trie:
//! `occurrences(S)` are the context positions where S starts and another
//! token follows. The draft starts from the longest suffix S of the context,
//! shorter than `max_depth`, with at least one occurrence (at least
//! `min_match` long); then it repeatedly appends the follower c of S that
//! occurs most often (lowest id on ties) while
//! `count(S + c) / occurrences(S) >= p_min`, S stays shorter than
//! `max_depth`, and the draft is shorter than `min(max, floor(alpha * |S0|))`
//! (at least 1).

use super::ContextDraft;

/// Native twin of the `suffix` plugin.
#[derive(Debug, Clone, Copy)]
pub struct Suffix {
    /// Longest substring considered.
    pub max_depth: usize,
    /// Shortest starting match.
    pub min_match: usize,
    /// Least share of continuations for a drafted token.
    pub p_min: f64,
    /// Draft length factor over the match length.
    pub alpha: f64,
}

impl Default for Suffix {
    fn default() -> Suffix {
        Suffix { max_depth: 24, min_match: 2, p_min: 0.3, alpha: 2.0 }
    }
}

/// Start positions of `s` in `c` that are followed by another token.
fn continued(c: &[i32], s: &[i32]) -> Vec<usize> {
    (0..c.len().saturating_sub(s.len())).filter(|&i| &c[i..i + s.len()] == s).collect()
}

/// Occurrences of `s` anywhere in `c`.
fn count(c: &[i32], s: &[i32]) -> usize {
    if s.len() > c.len() {
        return 0;
    }
    (0..=c.len() - s.len()).filter(|&i| &c[i..i + s.len()] == s).count()
}

impl ContextDraft for Suffix {
    fn draft_from(&self, c: &[i32], max: usize) -> Vec<i32> {
        let longest =
            (1..self.max_depth.min(c.len() + 1)).rev().find(|&len| !continued(c, &c[c.len() - len..]).is_empty());
        let Some(matched) = longest.filter(|&m| m >= self.min_match) else { return Vec::new() };
        let limit = max.min(((self.alpha * matched as f64).floor() as usize).max(1));
        let mut s: Vec<i32> = c[c.len() - matched..].to_vec();
        let mut out = Vec::new();
        while out.len() < limit && s.len() < self.max_depth {
            let starts = continued(c, &s);
            let mut followers: Vec<i32> = starts.iter().map(|&i| c[i + s.len()]).collect();
            followers.sort_unstable();
            followers.dedup();
            let scored = followers.into_iter().map(|t| {
                let mut ext = s.clone();
                ext.push(t);
                (count(c, &ext), t)
            });
            // Highest count; among equal counts the lowest token id.
            let Some((n, t)) = scored.max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1))) else { break };
            if (n as f64) / (starts.len() as f64) < self.p_min {
                break;
            }
            out.push(t);
            s.push(t);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_the_most_frequent_continuation() {
        // "1 2" is followed by 3 twice and by 9 once; then "1 2 3" by 4 twice.
        let c = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 9, 1, 2];
        assert_eq!(Suffix::default().draft_from(&c, 8), [3, 4, 1, 2]);
        // alpha caps the draft at alpha x the match length.
        assert_eq!(Suffix { alpha: 0.5, ..Suffix::default() }.draft_from(&c, 8), [3]);
        // A match of one token is below min_match 2.
        assert!(Suffix::default().draft_from(&[7, 1, 8, 1], 4).is_empty());
    }
}
