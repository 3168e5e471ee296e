//! Every walk over a value is paid for before it starts.
//!
//! minijinja charges fuel per instruction and for the values an instruction creates, but some
//! single instructions walk a whole value first: printing it (`{{ x }}`, `~`), converting it to
//! text for a filter, serializing it (`tojson`), comparing it (`==`, `<`, `in`, `sort`),
//! hashing it (a map key) or unpacking it. Values can be far larger than what they cost to
//! build: `[x] * n` repeats a list lazily for nothing, and a list holding another twice,
//! doubled thirty times in a loop, unfolds to a billion leaves. One such walk then took
//! minutes or all memory, in one instruction.
//!
//! This module closes that gap in two places:
//! - [`compile`] compiles the template with minijinja's own parser and code generator and puts
//!   a call to a guard function in front of each instruction that walks its operands (the
//!   comparisons, `in`, item lookups, map literals, unpacking, filters and tests other than
//!   a few that look at a value's surface only). The guard walks each operand once, at most as
//!   far as the remaining fuel could pay for, charges the walk, and hands the operands back
//!   unchanged; a walk that would cost more than the fuel left fails with `OutOfFuel`. `+`
//!   pays for what it may copy: minijinja concatenates sequences lazily, but copies a chain of
//!   more than 32 such sums into one list in one step (`a = a + a` 34 times asked for 6 GB
//!   at once).
//! - [`formatter`] does the same for everything printed or joined with `~`: a value other
//!   than a string or a number is formatted once into a counter that stops at the remaining
//!   fuel, before it is formatted for real.
//!
//! The guards' names start with [`RESERVED_PREFIX`], which templates may not use (so a
//! template cannot shadow them).

use std::collections::{BTreeMap, HashMap};

use minijinja::machinery::{CodeGenerator, Instruction, Instructions, parse};
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};

/// Names that start with this are flashlm's own (guards); a template that mentions one is
/// refused.
pub const RESERVED_PREFIX: &str = "__flashlm";

/// Walks one value, hands it back.
pub const GUARD_ONE: &str = "__flashlm_walk";
/// Walks its arguments, hands them back reversed (for `UnpackList`, which restores the order).
pub const GUARD_MANY: &str = "__flashlm_walk_many";
/// As [`GUARD_MANY`] for filter and test arguments: a string at the top is not walked
/// (minijinja charges a filter for the string it works on).
pub const GUARD_ARGS: &str = "__flashlm_walk_args";
/// As [`GUARD_MANY`] for the two operands of a comparison: two strings cost the shorter one's
/// length (a comparison reads at most that far).
pub const GUARD_PAIR: &str = "__flashlm_walk_pair";

/// Measures the text of its two arguments (as printing them would write it), hands them back
/// reversed: for `~`.
pub const GUARD_TEXT: &str = "__flashlm_measure_pair";

/// For an item lookup `[container, key]`: walks the key (it is hashed or compared) and pays
/// for a string container's length (indexing a string counts its characters), hands both back
/// reversed.
pub const GUARD_INDEX: &str = "__flashlm_walk_index";

/// For `+`: pays for what the sum builds (two sequences: an item each, as minijinja copies
/// them once a chain of lazy concatenations grows deep; two strings: their bytes), hands both
/// back reversed.
pub const GUARD_ADD: &str = "__flashlm_add_pair";

/// minijinja's fuel resolution: one fuel buys this many units (one unit is one byte).
const UNITS_PER_FUEL: u64 = 64;
/// Units a walk pays for each item of a list or map it visits (minijinja's own item cost).
const ITEM_UNITS: u64 = 32;

/// Filters that look at a value's surface only (its length, its first item, one attribute,
/// a number): their operands are not walked.
const SURFACE_FILTERS: &[&str] = &[
    "length", "count", "default", "d", "first", "attr", "bool", "abs", "round",
];

/// Tests that look at a value's type or a number only.
const SURFACE_TESTS: &[&str] = &[
    "defined",
    "undefined",
    "none",
    "safe",
    "escaped",
    "boolean",
    "odd",
    "even",
    "divisibleby",
    "number",
    "integer",
    "int",
    "float",
    "string",
    "sequence",
    "iterable",
    "mapping",
    "true",
    "false",
    "sameas",
    "callable",
    "filter",
    "test",
];

fn out_of_fuel() -> Error {
    Error::new(
        ErrorKind::OutOfFuel,
        "a value is larger than the fuel left can pay to walk",
    )
}

/// The units the render can still pay for (unlimited without fuel).
fn units_left(state: &State) -> u64 {
    state
        .fuel_levels()
        .map_or(u64::MAX, |(_, left)| left.saturating_mul(UNITS_PER_FUEL))
}

/// Pays for `units` of work (rounded up to whole fuel).
fn pay(state: &State, units: u64) -> Result<(), Error> {
    if units == 0 {
        return Ok(());
    }
    state.consume_fuel(units.div_ceil(UNITS_PER_FUEL))
}

fn is_container(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq | ValueKind::Map | ValueKind::Iterable
    )
}

/// What a walk of one container found: every item at every level below it.
#[derive(Clone, Copy, Default)]
struct Summary {
    /// [`ITEM_UNITS`] per item plus the bytes of the strings and one unit per other leaf.
    units: u64,
    items: u64,
    /// The items' depths summed (the container's own items are at depth 1).
    depth_sum: u64,
}

impl Summary {
    /// Adds a container found as an item one level down.
    fn add_child(&mut self, child: &Summary) {
        self.units = self.units.saturating_add(child.units);
        self.items = self.items.saturating_add(child.items);
        self.depth_sum = self
            .depth_sum
            .saturating_add(child.depth_sum)
            .saturating_add(child.items);
    }
    fn cost(&self, per_depth: u64) -> u64 {
        self.units
            .saturating_add(per_depth.saturating_mul(self.depth_sum))
    }
}

fn leaf_units(v: &Value) -> u64 {
    match v.kind() {
        ValueKind::String => v.as_str().map_or(0, |s| s.len() as u64),
        ValueKind::Bytes => v.as_bytes().map_or(0, |b| b.len() as u64),
        _ => 1,
    }
}

/// The address of a list's or map's data: the identity of an immutable container (None for
/// namespaces, lazy iterables and other objects).
pub(super) fn container_key(x: &Value) -> Option<usize> {
    if let Some(v) = x.downcast_object_ref::<Vec<Value>>() {
        return Some(v as *const Vec<Value> as usize);
    }
    x.downcast_object_ref::<BTreeMap<Value, Value>>()
        .map(|m| m as *const _ as usize)
}

/// One container being walked.
struct Frame {
    container: Value,
    key: Option<usize>,
    items: minijinja::value::ValueIter,
    /// Children of the current item still to walk (a map's value after its key).
    pending: Vec<Value>,
    found: Summary,
}

/// The units a full walk of `v` costs (each item [`ITEM_UNITS`] plus `per_depth` for each
/// level it is nested at, each byte of a string one), or `None` once it passes `budget`.
///
/// Lists and maps are immutable, so one met again (a list holding another twice) is counted
/// from what its first walk found instead of walked again: a value shared a billion times
/// over costs its full size but takes one step per distinct container. A container whose
/// length alone costs more than the budget fails without being walked (a list repeated
/// lazily). Otherwise the walk takes at most `budget / ITEM_UNITS` steps, and keeps an
/// explicit stack (values can nest hundreds of thousands deep).
pub fn walk_units(v: &Value, budget: u64, per_depth: u64) -> Option<u64> {
    if !is_container(v) {
        let units = leaf_units(v);
        return (units <= budget).then_some(units);
    }
    let mut steps = budget / ITEM_UNITS + 1;
    let mut seen: HashMap<usize, Summary> = HashMap::new();
    let open = |c: Value, key: Option<usize>| -> Option<Frame> {
        // Each item costs at least ITEM_UNITS: a length past the budget needs no walk.
        if c.len()
            .is_some_and(|n| (n as u64).saturating_mul(ITEM_UNITS) > budget)
        {
            return None;
        }
        let items = c.try_iter().ok()?;
        Some(Frame {
            container: c,
            key,
            items,
            pending: Vec::new(),
            found: Summary::default(),
        })
    };
    let mut stack = vec![open(v.clone(), container_key(v))?];
    loop {
        let top = stack.last_mut()?;
        let child = match top.pending.pop() {
            Some(child) => child,
            None => match top.items.next() {
                Some(item) => {
                    steps = steps.checked_sub(1)?;
                    top.found.units = top.found.units.saturating_add(ITEM_UNITS);
                    top.found.items += 1;
                    top.found.depth_sum += 1;
                    if top.container.kind() == ValueKind::Map {
                        top.pending
                            .push(top.container.get_item(&item).unwrap_or_default());
                    }
                    item
                }
                None => {
                    let done = stack.pop()?;
                    if let Some(key) = done.key {
                        seen.insert(key, done.found);
                    }
                    match stack.last_mut() {
                        Some(parent) => {
                            parent.found.add_child(&done.found);
                            if parent.found.cost(per_depth) > budget {
                                return None;
                            }
                            continue;
                        }
                        None => {
                            let cost = done.found.cost(per_depth);
                            return (cost <= budget).then_some(cost);
                        }
                    }
                }
            },
        };
        if !is_container(&child) {
            top.found.units = top.found.units.saturating_add(leaf_units(&child));
        } else {
            let key = container_key(&child);
            match key.and_then(|k| seen.get(&k)) {
                Some(known) => top.found.add_child(known),
                None => {
                    let frame = open(child, key)?;
                    stack.push(frame);
                    continue;
                }
            }
        }
        let top = stack.last()?;
        if top.found.cost(per_depth) > budget {
            return None;
        }
    }
}

/// Walks `v` (a string at the top only when `strings`), charging the walk; `OutOfFuel` when it
/// would cost more than the fuel left.
fn walk(state: &State, v: &Value, strings: bool) -> Result<(), Error> {
    if !(is_container(v) || strings && v.kind() == ValueKind::String) {
        return Ok(());
    }
    let units = walk_units(v, units_left(state), 0).ok_or_else(out_of_fuel)?;
    pay(state, units)
}

/// [`GUARD_ONE`].
pub fn guard_one(state: &State, v: Value) -> Result<Value, Error> {
    walk(state, &v, false)?;
    Ok(v)
}

/// Walks `args` and the values of `kwargs` (the keyword arguments of the call the guard stands
/// in front of), and hands them all back reversed, the keyword arguments (untouched, so still
/// keyword arguments) first.
fn walk_all(
    state: &State,
    args: Rest<Value>,
    kwargs: Kwargs,
    strings: bool,
) -> Result<Value, Error> {
    for v in args.iter() {
        walk(state, v, strings)?;
    }
    let mut out = args.0;
    if kwargs.args().next().is_some() {
        for key in kwargs.args() {
            walk(state, &kwargs.peek::<Value>(key)?, strings)?;
        }
        out.push(Value::from(kwargs));
    }
    out.reverse();
    Ok(Value::from(out))
}

/// [`GUARD_MANY`].
pub fn guard_many(state: &State, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    walk_all(state, args, kwargs, true)
}

/// [`GUARD_ARGS`].
pub fn guard_args(state: &State, args: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    walk_all(state, args, kwargs, false)
}

/// [`GUARD_PAIR`].
pub fn guard_pair(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    match (a.as_str(), b.as_str()) {
        (Some(x), Some(y)) => pay(state, x.len().min(y.len()) as u64)?,
        _ => {
            walk(state, &a, false)?;
            walk(state, &b, false)?;
        }
    }
    Ok(Value::from(vec![b, a]))
}

/// `tojson`, paid for first: indented JSON puts `indent` spaces per level before every item,
/// so its text can grow with the square of the nesting depth (or with a huge `indent`).
fn tojson(
    state: &State,
    value: Value,
    indent: Option<Value>,
    args: Kwargs,
) -> Result<Value, Error> {
    let width = match indent
        .clone()
        .map_or_else(|| args.get::<Option<Value>>("indent"), |v| Ok(Some(v)))?
    {
        None => 0,
        Some(v) => match bool::try_from(v.clone()) {
            Ok(true) => 2,
            Ok(false) => 0,
            Err(_) => u64::try_from(v).unwrap_or(u64::MAX),
        },
    };
    let units = walk_units(&value, units_left(state), width).ok_or_else(out_of_fuel)?;
    pay(state, units)?;
    minijinja::filters::tojson(&value, indent, args)
}

/// [`GUARD_INDEX`].
pub fn guard_index(state: &State, container: Value, key: Value) -> Result<Value, Error> {
    walk(state, &key, false)?;
    if let Some(s) = container.as_str() {
        pay(state, s.len() as u64)?;
    }
    Ok(Value::from(vec![key, container]))
}

/// [`GUARD_TEXT`].
pub fn guard_text(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    measure(state, &a)?;
    measure(state, &b)?;
    Ok(Value::from(vec![b, a]))
}

/// [`GUARD_ADD`].
pub fn guard_add(state: &State, a: Value, b: Value) -> Result<Value, Error> {
    let seq = |v: &Value| matches!(v.kind(), ValueKind::Seq | ValueKind::Iterable);
    if seq(&a) && seq(&b) {
        let items = items_within(&a, state)?.saturating_add(items_within(&b, state)?);
        pay(state, items.saturating_mul(ITEM_UNITS))?;
    } else if let (Some(x), Some(y)) = (a.as_str(), b.as_str()) {
        pay(state, (x.len() as u64).saturating_add(y.len() as u64))?;
    }
    Ok(Value::from(vec![b, a]))
}

/// The items of a sequence: its length, or for one without a length, its items counted as far
/// as the fuel left could pay for them.
fn items_within(v: &Value, state: &State) -> Result<u64, Error> {
    if let Some(n) = v.len() {
        return Ok(n as u64);
    }
    let most = units_left(state) / ITEM_UNITS;
    let mut n = 0u64;
    for _ in v.try_iter()? {
        n += 1;
        if n > most {
            return Err(out_of_fuel());
        }
    }
    Ok(n)
}

/// Adds the guard functions (and the paid-for `tojson`) to an environment.
pub fn add_guards(env: &mut minijinja::Environment<'_>) {
    env.add_function(super::unfold::FOLD_STOP, || 1u32);
    env.add_filter("tojson", tojson);
    env.add_function(GUARD_ONE, guard_one);
    env.add_function(GUARD_MANY, guard_many);
    env.add_function(GUARD_ARGS, guard_args);
    env.add_function(GUARD_PAIR, guard_pair);
    env.add_function(GUARD_TEXT, guard_text);
    env.add_function(GUARD_INDEX, guard_index);
    env.add_function(GUARD_ADD, guard_add);
}

/// Pays for a walk of `value` before its text is built or it is hashed: the walk's
/// [`ITEM_UNITS`] per item cover the separators and the text of a number, and its byte per
/// string byte covers a string's text up to its escapes (a control character prints as up to
/// six). Strings and numbers at the top are not walked (their text is no larger than they
/// are).
pub fn measure(state: &State, value: &Value) -> Result<(), Error> {
    walk(state, value, false)
}

/// The text of `value` (as `{{ value }}` would print it), paid for before it is built.
pub fn text_of(state: &State, value: &Value) -> Result<String, Error> {
    measure(state, value)?;
    Ok(value.to_string())
}

/// The environment's formatter: a value other than a string or a number is walked and the walk
/// charged ([`measure`]) before minijinja's own formatter writes it.
pub fn formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    measure(state, value)?;
    minijinja::escape_formatter(out, state, value)
}

/// The guard call put in front of `instr`, if it walks its operands: (function, operand
/// count).
fn guard_for(instr: &Instruction<'_>) -> Option<(&'static str, u16)> {
    Some(match instr {
        Instruction::Eq
        | Instruction::Ne
        | Instruction::Lt
        | Instruction::Lte
        | Instruction::Gt
        | Instruction::Gte
        | Instruction::In
        | Instruction::CompareAndPreserve(_) => (GUARD_PAIR, 2),
        Instruction::StringConcat => (GUARD_TEXT, 2),
        Instruction::Add => (GUARD_ADD, 2),
        Instruction::GetItem => (GUARD_INDEX, 2),
        Instruction::UnpackList(_) => (GUARD_ONE, 1),
        Instruction::UnpackLists(n) => (GUARD_ARGS, u16::try_from(*n).ok()?),
        Instruction::BuildMap(n) => (GUARD_MANY, u16::try_from(n.checked_mul(2)?).ok()?),
        Instruction::ApplyFilter(name, Some(n), _) if !SURFACE_FILTERS.contains(name) => {
            (GUARD_ARGS, *n)
        }
        Instruction::PerformTest(name, Some(n), _) if !SURFACE_TESTS.contains(name) => {
            (GUARD_MANY, *n)
        }
        // `loop.changed(...)` compares its arguments with the last turn's.
        Instruction::CallMethod("changed", Some(n)) => (GUARD_MANY, *n),
        _ => return None,
    })
}

/// A copy of `code` with the guard calls inserted and every jump target moved with them.
fn guard_instructions<'s>(
    code: &Instructions<'s>,
    name: &'s str,
    source: &'s str,
) -> Result<Instructions<'s>, Error> {
    let old: Vec<&Instruction<'s>> = (0..).map_while(|i| code.get(i)).collect();
    // A guard takes at most u16::MAX operands: a map literal or a splat past that would go
    // unguarded, so it is refused (no chat template comes near).
    if old.iter().any(|i| match i {
        Instruction::BuildMap(n) => n.saturating_mul(2) > u16::MAX as usize,
        Instruction::UnpackLists(n) => *n > u16::MAX as usize,
        _ => false,
    }) {
        return Err(Error::new(
            ErrorKind::SyntaxError,
            format!("a map literal or call has more than {} parts", u16::MAX / 2),
        ));
    }
    // Where each old instruction (and the end) lands: its guard, when it has one, comes first.
    let mut moved = Vec::with_capacity(old.len() + 1);
    let mut at = 0u32;
    for instr in &old {
        moved.push(at);
        at += match guard_for(instr) {
            Some((_, n)) if n > 1 => 3,
            Some(_) => 2,
            None => 1,
        };
    }
    moved.push(at);
    let to = |target: &u32| moved.get(*target as usize).copied().unwrap_or(at);
    let mut out = Instructions::new(name, source);
    for (i, instr) in old.iter().enumerate() {
        let i = i as u32;
        let mut add = |instr: Instruction<'s>| match code.get_span(i) {
            Some(span) => out.add_with_span(instr, span),
            None => out.add_with_line(instr, code.get_line(i).unwrap_or(0) as u16),
        };
        if let Some((guard, n)) = guard_for(instr) {
            // One operand needs no unpacking: the guard that hands back its argument.
            let guard = if n == 1 { GUARD_ONE } else { guard };
            add(Instruction::CallFunction(guard, Some(n)));
            if n > 1 {
                add(Instruction::UnpackList(n as usize));
            }
        }
        add(match instr {
            Instruction::Jump(t) => Instruction::Jump(to(t)),
            Instruction::JumpIfFalse(t) => Instruction::JumpIfFalse(to(t)),
            Instruction::JumpIfFalseOrPop(t) => Instruction::JumpIfFalseOrPop(to(t)),
            Instruction::JumpIfTrueOrPop(t) => Instruction::JumpIfTrueOrPop(to(t)),
            Instruction::Iterate(t) => Instruction::Iterate(to(t)),
            Instruction::BuildMacro(m, t, flags) => Instruction::BuildMacro(m, to(t), *flags),
            other => (*other).clone(),
        });
    }
    Ok(out)
}

/// A compiled template with its guards: the root instructions and the blocks.
pub type Compiled<'s> = (Instructions<'s>, BTreeMap<&'s str, Instructions<'s>>);

/// Parses and compiles `source` with minijinja's parser and code generator, then guards it.
pub fn compile<'s>(
    name: &'s str,
    source: &'s str,
    syntax: SyntaxConfig,
) -> Result<Compiled<'s>, Error> {
    let ast = parse(source, name, syntax)?;
    let mut codegen = CodeGenerator::new(name, source);
    codegen.compile_stmt(&ast);
    let (root, blocks) = codegen.finish();
    let root = guard_instructions(&root, name, source)?;
    let blocks = blocks
        .into_iter()
        .map(|(block, code)| Ok((block, guard_instructions(&code, name, source)?)))
        .collect::<Result<_, Error>>()?;
    Ok((root, blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_container_costs_what_its_copies_cost() {
        let inner = || Value::from(vec![Value::from(1), Value::from("ab")]);
        let shared = inner();
        let two_of_one = Value::from(vec![shared.clone(), shared]);
        let two_copies = Value::from(vec![inner(), inner()]);
        // 6 items (2 at depth 1, 4 at depth 2) of 32 units, leaves 1 + 2 twice.
        for v in [&two_of_one, &two_copies] {
            assert_eq!(walk_units(v, u64::MAX, 0), Some(6 * 32 + 6));
            assert_eq!(
                walk_units(v, u64::MAX, 8),
                Some(6 * 32 + 6 + 8 * (2 + 4 * 2))
            );
            assert_eq!(walk_units(v, 6 * 32 + 5, 0), None);
            assert_eq!(walk_units(v, 6 * 32 + 6, 0), Some(6 * 32 + 6));
        }
        // A map: each entry one item, its key and value leaves.
        let map: BTreeMap<Value, Value> = [(Value::from("k"), Value::from("vvv"))].into();
        assert_eq!(walk_units(&Value::from(map), u64::MAX, 0), Some(32 + 1 + 3));
        // A string at the top is its bytes; a number one unit.
        assert_eq!(walk_units(&Value::from("abcd"), u64::MAX, 0), Some(4));
        assert_eq!(walk_units(&Value::from(7), 0, 0), None);
    }
}
