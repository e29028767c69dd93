//! Integer bounds as an exact digit grammar: the decimal texts of every
//! integer in a range (`-` sign, no leading zeros), as alternatives of
//! digit-class sequences.

/// One alternative: an optional minus sign, then one digit from each class
/// (an inclusive range of digits), then, when `open`, any number of further
/// digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternative {
    pub negative: bool,
    pub classes: Vec<(u8, u8)>,
    pub open: bool,
}

/// The most digits an integer of a range with an open end is written with.
pub const MAX_DIGITS: usize = 16;

/// The alternatives matching exactly the integers `min..=max` (either end
/// may be open). `None` when the range is empty.
pub fn alternatives(min: Option<i128>, max: Option<i128>) -> Option<Vec<Alternative>> {
    if let (Some(lo), Some(hi)) = (min, max)
        && lo > hi
    {
        return None;
    }
    let mut out = Vec::new();
    // Negative integers -x, x in [a, b] with a >= 1.
    if min.is_none_or(|lo| lo < 0) {
        let a = max.map_or(1, |hi| (-hi).max(1)) as u128;
        let b = min.map(|lo| lo.unsigned_abs());
        if b.is_none_or(|b| a <= b) {
            out.extend(magnitudes(a, b).into_iter().map(|a| Alternative { negative: true, ..a }));
        }
    }
    // Non-negative integers in [a, b].
    if max.is_none_or(|hi| hi >= 0) {
        let a = min.map_or(0, |lo| lo.max(0)) as u128;
        let b = max.map(|hi| hi as u128);
        out.extend(magnitudes(a, b));
    }
    Some(out)
}

/// The decimal texts of `lo..=hi` (`hi` open when `None`), unsigned.
fn magnitudes(lo: u128, hi: Option<u128>) -> Vec<Alternative> {
    let digits = |n: u128| n.to_string().len();
    let top = hi.map_or(digits(lo), digits);
    let mut out = Vec::new();
    for len in digits(lo)..=top {
        let floor = if len == 1 { 0 } else { 10u128.pow(len as u32 - 1) };
        let ceil = 10u128.pow(len as u32) - 1;
        let (a, b) = (lo.max(floor), hi.map_or(ceil, |h| h.min(ceil)));
        for classes in same_length(&a.to_string().into_bytes(), &b.to_string().into_bytes()) {
            out.push(Alternative { negative: false, classes, open: false });
        }
    }
    if hi.is_none() {
        // Every integer with more digits than `lo`.
        let mut classes = vec![(1, 9)];
        classes.extend(std::iter::repeat_n((0, 9), digits(lo)));
        out.push(Alternative { negative: false, classes, open: true });
    }
    out
}

/// Digit-class sequences matching every number from `lo` to `hi`, two
/// digit strings of one length with `lo <= hi`.
pub fn same_length(lo: &[u8], hi: &[u8]) -> Vec<Vec<(u8, u8)>> {
    let d = |c: u8| c - b'0';
    let Some((&l, lo_rest)) = lo.split_first() else { return vec![Vec::new()] };
    let (&h, hi_rest) = hi.split_first().expect("same length");
    let prefixed = |first: (u8, u8), rest: Vec<Vec<(u8, u8)>>| {
        rest.into_iter().map(move |mut seq| {
            seq.insert(0, first);
            seq
        })
    };
    if l == h {
        return prefixed((d(l), d(l)), same_length(lo_rest, hi_rest)).collect();
    }
    let low_full = lo_rest.iter().all(|&c| c == b'0');
    let high_full = hi_rest.iter().all(|&c| c == b'9');
    let any = || vec![vec![(0u8, 9u8); lo_rest.len()]];
    let mut out = Vec::new();
    let (mut from, mut to) = (d(l), d(h));
    if !low_full {
        let nines = vec![b'9'; lo_rest.len()];
        out.extend(prefixed((d(l), d(l)), same_length(lo_rest, &nines)));
        from += 1;
    }
    let upper = if high_full {
        None
    } else {
        to -= 1;
        let zeros = vec![b'0'; hi_rest.len()];
        Some(prefixed((d(h), d(h)), same_length(&zeros, hi_rest)).collect::<Vec<_>>())
    };
    if from <= to {
        out.extend(prefixed((from, to), any()));
    }
    out.extend(upper.into_iter().flatten());
    out
}

/// The GBNF expression for `alternatives` (never empty).
pub fn gbnf(alternatives: &[Alternative]) -> String {
    let one = |a: &Alternative| {
        let mut parts = Vec::new();
        if a.negative {
            parts.push("\"-\"".to_string());
        }
        let mut i = 0;
        while i < a.classes.len() {
            let (l, h) = a.classes[i];
            if (l, h) == (0, 9) {
                let run = a.classes[i..].iter().take_while(|c| **c == (0, 9)).count();
                parts.push(if run == 1 { "[0-9]".into() } else { format!("[0-9]{{{run}}}") });
                i += run;
                continue;
            }
            parts.push(if l == h { format!("\"{l}\"") } else { format!("[{l}-{h}]") });
            i += 1;
        }
        // An open range stops at MAX_DIGITS digits, as llama.cpp's
        // converter does (an unbounded run lets a model write hundreds).
        let more = MAX_DIGITS.saturating_sub(a.classes.len());
        if a.open && more > 0 {
            parts.push(format!("[0-9]{{0,{more}}}"));
        }
        parts.join(" ")
    };
    format!("({})", alternatives.iter().map(one).collect::<Vec<_>>().join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `text` matches one of `alternatives`.
    fn accepts(alternatives: &[Alternative], text: &str) -> bool {
        alternatives.iter().any(|a| {
            let (sign, digits) = match text.strip_prefix('-') {
                Some(rest) => (true, rest.as_bytes()),
                None => (false, text.as_bytes()),
            };
            if sign != a.negative || digits.len() < a.classes.len() || (!a.open && digits.len() > a.classes.len()) {
                return false;
            }
            let fixed = a.classes.iter().zip(digits).all(|(&(l, h), &c)| (b'0' + l..=b'0' + h).contains(&c));
            fixed && digits[a.classes.len()..].iter().all(u8::is_ascii_digit)
        })
    }

    fn expand(seqs: &[Vec<(u8, u8)>]) -> Vec<String> {
        let mut out = Vec::new();
        for seq in seqs {
            let mut texts = vec![String::new()];
            for &(l, h) in seq {
                texts = texts.iter().flat_map(|t| (l..=h).map(move |d| format!("{t}{d}"))).collect();
            }
            out.extend(texts);
        }
        out
    }

    #[test]
    fn same_length_decomposition_is_exact() {
        for len in 1..=3u32 {
            let (floor, ceil) = (if len == 1 { 0 } else { 10u32.pow(len - 1) }, 10u32.pow(len) - 1);
            let step = if len == 3 { 7 } else { 1 };
            for lo in (floor..=ceil).step_by(step) {
                for hi in (lo..=ceil).step_by(step) {
                    let seqs = same_length(lo.to_string().as_bytes(), hi.to_string().as_bytes());
                    let got = expand(&seqs);
                    let want: Vec<String> = (lo..=hi).map(|n| n.to_string()).collect();
                    assert_eq!(got, want, "{lo}..={hi}: {seqs:?}");
                }
            }
        }
        assert_eq!(same_length(b"10", b"99"), vec![vec![(1, 9), (0, 9)]]);
        assert_eq!(same_length(b"123", b"456").len(), 5);
    }

    #[test]
    fn signed_ranges_accept_exactly_their_integers() {
        let bounds = [-1000i128, -101, -100, -99, -10, -9, -1, 0, 1, 7, 9, 10, 11, 99, 100, 250, 999];
        let ends = bounds.iter().map(|&b| Some(b)).chain([None]);
        for min in ends.clone() {
            for max in ends.clone() {
                let Some(alts) = alternatives(min, max) else {
                    assert!(min > max && max.is_some(), "{min:?}..{max:?}");
                    continue;
                };
                for n in -1300i128..=1300 {
                    let want = min.is_none_or(|m| n >= m) && max.is_none_or(|m| n <= m);
                    assert_eq!(accepts(&alts, &n.to_string()), want, "{n} in {min:?}..={max:?}: {alts:?}");
                }
                for bad in ["", "-", "-0", "01", "00", "-01", "1-"] {
                    assert!(!accepts(&alts, bad), "{bad:?} in {min:?}..={max:?}");
                }
            }
        }
        let big = alternatives(Some(i64::MIN.into()), Some(i64::MAX.into())).unwrap();
        for n in [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX] {
            assert!(accepts(&big, &n.to_string()), "{n}");
        }
        assert!(!accepts(&big, "9223372036854775808") && !accepts(&big, "-9223372036854775809"));
        assert!(accepts(&big, "-9223372036854775808"));
    }

    #[test]
    fn gbnf_text() {
        assert_eq!(gbnf(&alternatives(Some(1), Some(7)).unwrap()), "([1-7])");
        assert_eq!(gbnf(&alternatives(Some(-5), Some(12)).unwrap()), "(\"-\" [1-5] | [0-9] | \"1\" [0-2])");
        assert_eq!(gbnf(&alternatives(Some(10), None).unwrap()), "([1-9] [0-9] | [1-9] [0-9]{2} [0-9]{0,13})");
        assert_eq!(alternatives(Some(3), Some(2)), None);
    }
}
