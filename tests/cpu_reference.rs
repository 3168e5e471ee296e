//! The CPU reference forward pass: on the real model (the project's oracle) and on synthetic ones.

mod common;

use std::time::Instant;

use flashlm::gguf::writer::GgufWriter;
use flashlm::gguf::{GgmlType, GgufFile, MetaValue};
use flashlm::model::config::{ModelConfig, ModelError, RopeStyle};
use flashlm::model::reference::CpuModel;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

#[test]
fn real_model_config_and_greedy() {
    let Some(path) = common::model_path() else {
        return;
    };
    let g = GgufFile::open(&path).expect("open the real model");
    let c = ModelConfig::from_gguf(&g).expect("config");
    assert_eq!(c.arch, "llama");
    assert_eq!(c.n_layers, 30);
    assert_eq!(c.n_embd, 576);
    assert_eq!(c.n_ff, 1536);
    assert_eq!(c.n_heads, 9);
    assert_eq!(c.n_kv_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.rope_dim, 64);
    assert_eq!(c.rope_base, 100000.0);
    assert_eq!(c.rms_eps, 1e-5);
    assert_eq!(c.context_length, 8192);
    assert_eq!(c.vocab_size, 49152);
    assert!(c.tied_output);
    assert_eq!(c.rope_style, RopeStyle::Normal);
    assert!(!c.has_qkv_bias);
    let summary = c.summary();
    assert!(
        summary.contains("llama") && summary.contains("49152"),
        "{summary}"
    );

    let t0 = Instant::now();
    let m = CpuModel::from_gguf(&g, &c).expect("load weights");
    let t1 = Instant::now();
    // "The capital of France is" -> " Paris.\n\nThe answer is"
    let out = m.greedy(&[504, 3575, 282, 4649, 314], 7).expect("greedy");
    let t2 = Instant::now();
    eprintln!(
        "dequantize {:.2}s, 12 forward passes {:.2}s",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64()
    );
    assert_eq!(out, vec![7042, 30, 198, 198, 504, 2988, 314]);

    // Out-of-range inputs are errors, not panics.
    let mut st = m.new_state(2);
    assert!(matches!(
        m.forward(&mut st, 49152, 0),
        Err(ModelError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        m.forward(&mut st, 1, 2),
        Err(ModelError::BadPosition { .. })
    ));
}

fn spec(weight_type: GgmlType) -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 2,
        n_embd: 96,
        n_heads: 6,
        n_kv_heads: 2,
        n_ff: 160,
        vocab: 300,
        weight_type,
        ctx: 64,
        untied_output: false,
    }
}

#[test]
fn synthetic_round_trip_every_type() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
    ] {
        for untied in [false, true] {
            let s = SyntheticSpec {
                untied_output: untied,
                ..spec(ty)
            };
            let g = GgufFile::from_bytes(synthetic_llama(&s, 7)).expect("parse synthetic");
            let c = ModelConfig::from_gguf(&g).expect("synthetic config");
            assert_eq!(
                (
                    c.n_layers,
                    c.n_embd,
                    c.n_heads,
                    c.n_kv_heads,
                    c.head_dim,
                    c.n_ff
                ),
                (2, 96, 6, 2, 16, 160)
            );
            assert_eq!((c.vocab_size, c.context_length), (300, 64));
            assert_eq!(c.tied_output, !untied);
            assert_eq!(
                g.get_str("tokenizer.ggml.model").expect("meta"),
                Some("gpt2")
            );
            let tokens = g
                .get_str_array("tokenizer.ggml.tokens")
                .expect("meta")
                .expect("tokens");
            assert_eq!(tokens.len(), 300);

            let m = CpuModel::from_gguf(&g, &c).expect("load synthetic");
            let mut st = m.new_state(8);
            for (pos, tok) in [1u32, 200, 299, 5, 5].into_iter().enumerate() {
                let logits = m.forward(&mut st, tok, pos).expect("forward");
                assert_eq!(logits.len(), 300);
                assert!(
                    logits.iter().all(|v| v.is_finite()),
                    "{ty:?}: non-finite logits"
                );
                let sd = (logits.iter().map(|v| v * v).sum::<f32>() / 300.0).sqrt();
                assert!(sd > 0.05 && sd < 50.0, "{ty:?}: logit scale {sd}");
            }
        }
    }
}

#[test]
fn synthetic_is_deterministic_and_greedy_consistent() {
    let s = spec(GgmlType::Q8_0);
    let a = synthetic_llama(&s, 1);
    assert_eq!(a, synthetic_llama(&s, 1));
    assert_ne!(a, synthetic_llama(&s, 2));
    let g = GgufFile::from_bytes(a).expect("parse");
    let m = CpuModel::from_gguf(&g, &ModelConfig::from_gguf(&g).expect("config")).expect("load");
    let out = m.greedy(&[10, 20, 30], 5).expect("greedy");
    // Greedy equals step-by-step argmax, and rewinding the cache replays the same logits.
    let mut st = m.new_state(8);
    let mut logits = Vec::new();
    for (p, &t) in [10u32, 20, 30].iter().enumerate() {
        logits = m.forward(&mut st, t, p).expect("forward");
    }
    let first = flashlm::model::reference::argmax(&logits);
    assert_eq!(first, out[0]);
    let replay = m.forward(&mut st, 30, 2).expect("rewind");
    assert_eq!(replay, logits);
}

/// A synthetic model rebuilt with metadata and tensors edited. `meta` maps each key/value to a
/// new pair (or drops it); `tensor` maps each tensor's dims (or drops it); `extra_meta` and
/// `extra_tensors` are appended. Edited tensors are rewritten as F32 zeros of their new shape.
fn rebuild(
    s: &SyntheticSpec,
    meta: impl Fn(&str, MetaValue) -> Option<(String, MetaValue)>,
    tensor: impl Fn(&str, &[u64]) -> Option<Vec<u64>>,
    extra_meta: &[(&str, MetaValue)],
    extra_tensors: &[(&str, Vec<u64>)],
) -> GgufFile {
    let g = GgufFile::from_bytes(synthetic_llama(s, 3)).expect("parse");
    let mut w = GgufWriter::new();
    for k in &g.metadata_order {
        if let Some((k, v)) = meta(k, g.metadata[k].clone()) {
            w.meta(&k, v);
        }
    }
    for (k, v) in extra_meta {
        w.meta(k, v.clone());
    }
    let zeros = |dims: &[u64]| vec![0u8; dims.iter().product::<u64>() as usize * 4];
    for t in &g.tensors {
        match tensor(&t.name, &t.dims) {
            Some(d) if d == t.dims => {
                w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(t).to_vec());
            }
            Some(d) => {
                w.tensor(&t.name, &d, GgmlType::F32, zeros(&d));
            }
            None => {}
        }
    }
    for (name, d) in extra_tensors {
        w.tensor(name, d, GgmlType::F32, zeros(d));
    }
    GgufFile::from_bytes(w.to_bytes()).expect("parse rebuilt")
}

fn keep_meta(k: &str, v: MetaValue) -> Option<(String, MetaValue)> {
    Some((k.to_string(), v))
}

fn keep_tensor(_: &str, d: &[u64]) -> Option<Vec<u64>> {
    Some(d.to_vec())
}

/// Replace one metadata value.
fn set_meta(
    key: &'static str,
    value: MetaValue,
) -> impl Fn(&str, MetaValue) -> Option<(String, MetaValue)> {
    move |k, v| Some((k.to_string(), if k == key { value.clone() } else { v }))
}

fn config_err(g: &GgufFile) -> ModelError {
    match ModelConfig::from_gguf(g) {
        Ok(_) => panic!("config should have been refused"),
        Err(e) => e,
    }
}

#[test]
fn config_errors() {
    let s = spec(GgmlType::F32);

    // Sanity: an unmodified rebuild is accepted.
    ModelConfig::from_gguf(&rebuild(&s, keep_meta, keep_tensor, &[], &[])).expect("valid rebuild");

    // Unsupported architecture: the error names it and the supported set.
    let g = rebuild(
        &s,
        set_meta("general.architecture", MetaValue::String("gpt2".into())),
        keep_tensor,
        &[],
        &[],
    );
    let e = config_err(&g);
    assert!(
        matches!(&e, ModelError::UnsupportedArch { arch } if arch == "gpt2"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("gpt2")
            && msg.contains("llama")
            && msg.contains("mistral")
            && msg.contains("qwen2"),
        "{msg}"
    );

    // Missing tensor.
    let g = rebuild(
        &s,
        keep_meta,
        |n, d| (n != "blk.1.ffn_up.weight").then(|| d.to_vec()),
        &[],
        &[],
    );
    let e = config_err(&g);
    assert!(
        matches!(&e, ModelError::MissingTensor { name } if name == "blk.1.ffn_up.weight"),
        "{e:?}"
    );

    // Bad shape.
    let g = rebuild(
        &s,
        keep_meta,
        |n, d| {
            Some(if n == "blk.0.attn_k.weight" {
                vec![96, 96]
            } else {
                d.to_vec()
            })
        },
        &[],
        &[],
    );
    match config_err(&g) {
        ModelError::BadShape {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "blk.0.attn_k.weight");
            assert_eq!(expected, vec![96, 32]);
            assert_eq!(found, vec![96, 96]);
        }
        e => panic!("expected BadShape, got {e:?}"),
    }

    // Mixture of experts.
    let g = rebuild(
        &s,
        keep_meta,
        keep_tensor,
        &[("llama.expert_count", MetaValue::U32(8))],
        &[],
    );
    let e = config_err(&g);
    assert!(
        matches!(
            &e,
            ModelError::UnsupportedMoe {
                expert_count: 8,
                ..
            }
        ),
        "{e:?}"
    );

    // Rope scaling: none, linear and llama3 run; yarn does not, nor longrope without its factor
    // tensors.
    for (kind, ok) in [
        ("yarn", false),
        ("linear", true),
        ("none", true),
        ("llama3", true),
        ("longrope", false),
        ("dynamic", false),
    ] {
        let g = rebuild(
            &s,
            keep_meta,
            keep_tensor,
            &[("llama.rope.scaling.type", MetaValue::String(kind.into()))],
            &[],
        );
        match ModelConfig::from_gguf(&g) {
            Ok(_) => assert!(ok, "rope scaling {kind} accepted"),
            Err(ModelError::UnsupportedRopeScaling { kind: k, .. }) => {
                assert!(!ok && k.starts_with(kind), "{k}")
            }
            Err(e) => panic!("rope scaling {kind}: {e:?}"),
        }
    }
    // A factor without a type is linear scaling, as llama.cpp reads it.
    let g = rebuild(
        &s,
        keep_meta,
        keep_tensor,
        &[("llama.rope.scaling.factor", MetaValue::F32(4.0))],
        &[],
    );
    let c = ModelConfig::from_gguf(&g).expect("linear scaling");
    assert_eq!(c.rope.freq_scale, 0.25);
    for bad in [f32::NAN, -2.0] {
        let g = rebuild(
            &s,
            keep_meta,
            keep_tensor,
            &[("llama.rope.scaling.factor", MetaValue::F32(bad))],
            &[],
        );
        assert!(matches!(config_err(&g), ModelError::BadConfig { .. }));
    }

    // Heads that do not group.
    let g = rebuild(
        &s,
        set_meta("llama.attention.head_count_kv", MetaValue::U32(4)),
        keep_tensor,
        &[],
        &[],
    );
    assert!(matches!(config_err(&g), ModelError::BadConfig { .. }));

    // Zero and absurd sizes.
    for v in [0u64, u64::MAX] {
        let g = rebuild(
            &s,
            set_meta("llama.feed_forward_length", MetaValue::U64(v)),
            keep_tensor,
            &[],
            &[],
        );
        assert!(matches!(config_err(&g), ModelError::BadConfig { .. }));
    }

    // Missing required metadata.
    let g = rebuild(
        &s,
        |k, v| (k != "llama.block_count").then(|| (k.to_string(), v)),
        keep_tensor,
        &[],
        &[],
    );
    assert!(matches!(
        config_err(&g),
        ModelError::MissingMetadata { key } if key == "llama.block_count"
    ));

    // A tensor the forward pass would ignore.
    let g = rebuild(
        &s,
        keep_meta,
        keep_tensor,
        &[],
        &[("blk.0.attn_q_norm.weight", vec![16])],
    );
    assert!(matches!(
        config_err(&g),
        ModelError::UnexpectedTensor { name, .. } if name == "blk.0.attn_q_norm.weight"
    ));
    // Frequency factors must have one value per rotated pair (and be positive).
    let g = rebuild(
        &s,
        keep_meta,
        keep_tensor,
        &[],
        &[("rope_freqs.weight", vec![16])],
    );
    assert!(matches!(
        config_err(&g),
        ModelError::BadShape { name, .. } if name == "rope_freqs.weight"
    ));
    let g = rebuild(
        &s,
        keep_meta,
        keep_tensor,
        &[],
        &[("rope_freqs.weight", vec![8])],
    );
    assert!(matches!(
        config_err(&g),
        ModelError::BadConfig { key, .. } if key == "rope_freqs.weight"
    ));

    // The same model relabelled qwen2: needs q/k/v biases, then uses neox rope.
    let to_qwen = |k: &str, v: MetaValue| {
        Some(match k {
            "general.architecture" => (k.to_string(), MetaValue::String("qwen2".into())),
            _ => (k.replacen("llama.", "qwen2.", 1), v),
        })
    };
    let e = config_err(&rebuild(&s, to_qwen, keep_tensor, &[], &[]));
    assert!(
        matches!(&e, ModelError::MissingTensor { name } if name == "blk.0.attn_q.bias"),
        "{e:?}"
    );
    let mut biases = Vec::new();
    for l in 0..2 {
        biases.push((format!("blk.{l}.attn_q.bias"), vec![96u64]));
        biases.push((format!("blk.{l}.attn_k.bias"), vec![32]));
        biases.push((format!("blk.{l}.attn_v.bias"), vec![32]));
    }
    let biases: Vec<(&str, Vec<u64>)> = biases
        .iter()
        .map(|(n, d)| (n.as_str(), d.clone()))
        .collect();
    let g = rebuild(&s, to_qwen, keep_tensor, &[], &biases);
    let c = ModelConfig::from_gguf(&g).expect("qwen2 config");
    assert_eq!(c.arch, "qwen2");
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert!(c.has_qkv_bias);
    let m = CpuModel::from_gguf(&g, &c).expect("qwen2 load");
    let logits = m.forward(&mut m.new_state(2), 3, 0).expect("qwen2 forward");
    assert!(logits.iter().all(|v| v.is_finite()));
}
