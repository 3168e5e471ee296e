//! Command-line arguments, with bounds on every number.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::flash::IoMode;
use crate::sampling::SamplerParams;

use super::CliResult;

#[derive(Parser, Debug)]
#[command(
    name = "flashlm",
    version,
    about = "LLM inference with weights and KV cache on flash, streamed to the GPU through wgpu"
)]
pub struct Cli {
    /// List the GPU adapters and exit.
    #[arg(long, global = true)]
    pub list_adapters: bool,
    /// Backends to use: vulkan, metal, dx12, gl (default: WGPU_BACKEND, else all).
    #[arg(long, global = true)]
    pub backend: Option<String>,
    /// Pick the adapter whose name contains this text (default: WGPU_ADAPTER_NAME, else the best).
    #[arg(long, global = true)]
    pub adapter: Option<String>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Complete a prompt (raw, no chat template).
    Run(RunArgs),
    /// Interactive multi-turn chat with the model's template; Ctrl-D ends it.
    Chat(ChatArgs),
    /// Show a model's config, tensors and tokenizer.
    Info {
        /// The GGUF file (default: the default model).
        path: Option<PathBuf>,
        /// The GGUF file (same as the positional argument).
        #[arg(long, short = 'm', conflicts_with = "path")]
        model: Option<PathBuf>,
    },
    /// Measure this machine's constants for the performance model (flash, upload, kernel and
    /// attention rates, dispatch cost, overlap) and save them to the cache directory. The last
    /// five calibrations of the adapter and model (within a day) are kept, and the one saved for
    /// predictions is the one measured at their median machine speed, so that one calibration
    /// caught in a slow or fast stretch of a shared machine does not set every prediction.
    Calibrate {
        /// The model whose shapes and file are measured (default: the default model).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Forget the earlier calibrations: save this one alone (after a change to the
        /// machine, its drivers or flashlm).
        #[arg(long)]
        fresh: bool,
    },
    /// Print the placement, prefetch depth, ring size and I/O mode a run would choose and its
    /// predicted ms/token (compute, weight I/O, KV I/O) and time to first token, from the
    /// calibration. No GPU is used: --upload auto plans the staging path (auto's choice on
    /// discrete GPUs and CPU rasterizers); --upload in-place plans reads into the layer slots.
    Plan {
        #[command(flatten)]
        model: ModelArgs,
        /// Prompt tokens: the time to first token is predicted for a prompt this long, and the
        /// decode step at a context of --prompt-tokens + -n/2 tokens (as `run` plans), at most
        /// the plan's context (--ctx).
        #[arg(long, default_value = "64", value_parser = parse_tokens)]
        prompt_tokens: usize,
        /// Tokens the run would generate (as `run -n`).
        #[arg(short = 'n', long = "n-predict", default_value = "64", value_parser = parse_n)]
        n: usize,
        /// The device's largest storage binding, in bytes (default: 128MiB, the smallest
        /// common limit).
        #[arg(long, value_parser = parse_max_binding)]
        max_binding: Option<u64>,
    },
    /// Show what a saved session file holds (tokens, pages, sizes, the model it belongs to).
    SessionInfo {
        /// The session file.
        file: PathBuf,
        /// Also check the session against this model file (its header hash and config).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
    },
    /// Evaluations.
    Eval(EvalArgs),
    /// Benchmarks.
    Bench(super::bench_args::BenchArgs),
    /// Write a llama GGUF of any shape with seeded random weights (streamed to disk).
    Synth(super::synth::SynthArgs),
    /// An OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models,
    /// /health, /metrics) with a chat page at /.
    Serve(ServeArgs),
}

fn bounded(s: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{what} must be a whole number from {lo} to {hi}, got {s:?}"))?;
    if v < lo || v > hi {
        return Err(format!("{what} must be from {lo} to {hi}, got {v}"));
    }
    Ok(v)
}

macro_rules! bounded_parser {
    ($vis:vis $name:ident, $ty:ty, $what:expr, $lo:expr, $hi:expr) => {
        $vis fn $name(s: &str) -> Result<$ty, String> {
            bounded(s, $what, $lo, $hi).map(|v| v as $ty)
        }
    };
}

bounded_parser!(parse_ctx, usize, "--ctx", 1, 1 << 22);
bounded_parser!(parse_io_threads, usize, "--io-threads", 1, 256);
bounded_parser!(parse_prefetch, usize, "--prefetch", 0, 64);
bounded_parser!(pub(super) parse_kv_page, u32, "--kv-page", 1, 1024);

bounded_parser!(parse_kv_window, u32, "--kv-window", 0, 1 << 16);
bounded_parser!(parse_dense, u32, "--kv-select-dense-layers", 0, 4096);
bounded_parser!(parse_ubatch, usize, "--ubatch", 1, 512);
bounded_parser!(parse_n, usize, "--n-predict", 0, 1 << 22);
bounded_parser!(parse_top_k, usize, "--top-k", 0, 1 << 24);
bounded_parser!(parse_last_n, usize, "--repeat-last-n", 0, 1 << 22);
bounded_parser!(pub(super) parse_runs, usize, "--runs", 1, 1000);
bounded_parser!(parse_chunks, usize, "--chunks", 1, 1 << 20);
bounded_parser!(pub(super) parse_ppl_chunks, usize, "--chunks", 1, 1 << 20);
bounded_parser!(pub(super) parse_tokens, usize, "token count", 1, 1 << 22);
bounded_parser!(parse_port, u16, "--port", 0, 65535);
bounded_parser!(parse_parallel, usize, "--parallel", 1, 64);
bounded_parser!(parse_queue, usize, "--queue", 0, 1 << 16);
bounded_parser!(parse_max_prompt, usize, "--max-prompt-tokens", 1, 1 << 22);
bounded_parser!(parse_max_tokens, usize, "--max-tokens", 1, 1 << 22);
bounded_parser!(parse_timeout, u64, "--timeout", 1, 7 * 24 * 3600);
bounded_parser!(parse_connections, usize, "--max-connections", 1, 1 << 16);

fn parse_body_size(s: &str) -> Result<u64, String> {
    let v = crate::flash::parse_size(s)?;
    if !(1..=1 << 30).contains(&v) {
        return Err(format!("--max-body must be from 1 byte to 1GiB, got {s:?}"));
    }
    Ok(v)
}

pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    crate::flash::parse_size(s)
}

fn bounded_size(s: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let v = crate::flash::parse_size(s).map_err(|e| format!("{what}: {e}"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{what} must be from {lo} to {hi} bytes, got {s:?}"));
    }
    Ok(v)
}

fn parse_io_chunk(s: &str) -> Result<u64, String> {
    bounded_size(s, "--io-chunk", 1, crate::flash::MAX_CHUNK as u64)
}

fn parse_ring_chunk(s: &str) -> Result<u64, String> {
    bounded_size(s, "--ring-chunk", 4096, 256 << 20)
}

fn parse_head_chunk(s: &str) -> Result<u64, String> {
    bounded_size(s, "--head-chunk", 4096, 256 << 20)
}

fn parse_max_binding(s: &str) -> Result<u64, String> {
    bounded_size(s, "--max-binding", 1 << 20, 1 << 40)
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: $FLASHLM_MODEL, else the cached SmolLM2-135M-Instruct).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Context length in tokens (default: the model's, at most 2048; up to the model's
    /// context length under any budget: the KV cache pages to flash).
    #[arg(long, value_parser = parse_ctx)]
    pub ctx: Option<usize>,
    /// Cap on every device byte (weights, KV, activations, staging), e.g. 16MiB or 1.5GB.
    /// Default: what the adapter allows, so everything can be resident.
    #[arg(long, value_parser = parse_size_arg)]
    pub gpu_budget: Option<u64>,
    /// How the model file and the KV page file are read and written: direct (bypasses the
    /// page cache, so bytes per token are true flash reads) or mmap. Default: the planner's
    /// choice when this machine is calibrated (`flashlm calibrate`), else direct.
    #[arg(long)]
    pub io: Option<IoMode>,
    /// Reader threads per read.
    #[arg(long, default_value = "4", value_parser = parse_io_threads)]
    pub io_threads: usize,
    /// Bytes per read request, e.g. 1MiB.
    #[arg(long, default_value = "1MiB", value_parser = parse_io_chunk)]
    pub io_chunk: u64,
    /// Host-side cache shared by weight bytes and KV pages (kept in DRAM instead of re-read
    /// from flash), e.g. 64MiB.
    #[arg(long, default_value = "0", value_parser = parse_size_arg)]
    pub dram_budget: u64,
    /// What stays on the GPU: auto (the planner's choice when this machine is calibrated, else
    /// whole layers first to last, then the head), all, none, or a list such as 0-9,head.
    #[arg(long, default_value = "auto")]
    pub resident: String,
    /// How streamed weights reach the GPU: auto (in place where device memory is host memory,
    /// else staging), staging (read into the staging ring, copied by the device) or in-place
    /// (read straight into mapped layer slots).
    #[arg(long, default_value = "auto")]
    pub upload: crate::engine::UploadMode,
    /// Bytes per staging-ring slot, e.g. 1MiB: a read through the ring fills one slot at a
    /// time (pieces of --io-chunk over up to --io-threads). Default: the planner's choice when
    /// this machine is calibrated, else 512KiB.
    #[arg(long, value_parser = parse_ring_chunk)]
    pub ring_chunk: Option<u64>,
    /// Bytes per piece of the output head when it streams, e.g. 2MiB: each piece is one read
    /// and one matrix dispatch, through two chunk slots of the head's own. Default: pieces as
    /// large as a layer slot, through the layer slots, where layers stream (else 512KiB).
    #[arg(long, value_parser = parse_head_chunk)]
    pub head_chunk: Option<u64>,
    /// Streamed layers read ahead of the one computing. Default: the planner's choice when this
    /// machine is calibrated, else 1.
    #[arg(long, value_parser = parse_prefetch)]
    pub prefetch: Option<usize>,
    /// Tokens per forward batch (prefill).
    #[arg(long, default_value = "64", value_parser = parse_ubatch)]
    pub ubatch: usize,
    /// KV cache element type: f16 (half the memory) or f32.
    #[arg(long, default_value = "f16", value_parser = ["f16", "f32"])]
    pub kv: String,
    /// Tokens per KV page (a power of two, 1 to 1024).
    #[arg(long, value_parser = parse_kv_page)]
    pub kv_page: Option<u32>,
    /// Recent KV pages kept on the device beyond those a batch writes.
    #[arg(long, default_value = "0", value_parser = parse_kv_window)]
    pub kv_window: u32,
    /// Attend only selected KV pages: quest:N (the N pages with the highest upper bound of
    /// their attention scores) or quest:P% (that share of the pages). quest-lag:N and
    /// quest-lag:P% rank the pages by the previous token's scores, so a layer's pages are read
    /// ahead instead of after its own scores. Default: every page.
    #[arg(long)]
    pub kv_select: Option<String>,
    /// Layers, counted from the first, that attend every page despite --kv-select.
    #[arg(long, default_value = "2", value_parser = parse_dense)]
    pub kv_select_dense_layers: u32,
    /// Directory of the KV page file (default: kv/ under the cache directory). The file is
    /// removed at exit.
    #[arg(long)]
    pub kv_dir: Option<PathBuf>,
}

impl ModelArgs {
    /// The I/O mode asked for, else direct.
    pub fn io_mode(&self) -> IoMode {
        self.io.unwrap_or(IoMode::Direct)
    }
}

#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value = "40", value_parser = parse_top_k)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Penalize tokens seen in the last --repeat-last-n tokens (1.0: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value = "64", value_parser = parse_last_n)]
    pub repeat_last_n: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl SampleArgs {
    pub fn params(&self) -> SamplerParams {
        SamplerParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: self.repeat_last_n,
            seed: self.seed,
        }
    }
    pub fn check(&self) -> CliResult<()> {
        if !self.temp.is_finite() || self.temp < 0.0 {
            return Err(format!("--temp must be a number >= 0, got {}", self.temp).into());
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("--top-p must be in (0, 1], got {}", self.top_p).into());
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(format!(
                "--repeat-penalty must be a number > 0, got {}",
                self.repeat_penalty
            )
            .into());
        }
        Ok(())
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value = "64", value_parser = parse_n)]
    pub n: usize,
    /// Keep generating past end-of-generation tokens, so exactly -n tokens are decoded
    /// (benchmarks).
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Write the run's figures and token ids as JSON.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Before the run, take the speed probe (a few resident decode steps of the calibrated
    /// model and two short direct reads: a few seconds) and print the prediction from the
    /// calibration carried to the machine's speed of that moment beside the saved one.
    #[arg(long)]
    pub probe: bool,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of reads, uploads and compute.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Time every kernel with GPU timestamp queries (host timing of whole submissions where
    /// the adapter has none) and print a table per kernel.
    #[arg(long)]
    pub profile: bool,
    /// Draft tokens from the context and verify them in one pass: lookup or
    /// lookup:ngram=N,max=K (output identical to plain decoding when greedy; the same
    /// distribution when sampling).
    #[arg(long)]
    pub draft: Option<crate::engine::draft::DraftConfig>,
    /// Session file: resume from it when the prompt shares a prefix with its tokens, and save
    /// the tokens and KV pages to it at the end.
    #[arg(long)]
    pub session: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value = "512", value_parser = parse_n)]
    pub n: usize,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Session file: the conversation's tokens and KV pages, loaded at start when present and
    /// saved after every reply.
    #[arg(long)]
    pub session: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub which: EvalKind,
}

#[derive(Subcommand, Debug)]
pub enum EvalKind {
    /// Perplexity over a text file (llama.cpp's method: non-overlapping chunks of --ctx
    /// tokens, the second half of each chunk scored).
    Ppl {
        #[command(flatten)]
        model: ModelArgs,
        /// The text file (UTF-8).
        #[arg(long)]
        file: PathBuf,
        /// Chunks to evaluate (default: all the text holds).
        #[arg(long, value_parser = parse_chunks)]
        chunks: Option<usize>,
        /// Write the result as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value = "8080", value_parser = parse_port)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/* and /metrics.
    #[arg(long, env = "FLASHLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Sequences generated at once: they share each forward pass (continuous batching: a
    /// request joins at the next pass), in one engine under one --gpu-budget.
    #[arg(long, default_value = "4", value_parser = parse_parallel)]
    pub parallel: usize,
    /// Draft tokens from each request's own context and verify them in its pass: lookup or
    /// lookup:ngram=N,max=K (greedy output unchanged; sampling keeps its distribution).
    #[arg(long)]
    pub draft: Option<crate::engine::draft::DraftConfig>,
    /// Requests that may wait for a free sequence; beyond them, 429 at once.
    #[arg(long, default_value = "16", value_parser = parse_queue)]
    pub queue: usize,
    /// Largest request body, e.g. 1MiB (413 beyond).
    #[arg(long, default_value = "1MiB", value_parser = parse_body_size)]
    pub max_body: u64,
    /// Most prompt tokens per request (default: what the context holds).
    #[arg(long, value_parser = parse_max_prompt)]
    pub max_prompt_tokens: Option<usize>,
    /// Most tokens a request may generate; also the default when it gives no max_tokens.
    #[arg(long, default_value = "1024", value_parser = parse_max_tokens)]
    pub max_tokens: usize,
    /// Seconds a request may take, queueing included.
    #[arg(long, default_value = "600", value_parser = parse_timeout)]
    pub timeout: u64,
    /// Open connections at once; more are closed at once.
    #[arg(long, default_value = "256", value_parser = parse_connections)]
    pub max_connections: usize,
}
