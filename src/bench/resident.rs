//! `bench resident`: generation with every weight resident, the decode products' rate against
//! a device copy and a roofline kernel of the same bytes, and the cost of a dispatch.

use std::sync::Arc;

use serde::Serialize;

use super::{BENCH_TEXT, median};
use crate::engine::{Engine, EngineOptions};
use crate::gguf::GgufFile;
use crate::model::tokenizer::Tokenizer;
use crate::sampling::{Sampler, SamplerParams};

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
    /// A kernel streaming the same weight bytes with one XOR per 16 bytes.
    pub roofline_gb_s: f64,
    pub matvec_over_roofline: f64,
    /// The same kernel loading 32 bytes at a time as 64-bit words (None where the device has
    /// no 64-bit integers), and the matvec's rate against it.
    pub roofline_wide_gb_s: Option<f64>,
    pub matvec_over_roofline_wide: Option<f64>,
    /// Microseconds per empty dispatch (2000 in one submission).
    pub dispatch_us: f64,
    pub peak_device_bytes: u64,
    /// Median decode milliseconds per token, and the performance model's figure for the same
    /// runs (None when this machine is not calibrated).
    pub ms_per_token: f64,
    pub predicted_ms_per_token: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
    /// The same from the calibration carried to the speed probe taken before each run (None
    /// when the calibration has no probe).
    pub probed_ms_per_token: Option<f64>,
    pub probed_ttft_ms: Option<f64>,
    /// The speed probes taken before the runs (empty when the calibration has none).
    pub probes: Vec<crate::plan::perf::Probe>,
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
             | roofline kernel (one XOR per 16 bytes), GB/s of the same bytes (median) | {:.2} |\n\
             | matvec / roofline | {:.2} |\n\
             | roofline kernel with 64-bit loads (one XOR per 32 bytes), GB/s (median) | {} |\n\
             | matvec / roofline with 64-bit loads | {} |\n\
             | empty dispatch, µs each (2000 in one submission, median) | {:.1} |\n\
             | peak device bytes | {} |\n\
             | decode ms/token: measured (median) / predicted / probed prediction | {:.2} / {} / {} |\n\
             | time to first token, ms: predicted / probed prediction | {} / {} |",
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
            self.roofline_gb_s,
            self.matvec_over_roofline,
            self.roofline_wide_gb_s
                .map_or("no 64-bit integers".into(), |r| format!("{r:.2}")),
            self.matvec_over_roofline_wide
                .map_or("-".into(), |r| format!("{r:.2}")),
            self.dispatch_us,
            self.peak_device_bytes,
            self.ms_per_token,
            self.predicted_ms_per_token
                .map_or("not calibrated".into(), |p| format!("{p:.2}")),
            self.probed_ms_per_token
                .map_or("not probed".into(), |p| format!("{p:.2}")),
            self.predicted_ttft_ms
                .map_or("not calibrated".into(), |p| format!("{p:.0}")),
            self.probed_ttft_ms
                .map_or("not probed".into(), |p| format!("{p:.0}")),
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
    let (mut ms, mut pred) = (Vec::new(), Vec::new());
    let cal = crate::plan::perf::Calibration::load(&crate::plan::perf::Calibration::path()).ok();
    let mut prober = super::probe::Prober::for_calibration(cal.as_ref(), &opts.gpu);
    let mut probed_pred = Vec::new();
    let mut probes = Vec::new();
    let mut generated = 0;
    // One warm-up run, then the counted ones.
    for r in 0..=runs {
        let probed = match (&cal, prober.as_mut()) {
            (Some(c), Some(p)) if r > 0 => Some(super::probe::probed(c, p)?),
            _ => None,
        };
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
            ms.push(s.ms_per_token);
            if let Some(c) = &cal {
                pred.push(engine.predict(c, 0, prompt.len(), s.selection_reuse));
            }
            if let Some((c, line)) = &probed {
                let p = engine.predict(c, 0, prompt.len(), s.selection_reuse);
                eprintln!("{line}; probed prediction {:.1} ms/token", p.0.ms_per_token);
                probes.extend(c.probe.clone());
                probed_pred.push(p);
            }
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
    // Both rooflines in turn: 16-byte loads (what the products load) and, where the device has
    // 64-bit integers, 32-byte ones.
    let wide = engine.ctx.int64;
    let (mut rf, mut rw, mut ov) = (Vec::new(), Vec::new(), Vec::new());
    engine.time_roofline(1, false)?;
    if wide {
        engine.time_roofline(1, true)?;
    }
    for _ in 0..runs {
        let t = engine.time_roofline(reps, false)?;
        rf.push((bytes * reps as u64) as f64 / t / 1e9);
        if wide {
            let t = engine.time_roofline(reps, true)?;
            rw.push((bytes * reps as u64) as f64 / t / 1e9);
        }
        ov.push(engine.time_empty_dispatch(2000)? * 1e6);
    }
    let matvec_gb_s = median(&mut mv);
    let memcpy_gb_s = median(&mut cp);
    let roofline_gb_s = median(&mut rf);
    let roofline_wide_gb_s = (!rw.is_empty()).then(|| median(&mut rw));
    let dispatch_us = median(&mut ov);
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
        roofline_gb_s,
        matvec_over_roofline: matvec_gb_s / roofline_gb_s.max(1e-12),
        roofline_wide_gb_s,
        matvec_over_roofline_wide: roofline_wide_gb_s.map(|r| matvec_gb_s / r.max(1e-12)),
        dispatch_us,
        peak_device_bytes: engine.ctx.budget.peak(),
        ms_per_token: median(&mut ms),
        predicted_ms_per_token: (!pred.is_empty())
            .then(|| median(&mut pred.iter().map(|p| p.0.ms_per_token).collect::<Vec<_>>())),
        predicted_ttft_ms: (!pred.is_empty())
            .then(|| median(&mut pred.iter().map(|p| p.1).collect::<Vec<_>>())),
        probed_ms_per_token: (!probed_pred.is_empty()).then(|| {
            median(
                &mut probed_pred
                    .iter()
                    .map(|p| p.0.ms_per_token)
                    .collect::<Vec<_>>(),
            )
        }),
        probed_ttft_ms: (!probed_pred.is_empty())
            .then(|| median(&mut probed_pred.iter().map(|p| p.1).collect::<Vec<_>>())),
        probes,
    })
}
