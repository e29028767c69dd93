//! Jinja2's markup arithmetic, which minijinja does not have. In Jinja2 a
//! value marked `|safe` (or escaped with `|e`) is markupsafe's `Markup`, and
//! `Markup + text` HTML-escapes the plain text, even with auto-escaping off:
//! functionary's `"Use the function '"|safe + name + ...` writes a quote in a
//! tool's description as `&#34;`. bmoe renders that the same way by piping
//! every plain operand of a `+` chain that holds a marked operand through
//! [`ESCAPE_FILTER`] before minijinja compiles the template.
//!
//! The rewrite is syntactic: a value marked safe in one expression and added
//! to text in another (through `set`) is not escaped. Templates without a
//! marking filter are left byte for byte as they are.

use minijinja::value::Value;

/// The name of the filter the rewrite pipes plain operands through.
macro_rules! escape_filter_name {
    () => {
        "__jinja2_markup_escape"
    };
}

/// The filter the rewrite pipes plain operands through: [`markup_escape`].
pub const ESCAPE_FILTER: &str = escape_filter_name!();

/// What closes a wrapped operand.
const CLOSE_ESCAPE: &str = concat!(")|", escape_filter_name!());

/// Filters whose result is `Markup` in Jinja2.
const MARKING_FILTERS: [&str; 3] = ["safe", "e", "escape"];

/// Words that end an additive chain on the left or right: conditional,
/// boolean and comparison words, and statement keywords.
const CHAIN_BREAKERS: [&str; 9] = ["if", "else", "elif", "or", "and", "not", "in", "for", "set"];

/// markupsafe's `escape`: `&`, `<`, `>`, `'` and `"` as entities. A value
/// already marked is returned as it is; a value that is not text too (Jinja2
/// would fail to add it to markup; bmoe leaves it to minijinja's `+`).
pub fn markup_escape(value: Value) -> Value {
    if value.is_safe() {
        return value;
    }
    let Some(text) = value.as_str() else { return value };
    Value::from_safe_string(escape_text(text))
}

/// `text` with markupsafe's five entities.
fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&#39;"),
            '"' => out.push_str("&#34;"),
            c => out.push(c),
        }
    }
    out
}

/// `source` with each plain operand of a `+` chain that also holds a marked
/// operand written `(operand)|__jinja2_markup_escape`.
pub fn escape_marked_sums(source: &str) -> String {
    if !MARKING_FILTERS.iter().any(|f| source.contains(f)) {
        return source.to_string();
    }
    let mut inserts: Vec<(usize, &'static str)> = Vec::new();
    for tag in expression_tags(source) {
        let items = tree(&tag);
        chains(source, &items, &mut inserts);
    }
    if inserts.is_empty() {
        return source.to_string();
    }
    inserts.sort_by_key(|&(at, text)| (at, text != "("));
    let mut out = String::with_capacity(source.len() + inserts.len() * 32);
    let mut from = 0;
    for (at, text) in inserts {
        out.push_str(&source[from..at]);
        out.push_str(text);
        from = at;
    }
    out.push_str(&source[from..]);
    out
}

/// One token of an expression, by its place in the source.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Name,
    Number,
    Open,
    Close,
    Operator,
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    start: usize,
    end: usize,
}

/// A token, or a bracketed group of items with its brackets.
#[derive(Debug)]
enum Item {
    Token(Token),
    Group { open: Token, inner: Vec<Item>, close: Option<Token> },
}

impl Item {
    fn start(&self) -> usize {
        match self {
            Item::Token(t) => t.start,
            Item::Group { open, .. } => open.start,
        }
    }

    fn end(&self) -> usize {
        match self {
            Item::Token(t) => t.end,
            Item::Group { open, inner, close } => {
                close.map(|c| c.end).or_else(|| inner.last().map(Item::end)).unwrap_or(open.end)
            }
        }
    }
}

/// The tokens of every `{{ ... }}` and `{% ... %}` tag, skipping comments
/// and `raw` blocks.
fn expression_tags(source: &str) -> Vec<Vec<Token>> {
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

/// The tokens nested by their brackets (an unclosed bracket runs to the end).
fn tree(tokens: &[Token]) -> Vec<Item> {
    /// Items up to the close of the group being read, and that close.
    fn group(tokens: &[Token], at: &mut usize) -> (Vec<Item>, Option<Token>) {
        let mut items = Vec::new();
        while let Some(&t) = tokens.get(*at) {
            *at += 1;
            match t.kind {
                Kind::Open => {
                    let (inner, close) = group(tokens, at);
                    items.push(Item::Group { open: t, inner, close });
                }
                Kind::Close => return (items, Some(t)),
                _ => items.push(Item::Token(t)),
            }
        }
        (items, None)
    }
    let mut at = 0;
    let mut items = Vec::new();
    while at < tokens.len() {
        // A stray close at the top ends nothing: read on after it.
        items.extend(group(tokens, &mut at).0);
    }
    items
}

/// Finds the `+` chains among `items` (one bracket level), and in every
/// group below it, that hold a marked operand; records the escapes.
fn chains(source: &str, items: &[Item], inserts: &mut Vec<(usize, &'static str)>) {
    for item in items {
        if let Item::Group { inner, .. } = item {
            chains(source, inner, inserts);
        }
    }
    for segment in segments(source, items) {
        let operands = operands(source, segment);
        let Some(operands) = operands else { continue };
        if operands.len() < 2 || !operands.iter().any(|op| marked(source, op)) {
            continue;
        }
        for op in operands.iter().filter(|op| !marked(source, op)) {
            inserts.push((op[0].start(), "("));
            inserts.push((op[op.len() - 1].end(), CLOSE_ESCAPE));
        }
    }
}

/// The text of a token.
fn text<'a>(source: &'a str, item: &Item) -> Option<&'a str> {
    match item {
        Item::Token(t) => Some(&source[t.start..t.end]),
        Item::Group { .. } => None,
    }
}

/// `items` cut where an additive chain cannot continue: commas, colons,
/// assignments, comparisons, and the words of [`CHAIN_BREAKERS`] (`not`
/// after `is` belongs to the test).
fn segments<'a>(source: &str, items: &'a [Item]) -> Vec<&'a [Item]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, item) in items.iter().enumerate() {
        let breaks = match (item, text(source, item)) {
            (Item::Token(t), Some(word)) if t.kind == Kind::Name => {
                CHAIN_BREAKERS.contains(&word) && !(word == "not" && i > 0 && text(source, &items[i - 1]) == Some("is"))
            }
            (Item::Token(t), Some(op)) if t.kind == Kind::Operator => {
                matches!(op, "," | ":" | "=" | "==" | "!=" | "<" | ">" | "<=" | ">=")
            }
            _ => false,
        };
        if breaks {
            out.push(&items[start..i]);
            start = i + 1;
        }
    }
    out.push(&items[start..]);
    out
}

/// A segment's operands, split at binary `+`; `None` where it also
/// subtracts (no text chain) or is empty.
fn operands<'a>(source: &str, segment: &'a [Item]) -> Option<Vec<&'a [Item]>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, item) in segment.iter().enumerate() {
        let op = text(source, item).filter(|_| matches!(item, Item::Token(t) if t.kind == Kind::Operator));
        let binary = i > start && ends_operand(source, &segment[i - 1]);
        match op {
            Some("+") if binary => {
                out.push(&segment[start..i]);
                start = i + 1;
            }
            Some("-") if binary => return None,
            _ => {}
        }
    }
    (start < segment.len()).then(|| {
        out.push(&segment[start..]);
        out
    })
}

/// Whether `item` can end an operand (so a `+` after it is binary).
fn ends_operand(source: &str, item: &Item) -> bool {
    match item {
        Item::Group { .. } => true,
        Item::Token(t) => match t.kind {
            Kind::Text | Kind::Number => true,
            Kind::Name => !matches!(&source[t.start..t.end], "is" | "not" | "and" | "or" | "in" | "if" | "else"),
            _ => false,
        },
    }
}

/// Whether an operand is markup in Jinja2: piped through a marking filter
/// at its own level, or a bracketed expression that is.
fn marked(source: &str, operand: &[Item]) -> bool {
    let filtered = operand
        .windows(2)
        .any(|w| text(source, &w[0]) == Some("|") && text(source, &w[1]).is_some_and(|f| MARKING_FILTERS.contains(&f)));
    filtered
        || match operand.first() {
            Some(Item::Group { open, inner, .. }) if &source[open.start..open.end] == "(" => {
                operands(source, inner).is_some_and(|ops| ops.iter().any(|op| marked(source, op)))
            }
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_operands_of_a_marked_sum_are_escaped() {
        let src = r#"{{ "Use '"|safe + t["name"] + "' to"|safe + t | tojson() }}"#;
        assert_eq!(
            escape_marked_sums(src),
            r#"{{ "Use '"|safe + (t["name"])|__jinja2_markup_escape + "' to"|safe + (t | tojson())|__jinja2_markup_escape }}"#
        );
    }

    #[test]
    fn templates_without_marked_sums_are_untouched() {
        for src in [
            "{{ a + b }}{% set x = y|safe %}{{ x ~ z }}",
            "{# a|safe + b #}{% raw %}{{ a|safe + b }}{% endraw %}",
            "{{ a|safe - 1 }}{{ f(a|safe, b + c) }}",
            "{% if a|safe == b + c %}{% endif %}",
        ] {
            assert_eq!(escape_marked_sums(src), src, "{src}");
        }
    }

    #[test]
    fn chains_end_at_words_and_brackets() {
        assert_eq!(
            escape_marked_sums("{%- set s = x if c else 'a'|e + y -%}"),
            "{%- set s = x if c else 'a'|e + (y)|__jinja2_markup_escape -%}"
        );
        assert_eq!(
            escape_marked_sums("{{ [n + 'a'|safe, m] }}{{ ('<'|safe + v) + w }}"),
            "{{ [(n)|__jinja2_markup_escape + 'a'|safe, m] }}{{ ('<'|safe + (v)|__jinja2_markup_escape) + (w)|__jinja2_markup_escape }}"
        );
        assert_eq!(
            escape_marked_sums("{{ a|safe + b is defined }}{{ \"}}\"|safe + c }}"),
            "{{ a|safe + (b is defined)|__jinja2_markup_escape }}{{ \"}}\"|safe + (c)|__jinja2_markup_escape }}"
        );
    }

    #[test]
    fn escaping_is_markupsafes() {
        let v = markup_escape(Value::from(r#"<a href="x">&'"#));
        assert_eq!(v.as_str(), Some("&lt;a href=&#34;x&#34;&gt;&amp;&#39;"));
        assert!(v.is_safe());
        assert_eq!(markup_escape(Value::from_safe_string("<".into())).as_str(), Some("<"));
        assert_eq!(markup_escape(Value::from(3)), Value::from(3));
    }
}
