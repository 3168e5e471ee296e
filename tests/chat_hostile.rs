//! Malicious chat templates: each fails quickly with a typed error, and none reaches outside
//! the render.

use std::time::{Duration, Instant};

mod common;

use flashlm::model::chat::{
    CHATML_TEMPLATE, ChatError, ChatMessage, ChatTemplate, MAX_TEMPLATE_BYTES, RECURSION_LIMIT,
};

/// A hang guard, not a speed test: fuel bounds every render here. Most run out in
/// milliseconds; a list rebuilt each loop turn (`ns.l + [j]`, each turn copying the list) is
/// quadratic in the fuel, about a second on the 2-core VM, more on a loaded one (2.4 s seen).
const BOUND: Duration = Duration::from_secs(15);

fn render(src: &str) -> Result<String, ChatError> {
    let t = ChatTemplate::new(src, "<s>", "</s>")?;
    let start = Instant::now();
    let r = t.render(&[ChatMessage::user("hi")], true);
    assert!(
        start.elapsed() < BOUND,
        "{src:?} took {:?}",
        start.elapsed()
    );
    r
}

fn out_of_fuel(src: &str) {
    match render(src) {
        Err(ChatError::OutOfFuel { fuel }) => assert!(fuel > 0),
        other => panic!("{src:?}: expected OutOfFuel, got {other:?}"),
    }
}

#[test]
fn endless_loops_run_out_of_fuel() {
    out_of_fuel("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
    out_of_fuel(
        "{% for a in range(100000) %}{% for b in range(100000) %}{{ a }}{% endfor %}{% endfor %}",
    );
    // Loops over a list that keeps being rebuilt.
    out_of_fuel(
        "{% set ns = namespace(l=[1]) %}{% for i in range(100000) %}{% for j in range(100000) %}\
         {% set ns.l = ns.l + [j] %}{% endfor %}{% endfor %}",
    );
}

#[test]
fn huge_strings_run_out_of_fuel_before_they_exist() {
    out_of_fuel("{{ 'x' * 1000000000000 }}");
    out_of_fuel("{{ ('x' * 100000) * 100000 }}");
    // Doubling: 2^100 bytes after 100 steps.
    out_of_fuel(
        "{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s | length }}",
    );
    // Methods whose output dwarfs their input.
    out_of_fuel("{% set s = 'a' * 100000 %}{{ s.replace('a', s) | length }}");
    out_of_fuel("{% set s = 'a' * 100000 %}{{ s.replace('', s) | length }}");
    out_of_fuel("{{ ('x' * 100000).join(range(100000)) | length }}");
    out_of_fuel("{{ (',' * 1000000).split(',') | length }}");
    out_of_fuel("{{ ('ab' * 100000) | replace('a', 'x' * 100000) | length }}");
    out_of_fuel(
        "{{ range(100000) | list | tojson | length }}{{ range(100000) | join('x' * 1000) }}",
    );
}

#[test]
fn deep_recursion_fails_with_a_typed_error() {
    // Test threads have small stacks: the limit must bite long before the stack does.
    for src in [
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "{% macro f(n) %}{% for i in [1] %}{% if true %}{{ f(n) }}{% endif %}{% endfor %}{% endmacro %}{{ f(0) }}",
        "{% for x in [[1]] recursive %}{{ loop([[x]]) }}{% endfor %}",
    ] {
        match render(src) {
            Err(ChatError::TooDeep { limit }) => assert_eq!(limit, RECURSION_LIMIT),
            other => panic!("{src:?}: expected TooDeep, got {other:?}"),
        }
    }
    // Deeply nested syntax is refused when compiling.
    let nested = format!("{{{{ {}1{} }}}}", "(".repeat(5000), ")".repeat(5000));
    assert!(matches!(render(&nested), Err(ChatError::Syntax(_))));
    let nested = format!(
        "{}x{}",
        "{% if true %}".repeat(5000),
        "{% endif %}".repeat(5000)
    );
    assert!(matches!(render(&nested), Err(ChatError::Syntax(_))));
}

#[test]
fn no_way_out_of_the_template() {
    // Loading other templates does not exist, whatever the name.
    for src in [
        "{% include '/etc/passwd' %}",
        "{% include 'chat_template' %}",
        "{% import '/etc/passwd' as p %}",
        "{% from '/etc/passwd' import x %}",
        "{% extends '/etc/passwd' %}",
    ] {
        match ChatTemplate::new(src, "", "") {
            Err(ChatError::Syntax(_)) => {}
            other => panic!("{src:?}: expected a syntax error, got {other:?}"),
        }
    }
    // No function or filter reads files, the environment or runs programs.
    for src in [
        "{{ open('/etc/passwd') }}",
        "{{ env('HOME') }}",
        "{{ ''.__class__ }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ self.__init__ }}",
        "{{ lipsum() }}",
        "{{ '/etc/passwd' | read }}",
    ] {
        match render(src) {
            Err(ChatError::Render(_) | ChatError::Syntax(_)) => {}
            Ok(out) => assert!(!out.contains("root:"), "{src:?} -> {out:?}"),
            Err(e) => panic!("{src:?}: {e}"),
        }
    }
}

#[test]
fn oversized_templates_are_refused() {
    let src = "x".repeat(MAX_TEMPLATE_BYTES + 1);
    assert!(matches!(
        ChatTemplate::new(src, "", ""),
        Err(ChatError::TooLarge { len, max }) if len == MAX_TEMPLATE_BYTES + 1 && max == MAX_TEMPLATE_BYTES
    ));
    assert!(ChatTemplate::new("x".repeat(MAX_TEMPLATE_BYTES), "", "").is_ok());
}

#[test]
fn real_conversations_stay_within_budget() {
    let t = ChatTemplate::new(CHATML_TEMPLATE, "", "<|im_end|>").unwrap();
    // A 4 MB message: the budget grows with the input.
    let big = "word ".repeat(800_000);
    let out = t.render(&[ChatMessage::user(big.clone())], true).unwrap();
    assert!(out.contains(&big));
    // A long conversation.
    let turns = conversation_of(2000);
    let out = t.render(&turns, true).unwrap();
    assert!(out.contains("answer 1999"));
    // Fuel is per render: an exhausted render does not starve the next one.
    let greedy = ChatTemplate::new(
        "{% if messages[0].content == 'spin' %}{% for a in range(100000) %}{% for b in range(100000) %}\
         {% endfor %}{% endfor %}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    assert!(matches!(
        greedy.render(&[ChatMessage::user("spin")], false),
        Err(ChatError::OutOfFuel { .. })
    ));
    assert_eq!(
        greedy.render(&[ChatMessage::user("x")], false).unwrap(),
        "ok"
    );
}

/// Values nested as deep as the fuel lets a template build them (a list in a list, 20 000
/// deep) print, compare and serialize quickly or fail with a typed error; the filter whose
/// output grows with the square of the depth (`pprint`) does not exist. (`tojson(indent=N)`
/// also grows with the square of the depth: only the sandbox bounds it, see chat_sandbox.rs.)
#[test]
fn deeply_nested_values_stay_cheap() {
    let deep = "{% set ns = namespace(x=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    for expr in [
        "ns.x",
        "ns.x|tojson",
        "ns.x|string|length",
        "ns.x == ns.x",
        "ns.x < ns.x",
        "[ns.x]|unique|length",
        "ns.x|indent(4)",
    ] {
        let src = format!("{deep}{{{{ {expr} }}}}");
        match render(&src) {
            Ok(_) | Err(ChatError::OutOfFuel { .. }) => {}
            Err(e) => panic!("{expr}: {e}"),
        }
    }
    // pprint is gone (it indents its whole text without paying fuel).
    let err = render("{{ [[[1]]]|pprint }}").unwrap_err();
    assert!(err.to_string().contains("pprint"), "{err}");
}

#[test]
fn a_namespace_cannot_contain_itself() {
    // Each would make a namespace reach itself; printing, comparing, serializing or hashing
    // it would then recurse until the stack overflows and the process aborts.
    let ns = "{% set ns = namespace(a=1) %}{% set o = namespace() %}";
    for (set, use_) in [
        ("{% set ns.n = ns %}", "{{ ns }}"),
        ("{% set ns.n = [ns] %}", "{{ ns ~ '' }}"),
        ("{% set ns.n = [1, [ns]]|reverse %}", "{{ ns|tojson }}"),
        ("{% set ns.n = dict(k=ns) %}", "{{ ns == ns }}"),
        ("{% set o.x = ns %}{% set ns.y = [o] %}", "{{ {ns: 1} }}"),
        (
            "{% set ns.k = namespace() %}{% set ns.k.z = ns %}",
            "{{ [ns, ns]|sort }}",
        ),
        ("{%- set a, ns.b = 1, ns -%}", "{{ ns|string }}"),
        (
            "{% for m in [ns] %}{% set ns.m = [m]|select %}{% endfor %}",
            "{{ ns }}",
        ),
    ] {
        let src = format!("{ns}{set}{use_}");
        match render(&src) {
            Err(ChatError::Render(e)) => {
                assert!(e.to_string().contains("contain itself"), "{src:?}: {e}")
            }
            other => panic!("{src:?}: expected a render error, got {other:?}"),
        }
    }
    // Namespaces holding other values, or other namespaces without a way back, still work.
    let ok = format!(
        "{ns}{{% set ns.flag = true %}}{{% set ns.s = 'x' ~ ns.a %}}{{% set o.inner = ns %}}\
         {{% set ns.t %}}text{{% endset %}}{{% set ns.p, ns.q = 1, 2 %}}\
         {{{{ ns.flag }}}} {{{{ ns.s }}}} {{{{ o.inner.t }}}} {{{{ ns.p + ns.q }}}}"
    );
    assert_eq!(render(&ok).unwrap(), "True x1 text 3");
}

/// A fixture in the chat_template fuzz target's input format: a flags byte, then the template
/// and the messages, NUL-separated.
fn fuzz_fixture(name: &str) -> (Result<ChatTemplate, ChatError>, Vec<ChatMessage>, bool) {
    let f = common::chat_fixture(name);
    let t = ChatTemplate::new(f.template, "<s>", "</s>");
    (t, f.messages, f.generation_prompt)
}

#[test]
fn a_set_with_a_stray_dot_is_a_syntax_error() {
    // `{% set. snn = ... %}` made the assignment scan slice the source backwards (a panic the
    // fuzzer found in the namespace guard).
    let (t, _, _) = fuzz_fixture("fuzz-set-dot.bin");
    assert!(matches!(t, Err(ChatError::Syntax(_))), "{t:?}");
}

#[test]
fn the_fuzzer_input_that_overflowed_the_stack_is_a_typed_error() {
    // It sets `ns.n = ns` in a loop and prints it.
    let (t, messages, gen_prompt) = fuzz_fixture("fuzz-cyclic-namespace.bin");
    let t = t.unwrap();
    match t.render_here(&messages, gen_prompt) {
        Err(ChatError::Render(e)) => assert!(e.to_string().contains("contain itself"), "{e}"),
        other => panic!("expected a render error, got {other:?}"),
    }
}

#[test]
fn the_fuzzer_input_that_timed_out_ends_in_a_typed_error() {
    // `['a','b'] * 2415219 ~ 333`: a list repeated to millions of items in one instruction,
    // then printed; fuel does not bound that single step (4.2 s in process on the 2-core VM;
    // `chat` and `serve` render in the sandbox, which has a deadline). It must end, typed.
    fixture_fails_within("fuzz-slow-repeat.bin", Duration::from_secs(120));
}

/// The fuzz fixture `name` compiles, and its render fails within `bound`.
fn fixture_fails_within(name: &str, bound: Duration) {
    let (t, messages, gen_prompt) = fuzz_fixture(name);
    let t = t.unwrap();
    let start = Instant::now();
    let r = t.render_here(&messages, gen_prompt);
    assert!(r.is_err(), "{:?}", r.map(|s| s.len()));
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());
}

/// Values far larger than they cost to build (a list holding another twice, doubled forty
/// times; a list repeated lazily a hundred million times) fail with a typed error in this
/// process, quickly, wherever a single instruction would walk them: printing, `~`, filters,
/// serializing, comparing, hashing, unpacking, methods.
#[test]
fn walks_over_cheaply_built_values_are_paid_for() {
    let dags = "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}\
                {% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}";
    let deep = "{% set ns = namespace(x=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    let lazy = "{% set big = [1, 'b'] * 50000000 %}";
    let cases = [
        format!("{dags}{{{{ ns.x }}}}"),
        format!("{dags}{{{{ (ns.x ~ '')|length }}}}"),
        format!("{dags}{{{{ ns.x|tojson }}}}"),
        format!("{dags}{{{{ ns.x|string|length }}}}"),
        format!("{dags}{{{{ ns.x|join(',') }}}}"),
        format!("{dags}{{{{ ns.x|lower }}}}"),
        format!("{dags}{{{{ '%s'|format(ns.x) }}}}"),
        format!("{dags}{{{{ ns.x|replace('1', '2') }}}}"),
        format!("{dags}{{{{ ns.x == ns.y }}}}"),
        format!("{dags}{{{{ ns.x != ns.y }}}}"),
        format!("{dags}{{{{ ns.x < ns.y }}}}"),
        format!("{dags}{{{{ ns.x < ns.y < 3 }}}}"),
        format!("{dags}{{{{ ns.x in [ns.y] }}}}"),
        format!("{dags}{{{{ ns.x is eq ns.y }}}}"),
        format!("{dags}{{{{ {{ns.x: 1}}|length }}}}"),
        format!("{dags}{{{{ {{}}[ns.x] }}}}"),
        format!("{dags}{{{{ [ns.x, ns.y]|sort|length }}}}"),
        format!("{dags}{{{{ [ns.x, ns.y]|unique|list|length }}}}"),
        format!("{dags}{{{{ [{{'a': ns.x}}]|selectattr('a', 'equalto', ns.y)|list|length }}}}"),
        format!("{dags}{{{{ [ns.x]|map('string')|list|length }}}}"),
        format!("{dags}{{% for i in range(3) %}}{{{{ loop.changed(ns.x) }}}}{{% endfor %}}"),
        format!("{dags}{{{{ ','.join([ns.x]) }}}}"),
        format!("{dags}{{{{ messages[0].get(ns.x) }}}}"),
        format!("{dags}{{{{ raise_exception(ns.x) }}}}"),
        format!("{deep}{{{{ ns.x|tojson(indent=8)|length }}}}"),
        "{{ [[1]]|tojson(indent=1000000000000) }}".to_string(),
        format!("{lazy}{{{{ big ~ '' }}}}"),
        format!("{lazy}{{{{ big }}}}"),
        format!("{lazy}{{{{ big|list|length }}}}"),
        format!("{lazy}{{{{ big|sort|length }}}}"),
        format!("{lazy}{{{{ big|tojson|length }}}}"),
        format!("{lazy}{{% set a, b = big %}}"),
        format!("{lazy}{{{{ 2 in big }}}}"),
        // Indexing a string counts its characters: a long one indexed in a loop.
        "{% set s = 'a' * 4000000 %}{% for i in range(100000) %}{{ s[-1] }}{% endfor %}"
            .to_string(),
        format!(
            "{{{{ (['{}', 'b'] * 2415219 ~ 333)|length }}}}",
            "y".repeat(400)
        ),
    ];
    for src in &cases {
        let start = Instant::now();
        let r = render(src);
        eprintln!(
            "{src}: {:?} after {:?}",
            r.as_ref().map(|s| s.len()),
            start.elapsed()
        );
        match r {
            Err(ChatError::OutOfFuel { .. }) | Err(ChatError::Render(_)) => {}
            other => panic!("{src}: expected a typed error, got {other:?}"),
        }
    }
}

/// The guards hand every operand back unchanged: comparisons (chained too), `in`, lookups,
/// map literals, unpacking, filters with keyword arguments and tests give what they always
/// gave.
#[test]
fn guarded_operations_keep_their_meaning() {
    let src = "{% set a, b = [1, 'x'] %}{{ a }}{{ b }}|{{ 1 < 2 < 3 }}{{ 3 < 2 < 1 }}|\
{{ 'ell' in 'hello' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}|\
{{ {'a': 1, 'b': [2]}['b'][0] }}|{{ [3, 1, 2]|sort|join(',') }}|\
{{ {'z': 1, 'a': 2}|dictsort|first|first }}|{{ [1, 2]|tojson }}|{{ {'a': [1]}|tojson(indent=2) }}|\
{{ 'aXaXa'|replace('a', 'b', count=2) }}|{{ [1, 1, 2]|unique|list|length }}|\
{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ 2 is eq 2 }}{{ 'a' is lt 'b' }}|\
{% for m in messages %}{{ loop.changed(m.role) }}{% endfor %}|{{ [1, [2, 'q']] }}|{{ [1] ~ 'z' }}|\
{{ messages[0]['content'] }}{{ messages[0]['role'] }}|{{ '%s-%s'|format(1, 'x') }}|\
{{ ['a', 'b']|map('upper')|join }}|{{ (1, 2) == (1, 2) }}{{ [1, 2] == [1, 2] }}|\
{{ 2 * 3 }}{{ 'ab' * 2 }}{{ [1] * 2 }}{{ 2 * [1] }}{{ 7 / 2 * 2 }}{{ 2 * 3 / 4 }}{{ -2 * 3 }}{{ (1, 2) * 2 }}|\
{% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ m(*[1, 2]) }}{{ m(*([3] * 2)) }}";
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let out = t
        .render(
            &[ChatMessage::user("hi"), ChatMessage::user("again")],
            false,
        )
        .unwrap();
    assert_eq!(
        out,
        "1x|TrueFalse|TrueTrueTrueTrue|2|1,2,3|a|[1, 2]|{\n  \"a\": [\n    1\n  ]\n}|bXbXa|2|2|\
TrueTrue|TrueFalse|[1, [2, 'q']]|[1]z|hiuser|1-x|AB|TrueTrue|6abab[1, 1][1, 1]7.01.5-6(1, 2, 1, 2)|\
1233"
    );
    // The same as minijinja renders it without flashlm's guards.
    let want = plain_render(src, &[ChatMessage::user("hi"), ChatMessage::user("again")]);
    assert_eq!(out, want);
}

/// `src` rendered by minijinja itself, without flashlm's guards (the same syntax settings).
fn plain_render(src: &str, conversation: &[ChatMessage]) -> String {
    let mut plain = minijinja::Environment::new();
    plain.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .unwrap(),
    );
    plain.add_template("t", src).unwrap();
    let messages: Vec<_> = conversation
        .iter()
        .map(|m| minijinja::context! { role => m.role.clone(), content => m.content.clone() })
        .collect();
    plain
        .get_template("t")
        .unwrap()
        .render(minijinja::context! { messages => messages })
        .unwrap()
}

/// Control flow survives the guards (every jump target moves with the instructions put in
/// front of it): loops with `loop.*`, `break`/`continue`, `else`, recursion, macros with
/// `caller`, `filter` and `with` blocks, block sets, inline and chained `if`s, all
/// rendered as plain minijinja renders them.
#[test]
fn control_flow_renders_as_plain_minijinja() {
    let src = "{% macro row(m, i) %}[{{ i }}:{{ m.role }}={{ m.content|trim }}]{% endmacro %}\
{% macro wrap() %}<{{ caller() }}>{% endmacro %}\
{% for m in messages if m.role != 'system' %}{% if loop.index0 == 1 %}{% continue %}{% endif %}\
{{ row(m, loop.index) }}{{ loop.cycle('a', 'b') }}{% if loop.last %}!{% elif m.role == 'user' %}?{% else %}.{% endif %}\
{% if loop.index > 3 %}{% break %}{% endif %}{% else %}none{% endfor %}|\
{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|\
{% call wrap() %}{{ messages|length }}{% endcall %}|\
{% set ns = namespace(n=0, seen=[]) %}{% for m in messages %}{% if m.role == 'user' and m.content not in ns.seen %}\
{% set ns.n = ns.n + 1 %}{% set ns.seen = ns.seen + [m.content] %}{% endif %}{% endfor %}{{ ns.n }}{{ ns.seen|join('/') }}|\
{% for item in tree recursive %}({{ item.name }}{% if item.kids %}{{ loop(item.kids) }}{% endif %}){% endfor %}|\
{% filter upper %}{{ 'shout' }}{% endfilter %}|{% with a = 3, b = [1, 2] %}{{ a in b }}{{ a * 2 }}{% endwith %}|\
{% set block %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ block ~ block }}|\
{{ 'yes' if messages[0].role == 'system' else 'no' }}{{ (1 if 2 > 1) }}{{ 2 is not eq 3 }}|\
{% for m in messages[::-1] %}{{ m.content[:2] }}{% endfor %}|\
{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% if not loop.last %},{% endif %}{% endfor %}|\
{% for k, v in {'x': [1], 'y': [2, 3]}|dictsort %}{{ k }}{{ v|length }}{% endfor %}";
    let conversation = [
        ChatMessage::system(" sys "),
        ChatMessage::user("one"),
        ChatMessage::assistant("two"),
        ChatMessage::user("one"),
        ChatMessage::assistant("three"),
        ChatMessage::user("four"),
        ChatMessage::user("five"),
    ];
    let tree = "[{'name': 'r', 'kids': [{'name': 'a', 'kids': []}, {'name': 'b', 'kids': [{'name': 'c'}]}]}]";
    let full = format!("{{% set tree = {tree} %}}{src}");
    let t = ChatTemplate::new(full.as_str(), "<s>", "</s>").unwrap();
    let out = t.render(&conversation, false).unwrap();
    let want = plain_render(&full, &conversation);
    assert_eq!(out, want);
    assert!(out.contains("(r(a)(b(c)))"), "{out}");
}

/// minijinja folds constant expressions while it compiles, without fuel: a list repeated
/// lazily a hundred million times, then printed, joined with `~`, compared or searched, was all
/// built or walked at compile time. Products are no longer folded, so these fail with a typed
/// error at render time, quickly (compiling included).
#[test]
fn constant_expressions_are_not_folded_past_the_fuel() {
    let y = "y".repeat(400);
    for src in [
        format!("{{{{ (['{y}', 'b'] * 2415219 ~ 333)|length }}}}"),
        "{{ [1] * 100000000 == [1] * 100000000 }}".to_string(),
        "{{ 2 in [1] * 100000000 }}".to_string(),
        "{{ ([1] * 100000000 ~ '')|length }}".to_string(),
        "{{ [1, 2] * 50000000 }}".to_string(),
    ] {
        let start = Instant::now();
        let t = ChatTemplate::new(src.as_str(), "", "").unwrap();
        match t.render(&[ChatMessage::user("hi")], true) {
            Err(ChatError::OutOfFuel { .. }) => {}
            other => panic!("{src}: expected OutOfFuel, got {other:?}"),
        }
        assert!(start.elapsed() < BOUND, "{src}: {:?}", start.elapsed());
    }
}

/// A guard takes at most 65 535 operands: a map literal past that is refused, not left
/// unguarded.
#[test]
fn oversized_map_literals_are_refused() {
    // (Not constant, so not folded: the first key is a variable.)
    let entries: Vec<String> = (0..40_000).map(|i| format!("{i}: 0")).collect();
    let src = format!(
        "{{% set x = -1 %}}{{{{ {{x: 0, {}}}|length }}}}",
        entries.join(", ")
    );
    assert!(matches!(
        ChatTemplate::new(src.as_str(), "", ""),
        Err(ChatError::Syntax(_))
    ));
    let entries: Vec<String> = (0..1000).map(|i| format!("{i}: 0")).collect();
    let src = format!(
        "{{% set x = -1 %}}{{{{ {{x: 0, {}}}|length }}}}",
        entries.join(", ")
    );
    assert_eq!(render(&src).unwrap(), "1001");
}

/// flashlm's own helpers cannot be named (and so shadowed) by a template.
#[test]
fn reserved_names_are_refused() {
    for src in [
        "{% set __flashlm_walk = 1 %}",
        "{% macro __flashlm_walk_pair(a, b) %}{% endmacro %}",
        "{{ __flashlm_acyclic }}",
    ] {
        match ChatTemplate::new(src, "", "") {
            Err(ChatError::Reserved { name, .. }) => {
                assert!(name.starts_with("__flashlm"), "{name}")
            }
            other => panic!("{src}: expected Reserved, got {other:?}"),
        }
    }
    // `debug()` (which prints every value in reach without paying) is gone.
    assert!(matches!(render("{{ debug() }}"), Err(ChatError::Render(_))));
}

/// `+` of two sequences is lazy in minijinja until a chain of such sums is more than 32 deep,
/// when it copies the whole chain into one list in one instruction: `a = a + a` thirty-four
/// times asked for 6 GB at once and aborted the process. `+` now pays for the items it may
/// copy (and two strings for their bytes), so doubling runs out of fuel, quickly.
#[test]
fn sums_that_double_run_out_of_fuel() {
    for (start, n) in [
        ("[0]", 34),
        ("[0, 1]", 60),
        ("'ab'", 60),
        ("(range(3)|list)", 40),
    ] {
        let src = format!(
            "{{% set a = {start} %}}{}{{{{ a|length }}}}",
            "{% set a = a + a %}".repeat(n)
        );
        out_of_fuel(&src);
    }
    out_of_fuel(
        "{% set ns = namespace(x=[1]) %}{% for i in range(64) %}{% set ns.x = ns.x + ns.x %}{% endfor %}",
    );
}

/// The fuzzer's input that took 16 s: lists of lazy sums nested a thousand deep, assigned into
/// a namespace again and again. The namespace guard compared each lazy sum with all those met
/// before (they have no address to look up), the cube of the chain's length in all; the
/// comparisons now count against its visit budget, so this ends typed, quickly.
#[test]
fn chains_of_lazy_sums_assigned_into_namespaces_end_quickly() {
    fixture_fails_within("fuzz-namespace-chains.bin", Duration::from_secs(5));
    let src = "{% set ns = namespace(x=[1]) %}{% for i in range(1681) %}{% set ns.x = [ns.x + ns.x] %}{% endfor %}";
    let start = Instant::now();
    assert!(render(src).is_err());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// `+` gives what it always gave: numbers, strings, lists, tuples, lists grown message by
/// message in a namespace over a long conversation, and sums of lazy sums.
#[test]
fn sums_keep_their_meaning() {
    let src = "{{ 1 + 2 }}{{ 1.5 + 2 }}{{ 'a' + 'b' }}{{ [1] + [2, 3] }}{{ (1,) + (2,) }}|\
{% set ns = namespace(all=[], text='') %}{% for m in messages %}{% set ns.all = ns.all + [m.content] %}\
{% set ns.text = ns.text + m.role[0] %}{% endfor %}{{ ns.all|length }} {{ ns.all[-1] }} {{ ns.text|length }}|\
{% set a = [1] + [2] %}{% set b = a + a %}{{ (b + b)|list }}{{ (b + [])|length }}";
    let conversation = conversation_of(400);
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let out = t.render(&conversation, false).unwrap();
    assert_eq!(out, plain_render(src, &conversation));
    assert!(out.contains("|400 answer 399 400|"), "{out}");
}

/// `n` messages, questions and answers in turn.
fn conversation_of(n: usize) -> Vec<ChatMessage> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                ChatMessage::user(format!("question {i}"))
            } else {
                ChatMessage::assistant(format!("answer {i}"))
            }
        })
        .collect()
}
