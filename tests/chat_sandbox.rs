//! Chat templates rendered in the sandbox (a child process of the flashlm binary with a memory
//! limit and a deadline): the same text as an in-process render, the same typed errors, and
//! templates whose single filter would take unbounded time or memory stopped with a typed
//! error instead of hanging or killing the caller.

use std::time::{Duration, Instant};

mod common;

use flashlm::model::chat::{ChatError, ChatMessage, ChatTemplate, Sandbox};

const DEADLINE: Duration = Duration::from_secs(3);

fn sandbox() -> Sandbox {
    Sandbox::new(env!("CARGO_BIN_EXE_flashlm"))
        .memory(768 << 20)
        .time(DEADLINE)
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Héllo \"world\" \u{1F600}\nsecond line\\"),
        ChatMessage::assistant("Hi."),
        ChatMessage::user("{{ not a template }} {% neither %}"),
    ]
}

const LLAMA2: &str = "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set msgs = messages[1:] %}{% else %}{% set sys = false %}{% set msgs = messages %}{% endif %}\
{% for m in msgs %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}\
{% if loop.index0 == 0 and sys %}{% set c = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m['content'] %}{% else %}{% set c = m['content'] %}{% endif %}\
{% if m['role'] == 'user' %}{{ bos_token + '[INST] ' + c.strip() + ' [/INST]' }}{% else %}{{ ' ' + c.strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

#[test]
fn same_text_as_in_process() {
    for src in [flashlm::model::chat::CHATML_TEMPLATE, LLAMA2] {
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        for add in [false, true] {
            let here = t.render_here(&conversation(), add).unwrap();
            let t2 = ChatTemplate::new(src, "<s>", "</s>")
                .unwrap()
                .with_sandbox(sandbox());
            assert_eq!(t2.render(&conversation(), add).unwrap(), here);
        }
    }
}

#[test]
fn template_errors_come_back_typed() {
    let t = ChatTemplate::new(LLAMA2, "<s>", "</s>")
        .unwrap()
        .with_sandbox(sandbox());
    let bad = [ChatMessage::user("a"), ChatMessage::user("b")];
    match t.render(&bad, true) {
        Err(ChatError::Sandboxed(m)) => assert!(m.contains("must alternate"), "{m}"),
        other => panic!("expected the template's exception, got {other:?}"),
    }
    let looping =
        "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(looping, "", "")
        .unwrap()
        .with_sandbox(sandbox());
    assert!(matches!(
        t.render(&[ChatMessage::user("hi")], true),
        Err(ChatError::OutOfFuel { .. })
    ));
    let deep = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let t = ChatTemplate::new(deep, "", "")
        .unwrap()
        .with_sandbox(sandbox());
    assert!(matches!(
        t.render(&[ChatMessage::user("hi")], true),
        Err(ChatError::TooDeep { .. })
    ));
}

/// A list holding itself twice, doubled 32 times in 32 cheap steps (4 billion leaves), then
/// printed, serialized, joined or concatenated; a deep list serialized with indentation (text
/// quadratic in the depth); a list of a long string repeated millions of times in one step (a
/// lazy list, which costs no fuel until it is turned into text), then concatenated. In process
/// each of these runs for minutes or until memory runs out; the sandbox stops each at its
/// deadline or memory limit.
#[test]
fn unbounded_filters_are_stopped() {
    let dag = "{% set ns = namespace(x=[1]) %}{% for i in range(32) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}";
    let deep = "{% set ns = namespace(x=[]) %}{% for i in range(20000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    for src in [
        format!("{dag}{{{{ ns.x }}}}"),
        format!("{dag}{{{{ ns.x|tojson }}}}"),
        format!("{dag}{{{{ ns.x|string|length }}}}"),
        format!("{dag}{{{{ ns.x|join(',') }}}}"),
        format!("{dag}{{{{ (ns.x ~ '')|length }}}}"),
        format!("{deep}{{{{ ns.x|tojson(indent=8)|length }}}}"),
        format!(
            "{{{{ (['{}', 'b'] * 2415219 ~ 333)|length }}}}",
            "y".repeat(400)
        ),
    ] {
        let t = ChatTemplate::new(src.as_str(), "", "")
            .unwrap()
            .with_sandbox(sandbox());
        let start = Instant::now();
        let r = t.render(&[ChatMessage::user("hi")], true);
        let took = start.elapsed();
        eprintln!("{src}: {r:?} after {took:?}");
        match r {
            Err(ChatError::Limit(m)) => assert!(!m.is_empty()),
            Err(ChatError::OutOfFuel { .. }) => {}
            other => panic!("{src}: expected a stopped render, got {other:?}"),
        }
        assert!(took < DEADLINE * 3, "{src}: stopped after {took:?}");
    }
}

/// The chat_template fuzzer's input that used 2.4 GB in process (lists of a 400-byte string
/// repeated 2.4 million times, each turned into text by `~`) is stopped in the sandbox.
#[test]
fn the_fuzzer_input_that_ran_out_of_memory_is_stopped() {
    let f = common::chat_fixture("fuzz-oom-repeat-concat.bin");
    let t = ChatTemplate::new(f.template, "<s>", "</s>")
        .unwrap()
        .with_sandbox(sandbox());
    let start = Instant::now();
    let r = t.render(&f.messages, f.generation_prompt);
    let took = start.elapsed();
    match r {
        Err(ChatError::Limit(m)) => assert!(!m.is_empty()),
        Err(ChatError::OutOfFuel { .. }) => {}
        other => panic!("expected a stopped render, got {other:?}"),
    }
    assert!(took < DEADLINE * 3, "stopped after {took:?}");
}

#[test]
fn renders_run_side_by_side() {
    let t = std::sync::Arc::new(
        ChatTemplate::new(LLAMA2, "<s>", "</s>")
            .unwrap()
            .with_sandbox(sandbox()),
    );
    let want = t.render_here(&conversation()[1..], true).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || t.render(&conversation()[1..], true).unwrap())
        })
        .collect();
    for h in threads {
        assert_eq!(h.join().unwrap(), want);
    }
}

#[test]
fn a_missing_child_is_a_clear_error() {
    let t = ChatTemplate::new("{{ 1 }}", "", "")
        .unwrap()
        .with_sandbox(Sandbox::new("/nonexistent/flashlm-child"));
    match t.render(&[ChatMessage::user("hi")], true) {
        Err(ChatError::Sandbox(m)) => assert!(m.contains("/nonexistent/flashlm-child"), "{m}"),
        other => panic!("expected a sandbox error, got {other:?}"),
    }
}
