//! JSON written the way Python's `json.dumps` writes it (`", "` and `": "`
//! separators, optional indent, `ensure_ascii`, `sort_keys`), because chat
//! templates embed tool schemas and arguments with `tojson` and the model was
//! trained on Python's spelling.

use std::fmt::Write as _;

use serde_json::Value;

/// `json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)`.
pub fn python_json(value: &Value, indent: Option<usize>, ensure_ascii: bool, sort_keys: bool) -> String {
    let mut out = String::new();
    write_value(&mut out, value, &Style { indent, ensure_ascii, sort_keys }, 0);
    out
}

struct Style {
    indent: Option<usize>,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl Style {
    /// Between items: `", "` on one line, `","` before a newline.
    fn item_separator(&self) -> &'static str {
        if self.indent.is_some() { "," } else { ", " }
    }

    fn newline(&self, out: &mut String, level: usize) {
        if let Some(n) = self.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    }
}

fn write_value(out: &mut String, value: &Value, style: &Style, level: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s, style.ensure_ascii),
        Value::Array(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return;
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_separator());
                }
                style.newline(out, level + 1);
                write_value(out, item, style, level + 1);
            }
            style.newline(out, level);
            out.push(']');
        }
        Value::Object(map) => {
            if map.is_empty() {
                out.push_str("{}");
                return;
            }
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(style.item_separator());
                }
                style.newline(out, level + 1);
                write_string(out, key, style.ensure_ascii);
                out.push_str(": ");
                write_value(out, item, style, level + 1);
            }
            style.newline(out, level);
            out.push('}');
        }
    }
}

/// Integers as they are; floats as Python's `repr` (`1.0`, `1e+100`).
fn write_number(out: &mut String, n: &serde_json::Number) {
    let text = n.to_string();
    match text.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with(['-', '+']) => {
            let _ = write!(out, "{mantissa}e+{exp}");
        }
        _ => out.push_str(&text),
    }
}

fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn matches_python_json_dumps() {
        let v = json!({"name": "get_weather", "args": {"city": "Zürich", "days": [1, 2.5]}, "ok": true, "none": null});
        // json.dumps(v, ensure_ascii=False)
        assert_eq!(
            python_json(&v, None, false, false),
            r#"{"name": "get_weather", "args": {"city": "Zürich", "days": [1, 2.5]}, "ok": true, "none": null}"#
        );
        // json.dumps(v) (ensure_ascii defaults to True in Python itself)
        assert!(python_json(&v, None, true, false).contains(r#""Z\u00fcrich""#));
        // json.dumps({"b": [], "a": {}}, indent=2, sort_keys=True)
        assert_eq!(python_json(&json!({"b": [], "a": {}}), Some(2), false, true), "{\n  \"a\": {},\n  \"b\": []\n}");
        assert_eq!(python_json(&json!([1, [2]]), Some(1), false, false), "[\n 1,\n [\n  2\n ]\n]");
        assert_eq!(python_json(&json!("tab\there \"q\" \u{1}"), None, false, false), r#""tab\there \"q\" \u0001""#);
        assert_eq!(python_json(&json!("😀"), None, true, false), r#""\ud83d\ude00""#);
        assert_eq!(python_json(&json!(1e100), None, false, false), "1e+100");
    }
}
