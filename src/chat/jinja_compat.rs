//! Where minijinja and Python's Jinja2 differ on what real chat templates
//! use, Jinja2's behaviour: values written as Python's `str()` writes them
//! (`None`, `True`, `{'a': 1}`), the `string`, `length` and `indent`
//! filters, and the `iterable` test.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};

/// Installs Jinja2's behaviour on `env`.
pub fn install(env: &mut Environment<'static>) {
    env.set_formatter(write_value);
    env.add_filter("string", |v: Value| Value::from(python_str(&v)));
    env.add_filter("length", length);
    env.add_filter("count", length);
    env.add_filter("indent", indent);
    env.add_test("iterable", is_iterable);
}

/// `{{ value }}`: text as it is, anything else as `str(value)`.
fn write_value(out: &mut Output, _state: &State, value: &Value) -> Result<(), Error> {
    out.write_str(&python_str(value)).map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
}

/// Python's `str(value)`: text unquoted, undefined empty, the rest as
/// [`python_repr`].
pub fn python_str(value: &Value) -> String {
    match value.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => value.as_str().unwrap_or_default().to_string(),
        _ => python_repr(value),
    }
}

/// Python's `repr(value)`: `None`, `True`, `'text'`, `[1, 'a']`, `{'k': v}`.
pub fn python_repr(value: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, value);
    out
}

fn write_repr(out: &mut String, value: &Value) {
    match value.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Number => match f64::try_from(value.clone()) {
            Ok(f) if value.as_i64().is_none() && f.fract() == 0.0 && f.is_finite() => out.push_str(&format!("{f:.1}")),
            _ => out.push_str(&value.to_string()),
        },
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key);
                out.push_str(": ");
                write_repr(out, &value.get_item(&key).unwrap_or_default());
            }
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item);
            }
            out.push(']');
        }
        _ => out.push_str(&value.to_string()),
    }
}

/// A string as Python quotes it: single quotes, unless it holds a single
/// quote and no double quote.
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// `x | length`: an undefined value has none (0), as in Jinja2.
fn length(value: Value) -> Result<Value, Error> {
    if value.is_undefined() {
        return Ok(Value::from(0));
    }
    value.len().map(Value::from).ok_or_else(|| {
        Error::new(ErrorKind::InvalidOperation, format!("cannot calculate length of value of type {}", value.kind()))
    })
}

/// `x is iterable`: what Python can iterate (text, lists, mappings and
/// Jinja2's undefined), not `none` or numbers.
fn is_iterable(value: Value) -> bool {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number => false,
        _ => value.try_iter().is_ok(),
    }
}

/// `text | indent(width=4, first=False, blank=False)` as Jinja2 computes it:
/// each line after the first indented, blank lines left alone unless
/// `blank`; a trailing newline kept.
fn indent(
    text: String,
    width: Option<Value>,
    first: Option<bool>,
    blank: Option<bool>,
    kwargs: Kwargs,
) -> Result<String, Error> {
    let width = width.or(kwargs.get("width")?);
    let first = first.or(kwargs.get("first")?);
    let blank = blank.or(kwargs.get("blank")?);
    kwargs.assert_all_used()?;
    let prefix = match &width {
        None => "    ".to_string(),
        Some(w) if w.kind() == ValueKind::String => w.as_str().unwrap_or_default().to_string(),
        Some(w) => " ".repeat(w.as_usize().ok_or_else(|| {
            Error::new(ErrorKind::InvalidOperation, format!("indent: width must be a count or text, not {w}"))
        })?),
    };
    // Jinja2 appends a newline before splitting, so that a text ending in
    // one keeps it.
    let text = text + "\n";
    let lines = split_lines(&text);
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
            if blank.unwrap_or(false) || !line.is_empty() {
                out.push_str(&prefix);
            }
        }
        out.push_str(line);
    }
    if first.unwrap_or(false) {
        out.insert_str(0, &prefix);
    }
    Ok(out)
}

/// Python's `str.splitlines()`: lines split at any of its line boundaries,
/// with no empty line after a final boundary.
fn split_lines(text: &str) -> Vec<&str> {
    const BREAKS: [char; 10] =
        ['\n', '\r', '\u{0b}', '\u{0c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}', '\u{2029}'];
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if BREAKS.contains(&c) {
            lines.push(&text[start..at]);
            start = at + c.len_utf8();
            if c == '\r' && chars.peek().is_some_and(|&(_, n)| n == '\n') {
                chars.next();
                start += 1;
            }
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str) -> String {
        let mut env = Environment::new();
        install(&mut env);
        env.render_str(
            source,
            minijinja::context! { d => Value::from_serialize(serde_json::json!({"a": [1, "it's", null, true, 2.0]})) },
        )
        .unwrap()
    }

    #[test]
    fn values_are_written_as_python_writes_them() {
        assert_eq!(
            render("{{ d }}|{{ d|string }}|{{ none }}|{{ true }}"),
            "{'a': [1, \"it's\", None, True, 2.0]}|{'a': [1, \"it's\", None, True, 2.0]}|None|True"
        );
        assert_eq!(render("{{ 'a\\nb'|string }}|{{ ['a\\nb'] }}|{{ nothing }}"), "a\nb|['a\\nb']|");
    }

    #[test]
    fn iterable_length_and_indent_follow_jinja2() {
        assert_eq!(
            render(
                "{{ none is iterable }} {{ 1 is iterable }} {{ 'x' is iterable }} {{ d is iterable }} {{ nothing is iterable }}"
            ),
            "False False True True True"
        );
        assert_eq!(render("{{ nothing|length }} {{ d.a|length }}"), "0 5");
        assert_eq!(
            render(
                "{{ 'a\\nb\\n'|indent(2) }}|{{ 'a\\n\\nb'|indent(2, first=true) }}|{{ 'a\\n\\nb'|indent('>', blank=true) }}"
            ),
            "a\n  b\n|  a\n\n  b|a\n>\n>b"
        );
    }
}
