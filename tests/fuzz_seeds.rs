//! Seed corpora for the fuzz targets under `fuzz/`.
//!
//! `FLASHLM_FUZZ_SEEDS=fuzz/seeds cargo test --test fuzz_seeds` writes one folder per target
//! (see `fuzz/README.md`); without the variable the test only checks that the seeds build.

use std::path::Path;

use flashlm::gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

/// SmolLM2-Instruct's template, as stored in its GGUF.
const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A Llama-2 style template: variables, slicing, methods, raise_exception, whitespace control.
const LLAMA2: &str = "{% if messages[0]['role'] == 'system' %}{% set system = '<<SYS>>\\n' + messages[0]['content'].strip() + '\\n<</SYS>>\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set system = '' %}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{- raise_exception('Conversation roles must alternate') }}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + (system if loop.first else '') + message['content'].strip() + ' [/INST]' }}{% else %}{{ ' ' + message['content'].strip() + ' ' + eos_token }}{% endif %}{% endfor %}";

/// Macros, namespaces, filters and loops, as tool-calling templates use them.
const TOOLS: &str = "{% macro render(m) %}{{ m['role'] | upper }}: {{ m['content'] | trim }}{% endmacro %}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{{ render(m) }}{% if not loop.last %}\n{% endif %}{% endfor %}{{ ns.n }}{{ messages | map(attribute='role') | join(',') }}{% for k, v in messages[0].items() %}{{ k }}={{ v | tojson }}{% endfor %}{{ 'x'.join(['a','b']) }}{{ 'a b'.split() | length }}{{ 'abc'.replace('b', 'B') }}";

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn gguf_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, ty) in [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::F16]
        .into_iter()
        .enumerate()
    {
        let spec = SyntheticSpec {
            n_layers: 1,
            ..SyntheticSpec::tiny(ty)
        };
        out.push((
            format!("synthetic-{i}.gguf"),
            synthetic_llama(&spec, i as u64),
        ));
    }
    let mut w = GgufWriter::new();
    w.meta("general.alignment", MetaValue::U32(16))
        .meta("b", MetaValue::Bool(true))
        .meta("f", MetaValue::F64(0.5))
        .meta("s", MetaValue::Array(vec!["a", "<|im_start|>"].into()))
        .meta(
            "nested",
            MetaValue::Array(flashlm::gguf::MetaArray::Array(vec![
                vec![1u16, 2].into(),
                vec![-1i64].into(),
            ])),
        )
        .tensor_f32("x", &[32, 1], GgmlType::Q4_0, &[0.25; 32])
        .tensor_f32("y", &[2, 2], GgmlType::BF16, &[1.0, 2.0, 3.0, 4.0]);
    out.push(("kinds.gguf".into(), w.to_bytes()));
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile");
    for e in std::fs::read_dir(fixtures).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "gguf") {
            let name = format!("hostile-{}", p.file_name().unwrap().to_string_lossy());
            out.push((name, std::fs::read(&p).unwrap()));
        }
    }
    // The head of the default model: its header, metadata and part of its tokenizer.
    if let Ok(bytes) = std::fs::read(flashlm::paths::default_model_path()) {
        out.push(("default-model-head.gguf".into(), bytes[..1 << 20].to_vec()));
    }
    out
}

fn tokenizer_seeds() -> Vec<(String, Vec<u8>)> {
    let texts = [
        "The capital of France is",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "héllo wörld 🌍 ∑ 日本語 \u{0}\u{7f}\u{2581}",
        "   leading and trailing   ",
        "1234567 I'M 'll",
        "<|im_sta<|im_start|<tool>",
    ];
    let mut out = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        // Mode byte: tokenizer in the high bits, encode (0, 1) or decode (2, 3) in the low ones.
        for sel in [0u8, 1, 4, 5, 8, 9] {
            let mut b = vec![sel];
            b.extend_from_slice(t.as_bytes());
            out.push((format!("text-{i}-{sel}"), b));
        }
        let mut b = vec![2u8];
        for id in 0..(t.len() as u32) {
            b.extend_from_slice(&(id * 7).to_le_bytes());
        }
        out.push((format!("ids-{i}"), b));
    }
    out
}

fn chat_seeds() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, src) in [
        ("smollm2", SMOLLM2),
        ("chatml", flashlm::model::chat::CHATML_TEMPLATE),
        ("llama2", LLAMA2),
        ("tools", TOOLS),
    ] {
        let mut b = vec![1u8];
        b.extend_from_slice(src.as_bytes());
        b.extend_from_slice(b"\0Hi there\0Hello!\0 Bye ");
        out.push((name.to_string(), b));
    }
    // Inputs the fuzzer found (regression fixtures), and values far larger than they cost to
    // build: mutations start next to the walks that must be paid for.
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
    let mut found: Vec<_> = std::fs::read_dir(&fixtures)
        .expect("tests/fixtures/chat")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    found.sort();
    for path in found {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        out.push((name, std::fs::read(&path).expect("reading a chat fixture")));
    }
    for (name, src) in [
        (
            "shared-lists",
            "{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(40) %}{% set ns.x = [ns.x, ns.x] %}\
             {% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}{{ {ns.x: 1} }}{{ ns.x|tojson }}",
        ),
        (
            "lazy-repeat",
            "{% set big = [1, 'b'] * 50000000 %}{{ big ~ '' }}{{ big|sort|first }}{{ 2 in big }}",
        ),
    ] {
        let mut b = vec![0u8];
        b.extend_from_slice(src.as_bytes());
        b.extend_from_slice(b"\0Hi there");
        out.push((name.to_string(), b));
    }
    out
}

#[test]
fn write_fuzz_seeds() {
    let gguf = gguf_seeds();
    for (_, b) in &gguf {
        // The seeds exercise the reader; the synthetic ones are whole models.
        let _ = GgufFile::from_bytes(b.clone());
    }
    let tok = tokenizer_seeds();
    let chat = chat_seeds();
    let Some(root) = std::env::var_os("FLASHLM_FUZZ_SEEDS") else {
        return;
    };
    let root = Path::new(&root);
    for (dir, seeds) in [("gguf", gguf), ("tokenizer", tok), ("chat_template", chat)] {
        for (name, b) in seeds {
            write(&root.join(dir), &name, &b);
        }
    }
}
