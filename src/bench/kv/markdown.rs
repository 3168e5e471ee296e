//! The KV benchmark report as markdown: the tables BENCHMARKS.md holds for S2, the page-size
//! sweep and the hit-rate model, with each goal's verdict.

use super::report::{KvReport, ModeRow, PAGE_RULE_TOLERANCE, verdict};
use super::sweep::{MEASURED_TOKENS, WARM_TOKENS};
use crate::plan::kvplan::DEFAULT_PAGE_TOKENS;

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
                "\nPerformance model (`flashlm calibrate` constants): predicted against measured, same runs; the probed prediction carries \
                 the calibration to the speed probe taken before each run (its TTFT is the probed one where probed)\n\n\
                 | S2 mode | host cache | ms/token predicted | measured | error | probed prediction | error | TTFT predicted, ms | measured | error |\n\
                 |---|---|---|---|---|---|---|---|---|---|\n",
            );
            for r in &self.rows {
                if let Some(p) = r.predicted_ms_per_token {
                    let probed = match r.probed_ms_per_token {
                        Some(q) => format!(
                            "{q:.1} | {:+.0}%",
                            (q / r.ms_per_token.max(1e-9) - 1.0) * 100.0
                        ),
                        None => "not probed | -".to_string(),
                    };
                    let ttft = match r.probed_ttft_ms.or(r.predicted_ttft_ms) {
                        Some(t) if r.ttft_ms.is_finite() => format!(
                            "{:.0} | {:.0} | {:+.0}%",
                            t,
                            r.ttft_ms,
                            (t / r.ttft_ms.max(1e-9) - 1.0) * 100.0
                        ),
                        _ => "- | - | -".to_string(),
                    };
                    s.push_str(&format!(
                        "| {} | {} | {:.1} | {:.1} | {:+.0}% | {probed} | {} |\n",
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
                "\nPage size at the S2 setting (exact attention, {}-token prompt, {} tokens decoded, no host cache, cold; \
                 medians of {} runs, every size once a round, in reverse order every other round). \
                 Ring GB/s: bytes through the staging ring (weights and KV pages) over the I/O thread's time.\n\n\
                 | tokens per page | page bytes | ms/token | prefill tok/s | TTFT ms | KV bytes/token from flash | KV pages/token | ring GB/s | pages at home per layer | stream pool halves | peak device bytes |\n\
                 |---|---|---|---|---|---|---|---|---|---|---|\n",
                self.pages[0].prompt_tokens,
                self.pages[0].decoded_tokens,
                self.pages.iter().map(|p| p.runs).max().unwrap_or(0)
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
