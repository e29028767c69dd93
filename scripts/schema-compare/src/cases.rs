//! The schemas: one per JSON Schema feature for coverage, each with JSON
//! texts the schema accepts (`valid`) and refuses (`invalid`) by the
//! specification; and the schemas whose cost per token is measured, each
//! with an answer a model would write.
//!
//! Texts are compact (no whitespace), which both engines allow.

pub struct Case {
    pub feature: &'static str,
    pub schema: &'static str,
    pub valid: &'static [&'static str],
    pub invalid: &'static [&'static str],
}

const fn case(
    feature: &'static str,
    schema: &'static str,
    valid: &'static [&'static str],
    invalid: &'static [&'static str],
) -> Case {
    Case { feature, schema, valid, invalid }
}

pub const COVERAGE: &[Case] = &[
    case(
        "type: one of each",
        r#"{"type":"array","items":{"type":["string","number","integer","boolean","null","object","array"]}}"#,
        &[r#"["a",1.5,2,true,null,{},[]]"#],
        &[r#"[1,}"#],
    ),
    case("type: union", r#"{"type":["integer","string"]}"#, &[r#"7"#, r#""x""#], &[r#"true"#, r#"1.5"#]),
    case(
        "enum (mixed values)",
        r#"{"enum":["red","green",3,null,{"k":[1]}]}"#,
        &[r#""green""#, r#"3"#, r#"null"#, r#"{"k":[1]}"#],
        &[r#""blue""#, r#"4"#],
    ),
    case("const", r#"{"const":{"a":1,"b":"x"}}"#, &[r#"{"a":1,"b":"x"}"#], &[r#"{"a":2,"b":"x"}"#]),
    case(
        "nested objects",
        r#"{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"object","properties":{"c":{"type":"integer"}},"required":["c"]}},"required":["b"]}},"required":["a"]}"#,
        &[r#"{"a":{"b":{"c":1}}}"#],
        &[r#"{"a":{"b":{}}}"#, r#"{"a":{"b":{"c":"1"}}}"#],
    ),
    case(
        "required, optional omitted",
        r#"{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x"]}"#,
        &[r#"{"x":1}"#],
        &[r#"{"y":2}"#, r#"{}"#],
    ),
    case(
        "optional property written",
        r#"{"type":"object","properties":{"x":{"type":"integer"},"y":{"type":"integer"}},"required":["x"]}"#,
        &[r#"{"x":1,"y":2}"#],
        &[r#"{"x":1,"y":"2"}"#],
    ),
    case(
        "no required: empty or partial",
        r#"{"type":"object","properties":{"a":{"type":"string"},"b":{"type":"boolean"}}}"#,
        &[r#"{}"#, r#"{"b":true}"#],
        &[r#"{"b":"yes"}"#],
    ),
    case(
        "additionalProperties: false",
        r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}"#,
        &[r#"{"a":1}"#],
        &[r#"{"a":1,"b":2}"#],
    ),
    case(
        "additionalProperties: schema",
        r#"{"type":"object","additionalProperties":{"type":"integer"}}"#,
        &[r#"{"k":1,"other_key":2}"#, r#"{}"#],
        &[r#"{"k":"x"}"#],
    ),
    case(
        "additionalProperties absent (spec: allowed)",
        r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}"#,
        &[r#"{"a":1,"extra":true}"#],
        &[r#"{"a":"1"}"#],
    ),
    case(
        "min/maxProperties",
        r#"{"type":"object","additionalProperties":{"type":"integer"},"minProperties":1,"maxProperties":2}"#,
        &[r#"{"a":1}"#, r#"{"a":1,"b":2}"#],
        &[r#"{}"#, r#"{"a":1,"b":2,"c":3}"#],
    ),
    case(
        "patternProperties",
        r#"{"type":"object","patternProperties":{"^x_[a-z]+$":{"type":"integer"}},"additionalProperties":false}"#,
        &[r#"{"x_ab":1}"#],
        &[r#"{"y":1}"#],
    ),
    case(
        "propertyNames",
        r#"{"type":"object","propertyNames":{"pattern":"^[a-z]{1,3}$"},"additionalProperties":{"type":"integer"}}"#,
        &[r#"{"ab":1}"#],
        &[r#"{"ABCD":1}"#],
    ),
    case(
        "array items + min/maxItems",
        r#"{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}"#,
        &[r#"[1,2]"#, r#"[1,2,3]"#],
        &[r#"[1]"#, r#"[1,2,3,4]"#, r#"[1,"2"]"#],
    ),
    case(
        "prefixItems, items: false",
        r#"{"type":"array","prefixItems":[{"const":"a"},{"type":"integer"}],"items":false}"#,
        &[r#"["a",1]"#],
        &[r#"["a","b"]"#, r#"["a",1,2]"#],
    ),
    case(
        "prefixItems + items",
        r#"{"type":"array","prefixItems":[{"type":"string"}],"items":{"type":"boolean"},"maxItems":3}"#,
        &[r#"["s"]"#, r#"["s",true,false]"#],
        &[r#"["s",1]"#],
    ),
    case(
        "uniqueItems",
        r#"{"type":"array","items":{"type":"integer"},"uniqueItems":true}"#,
        &[r#"[1,2]"#],
        &[r#"[1,1]"#],
    ),
    case(
        "contains",
        r#"{"type":"array","items":{"type":"integer"},"contains":{"const":7}}"#,
        &[r#"[1,7]"#],
        &[r#"[1,2]"#],
    ),
    case(
        "string minLength/maxLength",
        r#"{"type":"string","minLength":2,"maxLength":4}"#,
        &[r#""ab""#, r#""abcd""#, r#""éü""#],
        &[r#""a""#, r#""abcde""#],
    ),
    case("string escapes", r#"{"type":"string","maxLength":20}"#, &[r#""a\"b\\c\n\u00e9""#], &[r#""a"b""#]),
    case(
        "pattern (anchored)",
        r#"{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"}"#,
        &[r#""AB-123""#],
        &[r#""ab-123""#, r#""AB-1234""#],
    ),
    case(
        "pattern (unanchored: spec = search)",
        r#"{"type":"string","pattern":"\\d{3}"}"#,
        &[r#""123""#, r#""ab123cd""#],
        &[r#""ab12""#],
    ),
    case(
        "pattern with lookahead",
        r#"{"type":"string","pattern":"^(?=.*\\d)[a-z0-9]{4}$"}"#,
        &[r#""ab1c""#],
        &[r#""abcd""#],
    ),
    case("format: date", r#"{"type":"string","format":"date"}"#, &[r#""2024-02-29""#], &[r#""2024-13-01""#]),
    case("format: time", r#"{"type":"string","format":"time"}"#, &[r#""12:30:00Z""#], &[r#""25:00:00Z""#]),
    case(
        "format: date-time",
        r#"{"type":"string","format":"date-time"}"#,
        &[r#""2024-02-29T12:30:00Z""#, r#""2024-02-29T12:30:00.5+01:00""#],
        &[r#""2024-02-29 12:30""#],
    ),
    case(
        "format: uuid",
        r#"{"type":"string","format":"uuid"}"#,
        &[r#""123e4567-e89b-12d3-a456-426614174000""#],
        &[r#""123e4567""#],
    ),
    case("format: email", r#"{"type":"string","format":"email"}"#, &[r#""ada.l@example.com""#], &[r#""not an email""#]),
    case("format: ipv4", r#"{"type":"string","format":"ipv4"}"#, &[r#""192.168.0.1""#], &[r#""999.1.1.1""#]),
    case(
        "format: uri",
        r#"{"type":"string","format":"uri"}"#,
        &[r#""https://example.com/a?b=1""#],
        &[r#""not a uri""#],
    ),
    case(
        "integer min/max",
        r#"{"type":"integer","minimum":-5,"maximum":120}"#,
        &[r#"-5"#, r#"0"#, r#"120"#],
        &[r#"121"#, r#"-6"#, r#"1.5"#],
    ),
    case(
        "integer exclusiveMin/Max",
        r#"{"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":10}"#,
        &[r#"1"#, r#"9"#],
        &[r#"0"#, r#"10"#],
    ),
    case("integer, one bound", r#"{"type":"integer","minimum":100}"#, &[r#"100"#, r#"123456"#], &[r#"99"#, r#"-100"#]),
    case(
        "number, whole min/max",
        r#"{"type":"number","minimum":0,"maximum":1}"#,
        &[r#"0"#, r#"0.25"#, r#"1"#],
        &[r#"1.5"#, r#"-0.1"#],
    ),
    case(
        "number, fractional min/max",
        r#"{"type":"number","minimum":0.5,"maximum":2.75}"#,
        &[r#"0.5"#, r#"1"#, r#"2.75"#],
        &[r#"0.49"#, r#"2.8"#],
    ),
    case(
        "number, fractional exclusive",
        r#"{"type":"number","exclusiveMinimum":0.1,"exclusiveMaximum":0.9}"#,
        &[r#"0.5"#],
        &[r#"0.1"#, r#"0.9"#],
    ),
    case("number, exponent", r#"{"type":"number"}"#, &[r#"-1.5e10"#, r#"2E-3"#, r#"0"#], &[r#"01"#, r#"1."#]),
    case("multipleOf (integer)", r#"{"type":"integer","multipleOf":5}"#, &[r#"15"#], &[r#"7"#]),
    case("multipleOf (number)", r#"{"type":"number","multipleOf":0.25}"#, &[r#"1.75"#], &[r#"1.3"#]),
    case(
        "$ref to $defs",
        r##"{"$defs":{"p":{"type":"integer","minimum":1,"maximum":3}},"type":"array","items":{"$ref":"#/$defs/p"}}"##,
        &[r#"[1,3]"#],
        &[r#"[4]"#],
    ),
    case(
        "$ref recursive",
        r##"{"$defs":{"n":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/n"}}},"required":["v","kids"]}},"$ref":"#/$defs/n"}"##,
        &[r#"{"v":1,"kids":[{"v":2,"kids":[]}]}"#],
        &[r#"{"v":1,"kids":[{"v":2}]}"#],
    ),
    case(
        "$ref to definitions",
        r##"{"definitions":{"e":{"enum":["x","y"]}},"$ref":"#/definitions/e"}"##,
        &[r#""x""#],
        &[r#""z""#],
    ),
    case(
        "anyOf",
        r#"{"anyOf":[{"type":"integer"},{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]}"#,
        &[r#"5"#, r#"{"k":"v"}"#],
        &[r#"{"k":5}"#],
    ),
    case(
        "oneOf (overlap: 1 matches both)",
        r#"{"oneOf":[{"type":"integer"},{"type":"number","minimum":0,"maximum":1}]}"#,
        &[r#"7"#, r#"0.5"#],
        &[r#"1"#],
    ),
    case(
        "allOf (object parts)",
        r#"{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]}"#,
        &[r#"{"a":1,"b":"x"}"#],
        &[r#"{"a":1}"#],
    ),
    case(
        "allOf (one $ref + extra)",
        r##"{"$defs":{"base":{"type":"integer","minimum":0}},"allOf":[{"$ref":"#/$defs/base"}],"maximum":9}"##,
        &[r#"3"#],
        &[r#"10"#, r#"-1"#],
    ),
    case("not", r#"{"not":{"type":"string"}}"#, &[r#"1"#], &[r#""s""#]),
    case(
        "if/then/else",
        r#"{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"if":{"properties":{"a":{"const":1}}},"then":{"required":["b"]}}"#,
        &[r#"{"a":2}"#],
        &[r#"{"a":1}"#],
    ),
    case(
        "dependentRequired",
        r#"{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"dependentRequired":{"a":["b"]}}"#,
        &[r#"{"a":1,"b":2}"#],
        &[r#"{"a":1}"#],
    ),
    case("{} / true: any JSON", r#"{}"#, &[r#"{"a":[1,"x",null,{"b":false}]}"#, r#"-2.5"#], &[r#"{"a":}"#]),
    case(
        "nullable (type + null)",
        r#"{"type":["string","null"],"maxLength":3}"#,
        &[r#"null"#, r#""abc""#],
        &[r#""abcd""#],
    ),
    case(
        "tool-call args (typical)",
        r#"{"type":"object","properties":{"city":{"type":"string","description":"City"},"unit":{"type":"string","enum":["c","f"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","unit","days"],"additionalProperties":false}"#,
        &[r#"{"city":"Paris","unit":"c","days":3}"#],
        &[r#"{"city":"Paris","unit":"k","days":3}"#],
    ),
    case("unknown keyword (x-foo)", r#"{"type":"integer","x-foo":1}"#, &[r#"1"#], &[r#""1""#]),
];

/// Schemas whose mask cost per token is measured, with an answer a model
/// would write under them (within what both converters accept).
pub struct CostCase {
    pub name: String,
    pub schema: String,
    pub answer: String,
}

/// The built-in cost cases.
pub fn cost_cases() -> Vec<CostCase> {
    COST.iter()
        .map(|&(name, schema, answer)| CostCase { name: name.into(), schema: schema.into(), answer: answer.into() })
        .collect()
}

const COST: &[(&str, &str, &str)] = &[
    (
        "flat object",
        r#"{"type":"object","properties":{
            "name":{"type":"string","maxLength":60},
            "age":{"type":"integer","minimum":0,"maximum":150},
            "active":{"type":"boolean"},
            "score":{"type":"number"},
            "city":{"type":"string"},
            "role":{"enum":["admin","editor","viewer"]}},
          "required":["name","age","active","score","city","role"],"additionalProperties":false}"#,
        r#"{"name":"Ada Lovelace","age":36,"active":true,"score":97.25,"city":"London","role":"editor"}"#,
    ),
    (
        "nested + arrays",
        r##"{"$defs":{"item":{"type":"object","properties":{
              "sku":{"type":"string","maxLength":16},
              "qty":{"type":"integer","minimum":1,"maximum":100},
              "price":{"type":"number"},
              "tags":{"type":"array","items":{"type":"string","maxLength":12},"maxItems":4}},
            "required":["sku","qty","price","tags"]}},
          "type":"object","properties":{
            "order_id":{"type":"string","format":"uuid"},
            "customer":{"type":"object","properties":{
                "name":{"type":"string"},
                "address":{"type":"object","properties":{
                    "street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},
                  "required":["street","city","zip"]}},
              "required":["name","address"]},
            "items":{"type":"array","items":{"$ref":"#/$defs/item"},"minItems":1,"maxItems":10},
            "paid":{"type":"boolean"}},
          "required":["order_id","customer","items","paid"]}"##,
        r#"{"order_id":"123e4567-e89b-12d3-a456-426614174000","customer":{"name":"Grace Hopper","address":{"street":"1 Navy Yard Road","city":"Arlington","zip":"22202"}},"items":[{"sku":"CB-100","qty":2,"price":19.99,"tags":["cable","usb"]},{"sku":"KB-7","qty":1,"price":89.5,"tags":["keyboard"]},{"sku":"MS-22","qty":3,"price":24,"tags":["mouse","wireless","black"]}],"paid":true}"#,
    ),
    (
        "pattern strings",
        r#"{"type":"object","properties":{
            "code":{"type":"string","pattern":"^[A-Z]{3}-[0-9]{4}-[a-z0-9]{6}$"},
            "phone":{"type":"string","pattern":"^\\+[0-9]{1,3} [0-9]{3} [0-9]{3} [0-9]{4}$"},
            "when":{"type":"string","format":"date-time"},
            "ids":{"type":"array","items":{"type":"string","pattern":"^(ab|cd)[0-9]{2,4}$"},"maxItems":5}},
          "required":["code","phone","when","ids"]}"#,
        r#"{"code":"XYZ-2024-ab12cd","phone":"+44 207 946 0958","when":"2024-06-01T09:30:00Z","ids":["ab123","cd9876","ab01"]}"#,
    ),
    (
        "free-text string",
        r#"{"type":"object","properties":{"summary":{"type":"string","maxLength":600}},"required":["summary"]}"#,
        r#"{"summary":"The committee met on Tuesday to review the quarterly budget. Spending on infrastructure rose by twelve percent, mostly because of delayed maintenance on the northern bridge, while administrative costs fell slightly. Members agreed to postpone the new library wing until the spring and asked staff to prepare two alternative plans, one with a smaller footprint and one financed partly by private donors."}"#,
    ),
];
