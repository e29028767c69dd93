//! Output constrained to a shape: a GBNF grammar (llama.cpp's grammar
//! sampler, for `--grammar` and tool calls) or a JSON schema, matched by
//! Microsoft's llguidance on the model's own vocabulary.
//!
//! llguidance computes the set of tokens a schema allows next in 0.1-0.2 ms
//! on a 151,936-token vocabulary, where llama.cpp's grammar sampler takes
//! 13-27 ms for the same schema converted to GBNF, and it covers more of
//! JSON Schema (`scripts/schema-compare.sh`, docs/chat.md).

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// What the generated text must follow.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// A GBNF grammar, rule `root` first (llama.cpp's grammar sampler).
    Grammar(String),
    /// A JSON schema (llguidance), with bmoe's layout options in place.
    JsonSchema(Value),
}

impl Constraint {
    /// A JSON schema given as JSON text, checked now: a schema llguidance
    /// refuses (a keyword it does not implement, a bad `$ref`, an
    /// unsatisfiable combination) is an error before any model runs.
    pub fn json_schema(text: &str) -> Result<Constraint, String> {
        let schema: Value = serde_json::from_str(text).map_err(|e| format!("the schema is not JSON: {e}"))?;
        Constraint::json_schema_value(schema)
    }

    /// As [`Constraint::json_schema`], from a parsed value.
    pub fn json_schema_value(schema: Value) -> Result<Constraint, String> {
        let schema = with_layout(schema)?;
        SchemaGuide::new(byte_table(), &schema)?;
        Ok(Constraint::JsonSchema(schema))
    }
}

/// The schema with bmoe's layout: no whitespace in the JSON but one
/// optional space after `,` and `:` (so a model cannot pad its answer
/// forever), unless the schema sets llguidance's own `x-guidance` options.
fn with_layout(schema: Value) -> Result<Value, String> {
    let mut object = match schema {
        Value::Object(object) => object,
        Value::Bool(true) => serde_json::Map::new(),
        Value::Bool(false) => return Err("the schema is `false`: no value matches it".into()),
        other => return Err(format!("a schema is an object or `true`, not {other}")),
    };
    object.entry("x-guidance").or_insert_with(
        || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ?", "key_separator": ": ?"}),
    );
    let mut schema = Value::Object(object);
    each_schema(&mut schema, true, &mut |node, closable| {
        check_bounds(node)?;
        keep_exclusive_bounds_out(node)?;
        if closable {
            close(node);
        }
        Ok(())
    })?;
    Ok(schema)
}

/// Calls `visit` on every schema object within `schema` (itself included),
/// with whether it may be closed ([`close`]): not a direct branch of
/// `allOf`, whose intersection needs each branch's keys.
fn each_schema(
    schema: &mut Value,
    closable: bool,
    visit: &mut impl FnMut(&mut serde_json::Map<String, Value>, bool) -> Result<(), String>,
) -> Result<(), String> {
    let Value::Object(node) = schema else { return Ok(()) };
    visit(node, closable)?;
    for (key, child) in node.iter_mut() {
        match (key.as_str(), child) {
            ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                map.values_mut().try_for_each(|s| each_schema(s, true, visit))?
            }
            ("anyOf" | "oneOf" | "prefixItems", Value::Array(list)) => {
                list.iter_mut().try_for_each(|s| each_schema(s, true, visit))?
            }
            ("allOf", Value::Array(list)) => list.iter_mut().try_for_each(|s| each_schema(s, false, visit))?,
            ("items" | "additionalItems" | "additionalProperties" | "contains" | "not", child) => {
                each_schema(child, true, visit)?
            }
            _ => {}
        }
    }
    Ok(())
}

/// Closes what is listed, as llama.cpp's converter and OpenAI's structured
/// outputs read a schema: an object with `properties` (or
/// `patternProperties`) and no `additionalProperties` takes no other key; a
/// `prefixItems` tuple is written whole (unless `minItems` says otherwise)
/// and, with no `items`, takes no other item.
fn close(node: &mut serde_json::Map<String, Value>) {
    let lists_keys = node.contains_key("properties") || node.contains_key("patternProperties");
    if lists_keys && !node.contains_key("additionalProperties") {
        node.insert("additionalProperties".into(), Value::Bool(false));
    }
    if let Some(Value::Array(tuple)) = node.get("prefixItems") {
        let whole = tuple.len();
        if !node.contains_key("items") && !node.contains_key("additionalItems") {
            node.insert("items".into(), Value::Bool(false));
        }
        node.entry("minItems").or_insert(whole.into());
    }
}

/// Works around llguidance 1.9.1 writing a number's exclusive bound
/// itself: when an exclusive whole-number bound and the other bound lie
/// within one unit (`exclusiveMinimum: 0, maximum: 0.5`, or
/// `minimum: -0.5, exclusiveMaximum: 0`), its range makes the fraction
/// optional and lets the bare bound (`0`, `-0`) through. The exclusive
/// bound becomes an inclusive one the smallest step inside it that still
/// prints as a fraction (10^-9 for small numbers): never outside the schema.
fn keep_exclusive_bounds_out(node: &mut serde_json::Map<String, Value>) -> Result<(), String> {
    let is_number = match node.get("type") {
        Some(Value::String(t)) => t == "number",
        Some(Value::Array(types)) => types.iter().any(|t| t == "number"),
        _ => false,
    };
    if !is_number {
        return Ok(());
    }
    let bound = |key: &str| node.get(key).and_then(Value::as_f64);
    let lower = [bound("minimum"), bound("exclusiveMinimum")].into_iter().flatten().reduce(f64::max);
    let upper = [bound("maximum"), bound("exclusiveMaximum")].into_iter().flatten().reduce(f64::min);
    let (Some(lower), Some(upper)) = (lower, upper) else { return Ok(()) };
    let inside = |from: f64, toward: f64| {
        [1e-9_f64, 1e-6, 1e-3, 0.1].into_iter().map(|step| from + step.copysign(toward - from)).find(|&b| {
            b.fract() != 0.0
                && (b - from).signum() == (toward - from).signum()
                && (b - toward).abs() < (from - toward).abs()
        })
    };
    let exclusive_min =
        bound("exclusiveMinimum").filter(|&l| l == lower && l >= 0.0 && l.fract() == 0.0 && upper < l + 1.0);
    let exclusive_max =
        bound("exclusiveMaximum").filter(|&r| r == upper && r <= 0.0 && r.fract() == 0.0 && lower > r - 1.0);
    for (key, from, toward, replacement) in
        [("exclusiveMinimum", exclusive_min, upper, "minimum"), ("exclusiveMaximum", exclusive_max, lower, "maximum")]
    {
        let Some(from) = from else { continue };
        let Some(moved) = inside(from, toward) else {
            return Err(format!("the schema cannot be used: the range from {lower} to {upper} is too narrow to write"));
        };
        node.remove(key);
        node.insert(replacement.into(), moved.into());
    }
    Ok(())
}

/// Refuses a numeric bound of magnitude 2^63 or more: llguidance builds
/// integer ranges on 64-bit integers, and recurses without end at -2^63.
fn check_bounds(node: &serde_json::Map<String, Value>) -> Result<(), String> {
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if let Some(bound) = node.get(key).and_then(Value::as_f64)
            && bound.abs() >= LIMIT
        {
            return Err(format!(
                "the schema cannot be used: `{key}` {bound:e} is beyond ±2^63, the bounds it supports"
            ));
        }
    }
    Ok(())
}

/// A vocabulary of the 256 bytes and an end token, on which a schema is
/// checked before a model is known (what llguidance refuses does not
/// depend on the vocabulary).
fn byte_table() -> &'static TokenTable {
    static TABLE: OnceLock<TokenTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e', b'o', b's']);
        TokenTable::new(&words, &[256]).expect("a vocabulary of single bytes is always accepted")
    })
}

/// A vocabulary as llguidance reads it, built once per model.
pub struct TokenTable {
    factory: ParserFactory,
    /// llguidance's end token: the first of `ends`, or one past the
    /// vocabulary when it has none.
    eos: u32,
    /// The end-of-generation tokens: allowed exactly when the schema is
    /// complete.
    ends: Arc<[u32]>,
}

impl TokenTable {
    /// The table of `words` (each token's bytes; control tokens start with
    /// [`TokTrie::SPECIAL_TOKEN_MARKER`]); `ends` are the end-of-generation
    /// tokens, the first standing for all of them (none: a complete schema
    /// allows no token, and the text ends there).
    pub fn new(words: &[Vec<u8>], ends: &[u32]) -> Result<TokenTable, String> {
        let too_large = || "the vocabulary is too large".to_string();
        let n = u32::try_from(words.len()).map_err(|_| too_large())?;
        let mut extended;
        let (words, eos) = match ends.first() {
            Some(&eos) => (words, eos),
            None => {
                // llguidance needs an end token: one past the vocabulary
                // stands in, a token no logit stands for.
                extended = words.to_vec();
                extended.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e', b'n', b'd']);
                (extended.as_slice(), n)
            }
        };
        let count = u32::try_from(words.len()).map_err(|_| too_large())?;
        let trie = TokTrie::from(&TokRxInfo::new(count, eos), words);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("llguidance: {e}"))?;
        factory.quiet();
        Ok(TokenTable { factory, eos, ends: ends.into() })
    }
}

/// One schema's matcher over a [`TokenTable`]: per step the mask of the
/// tokens allowed next, then the token chosen.
pub struct SchemaGuide {
    matcher: Matcher,
    eos: u32,
    ends: Arc<[u32]>,
}

impl SchemaGuide {
    /// Compiles `schema` (with its layout options, see
    /// [`Constraint::json_schema`]) for `table`'s vocabulary.
    pub fn new(table: &TokenTable, schema: &Value) -> Result<SchemaGuide, String> {
        let grammar = TopLevelGrammar::from_json_schema(schema.clone());
        let parser = table.factory.create_parser(grammar).map_err(|e| refusal(&e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(refusal(&e));
        }
        Ok(SchemaGuide { matcher, eos: table.eos, ends: table.ends.clone() })
    }

    /// Sets every logit the schema does not allow next to -inf; every end
    /// token shares the verdict on the first.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| format!("the JSON schema's matcher failed: {e}"))?;
        let ends_allowed = mask.is_allowed(self.eos);
        for (word_index, &word) in mask.as_slice().iter().enumerate() {
            if word == u32::MAX {
                continue;
            }
            let base = word_index * 32;
            let end = (base + 32).min(logits.len());
            for (bit, logit) in logits.get_mut(base..end).unwrap_or_default().iter_mut().enumerate() {
                if word & (1 << bit) == 0 {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        for &t in self.ends.iter() {
            if !ends_allowed && let Some(logit) = logits.get_mut(t as usize) {
                *logit = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Moves the matcher past `token` (one [`SchemaGuide::mask`] allowed).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        let is_end = self.ends.contains(&token);
        if is_end && self.matcher.is_stopped() && self.matcher.get_error().is_none() {
            // The schema was complete and stopped the matcher: the end
            // token its mask allowed closes the text.
            return Ok(());
        }
        let token = if is_end { self.eos } else { token };
        self.matcher.consume_token(token).map_err(|e| format!("the JSON schema's matcher refused a token: {e}"))
    }

    /// Back to the schema's start.
    pub fn reset(&mut self) {
        let _ = self.matcher.reset();
    }
}

/// llguidance's error as one line, said as a refusal of the schema.
/// A multi-line error (a regex's, with the pattern and a caret line) is
/// said as its first line and its last `error:` line.
fn refusal(error: &str) -> String {
    let mut lines = error.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or(error.trim());
    match lines.filter_map(|l| l.strip_prefix("error:")).next_back() {
        Some(why) => format!("the schema cannot be used: {first} {}", why.trim()),
        None => format!("the schema cannot be used: {first}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of the digits, `{`, `}`, `"`, `:`, `,`, space, a few
    /// letters, and an end token.
    fn table() -> (TokenTable, Vec<Vec<u8>>) {
        let mut words: Vec<Vec<u8>> =
            "0123456789{}\":, abcdefghijklmnopqrstuvwxyz-.[]".bytes().map(|b| vec![b]).collect();
        words.push(vec![TokTrie::SPECIAL_TOKEN_MARKER, b'e', b'n', b'd']);
        let end = (words.len() - 1) as u32;
        (TokenTable::new(&words, &[end]).unwrap(), words)
    }

    /// Greedy choice over the mask, with `prefer` giving each token's logit
    /// from its bytes and the length written so far.
    fn write(schema: &str, prefer: impl Fn(&[u8], usize) -> f32) -> String {
        let (table, words) = table();
        let Constraint::JsonSchema(schema) = Constraint::json_schema(schema).unwrap() else { unreachable!() };
        let mut guide = SchemaGuide::new(&table, &schema).unwrap();
        let mut out = String::new();
        for _ in 0..64 {
            let mut logits: Vec<f32> = words.iter().map(|w| prefer(w, out.len())).collect();
            guide.mask(&mut logits).unwrap();
            let best = super::super::sampler::argmax(&logits) as usize;
            assert!(logits[best] > f32::NEG_INFINITY, "no token allowed after {out:?}");
            guide.accept(best as u32).unwrap();
            if best == words.len() - 1 {
                return out;
            }
            out.push_str(std::str::from_utf8(&words[best]).unwrap());
        }
        panic!("no end after {out:?}");
    }

    /// A model that writes the largest digit allowed for six bytes, then
    /// ends as soon as it may.
    fn largest_digits(word: &[u8], written: usize) -> f32 {
        match word {
            [d @ b'0'..=b'9'] if written < 6 => f32::from(d - b'0'),
            b"." => 0.5,
            [TokTrie::SPECIAL_TOKEN_MARKER, ..] => 0.2,
            _ => -10.0,
        }
    }

    #[test]
    fn fractional_bounds_on_a_number_hold() {
        let out = write(r#"{"type":"number","minimum":-1.5,"maximum":2.25}"#, largest_digits);
        assert_eq!(out, "2.25");
        let out = write(r#"{"type":"number","exclusiveMinimum":0.5,"exclusiveMaximum":0.75}"#, largest_digits);
        let value: f64 = out.parse().unwrap();
        assert!(value > 0.5 && value < 0.75, "{out}");
    }

    #[test]
    fn spaces_only_after_separators_and_at_most_one() {
        // A model that loves spaces gets one after `:` and `,`, none elsewhere.
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer","maximum":5},"b":{"type":"integer","maximum":5}},"required":["a","b"],"additionalProperties":false}"#;
        let out = write(schema, |w, _| if w == b" " { 5.0 } else { 0.0 });
        assert_eq!(out, r#"{"a": 0, "b": 0}"#);
        let out = write(schema, |w, _| if w == b" " { -5.0 } else { 0.0 });
        assert_eq!(out, r#"{"a":0,"b":0}"#);
    }

    #[test]
    fn listed_keys_and_tuples_are_closed_unless_the_schema_opens_them() {
        // A model that would add a key after the listed one cannot.
        let schema = r#"{"type":"object","properties":{"a":{"type":"integer","maximum":5}},"required":["a"]}"#;
        let out = write(schema, |w, _| if w == b"," { 5.0 } else { 0.0 });
        assert_eq!(out, r#"{"a":0}"#);
        let out = write(r#"{"type":"array","prefixItems":[{"const":1}]}"#, |w, _| if w == b"," { 5.0 } else { 0.0 });
        assert_eq!(out, "[1]");
        let open = r#"{"type":"object","properties":{"a":{"const":1}},"required":["a"],"additionalProperties":true,"maxProperties":2}"#;
        let out = write(open, |w, n| match w {
            b"," if n < 8 => 5.0,
            b"\"" if n > 8 => 4.0,
            _ => 0.0,
        });
        assert!(out.starts_with(r#"{"a":1,"#), "{out}");
    }

    #[test]
    fn an_exclusive_bound_is_never_written() {
        // A model that wants `-0` or `0` and to end there gets a number
        // strictly inside the bound instead.
        let wants_zero = |w: &[u8], n: usize| match w {
            b"-" => 5.0,
            b"0" if n < 2 => 4.0,
            [TokTrie::SPECIAL_TOKEN_MARKER, ..] => 3.0,
            b"." => 1.0,
            b"1" => 0.5,
            _ => 0.0,
        };
        type Inside = fn(f64) -> bool;
        let cases: [(&str, Inside); 4] = [
            (r#"{"type":"number","minimum":-0.001,"exclusiveMaximum":0}"#, |x| (-0.001..0.0).contains(&x)),
            (r#"{"type":"number","exclusiveMinimum":0,"maximum":0.001}"#, |x| x > 0.0 && x <= 0.001),
            (r#"{"type":["number","null"],"exclusiveMinimum":2,"exclusiveMaximum":2.5}"#, |x| x > 2.0 && x < 2.5),
            (r#"{"type":"number","minimum":-3.5,"exclusiveMaximum":-3}"#, |x| (-3.5..-3.0).contains(&x)),
        ];
        for (schema, inside) in cases {
            let out = write(schema, wants_zero);
            assert!(out.parse().is_ok_and(inside), "{schema}: {out}");
        }
    }

    #[test]
    fn refusals_name_what_is_refused() {
        let e = Constraint::json_schema(r#"{"type":"object","not":{}}"#).unwrap_err();
        assert!(e.contains("not"), "{e}");
        let e = Constraint::json_schema(r##"{"$ref":"#/$defs/missing"}"##).unwrap_err();
        assert!(e.contains("missing"), "{e}");
        assert!(Constraint::json_schema("false").is_err());
        assert!(Constraint::json_schema("[1]").unwrap_err().contains("an object or `true`"));
        assert!(Constraint::json_schema("{").unwrap_err().contains("not JSON"));
        let e = Constraint::json_schema(r#"{"type":"integer","minimum":-9223372036854775808}"#).unwrap_err();
        assert!(e.contains("`minimum` -9.223372036854776e18 is beyond ±2^63"), "{e}");
        let e = Constraint::json_schema(r#"{"type":"string","pattern":"a(?=b)"}"#).unwrap_err();
        assert!(e.starts_with("the schema cannot be used: regex parse error: look-around"), "{e}");
    }
}
