//! `bench kv`: the KV cache on flash.
//!
//! - Scenario S2: the default model under a 16 MiB device budget with direct I/O and a cold
//!   page cache prefills a long prompt of natural prose, then decodes; exact attention and page
//!   selection at 25% and 50% of the pages. Beside it, S1 (the same budget, a 64-token prompt:
//!   weights streaming with a KV cache that stays on the device) and the raw cold read rate, so
//!   exact S2 can be compared with "S1 plus the KV bytes at the flash rate".
//! - Time to first token for the long prompt, cold and resumed from a saved session.
//! - Perplexity of the text at the prompt's context for each mode.
//! - The page hit-rate model against measurement over context length x host-cache size.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::{median, raw_cold_read};
use crate::engine::{Engine, EngineOptions, GenStats};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, IoMode, ReaderOptions};
use crate::kv::session::Session;
use crate::model::LoadedModel;
use crate::plan::KvSelect;
use crate::sampling::{Sampler, SamplerParams};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// What `bench kv` runs.
pub struct KvBenchOptions<'a> {
    pub model: &'a LoadedModel,
    pub base: EngineOptions,
    pub io: IoMode,
    pub text: Option<PathBuf>,
    pub prompt_tokens: usize,
    pub n_gen: usize,
    pub runs: usize,
    pub ppl_chunks: usize,
    /// Page sizes to compare (exact attention, a prompt of half the length, 32 tokens decoded).
    pub page_sweep: Vec<u32>,
}

/// One page size of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct PageRow {
    pub page_tokens: u32,
    pub ms_per_token: f64,
    pub prefill_tok_s: f64,
    pub kv_flash_bytes_per_token: f64,
    pub home_pages: u32,
    pub halves: u32,
}

/// One attention mode of S2 (medians over the runs).
#[derive(Debug, Clone, Serialize)]
pub struct ModeRow {
    pub mode: String,
    pub runs: usize,
    pub ms_per_token: f64,
    pub kv_flash_bytes_per_token: f64,
    pub weight_bytes_per_token: f64,
    pub kv_bytes_written_per_token: f64,
    pub kv_pages_written: u64,
    pub hit_rate: f64,
    pub hit_rate_predicted: f64,
    pub kv_flash_predicted: f64,
    pub prefetch_hit_rate: f64,
    pub selection_reuse: f64,
    pub overlap_efficiency: f64,
    pub ttft_ms: f64,
    pub peak_device_bytes: u64,
    pub placement: String,
    pub ppl: Option<f64>,
    pub ppl_stderr: Option<f64>,
    /// The performance model's ms/token and TTFT (when this machine is calibrated).
    pub predicted_ms_per_token: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
}

/// One point of the hit-rate model's sweep.
#[derive(Debug, Clone, Serialize)]
pub struct ModelPoint {
    pub mode: String,
    pub ctx: usize,
    pub dram_budget: u64,
    pub kv_cache_share: f64,
    pub hit_predicted: f64,
    pub hit_measured: f64,
    pub kv_flash_predicted: f64,
    pub kv_flash_measured: f64,
    /// |predicted - measured| / measured KV bytes from flash (0 when both are 0).
    pub bytes_error: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct KvReport {
    pub adapter: String,
    pub backend: String,
    pub text: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub page_tokens: u32,
    pub raw_cold_read_gb_s: f64,
    pub s1_ms_per_token: f64,
    pub rows: Vec<ModeRow>,
    /// Exact S2 ms/token over (S1 ms/token + KV bytes per token at the raw cold-read rate).
    pub exact_over_s1_plus_kv: f64,
    pub ttft_cold_ms: f64,
    pub ttft_resumed_ms: f64,
    pub ttft_speedup: f64,
    pub model: Vec<ModelPoint>,
    pub pages: Vec<PageRow>,
}

const S_BUDGET: u64 = 16 << 20;

/// The benchmark text: the given file, else `data/persuasion.txt` of the source tree.
pub fn default_text() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("data/persuasion.txt")
}

fn greedy() -> Sampler {
    Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    })
}

struct Ctx<'a> {
    o: &'a KvBenchOptions<'a>,
    raws: Vec<f64>,
    verified: bool,
}

impl Ctx<'_> {
    /// An engine on a cold page cache (the cache is evicted again after loading).
    fn engine(&mut self, opts: &EngineOptions, dram: u64) -> BenchResult<Engine> {
        let m = self.o.model;
        let (raw, v) = raw_cold_read(&m.path)?;
        self.raws.push(raw);
        self.verified &= v;
        let file = FlashFile::open(
            &m.path,
            ReaderOptions {
                mode: self.o.io,
                ..Default::default()
            },
        )?;
        m.gguf.release_pages();
        let e = Engine::with_source(m.gguf.clone(), Arc::new(FlashSource::new(file, dram)), opts)?;
        m.gguf.release_pages();
        let ev = crate::flash::evict_page_cache(&m.path)?;
        self.verified &= ev.effective();
        Ok(e)
    }
}

fn opts_for(base: &EngineOptions, ctx: usize, select: Option<&str>) -> BenchResult<EngineOptions> {
    let mut o = base.clone();
    o.gpu.budget = Some(S_BUDGET);
    o.ctx = Some(ctx);
    o.kv_select = match select {
        Some(s) => Some(KvSelect::parse(s, 2)?),
        None => None,
    };
    Ok(o)
}

fn med(rows: &[GenStats], f: impl Fn(&GenStats) -> f64) -> f64 {
    let mut v: Vec<f64> = rows.iter().map(f).collect();
    median(&mut v)
}

pub fn run(o: &KvBenchOptions<'_>) -> BenchResult<KvReport> {
    let m = o.model;
    let path = o.text.clone().unwrap_or_else(default_text);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading the benchmark text {}: {e}", path.display()))?;
    let all = m.tokenizer.encode(&text, false);
    if all.len() < o.prompt_tokens + 16 {
        return Err(format!(
            "{} has {} tokens, fewer than the {} the prompt needs",
            path.display(),
            all.len(),
            o.prompt_tokens
        )
        .into());
    }
    let prompt = all[..o.prompt_tokens].to_vec();
    let ctx_len = o.prompt_tokens + o.n_gen;
    let mut c = Ctx {
        o,
        raws: Vec::new(),
        verified: true,
    };
    let dir = std::env::temp_dir().join(format!("flashlm-bench-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let session_path = dir.join("s2.session");

    // S1: the weights stream, the KV cache stays home.
    let mut s1 = Vec::new();
    for r in 0..o.runs {
        let mut e = c.engine(&opts_for(&o.base, 64 + o.n_gen, None)?, 0)?;
        let (_, s) = e.generate(&prompt[..64], o.n_gen, &mut greedy(), |_| false, |_| true)?;
        eprintln!("S1 run {}: {:.1} ms/token", r + 1, s.ms_per_token);
        s1.push(s);
    }
    let s1_ms = med(&s1, |s| s.ms_per_token);
    let cal = crate::plan::perf::Calibration::load(&crate::plan::perf::Calibration::path()).ok();

    let mut rows = Vec::new();
    let mut adapter = String::new();
    let mut backend = String::new();
    let mut page_tokens = 0;
    let mut ttft_cold = Vec::new();
    for mode in ["exact", "quest:25%", "quest:50%"] {
        let select = (mode != "exact").then_some(mode);
        let opts = opts_for(&o.base, ctx_len, select)?;
        let mut runs = Vec::new();
        let mut extra = (0.0, 0.0, String::new(), 0u64);
        let mut preds = Vec::new();
        for r in 0..o.runs {
            let mut e = c.engine(&opts, 0)?;
            let (_, s) = e.generate(&prompt, o.n_gen, &mut greedy(), |_| false, |_| true)?;
            let p = e.kv_prediction(&s);
            if let Some(cal) = &cal {
                let (t, ttft) = e.predict(cal, prompt.len(), s.selection_reuse);
                preds.push((t.ms_per_token, ttft));
            }
            eprintln!(
                "S2 {mode} run {}: {:.1} ms/token, TTFT {:.0} ms, KV {:.0} B/token from flash (predicted {:.0})",
                r + 1,
                s.ms_per_token,
                s.ttft_ms,
                s.kv_flash_bytes_per_token,
                p.flash_bytes_per_token
            );
            if mode == "exact" {
                ttft_cold.push(s.ttft_ms);
                if r == 0 {
                    e.save_session(&session_path)?;
                }
            }
            extra = (
                p.hit_rate,
                p.flash_bytes_per_token,
                e.placement.to_string(),
                s.kv_pages_written,
            );
            adapter = e.ctx.info.name.clone();
            backend = e.ctx.backend_name();
            page_tokens = e.plan.kv.page_tokens;
            runs.push(s);
        }
        rows.push(ModeRow {
            mode: mode.to_string(),
            runs: runs.len(),
            ms_per_token: med(&runs, |s| s.ms_per_token),
            kv_flash_bytes_per_token: med(&runs, |s| s.kv_flash_bytes_per_token),
            weight_bytes_per_token: med(&runs, |s| {
                s.flash_bytes_per_token - s.kv_flash_bytes_per_token
            }),
            kv_bytes_written_per_token: med(&runs, |s| s.kv_bytes_written_per_token),
            kv_pages_written: extra.3,
            hit_rate: med(&runs, |s| s.kv_hit_rate),
            hit_rate_predicted: extra.0,
            kv_flash_predicted: extra.1,
            prefetch_hit_rate: med(&runs, |s| s.prefetch_hit_rate),
            selection_reuse: med(&runs, |s| s.selection_reuse),
            overlap_efficiency: med(&runs, |s| s.overlap_efficiency),
            ttft_ms: med(&runs, |s| s.ttft_ms),
            peak_device_bytes: runs.iter().map(|s| s.peak_device_bytes).max().unwrap_or(0),
            placement: extra.2,
            ppl: None,
            ppl_stderr: None,
            predicted_ms_per_token: (!preds.is_empty()).then(|| {
                let mut v: Vec<f64> = preds.iter().map(|p| p.0).collect();
                super::median(&mut v)
            }),
            predicted_ttft_ms: (!preds.is_empty()).then(|| {
                let mut v: Vec<f64> = preds.iter().map(|p| p.1).collect();
                super::median(&mut v)
            }),
        });
    }

    // Time to first token resumed from the saved session (load and resume included).
    let session = Session::open(&session_path)?;
    let mut ttft_resumed = Vec::new();
    for r in 0..o.runs {
        let mut e = c.engine(&opts_for(&o.base, ctx_len, None)?, 0)?;
        let t = Instant::now();
        let s = Session::open(&session_path)?;
        let k = e.resume(&s, &prompt)?;
        let logits = e.forward(&prompt[k..])?;
        let _ = greedy().sample(&logits, &prompt);
        let ms = t.elapsed().as_secs_f64() * 1e3;
        eprintln!("resumed run {}: {k} tokens loaded, TTFT {ms:.0} ms", r + 1);
        ttft_resumed.push(ms);
    }
    let raw = median(&mut c.raws.clone());
    let cold = median(&mut ttft_cold);
    let resumed = median(&mut ttft_resumed);

    // Perplexity at the prompt's context, all resident (placement never changes results).
    if o.ppl_chunks > 0 {
        let bos = if m.tokenizer.add_bos() {
            m.tokenizer.bos_id()
        } else {
            None
        };
        let ids = m
            .tokenizer
            .encode_with_bos(&text, false, m.tokenizer.add_bos());
        let list = crate::eval::ppl::chunks(&ids, o.prompt_tokens, Some(o.ppl_chunks), bos)?;
        for row in rows.iter_mut() {
            let mut opts = o.base.clone();
            opts.ctx = Some(o.prompt_tokens);
            opts.logit_rows = 16;
            opts.kv_select = match row.mode.as_str() {
                "exact" => None,
                s => Some(KvSelect::parse(s, 2)?),
            };
            let mut e = Engine::new(m.gguf.clone(), &opts)?;
            let t = Instant::now();
            let rep = crate::eval::perplexity(&mut e, &list, &mut |_, _| {})?;
            eprintln!(
                "ppl {}: {:.4} +/- {:.5} ({:.0} s)",
                row.mode,
                rep.ppl,
                rep.stderr,
                t.elapsed().as_secs_f64()
            );
            row.ppl = Some(rep.ppl);
            row.ppl_stderr = Some(rep.stderr);
        }
    }

    // The hit-rate model over context length x host-cache size, resumed from the session.
    let mut points = Vec::new();
    let sweep: Vec<(&str, usize, f64)> = {
        let mut v = Vec::new();
        for &ctx in &[1024usize, 2048, o.prompt_tokens] {
            if ctx > o.prompt_tokens {
                continue;
            }
            for &share in &[0.0, 0.25, 0.5, 1.0] {
                v.push(("exact", ctx, share));
            }
        }
        for &share in &[0.25, 0.5] {
            v.push(("quest:25%", o.prompt_tokens, share));
        }
        v
    };
    let streamed_weights: u64 = m
        .gguf
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .map(|t| t.n_bytes)
        .sum();
    for (mode, ctx, share) in sweep {
        let select = (mode != "exact").then_some(mode);
        let opts = opts_for(&o.base, ctx + 40, select)?;
        let probe = c.engine(&opts, 0)?;
        let kv_total = probe.plan.kv.page_bytes
            * probe
                .plan
                .kv
                .max_pages
                .saturating_sub(probe.plan.kv.home_pages) as u64
            * m.cfg.n_layers as u64;
        drop(probe);
        let dram = streamed_weights + (kv_total as f64 * share) as u64;
        let mut e = c.engine(&opts, dram)?;
        let k = e.resume(&session, &prompt[..ctx])?;
        // Fill the cache (and the selections) first, then measure.
        let (warm, _) = e.generate(&prompt[k..ctx], 4, &mut greedy(), |_| false, |_| true)?;
        let last = *warm.last().unwrap_or(&prompt[0]);
        let (_, s) = e.generate(&[last], 24, &mut greedy(), |_| false, |_| true)?;
        let p = e.kv_prediction(&s);
        let err = if s.kv_flash_bytes_per_token > 0.0 {
            (p.flash_bytes_per_token - s.kv_flash_bytes_per_token).abs()
                / s.kv_flash_bytes_per_token
        } else if p.flash_bytes_per_token > 0.0 {
            1.0
        } else {
            0.0
        };
        eprintln!(
            "model {mode} ctx {ctx} cache {share}: hit {:.3} predicted {:.3}; KV flash {:.0} predicted {:.0}",
            s.kv_hit_rate, p.hit_rate, s.kv_flash_bytes_per_token, p.flash_bytes_per_token
        );
        points.push(ModelPoint {
            mode: mode.to_string(),
            ctx,
            dram_budget: dram,
            kv_cache_share: share,
            hit_predicted: p.hit_rate,
            hit_measured: s.kv_hit_rate,
            kv_flash_predicted: p.flash_bytes_per_token,
            kv_flash_measured: s.kv_flash_bytes_per_token,
            bytes_error: err,
        });
    }
    // Page sizes, side by side.
    let mut pages = Vec::new();
    for &pt in &o.page_sweep {
        let mut opts = opts_for(&o.base, ctx_len, None)?;
        opts.kv_page = Some(pt);
        let half = o.prompt_tokens / 2;
        let mut ms = Vec::new();
        let mut pre = Vec::new();
        let mut kvb = Vec::new();
        let mut geo = (0, 0);
        for _ in 0..o.runs {
            let mut e = c.engine(&opts, 0)?;
            let (_, s) = e.generate(&prompt[..half], 32, &mut greedy(), |_| false, |_| true)?;
            eprintln!(
                "page {pt}: {:.1} ms/token, prefill {:.1} tok/s, KV {:.0} B/token from flash",
                s.ms_per_token, s.prefill_tok_s, s.kv_flash_bytes_per_token
            );
            ms.push(s.ms_per_token);
            pre.push(s.prefill_tok_s);
            kvb.push(s.kv_flash_bytes_per_token);
            geo = (e.plan.kv.home_pages, e.plan.kv.halves);
        }
        pages.push(PageRow {
            page_tokens: pt,
            ms_per_token: median(&mut ms),
            prefill_tok_s: median(&mut pre),
            kv_flash_bytes_per_token: median(&mut kvb),
            home_pages: geo.0,
            halves: geo.1,
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    let exact = rows[0].clone();
    let kv_time_ms = exact.kv_flash_bytes_per_token / (raw * 1e9) * 1e3;
    Ok(KvReport {
        adapter,
        backend,
        text: path.display().to_string(),
        prompt_tokens: o.prompt_tokens,
        generated_tokens: o.n_gen,
        page_tokens,
        raw_cold_read_gb_s: raw,
        s1_ms_per_token: s1_ms,
        exact_over_s1_plus_kv: exact.ms_per_token / (s1_ms + kv_time_ms),
        ttft_cold_ms: cold,
        ttft_resumed_ms: resumed,
        ttft_speedup: cold / resumed.max(1e-9),
        rows,
        model: points,
        pages,
    })
}

impl KvReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {} ({}); {}-token prompt from {}, {} tokens decoded; {}-token KV pages; raw cold read {:.2} GB/s (median)\n\n\
             | mode | ms/token | KV bytes/token from flash | weight bytes/token | KV bytes written/token | hit rate (measured / predicted) | KV flash bytes predicted | overlap eff. | selection reuse | prefetch hits | ppl at ctx {} | peak device bytes |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.adapter,
            self.backend,
            self.prompt_tokens,
            self.text,
            self.generated_tokens,
            self.page_tokens,
            self.raw_cold_read_gb_s,
            self.prompt_tokens
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.3} / {:.3} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} |\n",
                r.mode,
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
                match (r.ppl, r.ppl_stderr) {
                    (Some(p), Some(e)) => format!("{p:.4} ± {e:.4}"),
                    _ => "-".into(),
                },
                r.peak_device_bytes
            ));
        }
        if self.rows.iter().any(|r| r.predicted_ms_per_token.is_some()) {
            s.push_str(
                "\nPerformance model (`flashlm calibrate` constants): predicted against measured, same runs\n\n\
                 | S2 mode | ms/token predicted | measured | error | TTFT predicted, ms | measured | error |\n\
                 |---|---|---|---|---|---|---|\n",
            );
            for r in &self.rows {
                if let (Some(p), Some(t)) = (r.predicted_ms_per_token, r.predicted_ttft_ms) {
                    s.push_str(&format!(
                        "| {} | {:.1} | {:.1} | {:+.0}% | {:.0} | {:.0} | {:+.0}% |\n",
                        r.mode,
                        p,
                        r.ms_per_token,
                        (p / r.ms_per_token.max(1e-9) - 1.0) * 100.0,
                        t,
                        r.ttft_ms,
                        (t / r.ttft_ms.max(1e-9) - 1.0) * 100.0
                    ));
                }
            }
            s.push('\n');
        }
        let base_ppl = self.rows.first().and_then(|r| r.ppl);
        s.push_str(&format!(
            "\nS1 (same budget, 64-token prompt): {:.1} ms/token. Exact S2 / (S1 + KV bytes at the raw cold-read rate) = {:.2} (goal <= 1.5).\n",
            self.s1_ms_per_token, self.exact_over_s1_plus_kv
        ));
        if let Some(b) = base_ppl {
            for r in self.rows.iter().skip(1) {
                if let Some(p) = r.ppl {
                    s.push_str(&format!(
                        "{}: perplexity {:+.2}% against exact.\n",
                        r.mode,
                        (p / b - 1.0) * 100.0
                    ));
                }
            }
        }
        s.push_str(&format!(
            "\nTime to first token, {}-token prompt: cold {:.0} ms, resumed from a session {:.0} ms ({:.1}x faster; goal >= 10x).\n\n",
            self.prompt_tokens, self.ttft_cold_ms, self.ttft_resumed_ms, self.ttft_speedup
        ));
        s.push_str(
            "Page hit-rate model: predicted against measured (decode after 4 warm-up tokens, 24 tokens)\n\n\
             | mode | context | host cache (share of streamed KV) | hit rate predicted | hit rate measured | KV flash bytes/token predicted | measured | error |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        if !self.pages.is_empty() {
            // Printed after the model table below.
        }
        for p in &self.model {
            s.push_str(&format!(
                "| {} | {} | {:.0}% | {:.3} | {:.3} | {:.0} | {:.0} | {:.1}% |\n",
                p.mode,
                p.ctx,
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
                "\nPage size (exact attention, {}-token prompt, 32 tokens decoded, same budget)\n\n\
                 | tokens per page | ms/token | prefill tok/s | KV bytes/token from flash | pages at home per layer | stream pool halves |\n\
                 |---|---|---|---|---|---|\n",
                self.prompt_tokens / 2
            ));
            for p in &self.pages {
                s.push_str(&format!(
                    "| {} | {:.1} | {:.1} | {:.0} | {} | {} |\n",
                    p.page_tokens,
                    p.ms_per_token,
                    p.prefill_tok_s,
                    p.kv_flash_bytes_per_token,
                    p.home_pages,
                    p.halves
                ));
            }
        }
        s
    }
}
