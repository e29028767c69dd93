//! The expressions of a Jinja template's tags, as tokens with their places
//! in the source: what the rewrites done before minijinja compiles a template
//! read ([`super::markup`], [`string_continuations`]).

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// A quoted string literal, quotes included.
    Text,
    /// A name or keyword.
    Name,
    /// A number.
    Number,
    /// `(`, `[` or `{`.
    Open,
    /// `)`, `]` or `}`.
    Close,
    /// Anything else: `+`, `|`, `==`, `,`...
    Operator,
}

/// One token of an expression, by its place in the source.
#[derive(Debug, Clone, Copy)]
pub struct Token {
    /// What it is.
    pub kind: Kind,
    /// Where it starts in the source.
    pub start: usize,
    /// Where it ends.
    pub end: usize,
}

/// The tokens of every `{{ ... }}` and `{% ... %}` tag, skipping comments
/// and `raw` blocks.
pub fn expression_tags(source: &str) -> Vec<Vec<Token>> {
    let bytes = source.as_bytes();
    let mut tags = Vec::new();
    let mut at = 0;
    while let Some(found) = source[at..].find('{') {
        let open = at + found;
        let next = bytes.get(open + 1).copied();
        match next {
            Some(b'#') => {
                at = source[open..].find("#}").map_or(source.len(), |e| open + e + 2);
            }
            Some(b'{') | Some(b'%') => {
                let closer = if next == Some(b'{') { b'}' } else { b'%' };
                let (tokens, end) = tokenize(source, open + 2, closer);
                at = end;
                if next == Some(b'%') && is_raw(source, &tokens) {
                    at = source[at..].find("endraw").map_or(source.len(), |e| at + e);
                    continue;
                }
                tags.push(tokens);
            }
            _ => at = open + 1,
        }
    }
    tags
}

/// Whether a statement tag is `{% raw %}`.
fn is_raw(source: &str, tokens: &[Token]) -> bool {
    matches!(tokens, [t] if &source[t.start..t.end] == "raw")
}

/// The tokens from `from` to the tag's closing `}}` or `%}` (outside
/// brackets and text), and where the tag ends.
fn tokenize(source: &str, from: usize, closer: u8) -> (Vec<Token>, usize) {
    let bytes = source.as_bytes();
    let mut tokens = Vec::new();
    let mut depth = 0usize;
    let mut i = from;
    if matches!(bytes.get(i), Some(b'-' | b'+')) {
        i += 1;
    }
    while i < bytes.len() {
        let c = bytes[i];
        let ends_here = |j: usize| bytes.get(j) == Some(&closer) && bytes.get(j + 1) == Some(&b'}');
        if depth == 0 && (ends_here(i) || (matches!(c, b'-' | b'+') && ends_here(i + 1))) {
            let end = if ends_here(i) { i + 2 } else { i + 3 };
            return (tokens, end);
        }
        let start = i;
        let kind = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'\'' | b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != c {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i = (i + 1).min(bytes.len());
                Kind::Text
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                Kind::Name
            }
            b'0'..=b'9' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || matches!(bytes[i], b'_' | b'.')) {
                    i += 1;
                }
                Kind::Number
            }
            b'(' | b'[' | b'{' => {
                depth += 1;
                i += 1;
                Kind::Open
            }
            b')' | b']' | b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
                Kind::Close
            }
            _ => {
                let two = bytes.get(i..i + 2).unwrap_or_default();
                i += if matches!(two, b"**" | b"//" | b"==" | b"!=" | b"<=" | b">=") { 2 } else { 1 };
                // Keep to character boundaries for text outside ASCII.
                while !source.is_char_boundary(i) {
                    i += 1;
                }
                Kind::Operator
            }
        };
        tokens.push(Token { kind, start, end: i.min(bytes.len()) });
    }
    (tokens, bytes.len())
}

/// `source` with each backslash-newline inside a tag's string literal
/// removed: Jinja2 reads string literals with Python's escapes, where that is
/// a line continuation (Mistral-Small-3.1's default system prompt), and
/// minijinja would keep both characters.
pub fn string_continuations(source: &str) -> String {
    if !source.contains("\\\n") {
        return source.to_string();
    }
    let mut cuts = Vec::new();
    for token in expression_tags(source).into_iter().flatten().filter(|t| t.kind == Kind::Text) {
        let bytes = &source.as_bytes()[token.start..token.end];
        let mut i = 1;
        while i + 1 < bytes.len() {
            if bytes[i] == b'\\' {
                if bytes[i + 1] == b'\n' {
                    cuts.push(token.start + i);
                }
                i += 2;
            } else {
                i += 1;
            }
        }
    }
    let mut out = String::with_capacity(source.len());
    let mut from = 0;
    for at in cuts {
        out.push_str(&source[from..at]);
        from = at + 2;
    }
    out.push_str(&source[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_read_past_strings_comments_and_raw_blocks() {
        let src = "a{# {{ x }} #}{{ \"}}\" + y }}{% raw %}{{ z }}{% endraw %}{%- if w -%}";
        let words: Vec<Vec<&str>> =
            expression_tags(src).iter().map(|t| t.iter().map(|k| &src[k.start..k.end]).collect()).collect();
        assert_eq!(words, [vec!["\"}}\"", "+", "y"], vec!["if", "w"]]);
    }

    #[test]
    fn a_backslash_newline_in_a_string_is_a_line_continuation() {
        let src = "{%- set s = \"one.\\\ntwo \\\\\nthree\" %}text \\\n{{ s }}";
        assert_eq!(string_continuations(src), "{%- set s = \"one.two \\\\\nthree\" %}text \\\n{{ s }}");
        let plain = "{{ 'a\\nb' }}";
        assert_eq!(string_continuations(plain), plain);
    }
}
