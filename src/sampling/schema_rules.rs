//! What a client's JSON schema leaves open, closed before it is compiled,
//! so that constrained output always ends.
//!
//! A schema as pydantic writes it (instructor, langchain, the OpenAI SDK's
//! `parse`) lists an object's `properties` and says nothing of
//! `additionalProperties`, and gives its numbers no bounds. Taken literally,
//! such a schema lets a small model add invented keys, or digits, until
//! `max_tokens`. wick reads it as llama.cpp does ([`close_schema`]):
//!
//! - an object that lists `properties` and says nothing of
//!   `additionalProperties` (nor `unevaluatedProperties`) allows no other
//!   keys; one that lists none, or says `true` or a schema, is left as is;
//! - an `integer` with no bound on a side is bounded there by
//!   ±[`MAX_SAFE_INTEGER`] (16 digits, as llama.cpp caps its integers);
//! - a `number` with no bound on a side is bounded the same way, which caps
//!   its integer part at 16 digits and leaves out exponents; one with no
//!   `multipleOf` has its fraction kept to [`MAX_FRACTION_DIGITS`] digits.
//!
//! `allOf` is left as written: its branches (and the definitions they
//! `$ref`) describe parts of one object, and closing each would refuse the
//! others' keys. Nothing under `not` is touched, and a number with an
//! `enum` or `const` keeps its values.

use std::collections::HashSet;

use serde_json::{json, Map, Value};

/// The bound given to a side of an `integer` or `number` the schema leaves
/// open: 2^53 − 1, the largest integer every JSON reader (JavaScript's
/// included) holds exactly. It has 16 digits, llama.cpp's cap.
pub const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Digits a `number`'s fraction may have when the schema gives no
/// `multipleOf`. llama.cpp allows 16; this cap is a `multipleOf` of
/// 10^-10, the finest llguidance 1.9 takes (it reads `multipleOf` through
/// an f64, and 1e-11 is not one it can make exact).
pub const MAX_FRACTION_DIGITS: i32 = 10;

/// The schema with wick's rules applied (see the module's documentation);
/// what the schema already says is kept.
pub fn close_schema(schema: &Value) -> Value {
    let mut out = schema.clone();
    let keep_open = all_of_refs(schema);
    close(&mut out, &keep_open, false);
    out
}

/// The local definitions (`#/$defs/X`, `#/definitions/X`) an `allOf`
/// branch refers to: they are parts of an object, left open.
fn all_of_refs(schema: &Value) -> HashSet<String> {
    let mut refs = HashSet::new();
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                if let Some(Value::Array(branches)) = o.get("allOf") {
                    refs.extend(
                        branches
                            .iter()
                            .filter_map(|b| b.get("$ref")?.as_str().map(str::to_owned)),
                    );
                }
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    refs
}

/// Applies the rules to `v` and its subschemas; `part` marks an `allOf`
/// branch or a definition one refers to, whose own keys stay open.
fn close(v: &mut Value, keep_open: &HashSet<String>, part: bool) {
    let Value::Object(o) = v else { return };
    if !part && !o.contains_key("allOf") {
        close_object(o);
    }
    bound_numbers(o);
    for (key, sub) in o.iter_mut() {
        match key.as_str() {
            "properties" | "patternProperties" => {
                if let Value::Object(props) = sub {
                    for s in props.values_mut() {
                        close(s, keep_open, false);
                    }
                }
            }
            "$defs" | "definitions" => {
                if let Value::Object(defs) = sub {
                    for (name, s) in defs.iter_mut() {
                        let path = format!("#/{key}/{name}");
                        close(s, keep_open, keep_open.contains(&path));
                    }
                }
            }
            "items"
            | "prefixItems"
            | "additionalItems"
            | "additionalProperties"
            | "anyOf"
            | "oneOf" => match sub {
                Value::Array(list) => list.iter_mut().for_each(|s| close(s, keep_open, false)),
                s => close(s, keep_open, false),
            },
            "allOf" => {
                if let Value::Array(list) = sub {
                    list.iter_mut().for_each(|s| close(s, keep_open, true));
                }
            }
            _ => {}
        }
    }
}

/// `additionalProperties: false` for an object that lists its properties
/// and says nothing of others.
fn close_object(o: &mut Map<String, Value>) {
    let lists = o.get("properties").is_some_and(Value::is_object);
    let says = o.contains_key("additionalProperties") || o.contains_key("unevaluatedProperties");
    if lists && !says {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
}

/// Bounds an `integer` or `number` on each side the schema leaves open,
/// unless that would contradict the side it bounds.
fn bound_numbers(o: &mut Map<String, Value>) {
    let types: Vec<&str> = match o.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return,
    };
    let number = types.contains(&"number");
    if !(number || types.contains(&"integer")) || o.contains_key("enum") || o.contains_key("const")
    {
        return;
    }
    let limit = MAX_SAFE_INTEGER as f64;
    let bound = |o: &Map<String, Value>, k: &str| o.get(k).and_then(Value::as_f64);
    let low = bound(o, "minimum").or(bound(o, "exclusiveMinimum"));
    let high = bound(o, "maximum").or(bound(o, "exclusiveMaximum"));
    if low.is_none() && high.is_none_or(|h| h >= -limit) {
        o.insert("minimum".into(), json!(-MAX_SAFE_INTEGER));
    }
    if high.is_none() && low.is_none_or(|l| l <= limit) {
        o.insert("maximum".into(), json!(MAX_SAFE_INTEGER));
    }
    // Bounded, a number has no exponent; this caps what is left, its fraction.
    if number && !o.contains_key("multipleOf") {
        o.insert("multipleOf".into(), json!(10f64.powi(-MAX_FRACTION_DIGITS)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: i64 = MAX_SAFE_INTEGER;

    #[test]
    fn objects_that_list_properties_are_closed_everywhere() {
        let city = json!({"type": "object", "properties": {"name": {"type": "string"}}});
        let schema = json!({
            "type": "object",
            "properties": {
                "city": {"$ref": "#/$defs/City"},
                "nested": {"type": "object", "properties": {"a": {"type": "string"}}},
                "list": {"type": "array", "items": {"properties": {"b": {"type": "string"}}}},
                "tuple": {"type": "array", "prefixItems": [{"properties": {"c": {}}}]},
                "either": {"anyOf": [{"properties": {"d": {}}}, {"type": "null"}]},
                "one": {"oneOf": [{"properties": {"e": {}}}]},
            },
            "$defs": {"City": city.clone()},
            "definitions": {"Old": city},
        });
        let c = close_schema(&schema);
        let p = &c["properties"];
        for closed in [
            &c,
            &c["$defs"]["City"],
            &c["definitions"]["Old"],
            &p["nested"],
            &p["list"]["items"],
            &p["tuple"]["prefixItems"][0],
            &p["either"]["anyOf"][0],
            &p["one"]["oneOf"][0],
        ] {
            assert_eq!(closed["additionalProperties"], json!(false), "{closed}");
        }
        // Nothing else changed.
        let mut back = c.clone();
        let strip = |v: &mut Value| {
            v.as_object_mut().unwrap().remove("additionalProperties");
        };
        strip(&mut back);
        strip(&mut back["$defs"]["City"]);
        strip(&mut back["definitions"]["Old"]);
        for k in ["nested", "list", "tuple", "either", "one"] {
            let p = &mut back["properties"][k];
            match k {
                "nested" => strip(p),
                "list" => strip(&mut p["items"]),
                "tuple" => strip(&mut p["prefixItems"][0]),
                "either" => strip(&mut p["anyOf"][0]),
                _ => strip(&mut p["oneOf"][0]),
            }
        }
        assert_eq!(back, schema);
    }

    #[test]
    fn what_the_schema_says_is_kept() {
        for schema in [
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}),
            json!({"type": "object", "properties": {"a": {}},
                   "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}}),
            json!({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": false}),
            // No properties listed: any object, as llama.cpp reads it.
            json!({"type": "object"}),
            json!({"type": "integer", "minimum": 3, "maximum": 7}),
            json!({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1,
                   "multipleOf": 0.01}),
            json!({"type": "integer", "enum": [1, 1e20]}),
            json!({"type": "number", "const": 1.5}),
            json!({"not": {"type": "object", "properties": {"a": {}}}}),
            json!({"type": "string"}),
            json!(true),
        ] {
            assert_eq!(close_schema(&schema), schema);
        }
    }

    #[test]
    fn all_of_parts_stay_open() {
        let schema = json!({
            "properties": {"x": {"allOf": [{"$ref": "#/$defs/Base"},
                                           {"properties": {"extra": {}}}]}},
            "$defs": {"Base": {"properties": {"base": {}}},
                      "Other": {"properties": {"o": {}}}},
        });
        let c = close_schema(&schema);
        assert_eq!(c["additionalProperties"], json!(false));
        assert_eq!(c["$defs"]["Other"]["additionalProperties"], json!(false));
        assert_eq!(c["$defs"]["Base"].get("additionalProperties"), None);
        assert_eq!(c["properties"]["x"].get("additionalProperties"), None);
        assert_eq!(
            c["properties"]["x"]["allOf"][1].get("additionalProperties"),
            None
        );
    }

    #[test]
    fn numbers_are_bounded_on_their_open_sides() {
        let c = close_schema(&json!({"type": "integer"}));
        assert_eq!(
            c,
            json!({"type": "integer", "minimum": -MAX, "maximum": MAX})
        );
        assert_eq!(MAX.to_string().len(), 16);
        let c = close_schema(&json!({"type": ["integer", "null"], "minimum": 1}));
        assert_eq!(
            c,
            json!({"type": ["integer", "null"], "minimum": 1, "maximum": MAX})
        );
        let c = close_schema(&json!({"type": "integer", "exclusiveMaximum": 0}));
        assert_eq!(
            c,
            json!({"type": "integer", "exclusiveMaximum": 0, "minimum": -MAX})
        );
        // A bound past the cap is kept, the other side left open rather
        // than contradicted.
        let big = json!({"type": "integer", "minimum": 1e20});
        assert_eq!(close_schema(&big), big);
        let c = close_schema(&json!({"type": "number", "minimum": 0, "maximum": 1}));
        assert_eq!(c["multipleOf"], json!(1e-10));

        let c = close_schema(&json!({"type": "number"}));
        assert_eq!(
            c,
            json!({"type": "number", "minimum": -MAX, "maximum": MAX, "multipleOf": 1e-10})
        );
        let c = close_schema(&json!({"type": "number", "minimum": 0, "multipleOf": 0.5}));
        assert_eq!(
            c,
            json!({"type": "number", "minimum": 0, "multipleOf": 0.5, "maximum": MAX})
        );
    }
}
