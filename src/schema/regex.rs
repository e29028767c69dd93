//! A string `pattern` as GBNF, for a plain regex subset: literal
//! characters (and `\`-escaped punctuation, `\n`, `\t`, `\r`), classes
//! `[...]` and `[^...]` (with ranges, `\d`, `\w`), `.`, `\d` `\w` `\s` and
//! their negations, groups `(...)` and `(?:...)`, alternation `|`,
//! quantifiers `?` `*` `+` `{m}` `{m,}` `{m,n}`, and anchors `^` `$` at the
//! ends. The whole string matches the pattern (anchored or not: a string
//! that is one match also contains one). Anything else is an error naming
//! it.
//!
//! The grammar matches the JSON text of the string, between its quotes: a
//! `"` or `\` in the pattern is written escaped, and `.` or a negated class
//! never matches a quote, backslash or control character.

/// What a negated class or `.` never matches: JSON would need it escaped.
const UNSAFE: &str = "\"\\\\\\x00-\\x1F\\x7F";

/// The GBNF expression for the JSON text of strings matching `pattern`.
pub fn to_gbnf(pattern: &str) -> Result<String, String> {
    let mut chars: Vec<char> = pattern.chars().collect();
    if chars.first() == Some(&'^') {
        chars.remove(0);
    }
    // A trailing `$` not escaped by an odd run of backslashes.
    if chars.last() == Some(&'$') {
        let slashes = chars[..chars.len() - 1].iter().rev().take_while(|c| **c == '\\').count();
        if slashes % 2 == 0 {
            chars.pop();
        }
    }
    let mut parser = Parser { chars, at: 0 };
    let out = parser.alternation()?;
    match parser.peek() {
        None => Ok(if out.is_empty() { "\"\"".into() } else { out }),
        Some(c) => Err(format!("unbalanced `{c}`")),
    }
}

struct Parser {
    chars: Vec<char>,
    at: usize,
}

impl Parser {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn next(&mut self) -> Result<char, String> {
        let c = self.peek().ok_or("it ends too soon")?;
        self.at += 1;
        Ok(c)
    }

    /// Sequences separated by `|`, up to a `)` or the end (a rule body,
    /// or the inside of a group).
    fn alternation(&mut self) -> Result<String, String> {
        let mut alternatives = vec![self.sequence()?];
        while self.peek() == Some('|') {
            self.at += 1;
            alternatives.push(self.sequence()?);
        }
        if alternatives.len() == 1 {
            return Ok(alternatives.remove(0));
        }
        let alternatives: Vec<String> =
            alternatives.into_iter().map(|a| if a.is_empty() { "\"\"".into() } else { a }).collect();
        Ok(alternatives.join(" | "))
    }

    /// Quantified atoms, up to `|`, `)` or the end; runs of plain
    /// characters become one literal.
    fn sequence(&mut self) -> Result<String, String> {
        let mut parts: Vec<String> = Vec::new();
        let mut text = String::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let (atom, plain) = self.atom()?;
            let quantifier = self.quantifier()?;
            match (plain, quantifier.is_empty()) {
                (Some(c), true) => text.push(c),
                _ => {
                    if !text.is_empty() {
                        parts.push(json_literal(&std::mem::take(&mut text)));
                    }
                    parts.push(format!("{atom}{quantifier}"));
                }
            }
        }
        if !text.is_empty() {
            parts.push(json_literal(&text));
        }
        Ok(parts.join(" "))
    }

    /// One atom as GBNF, and the character when it is a plain one.
    fn atom(&mut self) -> Result<(String, Option<char>), String> {
        let c = self.next()?;
        Ok(match c {
            '(' => {
                if self.peek() == Some('?') {
                    self.at += 1;
                    if self.peek() != Some(':') {
                        return Err("`(?` other than `(?:` is not supported".into());
                    }
                    self.at += 1;
                }
                let inner = self.alternation()?;
                if self.next().ok() != Some(')') {
                    return Err("a `(` is not closed".into());
                }
                (format!("({})", if inner.is_empty() { "\"\"" } else { &inner }), None)
            }
            '[' => (self.class()?, None),
            '.' => (format!("[^{UNSAFE}]"), None),
            '\\' => match self.next()? {
                'd' => ("[0-9]".into(), None),
                'w' => ("[a-zA-Z0-9_]".into(), None),
                's' => ("(\" \" | \"\\\\t\" | \"\\\\n\" | \"\\\\r\")".into(), None),
                'D' => (format!("[^0-9{UNSAFE}]"), None),
                'W' => (format!("[^a-zA-Z0-9_{UNSAFE}]"), None),
                'S' => (format!("[^ {UNSAFE}]"), None),
                e => {
                    let c = escaped(e)?;
                    (json_literal(&c.to_string()), Some(c))
                }
            },
            '^' | '$' => return Err(format!("the anchor `{c}` is supported only at the ends")),
            '*' | '+' | '?' | '{' => return Err(format!("`{c}` has nothing to repeat")),
            c => (json_literal(&c.to_string()), Some(c)),
        })
    }

    /// A quantifier after an atom, as GBNF ("" when there is none).
    fn quantifier(&mut self) -> Result<String, String> {
        let q = match self.peek() {
            Some(c @ ('?' | '*' | '+')) => {
                self.at += 1;
                c.to_string()
            }
            Some('{') => {
                self.at += 1;
                let mut body = String::new();
                loop {
                    match self.next()? {
                        '}' => break,
                        c @ ('0'..='9' | ',') => body.push(c),
                        c => return Err(format!("`{c}` in a `{{m,n}}` quantifier")),
                    }
                }
                let (min, max) = body.split_once(',').unwrap_or((&body, &body));
                let min: u32 = min.parse().map_err(|_| format!("the quantifier {{{body}}}"))?;
                if !max.is_empty() && max.parse::<u32>().map_err(|_| format!("the quantifier {{{body}}}"))? < min {
                    return Err(format!("the quantifier {{{body}}} counts down"));
                }
                format!("{{{min},{max}}}").replace(&format!("{{{min},{min}}}"), &format!("{{{min}}}"))
            }
            _ => return Ok(String::new()),
        };
        if matches!(self.peek(), Some('?' | '+')) {
            return Err(format!("the lazy or possessive quantifier `{q}{}`", self.peek().unwrap_or_default()));
        }
        Ok(q)
    }

    /// A class after its `[`, as a GBNF class.
    fn class(&mut self) -> Result<String, String> {
        let negated = self.peek() == Some('^');
        if negated {
            self.at += 1;
        }
        let mut out = String::new();
        let mut first = true;
        loop {
            let c = self.next().map_err(|_| "a `[` is not closed".to_string())?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let low = match c {
                '\\' => match self.next()? {
                    'd' => {
                        out.push_str("0-9");
                        continue;
                    }
                    'w' => {
                        out.push_str("a-zA-Z0-9_");
                        continue;
                    }
                    e => escaped(e)?,
                },
                '[' => return Err("`[` inside a class".into()),
                c => c,
            };
            let mut high = low;
            if self.peek() == Some('-') && self.chars.get(self.at + 1).is_some_and(|c| *c != ']') {
                self.at += 1;
                high = match self.next()? {
                    '\\' => escaped(self.next()?)?,
                    c => c,
                };
                if high < low {
                    return Err(format!("the range {low}-{high} counts down"));
                }
            }
            if !negated && (low..=high).any(|c| c == '"' || c == '\\' || c.is_control()) {
                return Err("a class holding `\"`, `\\` or a control character".into());
            }
            out.push_str(&class_char(low));
            if high != low {
                out.push('-');
                out.push_str(&class_char(high));
            }
        }
        Ok(if negated { format!("[^{out}{UNSAFE}]") } else { format!("[{out}]") })
    }
}

/// The character `\e` stands for: punctuation, or `n`, `r`, `t`.
fn escaped(e: char) -> Result<char, String> {
    match e {
        'n' => Ok('\n'),
        'r' => Ok('\r'),
        't' => Ok('\t'),
        e if e.is_ascii_punctuation() => Ok(e),
        e => Err(format!("the escape `\\{e}` is not supported")),
    }
}

/// A character in a GBNF class: ASCII other than letters and digits as
/// `\xHH`, so nothing in it is read as class syntax.
fn class_char(c: char) -> String {
    if c.is_ascii() && !c.is_ascii_alphanumeric() { format!("\\x{:02X}", u32::from(c)) } else { c.to_string() }
}

/// A GBNF literal for the JSON text (inside quotes) of `text`.
fn json_literal(text: &str) -> String {
    let json = serde_json::Value::String(text.to_string()).to_string();
    super::text_literal(&json[1..json.len() - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_become_gbnf() {
        assert_eq!(to_gbnf("^abc$").unwrap(), "\"abc\"");
        assert_eq!(to_gbnf("^[A-Z]{2}-\\d{3,}$").unwrap(), "[A-Z]{2} \"-\" [0-9]{3,}");
        assert_eq!(to_gbnf("(a|bc)+x?").unwrap(), "(\"a\" | \"bc\")+ \"x\"?");
        assert_eq!(to_gbnf("a\"b").unwrap(), "\"a\\\\\\\"b\"");
        assert_eq!(to_gbnf("[^a-c]").unwrap(), format!("[^a-c{UNSAFE}]"));
        assert_eq!(to_gbnf("[.-]{1,4}").unwrap(), "[\\x2E\\x2D]{1,4}");
        assert_eq!(to_gbnf("x\\$").unwrap(), "\"x$\"");
        assert_eq!(to_gbnf("(?:ab){2}").unwrap(), "(\"ab\"){2}");
        let errors = [
            ("a(?=b)", "`(?` other"),
            ("a\\bc", "escape `\\b`"),
            ("a^b", "anchor `^`"),
            ("*a", "nothing to repeat"),
            ("a+?", "lazy"),
            ("(ab", "not closed"),
            ("ab)", "unbalanced"),
            ("[a\"]", "class holding"),
            ("a{3,1}", "counts down"),
            ("\\1", "escape `\\1`"),
        ];
        for (pattern, want) in errors {
            let e = to_gbnf(pattern).unwrap_err();
            assert!(e.contains(want), "{pattern}: {e}");
        }
    }
}
