//! JSON Schema to a GBNF grammar, for output constrained to a JSON shape
//! (`--json-schema`). A subset, converted exactly, with an error naming
//! anything outside it:
//!
//! - `type`: `object`, `array`, `string`, `number`, `integer`, `boolean`,
//!   `null`, or a list of them;
//! - `properties` with `required`: the required properties are written in
//!   the order `properties` gives them; optional ones are left out (the
//!   output still satisfies the schema);
//! - `items` (one schema), `minItems` 0 or 1;
//! - `minLength` and `maxLength` of strings (in characters);
//! - `enum` and `const` of any JSON values;
//! - `{}` or `true`: any JSON value;
//! - annotations (`title`, `description`, `$schema`, `$id`, `default`,
//!   `examples`) and `additionalProperties: false` are accepted and change
//!   nothing.
//!
//! The JSON written has no whitespace but one optional space after `:` and
//! `,`, so a model cannot pad its answer forever.

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Keywords that describe a schema without constraining it.
const ANNOTATIONS: [&str; 6] = ["title", "description", "$schema", "$id", "default", "examples"];

/// The rules every converted grammar shares.
const COMMON_RULES: &str = r#"ws ::= " "?
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
integer ::= "-"? ("0" | [1-9] [0-9]*)
number ::= integer ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}"
array ::= "[" ws (value ("," ws value)*)? "]"
"#;

/// Converts `schema` (JSON text) to a GBNF grammar whose `root` is it.
pub fn to_grammar(schema: &str) -> Result<String, String> {
    let value: Value = serde_json::from_str(schema).map_err(|e| format!("the JSON schema is not JSON: {e}"))?;
    let mut rules = GrammarRules::default();
    let root = rule_for(&value, "root", &mut rules.rules)?;
    Ok(rules.finish(&root))
}

/// The rules of a grammar built from parts (the tool-call grammars): schemas
/// become named rules, and the JSON rules they share are written once.
#[derive(Debug, Default)]
pub struct GrammarRules {
    rules: Vec<(String, String)>,
}

impl GrammarRules {
    /// Adds the rule `name ::= body`.
    pub fn push(&mut self, name: &str, body: String) {
        self.rules.push((name.to_string(), body));
    }

    /// Adds the rule `name` for the JSON values `schema` allows; returns
    /// `name`. Errors name the path of what is not supported.
    pub fn schema(&mut self, name: &str, schema: &Value) -> Result<String, String> {
        let body = rule_for(schema, name, &mut self.rules)?;
        self.push(name, body);
        Ok(name.to_string())
    }

    /// The grammar: `root ::= root_body`, then every rule added.
    pub fn finish(self, root_body: &str) -> String {
        let mut out = format!("root ::= {root_body}\n");
        for (name, body) in self.rules {
            let _ = writeln!(out, "{name} ::= {body}");
        }
        out.push_str(COMMON_RULES);
        out
    }
}

/// A GBNF literal matching `text` exactly.
pub fn text_literal(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The GBNF expression for `schema` at `path` (used for rule names and
/// errors); named sub-rules go to `rules`.
fn rule_for(schema: &Value, path: &str, rules: &mut Vec<(String, String)>) -> Result<String, String> {
    let object = match schema {
        Value::Bool(true) => return Ok("value".into()),
        Value::Object(o) => o,
        other => return Err(format!("{path}: a schema is an object or true, not {other}")),
    };
    for key in object.keys() {
        let known = ANNOTATIONS.contains(&key.as_str())
            || [
                "type",
                "properties",
                "required",
                "items",
                "minItems",
                "enum",
                "const",
                "additionalProperties",
                "minLength",
                "maxLength",
            ]
            .contains(&key.as_str());
        if !known {
            return Err(format!("{path}: `{key}` is not supported (see docs/chat.md, \"Constrained output\")"));
        }
    }
    if let Some(value) = object.get("const") {
        return Ok(literal(value));
    }
    if let Some(values) = object.get("enum") {
        let values = values.as_array().filter(|v| !v.is_empty());
        let values = values.ok_or_else(|| format!("{path}: `enum` is a list of at least one value"))?;
        return Ok(format!("({})", values.iter().map(literal).collect::<Vec<_>>().join(" | ")));
    }
    match object.get("additionalProperties") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => return Err(format!("{path}: only `additionalProperties: false` is supported")),
    }
    let types: Vec<&str> = match object.get("type") {
        None => return Ok("value".into()),
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|t| t.as_str().ok_or_else(|| format!("{path}: bad `type` {t}")))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{path}: bad `type` {other}")),
    };
    let mut alternatives = Vec::new();
    for t in types {
        alternatives.push(match t {
            "string" => match length_bounds(object, path)? {
                Some(bounds) => format!("\"\\\"\" char{bounds} \"\\\"\""),
                None => "string".into(),
            },
            "number" | "integer" | "boolean" | "null" => t.to_string(),
            "object" => object_rule(object, path, rules)?,
            "array" => array_rule(object, path, rules)?,
            other => return Err(format!("{path}: unknown type `{other}`")),
        });
    }
    Ok(if alternatives.len() == 1 { alternatives.remove(0) } else { format!("({})", alternatives.join(" | ")) })
}

/// A string's `minLength`/`maxLength` as a GBNF repetition (`{2,40}`);
/// `None` when it has neither.
pub fn length_bounds(object: &Map<String, Value>, path: &str) -> Result<Option<String>, String> {
    let bound = |key: &str| match object.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("{path}: `{key}` is a whole number, not {v}")),
    };
    match (bound("minLength")?, bound("maxLength")?) {
        (None, None) => Ok(None),
        (min, Some(max)) if min.unwrap_or(0) > max => Err(format!("{path}: `minLength` is above `maxLength`")),
        (min, max) => Ok(Some(format!("{{{},{}}}", min.unwrap_or(0), max.map_or(String::new(), |m| m.to_string())))),
    }
}

/// An object with its required properties in order (or any object when
/// the schema lists none).
fn object_rule(object: &Map<String, Value>, path: &str, rules: &mut Vec<(String, String)>) -> Result<String, String> {
    let Some(properties) = object.get("properties") else { return Ok("object".into()) };
    let properties = properties.as_object().ok_or_else(|| format!("{path}: `properties` is not an object"))?;
    let required: Vec<&str> = match object.get("required") {
        None => Vec::new(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|r| r.as_str().ok_or_else(|| format!("{path}: bad `required` entry {r}")))
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(format!("{path}: `required` is a list, not {other}")),
    };
    if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
        return Err(format!("{path}: `{missing}` is required but not in `properties`"));
    }
    let mut members = Vec::new();
    for (name, schema) in properties.iter().filter(|(name, _)| required.contains(&name.as_str())) {
        let rule = format!("{path}-{}", rule_name(name));
        let body = rule_for(schema, &rule, rules)?;
        rules.push((rule.clone(), body));
        members.push(format!("{} \":\" ws {rule}", literal(&Value::String(name.clone()))));
    }
    Ok(format!("\"{{\" ws {} \"}}\"", members.join(" \",\" ws ")).replace("ws  \"}\"", "ws \"}\""))
}

/// An array of one item schema; `minItems: 1` asks for at least one.
fn array_rule(object: &Map<String, Value>, path: &str, rules: &mut Vec<(String, String)>) -> Result<String, String> {
    let item = match object.get("items") {
        None => "value".to_string(),
        Some(schema) => {
            let rule = format!("{path}-item");
            let body = rule_for(schema, &rule, rules)?;
            rules.push((rule.clone(), body));
            rule
        }
    };
    let list = format!("{item} (\",\" ws {item})*");
    match object.get("minItems").map(Value::as_u64) {
        None | Some(Some(0)) => Ok(format!("\"[\" ws ({list})? \"]\"")),
        Some(Some(1)) => Ok(format!("\"[\" ws {list} \"]\"")),
        Some(_) => Err(format!("{path}: only `minItems` 0 or 1 is supported")),
    }
}

/// A rule name made of a property name: letters, digits and dashes.
pub fn rule_name(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    if cleaned.is_empty() { "p".into() } else { cleaned }
}

/// A GBNF string literal for the compact JSON text of `value` (which
/// escapes every control character itself, so only quotes and backslashes
/// need escaping again).
fn literal(value: &Value) -> String {
    format!("\"{}\"", value.to_string().replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_enums_arrays_and_literals() {
        let g = to_grammar(
            r#"{"type":"object","properties":{"ok":{"type":"boolean"},"note":{"type":"string"},
                "level":{"enum":["low","high"]},"tags":{"type":"array","items":{"const":"a\"b"},"minItems":1}},
                "required":["ok","level","tags"]}"#,
        )
        .unwrap();
        assert!(g.starts_with(
            "root ::= \"{\" ws \"\\\"ok\\\"\" \":\" ws root-ok \",\" ws \"\\\"level\\\"\" \":\" ws root-level \",\" ws \"\\\"tags\\\"\" \":\" ws root-tags \"}\"\n"
        ), "{g}");
        assert!(g.contains("root-ok ::= boolean\n"), "{g}");
        assert!(g.contains("root-level ::= (\"\\\"low\\\"\" | \"\\\"high\\\"\")\n"), "{g}");
        assert!(g.contains("root-tags-item ::= \"\\\"a\\\\\\\"b\\\"\"\n"), "{g}");
        assert!(g.contains("root-tags ::= \"[\" ws root-tags-item (\",\" ws root-tags-item)* \"]\"\n"), "{g}");
        assert!(!g.contains("note"), "optional properties are left out: {g}");
        assert_eq!(to_grammar("true").unwrap().lines().next(), Some("root ::= value"));
        assert!(to_grammar(r#"{"type":["integer","null"]}"#).unwrap().starts_with("root ::= (integer | null)\n"));
        let g = to_grammar(r#"{"type":"string","maxLength":40}"#).unwrap();
        assert!(g.starts_with("root ::= \"\\\"\" char{0,40} \"\\\"\"\n"), "{g}");
        assert!(to_grammar(r#"{"type":"string","minLength":2}"#).unwrap().contains("char{2,}"));
    }

    #[test]
    fn text_literals_escape_what_gbnf_reads() {
        assert_eq!(text_literal("<a=\"b\">\n\\"), r#""<a=\"b\">\n\\""#);
        assert_eq!(text_literal("｜x\u{1}"), "\"｜x\\x01\"");
    }

    #[test]
    fn the_unsupported_is_named() {
        let e = to_grammar(r#"{"type":"object","properties":{"a":{"type":"string","pattern":"x+"}},"required":["a"]}"#);
        assert!(e.unwrap_err().contains("root-a: `pattern` is not supported"));
        assert!(to_grammar(r##"{"$ref":"#/x"}"##).unwrap_err().contains("`$ref` is not supported"));
        assert!(
            to_grammar(r#"{"required":["b"],"properties":{},"type":"object"}"#)
                .unwrap_err()
                .contains("`b` is required")
        );
        assert!(to_grammar("{nope").unwrap_err().contains("not JSON"));
        assert!(to_grammar(r#"{"type":"array","minItems":3}"#).unwrap_err().contains("minItems"));
        let e = to_grammar(r#"{"type":"string","minLength":5,"maxLength":2}"#).unwrap_err();
        assert!(e.contains("above `maxLength`"), "{e}");
    }
}
