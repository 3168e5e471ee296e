//! S1, the S2 modes (without and with a host cache), and time to first token resumed from a
//! session.

use std::path::Path;
use std::time::Instant;

use super::report::ModeRow;
use super::{BenchResult, Ctx, MODES, S1_PROMPT, Streamed, greedy, med, med_of};
use crate::bench::probe::{Prober, probed};
use crate::kv::session::Session;

/// S1's figures: weights streaming under the same budget, a short prompt.
#[derive(Debug, Clone)]
pub struct S1 {
    pub prompt_tokens: usize,
    pub ms_per_token: f64,
    pub weight_bytes_per_token: f64,
    /// KV bytes read from flash per token (0 when the KV cache stays on the device, as S1 is
    /// meant to: then the run is weights-only streaming).
    pub kv_flash_bytes_per_token: f64,
    pub kv_streams: bool,
}

/// S1: the weights stream, the KV cache of a short prompt stays home.
pub fn s1(c: &mut Ctx<'_>, prompt: &[u32], runs: usize) -> BenchResult<S1> {
    let n = S1_PROMPT.min(prompt.len());
    let opts = c.opts(n + c.o.n_gen, "exact")?;
    let mut rows = Vec::new();
    let mut streams = false;
    for r in 0..runs {
        let mut e = c.engine(&opts, 0)?;
        let (_, s) = e.generate(&prompt[..n], c.o.n_gen, &mut greedy(), |_| false, |_| true)?;
        eprintln!(
            "S1 run {}: {:.1} ms/token, KV {:.0} B/token from flash",
            r + 1,
            s.ms_per_token,
            s.kv_flash_bytes_per_token
        );
        streams = e.plan.kv.streams;
        rows.push(s);
    }
    Ok(S1 {
        prompt_tokens: n,
        ms_per_token: med(&rows, |s| s.ms_per_token),
        weight_bytes_per_token: med(&rows, |s| {
            s.flash_bytes_per_token - s.kv_flash_bytes_per_token
        }),
        kv_flash_bytes_per_token: med(&rows, |s| s.kv_flash_bytes_per_token),
        kv_streams: streams,
    })
}

/// The S2 rows and what goes with them.
#[derive(Debug, Clone)]
pub struct S2 {
    pub rows: Vec<ModeRow>,
    /// TTFT of the exact runs without a host cache (cold), median.
    pub ttft_cold_ms: f64,
    pub page_tokens: u32,
    /// The speed probes taken before the runs (empty when the calibration has none).
    pub probes: Vec<crate::plan::perf::Probe>,
}

/// One S2 row's runs as they come in.
struct RowRuns {
    mode: &'static str,
    share: f64,
    dram: u64,
    stats: Vec<crate::engine::GenStats>,
    preds: Vec<crate::plan::hitrate::KvPrediction>,
    perf: Vec<f64>,
    probed: Vec<f64>,
    probed_ttft: Vec<f64>,
    placement: String,
    streamed: Option<Streamed>,
    cold_ttft: Vec<f64>,
    cold_pred_ttft: Vec<f64>,
}

/// Every S2 mode, without a host cache, then (when the cache share is not 0) with the streamed
/// weights plus that share of the streamed KV in the host cache. The rows take turns run by
/// run (round 1: every row once, round 2: every row again...), so that a slow spell of a
/// shared machine falls on every row rather than on one row's runs; before each run a speed
/// probe carries the calibration to the machine's speed of that moment (where the calibration
/// has a probe of its own), and the row keeps both predictions. The first exact run saves the
/// session the resumed TTFT and the model sweep start from. With `cold_runs`, only that many
/// exact runs without a host cache prefill cold and the others resume the prompt from that
/// session (prefill attends exactly in every mode, so the decoded state is the same).
pub fn s2(c: &mut Ctx<'_>, prompt: &[u32], runs: usize, session: &Path) -> BenchResult<S2> {
    let o = c.o;
    let ctx_len = o.prompt_tokens + o.n_gen;
    let mut page_tokens = 0;
    let cal = crate::plan::perf::Calibration::load(&crate::plan::perf::Calibration::path()).ok();
    let mut prober = Prober::for_calibration(cal.as_ref(), &o.base.gpu);
    let mut opened: Option<Session> = None;
    let mut rows: Vec<RowRuns> = Vec::new();
    let mut probes = Vec::new();
    for mode in MODES {
        let mut shares = vec![0.0];
        if o.cache_share > 0.0 {
            shares.push(o.cache_share);
        }
        for share in shares {
            rows.push(RowRuns {
                mode,
                share,
                dram: 0,
                stats: Vec::new(),
                preds: Vec::new(),
                perf: Vec::new(),
                probed: Vec::new(),
                probed_ttft: Vec::new(),
                placement: String::new(),
                streamed: None,
                cold_ttft: Vec::new(),
                cold_pred_ttft: Vec::new(),
            });
        }
    }
    for r in 0..runs {
        for i in 0..rows.len() {
            let (mode, share) = (rows[i].mode, rows[i].share);
            let opts = c.opts(ctx_len, mode)?;
            // A row with a host cache sizes it from what its mode streams without one (the
            // row before it, run first in the first round).
            let dram = if share > 0.0 {
                rows[..i]
                    .iter()
                    .rev()
                    .find(|x| x.mode == mode && x.share == 0.0)
                    .and_then(|x| x.streamed)
                    .map_or(0, |s| s.dram(share))
            } else {
                0
            };
            let probed = match (&cal, prober.as_mut()) {
                (Some(cal), Some(p)) => Some(probed(cal, p)?),
                _ => None,
            };
            let mut e = c.engine(&opts, dram)?;
            let cold = match o.cold_runs {
                None => true,
                Some(k) => mode == "exact" && dram == 0 && r < k,
            };
            let past = if cold {
                0
            } else {
                let sess = match &opened {
                    Some(s) => s,
                    None => opened.insert(Session::open(session)?),
                };
                e.resume(sess, prompt)?
            };
            let (_, s) =
                e.generate(&prompt[past..], o.n_gen, &mut greedy(), |_| false, |_| true)?;
            let p = e.kv_prediction(&s);
            let row = &mut rows[i];
            let n_new = prompt.len() - past;
            if let Some(cal) = &cal {
                let (t, ttft) = e.predict(cal, past, n_new, s.selection_reuse);
                row.perf.push(t.ms_per_token);
                if cold {
                    row.cold_pred_ttft.push(ttft);
                }
            }
            let mut probe_note = String::new();
            if let Some((pc, line)) = &probed {
                let (t, ttft) = e.predict(pc, past, n_new, s.selection_reuse);
                row.probed.push(t.ms_per_token);
                if cold {
                    row.probed_ttft.push(ttft);
                }
                probe_note = format!(", probed {:.1} ({line})", t.ms_per_token);
                probes.extend(pc.probe.clone());
            }
            eprintln!(
                "S2 {mode} (host cache {dram} B) run {} ({}): {:.1} ms/token{}{probe_note}, TTFT {:.0} ms, KV {:.0} B/token from flash (predicted {:.0}), hit {:.3} (predicted {:.3})",
                r + 1,
                if cold { "cold" } else { "resumed" },
                s.ms_per_token,
                row.perf
                    .last()
                    .map_or(String::new(), |p| format!(" (predicted {p:.1})")),
                s.ttft_ms,
                s.kv_flash_bytes_per_token,
                p.flash_bytes_per_token,
                s.kv_hit_rate,
                p.hit_rate
            );
            if cold {
                row.cold_ttft.push(s.ttft_ms);
                if dram == 0 && mode == "exact" && r == 0 {
                    e.save_session(session)?;
                }
            }
            row.streamed
                .get_or_insert_with(|| Streamed::of(&e.plan, ctx_len));
            row.dram = dram;
            row.placement = e.placement.to_string();
            page_tokens = e.plan.kv.page_tokens;
            row.preds.push(p);
            row.stats.push(s);
        }
    }
    let rows: Vec<ModeRow> = rows.into_iter().map(mode_row).collect();
    // The exact row without a host cache: its runs are the cold ones S2 is defined by.
    let ttft_cold_ms = rows
        .iter()
        .find(|r| r.mode == "exact" && r.dram_budget == 0)
        .map_or(f64::NAN, |r| r.ttft_ms);
    Ok(S2 {
        rows,
        ttft_cold_ms,
        page_tokens,
        probes,
    })
}

/// A row's medians.
fn mode_row(r: RowRuns) -> ModeRow {
    let stats = &r.stats;
    let m = |f: &dyn Fn(&crate::plan::hitrate::KvPrediction) -> f64| med_of(r.preds.iter().map(f));
    let st = r.streamed.unwrap_or(Streamed { weights: 0, kv: 0 });
    let opt = |v: Vec<f64>| (!v.is_empty()).then(|| med_of(v));
    ModeRow {
        mode: r.mode.to_string(),
        runs: stats.len(),
        dram_budget: r.dram,
        kv_cache_share: r.share,
        streamed_weight_bytes: st.weights,
        streamed_kv_bytes: st.kv,
        ms_per_token: med(stats, |s| s.ms_per_token),
        kv_flash_bytes_per_token: med(stats, |s| s.kv_flash_bytes_per_token),
        kv_bytes_per_token: med(stats, |s| s.kv_bytes_per_token),
        weight_bytes_per_token: med(stats, |s| {
            s.flash_bytes_per_token - s.kv_flash_bytes_per_token
        }),
        kv_bytes_written_per_token: med(stats, |s| s.kv_bytes_written_per_token),
        kv_pages_written: stats.iter().map(|s| s.kv_pages_written).max().unwrap_or(0),
        hit_rate: med(stats, |s| s.kv_hit_rate),
        hit_rate_predicted: m(&|p| p.hit_rate),
        kv_flash_predicted: m(&|p| p.flash_bytes_per_token),
        prefetch_hit_rate: med(stats, |s| s.prefetch_hit_rate),
        selection_reuse: med(stats, |s| s.selection_reuse),
        overlap_efficiency: med(stats, |s| s.overlap_efficiency),
        cold_runs: r.cold_ttft.len(),
        ttft_ms: if r.cold_ttft.is_empty() {
            f64::NAN
        } else {
            med_of(r.cold_ttft)
        },
        peak_device_bytes: stats.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0),
        placement: r.placement,
        predicted_ms_per_token: opt(r.perf),
        predicted_ttft_ms: opt(r.cold_pred_ttft),
        probed_ms_per_token: opt(r.probed),
        probed_ttft_ms: opt(r.probed_ttft),
    }
}

/// Time to first token resumed from the saved session (opening it and loading the pages
/// included), median over the runs.
pub fn ttft_resumed(
    c: &mut Ctx<'_>,
    prompt: &[u32],
    runs: usize,
    session: &Path,
) -> BenchResult<f64> {
    let opts = c.opts(c.o.prompt_tokens + c.o.n_gen, "exact")?;
    let mut ms = Vec::new();
    for r in 0..runs {
        let mut e = c.engine(&opts, 0)?;
        let t = Instant::now();
        let s = Session::open(session)?;
        let k = e.resume(&s, prompt)?;
        let logits = e.forward(&prompt[k..])?;
        let _ = greedy().sample(&logits, prompt);
        let v = t.elapsed().as_secs_f64() * 1e3;
        eprintln!("resumed run {}: {k} tokens loaded, TTFT {v:.0} ms", r + 1);
        ms.push(v);
    }
    Ok(med_of(ms))
}
