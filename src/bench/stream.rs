//! `bench stream`: the streaming scenarios (S1, a half-model budget, each upload path) against
//! all-resident, run in turn over the same prompt with a cold page cache, a raw cold read
//! beside every run.

use serde::Serialize;

use super::{BENCH_TEXT, median, raw_cold_read};
use crate::engine::{Engine, EngineOptions};
use crate::sampling::{Sampler, SamplerParams};

/// One streaming scenario's figures.
#[derive(Debug, Clone, Serialize)]
pub struct StreamRow {
    pub scenario: String,
    pub gpu_budget: u64,
    pub placement: String,
    pub io: String,
    pub cold_cache: bool,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Median decode milliseconds per token.
    pub ms_per_token: f64,
    /// Its median over the all-resident run's median.
    pub ms_per_token_vs_resident: f64,
    /// The median over the rounds of its run over the all-resident run of the same round:
    /// the machine's drift from one round to the next cancels.
    pub ms_per_token_vs_resident_paired: f64,
    pub flash_bytes_per_token: f64,
    pub overlap_efficiency: f64,
    pub io_wait_share: f64,
    /// Flash-to-GPU throughput of the staging ring: bytes uploaded / time inside uploads
    /// less the time spent waiting for the GPU to free a staging slot.
    pub upload_gb_s: f64,
    /// Its ratio to the raw cold-read GB/s of the same run.
    pub upload_over_raw_cold: f64,
    pub peak_device_bytes: u64,
    pub ttft_ms: f64,
    /// The performance model's ms/token and time to first token for this run, from this
    /// machine's calibration (`flashlm calibrate`); None when it is not calibrated.
    pub predicted_ms_per_token: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
    /// The same from the calibration carried to the speed probe taken before each run (None
    /// when the calibration has no probe).
    pub probed_ms_per_token: Option<f64>,
    pub probed_ttft_ms: Option<f64>,
}

/// The streaming benchmark (scenario S1 and a half-model budget, against all-resident).
#[derive(Debug, Clone, Serialize)]
pub struct StreamReport {
    pub adapter: String,
    pub backend: String,
    pub raw_cold_read_gb_s: f64,
    pub eviction_verified: bool,
    /// Rounds run: each ran every scenario once, in turn.
    pub rounds: usize,
    pub rows: Vec<StreamRow>,
    /// The speed probes taken before the runs (empty when the calibration has none).
    pub probes: Vec<crate::plan::perf::Probe>,
}

impl StreamReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {} ({}); {} rounds, each running every scenario once in turn; raw cold read {:.2} GB/s, median over the runs (page-cache eviction {})\n\n\
             | scenario | budget | I/O | placement | ms/token (median) | vs resident | vs resident, same round (median) | flash bytes/token | overlap eff. | GPU idle | ring GB/s | ring / raw cold (same run) | peak device bytes |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.adapter,
            self.backend,
            self.rounds,
            self.raw_cold_read_gb_s,
            if self.eviction_verified {
                "verified"
            } else {
                "NOT verified: figures may include page-cache hits"
            }
        );
        let predicted: Vec<&StreamRow> = self
            .rows
            .iter()
            .filter(|r| r.predicted_ms_per_token.is_some())
            .collect();
        let mut model = String::new();
        if predicted.is_empty() {
            model.push_str(
                "\nNo calibration on this machine (`flashlm calibrate`): no predictions.\n",
            );
        } else {
            model.push_str(
                "\nPerformance model (`flashlm calibrate` constants): predicted against measured, same runs; the probed prediction \
                 carries the calibration to the speed probe taken before each run (its TTFT is the probed one where probed)\n\n\
                 | scenario | ms/token predicted | measured | error | probed prediction | error | TTFT predicted, ms | measured | error |\n\
                 |---|---|---|---|---|---|---|---|---|\n",
            );
            for r in predicted {
                let p = r.predicted_ms_per_token.unwrap_or(0.0);
                let t = r.probed_ttft_ms.or(r.predicted_ttft_ms).unwrap_or(0.0);
                let probed = match r.probed_ms_per_token {
                    Some(q) => format!(
                        "{q:.1} | {:+.0}%",
                        (q / r.ms_per_token.max(1e-9) - 1.0) * 100.0
                    ),
                    None => "not probed | -".to_string(),
                };
                model.push_str(&format!(
                    "| {} | {:.1} | {:.1} | {:+.0}% | {probed} | {:.0} | {:.0} | {:+.0}% |\n",
                    r.scenario,
                    p,
                    r.ms_per_token,
                    (p / r.ms_per_token.max(1e-9) - 1.0) * 100.0,
                    t,
                    r.ttft_ms,
                    (t / r.ttft_ms.max(1e-9) - 1.0) * 100.0
                ));
            }
        }
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.0} | {:.2} | {:.0}% | {:.3} | {:.2} | {} |\n",
                r.scenario,
                if r.gpu_budget == u64::MAX {
                    "none".to_string()
                } else {
                    format!("{:.1} MiB", r.gpu_budget as f64 / 1048576.0)
                },
                r.io,
                r.placement,
                r.ms_per_token,
                r.ms_per_token_vs_resident,
                r.ms_per_token_vs_resident_paired,
                r.flash_bytes_per_token,
                r.overlap_efficiency,
                r.io_wait_share * 100.0,
                r.upload_gb_s,
                r.upload_over_raw_cold,
                r.peak_device_bytes
            ));
        }
        s.push_str(&model);
        s
    }
}

/// One streaming run: median ms/token, its figures, whether the cache was cold, the placement,
/// the budget, the raw cold read beside it, the predictions (ms/token, TTFT) from the saved
/// and from the probed calibration.
type RunFigures = (
    f64,
    crate::engine::GenStats,
    bool,
    String,
    u64,
    f64,
    Option<(f64, f64)>,
    Option<(f64, f64)>,
);

/// Settings of one streaming scenario.
pub struct Scenario {
    pub name: String,
    pub budget: Option<u64>,
    pub io: crate::flash::IoMode,
    /// How streamed weights reach the device (None: the options' choice).
    pub upload: Option<crate::engine::UploadMode>,
}

/// One run of one streaming scenario: load the engine with a cold page cache, prefill the
/// prompt and decode `n_gen` greedy tokens. `raw` is the raw cold read measured beside it.
fn stream_run(
    model: &crate::model::LoadedModel,
    base: &EngineOptions,
    sc: &Scenario,
    prompt: &[u32],
    n_gen: usize,
    // The calibration as saved, and carried to the probe taken before this run.
    (cal, probed): (
        Option<&crate::plan::perf::Calibration>,
        Option<&crate::plan::perf::Calibration>,
    ),
    raw: f64,
) -> Result<(RunFigures, String, String), Box<dyn std::error::Error>> {
    use crate::flash::source::FlashSource;
    use crate::flash::{FlashFile, ReaderOptions};
    let mut opts = base.clone();
    opts.gpu.budget = sc.budget;
    opts.ctx = Some(prompt.len() + n_gen);
    if let Some(u) = sc.upload {
        opts.upload = u;
    }
    let file = FlashFile::open(
        &model.path,
        ReaderOptions {
            mode: sc.io,
            ..Default::default()
        },
    )?;
    model.gguf.release_pages();
    let ev = crate::flash::evict_page_cache(&model.path)?;
    let mut engine = Engine::with_source(
        model.gguf.clone(),
        std::sync::Arc::new(FlashSource::new(file, 0)),
        &opts,
    )?;
    // Loading read the resident weights; evict again so decoding starts cold.
    model.gguf.release_pages();
    let ev2 = crate::flash::evict_page_cache(&model.path)?;
    let mut sampler = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    let (_, s) = engine.generate(prompt, n_gen, &mut sampler, |_| false, |_| true)?;
    let mut ms = s.token_ms.clone();
    let med = median(&mut ms);
    let predict = |c: &crate::plan::perf::Calibration| {
        let (p, ttft) = engine.predict(c, 0, prompt.len(), s.selection_reuse);
        (p.ms_per_token, ttft)
    };
    let pred = cal.map(predict);
    let probed = probed.map(predict);
    eprintln!(
        "{}: {:.1} ms/token{}{}, {}",
        sc.name,
        med,
        pred.map(|p| format!(" (predicted {:.1})", p.0))
            .unwrap_or_default(),
        probed
            .map(|p| format!(" (probed {:.1})", p.0))
            .unwrap_or_default(),
        engine.placement
    );
    let placement = if engine.placement.streaming {
        format!(
            "{}; layers {}",
            engine.placement,
            if engine.in_place {
                "read in place"
            } else {
                "copied from the staging ring"
            }
        )
    } else {
        engine.placement.to_string()
    };
    let figures = (
        med,
        s,
        ev.effective() && ev2.effective(),
        placement,
        engine.placement.budget,
        raw,
        pred,
        probed,
    );
    Ok((
        figures,
        engine.ctx.info.name.clone(),
        engine.ctx.backend_name(),
    ))
}

/// Run the scenarios over the same prompt: each loads the engine with a cold page cache,
/// prefills `prompt_tokens` and decodes `n_gen` greedy tokens.
pub fn stream(
    model: &crate::model::LoadedModel,
    base: &EngineOptions,
    scenarios: &[Scenario],
    prompt_tokens: usize,
    n_gen: usize,
    runs: usize,
) -> Result<StreamReport, Box<dyn std::error::Error>> {
    let mut raws = Vec::new();
    let mut verified = true;
    let mut prompt = model.tokenizer.encode(BENCH_TEXT, false);
    while prompt.len() < prompt_tokens {
        let again = prompt.clone();
        prompt.extend(again);
    }
    prompt.truncate(prompt_tokens);
    let mut rows: Vec<StreamRow> = Vec::new();
    let mut adapter = String::new();
    let mut backend = String::new();
    let mut resident_ms = None;
    let mut resident_runs: Vec<f64> = Vec::new();
    let cal = crate::plan::perf::Calibration::load(&crate::plan::perf::Calibration::path()).ok();
    let mut prober = super::probe::Prober::for_calibration(cal.as_ref(), &base.gpu);
    let mut probes = Vec::new();
    // Rounds run the scenarios in turn (round 1: A, B, C; round 2: A, B, C...), so that a slow
    // spell of a shared machine falls on every scenario instead of on one scenario's runs.
    let mut per_sc: Vec<Vec<RunFigures>> = scenarios.iter().map(|_| Vec::new()).collect();
    for _ in 0..runs.max(1) {
        for (sc, per_run) in scenarios.iter().zip(per_sc.iter_mut()) {
            // The disk's rate moves between runs: a raw cold read beside every run.
            model.gguf.release_pages();
            let (r, v) = raw_cold_read(&model.path)?;
            raws.push(r);
            verified &= v;
            let probed = match (&cal, prober.as_mut()) {
                (Some(c), Some(p)) => Some(super::probe::probed(c, p)?),
                _ => None,
            };
            if let Some((c, line)) = &probed {
                eprintln!("{line}");
                probes.extend(c.probe.clone());
            }
            let pc = probed.as_ref().map(|p| &p.0);
            let (figures, a, b) =
                stream_run(model, base, sc, &prompt, n_gen, (cal.as_ref(), pc), r)?;
            adapter = a;
            backend = b;
            per_run.push(figures);
        }
    }
    for (sc, per_run) in scenarios.iter().zip(per_sc) {
        let m = |f: &dyn Fn(&RunFigures) -> f64| {
            let mut v: Vec<f64> = per_run.iter().map(f).collect();
            median(&mut v)
        };
        let runs_ms: Vec<f64> = per_run.iter().map(|r| r.0).collect();
        let med = median(&mut runs_ms.clone());
        if resident_ms.is_none() && sc.budget.is_none() {
            resident_ms = Some(med);
            resident_runs = runs_ms.clone();
        }
        let last = &per_run[per_run.len() - 1];
        rows.push(StreamRow {
            scenario: sc.name.clone(),
            gpu_budget: last.4,
            placement: last.3.clone(),
            io: sc.io.to_string(),
            cold_cache: per_run.iter().all(|r| r.2),
            prompt_tokens: prompt.len(),
            generated_tokens: last.1.generated_tokens,
            ms_per_token: med,
            ms_per_token_vs_resident: 0.0,
            ms_per_token_vs_resident_paired: paired_ratio(&runs_ms, &resident_runs),
            flash_bytes_per_token: m(&|r| r.1.flash_bytes_per_token),
            overlap_efficiency: m(&|r| r.1.overlap_efficiency),
            io_wait_share: m(&|r| r.1.io_wait_share),
            upload_gb_s: m(&|r| r.1.flash_to_gpu_gb_s),
            upload_over_raw_cold: m(&|r| r.1.flash_to_gpu_gb_s / r.5.max(1e-12)),
            peak_device_bytes: per_run
                .iter()
                .map(|r| r.1.peak_device_bytes)
                .max()
                .unwrap_or(0),
            ttft_ms: m(&|r| r.1.ttft_ms),
            predicted_ms_per_token: per_run[0].6.map(|_| m(&|r| r.6.map_or(0.0, |p| p.0))),
            predicted_ttft_ms: per_run[0].6.map(|_| m(&|r| r.6.map_or(0.0, |p| p.1))),
            probed_ms_per_token: per_run[0].7.map(|_| m(&|r| r.7.map_or(0.0, |p| p.0))),
            probed_ttft_ms: per_run[0].7.map(|_| m(&|r| r.7.map_or(0.0, |p| p.1))),
        });
    }
    let raw = median(&mut raws);
    if let Some(r) = resident_ms {
        for row in &mut rows {
            row.ms_per_token_vs_resident = row.ms_per_token / r;
        }
    }
    Ok(StreamReport {
        adapter,
        backend,
        raw_cold_read_gb_s: raw,
        eviction_verified: verified,
        rounds: runs.max(1),
        rows,
        probes,
    })
}

/// The median over rounds of `runs[i] / resident[i]` (runs of the same round side by side); 0
/// where there is no resident run to pair with.
pub fn paired_ratio(runs: &[f64], resident: &[f64]) -> f64 {
    let mut r: Vec<f64> = runs
        .iter()
        .zip(resident)
        .filter(|(_, b)| **b > 0.0)
        .map(|(a, b)| a / b)
        .collect();
    median(&mut r)
}

#[cfg(test)]
mod tests {
    use super::paired_ratio;

    #[test]
    fn ratios_pair_runs_of_the_same_round() {
        // Rounds of 90/45, 56/42 and 81/60: ratios 2.0, 1.33 and 1.35, median 1.35 (the
        // medians' ratio would read 81/45 = 1.8).
        assert!((paired_ratio(&[90.0, 56.0, 81.0], &[45.0, 42.0, 60.0]) - 1.35).abs() < 1e-12);
        // An even count: the mean of the middle two; no resident runs: 0.
        assert_eq!(paired_ratio(&[10.0, 20.0], &[10.0, 10.0]), 1.5);
        assert_eq!(paired_ratio(&[10.0], &[]), 0.0);
    }
}
