//! RoPE with the KV store inside decode attention (`kernels::attention_rope`) against the same
//! work as a dispatch of its own: the same bits in every logit of every decode step, with f16
//! and f32 KV pages, one page or many, KV pages on the device or streamed from flash, and a
//! context long enough for two attention splits; the plan fuses exactly where it says and
//! allocates what it plans. (tests/arch.rs compares the two on every architecture, NeoX RoPE,
//! sliding windows and page selection among them, with the oracle beside.)
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::kernels;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};

fn model() -> Arc<GgufFile> {
    let spec = SyntheticSpec {
        n_layers: 2,
        n_embd: 64,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 96,
        vocab: 400,
        weight_type: GgmlType::Q8_0,
        ctx: 1024,
        untied_output: false,
    };
    Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 33)).unwrap())
}

/// Prefill logits, then the logits of every greedy step.
fn run(e: &mut Engine, p: &[u32], n: usize) -> Vec<Vec<f32>> {
    e.reset();
    let mut logits = e.forward(p).unwrap();
    let mut all = vec![logits.clone()];
    for _ in 0..n {
        let id = flashlm::model::reference::argmax(&logits);
        logits = e.forward(&[id]).unwrap();
        all.push(logits.clone());
    }
    all
}

#[test]
fn rope_inside_decode_attention_gives_the_same_bits() {
    let Some(ctx) = common::gpu() else {
        return;
    };
    let available = kernels::rope_fusion_available(&ctx);
    drop(ctx);
    let gguf = model();
    let dir = common::scratch("rope-fusion");
    // Past 512 keys by the end: two attention splits per decode step.
    let p: Vec<u32> = (0..500u32).map(|k| (k * 131 + 7) % 400).collect();
    for f16 in [true, false] {
        for page in [16u32, 1024] {
            let base = EngineOptions {
                ctx: Some(1024),
                ubatch: 64,
                ring_slots: 3,
                ring_chunk: 8192,
                head_chunk: Some(16384),
                kv_f16: f16,
                kv_page: Some(page),
                kv_dir: Some(dir.join("kv")),
                ..Default::default()
            };
            let min = common::min_budget(&gguf, &base);
            let budgets: &[Option<u64>] = if page == 16 {
                &[None, Some(min)]
            } else {
                &[None]
            };
            for &budget in budgets {
                let o = EngineOptions {
                    gpu: GpuOptions {
                        budget,
                        ..Default::default()
                    },
                    ..base.clone()
                };
                let what = format!("f16 {f16}, page {page}, budget {budget:?}");
                let mut fused = Engine::new(gguf.clone(), &o).unwrap();
                let mut own = Engine::new(
                    gguf.clone(),
                    &EngineOptions {
                        fuse_rope: false,
                        ..o.clone()
                    },
                )
                .unwrap();
                assert!(own.plan.fused_rope.iter().all(|&f| !f), "{what}");
                assert_eq!(
                    fused.plan.fused_rope.iter().all(|&f| f),
                    available,
                    "{what}: fused where the device can"
                );
                for (e, name) in [(&fused, "fused"), (&own, "own dispatch")] {
                    assert_eq!(
                        e.ctx.budget.in_use(),
                        e.plan.total,
                        "{what}, {name}: the plan's sizes are what is allocated"
                    );
                }
                for (a, b) in fused
                    .plan
                    .layer_dispatches
                    .iter()
                    .zip(&own.plan.layer_dispatches)
                {
                    assert_eq!(*a + u64::from(available), *b, "{what}: one dispatch less");
                }
                if budget.is_some() {
                    assert!(fused.plan.kv.streams, "{what}: KV pages stream");
                }
                let want = run(&mut own, &p, 24);
                let got = run(&mut fused, &p, 24);
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(g == w, "{what}: logits of step {i} differ");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
