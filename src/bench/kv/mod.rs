//! `bench kv`: the KV cache on flash.
//!
//! - Scenario S2: the default model under a 16 MiB device budget with direct I/O and a cold
//!   page cache prefills a long prompt of natural prose, then decodes; exact attention and page
//!   selection at 25% and 50% of the pages, plain and lagged (`quest-lag:`), each without a
//!   host cache and with one (the streamed weights plus a share of the streamed KV pages), so
//!   the hit-rate columns carry information. Beside it, S1 (the same budget, a 64-token prompt: weights streaming with a
//!   KV cache that stays on the device) and the raw cold read rate, so exact S2 can be compared
//!   with "S1 plus the KV bytes at the flash rate".
//! - Time to first token for the long prompt, cold and resumed from a saved session.
//! - The page hit-rate model against measurement over context length x host-cache size.
//! - Page sizes side by side at the S2 setting, with the size the bench's own rule picks.
//! - Goal lines computed from these figures ([`Goal`]).
//!
//! Submodules: [`s2`] (S1, S2, TTFT), [`sweep`] (the hit-rate model sweep and the
//! page sizes), [`report`] (figures, goals and markdown).

mod markdown;
mod report;
mod s2;
mod sweep;

use std::path::PathBuf;
use std::sync::Arc;

pub use report::{
    Goal, KvReport, ModeRow, ModelPoint, PAGE_RULE_TOLERANCE, PageRow, recommend_page, verdict,
};
pub use sweep::points as model_sweep_points;

use super::{median, raw_cold_read};
use crate::engine::{Engine, EngineOptions, GenStats};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, IoMode, ReaderOptions};
use crate::model::LoadedModel;
use crate::plan::{ExecPlan, KvSelect};
use crate::sampling::{Sampler, SamplerParams};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The S2 device budget when none is given.
pub const S2_BUDGET: u64 = 16 << 20;
/// The share of the streamed KV pages the S2 host-cache rows hold when none is given.
pub const DEFAULT_CACHE_SHARE: f64 = 0.25;
/// Prompt tokens of S1 (as in `bench stream`).
pub const S1_PROMPT: usize = 64;
/// The attention modes of S2: exact, page selection at a quarter and half of the pages, and
/// the same selections ranked by the previous token's scores (read ahead, no per-layer wait).
pub const MODES: [&str; 5] = [
    "exact",
    "quest:25%",
    "quest-lag:25%",
    "quest:50%",
    "quest-lag:50%",
];

/// What `bench kv` runs.
pub struct KvBenchOptions<'a> {
    pub model: &'a LoadedModel,
    pub base: EngineOptions,
    pub io: IoMode,
    /// Device budget of every run (S2: 16 MiB).
    pub budget: u64,
    pub text: Option<PathBuf>,
    pub prompt_tokens: usize,
    pub n_gen: usize,
    /// Repetitions of every measured point (medians are reported).
    pub runs: usize,
    /// Host cache of the second set of S2 rows, as a share (0 to 1) of the KV bytes that
    /// stream at the end of the run, on top of the streamed weights (0: no such rows).
    pub cache_share: f64,
    /// Page sizes to compare at the S2 setting (empty: skip).
    pub page_sweep: Vec<u32>,
    /// Prompt tokens of the page sweep (None: the whole prompt).
    pub page_sweep_tokens: Option<usize>,
    /// Runs of the exact S2 row without a host cache that prefill cold (None: every run of
    /// every row prefills cold); the other S2 runs resume the prompt from the session.
    pub cold_runs: Option<usize>,
}

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

/// What streams under a plan: the weight bytes every token reads (pinned first in the host
/// cache) and the bytes of the KV pages that live on flash once `n` tokens are cached.
#[derive(Debug, Clone, Copy)]
struct Streamed {
    weights: u64,
    kv: u64,
}

impl Streamed {
    fn of(plan: &ExecPlan, n: usize) -> Self {
        let kv = &plan.kv;
        let pages = n.div_ceil(kv.page_tokens.max(1) as usize) as u64;
        let away = pages.saturating_sub(kv.home_pages as u64);
        Self {
            weights: crate::plan::perf::streamed_weight_bytes(plan),
            kv: if kv.streams {
                away * kv.page_bytes * plan.layers.len() as u64
            } else {
                0
            },
        }
    }

    /// The host cache holding the streamed weights and `share` of the streamed KV.
    fn dram(&self, share: f64) -> u64 {
        self.weights + (self.kv as f64 * share).round() as u64
    }
}

struct Ctx<'a> {
    o: &'a KvBenchOptions<'a>,
    raws: Vec<f64>,
    verified: bool,
    adapter: String,
    backend: String,
}

impl Ctx<'_> {
    /// An engine on a cold page cache (the cache is evicted again after loading), with a host
    /// cache of `dram` bytes; the raw cold read rate is measured first.
    fn engine(&mut self, opts: &EngineOptions, dram: u64) -> BenchResult<Engine> {
        let (raw, v) = raw_cold_read(&self.o.model.path)?;
        self.raws.push(raw);
        self.verified &= v;
        self.build(opts, dram)
    }

    /// As [`Ctx::engine`] without the raw read (for looking at a plan).
    fn build(&mut self, opts: &EngineOptions, dram: u64) -> BenchResult<Engine> {
        let m = self.o.model;
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
        if self.adapter.is_empty() {
            self.adapter = e.ctx.info.name.clone();
            self.backend = e.ctx.backend_name();
        }
        Ok(e)
    }

    /// The engine options of a run: the bench's budget, a context of `ctx` tokens, a mode.
    fn opts(&self, ctx: usize, mode: &str) -> BenchResult<EngineOptions> {
        let mut o = self.o.base.clone();
        o.gpu.budget = Some(self.o.budget);
        o.ctx = Some(ctx);
        o.kv_select = select(mode)?;
        Ok(o)
    }

    /// What streams in `mode` with a context of `ctx` tokens, once `n` are cached.
    fn streamed(&mut self, ctx: usize, mode: &str, n: usize) -> BenchResult<Streamed> {
        let e = self.build(&self.opts(ctx, mode)?, 0)?;
        Ok(Streamed::of(&e.plan, n))
    }
}

/// The page selection of a mode: `exact` or a `quest:` spec (the first two layers dense).
pub(crate) fn select(mode: &str) -> BenchResult<Option<KvSelect>> {
    Ok(match mode {
        "exact" => None,
        s => Some(KvSelect::parse(s, 2)?),
    })
}

fn med(rows: &[GenStats], f: impl Fn(&GenStats) -> f64) -> f64 {
    let mut v: Vec<f64> = rows.iter().map(f).collect();
    median(&mut v)
}

fn med_of(v: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().collect();
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
            o.prompt_tokens + 16
        )
        .into());
    }
    if !(0.0..=1.0).contains(&o.cache_share) {
        return Err(format!("cache share {} is not from 0 to 1", o.cache_share).into());
    }
    let runs = o.runs.max(1);
    let prompt = all[..o.prompt_tokens].to_vec();
    let mut c = Ctx {
        o,
        raws: Vec::new(),
        verified: true,
        adapter: String::new(),
        backend: String::new(),
    };
    let dir = std::env::temp_dir().join(format!("flashlm-bench-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let session_path = dir.join("s2.session");
    let result = (|| {
        let s1 = s2::s1(&mut c, &prompt, runs)?;
        let s2 = s2::s2(&mut c, &prompt, runs, &session_path)?;
        let resumed = s2::ttft_resumed(&mut c, &prompt, runs, &session_path)?;
        let model = sweep::model(&mut c, &prompt, runs, &session_path)?;
        let pages = sweep::pages(&mut c, &prompt, runs)?;
        Ok::<_, Box<dyn std::error::Error>>((s1, s2, resumed, model, pages))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let (s1, s2, resumed, model, pages) = result?;
    Ok(report::assemble(report::Parts {
        adapter: c.adapter,
        backend: c.backend,
        text: path.display().to_string(),
        prompt_tokens: o.prompt_tokens,
        generated_tokens: o.n_gen,
        gpu_budget: o.budget,
        runs,
        raw_cold_read_gb_s: med_of(c.raws),
        cold_cache_verified: c.verified,
        s1,
        s2,
        ttft_resumed_ms: resumed,
        model,
        pages,
    }))
}
