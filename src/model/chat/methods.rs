//! The functions and Python methods chat templates call (`raise_exception`, `strip`,
//! `startswith`, `items`, ...). Those whose result can be much larger than their inputs pay
//! fuel for it before building it.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, ErrorKind, State};

use super::bounded;

/// Charges the render for about `bytes` bytes it is about to create.
fn charge(state: &State, bytes: usize) -> Result<(), Error> {
    state.consume_fuel((bytes / 64) as u64 + 1)
}

/// `raise_exception(message)`: templates call it to reject a conversation.
pub(super) fn raise_exception(state: &State, message: Value) -> Result<Value, Error> {
    let message = bounded::text_of(state, &message)?;
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

fn arg_str(args: &[Value], i: usize) -> Option<&str> {
    args.get(i).and_then(Value::as_str)
}

fn wrong_args(method: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("wrong arguments to .{method}()"),
    )
}

/// Python methods that chat templates call on strings and dicts.
pub(super) fn python_method(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        return string_method(state, s, method, args);
    }
    if value.kind() == ValueKind::Map {
        return map_method(state, value, method, args);
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

/// String methods. Those whose result can be much larger than their inputs (`replace`,
/// `split`, `join`) pay for it before building it.
fn string_method(state: &State, s: &str, method: &str, args: &[Value]) -> Result<Value, Error> {
    let strip_chars = |args: &[Value]| -> Option<Vec<char>> {
        arg_str(args, 0).map(|c| c.chars().collect::<Vec<char>>())
    };
    let prefix_test = |args: &[Value], f: &dyn Fn(&str) -> bool| -> Result<Value, Error> {
        let Some(arg) = args.first() else {
            return Err(wrong_args(method));
        };
        if let Some(p) = arg.as_str() {
            return Ok(Value::from(f(p)));
        }
        // A tuple or list of alternatives.
        for item in arg.try_iter()? {
            if item.as_str().is_some_and(f) {
                return Ok(Value::from(true));
            }
        }
        Ok(Value::from(false))
    };
    Ok(match method {
        "strip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_matches(&c[..]),
            None => s.trim(),
        }),
        "lstrip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_start_matches(&c[..]),
            None => s.trim_start(),
        }),
        "rstrip" => Value::from(match strip_chars(args) {
            Some(c) => s.trim_end_matches(&c[..]),
            None => s.trim_end(),
        }),
        "startswith" => return prefix_test(args, &|p| s.starts_with(p)),
        "endswith" => return prefix_test(args, &|p| s.ends_with(p)),
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "capitalize" => {
            let mut chars = s.chars();
            Value::from(match chars.next() {
                Some(first) => first
                    .to_uppercase()
                    .chain(chars.flat_map(char::to_lowercase))
                    .collect(),
                None => String::new(),
            })
        }
        "title" => {
            let mut out = String::with_capacity(s.len());
            let mut prev_cased = false;
            for c in s.chars() {
                if prev_cased {
                    out.extend(c.to_lowercase());
                } else {
                    out.extend(c.to_uppercase());
                }
                prev_cased = c.is_alphabetic();
            }
            Value::from(out)
        }
        "replace" => {
            let (Some(old), Some(new)) = (arg_str(args, 0), arg_str(args, 1)) else {
                return Err(wrong_args(method));
            };
            let limit = match args.get(2).and_then(|v| i64::try_from(v.clone()).ok()) {
                Some(n) if n >= 0 => usize::try_from(n).unwrap_or(usize::MAX),
                _ => usize::MAX,
            };
            // An empty pattern matches before every character and at the end.
            let matches = if old.is_empty() {
                s.chars().count().saturating_add(1)
            } else {
                s.matches(old).count()
            }
            .min(limit);
            charge(
                state,
                s.len().saturating_add(matches.saturating_mul(new.len())),
            )?;
            Value::from(s.replacen(old, new, limit))
        }
        "split" => {
            let sep = arg_str(args, 0);
            let n = match sep {
                Some("") => return Err(wrong_args(method)),
                Some(sep) => s.matches(sep).count().saturating_add(1),
                None => s.split_whitespace().count(),
            };
            charge(
                state,
                s.len()
                    .saturating_add(n.saturating_mul(std::mem::size_of::<Value>())),
            )?;
            let parts: Vec<Value> = match sep {
                Some(sep) => s.split(sep).map(Value::from).collect(),
                None => s.split_whitespace().map(Value::from).collect(),
            };
            Value::from(parts)
        }
        "join" => {
            let Some(items) = args.first() else {
                return Err(wrong_args(method));
            };
            let mut out = String::new();
            for (i, v) in items.try_iter()?.enumerate() {
                let part = bounded::text_of(state, &v)?;
                let sep = if i > 0 { s } else { "" };
                charge(state, sep.len().saturating_add(part.len()))?;
                out.push_str(sep);
                out.push_str(&part);
            }
            Value::from(out)
        }
        "find" => {
            let Some(needle) = arg_str(args, 0) else {
                return Err(wrong_args(method));
            };
            Value::from(match s.find(needle) {
                Some(byte) => s[..byte].chars().count() as i64,
                None => -1,
            })
        }
        "count" => {
            let Some(needle) = arg_str(args, 0) else {
                return Err(wrong_args(method));
            };
            if needle.is_empty() {
                Value::from(s.chars().count() + 1)
            } else {
                Value::from(s.matches(needle).count())
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}

fn map_method(state: &State, map: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    Ok(match method {
        "items" => {
            let mut pairs = Vec::new();
            for key in map.try_iter()? {
                let v = map.get_item(&key)?;
                pairs.push(Value::from(vec![key, v]));
            }
            Value::from(pairs)
        }
        "keys" => Value::from(map.try_iter()?.collect::<Vec<Value>>()),
        "values" => {
            let mut values = Vec::new();
            for key in map.try_iter()? {
                values.push(map.get_item(&key)?);
            }
            Value::from(values)
        }
        "get" => {
            let Some(key) = args.first() else {
                return Err(wrong_args(method));
            };
            bounded::measure(state, key)?;
            let v = map.get_item(key)?;
            if v.is_undefined() {
                args.get(1).cloned().unwrap_or(Value::from(()))
            } else {
                v
            }
        }
        _ => return Err(Error::from(ErrorKind::UnknownMethod)),
    })
}
