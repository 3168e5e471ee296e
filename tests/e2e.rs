//! End to end: the real model on the GPU against known token ids and the CPU reference, and
//! synthetic models of every weight type with odd sizes.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::{GpuOptions, MatmulLayout};
use flashlm::model::config::ModelConfig;
use flashlm::model::reference::CpuModel;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::model::tokenizer::Tokenizer;
use flashlm::sampling::{Sampler, SamplerParams};

fn greedy() -> Sampler {
    Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    })
}

/// Largest |a - b| relative to the largest |b| (at least 1).
fn rel_max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

#[test]
fn real_model_greedy_ids_and_logits_match_cpu() {
    let Some(path) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let tk = Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = tk.encode("The capital of France is", false);
    assert_eq!(prompt, vec![504, 3575, 282, 4649, 314]);

    // CPU reference over the same prompt, with an f32 and an f16 KV cache like the GPU's.
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let cpu = CpuModel::from_gguf(&gguf, &cfg).unwrap();
    for kv_f16 in [false, true] {
        let mut engine = Engine::new(
            gguf.clone(),
            &EngineOptions {
                kv_f16,
                ..Default::default()
            },
        )
        .unwrap();
        let gpu_logits = engine.forward(&prompt).unwrap();
        let mut st = cpu.new_state_kv(64, kv_f16);
        let mut cpu_logits = Vec::new();
        for (pos, &id) in prompt.iter().enumerate() {
            cpu_logits = cpu.forward(&mut st, id, pos).unwrap();
        }
        let d = rel_max_diff(&gpu_logits, &cpu_logits);
        eprintln!("first-step logits (f16 KV {kv_f16}): max |gpu - cpu| / max |cpu| = {d:e}");
        // Tolerance: 1e-3 of the largest logit (f32 sums in another order over 30 layers).
        assert!(d < 1e-3, "GPU logits differ from the CPU reference by {d}");
        assert_eq!(argmax(&gpu_logits), argmax(&cpu_logits));
    }
    let mut engine = Engine::new(gguf.clone(), &EngineOptions::default()).unwrap();

    engine.reset();
    let (ids, stats) = engine
        .generate(&prompt, 7, &mut greedy(), |_| false, |_| true)
        .unwrap();
    assert_eq!(ids, vec![7042, 30, 198, 198, 504, 2988, 314]);
    assert_eq!(tk.decode(&ids, true).unwrap(), " Paris.\n\nThe answer is");
    assert_eq!(stats.generated_tokens, 7);
    assert!(stats.peak_device_bytes > 0);
}

fn synthetic(ty: GgmlType, seed: u64) -> Arc<GgufFile> {
    let spec = SyntheticSpec {
        n_layers: 2,
        n_embd: 96,
        n_heads: 3,
        n_kv_heads: 1,
        n_ff: 160,
        vocab: 300,
        weight_type: ty,
        ctx: 128,
        untied_output: seed % 2 == 1,
    };
    Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, seed)).unwrap())
}

#[test]
fn synthetic_models_every_type_gpu_matches_cpu() {
    if common::gpu().is_none() {
        return;
    }
    for (i, ty) in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
    ]
    .into_iter()
    .enumerate()
    {
        let gguf = synthetic(ty, 100 + i as u64);
        let cfg = ModelConfig::from_gguf(&gguf).unwrap();
        let cpu = CpuModel::from_gguf(&gguf, &cfg).unwrap();
        // Alternate the two matrix-kernel layouts across types.
        let layout = if i % 2 == 0 {
            MatmulLayout::CPU
        } else {
            MatmulLayout::GPU
        };
        let mut engine = Engine::new(
            gguf.clone(),
            &EngineOptions {
                ubatch: 8,
                gpu: GpuOptions {
                    matmul_layout: Some(layout),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .unwrap();
        // A 19-token prompt: three prefill batches of 8, 8 and 3, then single-token steps.
        let prompt: Vec<u32> = (0..19).map(|k| (k * 37 + 5) % 300).collect();
        // The engine keeps an f16 KV cache by default; the reference rounds the same way.
        let mut st = cpu.new_state_kv(64, true);
        let mut want = Vec::new();
        for (pos, &id) in prompt.iter().enumerate() {
            want = cpu.forward(&mut st, id, pos).unwrap();
        }
        let got = engine.forward(&prompt).unwrap();
        let d = rel_max_diff(&got, &want);
        assert!(d < 1e-3, "{ty:?}: prefill logits differ by {d}");
        for k in 0..4u32 {
            let id = (k * 91 + 7) % 300;
            let want = cpu.forward(&mut st, id, prompt.len() + k as usize).unwrap();
            let got = engine.forward(&[id]).unwrap();
            let d = rel_max_diff(&got, &want);
            assert!(d < 1e-3, "{ty:?}: decode step {k} logits differ by {d}");
        }
    }
}

#[test]
fn batched_prefill_equals_token_by_token() {
    if common::gpu().is_none() {
        return;
    }
    let gguf = synthetic(GgmlType::Q4_1, 42);
    let prompt: Vec<u32> = (0..13).map(|k| (k * 17 + 3) % 300).collect();
    let mut a = Engine::new(gguf.clone(), &EngineOptions::default()).unwrap();
    let batched = a.forward(&prompt).unwrap();
    a.reset();
    let mut single = Vec::new();
    for &id in &prompt {
        single = a.forward(&[id]).unwrap();
    }
    assert!(rel_max_diff(&batched, &single) < 1e-4);
}

#[test]
fn engine_errors_are_clear() {
    if common::gpu().is_none() {
        return;
    }
    let gguf = synthetic(GgmlType::Q8_0, 1);
    let mut e = Engine::new(
        gguf,
        &EngineOptions {
            ctx: Some(16),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(e.forward(&[]).unwrap_err().to_string().contains("empty"));
    let err = e.forward(&[300]).unwrap_err().to_string();
    assert!(err.contains("300"), "{err}");
    let err = e.forward(&[1; 17]).unwrap_err().to_string();
    assert!(err.contains("context full"), "{err}");
    // Nothing was consumed by the failed calls.
    assert_eq!(e.n_past(), 0);
    e.forward(&[1; 16]).unwrap();
    assert_eq!(e.n_past(), 16);
}
