//! The figures of `bench kv`, its goal lines and its markdown.

use serde::Serialize;

use super::s2::{S1, S2};

/// The page-size rule: the smallest page whose decode ms/token is within this share of the
/// fastest page size's (smaller pages select more finely and keep a smaller window on the
/// device; the time per token is what small flash reads cost).
pub const PAGE_RULE_TOLERANCE: f64 = 0.05;
/// Goal: exact S2 ms/token at most this many times S1 + the KV bytes at the flash rate.
pub const GOAL_S2_OVER_BOUND: f64 = 1.5;
/// Goal: resumed TTFT this many times faster than cold.
pub const GOAL_TTFT_SPEEDUP: f64 = 10.0;

/// One attention mode of S2 at one host-cache size (medians over the runs).
#[derive(Debug, Clone, Serialize)]
pub struct ModeRow {
    pub mode: String,
    pub runs: usize,
    /// Host cache (`--dram-budget`) of the runs: 0, or the streamed weights plus
    /// `kv_cache_share` of the streamed KV bytes.
    pub dram_budget: u64,
    pub kv_cache_share: f64,
    /// Weight bytes each token streams under the plan, and KV bytes on flash at the run's end.
    pub streamed_weight_bytes: u64,
    pub streamed_kv_bytes: u64,
    pub ms_per_token: f64,
    pub kv_flash_bytes_per_token: f64,
    /// KV bytes brought to the device per token (host-cache hits included).
    pub kv_bytes_per_token: f64,
    pub weight_bytes_per_token: f64,
    pub kv_bytes_written_per_token: f64,
    pub kv_pages_written: u64,
    pub hit_rate: f64,
    pub hit_rate_predicted: f64,
    pub kv_flash_predicted: f64,
    pub prefetch_hit_rate: f64,
    pub selection_reuse: f64,
    pub overlap_efficiency: f64,
    /// Runs that prefilled the prompt cold (the others resumed it from the session).
    pub cold_runs: usize,
    /// TTFT of the cold runs, median (NaN when every run resumed).
    pub ttft_ms: f64,
    pub peak_device_bytes: u64,
    pub placement: String,
    /// The performance model's ms/token and TTFT (when this machine is calibrated).
    pub predicted_ms_per_token: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
    /// The same from the calibration carried to the speed probe taken before each run (None
    /// when the calibration has no probe).
    pub probed_ms_per_token: Option<f64>,
    pub probed_ttft_ms: Option<f64>,
}

/// One point of the hit-rate model's sweep (medians over the runs).
#[derive(Debug, Clone, Serialize)]
pub struct ModelPoint {
    pub mode: String,
    pub ctx: usize,
    pub runs: usize,
    pub dram_budget: u64,
    pub kv_cache_share: f64,
    pub streamed_kv_bytes: u64,
    pub hit_predicted: f64,
    pub hit_measured: f64,
    pub kv_flash_predicted: f64,
    pub kv_flash_measured: f64,
    /// |predicted - measured| / measured KV bytes from flash (0 when both are 0).
    pub bytes_error: f64,
}

/// One page size at the S2 setting.
#[derive(Debug, Clone, Serialize)]
pub struct PageRow {
    pub page_tokens: u32,
    /// Prompt tokens each run prefilled.
    pub prompt_tokens: usize,
    pub runs: usize,
    pub decoded_tokens: usize,
    pub ms_per_token: f64,
    pub prefill_tok_s: f64,
    pub ttft_ms: f64,
    pub kv_flash_bytes_per_token: f64,
    pub kv_pages_per_token: f64,
    /// Bytes through the staging ring over the I/O thread's time (weights and KV pages).
    pub flash_to_gpu_gb_s: f64,
    pub page_bytes: u64,
    pub home_pages: u32,
    pub halves: u32,
    pub peak_device_bytes: u64,
    /// Why this size did not run (it does not fit the budget, ...); its figures are NaN/0.
    pub not_run: Option<String>,
}

impl PageRow {
    /// A page size that could not run, and why.
    pub fn not_run(
        page_tokens: u32,
        prompt_tokens: usize,
        decoded_tokens: usize,
        why: String,
    ) -> Self {
        PageRow {
            page_tokens,
            prompt_tokens,
            runs: 0,
            decoded_tokens,
            ms_per_token: f64::NAN,
            prefill_tok_s: f64::NAN,
            ttft_ms: f64::NAN,
            kv_flash_bytes_per_token: f64::NAN,
            kv_pages_per_token: f64::NAN,
            flash_to_gpu_gb_s: f64::NAN,
            page_bytes: 0,
            home_pages: 0,
            halves: 0,
            peak_device_bytes: 0,
            not_run: Some(why),
        }
    }
}

/// A goal of the issue, checked against this run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub goal: String,
    /// None when the figures it needs were not measured.
    pub met: Option<bool>,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct KvReport {
    pub adapter: String,
    pub backend: String,
    pub text: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub gpu_budget: u64,
    pub runs: usize,
    pub page_tokens: u32,
    pub raw_cold_read_gb_s: f64,
    /// Every page-cache eviction took effect (false: "cold" runs may have hit the page cache).
    pub cold_cache_verified: bool,
    pub s1_prompt_tokens: usize,
    pub s1_ms_per_token: f64,
    pub s1_weight_bytes_per_token: f64,
    pub s1_kv_flash_bytes_per_token: f64,
    pub s1_kv_streams: bool,
    pub rows: Vec<ModeRow>,
    /// Exact S2 (no host cache) ms/token over (S1 ms/token + its KV flash bytes per token at
    /// the raw cold-read rate).
    pub exact_over_s1_plus_kv: f64,
    pub ttft_cold_ms: f64,
    pub ttft_resumed_ms: f64,
    pub ttft_speedup: f64,
    pub model: Vec<ModelPoint>,
    pub pages: Vec<PageRow>,
    /// The page size [`recommend_page`] picks from `pages`.
    pub recommended_page_tokens: Option<u32>,
    pub goals: Vec<Goal>,
    /// The speed probes taken before the S2 runs (empty when the calibration has none).
    pub probes: Vec<crate::plan::perf::Probe>,
}

/// What [`assemble`] puts together.
pub struct Parts {
    pub adapter: String,
    pub backend: String,
    pub text: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub gpu_budget: u64,
    pub runs: usize,
    pub raw_cold_read_gb_s: f64,
    pub cold_cache_verified: bool,
    pub s1: S1,
    pub s2: S2,
    pub ttft_resumed_ms: f64,
    pub model: Vec<ModelPoint>,
    pub pages: Vec<PageRow>,
}

/// The smallest page size whose ms/token is within [`PAGE_RULE_TOLERANCE`] of the fastest.
pub fn recommend_page(pages: &[PageRow]) -> Option<u32> {
    let best = pages
        .iter()
        .map(|p| p.ms_per_token)
        .filter(|t| t.is_finite())
        .min_by(|a, b| a.total_cmp(b))?;
    pages
        .iter()
        .filter(|p| p.ms_per_token <= best * (1.0 + PAGE_RULE_TOLERANCE))
        .map(|p| p.page_tokens)
        .min()
}

pub fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "not met",
        None => "not measured",
    }
}

/// The goal lines from the figures.
fn goals(r: &KvReport) -> Vec<Goal> {
    let mut g = Vec::new();
    let exact = r
        .rows
        .iter()
        .find(|m| m.mode == "exact" && m.dram_budget == 0);
    g.push(match exact {
        Some(e) => {
            let kv_ms = e.kv_flash_bytes_per_token / (r.raw_cold_read_gb_s * 1e9).max(1e-9) * 1e3;
            let bound = r.s1_ms_per_token + kv_ms;
            let ratio = e.ms_per_token / bound.max(1e-9);
            Goal {
                goal: format!(
                    "exact S2 within {GOAL_S2_OVER_BOUND}x of S1 weights-only streaming + KV bytes at the flash rate"
                ),
                met: Some(ratio <= GOAL_S2_OVER_BOUND),
                detail: format!(
                    "exact S2 {:.1} ms/token; S1 {:.1} ms/token + {:.0} KV B/token at {:.2} GB/s ({:.1} ms) = {:.1} ms; ratio {:.2}{}",
                    e.ms_per_token,
                    r.s1_ms_per_token,
                    e.kv_flash_bytes_per_token,
                    r.raw_cold_read_gb_s,
                    kv_ms,
                    bound,
                    ratio,
                    if r.s1_kv_streams {
                        format!(
                            " (S1's KV cache streamed too: {:.0} B/token, so S1 is not weights-only)",
                            r.s1_kv_flash_bytes_per_token
                        )
                    } else {
                        String::new()
                    }
                ),
            }
        }
        None => Goal {
            goal: "exact S2 against S1 + KV bytes at the flash rate".into(),
            met: None,
            detail: "no exact S2 row".into(),
        },
    });
    g.push(Goal {
        goal: format!("resumed TTFT >= {GOAL_TTFT_SPEEDUP}x faster than cold"),
        met: Some(r.ttft_speedup >= GOAL_TTFT_SPEEDUP),
        detail: format!(
            "cold {:.0} ms, resumed {:.0} ms: {:.1}x",
            r.ttft_cold_ms, r.ttft_resumed_ms, r.ttft_speedup
        ),
    });
    g
}

pub fn assemble(p: Parts) -> KvReport {
    let exact =
        p.s2.rows
            .iter()
            .find(|m| m.mode == "exact" && m.dram_budget == 0);
    let exact_over = exact.map_or(f64::NAN, |e| {
        let kv_ms = e.kv_flash_bytes_per_token / (p.raw_cold_read_gb_s * 1e9).max(1e-9) * 1e3;
        e.ms_per_token / (p.s1.ms_per_token + kv_ms).max(1e-9)
    });
    let recommended = recommend_page(&p.pages);
    let mut r = KvReport {
        adapter: p.adapter,
        backend: p.backend,
        text: p.text,
        prompt_tokens: p.prompt_tokens,
        generated_tokens: p.generated_tokens,
        gpu_budget: p.gpu_budget,
        runs: p.runs,
        page_tokens: p.s2.page_tokens,
        raw_cold_read_gb_s: p.raw_cold_read_gb_s,
        cold_cache_verified: p.cold_cache_verified,
        s1_prompt_tokens: p.s1.prompt_tokens,
        s1_ms_per_token: p.s1.ms_per_token,
        s1_weight_bytes_per_token: p.s1.weight_bytes_per_token,
        s1_kv_flash_bytes_per_token: p.s1.kv_flash_bytes_per_token,
        s1_kv_streams: p.s1.kv_streams,
        rows: p.s2.rows,
        exact_over_s1_plus_kv: exact_over,
        ttft_cold_ms: p.s2.ttft_cold_ms,
        ttft_resumed_ms: p.ttft_resumed_ms,
        ttft_speedup: p.s2.ttft_cold_ms / p.ttft_resumed_ms.max(1e-9),
        model: p.model,
        pages: p.pages,
        recommended_page_tokens: recommended,
        goals: Vec::new(),
        probes: p.s2.probes,
    };
    r.goals = goals(&r);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(t: u32, ms: f64) -> PageRow {
        PageRow {
            page_tokens: t,
            prompt_tokens: 1,
            runs: 1,
            decoded_tokens: 1,
            ms_per_token: ms,
            prefill_tok_s: 0.0,
            ttft_ms: 0.0,
            kv_flash_bytes_per_token: 0.0,
            kv_pages_per_token: 0.0,
            flash_to_gpu_gb_s: 0.0,
            page_bytes: 0,
            home_pages: 0,
            halves: 0,
            peak_device_bytes: 0,
            not_run: None,
        }
    }

    #[test]
    fn page_rule_picks_the_smallest_within_tolerance_of_the_fastest() {
        let rows = [
            page(16, 130.0),
            page(32, 104.0),
            page(64, 101.0),
            page(128, 100.0),
        ];
        assert_eq!(recommend_page(&rows), Some(32));
        let rows = [page(16, 100.0), page(64, 90.0)];
        assert_eq!(recommend_page(&rows), Some(64));
        assert_eq!(recommend_page(&[]), None);
        // Sizes that did not run take no part.
        let rows = [
            page(16, 100.0),
            page(64, 97.0),
            PageRow::not_run(256, 1, 1, "does not fit".into()),
        ];
        assert_eq!(recommend_page(&rows), Some(16));
        let rows = [PageRow::not_run(256, 1, 1, "does not fit".into())];
        assert_eq!(recommend_page(&rows), None);
    }
}
