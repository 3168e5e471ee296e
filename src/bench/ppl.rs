//! `bench ppl`: the perplexity of a text at a long context under exact attention and each page
//! selection mode of `bench kv`, all resident (placement never changes results), each mode's
//! loss against exact paired chunk by chunk, and the goal on quest 25%'s loss.
//!
//! Apart from `bench kv` because it times nothing: it is the longest part of a full bench run
//! and can run while nothing else is timed.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::kv::{Goal, MODES, default_text, select};
use crate::engine::{Engine, EngineOptions};
use crate::model::LoadedModel;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Goal: quest 25% perplexity loss against exact, percent.
pub const GOAL_QUEST_PPL_LOSS_PCT: f64 = 1.0;

/// What `bench ppl` runs.
pub struct PplOptions<'a> {
    pub model: &'a LoadedModel,
    pub base: EngineOptions,
    /// The text (None: `bench kv`'s default text).
    pub text: Option<PathBuf>,
    /// Tokens of context of every chunk.
    pub ctx: usize,
    /// Chunks per mode, at most what the text holds.
    pub chunks: usize,
}

/// One mode's perplexity at the context.
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

/// The figures of `bench ppl`.
#[derive(Debug, Clone, Serialize)]
pub struct PplReport {
    pub adapter: String,
    pub backend: String,
    pub text: String,
    pub ctx: usize,
    pub rows: Vec<PplRow>,
    pub goal: Goal,
}

/// Perplexity at `o.ctx` for every mode of [`MODES`], exact first.
pub fn run(o: &PplOptions<'_>) -> BenchResult<PplReport> {
    if o.chunks == 0 {
        return Err("bench ppl needs at least one chunk".into());
    }
    let m = o.model;
    let path = o.text.clone().unwrap_or_else(default_text);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("reading the benchmark text {}: {e}", path.display()))?;
    let bos = if m.tokenizer.add_bos() {
        m.tokenizer.bos_id()
    } else {
        None
    };
    let ids = m
        .tokenizer
        .encode_with_bos(&text, false, m.tokenizer.add_bos());
    let list = crate::eval::ppl::chunks(&ids, o.ctx, Some(o.chunks), bos)?;
    let mut rows: Vec<PplRow> = Vec::new();
    let mut exact_chunks: Vec<f64> = Vec::new();
    let (mut adapter, mut backend) = (String::new(), String::new());
    for (i, mode) in MODES.iter().enumerate() {
        let mut opts = o.base.clone();
        opts.gpu.budget = None;
        opts.ctx = Some(o.ctx);
        opts.logit_rows = 16;
        opts.kv_select = select(mode)?;
        let mut e = Engine::new(m.gguf.clone(), &opts)?;
        if adapter.is_empty() {
            adapter = e.ctx.info.name.clone();
            backend = e.ctx.backend_name();
        }
        let t = Instant::now();
        let n = list.len();
        let rep = crate::eval::perplexity(&mut e, &list, &mut |k, acc| {
            eprintln!(
                "ppl {mode} ({}/{}): chunk {}/{n}, ppl so far {:.4} ({:.0} s)",
                i + 1,
                MODES.len(),
                k + 1,
                acc.ppl(),
                t.elapsed().as_secs_f64()
            );
        })?;
        eprintln!(
            "ppl {mode} ({}/{}): {:.4} +/- {:.5} over {} chunks ({:.0} s)",
            i + 1,
            MODES.len(),
            rep.ppl,
            rep.stderr,
            rep.chunks,
            t.elapsed().as_secs_f64()
        );
        if *mode == "exact" {
            exact_chunks = rep.per_chunk_ppl.clone();
        }
        let base = rows.first().map(|r| r.ppl).unwrap_or(rep.ppl);
        let (loss, loss_se) = paired_loss(&rep.per_chunk_ppl, &exact_chunks);
        rows.push(PplRow {
            mode: mode.to_string(),
            ppl: rep.ppl,
            stderr: rep.stderr,
            chunks: rep.chunks,
            tokens: rep.tokens,
            loss_pct: (rep.ppl / base - 1.0) * 100.0,
            paired_loss_pct: loss,
            paired_loss_stderr_pct: loss_se,
        });
    }
    let goal = goal(&rows);
    Ok(PplReport {
        adapter,
        backend,
        text: path.display().to_string(),
        ctx: o.ctx,
        rows,
        goal,
    })
}

/// The goal line on quest:25%'s loss against exact.
fn goal(rows: &[PplRow]) -> Goal {
    let q = rows.iter().find(|p| p.mode == "quest:25%");
    Goal {
        goal: format!("quest 25% perplexity loss <= {GOAL_QUEST_PPL_LOSS_PCT}%"),
        met: q.map(|q| q.loss_pct <= GOAL_QUEST_PPL_LOSS_PCT),
        detail: match q {
            Some(q) => format!(
                "quest:25% ppl {:.4} against exact {:.4}: {:+.2}%{} over {} chunks",
                q.ppl,
                rows.first().map_or(f64::NAN, |e| e.ppl),
                q.loss_pct,
                q.paired_loss_stderr_pct
                    .map(|s| format!(" (paired stderr {s:.2}%)"))
                    .unwrap_or_default(),
                q.chunks
            ),
            None => "no quest:25% row".into(),
        },
    }
}

/// A mode's perplexity loss against exact from the chunks' log ratios `d_k = ln(ppl_k /
/// exact_k)`: `100 (exp(mean d) - 1)` and its standard error `100 exp(mean d) sd(d) / sqrt(K)`
/// (None below 2 chunks). Chunks score the same number of tokens, so `mean d` is the log ratio
/// of the overall perplexities; pairing removes the chunks' own spread of difficulty.
pub fn paired_loss(mode: &[f64], exact: &[f64]) -> (f64, Option<f64>) {
    let d: Vec<f64> = mode.iter().zip(exact).map(|(a, b)| (a / b).ln()).collect();
    if d.is_empty() {
        return (0.0, None);
    }
    let k = d.len() as f64;
    let mean = d.iter().sum::<f64>() / k;
    let loss = (mean.exp() - 1.0) * 100.0;
    if d.len() < 2 {
        return (loss, None);
    }
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (k - 1.0);
    (loss, Some(mean.exp() * (var / k).sqrt() * 100.0))
}

impl PplReport {
    pub fn to_markdown(&self) -> String {
        let (chunks, tokens) = self.rows.first().map_or((0, 0), |r| (r.chunks, r.tokens));
        let mut s = format!(
            "adapter {} ({}); text {}\n\n\
             Perplexity at ctx {} (all resident; {chunks} chunks, {tokens} scored tokens each mode). The loss is \
             against exact; its standard error pairs the modes chunk by chunk.\n\n\
             | mode | ppl ± stderr | loss vs exact | paired stderr of the loss |\n|---|---|---|---|\n",
            self.adapter, self.backend, self.text, self.ctx
        );
        for p in &self.rows {
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
        s.push_str(&format!(
            "\nGoal, from the figures above: {}: **{}**. {}\n",
            self.goal.goal,
            super::kv::verdict(self.goal.met),
            self.goal.detail
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::{PplRow, goal, paired_loss};

    #[test]
    fn paired_loss_is_the_ratio_of_the_means_with_the_spread_of_the_chunk_ratios() {
        // Equal chunk ratios: the loss is that ratio, with no spread.
        let (l, se) = paired_loss(&[11.0, 22.0], &[10.0, 20.0]);
        assert!((l - 10.0).abs() < 1e-9, "{l}");
        assert!(se.unwrap().abs() < 1e-9);
        // One chunk: no standard error.
        assert_eq!(paired_loss(&[10.0], &[10.0]), (0.0, None));
        // Ratios 1.0 and 1.02: mean log ratio ln(1.02)/2, stderr = |d1 - d2| / 2 (times exp).
        let (l, se) = paired_loss(&[10.0, 10.2], &[10.0, 10.0]);
        let d = 1.02f64.ln();
        assert!((l - ((d / 2.0).exp() - 1.0) * 100.0).abs() < 1e-9);
        assert!((se.unwrap() - (d / 2.0).exp() * d / 2.0 * 100.0).abs() < 1e-9);
    }

    #[test]
    fn the_goal_reads_quest_25_against_its_limit() {
        let row = |mode: &str, ppl: f64, loss: f64| PplRow {
            mode: mode.into(),
            ppl,
            stderr: 0.1,
            chunks: 2,
            tokens: 10,
            loss_pct: loss,
            paired_loss_pct: loss,
            paired_loss_stderr_pct: Some(0.5),
        };
        let g = goal(&[row("exact", 10.0, 0.0), row("quest:25%", 10.05, 0.5)]);
        assert_eq!(g.met, Some(true));
        assert!(g.detail.contains("+0.50%"), "{}", g.detail);
        let g = goal(&[row("exact", 10.0, 0.0), row("quest:25%", 10.3, 3.0)]);
        assert_eq!(g.met, Some(false));
        assert_eq!(goal(&[row("exact", 10.0, 0.0)]).met, None);
    }
}
