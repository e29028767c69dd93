//! JSON Schema to a GBNF grammar, for the arguments of forced tool calls
//! (`--tool-choice required`), spliced into each template's call markup.
//! (`--json-schema` output is matched by llguidance instead:
//! [`crate::llama::Constraint`].) A subset, converted exactly, with an error
//! naming anything outside it:
//!
//! - `type`: `object`, `array`, `string`, `number`, `integer`, `boolean`,
//!   `null`, or a list of them;
//! - `properties` with `required`: the required properties are written in
//!   the order `properties` gives them; optional ones are left out (the
//!   output still satisfies the schema);
//! - `additionalProperties`: `false` (or absent) adds nothing; `true` or a
//!   schema lets any number of extra `"key": value` pairs follow the
//!   required properties, their values matching the schema and their keys
//!   short names (1 to 32 of `a-z A-Z 0-9 _ -`), so that each pair ends;
//!   `maxProperties` bounds how many there are in all;
//! - `items` (one schema), `prefixItems` (the first items, each its own
//!   schema, all written; further items only when `items` is a schema),
//!   `minItems` and `maxItems`;
//! - `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` of
//!   integers, as an exact digit grammar ([`int_range`]), and of numbers
//!   when the bounds are whole (written without an exponent then);
//! - `minLength` and `maxLength` of strings (in characters), `pattern` (a
//!   plain regex subset, see [`regex`]), `format` `date`, `time`,
//!   `date-time` and `uuid`;
//! - `enum` and `const` of any JSON values;
//! - `anyOf` and `oneOf` (any of the schemas: the grammar does not check
//!   that only one matches);
//! - `$ref` to `#/$defs/...` or `#/definitions/...` (or any other pointer
//!   into the same document), recursion included;
//! - `{}` or `true`: any JSON value;
//! - annotations (`title`, `description`, `$schema`, `$id`, `$comment`,
//!   `default`, `examples`) change nothing.
//!
//! The JSON written has no whitespace but one optional space after `{`, `[`,
//! `:` and `,`, so a model cannot pad its answer forever.

mod int_range;
mod regex;

use std::fmt::Write as _;

use serde_json::{Map, Value};

/// Keywords that describe a schema without constraining it (`$defs` and
/// `definitions` are read through `$ref`).
const ANNOTATIONS: [&str; 9] =
    ["title", "description", "$schema", "$id", "$comment", "default", "examples", "$defs", "definitions"];

/// Keywords that constrain, all handled below.
const KEYWORDS: [&str; 22] = [
    "type",
    "properties",
    "required",
    "additionalProperties",
    "maxProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "$ref",
    "anyOf",
    "oneOf",
];

/// The integer bounds.
const BOUNDS: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// The rules every converted grammar shares.
const COMMON_RULES: &str = r#"ws ::= " "?
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
integer ::= "-"? ("0" | [1-9] [0-9]{0,15})
number ::= integer ("." [0-9]{1,16})? ([eE] [-+]? ("0" | [1-9] [0-9]{0,15}))?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}"
array ::= "[" ws (value ("," ws value)*)? "]"
"#;

/// The key of a pair `additionalProperties` allows: a short name.
const EXTRA_KEY: &str = r#""\"" [a-zA-Z0-9_-]{1,32} "\"""#;

/// The `format`s of strings, each a rule (without the quotes).
const FORMATS: [(&str, &str); 4] = [
    ("date", r#"[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])"#),
    (
        "time",
        r#"([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{3})? ("Z" | ("+" | "-") ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])"#,
    ),
    ("date-time", r#"format-date "T" format-time"#),
    ("uuid", r#"[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}"#),
];

/// Converts `schema` (JSON text) to a GBNF grammar whose `root` is it.
pub fn to_grammar(schema: &str) -> Result<String, String> {
    let value: Value = serde_json::from_str(schema).map_err(|e| format!("the JSON schema is not JSON: {e}"))?;
    let mut rules = GrammarRules::default();
    let root = Converter { root: &value, top: "root", rules: &mut rules.rules }.rule_for(&value, "root")?;
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

    /// Adds the rule `name` for the JSON values `schema` allows (its `$ref`s
    /// point into `schema` itself); returns `name`. Errors name the path of
    /// what is not supported.
    pub fn schema(&mut self, name: &str, schema: &Value) -> Result<String, String> {
        let body = Converter { root: schema, top: name, rules: &mut self.rules }.rule_for(schema, name)?;
        self.push(name, body);
        Ok(name.to_string())
    }

    /// Like [`GrammarRules::schema`], for a `schema` inside the document
    /// `root` (a tool's parameter inside its parameters): `$ref`s point into
    /// `root`.
    pub fn schema_within(&mut self, name: &str, schema: &Value, root: &Value) -> Result<String, String> {
        let body = Converter { root, top: name, rules: &mut self.rules }.rule_for(schema, name)?;
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

/// A string's `minLength`/`maxLength` as a GBNF repetition (`{2,40}`);
/// `None` when it has neither.
pub fn length_bounds(object: &Map<String, Value>, path: &str) -> Result<Option<String>, String> {
    match (count(object, "minLength", path)?, count(object, "maxLength", path)?) {
        (None, None) => Ok(None),
        (min, Some(max)) if min.unwrap_or(0) > max => Err(format!("{path}: `minLength` is above `maxLength`")),
        (min, max) => Ok(Some(format!("{{{},{}}}", min.unwrap_or(0), max.map_or(String::new(), |m| m.to_string())))),
    }
}

/// A rule name made of a property name: letters, digits and dashes.
pub fn rule_name(name: &str) -> String {
    let cleaned: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    if cleaned.is_empty() { "p".into() } else { cleaned }
}

/// The whole number under `key`, if there.
fn count(object: &Map<String, Value>, key: &str, path: &str) -> Result<Option<u64>, String> {
    match object.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| format!("{path}: `{key}` is a whole number, not {v}")),
    }
}

/// A GBNF string literal for the compact JSON text of `value` (which
/// escapes every control character itself, so only quotes and backslashes
/// need escaping again).
fn literal(value: &Value) -> String {
    format!("\"{}\"", value.to_string().replace('\\', "\\\\").replace('"', "\\\""))
}

/// One schema document being converted: `$ref`s resolve in `root`, and the
/// rules they become are named after `top`.
struct Converter<'a> {
    root: &'a Value,
    top: &'a str,
    rules: &'a mut Vec<(String, String)>,
}

impl Converter<'_> {
    /// Adds the rule `name` for `schema` at `path`; returns `name`.
    fn named(&mut self, name: String, schema: &Value) -> Result<String, String> {
        let body = self.rule_for(schema, &name)?;
        self.rules.push((name.clone(), body));
        Ok(name)
    }

    /// Adds `name ::= body` unless a rule of that name is there already.
    fn shared(&mut self, name: &str, body: &str) -> String {
        if !self.rules.iter().any(|(n, _)| n == name) {
            self.rules.push((name.to_string(), body.to_string()));
        }
        name.to_string()
    }

    /// The GBNF expression for `schema` at `path` (used for rule names and
    /// errors); named sub-rules go to `self.rules`.
    fn rule_for(&mut self, schema: &Value, path: &str) -> Result<String, String> {
        let object = match schema {
            Value::Bool(true) => return Ok("value".into()),
            Value::Object(o) => o,
            other => return Err(format!("{path}: a schema is an object or true, not {other}")),
        };
        if let Some(key) = object.keys().find(|k| !ANNOTATIONS.contains(&k.as_str()) && !KEYWORDS.contains(&k.as_str()))
        {
            return Err(format!("{path}: `{key}` is not supported (see docs/chat.md, \"Constrained output\")"));
        }
        if let Some(value) = object.get("const") {
            return Ok(literal(value));
        }
        if let Some(values) = object.get("enum") {
            let values = values.as_array().filter(|v| !v.is_empty());
            let values = values.ok_or_else(|| format!("{path}: `enum` is a list of at least one value"))?;
            return Ok(format!("({})", values.iter().map(literal).collect::<Vec<_>>().join(" | ")));
        }
        for key in ["$ref", "anyOf", "oneOf"] {
            if object.contains_key(key)
                && let Some(other) = object.keys().find(|k| *k != key && KEYWORDS.contains(&k.as_str()))
            {
                return Err(format!("{path}: `{other}` beside `{key}` is not supported"));
            }
        }
        if let Some(reference) = object.get("$ref") {
            return self.reference(reference, path);
        }
        if let Some(list) = object.get("anyOf").or_else(|| object.get("oneOf")) {
            let list = list.as_array().filter(|l| !l.is_empty());
            let list = list.ok_or_else(|| format!("{path}: `anyOf`/`oneOf` is a list of at least one schema"))?;
            let mut alternatives = Vec::new();
            for (i, schema) in list.iter().enumerate() {
                alternatives.push(self.named(format!("{path}-{i}"), schema)?);
            }
            return Ok(format!("({})", alternatives.join(" | ")));
        }
        let types: Vec<&str> = match object.get("type") {
            None => vec![implied_type(object)],
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
                "any" => "value".into(),
                "string" => self.string_rule(object, path)?,
                "integer" => integer_rule(object, path)?,
                "number" => number_rule(object, path)?,
                "boolean" | "null" => t.to_string(),
                "object" => self.object_rule(object, path)?,
                "array" => self.array_rule(object, path)?,
                other => return Err(format!("{path}: unknown type `{other}`")),
            });
        }
        Ok(if alternatives.len() == 1 { alternatives.remove(0) } else { format!("({})", alternatives.join(" | ")) })
    }

    /// A `$ref` into this document: a rule named after the pointer, added
    /// once (so recursive schemas refer to themselves).
    fn reference(&mut self, reference: &Value, path: &str) -> Result<String, String> {
        let pointer = reference.as_str().and_then(|r| r.strip_prefix('#'));
        let pointer =
            pointer.ok_or_else(|| format!("{path}: only `$ref`s into this schema (\"#/$defs/...\") are supported"))?;
        let target =
            self.root.pointer(pointer).ok_or_else(|| format!("{path}: `$ref` #{pointer} points at nothing"))?;
        if pointer.is_empty() && path == self.top {
            return Err(format!("{path}: `$ref` \"#\" refers to itself"));
        }
        let name = match pointer {
            "" => self.top.to_string(),
            p => format!("{}-ref{}", self.top, rule_name(p)),
        };
        if name == self.top || self.rules.iter().any(|(n, _)| *n == name) {
            return Ok(name);
        }
        // Reserved before its body is written, for schemas that recurse.
        let at = self.rules.len();
        self.rules.push((name.clone(), String::new()));
        let body = self.rule_for(target, &name)?;
        self.rules[at].1 = body;
        Ok(name)
    }

    /// A string: of a `format`, a `pattern`, or a length.
    fn string_rule(&mut self, object: &Map<String, Value>, path: &str) -> Result<String, String> {
        let lengths = object.contains_key("minLength") || object.contains_key("maxLength");
        if let Some(format) = object.get("format") {
            if lengths || object.contains_key("pattern") {
                return Err(format!("{path}: `format` with a length or `pattern` is not supported"));
            }
            let format = format.as_str().unwrap_or_default();
            if format == "date-time" {
                self.shared("format-date", FORMATS[0].1);
                self.shared("format-time", FORMATS[1].1);
            }
            let (name, body) = FORMATS.iter().find(|(name, _)| *name == format).ok_or_else(|| {
                format!("{path}: `format` {format:?} is not supported (date, time, date-time, uuid are)")
            })?;
            let rule = self.shared(&format!("format-{name}"), body);
            return Ok(format!("\"\\\"\" {rule} \"\\\"\""));
        }
        if let Some(pattern) = object.get("pattern") {
            if lengths {
                return Err(format!("{path}: `pattern` with `minLength`/`maxLength` is not supported"));
            }
            let pattern = pattern.as_str().ok_or_else(|| format!("{path}: `pattern` is a string"))?;
            let body = regex::to_gbnf(pattern).map_err(|e| format!("{path}: `pattern` {pattern:?}: {e}"))?;
            let rule = format!("{path}-pattern");
            self.rules.push((rule.clone(), body));
            return Ok(format!("\"\\\"\" {rule} \"\\\"\""));
        }
        Ok(match length_bounds(object, path)? {
            Some(bounds) => format!("\"\\\"\" char{bounds} \"\\\"\""),
            None => "string".into(),
        })
    }

    /// An object with its required properties in order, then the extra
    /// pairs `additionalProperties` allows, at most `maxProperties` in all
    /// (or any object when the schema says nothing of its properties).
    fn object_rule(&mut self, object: &Map<String, Value>, path: &str) -> Result<String, String> {
        let extra = match object.get("additionalProperties") {
            None | Some(Value::Bool(false)) => None,
            Some(Value::Bool(true)) => Some("value".to_string()),
            Some(schema) => Some(self.named(format!("{path}-extra"), schema)?),
        };
        let empty = Map::new();
        let properties = match object.get("properties") {
            None if extra.is_none() && !object.contains_key("additionalProperties") => return Ok("object".into()),
            None => &empty,
            Some(p) => p.as_object().ok_or_else(|| format!("{path}: `properties` is not an object"))?,
        };
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
            let rule = self.named(format!("{path}-{}", rule_name(name)), schema)?;
            members.push(format!("{} \":\" ws {rule}", literal(&Value::String(name.clone()))));
        }
        let most = count(object, "maxProperties", path)?;
        if most.is_some_and(|most| most < members.len() as u64) {
            return Err(format!("{path}: `maxProperties` is below the number required"));
        }
        let mut body = members.join(" \",\" ws ");
        let more = most.map(|most| most - members.len() as u64);
        if let Some(value) = extra.filter(|_| more != Some(0)) {
            // Extra keys are short names, so each pair ends.
            let pair = format!("{} \":\" ws {value}", self.shared("extra-key", EXTRA_KEY));
            let times = |n: Option<u64>| n.map_or("*".into(), |n| format!("{{0,{n}}}"));
            body = match more {
                _ if !members.is_empty() => format!("{body} (\",\" ws {pair}){}", times(more)),
                Some(1) => format!("({pair})?"),
                more => format!("({pair} (\",\" ws {pair}){})?", times(more.map(|n| n - 1))),
            };
        }
        Ok(if body.is_empty() { "\"{\" ws \"}\"".into() } else { format!("\"{{\" ws {body} \"}}\"") })
    }

    /// An array: the `prefixItems` in order, then items of `items`, as many
    /// as `minItems`/`maxItems` allow.
    fn array_rule(&mut self, object: &Map<String, Value>, path: &str) -> Result<String, String> {
        let (min, max) = (count(object, "minItems", path)?.unwrap_or(0), count(object, "maxItems", path)?);
        if max.is_some_and(|max| min > max) {
            return Err(format!("{path}: `minItems` is above `maxItems`"));
        }
        let mut prefix = Vec::new();
        if let Some(list) = object.get("prefixItems") {
            let list = list.as_array().ok_or_else(|| format!("{path}: `prefixItems` is a list of schemas"))?;
            for (i, schema) in list.iter().enumerate() {
                prefix.push(self.named(format!("{path}-{i}"), schema)?);
            }
        }
        let item = match object.get("items") {
            Some(Value::Bool(false)) => None,
            None if !prefix.is_empty() => None,
            None => Some("value".to_string()),
            Some(schema) => Some(self.named(format!("{path}-item"), schema)?),
        };
        let fixed = prefix.len() as u64;
        if max.is_some_and(|max| max < fixed) {
            return Err(format!("{path}: `maxItems` below the number of `prefixItems` is not supported"));
        }
        let (more_min, more_max) = (min.saturating_sub(fixed), max.map(|max| max - fixed));
        let Some(item) = item.filter(|_| more_max != Some(0)) else {
            if more_min > 0 {
                return Err(format!("{path}: `minItems` asks for more items than `prefixItems` gives"));
            }
            return Ok(if prefix.is_empty() {
                "\"[\" ws \"]\"".into()
            } else {
                format!("\"[\" ws {} \"]\"", prefix.join(" \",\" ws "))
            });
        };
        // `min` to `max` more items, each after a comma.
        let next = |min: u64, max: Option<u64>| {
            let one = format!("(\",\" ws {item})");
            match (min, max) {
                (_, Some(0)) => String::new(),
                (0, None) => format!(" {one}*"),
                (1, None) => format!(" {one}+"),
                (min, None) => format!(" {one}{{{min},}}"),
                (min, Some(max)) if min == max => format!(" {one}{{{min}}}"),
                (min, Some(max)) => format!(" {one}{{{min},{max}}}"),
            }
        };
        let body = if prefix.is_empty() {
            // The first item has no comma before it.
            let rest = next(more_min.saturating_sub(1), more_max.map(|m| m - 1));
            if more_min == 0 { format!("({item}{rest})?") } else { format!("{item}{rest}") }
        } else {
            format!("{}{}", prefix.join(" \",\" ws "), next(more_min, more_max))
        };
        Ok(format!("\"[\" ws {body} \"]\""))
    }
}

/// The type a schema without `type` describes by its keywords.
fn implied_type(object: &Map<String, Value>) -> &'static str {
    let has = |keys: &[&str]| keys.iter().any(|k| object.contains_key(*k));
    if has(&["properties", "additionalProperties", "required", "maxProperties"]) {
        "object"
    } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
        "array"
    } else if has(&["pattern", "format", "minLength", "maxLength"]) {
        "string"
    } else if has(&BOUNDS) {
        "integer"
    } else {
        "any"
    }
}

/// An integer within its bounds (`exclusiveMinimum: 3` is `minimum: 4`;
/// a fractional bound rounds inward).
fn integer_rule(object: &Map<String, Value>, path: &str) -> Result<String, String> {
    let bound = |key: &str, round: fn(f64) -> f64, shift: i128| -> Result<Option<i128>, String> {
        let Some(v) = object.get(key) else { return Ok(None) };
        let whole = if let Some(n) = v.as_i64() {
            i128::from(n)
        } else if let Some(n) = v.as_u64() {
            i128::from(n)
        } else {
            let x = v.as_f64().ok_or_else(|| format!("{path}: `{key}` is a number, not {v}"))?;
            let r = round(x);
            if r.abs() > 1e30 {
                return Err(format!("{path}: `{key}` {v} is too large"));
            }
            // An exclusive bound that is already fractional needs no shift.
            return Ok(Some(r as i128 + if r == x { shift } else { 0 }));
        };
        Ok(Some(whole + shift))
    };
    let lower = [bound("minimum", f64::ceil, 0)?, bound("exclusiveMinimum", f64::ceil, 1)?];
    let upper = [bound("maximum", f64::floor, 0)?, bound("exclusiveMaximum", f64::floor, -1)?];
    let (min, max) = (lower.into_iter().flatten().max(), upper.into_iter().flatten().min());
    if min.is_none() && max.is_none() {
        return Ok("integer".into());
    }
    let alternatives =
        int_range::alternatives(min, max).ok_or_else(|| format!("{path}: no integer is within the bounds"))?;
    Ok(int_range::gbnf(&alternatives))
}

/// A fraction of up to 16 digits.
const FRACTION: &str = r#""." [0-9]{1,16}"#;
/// A fraction of zeros only (the bound itself, written with decimals).
const ZERO_FRACTION: &str = r#""." "0"{1,16}"#;
/// A fraction with a digit that is not zero (just above a whole number).
const NONZERO_FRACTION: &str = r#""." "0"{0,15} [1-9] [0-9]{0,15}"#;

/// One end of a range of numbers: the value and whether it is allowed.
#[derive(Debug, Clone, Copy)]
struct End {
    at: i128,
    allowed: bool,
}

/// A number within its bounds (`minimum`, `maximum` and their exclusive
/// forms), as exact decimal text without an exponent. Bounds must be whole
/// numbers (the usual 0, 1, 100); a fractional one is an error naming it.
fn number_rule(object: &Map<String, Value>, path: &str) -> Result<String, String> {
    let bound = |key: &str| -> Result<Option<i128>, String> {
        let Some(v) = object.get(key) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| format!("{path}: `{key}` is a number, not {v}"))?;
        if x.fract() != 0.0 || x.abs() > 1e15 {
            return Err(format!(
                "{path}: `{key}` {v}: bounds of a number must be whole numbers of at most 15 digits here"
            ));
        }
        Ok(Some(x as i128))
    };
    // The tighter of each pair; at equal values the exclusive one wins.
    let tighter = |inclusive: Option<i128>, exclusive: Option<i128>, lower: bool| -> Option<End> {
        let ends = [inclusive.map(|at| End { at, allowed: true }), exclusive.map(|at| End { at, allowed: false })];
        ends.into_iter().flatten().reduce(|a, b| {
            let a_tighter = if lower { a.at > b.at } else { a.at < b.at };
            if a.at == b.at {
                End { at: a.at, allowed: a.allowed && b.allowed }
            } else if a_tighter {
                a
            } else {
                b
            }
        })
    };
    let low = tighter(bound("minimum")?, bound("exclusiveMinimum")?, true);
    let high = tighter(bound("maximum")?, bound("exclusiveMaximum")?, false);
    if low.is_none() && high.is_none() {
        return Ok("number".into());
    }
    let mut alternatives = Vec::new();
    // Zero and above: magnitudes from max(low, 0) to high.
    if high.is_none_or(|h| h.at >= 0) {
        let from = match low {
            Some(l) if l.at >= 0 => l,
            _ => End { at: 0, allowed: true },
        };
        alternatives.extend(magnitudes(from, high));
    }
    // Below zero: "-" and magnitudes from max(-high, 0) to -low.
    if low.is_none_or(|l| l.at < 0) {
        let from = match high {
            Some(h) if h.at <= 0 => End { at: -h.at, allowed: h.allowed },
            _ => End { at: 0, allowed: false },
        };
        let to = low.map(|l| End { at: -l.at, allowed: l.allowed });
        alternatives.extend(magnitudes(from, to).into_iter().map(|m| format!("\"-\" {m}")));
    }
    if alternatives.is_empty() {
        return Err(format!("{path}: no number is within the bounds"));
    }
    Ok(format!("({})", alternatives.join(" | ")))
}

/// The texts of the non-negative numbers from `low` to `high` (`None`: no
/// upper end), whole numbers at both ends (`low.at >= 0`).
fn magnitudes(low: End, high: Option<End>) -> Vec<String> {
    let whole = |lo: i128, hi: Option<i128>| {
        int_range::alternatives(Some(lo), hi).map(|a| int_range::gbnf(&a)).filter(|_| hi.is_none_or(|h| lo <= h))
    };
    let mut out = Vec::new();
    if let Some(h) = high
        && h.at <= low.at
    {
        // One point at most: the bound itself, when both ends allow it.
        if h.at == low.at && h.allowed && low.allowed {
            out.push(format!("\"{}\" ({ZERO_FRACTION})?", low.at));
        }
        return out;
    }
    // The whole part at the low end: any fraction, or only one above zero.
    out.push(match low.allowed {
        true => format!("\"{}\" ({FRACTION})?", low.at),
        false => format!("\"{}\" {NONZERO_FRACTION}", low.at),
    });
    // Whole parts strictly between the ends: any fraction.
    if let Some(between) = whole(low.at + 1, high.map(|h| h.at - 1)) {
        out.push(format!("{between} ({FRACTION})?"));
    }
    // The high end itself, with zeros after the point at most.
    if let Some(h) = high.filter(|h| h.allowed) {
        out.push(format!("\"{}\" ({ZERO_FRACTION})?", h.at));
    }
    out
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

    fn root(schema: &str) -> String {
        let g = to_grammar(schema).unwrap_or_else(|e| panic!("{schema}: {e}"));
        g.lines().next().unwrap().strip_prefix("root ::= ").unwrap().to_string()
    }

    #[test]
    fn integer_bounds() {
        assert_eq!(root(r#"{"type":"integer","minimum":1,"maximum":7}"#), "([1-7])");
        assert_eq!(root(r#"{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":8}"#), "([1-7])");
        assert_eq!(root(r#"{"type":"integer","minimum":0.5,"maximum":7.9}"#), "([1-7])");
        assert_eq!(root(r#"{"type":"integer","exclusiveMinimum":0.5,"exclusiveMaximum":7.5}"#), "([1-7])");
        assert_eq!(root(r#"{"type":"integer","minimum":-3,"maximum":-1}"#), "(\"-\" [1-3])");
        assert_eq!(root(r#"{"type":"integer","minimum":2,"exclusiveMinimum":4,"maximum":5}"#), "(\"5\")");
        assert_eq!(root(r#"{"maximum":-10}"#), "(\"-\" [1-9] [0-9] | \"-\" [1-9] [0-9]{2} [0-9]{0,13})");
        let e = to_grammar(r#"{"type":"integer","minimum":3,"exclusiveMaximum":3}"#).unwrap_err();
        assert!(e.contains("no integer"), "{e}");
    }

    /// The optional space stands only after `{`, `[`, `:` and `,`, as
    /// docs/chat.md says.
    #[test]
    fn whitespace_only_after_openers_and_separators() {
        let g = to_grammar(
            r#"{"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}},"b":true},
                "required":["a","b"],"additionalProperties":{"type":"string"}}"#,
        )
        .unwrap();
        let mut uses = 0;
        for (at, _) in g.match_indices(" ws") {
            let before = g[..at].trim_end();
            assert!([r#""{""#, r#""[""#, r#"":""#, r#"",""#].iter().any(|t| before.ends_with(t)), "{}", &g[..at + 3]);
            uses += 1;
        }
        assert!(uses > 4, "{g}");
    }

    /// A number's bounds as alternatives: the low end, the whole parts in
    /// between, the high end (tests/schemas.rs runs them through llama.cpp's
    /// grammar sampler).
    #[test]
    fn number_bounds() {
        assert_eq!(
            root(r#"{"type":"number","minimum":0,"maximum":1}"#),
            r#"("0" ("." [0-9]{1,16})? | "1" ("." "0"{1,16})?)"#
        );
        assert_eq!(
            root(r#"{"type":"number","exclusiveMinimum":0,"maximum":3}"#),
            r#"("0" "." "0"{0,15} [1-9] [0-9]{0,15} | ([1-2]) ("." [0-9]{1,16})? | "3" ("." "0"{1,16})?)"#
        );
        // Both signs: -2 < x < 2.
        assert_eq!(
            root(r#"{"type":"number","exclusiveMinimum":-2,"exclusiveMaximum":2}"#),
            r#"("0" ("." [0-9]{1,16})? | ("1") ("." [0-9]{1,16})? | "-" "0" "." "0"{0,15} [1-9] [0-9]{0,15} | "-" ("1") ("." [0-9]{1,16})?)"#
        );
        // One end open: at least 10.
        assert!(root(r#"{"type":"number","minimum":10}"#).starts_with(r#"("10" ("." [0-9]{1,16})? | "#));
        assert_eq!(root(r#"{"type":"number","minimum":5,"maximum":5}"#), r#"("5" ("." "0"{1,16})?)"#);
        let e = to_grammar(r#"{"type":"number","minimum":5,"exclusiveMaximum":5}"#).unwrap_err();
        assert!(e.contains("no number"), "{e}");
        let e = to_grammar(r#"{"type":"number","maximum":0.5}"#).unwrap_err();
        assert!(e.contains("`maximum` 0.5") && e.contains("whole numbers"), "{e}");
        // A whole bound written with a point is whole.
        assert!(to_grammar(r#"{"type":"number","minimum":-3.0,"maximum":250}"#).is_ok());
    }

    #[test]
    fn array_counts_and_prefixes() {
        let item = r#""items":{"type":"boolean"}"#;
        let it = "root-item";
        let array = |extra: &str| root(&format!(r#"{{"type":"array",{item}{extra}}}"#));
        assert_eq!(array(""), format!("\"[\" ws ({it} (\",\" ws {it})*)? \"]\""));
        assert_eq!(array(r#","maxItems":0"#), "\"[\" ws \"]\"");
        assert_eq!(array(r#","maxItems":1"#), format!("\"[\" ws ({it})? \"]\""));
        assert_eq!(array(r#","maxItems":3"#), format!("\"[\" ws ({it} (\",\" ws {it}){{0,2}})? \"]\""));
        assert_eq!(array(r#","minItems":2"#), format!("\"[\" ws {it} (\",\" ws {it})+ \"]\""));
        assert_eq!(array(r#","minItems":3"#), format!("\"[\" ws {it} (\",\" ws {it}){{2,}} \"]\""));
        assert_eq!(array(r#","minItems":2,"maxItems":2"#), format!("\"[\" ws {it} (\",\" ws {it}){{1}} \"]\""));
        assert_eq!(array(r#","minItems":2,"maxItems":4"#), format!("\"[\" ws {it} (\",\" ws {it}){{1,3}} \"]\""));
        assert!(to_grammar(r#"{"type":"array","minItems":3,"maxItems":2}"#).unwrap_err().contains("above"));
        let tuple = r#"{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}]"#;
        assert_eq!(root(&format!("{tuple}}}")), "\"[\" ws root-0 \",\" ws root-1 \"]\"");
        assert_eq!(
            root(&format!(r#"{tuple},{item},"maxItems":3}}"#)),
            format!("\"[\" ws root-0 \",\" ws root-1 (\",\" ws {it}){{0,1}} \"]\"")
        );
        assert!(to_grammar(&format!(r#"{tuple},"maxItems":1}}"#)).unwrap_err().contains("below"));
        assert!(to_grammar(&format!(r#"{tuple},"minItems":3}}"#)).unwrap_err().contains("more items"));
    }

    #[test]
    fn references_alternatives_and_extra_properties() {
        let g = to_grammar(
            r##"{"$defs":{"Node":{"type":"object","properties":{"next":{"anyOf":[{"$ref":"#/$defs/Node"},{"type":"null"}]}},"required":["next"]}},
                "$ref":"#/$defs/Node"}"##,
        )
        .unwrap();
        assert!(g.starts_with("root ::= root-ref--defs-node\n"), "{g}");
        assert!(
            g.contains("root-ref--defs-node ::= \"{\" ws \"\\\"next\\\"\" \":\" ws root-ref--defs-node-next \"}\"\n")
        );
        assert!(g.contains("root-ref--defs-node-next ::= (root-ref--defs-node-next-0 | root-ref--defs-node-next-1)\n"));
        assert!(g.contains("root-ref--defs-node-next-0 ::= root-ref--defs-node\n"), "{g}");
        assert_eq!(root(r##"{"definitions":{"a":{"type":"null"}},"oneOf":[{"$ref":"#/definitions/a"}]}"##), "(root-0)");
        let g = to_grammar(r##"{"type":"array","maxItems":2,"items":{"$ref":"#"}}"##).unwrap();
        assert!(g.contains("root-item ::= root\n"), "{g}");
        assert!(to_grammar(r##"{"$ref":"#"}"##).unwrap_err().contains("refers to itself"));
        let e = to_grammar(r##"{"$ref":"#/$defs/x"}"##).unwrap_err();
        assert!(e.contains("points at nothing"), "{e}");
        let e = to_grammar(r##"{"$ref":"other.json#/x"}"##).unwrap_err();
        assert!(e.contains("only `$ref`s into this schema"), "{e}");
        let e = to_grammar(r#"{"anyOf":[true],"type":"string"}"#).unwrap_err();
        assert!(e.contains("`type` beside `anyOf`"), "{e}");
        let pair = "extra-key \":\" ws root-extra";
        assert_eq!(
            root(r#"{"type":"object","additionalProperties":{"type":"integer"}}"#),
            format!("\"{{\" ws ({pair} (\",\" ws {pair})*)? \"}}\"")
        );
        assert_eq!(
            root(r#"{"type":"object","properties":{"a":{"type":"null"}},"required":["a"],"additionalProperties":{}}"#),
            format!("\"{{\" ws \"\\\"a\\\"\" \":\" ws root-a (\",\" ws {pair})* \"}}\"")
        );
        assert_eq!(
            root(r#"{"additionalProperties":{},"maxProperties":3}"#),
            format!("\"{{\" ws ({pair} (\",\" ws {pair}){{0,2}})? \"}}\"")
        );
        let e = to_grammar(r#"{"properties":{"a":{}},"required":["a"],"maxProperties":0}"#).unwrap_err();
        assert!(e.contains("`maxProperties` is below"), "{e}");
        assert_eq!(root(r#"{"type":"object","additionalProperties":false}"#), "\"{\" ws \"}\"");
        assert_eq!(root(r#"{"type":"object"}"#), "object");
    }

    #[test]
    fn string_formats_and_patterns() {
        let g = to_grammar(r#"{"type":"string","format":"date-time"}"#).unwrap();
        assert!(g.starts_with("root ::= \"\\\"\" format-date-time \"\\\"\"\n"), "{g}");
        assert!(g.contains("format-date ::= [0-9]{4}") && g.contains("format-time ::= "), "{g}");
        let e = to_grammar(r#"{"type":"string","format":"email"}"#).unwrap_err();
        assert!(e.contains("`format` \"email\" is not supported"), "{e}");
        let g = to_grammar(r#"{"type":"string","pattern":"^[a-c]+$"}"#).unwrap();
        assert!(g.starts_with("root ::= \"\\\"\" root-pattern \"\\\"\"\nroot-pattern ::= [a-c]+\n"), "{g}");
        let e = to_grammar(r#"{"properties":{"a":{"pattern":"a(?=b)"}},"required":["a"]}"#).unwrap_err();
        assert!(e.contains("root-a: `pattern` \"a(?=b)\": `(?` other"), "{e}");
    }

    #[test]
    fn text_literals_escape_what_gbnf_reads() {
        assert_eq!(text_literal("<a=\"b\">\n\\"), r#""<a=\"b\">\n\\""#);
        assert_eq!(text_literal("｜x\u{1}"), "\"｜x\\x01\"");
    }

    #[test]
    fn the_unsupported_is_named() {
        let e = to_grammar(r#"{"type":"object","properties":{"a":{"type":"string","not":{}}},"required":["a"]}"#);
        assert!(e.unwrap_err().contains("root-a: `not` is not supported"));
        assert!(to_grammar(r#"{"if":{}}"#).unwrap_err().contains("`if` is not supported"));
        assert!(
            to_grammar(r#"{"required":["b"],"properties":{},"type":"object"}"#)
                .unwrap_err()
                .contains("`b` is required")
        );
        assert!(to_grammar("{nope").unwrap_err().contains("not JSON"));
        let e = to_grammar(r#"{"type":"string","minLength":5,"maxLength":2}"#).unwrap_err();
        assert!(e.contains("above `maxLength`"), "{e}");
    }
}
