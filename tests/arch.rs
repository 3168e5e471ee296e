//! Every supported architecture end to end: a small synthetic model of each (written with the
//! tensor names and metadata llama.cpp's converter writes), run on the GPU resident, streamed
//! under the least budget that runs (weights and KV pages through flash), with bindings small
//! enough to split every matrix, and with page selection keeping every page, against an
//! independent NumPy forward pass (`tests/oracle/arch_forward.py`, reading the file with the
//! `gguf` package). The CPU reference is checked against the same oracle.
//!
//! Tolerance: the largest |GPU − oracle| logit difference must stay within 2e-3 of the largest
//! |oracle logit| (at least 1): both dequantize the same blocks and round the KV cache to f16; the
//! rest is f32 against f64 arithmetic in another order. Greedy ids must be equal for 16 steps.
//! Streaming and split bindings must not change a bit of the resident run's logits.
//! Without python3 and the `gguf`/`numpy` packages the oracle tests skip with a note, and fail
//! under CI=true.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::writer::GgufWriter;
use flashlm::gguf::{GgufFile, MetaValue};
use flashlm::gpu::GpuOptions;
use flashlm::model::config::{FfnAct, ModelConfig, ModelError};
use flashlm::model::reference::{CpuModel, argmax};
use flashlm::model::synthetic_arch::{ArchSpec, SynthArch, synthetic_arch};
use flashlm::plan::KvSelect;

const TOL: f32 = 2e-3;
const STEPS: usize = 16;
const CTX: usize = 256;

fn scratch() -> PathBuf {
    common::scratch("arch")
}

struct Oracle {
    prompt_logits: Vec<f32>,
    greedy: Vec<u32>,
    step_logits: Vec<Vec<f32>>,
}

/// Whether the oracle can run: python3 with gguf and numpy (panics under CI when not).
fn oracle_available() -> bool {
    let ok =
        Command::new(std::env::var("FLASHLM_PYTHON").unwrap_or_else(|_| "python3".to_string()))
            .args(["-c", "import gguf, numpy"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
    if !ok {
        if common::in_ci() {
            panic!("CI=true but python3 with the gguf and numpy packages is missing");
        }
        eprintln!("skipping: python3 with gguf and numpy is missing (pip install gguf numpy)");
    }
    ok
}

fn run_oracle(model: &Path, prompt: &[u32], ctx: usize) -> Oracle {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/arch_forward.py");
    let tokens: Vec<String> = prompt.iter().map(|t| t.to_string()).collect();
    let out =
        Command::new(std::env::var("FLASHLM_PYTHON").unwrap_or_else(|_| "python3".to_string()))
            .arg(script)
            .arg(model)
            .args(["--tokens", &tokens.join(",")])
            .args(["--steps", &STEPS.to_string(), "--ctx", &ctx.to_string()])
            .arg("--kv-f16")
            .output()
            .expect("run the oracle");
    assert!(
        out.status.success(),
        "oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("oracle JSON");
    let floats = |x: &serde_json::Value| -> Vec<f32> {
        x.as_array()
            .expect("array")
            .iter()
            .map(|f| f.as_f64().expect("number") as f32)
            .collect()
    };
    Oracle {
        prompt_logits: floats(&v["prompt_logits"]),
        greedy: v["greedy"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect(),
        step_logits: v["step_logits"]
            .as_array()
            .expect("steps")
            .iter()
            .map(floats)
            .collect(),
    }
}

/// Largest |a - b| relative to the largest |b| (at least 1).
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn prompt(vocab: usize) -> Vec<u32> {
    (0..23u32).map(|k| (k * 71 + 11) % vocab as u32).collect()
}

fn options(budget: Option<u64>, dir: &Path) -> EngineOptions {
    EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(CTX),
        ubatch: 8,
        ring_slots: 3,
        ring_chunk: 4096,
        head_chunk: Some(4096),
        kv_page: Some(4),
        kv_dir: Some(dir.join("kv")),
        ..Default::default()
    }
}

/// The GPU engine under `o` against the oracle: prompt logits, then 16 greedy steps. Returns
/// every logit computed.
fn check_engine(
    name: &str,
    gguf: &Arc<GgufFile>,
    o: &EngineOptions,
    want: &Oracle,
    p: &[u32],
) -> Vec<Vec<f32>> {
    let mut e = Engine::new(gguf.clone(), o).unwrap_or_else(|err| panic!("{name}: {err}"));
    assert_eq!(
        e.ctx.budget.in_use(),
        e.plan.total,
        "{name}: the plan's sizes are what is allocated"
    );
    let mut logits = e.forward(p).unwrap();
    let d = rel_diff(&logits, &want.prompt_logits);
    eprintln!("{name}: prompt logits max rel diff {d:e}");
    assert!(d < TOL, "{name}: prompt logits differ by {d}");
    let mut all = vec![logits.clone()];
    for i in 0..STEPS {
        let id = argmax(&logits);
        assert_eq!(id, want.greedy[i], "{name}: greedy id {i}");
        logits = e.forward(&[id]).unwrap();
        let d = rel_diff(&logits, &want.step_logits[i]);
        assert!(d < TOL, "{name}: step {i} logits differ by {d}");
        all.push(logits.clone());
    }
    assert_eq!(
        e.ctx.budget.peak(),
        e.plan.total,
        "{name}: nothing beyond the plan"
    );
    all
}

fn check_arch(spec: &ArchSpec, seed: u64) {
    let name = format!(
        "{:?}{}{}",
        spec.arch,
        if spec.longrope { "-longrope" } else { "" },
        if spec.mixed_types { "-mixed" } else { "" }
    );
    let dir = scratch().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = synthetic_arch(spec, seed);
    let path = dir.join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let cfg = ModelConfig::from_gguf(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
    let p = prompt(spec.vocab);
    let want = run_oracle(&path, &p, CTX);

    // The CPU reference agrees with the oracle too.
    let cpu = CpuModel::from_gguf(&gguf, &cfg).unwrap();
    let mut st = cpu.new_state_kv(CTX, true);
    let mut logits = Vec::new();
    for (pos, &t) in p.iter().enumerate() {
        logits = cpu.forward(&mut st, t, pos).unwrap();
    }
    let d = rel_diff(&logits, &want.prompt_logits);
    eprintln!("{name}: CPU reference prompt logits max rel diff {d:e}");
    assert!(
        d < TOL,
        "{name}: CPU reference differs from the oracle by {d}"
    );

    if common::gpu().is_none() {
        return;
    }
    let resident = options(None, &dir);
    let base = check_engine(&format!("{name} resident"), &gguf, &resident, &want, &p);
    let min = common::min_budget(&gguf, &resident);
    let streamed = options(Some(min), &dir);
    let e = Engine::new(gguf.clone(), &streamed).unwrap();
    assert!(
        e.placement.streaming && e.plan.kv.streams,
        "{name}: the least budget streams weights and KV pages"
    );
    drop(e);
    let got = check_engine(&format!("{name} streamed"), &gguf, &streamed, &want, &p);
    assert!(got == base, "{name}: streaming changed the bits");
    let split = EngineOptions {
        max_binding: Some(12 * 1024),
        ..options(None, &dir)
    };
    let got = check_engine(&format!("{name} split bindings"), &gguf, &split, &want, &p);
    assert!(got == base, "{name}: split bindings changed the bits");
    // RoPE with the KV store as a dispatch of its own rather than inside decode attention.
    let own = EngineOptions {
        fuse_rope: false,
        ..options(None, &dir)
    };
    let got = check_engine(&format!("{name} own RoPE dispatch"), &gguf, &own, &want, &p);
    assert!(
        got == base,
        "{name}: RoPE inside decode attention changed the bits"
    );
    // Page selection keeping every candidate (local layers: those their window reaches).
    let select = EngineOptions {
        kv_select: Some(KvSelect::parse("quest:100%", 0).unwrap()),
        ..options(None, &dir)
    };
    check_engine(&format!("{name} page selection"), &gguf, &select, &want, &p);
    let _ = std::fs::remove_dir_all(&dir);
}

fn arch_test(arch: SynthArch, seed: u64) {
    if !oracle_available() {
        return;
    }
    check_arch(&ArchSpec::small(arch), seed);
}

#[test]
fn llama3_rope_freqs_matches_oracle() {
    arch_test(SynthArch::Llama3, 31);
}

#[test]
fn mistral_matches_oracle() {
    arch_test(SynthArch::Mistral, 32);
}

#[test]
fn qwen2_matches_oracle() {
    arch_test(SynthArch::Qwen2, 33);
}

#[test]
fn qwen3_matches_oracle() {
    arch_test(SynthArch::Qwen3, 34);
}

#[test]
fn phi3_matches_oracle() {
    arch_test(SynthArch::Phi3, 35);
    if oracle_available() {
        let spec = ArchSpec {
            longrope: true,
            ..ArchSpec::small(SynthArch::Phi3)
        };
        check_arch(&spec, 36);
    }
}

#[test]
fn gemma2_matches_oracle() {
    arch_test(SynthArch::Gemma2, 37);
}

#[test]
fn gemma3_matches_oracle() {
    arch_test(SynthArch::Gemma3, 38);
}

/// Weight types that vary from layer to layer (as in Q4_K_M files) stream through slots sized
/// for every layer.
#[test]
fn mixed_weight_types_match_oracle() {
    if !oracle_available() {
        return;
    }
    for (arch, seed) in [(SynthArch::Gemma3, 39), (SynthArch::Llama3, 40)] {
        let spec = ArchSpec {
            mixed_types: true,
            ..ArchSpec::small(arch)
        };
        check_arch(&spec, seed);
    }
}

/// The features each synthetic file turns on, as the config reads them.
#[test]
fn configs_read_each_architecture() {
    let cfg = |a: SynthArch| {
        let g = GgufFile::from_bytes(synthetic_arch(&ArchSpec::small(a), 1)).unwrap();
        ModelConfig::from_gguf(&g).unwrap_or_else(|e| panic!("{a:?}: {e}"))
    };
    let l3 = cfg(SynthArch::Llama3);
    assert!(matches!(
        l3.rope.factors,
        flashlm::model::rope::RopeFactors::Fixed(_)
    ));
    let m = cfg(SynthArch::Mistral);
    assert_eq!((m.arch.as_str(), m.head_dim, m.q_dim()), ("llama", 24, 96));
    assert!(cfg(SynthArch::Qwen2).has_qkv_bias);
    let q3 = cfg(SynthArch::Qwen3);
    assert!(q3.qk_norm && !q3.has_qkv_bias);
    let phi = cfg(SynthArch::Phi3);
    assert!(phi.fused_qkv && phi.fused_gate_up && phi.swa_window.is_none());
    let g2 = cfg(SynthArch::Gemma2);
    assert_eq!(g2.swa_layers, vec![true, false, true, false]);
    assert_eq!((g2.attn_softcap, g2.final_softcap), (Some(4.0), Some(3.0)));
    assert_eq!(g2.ffn_act, FfnAct::GeluTanh);
    assert_eq!(g2.embd_scale, Some(8.0));
    let g3 = cfg(SynthArch::Gemma3);
    assert_eq!(
        g3.swa_layers,
        vec![true, true, true, true, true, false, true]
    );
    assert_eq!((g3.rope.base, g3.rope.freq_scale), (1_000_000.0, 0.125));
    assert_eq!((g3.rope_swa.base, g3.rope_swa.freq_scale), (10000.0, 1.0));
    assert!(g3.qk_norm && g3.post_norms && g3.final_softcap.is_none());
    assert!(g3.split_rope() && !g2.split_rope());
}

/// A file rebuilt with extra metadata and without some tensors.
fn edit(a: SynthArch, extra: &[(&str, MetaValue)], drop: &[&str]) -> GgufFile {
    let g = GgufFile::from_bytes(synthetic_arch(&ArchSpec::small(a), 2)).unwrap();
    let mut w = GgufWriter::new();
    for k in &g.metadata_order {
        if !extra.iter().any(|(e, _)| e == k) {
            w.meta(k, g.metadata[k].clone());
        }
    }
    for (k, v) in extra {
        w.meta(k, v.clone());
    }
    for t in &g.tensors {
        if !drop.contains(&t.name.as_str()) {
            w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(t).to_vec());
        }
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

/// What is not implemented fails at load with a message naming it.
#[test]
fn unsupported_features_are_named() {
    let err = |g: &GgufFile| match ModelConfig::from_gguf(g) {
        Ok(_) => panic!("accepted"),
        Err(e) => e,
    };
    let s = |v: &str| MetaValue::String(v.into());
    let e = err(&edit(
        SynthArch::Qwen3,
        &[("qwen3.rope.scaling.type", s("yarn"))],
        &[],
    ));
    assert!(e.to_string().contains("yarn"), "{e}");
    let e = err(&edit(
        SynthArch::Phi3,
        &[("phi3.rope.scaling.type", s("longrope"))],
        &[],
    ));
    assert!(e.to_string().contains("longrope"), "{e}");
    let long = ArchSpec {
        longrope: true,
        ..ArchSpec::small(SynthArch::Phi3)
    };
    let g = GgufFile::from_bytes(synthetic_arch(&long, 2)).unwrap();
    ModelConfig::from_gguf(&g).expect("longrope with both factor tensors");
    let mut w = GgufWriter::new();
    for k in &g.metadata_order {
        w.meta(k, g.metadata[k].clone());
    }
    for t in g
        .tensors
        .iter()
        .filter(|t| t.name != "rope_factors_short.weight")
    {
        w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(t).to_vec());
    }
    let e = err(&GgufFile::from_bytes(w.to_bytes()).unwrap());
    assert!(
        matches!(&e, ModelError::UnsupportedFeature { feature, .. } if feature.contains("rope_factors")),
        "{e}"
    );
    let m3 = edit(SynthArch::Mistral, &[], &[]);
    let relabel = |g: &GgufFile, extra: &[(&str, MetaValue)]| {
        let mut w = GgufWriter::new();
        for k in &g.metadata_order {
            let v = g.metadata[k].clone();
            match k.as_str() {
                "general.architecture" => w.meta(k, s("mistral3")),
                _ => w.meta(&k.replacen("llama.", "mistral3.", 1), v),
            };
        }
        for (k, v) in extra {
            w.meta(k, v.clone());
        }
        for t in &g.tensors {
            w.tensor(&t.name, &t.dims, t.ty, g.tensor_data(t).to_vec());
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let plain = relabel(&m3, &[]);
    let c = ModelConfig::from_gguf(&plain).expect("mistral3 without temperature tuning");
    assert_eq!(c.arch, "mistral3");
    let e = err(&relabel(
        &m3,
        &[("mistral3.attention.temperature_scale", MetaValue::F32(0.1))],
    ));
    assert!(e.to_string().contains("temperature"), "{e}");
    let e = err(&edit(
        SynthArch::Gemma2,
        &[],
        &["blk.1.post_ffw_norm.weight"],
    ));
    assert!(e.to_string().contains("blk.1.post_ffw_norm.weight"), "{e}");
}

/// Llama 3 scaling given in metadata computes the converter's `rope_freqs`: the same logits.
#[test]
fn llama3_scaling_from_metadata_equals_rope_freqs() {
    let run = |g: &GgufFile| {
        let cfg = ModelConfig::from_gguf(g).unwrap();
        let m = CpuModel::from_gguf(g, &cfg).unwrap();
        let mut st = m.new_state(32);
        let mut out = Vec::new();
        for (pos, t) in [5u32, 77, 3, 140, 9, 200, 11].into_iter().enumerate() {
            out = m.forward(&mut st, t, pos).unwrap();
        }
        (cfg, out)
    };
    let (c1, with_tensor) = run(&edit(SynthArch::Llama3, &[], &[]));
    let (c2, from_meta) = run(&edit(
        SynthArch::Llama3,
        &[
            (
                "llama.rope.scaling.type",
                MetaValue::String("llama3".into()),
            ),
            ("llama.rope.scaling.factor", MetaValue::F32(8.0)),
            (
                "llama.rope.scaling.original_context_length",
                MetaValue::U32(64),
            ),
        ],
        &["rope_freqs.weight"],
    ));
    assert_eq!(c1.rope.factors, c2.rope.factors);
    assert_eq!(with_tensor, from_meta);
    let (_, plain) = run(&edit(SynthArch::Llama3, &[], &["rope_freqs.weight"]));
    assert_ne!(with_tensor, plain, "the factors change the result");
}
