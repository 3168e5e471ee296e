//! Benchmarks behind `flashlm bench` (and `cargo bench`). Each reports medians of several runs
//! measured side by side in one process.

pub mod io;

use std::sync::Arc;

use serde::Serialize;

use crate::engine::{Engine, EngineOptions};
use crate::gguf::GgufFile;
use crate::model::tokenizer::Tokenizer;
use crate::sampling::{Sampler, SamplerParams};

/// A fixed English passage used as the benchmark prompt.
pub const BENCH_TEXT: &str = "The history of computing is a story of ever smaller machines doing ever larger \
amounts of work. Early computers filled whole rooms, consumed enormous amounts of power and were \
programmed by rewiring panels by hand. The invention of the transistor, and later of the integrated \
circuit, changed everything: memory became cheap, processors became fast, and storage moved from \
punched cards to magnetic disks and finally to flash. Today a laptop carries more memory than all";

pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Figures of the all-resident benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct ResidentReport {
    pub adapter: String,
    pub backend: String,
    pub runs: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub ttft_ms: f64,
    pub weight_bytes_per_token: u64,
    pub matvec_gb_s: f64,
    pub memcpy_gb_s: f64,
    pub matvec_over_memcpy: f64,
    pub peak_device_bytes: u64,
}

impl ResidentReport {
    pub fn to_markdown(&self) -> String {
        format!(
            "| figure | value |\n|---|---|\n\
             | adapter / backend | {} / {} |\n\
             | prompt tokens / generated tokens | {} / {} |\n\
             | prefill tok/s (median of {}) | {:.1} |\n\
             | decode tok/s (median) | {:.2} |\n\
             | time to first token, ms (median) | {:.0} |\n\
             | weight bytes read per decoded token | {} |\n\
             | quantized matvec, GB/s of weight bytes (median) | {:.2} |\n\
             | device memcpy of the same bytes, GB/s (median) | {:.2} |\n\
             | matvec / memcpy | {:.2} |\n\
             | peak device bytes | {} |",
            self.adapter,
            self.backend,
            self.prompt_tokens,
            self.generated_tokens,
            self.runs,
            self.prefill_tok_s,
            self.decode_tok_s,
            self.ttft_ms,
            self.weight_bytes_per_token,
            self.matvec_gb_s,
            self.memcpy_gb_s,
            self.matvec_over_memcpy,
            self.peak_device_bytes
        )
    }
}

/// Generation with every weight resident, plus the matvec bandwidth against a device copy.
pub fn resident(
    gguf: Arc<GgufFile>,
    opts: &EngineOptions,
    tokenizer: &Tokenizer,
    runs: usize,
) -> Result<ResidentReport, Box<dyn std::error::Error>> {
    let mut engine = Engine::new(gguf, opts)?;
    let mut prompt = tokenizer.encode(BENCH_TEXT, false);
    prompt.truncate(64);
    let n_gen = 64;
    let (mut pre, mut dec, mut ttft) = (Vec::new(), Vec::new(), Vec::new());
    let mut generated = 0;
    // One warm-up run, then the counted ones.
    for r in 0..=runs {
        engine.reset();
        let mut sampler = Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        });
        let (_, s) = engine.generate(&prompt, n_gen, &mut sampler, |_| false, |_| true)?;
        eprintln!(
            "run {r}: prefill {:.1} tok/s, decode {:.2} tok/s",
            s.prefill_tok_s, s.decode_tok_s
        );
        if r > 0 {
            pre.push(s.prefill_tok_s);
            dec.push(s.decode_tok_s);
            ttft.push(s.ttft_ms);
            generated = s.generated_tokens;
        }
    }
    let bytes = engine.matvec_weight_bytes();
    let reps = 8;
    let (mut mv, mut cp) = (Vec::new(), Vec::new());
    engine.time_matvecs(1)?;
    engine.time_weight_copies(1)?;
    for _ in 0..runs {
        let t = engine.time_matvecs(reps)?;
        mv.push((bytes * reps as u64) as f64 / t / 1e9);
        let t = engine.time_weight_copies(reps)?;
        cp.push((bytes * reps as u64) as f64 / t / 1e9);
    }
    let matvec_gb_s = median(&mut mv);
    let memcpy_gb_s = median(&mut cp);
    Ok(ResidentReport {
        adapter: engine.ctx.info.name.clone(),
        backend: engine.ctx.backend_name(),
        runs,
        prompt_tokens: prompt.len(),
        generated_tokens: generated,
        prefill_tok_s: median(&mut pre),
        decode_tok_s: median(&mut dec),
        ttft_ms: median(&mut ttft),
        weight_bytes_per_token: bytes,
        matvec_gb_s,
        memcpy_gb_s,
        matvec_over_memcpy: matvec_gb_s / memcpy_gb_s.max(1e-12),
        peak_device_bytes: engine.ctx.budget.peak(),
    })
}
