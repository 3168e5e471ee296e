//! The figures of `bench kv`, its goal lines and its markdown.

use serde::Serialize;

use super::s2::{S1, S2};
use super::sweep::{MEASURED_TOKENS, WARM_TOKENS};
use crate::plan::kvplan::DEFAULT_PAGE_TOKENS;

/// The page-size rule: the smallest page whose decode ms/token is within this share of the
/// fastest page size's (smaller pages select more finely and keep a smaller window on the
/// device; the time per token is what small flash reads cost).
pub const PAGE_RULE_TOLERANCE: f64 = 0.05;
/// Goal: exact S2 ms/token at most this many times S1 + the KV bytes at the flash rate.
pub const GOAL_S2_OVER_BOUND: f64 = 1.5;
/// Goal: quest 25% perplexity loss against exact, percent.
pub const GOAL_QUEST_PPL_LOSS_PCT: f64 = 1.0;
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
}

/// One mode's perplexity at the prompt's context.
#[derive(Debug, Clone, Serialize)]
pub struct PplRow {
    pub mode: String,
    pub ppl: f64,
    pub stderr: f64,
    pub chunks: usize,
    pub tokens: usize,
    /// `100 (ppl / ppl_exact - 1)`.
    pub loss_pct: f64,
    /// The same from the chunks' paired log ratios, and its standard error (2 chunks or more).
    pub paired_loss_pct: f64,
    pub paired_loss_stderr_pct: Option<f64>,
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
    pub ppl: Vec<PplRow>,
    pub model: Vec<ModelPoint>,
    pub pages: Vec<PageRow>,
    /// The page size [`recommend_page`] picks from `pages`.
    pub recommended_page_tokens: Option<u32>,
    pub goals: Vec<Goal>,
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
    pub ppl: Vec<PplRow>,
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

fn verdict(met: Option<bool>) -> &'static str {
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
    let q = r.ppl.iter().find(|p| p.mode == "quest:25%");
    g.push(Goal {
        goal: format!("quest 25% perplexity loss <= {GOAL_QUEST_PPL_LOSS_PCT}%"),
        met: q.map(|q| q.loss_pct <= GOAL_QUEST_PPL_LOSS_PCT),
        detail: match q {
            Some(q) => format!(
                "quest:25% ppl {:.4} against exact {:.4}: {:+.2}%{} over {} chunks",
                q.ppl,
                r.ppl.first().map_or(f64::NAN, |e| e.ppl),
                q.loss_pct,
                q.paired_loss_stderr_pct
                    .map(|s| format!(" (paired stderr {s:.2}%)"))
                    .unwrap_or_default(),
                q.chunks
            ),
            None => "perplexity skipped (--ppl-chunks 0)".into(),
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
        ppl: p.ppl,
        model: p.model,
        pages: p.pages,
        recommended_page_tokens: recommended,
        goals: Vec::new(),
    };
    r.goals = goals(&r);
    r
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / 1048576.0)
}

/// A row's host cache: "none", or its size and the KV share it holds.
fn cache_label(r: &ModeRow) -> String {
    if r.dram_budget == 0 {
        "none".to_string()
    } else {
        format!(
            "{} ({:.0}% of KV)",
            mib(r.dram_budget),
            r.kv_cache_share * 100.0
        )
    }
}

/// How a row's runs got the prompt: all cold, all resumed from the session, or some of each.
fn prefill_label(r: &ModeRow) -> String {
    match (r.cold_runs, r.runs - r.cold_runs.min(r.runs)) {
        (_, 0) => "cold".to_string(),
        (0, _) => "resumed".to_string(),
        (c, k) => format!("{c} cold, {k} resumed"),
    }
}

/// Milliseconds, or "-" for a figure not measured (NaN).
fn fmt_ms(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.0}")
    } else {
        "-".to_string()
    }
}

impl KvReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {} ({}); device budget {}; {}-token prompt from {}, {} tokens decoded; {}-token KV pages; \
             medians of {} runs; raw cold read {:.2} GB/s (median){}\n\n",
            self.adapter,
            self.backend,
            mib(self.gpu_budget),
            self.prompt_tokens,
            self.text,
            self.generated_tokens,
            self.page_tokens,
            self.runs,
            self.raw_cold_read_gb_s,
            if self.cold_cache_verified {
                ""
            } else {
                "; page-cache eviction not verified, so cold runs may not be cold"
            }
        );
        if let Some(r) = self.rows.iter().find(|r| r.dram_budget > 0) {
            s.push_str(&format!(
                "Host cache: \"none\" rows run with `--dram-budget 0`; the others with the weights that stream \
                 each token ({}, pinned first) plus {:.0}% of the KV bytes on flash at the end of the run \
                 ({} of {} for exact), so KV pages can hit it. Hit rates count KV pages served by the host cache.\n\n",
                mib(r.streamed_weight_bytes),
                r.kv_cache_share * 100.0,
                mib((r.streamed_kv_bytes as f64 * r.kv_cache_share) as u64),
                mib(r.streamed_kv_bytes),
            ));
        }
        s.push_str(
            "| mode | host cache | ms/token | KV bytes/token from flash | weight bytes/token | KV bytes written/token | hit rate (measured / predicted) | KV flash bytes predicted | overlap eff. | selection reuse | prefetch hits | prefill | TTFT ms (cold) | peak device bytes |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.3} / {:.3} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} |\n",
                r.mode,
                cache_label(r),
                r.ms_per_token,
                r.kv_flash_bytes_per_token,
                r.weight_bytes_per_token,
                r.kv_bytes_written_per_token,
                r.hit_rate,
                r.hit_rate_predicted,
                r.kv_flash_predicted,
                r.overlap_efficiency,
                r.selection_reuse,
                r.prefetch_hit_rate,
                prefill_label(r),
                fmt_ms(r.ttft_ms),
                r.peak_device_bytes
            ));
        }
        if self.rows.iter().any(|r| r.predicted_ms_per_token.is_some()) {
            s.push_str(
                "\nPerformance model (`flashlm calibrate` constants): predicted against measured, same runs\n\n\
                 | S2 mode | host cache | ms/token predicted | measured | error | TTFT predicted, ms | measured | error |\n\
                 |---|---|---|---|---|---|---|---|\n",
            );
            for r in &self.rows {
                if let Some(p) = r.predicted_ms_per_token {
                    let ttft = match r.predicted_ttft_ms {
                        Some(t) if r.ttft_ms.is_finite() => format!(
                            "{:.0} | {:.0} | {:+.0}%",
                            t,
                            r.ttft_ms,
                            (t / r.ttft_ms.max(1e-9) - 1.0) * 100.0
                        ),
                        _ => "- | - | -".to_string(),
                    };
                    s.push_str(&format!(
                        "| {} | {} | {:.1} | {:.1} | {:+.0}% | {} |\n",
                        r.mode,
                        cache_label(r),
                        p,
                        r.ms_per_token,
                        (p / r.ms_per_token.max(1e-9) - 1.0) * 100.0,
                        ttft
                    ));
                }
            }
        }
        s.push_str(&format!(
            "\nS1 (same budget, {}-token prompt, KV cache {}): {:.1} ms/token, {:.0} weight bytes/token, {:.0} KV bytes/token from flash. \
             Exact S2 / (S1 + KV bytes at the raw cold-read rate) = {:.2}.\n",
            self.s1_prompt_tokens,
            if self.s1_kv_streams {
                "partly on flash"
            } else {
                "on the device"
            },
            self.s1_ms_per_token,
            self.s1_weight_bytes_per_token,
            self.s1_kv_flash_bytes_per_token,
            self.exact_over_s1_plus_kv
        ));
        s.push_str(&format!(
            "\nTime to first token, {}-token prompt: cold {:.0} ms, resumed from a session {:.0} ms ({:.1}x faster).\n",
            self.prompt_tokens, self.ttft_cold_ms, self.ttft_resumed_ms, self.ttft_speedup
        ));
        if !self.ppl.is_empty() {
            s.push_str(&format!(
                "\nPerplexity at ctx {} (all resident; {} chunks, {} scored tokens each mode). The loss is against exact; \
                 its standard error pairs the modes chunk by chunk.\n\n\
                 | mode | ppl ± stderr | loss vs exact | paired stderr of the loss |\n|---|---|---|---|\n",
                self.prompt_tokens,
                self.ppl[0].chunks,
                self.ppl[0].tokens
            ));
            for p in &self.ppl {
                s.push_str(&format!(
                    "| {} | {:.4} ± {:.4} | {:+.2}% | {} |\n",
                    p.mode,
                    p.ppl,
                    p.stderr,
                    p.loss_pct,
                    p.paired_loss_stderr_pct
                        .map(|e| format!("{e:.2}%"))
                        .unwrap_or_else(|| "-".into())
                ));
            }
        }
        s.push_str(&format!(
            "\nPage hit-rate model: predicted against measured (resumed from the session to the context, \
             {WARM_TOKENS} warm-up tokens, then {MEASURED_TOKENS} measured; medians of {} runs). The host cache is \
             the streamed weights plus the given share of the KV bytes on flash at the end of the run.\n\n\
             | mode | context | host cache (share of streamed KV) | hit rate predicted | hit rate measured | KV flash bytes/token predicted | measured | error |\n\
             |---|---|---|---|---|---|---|---|\n",
            self.runs
        ));
        for p in &self.model {
            s.push_str(&format!(
                "| {} | {} | {} ({:.0}%) | {:.3} | {:.3} | {:.0} | {:.0} | {:.1}% |\n",
                p.mode,
                p.ctx,
                mib(p.dram_budget),
                p.kv_cache_share * 100.0,
                p.hit_predicted,
                p.hit_measured,
                p.kv_flash_predicted,
                p.kv_flash_measured,
                p.bytes_error * 100.0
            ));
        }
        if !self.pages.is_empty() {
            s.push_str(&format!(
                "\nPage size at the S2 setting (exact attention, {}-token prompt, {} tokens decoded, no host cache, cold). \
                 Ring GB/s: bytes through the staging ring (weights and KV pages) over the I/O thread's time.\n\n\
                 | tokens per page | page bytes | ms/token | prefill tok/s | TTFT ms | KV bytes/token from flash | KV pages/token | ring GB/s | pages at home per layer | stream pool halves | peak device bytes |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|\n",
                self.pages[0].prompt_tokens, self.pages[0].decoded_tokens
            ));
            for p in &self.pages {
                if let Some(why) = &p.not_run {
                    s.push_str(&format!(
                        "| {} | not run: {} | | | | | | | | | |\n",
                        p.page_tokens,
                        why.replace('|', "/")
                    ));
                    continue;
                }
                s.push_str(&format!(
                    "| {} | {} | {:.1} | {:.1} | {:.0} | {:.0} | {:.1} | {:.2} | {} | {} | {} |\n",
                    p.page_tokens,
                    p.page_bytes,
                    p.ms_per_token,
                    p.prefill_tok_s,
                    p.ttft_ms,
                    p.kv_flash_bytes_per_token,
                    p.kv_pages_per_token,
                    p.flash_to_gpu_gb_s,
                    p.home_pages,
                    p.halves,
                    p.peak_device_bytes
                ));
            }
            if let Some(best) = recommended_line(self) {
                s.push_str(&best);
            }
        }
        s.push_str("\nGoals, from the figures above:\n\n");
        for g in &self.goals {
            s.push_str(&format!(
                "- {}: **{}**. {}\n",
                g.goal,
                verdict(g.met),
                g.detail
            ));
        }
        s
    }
}

fn recommended_line(r: &KvReport) -> Option<String> {
    let p = r.recommended_page_tokens?;
    let fastest = r
        .pages
        .iter()
        .min_by(|a, b| a.ms_per_token.total_cmp(&b.ms_per_token))?;
    Some(format!(
        "\nRule: the smallest page whose ms/token is within {:.0}% of the fastest ({} tokens, {:.1} ms/token). \
         Recommended: **{p} tokens per page**; the default (`DEFAULT_PAGE_TOKENS`) is {DEFAULT_PAGE_TOKENS}{}.\n",
        PAGE_RULE_TOLERANCE * 100.0,
        fastest.page_tokens,
        fastest.ms_per_token,
        if p == DEFAULT_PAGE_TOKENS {
            ", which agrees"
        } else {
            "; this run points to changing it"
        }
    ))
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
