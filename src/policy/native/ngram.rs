//! `ngram`, by the reference engine's specification: scan every earlier end
//! position backwards, measure the common suffix (capped at `max_match` and
//! at the candidate's own length), keep the strictly longest (so the most
//! recent wins ties), require `min_match`, draft what followed.

use super::ContextDraft;

/// Native twin of the `ngram` plugin.
#[derive(Debug, Clone, Copy)]
pub struct Ngram {
    /// Shortest match that may draft.
    pub min_match: usize,
    /// Longest match compared.
    pub max_match: usize,
}

impl Default for Ngram {
    fn default() -> Ngram {
        Ngram { min_match: 3, max_match: 12 }
    }
}

/// The reference function over a corpus whose last token is the pattern's end.
pub fn ngram_draft(c: &[i32], max: usize, min_match: usize, max_match: usize) -> Vec<i32> {
    if max == 0 || min_match == 0 || max_match < min_match || c.len() < min_match + 1 {
        return Vec::new();
    }
    let end = c.len() - 1;
    let (mut best, mut best_len) = (0, 0);
    for j in (min_match - 1..end).rev() {
        if c[j] != c[end] {
            continue;
        }
        let cap = max_match.min(j + 1);
        let mut m = 1;
        while m < cap && c[j - m] == c[end - m] {
            m += 1;
        }
        if m > best_len {
            (best, best_len) = (j, m);
            if m == max_match {
                break;
            }
        }
    }
    if best_len < min_match {
        return Vec::new();
    }
    c[best + 1..c.len().min(best + 1 + max)].to_vec()
}

impl ContextDraft for Ngram {
    fn draft_from(&self, context: &[i32], max: usize) -> Vec<i32> {
        ngram_draft(context, max, self.min_match, self.max_match)
    }
}

#[cfg(test)]
mod tests {
    use super::ngram_draft as d;

    #[test]
    fn reference_cases() {
        assert!(d(&[], 3, 3, 12).is_empty());
        assert!(d(&[1, 2, 3, 4, 5], 3, 3, 12).is_empty(), "no repeat");
        assert_eq!(d(&[1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 3, 3, 12), [4, 5, 6], "trigram continuation");
        assert_eq!(d(&[1, 2, 3, 4, 5, 6, 0, 1, 2, 3], 2, 3, 12), [4, 5], "width cap");
        assert_eq!(d(&[1, 2, 3, 4, 0, 1, 2, 3], 8, 3, 12), [4, 0, 1, 2, 3], "clipped at the end");
        // Longest beats more recent: [7,1,2,3] matches 4 at the old place, 3 at the new.
        assert_eq!(d(&[7, 1, 2, 3, 8, 9, 1, 2, 3, 5, 7, 1, 2, 3], 1, 3, 12), [8]);
        // Recency breaks ties.
        assert_eq!(d(&[1, 2, 3, 8, 1, 2, 3, 9, 1, 2, 3], 1, 3, 12), [9]);
        assert_eq!(d(&[9, 9, 9, 9], 3, 2, 2), [9], "a run predicts itself");
        assert!(d(&[5, 1, 2, 6, 1, 2], 3, 3, 12).is_empty(), "2-token match below min 3");
        assert_eq!(d(&[5, 1, 2, 6, 1, 2], 3, 2, 12), [6, 1, 2]);
        assert!(d(&[1, 2, 3, 1, 2, 3], 3, 4, 3).is_empty(), "degenerate arguments");
    }
}
