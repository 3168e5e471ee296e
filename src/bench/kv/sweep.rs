//! The page hit-rate model against measurement over context length x host-cache size, and
//! page sizes side by side at the S2 setting.

use std::path::Path;

use super::report::{ModelPoint, PageRow};
use super::{BenchResult, Ctx, greedy, med, med_of};
use crate::kv::session::Session;

/// Contexts of the model sweep besides the prompt's own (those above it are left out).
pub const SWEEP_CTX: [usize; 2] = [1024, 2048];
/// Host caches of the exact points, as shares of the streamed KV (on top of the weights).
pub const SWEEP_SHARES: [f64; 4] = [0.0, 0.25, 0.5, 1.0];
/// Host caches of the quest points (at the prompt's context).
pub const QUEST_SHARES: [f64; 2] = [0.25, 0.5];
/// Tokens decoded before measuring (filling the cache and the selections), then measured.
pub const WARM_TOKENS: usize = 4;
pub const MEASURED_TOKENS: usize = 24;
/// Tokens decoded by each run of the page sweep (at most; fewer when `-n` is smaller).
pub const PAGE_SWEEP_DECODE: usize = 32;

/// The (mode, context, cache share) points of the model sweep for a prompt of `prompt_tokens`:
/// each context once, none above the prompt.
pub fn points(prompt_tokens: usize) -> Vec<(&'static str, usize, f64)> {
    let mut ctxs: Vec<usize> = SWEEP_CTX
        .iter()
        .copied()
        .chain([prompt_tokens])
        .filter(|&c| c <= prompt_tokens)
        .collect();
    ctxs.sort_unstable();
    ctxs.dedup();
    let mut v = Vec::new();
    for &ctx in &ctxs {
        for &share in &SWEEP_SHARES {
            v.push(("exact", ctx, share));
        }
    }
    for &share in &QUEST_SHARES {
        v.push(("quest:25%", prompt_tokens, share));
    }
    v
}

/// Each point: resumed from the session to its context, a few warm-up tokens, then the
/// measured tokens; medians over the runs.
pub fn model(
    c: &mut Ctx<'_>,
    prompt: &[u32],
    runs: usize,
    session_path: &Path,
) -> BenchResult<Vec<ModelPoint>> {
    let session = Session::open(session_path)?;
    let mut out = Vec::new();
    let mut streamed = None;
    for (mode, ctx, share) in points(c.o.prompt_tokens) {
        // The context holds the warm-up and the measured tokens (the last one is not cached).
        let ctx_len = ctx + WARM_TOKENS + MEASURED_TOKENS;
        let opts = c.opts(ctx_len, mode)?;
        let n_end = ctx_len - 1;
        let st = match streamed {
            Some((m, k, s)) if m == mode && k == ctx => s,
            _ => {
                let s = c.streamed(ctx_len, mode, n_end)?;
                streamed = Some((mode, ctx, s));
                s
            }
        };
        let dram = if share > 0.0 { st.dram(share) } else { 0 };
        let mut stats = Vec::new();
        let mut preds = Vec::new();
        for r in 0..runs {
            let mut e = c.engine(&opts, dram)?;
            let k = e.resume(&session, &prompt[..ctx])?;
            let (warm, _) = e.generate(
                &prompt[k..ctx],
                WARM_TOKENS,
                &mut greedy(),
                |_| false,
                |_| true,
            )?;
            let last = *warm.last().unwrap_or(&prompt[0]);
            let (_, s) =
                e.generate(&[last], MEASURED_TOKENS, &mut greedy(), |_| false, |_| true)?;
            let p = e.kv_prediction(&s);
            eprintln!(
                "model {mode} ctx {ctx} cache {share} run {}: hit {:.3} predicted {:.3}; KV flash {:.0} predicted {:.0}",
                r + 1,
                s.kv_hit_rate,
                p.hit_rate,
                s.kv_flash_bytes_per_token,
                p.flash_bytes_per_token
            );
            preds.push(p);
            stats.push(s);
        }
        let measured = med(&stats, |s| s.kv_flash_bytes_per_token);
        let predicted = med_of(preds.iter().map(|p| p.flash_bytes_per_token));
        out.push(ModelPoint {
            mode: mode.to_string(),
            ctx,
            runs: stats.len(),
            dram_budget: dram,
            kv_cache_share: share,
            streamed_kv_bytes: st.kv,
            hit_predicted: med_of(preds.iter().map(|p| p.hit_rate)),
            hit_measured: med(&stats, |s| s.kv_hit_rate),
            kv_flash_predicted: predicted,
            kv_flash_measured: measured,
            bytes_error: relative_error(predicted, measured),
        });
    }
    Ok(out)
}

/// |predicted - measured| / measured (0 when both are 0, 1 when only the measurement is).
pub fn relative_error(predicted: f64, measured: f64) -> f64 {
    if measured > 0.0 {
        (predicted - measured).abs() / measured
    } else if predicted > 0.0 {
        1.0
    } else {
        0.0
    }
}

/// Page sizes at the S2 setting (the bench's budget and I/O mode, cold, no host cache, the
/// prompt or its first `page_sweep_tokens`), exact attention. The sizes run in rounds, every
/// size once a round, in reverse order every other round ([`round_order`]), so that the
/// machine's drift over the sweep does not favour the size that runs first.
pub fn pages(c: &mut Ctx<'_>, prompt: &[u32], runs: usize) -> BenchResult<Vec<PageRow>> {
    let o = c.o;
    let prompt = &prompt[..o
        .page_sweep_tokens
        .unwrap_or(prompt.len())
        .clamp(1, prompt.len())];
    let decode = o.n_gen.clamp(1, PAGE_SWEEP_DECODE);
    // Each size's options, or why it does not fit the budget (a row of the table, not the end
    // of the bench).
    let mut sizes = Vec::new();
    for &pt in &o.page_sweep {
        let mut opts = c.opts(prompt.len() + decode, "exact")?;
        opts.kv_page = Some(pt);
        let fits = c.build(&opts, 0).map(|_| ()).map_err(|e| e.to_string());
        if let Err(e) = &fits {
            eprintln!("page {pt}: not run: {e}");
        }
        sizes.push((pt, opts, fits));
    }
    let mut stats: Vec<Vec<_>> = sizes.iter().map(|_| Vec::new()).collect();
    let mut geo = vec![(0, 0, 0); sizes.len()];
    for r in 0..runs {
        for i in round_order(sizes.len(), r) {
            let (pt, opts, fits) = &sizes[i];
            if fits.is_err() {
                continue;
            }
            let mut e = c.engine(opts, 0)?;
            let (_, s) = e.generate(prompt, decode, &mut greedy(), |_| false, |_| true)?;
            eprintln!(
                "page {pt} run {}: {:.1} ms/token, prefill {:.1} tok/s, KV {:.0} B/token from flash",
                r + 1,
                s.ms_per_token,
                s.prefill_tok_s,
                s.kv_flash_bytes_per_token
            );
            geo[i] = (e.plan.kv.home_pages, e.plan.kv.halves, e.plan.kv.page_bytes);
            stats[i].push(s);
        }
    }
    let mut out = Vec::new();
    for (i, (pt, _, fits)) in sizes.into_iter().enumerate() {
        if let Err(e) = fits {
            out.push(PageRow::not_run(pt, prompt.len(), decode, e));
            continue;
        }
        let st = &stats[i];
        out.push(PageRow {
            page_tokens: pt,
            prompt_tokens: prompt.len(),
            runs: st.len(),
            decoded_tokens: decode,
            ms_per_token: med(st, |s| s.ms_per_token),
            prefill_tok_s: med(st, |s| s.prefill_tok_s),
            ttft_ms: med(st, |s| s.ttft_ms),
            kv_flash_bytes_per_token: med(st, |s| s.kv_flash_bytes_per_token),
            kv_pages_per_token: med(st, |s| s.kv_pages_per_token),
            flash_to_gpu_gb_s: med(st, |s| s.flash_to_gpu_gb_s),
            page_bytes: geo[i].2,
            home_pages: geo[i].0,
            halves: geo[i].1,
            peak_device_bytes: st.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0),
            not_run: None,
        });
    }
    Ok(out)
}

/// The order of `n` items in round `r`: as given in even rounds, reversed in odd ones.
fn round_order(n: usize, r: usize) -> Vec<usize> {
    if r.is_multiple_of(2) {
        (0..n).collect()
    } else {
        (0..n).rev().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_order_of_the_sizes() {
        assert_eq!(round_order(3, 0), vec![0, 1, 2]);
        assert_eq!(round_order(3, 1), vec![2, 1, 0]);
        assert_eq!(round_order(3, 2), vec![0, 1, 2]);
        assert!(round_order(0, 1).is_empty());
    }

    #[test]
    fn each_context_once_and_none_above_the_prompt() {
        let ctxs = |n| {
            let mut v: Vec<usize> = points(n)
                .into_iter()
                .filter(|p| p.0 == "exact")
                .map(|p| p.1)
                .collect();
            v.dedup();
            v
        };
        assert_eq!(ctxs(2048), vec![1024, 2048]);
        assert_eq!(ctxs(4096), vec![1024, 2048, 4096]);
        assert_eq!(ctxs(1500), vec![1024, 1500]);
        assert_eq!(ctxs(96), vec![96]);
        assert_eq!(
            points(2048).len(),
            2 * SWEEP_SHARES.len() + QUEST_SHARES.len()
        );
    }

    #[test]
    fn relative_error_edges() {
        assert_eq!(relative_error(0.0, 0.0), 0.0);
        assert_eq!(relative_error(5.0, 0.0), 1.0);
        assert!((relative_error(90.0, 100.0) - 0.1).abs() < 1e-12);
    }
}
