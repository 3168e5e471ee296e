//! Namespaces that cannot hold themselves.
//!
//! A namespace is the one mutable value of a template, and `{% set ns.a = ns %}` (or a list,
//! map or namespace that leads back to `ns`) makes it contain itself. minijinja then recurses
//! without bound wherever it walks the value (printing, `~`, `tojson`, `string`, `sort`, `==`,
//! hashing it as a map key): fuel is not charged there, so the thread overflows its stack and
//! the process aborts. Every other value is immutable, so a cycle can only be closed by such an
//! assignment: the target of `{% set x.attr = value %}` is reached from `value`.
//!
//! [`guard_assignments`] rewrites the source so that each such statement passes its value
//! through [`GUARD`] first: `{% set ns.a = v %}` becomes `{% set ns.a = GUARD([ns], v) %}`,
//! which fails with a typed error when `v` reaches `ns` (and returns `v` otherwise). The scan
//! uses minijinja's own lexer, so strings, comments and raw blocks are never touched; a
//! source that does not lex is left as it is, for the compiler to report. The block form
//! (`{% set ns.a %}...{% endset %}`) assigns rendered text and needs no guard.

use minijinja::machinery::{Token, tokenize};
use minijinja::syntax::SyntaxConfig;
use minijinja::tests::is_sameas;
use minijinja::value::{Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind};

use super::bounded::container_key;

/// The guard's name in templates.
pub const GUARD: &str = "__flashlm_acyclic";

/// Values [`acyclic`] may visit in one render (all its assignments together); past that the
/// render fails. The walk is not charged fuel, so this bounds its time.
pub const MAX_VISITS: usize = 10_000_000;

thread_local! {
    static VISITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Lists and maps of this render known to hold no namespace, by address (each kept alive).
    static SAFE: std::cell::RefCell<std::collections::HashMap<usize, Value>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Starts a render's visit budget and forgets the last render's containers (renders run on
/// one thread, start to end).
pub fn start_render() {
    VISITS.with(|v| v.set(0));
    SAFE.with(|s| s.borrow_mut().clear());
}

/// The source with every `{% set <dotted target(s)> = value %}` guarded (see the module docs).
pub fn guard_assignments(source: &str, syntax: SyntaxConfig) -> String {
    let mut tokens = Vec::new();
    for t in tokenize(source, false, syntax) {
        match t {
            Ok((tok, span)) => {
                tokens.push((tok, span.start_offset as usize, span.end_offset as usize))
            }
            Err(_) => return source.to_string(),
        }
    }
    // (offset, text) insertions, in source order.
    let mut inserts: Vec<(usize, String)> = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let is_set = matches!(tokens[i].0, Token::BlockStart)
            && matches!(tokens.get(i + 1).map(|t| &t.0), Some(Token::Ident("set")));
        if !is_set {
            i += 1;
            continue;
        }
        // The targets: up to `=` (else a block set: nothing to guard).
        let start = i + 2;
        let Some(assign) = (start..tokens.len())
            .find(|&k| matches!(tokens[k].0, Token::Assign | Token::BlockEnd | Token::Pipe))
        else {
            break;
        };
        let Some(end) = (assign..tokens.len()).find(|&k| matches!(tokens[k].0, Token::BlockEnd))
        else {
            break;
        };
        if matches!(tokens[assign].0, Token::Assign) {
            let objects = dotted_objects(source, &tokens[start..assign]);
            if !objects.is_empty() && assign + 1 < end {
                let value_start = tokens[assign + 1].1;
                let value_end = tokens[end - 1].2;
                inserts.push((value_start, format!("{GUARD}([{}], ", objects.join(", "))));
                inserts.push((value_end, ")".to_string()));
            }
        }
        i = end + 1;
    }
    if inserts.is_empty() {
        return source.to_string();
    }
    let mut out = String::with_capacity(source.len() + 64 * inserts.len());
    let mut at = 0;
    for (offset, text) in inserts {
        // Offsets come from the lexer in source order; anything else leaves the source as it
        // is (for the compiler to judge).
        let Some(piece) = source.get(at..offset) else {
            return source.to_string();
        };
        out.push_str(piece);
        out.push_str(&text);
        at = offset;
    }
    out.push_str(&source[at..]);
    out
}

/// The objects assigned into by a target list: for each comma-separated item with a dot, its
/// text up to the last dot (`ns` of `ns.a`, `ns.a` of `ns.a.b`).
fn dotted_objects(source: &str, targets: &[(Token<'_>, usize, usize)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut item_start: Option<usize> = None;
    let mut last_dot: Option<usize> = None;
    let mut flush = |item_start: &mut Option<usize>, last_dot: &mut Option<usize>| {
        if let (Some(a), Some(d)) = (item_start.take(), last_dot.take())
            && let Some(text) = source.get(a..d)
            && !text.trim().is_empty()
        {
            out.push(text.to_string());
        }
    };
    for (tok, a, _) in targets {
        match tok {
            Token::Comma | Token::ParenOpen | Token::ParenClose => {
                flush(&mut item_start, &mut last_dot)
            }
            // A dot counts once the item has begun (`.a` is not a target the compiler takes).
            Token::Dot if item_start.is_some() => last_dot = Some(*a),
            Token::Dot => {}
            _ => {
                if item_start.is_none() {
                    item_start = Some(*a);
                }
            }
        }
    }
    flush(&mut item_start, &mut last_dot);
    out
}

/// The guard: `values` unchanged (a list when there are several, as a tuple assignment
/// unpacks), unless one of them reaches one of `targets`.
pub fn acyclic(targets: Vec<Value>, values: Rest<Value>) -> Result<Value, Error> {
    let mut visits = VISITS.with(|v| v.get());
    let found = values
        .iter()
        .try_fold(false, |found, v| -> Result<bool, Error> {
            if found {
                return Ok(true);
            }
            for t in &targets {
                if reaches(v, t, &mut visits)? {
                    return Ok(true);
                }
            }
            Ok(false)
        });
    VISITS.with(|v| v.set(visits));
    if found? {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "this assignment would make a namespace contain itself",
        ));
    }
    Ok(match values.len() {
        1 => values[0].clone(),
        _ => Value::from(values.0),
    })
}

/// Whether `target` (an object) is `v` or can be reached from it through lists, maps,
/// namespaces and other iterables.
fn reaches(v: &Value, target: &Value, visits: &mut usize) -> Result<bool, Error> {
    if target.as_object().is_none() {
        return Ok(false);
    }
    let mut stack = vec![v.clone()];
    let mut seen: Vec<Value> = Vec::new();
    while let Some(x) = stack.pop() {
        if is_sameas(&x, target) {
            return Ok(true);
        }
        if !matches!(
            x.kind(),
            ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
        ) {
            continue;
        }
        let key = container_key(&x);
        if key.is_some_and(|k| SAFE.with(|s| s.borrow().contains_key(&k))) {
            continue;
        }
        if key.is_none() {
            // Lazy sequences and other objects have no address to look up: each comparison
            // with the ones met before counts as a visit (else a chain of them assigned again
            // and again costs the cube of its length).
            *visits = visits.saturating_add(seen.len());
            if *visits > MAX_VISITS {
                return Err(too_many_parts());
            }
            if seen.iter().any(|s| is_sameas(s, &x)) {
                continue;
            }
        }
        // The children; a list or map whose children are all plain values or lists and maps
        // already known to hold no namespace holds none either, for good (it cannot change).
        let mut all_safe = true;
        for c in children(&x) {
            *visits += 1;
            if *visits > MAX_VISITS {
                return Err(too_many_parts());
            }
            let leaf = !matches!(
                c.kind(),
                ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
            );
            let safe = leaf
                || container_key(&c).is_some_and(|k| SAFE.with(|s| s.borrow().contains_key(&k)));
            if !safe {
                all_safe = false;
                stack.push(c);
            } else if is_sameas(&c, target) {
                return Ok(true);
            }
        }
        match key {
            Some(k) if all_safe => {
                // The clone keeps the address from being reused within the render.
                SAFE.with(|s| s.borrow_mut().insert(k, x.clone()));
            }
            Some(_) => {}
            None => seen.push(x),
        }
    }
    Ok(false)
}

fn too_many_parts() -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("values of more than {MAX_VISITS} parts assigned into namespaces"),
    )
}

/// Items of a sequence or iterable; keys and values of a map (at most `MAX_VISITS + 1`).
fn children(x: &Value) -> Vec<Value> {
    let Ok(items) = x.try_iter() else {
        return Vec::new();
    };
    let map = x.kind() == ValueKind::Map;
    let mut out = Vec::new();
    for item in items.take(MAX_VISITS + 1) {
        if map {
            out.push(x.get_item(&item).unwrap_or_default());
        }
        out.push(item);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guarded(src: &str) -> String {
        guard_assignments(src, SyntaxConfig::default())
    }

    #[test]
    fn only_dotted_assignments_are_guarded() {
        assert_eq!(
            guarded("{% set ns.a = x %}"),
            format!("{{% set ns.a = {GUARD}([ns], x) %}}")
        );
        assert_eq!(
            guarded("{%- set ns.a.b = x | trim -%}"),
            format!("{{%- set ns.a.b = {GUARD}([ns.a], x | trim) -%}}")
        );
        assert_eq!(
            guarded("{% set a, ns.b = 1, 2 %}"),
            format!("{{% set a, ns.b = {GUARD}([ns], 1, 2) %}}")
        );
        for same in [
            "{% set x = ns %}",
            "{% set ns.a %}text{% endset %}",
            "{% raw %}{% set ns.a = ns %}{% endraw %}",
            "{{ '{% set ns.a = ns %}' }}",
            "{# {% set ns.a = ns %} #}",
            "{% set ns.a = ",
            "{% set .a = ns %}",
            "{% set (.a).b = ns %}",
            "{% set ., ns = 1 %}",
        ] {
            assert_eq!(guarded(same), same);
        }
    }
}
