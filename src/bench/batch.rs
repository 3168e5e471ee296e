//! `bench batch`: several tokens per streamed layer.
//!
//! Under the S1 budget (16 MiB, direct I/O) k sequences (k = 1, 2, 4, 8) are prefilled one after
//! another, then decoded together, one token each per pass. Reported per k: flash bytes per
//! decoded token, aggregate tokens per second, and each request's latency (from the start of the
//! run to its first and to its last token; median and max over the sequences). Every sequence's
//! ids are compared with the same prompt decoded alone (greedy, one sequence per engine); a
//! difference is reported as NOT EQUAL and [`BatchReport::outputs_unchanged`] turns false (the
//! CLI then exits non-zero). Then prompt-lookup drafting against plain decoding on prompts whose
//! answers repeat their input ([`draft`]). The goal lines are computed from the run's own rows.
//! Batched passes use small batches and pages (`--ubatch 8 --kv-page 4`) so eight sequences'
//! device pages fit the budget.

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

pub mod draft;
pub use draft::{COPY_INSTRUCTION, DraftRow};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Goal thresholds (issue: "Benchmark goals").
pub const BYTES_RATIO_GOAL: f64 = 0.25;
pub const TOK_S_RATIO_GOAL: f64 = 4.0;
pub const ACCEPTED_PER_PASS_GOAL: f64 = 1.5;
/// The concurrency the byte and tok/s goals are stated at.
pub const GOAL_SEQUENCES: usize = 8;

/// What `bench batch` runs.
#[derive(Debug, Clone)]
pub struct BatchBenchOptions {
    /// Device budget (S1: 16 MiB).
    pub budget: u64,
    pub io: IoMode,
    /// Concurrency levels (default 1, 2, 4, 8); ratios are against 1.
    pub sequences: Vec<usize>,
    /// Tokens generated per sequence, the first from its prefill (at least 2).
    pub n: usize,
    /// Repetitions (medians are reported).
    pub runs: usize,
    /// Words of the default text in each sequence's prompt.
    pub prompt_words: usize,
    /// Drafting: how many passages are asked to be repeated, the fewest words in each, and the
    /// most tokens generated for each (generation also stops at the end of generation).
    pub draft_passages: usize,
    pub draft_words: usize,
    pub draft_tokens: usize,
    pub draft: DraftConfig,
}

impl BatchBenchOptions {
    /// The S1 benchmark: 1, 2, 4 and 8 sequences of `n` tokens.
    pub fn s1(io: IoMode, n: usize, runs: usize) -> Self {
        Self {
            budget: 16 << 20,
            io,
            sequences: vec![1, 2, 4, 8],
            n,
            runs,
            prompt_words: 30,
            draft_passages: 3,
            draft_words: 50,
            draft_tokens: 96,
            draft: DraftConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchRow {
    pub sequences: usize,
    /// Tokens the decode passes produced, all sequences together (each sequence's first token
    /// comes from its prefill and is not counted here).
    pub decoded_tokens: usize,
    pub decode_passes: usize,
    /// Flash bytes read during the decode passes (weights and KV pages) per decoded token.
    pub flash_bytes_per_token: f64,
    /// Against one sequence.
    pub bytes_ratio: f64,
    /// Decoded tokens per second of decode time, all sequences together.
    pub aggregate_tok_s: f64,
    pub tok_s_ratio: f64,
    pub decode_ms_per_pass: f64,
    /// Per request, from the start of the run (before the first prefill): to its first token
    /// (after its own prefill) and to its last token; median and max over the sequences.
    pub first_token_ms_p50: f64,
    pub first_token_ms_max: f64,
    pub latency_ms_p50: f64,
    pub latency_ms_max: f64,
    /// Every sequence's ids, in every run, equal the same prompt decoded alone.
    pub outputs_unchanged: bool,
    /// Sequences (0-based) whose ids differed from decoding alone in some run.
    pub differing: Vec<usize>,
    pub placement: String,
}

/// One goal line: the figure, its threshold and whether it holds.
#[derive(Debug, Clone, Serialize)]
pub struct Goal {
    pub name: String,
    pub value: Option<f64>,
    pub target: String,
    pub met: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct BatchReport {
    pub adapter: String,
    pub budget: u64,
    /// Tokens generated per sequence.
    pub n: usize,
    pub prompt_tokens: Vec<usize>,
    pub rows: Vec<BatchRow>,
    pub draft_config: String,
    pub draft_words: usize,
    pub draft_tokens: usize,
    /// Tokens of each drafting prompt.
    pub draft_prompt_tokens: Vec<usize>,
    pub drafts: Vec<DraftRow>,
    /// Lookup drafting's ids equal plain decoding's.
    pub draft_outputs_unchanged: bool,
    pub goals: Vec<Goal>,
}

impl BatchReport {
    /// Every batched sequence and the drafted generation gave the ids of plain decoding.
    pub fn outputs_unchanged(&self) -> bool {
        self.draft_outputs_unchanged && self.rows.iter().all(|r| r.outputs_unchanged)
    }
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

fn read_bytes(e: &Engine) -> u64 {
    e.flash_bytes() + e.kv_stats.fetch.flash_bytes
}

/// `count` words of the default text from word `start` (wrapping around a short text).
fn passage(words: &[&str], start: usize, count: usize) -> String {
    let count = count.min(words.len());
    let start = start % (words.len() - count + 1);
    words[start..start + count].join(" ")
}

/// One run of k sequences decoded together.
struct Run {
    bytes: u64,
    decode_s: f64,
    first_ms: Vec<f64>,
    last_ms: Vec<f64>,
    ids: Vec<Vec<u32>>,
}

fn run_k(e: &mut Engine, prompts: &[Vec<u32>], n: usize) -> BenchResult<Run> {
    let k = prompts.len();
    let seqs: Vec<u32> = (0..k).filter_map(|_| e.new_seq()).collect();
    if seqs.len() != k {
        return Err(format!("the engine holds {} sequences, not {k}", seqs.len()).into());
    }
    let mut samplers: Vec<Sampler> = (0..k).map(|_| greedy()).collect();
    let mut hist = prompts.to_vec();
    let mut ids = vec![Vec::new(); k];
    let mut first_ms = vec![0.0; k];
    let mut last_ms = vec![0.0; k];
    let t0 = Instant::now();
    // Prefill one sequence after another; each first token comes from its prefill's logits.
    for j in 0..k {
        let l = e
            .forward_batch(&[(seqs[j], prompts[j].as_slice())])?
            .remove(0);
        let id = samplers[j].sample(&l, &hist[j]);
        ids[j].push(id);
        hist[j].push(id);
        first_ms[j] = t0.elapsed().as_secs_f64() * 1e3;
        last_ms[j] = first_ms[j];
    }
    let f0 = read_bytes(e);
    let t1 = Instant::now();
    for _ in 1..n {
        let feed: Vec<[u32; 1]> = ids.iter().map(|v| [v[v.len() - 1]]).collect();
        let items: Vec<(u32, &[u32])> = seqs.iter().zip(&feed).map(|(s, i)| (*s, &i[..])).collect();
        let logits = e.forward_batch(&items)?;
        for j in 0..k {
            let id = samplers[j].sample(&logits[j], &hist[j]);
            ids[j].push(id);
            hist[j].push(id);
            last_ms[j] = t0.elapsed().as_secs_f64() * 1e3;
        }
    }
    let decode_s = t1.elapsed().as_secs_f64();
    let bytes = read_bytes(e) - f0;
    for s in seqs {
        e.free_seq(s)?;
    }
    Ok(Run {
        bytes,
        decode_s,
        first_ms,
        last_ms,
        ids,
    })
}

fn med(v: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.collect();
    median(&mut v)
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

pub fn run(
    m: &LoadedModel,
    base: &EngineOptions,
    b: &BatchBenchOptions,
) -> BenchResult<BatchReport> {
    if b.n < 2 {
        return Err(
            "bench batch: at least 2 tokens per sequence (one from the prefill, one decoded)"
                .into(),
        );
    }
    if b.sequences.is_empty() || b.sequences.contains(&0) {
        return Err("bench batch: concurrency levels are at least 1".into());
    }
    let text = std::fs::read_to_string(super::kv::default_text())?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let kmax = b.sequences.iter().copied().max().unwrap_or(1);
    // Prompt j is the same at every concurrency level.
    let prompts: Vec<Vec<u32>> = (0..kmax)
        .map(|j| {
            m.tokenizer
                .encode(&passage(&words, 2000 + j * 97, b.prompt_words), false)
        })
        .collect();
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut o1 = base.clone();
    o1.gpu.budget = Some(b.budget);
    o1.ubatch = 8;
    o1.kv_page = Some(4);
    o1.ctx = Some((longest + b.n).max(256));
    o1.max_seqs = 1;
    // Each prompt decoded alone: the ids every batched sequence must reproduce.
    let mut alone = Vec::with_capacity(kmax);
    {
        let mut e = engine(m, &o1, b.io)?;
        for p in &prompts {
            e.reset();
            let (ids, _) = e.generate(p, b.n, &mut greedy(), |_| false, |_| true)?;
            alone.push(ids);
        }
    }
    let mut rows: Vec<BatchRow> = Vec::new();
    let mut adapter = String::new();
    for &k in &b.sequences {
        let mut o = o1.clone();
        o.max_seqs = k;
        let mut runs = Vec::new();
        let mut placement = String::new();
        for _ in 0..b.runs.max(1) {
            let mut e = engine(m, &o, b.io)?;
            adapter = e.ctx.info.name.clone();
            placement = e.placement.to_string();
            let r = run_k(&mut e, &prompts[..k], b.n)?;
            eprintln!(
                "{k} sequences: {:.1} ms/pass, {:.0} flash bytes/token",
                r.decode_s * 1e3 / (b.n - 1) as f64,
                r.bytes as f64 / (k * (b.n - 1)) as f64
            );
            runs.push(r);
        }
        let decoded = k * (b.n - 1);
        let differing: Vec<usize> = (0..k)
            .filter(|&j| runs.iter().any(|r| r.ids[j] != alone[j]))
            .collect();
        rows.push(BatchRow {
            sequences: k,
            decoded_tokens: decoded,
            decode_passes: b.n - 1,
            flash_bytes_per_token: med(runs.iter().map(|r| r.bytes as f64 / decoded as f64)),
            bytes_ratio: 0.0,
            aggregate_tok_s: med(runs.iter().map(|r| decoded as f64 / r.decode_s.max(1e-9))),
            tok_s_ratio: 0.0,
            decode_ms_per_pass: med(runs.iter().map(|r| r.decode_s * 1e3 / (b.n - 1) as f64)),
            first_token_ms_p50: med(runs.iter().map(|r| med(r.first_ms.iter().copied()))),
            first_token_ms_max: med(runs.iter().map(|r| max(&r.first_ms))),
            latency_ms_p50: med(runs.iter().map(|r| med(r.last_ms.iter().copied()))),
            latency_ms_max: med(runs.iter().map(|r| max(&r.last_ms))),
            outputs_unchanged: differing.is_empty(),
            differing,
            placement,
        });
    }
    // Ratios against one sequence (the first row when 1 is not among the levels).
    if let Some((b1, t1)) = rows
        .iter()
        .find(|r| r.sequences == 1)
        .or(rows.first())
        .map(|r| (r.flash_bytes_per_token, r.aggregate_tok_s))
    {
        for r in &mut rows {
            r.bytes_ratio = r.flash_bytes_per_token / b1.max(1e-9);
            r.tok_s_ratio = r.aggregate_tok_s / t1.max(1e-9);
        }
    }
    // Drafting on prompts whose answers repeat their input, plain against lookup.
    let d = draft::run(m, base, b, &words)?;
    let drafts = d.rows;
    let draft_outputs_unchanged = drafts[0].ids == drafts[1].ids;
    let goals = goals(&rows, &drafts[1], draft_outputs_unchanged);
    Ok(BatchReport {
        adapter,
        budget: b.budget,
        n: b.n,
        prompt_tokens: prompts.iter().map(Vec::len).collect(),
        rows,
        draft_config: format!("ngram={},max={}", b.draft.ngram, b.draft.max),
        draft_words: b.draft_words,
        draft_tokens: b.draft_tokens,
        draft_prompt_tokens: d.prompt_tokens,
        drafts,
        draft_outputs_unchanged,
        goals,
    })
}

/// The goal lines, from the run's own rows.
fn goals(rows: &[BatchRow], lookup: &DraftRow, same: bool) -> Vec<Goal> {
    let base = rows.iter().find(|r| r.sequences == 1);
    let top = rows.iter().find(|r| r.sequences == GOAL_SEQUENCES);
    let missing = format!(
        "not measured: the goal compares {GOAL_SEQUENCES} sequences with 1 and this run lacks one of them"
    );
    let mut g = Vec::new();
    match (base, top) {
        (Some(r1), Some(r8)) => {
            let unchanged = r1.outputs_unchanged && r8.outputs_unchanged;
            let ratio = r8.flash_bytes_per_token / r1.flash_bytes_per_token.max(1e-9);
            g.push(Goal {
                name: format!("flash bytes per generated token, {GOAL_SEQUENCES} sequences against 1, outputs unchanged"),
                value: Some(ratio),
                target: format!("<= {BYTES_RATIO_GOAL}"),
                met: ratio <= BYTES_RATIO_GOAL && unchanged,
                detail: format!(
                    "{:.0} / {:.0} bytes = x{ratio:.3}; outputs unchanged: {}",
                    r8.flash_bytes_per_token,
                    r1.flash_bytes_per_token,
                    yes(unchanged)
                ),
            });
            let ratio = r8.aggregate_tok_s / r1.aggregate_tok_s.max(1e-9);
            g.push(Goal {
                name: format!("aggregate tok/s, {GOAL_SEQUENCES} sequences against 1"),
                value: Some(ratio),
                target: format!(">= {TOK_S_RATIO_GOAL}"),
                met: ratio >= TOK_S_RATIO_GOAL,
                detail: format!(
                    "{:.2} / {:.2} tok/s = x{ratio:.2}",
                    r8.aggregate_tok_s, r1.aggregate_tok_s
                ),
            });
        }
        _ => {
            for (name, target) in [
                (
                    "flash bytes per generated token",
                    format!("<= {BYTES_RATIO_GOAL}"),
                ),
                ("aggregate tok/s", format!(">= {TOK_S_RATIO_GOAL}")),
            ] {
                g.push(Goal {
                    name: format!("{name}, {GOAL_SEQUENCES} sequences against 1"),
                    value: None,
                    target,
                    met: false,
                    detail: missing.clone(),
                });
            }
        }
    }
    g.push(Goal {
        name: "lookup drafts: drafted tokens accepted per decode pass on the repeating prompts"
            .into(),
        value: Some(lookup.accepted_per_pass),
        target: format!(">= {ACCEPTED_PER_PASS_GOAL}"),
        met: lookup.accepted_per_pass >= ACCEPTED_PER_PASS_GOAL,
        detail: format!(
            "{} accepted over {} decode passes = {:.2} (excluding the token every pass yields \
             anyway; {:.2} per pass that carried a draft); tokens per pass including that token: \
             {:.2}; output equal to plain decoding: {}",
            lookup.accepted,
            lookup.decode_passes,
            lookup.accepted_per_pass,
            lookup.accepted_per_draft_pass,
            lookup.tokens_per_pass,
            yes(same)
        ),
    });
    g
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}

impl BatchReport {
    pub fn to_markdown(&self) -> String {
        let placement = self
            .rows
            .first()
            .map(|r| r.placement.as_str())
            .unwrap_or("");
        let mut s = format!(
            "adapter {}; budget {:.0} MiB ({placement}); prompts of {}-{} tokens, prefilled one after \
             another, then one token per sequence per pass, {} tokens per sequence (the first from \
             its prefill); medians of the runs. Flash bytes and tok/s count the decode passes. \
             Latency is per request, from the start of the run to its first and to its last token \
             (median and max over the sequences); decoding together, every sequence's last token \
             comes from the same pass, so the last-token figures differ only by sampling time, \
             while first tokens wait for the prefills before them. Outputs unchanged: each \
             sequence's ids equal the same prompt decoded alone (greedy).\n\n\
             | sequences | decoded tokens | flash bytes per decoded token | x vs 1 | aggregate tok/s | x vs 1 | decode ms per pass | first token ms, median / max | last token ms, median / max | outputs unchanged |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
            self.adapter,
            self.budget as f64 / 1048576.0,
            self.prompt_tokens.iter().min().unwrap_or(&0),
            self.prompt_tokens.iter().max().unwrap_or(&0),
            self.n,
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.3} | {:.2} | {:.2} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {} |\n",
                r.sequences,
                r.decoded_tokens,
                r.flash_bytes_per_token,
                r.bytes_ratio,
                r.aggregate_tok_s,
                r.tok_s_ratio,
                r.decode_ms_per_pass,
                r.first_token_ms_p50,
                r.first_token_ms_max,
                r.latency_ms_p50,
                r.latency_ms_max,
                yes(r.outputs_unchanged)
            ));
        }
        for r in self.rows.iter().filter(|r| r.placement != placement) {
            s.push_str(&format!(
                "\nWith {} sequences: {}.\n",
                r.sequences, r.placement
            ));
        }
        for r in self.rows.iter().filter(|r| !r.outputs_unchanged) {
            s.push_str(&format!(
                "\nNOT EQUAL: with {} sequences, sequence(s) {:?} gave ids that differ from decoding alone.\n",
                r.sequences, r.differing
            ));
        }
        s.push_str(&format!(
            "\nPrompt-lookup drafting ({}) against plain decoding, greedy, on {} prompts whose \
             answers repeat their input: through the chat template, \"{COPY_INSTRUCTION}\" followed \
             by a passage of the default text: whole sentences, at least {} words, from the first \
             sentence after evenly spaced points of the text ({:?} prompt tokens). Generation stops \
             at the end of generation or after {} tokens; figures are summed over the prompts. \
             Accepted per pass: drafted tokens accepted per decode pass, excluding the token every \
             pass yields anyway (passes with no draft count with 0); tokens per pass include that \
             token. Flash bytes per token include the prefills.\n\n\
             | decoding | tokens | decode passes | passes with a draft | accepted / drafted | accepted per pass | accepted per drafted pass | tokens per pass | ms/token | flash bytes/token |\n\
             |---|---|---|---|---|---|---|---|---|---|\n",
            self.draft_config,
            self.draft_prompt_tokens.len(),
            self.draft_words,
            self.draft_prompt_tokens,
            self.draft_tokens
        ));
        for d in &self.drafts {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} / {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} |\n",
                d.mode,
                d.tokens,
                d.decode_passes,
                d.draft_passes,
                d.accepted,
                d.drafted,
                d.accepted_per_pass,
                d.accepted_per_draft_pass,
                d.tokens_per_pass,
                d.ms_per_token,
                d.flash_bytes_per_token
            ));
        }
        s.push_str(&format!(
            "\nLookup output equal to plain decoding: {}\n",
            yes(self.draft_outputs_unchanged)
        ));
        if !self.draft_outputs_unchanged {
            s.push_str("\nNOT EQUAL: lookup drafting changed the greedy output.\n");
        }
        s.push_str("\nGoals:\n\n");
        for g in &self.goals {
            s.push_str(&format!(
                "- {} {}: {} ({})\n",
                g.name,
                g.target,
                if g.met { "met" } else { "not met" },
                g.detail
            ));
        }
        s
    }
}
