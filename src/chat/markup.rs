//! Jinja2's markup arithmetic, which minijinja does not have. In Jinja2 a
//! value marked `|safe` (or escaped with `|e`) is markupsafe's `Markup`, and
//! `Markup + text` HTML-escapes the plain text, even with auto-escaping off:
//! functionary's `"Use the function '"|safe + name + ...` writes a quote in a
//! tool's description as `&#34;`. bmoe renders that the same way by piping
//! every plain operand of a `+` chain that holds a marked operand through
//! [`ESCAPE_FILTER`] before minijinja compiles the template.
//!
//! A variable a `set` may mark (`{% set arguments = arguments|tojson|safe %}`,
//! Ministral's) is looked at when the template runs: the operands of a chain
//! that adds it go through [`ESCAPE_IF_FILTER`], which escapes them only if
//! it holds markup then. Templates without a marking filter are left byte for
//! byte as they are.

use std::collections::HashSet;

use minijinja::value::{Rest, Value};

use super::jinja_tags::{Kind, Token, expression_tags};

/// The filter the rewrite pipes plain operands through: [`markup_escape`].
pub const ESCAPE_FILTER: &str = "__jinja2_markup_escape";

/// The filter for the operands of a chain that adds a variable a `set` may
/// have marked: [`markup_escape_if`].
pub const ESCAPE_IF_FILTER: &str = "__jinja2_markup_escape_if";

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

/// `value` escaped as [`markup_escape`] does if any of `variables` (the
/// chain's variables a `set` may have marked) holds markup.
pub fn markup_escape_if(value: Value, variables: Rest<Value>) -> Value {
    if variables.iter().any(Value::is_safe) { markup_escape(value) } else { value }
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
/// operand written `(operand)|__jinja2_markup_escape`, and each operand of a
/// chain that adds a variable a `set` may mark written
/// `(operand)|__jinja2_markup_escape_if(variable, ...)`.
pub fn escape_marked_sums(source: &str) -> String {
    if !pipes_through_a_marking_filter(source) {
        return source.to_string();
    }
    let tags: Vec<Vec<Item>> = expression_tags(source).iter().map(|tag| tree(tag)).collect();
    let marked_sets: HashSet<String> = tags.iter().filter_map(|tag| marked_set_target(source, tag)).collect();
    let reader = Chains { source, marked_sets };
    let mut inserts: Vec<(usize, String)> = Vec::new();
    for tag in &tags {
        reader.rewrite(tag, &mut inserts);
    }
    if inserts.is_empty() {
        return source.to_string();
    }
    inserts.sort_by_key(|(at, text)| (*at, text != "("));
    let mut out = String::with_capacity(source.len() + inserts.len() * 32);
    let mut from = 0;
    for (at, text) in inserts {
        out.push_str(&source[from..at]);
        out.push_str(&text);
        from = at;
    }
    out.push_str(&source[from..]);
    out
}

/// Whether `source` has a `|` followed by a marking filter's name, the
/// cheap test that leaves most templates alone.
fn pipes_through_a_marking_filter(source: &str) -> bool {
    source.match_indices('|').any(|(at, _)| {
        let after = source[at + 1..].trim_start();
        let name = after.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or_default();
        MARKING_FILTERS.contains(&name)
    })
}

/// The target of `{% set TARGET = value %}` where the value is piped
/// through a marking filter somewhere, spaces removed.
fn marked_set_target(source: &str, tag: &[Item]) -> Option<String> {
    let (first, rest) = tag.split_first()?;
    if text(source, first) != Some("set") {
        return None;
    }
    let equals = rest.iter().position(|item| text(source, item) == Some("="))?;
    let (target, value) = (&rest[..equals], &rest[equals + 1..]);
    (!target.is_empty() && marks_anywhere(source, value)).then(|| squeezed(source, target))
}

/// Whether `items` pipe into a marking filter at their own level.
fn pipes_into_marking(source: &str, items: &[Item]) -> bool {
    items
        .windows(2)
        .any(|w| text(source, &w[0]) == Some("|") && text(source, &w[1]).is_some_and(|f| MARKING_FILTERS.contains(&f)))
}

/// Whether a marking filter is applied anywhere in `items`.
fn marks_anywhere(source: &str, items: &[Item]) -> bool {
    pipes_into_marking(source, items)
        || items.iter().any(|item| matches!(item, Item::Group { inner, .. } if marks_anywhere(source, inner)))
}

/// The source text of `items` without whitespace.
fn squeezed(source: &str, items: &[Item]) -> String {
    let (Some(first), Some(last)) = (items.first(), items.last()) else { return String::new() };
    source[first.start()..last.end()].chars().filter(|c| !c.is_whitespace()).collect()
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

/// What the rewrite knows of a template: its source and the targets of its
/// marking `set`s.
struct Chains<'a> {
    source: &'a str,
    marked_sets: HashSet<String>,
}

impl Chains<'_> {
    /// Finds the `+` chains among `items` (one bracket level), and in every
    /// group below it, that hold a marked operand or a variable a `set` may
    /// have marked; records the escapes.
    fn rewrite(&self, items: &[Item], inserts: &mut Vec<(usize, String)>) {
        let source = self.source;
        for item in items {
            if let Item::Group { inner, .. } = item {
                self.rewrite(inner, inserts);
            }
        }
        for segment in segments(source, items) {
            let Some(operands) = operands(source, segment) else { continue };
            if operands.len() < 2 {
                continue;
            }
            let variables: Vec<String> =
                operands.iter().map(|op| squeezed(source, op)).filter(|text| self.marked_sets.contains(text)).collect();
            let close = if operands.iter().any(|op| marked(source, op)) {
                format!(")|{ESCAPE_FILTER}")
            } else if !variables.is_empty() {
                format!(")|{ESCAPE_IF_FILTER}({})", variables.join(", "))
            } else {
                continue;
            };
            for op in operands.iter().filter(|op| !marked(source, op)) {
                inserts.push((op[0].start(), "(".into()));
                inserts.push((op[op.len() - 1].end(), close.clone()));
            }
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
    pipes_into_marking(source, operand)
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
        assert!(!pipes_through_a_marking_filter("{{ e + safe|trim }}{{ a || b }}"));
        assert!(pipes_through_a_marking_filter("{{ x |  e }}"));
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
    fn a_variable_a_set_may_mark_is_looked_at_when_the_template_runs() {
        let src = "{% if m %}{% set args = args|tojson|safe %}{% endif %}{{ name + '[ARGS]' + args }}{{ a + b }}";
        assert_eq!(
            escape_marked_sums(src),
            "{% if m %}{% set args = args|tojson|safe %}{% endif %}{{ (name)|__jinja2_markup_escape_if(args) + \
             ('[ARGS]')|__jinja2_markup_escape_if(args) + (args)|__jinja2_markup_escape_if(args) }}{{ a + b }}"
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
