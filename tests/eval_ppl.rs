//! `eval ppl` under the engine matches the perplexity the CPU reference forward pass gives on the
//! same chunks, resident and streamed, with page selection keeping every page.
//!
//! Tolerance: 2e-3 relative on the perplexity (the engine rounds K and V to f16 like the
//! reference does here, and accumulates in another order).
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::eval::ppl::{self, PplAccumulator};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::config::ModelConfig;
use flashlm::model::reference::CpuModel;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::KvSelect;

fn cpu_ppl(gguf: &GgufFile, chunks: &[ppl::Chunk]) -> f64 {
    let cfg = ModelConfig::from_gguf(gguf).unwrap();
    let m = CpuModel::from_gguf(gguf, &cfg).unwrap();
    let mut acc = PplAccumulator::default();
    for c in chunks {
        let mut st = m.new_state_kv(c.tokens.len(), true);
        let first = ppl::first_scored(c.tokens.len());
        for (j, &t) in c.tokens.iter().enumerate().take(c.tokens.len() - 1) {
            let logits = m.forward(&mut st, t, j).unwrap();
            if j >= first {
                acc.add_logits(&logits, c.tokens[j + 1]).unwrap();
            }
        }
        acc.add_chunk();
    }
    acc.ppl()
}

fn check(gguf: Arc<GgufFile>, tokens: &[u32], ctx: usize, budgets: &[Option<u64>]) {
    let chunks = ppl::chunks(tokens, ctx, Some(2), None).unwrap();
    let want = cpu_ppl(&gguf, &chunks);
    for &budget in budgets {
        for select in [None, Some("quest:100%")] {
            let o = EngineOptions {
                gpu: GpuOptions {
                    budget,
                    ..Default::default()
                },
                ctx: Some(ctx),
                logit_rows: 4,
                kv_page: Some(8),
                kv_select: select.map(|s| KvSelect::parse(s, 0).unwrap()),
                ..Default::default()
            };
            let mut e = Engine::new(gguf.clone(), &o).unwrap();
            let r = flashlm::eval::perplexity(&mut e, &chunks, &mut |_, _| {}).unwrap();
            assert_eq!(r.chunks, 2);
            assert_eq!(r.tokens, 2 * ppl::scored_per_chunk(ctx));
            assert!(
                (r.ppl - want).abs() <= 2e-3 * want,
                "budget {budget:?}, {select:?}: engine ppl {} vs CPU {want}",
                r.ppl
            );
        }
    }
}

#[test]
fn synthetic_model_ppl_matches_cpu_reference() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec::tiny(GgmlType::Q8_0);
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 31)).unwrap());
    let tokens: Vec<u32> = (0..200).map(|k| (k * 37 + 11) % 320).collect();
    check(gguf, &tokens, 40, &[None, Some(300_000)]);
}

#[test]
fn real_model_ppl_matches_cpu_reference() {
    let Some(path) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let tk = flashlm::model::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/persuasion.txt"))
        .unwrap();
    let tokens = tk.encode(&text[..4000], false);
    check(gguf, &tokens, 48, &[None]);
}
