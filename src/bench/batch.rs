//! `bench batch`: several tokens per streamed layer.
//!
//! Under the S1 budget (16 MiB, direct I/O) with every layer streaming, k sequences (k = 1, 2, 4,
//! 8) are prefilled, then decoded together, one token each per pass: flash bytes per generated
//! token, aggregate tokens per second and per-request latency. Then prompt-lookup drafting on a
//! prompt that repeats its input: tokens per pass and accepted drafts. Batched passes use small
//! batches and pages (`--ubatch 8 --kv-page 4`) so eight sequences' device pages fit the budget.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::median;
use crate::engine::draft::DraftConfig;
use crate::engine::{Engine, EngineOptions};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, IoMode, ReaderOptions};
use crate::model::LoadedModel;
use crate::sampling::{Sampler, SamplerParams};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;
/// One run: bytes per token, tok/s, latency ms, ms per pass, placement.
type Sample = (f64, f64, f64, f64, String);

#[derive(Debug, Clone, Serialize)]
pub struct BatchRow {
    pub sequences: usize,
    pub generated_tokens: usize,
    pub flash_bytes_per_token: f64,
    pub aggregate_tok_s: f64,
    /// Median over the requests of prefill plus decode time.
    pub request_latency_ms: f64,
    pub decode_ms_per_pass: f64,
    pub placement: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct DraftRow {
    pub mode: String,
    pub tokens: usize,
    pub passes: u64,
    pub tokens_per_pass: f64,
    pub accepted: u64,
    pub drafted: u64,
    pub ms_per_token: f64,
    pub flash_bytes_per_token: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub adapter: String,
    pub budget: u64,
    pub rows: Vec<BatchRow>,
    pub bytes_ratio_8_to_1: f64,
    pub tok_s_ratio_8_to_1: f64,
    pub drafts: Vec<DraftRow>,
}

fn greedy() -> Sampler {
    Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    })
}

fn engine(m: &LoadedModel, o: &EngineOptions, io: IoMode) -> BenchResult<Engine> {
    let f = FlashFile::open(
        &m.path,
        ReaderOptions {
            mode: io,
            ..Default::default()
        },
    )?;
    m.gguf.release_pages();
    Ok(Engine::with_source(
        m.gguf.clone(),
        Arc::new(FlashSource::new(f, 0)),
        o,
    )?)
}

pub fn run(
    m: &LoadedModel,
    base: &EngineOptions,
    io: IoMode,
    budget: u64,
    n: usize,
    runs: usize,
) -> BenchResult<BatchReport> {
    let text = std::fs::read_to_string(super::kv::default_text())?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let prompt = |k: usize| {
        let start = 2000 + k * 97;
        m.tokenizer
            .encode(&words[start..start + 30].join(" "), false)
    };
    let mut rows = Vec::new();
    let mut adapter = String::new();
    for k in [1usize, 2, 4, 8] {
        let mut o = base.clone();
        o.gpu.budget = Some(budget);
        o.max_seqs = k;
        o.ubatch = 8;
        o.kv_page = Some(4);
        o.ctx = Some(256);
        let prompts: Vec<Vec<u32>> = (0..k).map(prompt).collect();
        let mut per = Vec::new();
        for _ in 0..runs.max(1) {
            let mut e = engine(m, &o, io)?;
            adapter = e.ctx.info.name.clone();
            let placement = e.placement.to_string();
            let seqs: Vec<u32> = (0..k).filter_map(|_| e.new_seq()).collect();
            let t0 = Instant::now();
            let mut logits = Vec::new();
            for (s, p) in seqs.iter().zip(&prompts) {
                logits.push(e.forward_batch(&[(*s, p.as_slice())])?.remove(0));
            }
            let prefill_s = t0.elapsed().as_secs_f64();
            let f0 = e.flash_bytes() + e.kv_stats.fetch.flash_bytes;
            let t1 = Instant::now();
            let mut samplers: Vec<Sampler> = (0..k).map(|_| greedy()).collect();
            let mut passes = 0;
            for _ in 0..n {
                let ids: Vec<[u32; 1]> = (0..k)
                    .map(|j| [samplers[j].sample(&logits[j], &prompts[j])])
                    .collect();
                let items: Vec<(u32, &[u32])> =
                    seqs.iter().zip(&ids).map(|(s, i)| (*s, &i[..])).collect();
                logits = e.forward_batch(&items)?;
                passes += 1;
            }
            let decode_s = t1.elapsed().as_secs_f64();
            let bytes = (e.flash_bytes() + e.kv_stats.fetch.flash_bytes - f0) as f64;
            let generated = k * n;
            eprintln!(
                "{k} sequences: {:.1} ms/pass, {:.0} flash bytes/token",
                decode_s * 1e3 / passes as f64,
                bytes / generated as f64
            );
            per.push((
                bytes / generated as f64,
                generated as f64 / decode_s,
                (prefill_s + decode_s) * 1e3,
                decode_s * 1e3 / passes as f64,
                placement,
            ));
        }
        let med = |f: &dyn Fn(&Sample) -> f64| {
            let mut v: Vec<f64> = per.iter().map(f).collect();
            median(&mut v)
        };
        rows.push(BatchRow {
            sequences: k,
            generated_tokens: k * n,
            flash_bytes_per_token: med(&|r| r.0),
            aggregate_tok_s: med(&|r| r.1),
            request_latency_ms: med(&|r| r.2),
            decode_ms_per_pass: med(&|r| r.3),
            placement: per[0].4.clone(),
        });
    }
    // Drafting on a prompt that repeats its input (copying a list), plain against lookup.
    let copy = "Copy the list exactly.\nList: apples, pears, plums, cherries, grapes, lemons, limes, figs, dates, kiwis, melons, peaches, quinces.\nCopy: apples, pears, plums,";
    let p = m.tokenizer.encode(copy, false);
    let mut drafts = Vec::new();
    for mode in ["plain", "lookup"] {
        let mut o = base.clone();
        o.gpu.budget = Some(budget);
        o.ctx = Some(256);
        let cfg = DraftConfig::default();
        o.logit_rows = cfg.max + 1;
        let mut e = engine(m, &o, io)?;
        let n_tok = 32;
        let f0 = e.flash_bytes();
        let (row, flash0) = if mode == "plain" {
            let (ids, s) = e.generate(&p, n_tok, &mut greedy(), |_| false, |_| true)?;
            (
                DraftRow {
                    mode: mode.into(),
                    tokens: ids.len(),
                    passes: (ids.len() - 1) as u64,
                    tokens_per_pass: 1.0,
                    accepted: 0,
                    drafted: 0,
                    ms_per_token: s.ms_per_token,
                    flash_bytes_per_token: 0.0,
                },
                f0,
            )
        } else {
            let (ids, s, d) =
                e.generate_drafted(&p, n_tok, &mut greedy(), &cfg, |_| false, |_| true)?;
            (
                DraftRow {
                    mode: mode.into(),
                    tokens: ids.len(),
                    passes: d.passes,
                    tokens_per_pass: d.tokens_per_pass,
                    accepted: d.accepted,
                    drafted: d.drafted,
                    ms_per_token: s.ms_per_token,
                    flash_bytes_per_token: 0.0,
                },
                f0,
            )
        };
        let mut row = row;
        row.flash_bytes_per_token = (e.flash_bytes() - flash0) as f64 / row.tokens as f64;
        eprintln!(
            "{mode}: {:.2} tokens per pass, {:.1} ms/token",
            row.tokens_per_pass, row.ms_per_token
        );
        drafts.push(row);
    }
    let r1 = &rows[0];
    let r8 = &rows[rows.len() - 1];
    Ok(BatchReport {
        adapter,
        budget,
        bytes_ratio_8_to_1: r8.flash_bytes_per_token / r1.flash_bytes_per_token.max(1e-9),
        tok_s_ratio_8_to_1: r8.aggregate_tok_s / r1.aggregate_tok_s.max(1e-9),
        rows,
        drafts,
    })
}

impl BatchReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {}; budget {:.0} MiB, every layer streamed; 30-word prompts, then one token per sequence per pass (median of the runs)\n\n\
             | sequences | tokens | flash bytes per generated token | aggregate tok/s | decode ms per pass | request latency, ms |\n\
             |---|---|---|---|---|---|\n",
            self.adapter,
            self.budget as f64 / 1048576.0
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.2} | {:.1} | {:.0} |\n",
                r.sequences,
                r.generated_tokens,
                r.flash_bytes_per_token,
                r.aggregate_tok_s,
                r.decode_ms_per_pass,
                r.request_latency_ms
            ));
        }
        s.push_str(&format!(
            "\n8 sequences against 1: flash bytes per token x{:.3} (goal <= 0.25), aggregate tok/s x{:.2} (goal >= 4).\n\n\
             Prompt-lookup drafting on a copying prompt (greedy; identical output):\n\n\
             | decoding | tokens | passes | tokens per pass | drafts accepted / drafted | ms/token | flash bytes/token |\n\
             |---|---|---|---|---|---|---|\n",
            self.bytes_ratio_8_to_1, self.tok_s_ratio_8_to_1
        ));
        for d in &self.drafts {
            s.push_str(&format!(
                "| {} | {} | {} | {:.2} | {} / {} | {:.1} | {:.0} |\n",
                d.mode,
                d.tokens,
                d.passes,
                d.tokens_per_pass,
                d.accepted,
                d.drafted,
                d.ms_per_token,
                d.flash_bytes_per_token
            ));
        }
        s
    }
}
