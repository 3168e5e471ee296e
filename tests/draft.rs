//! Prompt-lookup drafting: greedy output identical to plain decoding (resident and streamed,
//! synthetic and real model), with drafts actually accepted on a prompt that repeats itself.
//! (The sampling rule's distribution is checked in `sampling::tests`.)
mod common;

use std::sync::Arc;

use flashlm::engine::draft::DraftConfig;
use flashlm::engine::{Engine, EngineOptions, ResidentSpec};
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

fn compare(gguf: Arc<GgufFile>, prompt: &[u32], n: usize, streamed: bool) -> (u64, f64) {
    let cfg = DraftConfig { ngram: 3, max: 5 };
    let mut o = EngineOptions {
        ctx: Some(512),
        logit_rows: cfg.max + 1,
        ..Default::default()
    };
    if streamed {
        o.gpu = GpuOptions::default();
        o.resident = ResidentSpec::parse("none", 64).unwrap_or(ResidentSpec::Auto);
    }
    let mut plain = Engine::new(gguf.clone(), &o).unwrap();
    let (want, _) = plain
        .generate(prompt, n, &mut greedy(), |_| false, |_| true)
        .unwrap();
    drop(plain);
    let mut e = Engine::new(gguf, &o).unwrap();
    let (got, _, ds) = e
        .generate_drafted(prompt, n, &mut greedy(), &cfg, |_| false, |_| true)
        .unwrap();
    assert_eq!(
        got, want,
        "drafted greedy output differs (streamed {streamed})"
    );
    // The cache holds exactly the tokens fed: the prompt and all but the last output.
    assert_eq!(e.n_past(), prompt.len() + n - 1);
    (ds.accepted, ds.tokens_per_pass)
}

#[test]
fn synthetic_greedy_drafting_equals_plain_decoding() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 3,
        ..SyntheticSpec::tiny(GgmlType::Q8_0)
    };
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 13)).unwrap());
    let base: Vec<u32> = (0..12).map(|k| (k * 37 + 5) % 300).collect();
    let mut prompt = base.clone();
    prompt.extend_from_slice(&base);
    prompt.extend_from_slice(&base[..5]);
    for streamed in [false, true] {
        compare(gguf.clone(), &prompt, 40, streamed);
    }
}

#[test]
fn real_model_drafts_are_accepted_on_repeated_text() {
    let Some(path) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let tk = flashlm::model::tokenizer::Tokenizer::from_gguf(&gguf).unwrap();
    let text = "Copy the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes, figs.\nCopy: apples, pears, plums,";
    let prompt = tk.encode(text, false);
    let (accepted, per_pass) = compare(gguf, &prompt, 24, false);
    assert!(accepted > 0, "no draft accepted on a copying prompt");
    assert!(per_pass > 1.0, "{per_pass} tokens per pass");
}
