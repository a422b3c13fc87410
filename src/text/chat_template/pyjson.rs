//! The `tojson` filter as transformers defines it: Python's `json.dumps`
//! with `ensure_ascii=False` by default and its `indent`, `separators`,
//! `ensure_ascii` and `sort_keys` options. Templates write tool schemas and
//! call arguments with it, so its spacing, escapes, key order and float
//! format reach the prompt.

use std::fmt::Write;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::pystr::float_repr;

pub fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let flag = |name| -> Result<bool, Error> {
        Ok(kwargs
            .get::<Option<Value>>(name)?
            .is_some_and(|v| v.is_true()))
    };
    let ensure_ascii = flag("ensure_ascii")?;
    let sort_keys = flag("sort_keys")?;
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match (v.as_str(), v.as_i64()) {
            (Some(s), _) => s.to_string(),
            (None, Some(n)) => " ".repeat(n.max(0) as usize),
            _ => {
                return Err(bad_arg(format!(
                    "indent must be an int or a string, not {v}"
                )))
            }
        }),
    };
    let separators = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => Some((
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                )),
                _ => return Err(bad_arg("separators must be two strings".into())),
            }
        }
        _ => None,
    };
    kwargs.assert_all_used()?;
    // Python's defaults: no space before a newline when indenting.
    let (item_sep, key_sep) = separators.unwrap_or_else(|| {
        let item = if indent.is_some() { "," } else { ", " };
        (item.to_string(), ": ".to_string())
    });
    let dumper = Dumper {
        ensure_ascii,
        sort_keys,
        indent,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    dumper.value(value, 0, &mut out)?;
    Ok(Value::from(out))
}

fn bad_arg(message: String) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {message}"))
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::BadSerialization,
        format!("Object of type {} is not JSON serializable", value.kind()),
    )
}

struct Dumper {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

impl Dumper {
    fn value(&self, value: &Value, depth: usize, out: &mut String) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => out.push_str(&number(value)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default(), out),
            ValueKind::Seq => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.container(('[', ']'), &items, depth, out, |item, out| {
                    self.value(item, depth + 1, out)
                })?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.container(('{', '}'), &keys, depth, out, |key, out| {
                    self.string(&key_text(key)?, out);
                    out.push_str(&self.key_sep);
                    self.value(&value.get_item(key)?, depth + 1, out)
                })?;
            }
            _ => return Err(not_serializable(value)),
        }
        Ok(())
    }

    /// `open item sep item close`; with `indent`, each item on its own line
    /// one level in and the closing bracket back on the parent's level.
    fn container(
        &self,
        (open, close): (char, char),
        items: &[Value],
        depth: usize,
        out: &mut String,
        mut write_item: impl FnMut(&Value, &mut String) -> Result<(), Error>,
    ) -> Result<(), Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &self.indent {
                out.push('\n');
                out.push_str(&indent.repeat(level));
            }
        };
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            newline(out, depth + 1);
            write_item(item, out)?;
        }
        newline(out, depth);
        out.push(close);
        Ok(())
    }

    fn string(&self, s: &str, out: &mut String) {
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
                c if c < ' ' || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
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
}

/// Python's JSON numbers: integers as they are, floats as `repr` (`1e+16`),
/// and NaN and the infinities as JavaScript names them.
fn number(value: &Value) -> String {
    if value.is_integer() {
        return value.to_string();
    }
    match f64::try_from(value.clone()) {
        Ok(x) if x.is_nan() => "NaN".into(),
        Ok(x) if x.is_infinite() => if x > 0.0 { "Infinity" } else { "-Infinity" }.into(),
        Ok(x) => float_repr(x),
        Err(_) => value.to_string(),
    }
}

/// Object keys: Python turns None, booleans and numbers into strings.
fn key_text(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::None => Ok("null".into()),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.into()),
        ValueKind::Number => Ok(number(key)),
        kind => Err(Error::new(
            ErrorKind::BadSerialization,
            format!("keys must be str, int, float, bool or None, not {kind}"),
        )),
    }
}
