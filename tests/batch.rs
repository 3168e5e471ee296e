//! Several sequences per pass: each sequence's greedy ids equal what it gets alone, resident and
//! streamed (weights and KV pages through flash); sequences open and close; bad use is refused.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineError, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::sampling::{Sampler, SamplerParams};

fn greedy() -> Sampler {
    Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    })
}

fn opts(budget: Option<u64>, seqs: usize) -> EngineOptions {
    EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(384),
        ubatch: 32,
        ring_slots: 3,
        ring_chunk: 8192,
        head_chunk: Some(16384),
        kv_page: Some(16),
        max_seqs: seqs,
        ..Default::default()
    }
}

#[test]
fn batched_decoding_equals_each_sequence_alone() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 3,
        n_embd: 64,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 96,
        vocab: 400,
        weight_type: GgmlType::Q8_0,
        ctx: 1024,
        untied_output: false,
    };
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 41)).unwrap());
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|k| {
            (0..(20 + 37 * k))
                .map(|i| (i * 31 + k * 7 + 3) % 400)
                .collect()
        })
        .collect();
    let n = 30;
    // Each alone, with one sequence.
    let mut alone = Vec::new();
    {
        let mut e = Engine::new(gguf.clone(), &opts(None, 1)).unwrap();
        for p in &prompts {
            e.reset();
            let (ids, _) = e
                .generate(p, n, &mut greedy(), |_| false, |_| true)
                .unwrap();
            alone.push(ids);
        }
    }
    for streamed in [false, true] {
        let mut o = opts(None, 4);
        if streamed {
            o.gpu.budget = Some(common::min_budget(&gguf, &o));
        }
        let mut e = Engine::new(gguf.clone(), &o).unwrap();
        assert_eq!(e.ctx.budget.in_use(), e.plan.total);
        if streamed {
            assert!(
                e.placement.streaming && e.plan.kv.streams,
                "{}",
                e.placement
            );
        }
        let mut samplers: Vec<Sampler> = (0..4).map(|_| greedy()).collect();
        let got = e
            .generate_batch(&prompts, n, &mut samplers, |_| false)
            .unwrap();
        assert_eq!(
            got, alone,
            "streamed {streamed}: batched ids differ from alone"
        );
        assert!(e.ctx.budget.peak() <= o.gpu.budget.unwrap_or(u64::MAX));
        // Sequences were closed: all can be opened again.
        let s: Vec<u32> = (0..4).map(|_| e.new_seq().unwrap()).collect();
        assert_eq!(s, vec![0, 1, 2, 3]);
        assert!(e.new_seq().is_none());
        assert!(matches!(
            e.forward_batch(&[(1, &[1][..]), (1, &[2][..])]),
            Err(EngineError::Transfer(_))
        ));
        e.free_seq(2).unwrap();
        assert!(matches!(
            e.forward_batch(&[(2, &[1][..])]),
            Err(EngineError::BadSequence(2))
        ));
    }
}
