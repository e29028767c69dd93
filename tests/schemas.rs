//! `--json-schema` end to end: a random-weight model, masked by llguidance
//! to what the schema allows, writes JSON that satisfies the schema (bounds
//! included) and stops by itself. Whatever tokens the model picks inside
//! the mask test the bound; several seeds pick differently.

mod common;

use std::path::Path;
use std::process::Command;

use regex::Regex;
use serde_json::Value;

/// Seeds per schema.
const SEEDS: u32 = 8;

/// The tiny model, made once per test.
fn model(dir: &Path) -> String {
    let path = dir.join("m.gguf").to_string_lossy().into_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["make-model", "--preset", "tiny", "-o", &path])
        .output()
        .expect("run bmoe");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    path
}

/// What the model writes under `schema` with `seed`, parsed; it must have
/// stopped by itself, not at `-n`.
fn generate(model: &str, schema: &str, seed: u32) -> Value {
    let _serial = common::llama_lock();
    let seed = seed.to_string();
    let args = [
        "generate",
        "-m",
        model,
        "-p",
        "hello",
        "-n",
        "400",
        "-t",
        "1",
        "--temp",
        "1",
        "--seed",
        &seed,
        "--json-schema",
    ];
    let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(args)
        .arg(schema)
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run bmoe");
    let (text, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{schema}: {err}");
    assert!(err.contains("finish:  stop"), "{schema} seed {seed}: did not stop by itself: {text:?}\n{err}");
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{schema} seed {seed}: {e}: {text:?}"))
}

/// Runs `schema` with every seed and hands each value to `check`.
fn each(model: &str, schema: &str, check: impl Fn(&Value) -> bool) {
    for seed in 1..=SEEDS {
        let value = generate(model, schema, seed);
        assert!(check(&value), "{schema} seed {seed}: {value}");
    }
}

fn int_in(value: &Value, min: i64, max: i64) -> bool {
    value.as_i64().is_some_and(|n| (min..=max).contains(&n))
}

#[test]
fn integer_bounds() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let ranges = [
        (r#""minimum":1,"maximum":7"#, 1, 7),
        (r#""minimum":-120,"maximum":7"#, -120, 7),
        (r#""exclusiveMinimum":-6,"exclusiveMaximum":-2"#, -5, -3),
        (r#""minimum":10,"maximum":1000"#, 10, 1000),
        (r#""minimum":0,"maximum":0"#, 0, 0),
        (r#""exclusiveMinimum":99,"maximum":101"#, 100, 101),
        (r#""minimum":-1000000,"exclusiveMaximum":-999990"#, -1_000_000, -999_991),
        (r#""minimum":2.5,"maximum":19.5"#, 3, 19),
        (r#""minimum":-9007199254740992,"maximum":-9007199254740984"#, -(1 << 53), -(1 << 53) + 8),
    ];
    for (bounds, min, max) in ranges {
        let schema =
            format!(r#"{{"type":"object","properties":{{"days":{{"type":"integer",{bounds}}}}},"required":["days"]}}"#);
        each(&m, &schema, |v| int_in(&v["days"], min, max));
    }
}

/// Whether a number is within a schema's bounds.
type Inside = fn(f64) -> bool;

/// Numbers with whole and fractional bounds, inclusive and exclusive, either
/// sign: what the model writes parses as a number within them. Each is also
/// a multiple of 0.0001, which ends the random model's fraction.
#[test]
fn number_bounds() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let ranges: [(&str, Inside); 8] = [
        (r#""minimum":0,"maximum":1"#, |x| (0.0..=1.0).contains(&x)),
        (r#""exclusiveMinimum":0,"exclusiveMaximum":3"#, |x| x > 0.0 && x < 3.0),
        (r#""exclusiveMinimum":-2,"maximum":2"#, |x| x > -2.0 && x <= 2.0),
        (r#""minimum":-50,"exclusiveMaximum":-40"#, |x| (-50.0..-40.0).contains(&x)),
        (r#""minimum":100,"maximum":1000"#, |x| (100.0..=1000.0).contains(&x)),
        (r#""minimum":-1.5,"maximum":2.25"#, |x| (-1.5..=2.25).contains(&x)),
        (r#""exclusiveMinimum":0.5,"exclusiveMaximum":0.75"#, |x| x > 0.5 && x < 0.75),
        (r#""minimum":-0.001,"exclusiveMaximum":0"#, |x| (-0.001..0.0).contains(&x)),
    ];
    for (bounds, inside) in ranges {
        let schema =
            r#"{"type":"object","properties":{"p":{"type":"number","multipleOf":0.0001,BOUNDS}},"required":["p"]}"#
                .replace("BOUNDS", bounds);
        each(&m, &schema, |v| v["p"].as_f64().is_some_and(|x| inside(x) && ((x * 1e4).round() - x * 1e4).abs() < 1e-6));
    }
}

#[test]
fn array_counts_and_prefix_items() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let digits = r#"{"type":"integer","minimum":0,"maximum":9}"#;
    for (counts, min, max) in [
        (r#""minItems":2,"maxItems":4"#, 2, 4),
        (r#""maxItems":0"#, 0, 0),
        (r#""minItems":3,"maxItems":3"#, 3, 3),
        (r#""maxItems":2"#, 0, 2),
        (r#""minItems":5,"maxItems":9"#, 5, 9),
    ] {
        let schema = format!(r#"{{"type":"array","items":{digits},{counts}}}"#);
        each(&m, &schema, |v| {
            let items = v.as_array().unwrap();
            (min..=max).contains(&items.len()) && items.iter().all(|i| int_in(i, 0, 9))
        });
    }
    let tuple = r#"{"type":"array","prefixItems":[{"const":"a"},{"type":"integer","minimum":1,"maximum":3}]"#;
    each(&m, &format!("{tuple}}}"), |v| {
        let items = v.as_array().unwrap();
        items.len() == 2 && items[0] == "a" && int_in(&items[1], 1, 3)
    });
    each(&m, &format!(r#"{tuple},"items":{{"type":"boolean"}},"minItems":3,"maxItems":4}}"#), |v| {
        let items = v.as_array().unwrap();
        (3..=4).contains(&items.len())
            && items[0] == "a"
            && int_in(&items[1], 1, 3)
            && items[2..].iter().all(Value::is_boolean)
    });
}

#[test]
fn references_and_alternatives() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let schema = r##"{"$defs":{"d":{"type":"integer","minimum":1,"maximum":3}},"definitions":{"e":{"enum":["x","y"]}},
        "type":"object","properties":{"a":{"$ref":"#/$defs/d"},"b":{"$ref":"#/definitions/e"}},"required":["a","b"]}"##;
    each(&m, schema, |v| int_in(&v["a"], 1, 3) && (v["b"] == "x" || v["b"] == "y"));
    let schema = r#"{"type":"array","minItems":1,"maxItems":5,"items":{"anyOf":[
        {"type":"integer","minimum":5,"maximum":6},{"const":"no"},{"type":"boolean"}]}}"#;
    each(&m, schema, |v| {
        let items = v.as_array().unwrap();
        (1..=5).contains(&items.len()) && items.iter().all(|i| int_in(i, 5, 6) || *i == "no" || i.is_boolean())
    });
    let schema = r#"{"oneOf":[{"type":"null"},{"type":"integer","minimum":-2,"maximum":2}]}"#;
    each(&m, schema, |v| v.is_null() || int_in(v, -2, 2));
}

#[test]
fn additional_properties() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let schema = r#"{"type":"object","properties":{"id":{"const":1}},"required":["id"],
        "patternProperties":{"^[a-z]{1,4}$":{"type":"integer","minimum":0,"maximum":9}},"maxProperties":4}"#;
    let short_key = Regex::new("^[a-z]{1,4}$").unwrap();
    each(&m, schema, |v| {
        let o = v.as_object().unwrap();
        o.len() <= 4
            && o["id"] == 1
            && o.iter().filter(|(k, _)| *k != "id").all(|(k, v)| short_key.is_match(k) && int_in(v, 0, 9))
    });
    let schema = r#"{"type":"object","patternProperties":{"^[xyz]$":{"type":"boolean"}},"maxProperties":3}"#;
    each(&m, schema, |v| {
        let o = v.as_object().unwrap();
        o.len() <= 3 && o.iter().all(|(k, v)| ["x", "y", "z"].contains(&k.as_str()) && v.is_boolean())
    });
    // Listed keys close an object unless `additionalProperties` opens it.
    let schema = r#"{"type":"object","properties":{"a":{"type":"boolean"},"b":{"const":2}},"required":["a"]}"#;
    each(&m, schema, |v| {
        let o = v.as_object().unwrap();
        o["a"].is_boolean() && o.keys().all(|k| k == "a" || k == "b")
    });
}

#[test]
fn formats_and_patterns() {
    let dir = common::tempdir();
    let m = model(dir.path());
    let cases = [
        (r#""format":"date""#, r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"),
        (r#""format":"uuid""#, r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$"),
        (r#""format":"time""#, r"^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$"),
        (
            r#""format":"date-time""#,
            r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)",
        ),
        (r#""pattern":"^[A-Z]{2}-[0-9]{2,3}(x|yz)?$""#, r"^[A-Z]{2}-[0-9]{2,3}(x|yz)?$"),
        (r#""pattern":"^(ab|c\\.d)+[^a-z]{1,3}\\d?$""#, r"^(ab|c\.d)+[^a-z]{1,3}\d?$"),
        (r#""pattern":"^a\"?\\\\b{0,2}(?:q|)$""#, r#"^a"?\\b{0,2}(?:q|)$"#),
        (r#""format":"email","maxLength":24"#, r"^[^@\s]+@[a-zA-Z0-9.\[\]-]+$"),
    ];
    for (keyword, check) in cases {
        let schema =
            format!(r#"{{"type":"object","properties":{{"s":{{"type":"string",{keyword}}}}},"required":["s"]}}"#);
        let check = Regex::new(check).unwrap();
        each(&m, &schema, |v| v["s"].as_str().is_some_and(|s| check.is_match(s)));
    }
}

#[test]
fn what_is_not_supported_is_named() {
    let dir = common::tempdir();
    let m = model(dir.path());
    for (schema, want) in [
        (r#"{"type":"string","not":{}}"#, r#"Unimplemented keys: ["not"]"#),
        (r#"{"type":"string","pattern":"a(?=b)"}"#, "look-around"),
        (r#"{"type":"string","format":"colour"}"#, "Unknown format: colour"),
        (r#"{"type":"integer","minimum":5,"maximum":1}"#, "the schema cannot be used"),
        (r#"{"type":"integer","minimum":-9223372036854775808}"#, "beyond ±2^63"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bmoe"))
            .args(["generate", "-m", &m, "-p", "x", "--json-schema", schema])
            .output()
            .expect("run bmoe");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{schema}: {err}");
    }
}
