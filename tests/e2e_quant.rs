//! End to end with the 5-bit, K-quant and IQ4 weight types: synthetic models (every matrix of
//! one type, rows of 256) through the engine on the GPU against the CPU reference, prefill in
//! batches and then single-token decode steps, alternating the matrix-kernel layouts.
//!
//! Tolerance: logits within 1e-3 of the largest reference logit (as in `tests/e2e.rs`).
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::{GpuOptions, MatmulLayout};
use flashlm::model::config::ModelConfig;
use flashlm::model::reference::CpuModel;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

fn rel_max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn synthetic(ty: GgmlType, seed: u64) -> Arc<GgufFile> {
    let spec = SyntheticSpec {
        n_layers: 2,
        n_embd: 256,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 512,
        vocab: 300,
        weight_type: ty,
        ctx: 64,
        untied_output: seed % 2 == 1,
    };
    Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, seed)).unwrap())
}

#[test]
fn synthetic_models_new_types_gpu_matches_cpu() {
    if common::gpu().is_none() {
        return;
    }
    for (i, ty) in [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
    ]
    .into_iter()
    .enumerate()
    {
        let gguf = synthetic(ty, 200 + i as u64);
        assert!(gguf.tensors.iter().any(|t| t.ty == ty), "{ty}");
        let cfg = ModelConfig::from_gguf(&gguf).unwrap();
        let cpu = CpuModel::from_gguf(&gguf, &cfg).unwrap();
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
        // 11 tokens: prefill batches of 8 and 3, then single-token steps.
        let prompt: Vec<u32> = (0..11).map(|k| (k * 37 + 5) % 300).collect();
        let mut st = cpu.new_state_kv(32, true);
        let mut want = Vec::new();
        for (pos, &id) in prompt.iter().enumerate() {
            want = cpu.forward(&mut st, id, pos).unwrap();
        }
        let got = engine.forward(&prompt).unwrap();
        let d = rel_max_diff(&got, &want);
        assert!(d < 1e-3, "{ty}: prefill logits differ by {d}");
        for k in 0..3u32 {
            let id = (k * 91 + 7) % 300;
            let want = cpu.forward(&mut st, id, prompt.len() + k as usize).unwrap();
            let got = engine.forward(&[id]).unwrap();
            let d = rel_max_diff(&got, &want);
            assert!(d < 1e-3, "{ty}: decode step {k} logits differ by {d}");
        }
    }
}
