//! Python's `str()` of template values, which Jinja2 prints for `{{ x }}`
//! and the `string` filter: `None`, `True`, `1e+16`, and lists and dicts as
//! their `repr` (`['a', 1]`). minijinja would print `none`, `true`, `1e16`
//! and `["a", 1]`, and templates feed such text to the model (Qwen3-Coder
//! writes tool arguments with `| string`).

use std::fmt::Write;

use minijinja::value::{Value, ValueKind};

/// `str(value)`; an undefined value prints as nothing, as Jinja2's does.
pub fn py_str(value: &Value) -> String {
    match value.as_str() {
        Some(s) if value.kind() == ValueKind::String => s.to_string(),
        _ if value.is_undefined() => String::new(),
        _ => {
            let mut out = String::new();
            repr(value, &mut out);
            out
        }
    }
}

fn repr(value: &Value, out: &mut String) {
    match value.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number if !value.is_integer() => match f64::try_from(value.clone()) {
            Ok(x) => out.push_str(&float_repr(x)),
            Err(_) => write_display(value, out),
        },
        ValueKind::String => string_repr(value.as_str().unwrap_or_default(), out),
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            for (i, item) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&item, out);
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter().into_iter().flatten().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                repr(&key, out);
                out.push_str(": ");
                repr(&value.get_item(&key).unwrap_or_default(), out);
            }
            out.push('}');
        }
        _ => write_display(value, out),
    }
}

fn write_display(value: &Value, out: &mut String) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{value}");
}

/// Python's `repr(float)`: the shortest digits that read back the same,
/// positional from 1e-4 up to 1e16 (always with a fraction, `2.0`), else
/// scientific with a signed exponent of at least two digits (`1e-05`).
pub fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest digits: `-1.5e16`, `1e-5`, `0e0`.
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if !(-4..16).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let point = exp + 1; // digits before the decimal point
    let body = if point <= 0 {
        format!("0.{}{digits}", "0".repeat(point.unsigned_abs() as usize))
    } else {
        let point = point as usize;
        if digits.len() <= point {
            format!("{digits}{}.0", "0".repeat(point - digits.len()))
        } else {
            format!("{}.{}", &digits[..point], &digits[point..])
        }
    };
    format!("{sign}{body}")
}

/// Python's `repr(str)`: single quotes unless the text has `'` and no `"`;
/// backslash escapes for the quote, `\`, `\t\n\r`, and non-printable
/// characters (controls and the invisible spaces and format characters
/// that Python's `isprintable` rejects).
fn string_repr(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let n = c as u32;
                let _ = match n {
                    0..=0xff => write!(out, "\\x{n:02x}"),
                    0x100..=0xffff => write!(out, "\\u{n:04x}"),
                    _ => write!(out, "\\U{n:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable` for one character: false for the controls,
/// separators other than space, format characters and private use. These
/// are Python 3.11's (Unicode 14) assigned ones; unassigned code points,
/// which Python also escapes, print as they are.
fn is_printable(c: char) -> bool {
    !matches!(c as u32,
        0x00..=0x1f | 0x7f..=0xa0 | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f
        | 0x890..=0x891 | 0x8e2 | 0x1680 | 0x180e | 0x2000..=0x200f | 0x2028..=0x202f
        | 0x205f..=0x2064 | 0x2066..=0x206f | 0x3000 | 0xe000..=0xf8ff | 0xfeff
        | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x13438 | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..=0xffffd
        | 0x100000..=0x10fffd)
}

#[cfg(test)]
mod tests {
    use super::float_repr;

    #[test]
    fn float_repr_matches_python() {
        // Values and repr() from CPython 3.11.
        for (x, want) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (2.0, "2.0"),
            (1.5, "1.5"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (-2.5e-7, "-2.5e-07"),
            (1e300, "1e+300"),
            (f64::INFINITY, "inf"),
        ] {
            assert_eq!(float_repr(x), want, "{x}");
        }
    }
}
