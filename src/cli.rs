//! The command line: `run`, `chat`, `info`, `bench`, `--list-adapters`.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};

use crate::engine::{Engine, EngineOptions, GenStats, ResidentSpec};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, IoMode, ReaderOptions};
use crate::gguf::GgufFile;
use crate::gpu::GpuOptions;
use crate::model::chat::{ChatMessage, ChatTemplate};
use crate::model::config::ModelConfig;
use crate::model::tokenizer::Tokenizer;
use crate::paths;
use crate::sampling::{Sampler, SamplerParams};

type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

#[derive(Parser, Debug)]
#[command(
    name = "flashlm",
    version,
    about = "LLM inference with weights on flash, streamed to the GPU through wgpu"
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
    },
    /// Benchmarks.
    Bench(BenchArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: $FLASHLM_MODEL, else the cached SmolLM2-135M-Instruct).
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// KV cache length in tokens (default: the model's context, at most 2048, shrunk to fit
    /// the budget).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Cap on every device byte (weights, KV, activations, staging), e.g. 16MiB or 1.5GB.
    /// Default: what the adapter allows, so everything can be resident.
    #[arg(long, value_parser = parse_size_arg)]
    pub gpu_budget: Option<u64>,
    /// How weights are read from the file at run time: direct (bypasses the page cache, so
    /// bytes per token are true flash reads) or mmap.
    #[arg(long, default_value = "direct")]
    pub io: IoMode,
    /// Reader threads per read.
    #[arg(long, default_value_t = 4)]
    pub io_threads: usize,
    /// Bytes per read request, e.g. 1MiB.
    #[arg(long, default_value = "1MiB", value_parser = parse_size_arg)]
    pub io_chunk: u64,
    /// Host-side cache of weight bytes (kept in DRAM instead of re-read from flash), e.g. 64MiB.
    #[arg(long, default_value = "0", value_parser = parse_size_arg)]
    pub dram_budget: u64,
    /// What stays on the GPU: auto (from the budget), all, none, or a list such as 0-9,head.
    #[arg(long, default_value = "auto")]
    pub resident: String,
    /// Streamed layers read ahead of the one computing.
    #[arg(long, default_value_t = 1)]
    pub prefetch: usize,
    /// KV cache element type: f16 (half the memory) or f32.
    #[arg(long, default_value = "f16", value_parser = ["f16", "f32"])]
    pub kv: String,
}

fn parse_size_arg(s: &str) -> Result<u64, String> {
    crate::flash::parse_size(s)
}

#[derive(Args, Debug, Clone)]
pub struct SampleArgs {
    /// Temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the K most likely tokens (0: all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Penalize tokens seen in the last --repeat-last-n tokens (1.0: off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 64)]
    pub n: usize,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// Write the run's figures and token ids as JSON.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Write a Chrome trace (Perfetto, chrome://tracing) of reads, uploads and compute.
    #[arg(long)]
    pub trace: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// System prompt (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n: usize,
    #[command(flatten)]
    pub sample: SampleArgs,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchKind,
}

#[derive(Subcommand, Debug)]
pub enum BenchKind {
    /// Streaming under budgets (scenario S1: 16 MiB, direct I/O, cold cache; a half-model
    /// budget; all resident): ms/token, flash bytes/token, overlap, ring vs raw cold read.
    Stream {
        #[command(flatten)]
        model: ModelArgs,
        /// Budgets to run besides all-resident (default: 16MiB and one holding half the model).
        #[arg(long, value_delimiter = ',', value_parser = parse_size_arg)]
        budgets: Vec<u64>,
        /// Prompt tokens.
        #[arg(long, default_value_t = 64)]
        prompt_tokens: usize,
        /// Decoded tokens.
        #[arg(short = 'n', long, default_value_t = 128)]
        n: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Everything resident on the GPU: prefill and decode tok/s, matvec GB/s against a copy.
    Resident {
        #[command(flatten)]
        model: ModelArgs,
        /// Repetitions (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Flash read throughput from a cold page cache: raw read, direct and mmap over piece size
    /// × threads, and the staging ring into device buffers.
    Io {
        /// GGUF model file (default: $FLASHLM_MODEL, else the cached SmolLM2-135M-Instruct).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Bytes of tensor data to read per measurement (e.g. 64MiB, 16M, 1e8).
        #[arg(long, default_value = "64MiB", value_parser = crate::flash::parse_size)]
        bytes: u64,
        /// Repetitions of each cheap measurement (the median is reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
        /// Skip the staging-ring path (no GPU needed).
        #[arg(long)]
        no_gpu: bool,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write an SVG plot of GB/s against piece size.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
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
    fn check(&self) -> CliResult<()> {
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

/// The model file to use: the flag, else the default (with instructions when it is missing).
pub fn resolve_model(arg: &Option<PathBuf>) -> CliResult<PathBuf> {
    match arg {
        Some(p) => {
            if !p.is_file() {
                return Err(format!("model file {} does not exist", p.display()).into());
            }
            Ok(p.clone())
        }
        None => {
            let p = paths::default_model_path();
            if !p.is_file() {
                return Err(paths::how_to_get_model().into());
            }
            Ok(p)
        }
    }
}

/// A loaded model: file, config, tokenizer and template.
pub struct LoadedModel {
    pub gguf: Arc<GgufFile>,
    pub cfg: ModelConfig,
    pub tokenizer: Tokenizer,
    pub path: PathBuf,
}

pub fn load_model(path: &Path) -> CliResult<LoadedModel> {
    let gguf = GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cfg = ModelConfig::from_gguf(&gguf).map_err(|e| format!("{}: {e}", path.display()))?;
    let tokenizer = Tokenizer::from_gguf(&gguf).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(LoadedModel {
        gguf: Arc::new(gguf),
        cfg,
        tokenizer,
        path: path.to_path_buf(),
    })
}

fn engine_options(cli: &Cli, m: &ModelArgs, n_layers: usize) -> CliResult<EngineOptions> {
    Ok(EngineOptions {
        gpu: GpuOptions {
            backend: cli.backend.clone(),
            adapter: cli.adapter.clone(),
            budget: m.gpu_budget,
            matmul_layout: None,
        },
        ctx: m.ctx,
        prefetch: m.prefetch,
        kv_f16: m.kv == "f16",
        resident: ResidentSpec::parse(&m.resident, n_layers)?,
        ..Default::default()
    })
}

/// Open the model file for run-time reads and start the engine; prints the placement.
pub fn start_engine(
    cli: &Cli,
    m: &ModelArgs,
    model: &LoadedModel,
    trace: bool,
) -> CliResult<Engine> {
    let mut opts = engine_options(cli, m, model.cfg.n_layers)?;
    opts.trace = trace;
    let file = FlashFile::open(
        &model.path,
        ReaderOptions {
            mode: m.io,
            threads: m.io_threads.max(1),
            chunk: usize::try_from(m.io_chunk).map_err(|_| "--io-chunk is too large")?,
        },
    )?;
    let source = Box::new(FlashSource::new(file, m.dram_budget));
    let engine = Engine::with_source(model.gguf.clone(), source, &opts)?;
    eprintln!(
        "{} | context {} tokens | I/O {} | {}",
        engine.placement,
        engine.max_ctx(),
        m.io,
        engine.ctx.describe()
    );
    Ok(engine)
}

pub fn main_with(cli: Cli) -> CliResult<()> {
    if cli.list_adapters {
        let list = crate::gpu::list_adapters(&cli.backend)?;
        if list.is_empty() {
            println!("no adapters found");
        }
        for (i, a) in list.iter().enumerate() {
            println!(
                "{i}: {} ({:?}, {:?}, driver {} {})",
                a.name, a.backend, a.device_type, a.driver, a.driver_info
            );
        }
        return Ok(());
    }
    match &cli.command {
        None => Err("no command given; try `flashlm --help`".into()),
        Some(Command::Info { path }) => info(&resolve_model(path)?),
        Some(Command::Run(a)) => run(&cli, a),
        Some(Command::Chat(a)) => chat(&cli, a),
        Some(Command::Bench(b)) => match &b.which {
            BenchKind::Stream {
                model,
                budgets,
                prompt_tokens,
                n,
                json,
            } => {
                let path = resolve_model(&model.model)?;
                let m = load_model(&path)?;
                let base = engine_options(&cli, model, m.cfg.n_layers)?;
                let budgets = if budgets.is_empty() {
                    // Half the model: the streaming minimum plus half the weight bytes.
                    let weights: u64 = m
                        .gguf
                        .tensors
                        .iter()
                        .filter(|t| t.dims.len() == 2)
                        .map(|t| t.n_bytes)
                        .sum();
                    vec![16 << 20, (16 << 20) + weights / 2]
                } else {
                    budgets.clone()
                };
                let mut scenarios = vec![crate::bench::Scenario {
                    name: "all resident".into(),
                    budget: None,
                    io: model.io,
                }];
                for (i, b) in budgets.iter().enumerate() {
                    scenarios.push(crate::bench::Scenario {
                        name: if i == 0 && *b == 16 << 20 {
                            "S1".into()
                        } else {
                            format!("budget {:.1} MiB", *b as f64 / 1048576.0)
                        },
                        budget: Some(*b),
                        io: model.io,
                    });
                }
                let report = crate::bench::stream(&m, &base, &scenarios, *prompt_tokens, *n)?;
                println!("{}", report.to_markdown());
                if let Some(j) = json {
                    std::fs::write(j, serde_json::to_string_pretty(&report)?)?;
                }
                Ok(())
            }
            BenchKind::Resident { model, runs, json } => {
                let path = resolve_model(&model.model)?;
                let m = load_model(&path)?;
                let report = crate::bench::resident(
                    m.gguf.clone(),
                    &engine_options(&cli, model, m.cfg.n_layers)?,
                    &m.tokenizer,
                    (*runs).max(1),
                )?;
                println!("{}", report.to_markdown());
                if let Some(j) = json {
                    std::fs::write(j, serde_json::to_string_pretty(&report)?)?;
                }
                Ok(())
            }
            BenchKind::Io {
                model,
                bytes,
                repeats,
                no_gpu,
                json,
                plot,
            } => {
                let report = crate::bench::io::run(&crate::bench::io::IoBenchOptions {
                    model: resolve_model(model)?,
                    bytes: *bytes,
                    repeats: (*repeats).max(1),
                    gpu: (!*no_gpu).then(|| GpuOptions {
                        backend: cli.backend.clone(),
                        adapter: cli.adapter.clone(),
                        budget: None,
                        matmul_layout: None,
                    }),
                })?;
                println!("{}", report.to_markdown());
                if let Some(j) = json {
                    std::fs::write(j, serde_json::to_string_pretty(&report)?)
                        .map_err(|e| format!("writing {}: {e}", j.display()))?;
                }
                if let Some(p) = plot {
                    std::fs::write(p, report.to_svg())
                        .map_err(|e| format!("writing {}: {e}", p.display()))?;
                }
                Ok(())
            }
        },
    }
}

fn info(path: &Path) -> CliResult<()> {
    let m = load_model(path)?;
    let g = &m.gguf;
    println!(
        "file: {} ({} bytes, GGUF v{})",
        path.display(),
        g.file_len,
        g.version
    );
    if let Ok(Some(name)) = g.get_str("general.name") {
        println!("name: {name}");
    }
    println!("{}", m.cfg);
    let mut by_type: std::collections::BTreeMap<&str, (usize, u64)> = Default::default();
    for t in &g.tensors {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    println!("tensors: {}", g.tensors.len());
    for (ty, (n, bytes)) in by_type {
        println!(
            "  {ty:>5}: {n:4} tensors, {:10.2} MiB",
            bytes as f64 / 1048576.0
        );
    }
    let tk = &m.tokenizer;
    println!(
        "tokenizer: {:?} (pre-tokenizer {:?}), {} tokens, bos {:?} eos {:?}, add_bos {}, end-of-generation ids {:?}",
        tk.model(),
        tk.pre_tokenizer(),
        tk.n_vocab(),
        tk.bos_id(),
        tk.eos_id(),
        tk.add_bos(),
        tk.eog_ids()
    );
    let tpl = ChatTemplate::from_gguf(g).is_ok();
    println!(
        "chat template: {}",
        if g.get_str("tokenizer.chat_template")
            .ok()
            .flatten()
            .is_some()
        {
            "from the file"
        } else if tpl {
            "ChatML (default)"
        } else {
            "none"
        }
    );
    Ok(())
}

fn print_stats(engine: &Engine, stats: &GenStats) {
    eprintln!();
    eprintln!(
        "prefill: {} tokens, {:.1} tok/s | decode: {} tokens, {:.2} tok/s ({:.1} ms/token) | TTFT {:.0} ms",
        stats.prompt_tokens,
        stats.prefill_tok_s,
        stats.generated_tokens,
        stats.decode_tok_s,
        stats.ms_per_token,
        stats.ttft_ms
    );
    eprintln!(
        "flash bytes per token: {:.0} | upload {:.2} GB/s | GPU idle (waiting) {:.0}% | overlap efficiency {:.2}",
        stats.flash_bytes_per_token,
        stats.upload_gb_s,
        stats.io_wait_share * 100.0,
        stats.overlap_efficiency
    );
    eprintln!(
        "peak device memory: {:.2} MiB of {} | adapter: {} | backend: {}",
        stats.peak_device_bytes as f64 / 1048576.0,
        if engine.placement.budget == u64::MAX {
            "no budget".to_string()
        } else {
            format!("{:.2} MiB", engine.placement.budget as f64 / 1048576.0)
        },
        engine.ctx.info.name,
        engine.ctx.backend_name()
    );
}

fn run(cli: &Cli, a: &RunArgs) -> CliResult<()> {
    a.sample.check()?;
    // Syntax of --resident before any loading (layer numbers are checked against the model).
    ResidentSpec::parse(&a.model.resident, usize::MAX)?;
    let path = resolve_model(&a.model.model)?;
    let m = load_model(&path)?;
    let prompt_ids = m.tokenizer.encode(&a.prompt, false);
    if prompt_ids.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    let mut engine = start_engine(cli, &a.model, &m, a.trace.is_some())?;
    let mut sampler = Sampler::new(a.sample.params());
    let tk = &m.tokenizer;
    let mut dec = tk.stream_decoder(true);
    let stdout = std::io::stdout();
    let (generated, stats) = engine.generate(
        &prompt_ids,
        a.n,
        &mut sampler,
        |id| tk.is_end_of_generation(id),
        |id| {
            if let Ok(s) = dec.push(id) {
                let mut out = stdout.lock();
                let _ = out.write_all(s.as_bytes());
                let _ = out.flush();
            }
            true
        },
    )?;
    print!("{}", dec.finish());
    println!();
    print_stats(&engine, &stats);
    if let Some(p) = &a.trace {
        engine.write_trace(p)?;
        eprintln!("trace written to {}", p.display());
    }
    if let Some(p) = &a.stats_json {
        let j = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "prefill_tok_s": stats.prefill_tok_s,
            "decode_tok_s": stats.decode_tok_s,
            "ttft_ms": stats.ttft_ms,
            "flash_bytes_per_token": stats.flash_bytes_per_token,
            "peak_device_bytes": stats.peak_device_bytes,
            "gpu_budget": engine.placement.budget,
            "ms_per_token": stats.ms_per_token,
            "upload_bytes_per_token": stats.upload_bytes_per_token,
            "upload_gb_s": stats.upload_gb_s,
            "flash_to_gpu_gb_s": stats.flash_to_gpu_gb_s,
            "io_wait_share": stats.io_wait_share,
            "overlap_efficiency": stats.overlap_efficiency,
            "io_s": stats.io_s,
            "read_s": stats.read_s,
            "compute_s": stats.compute_s,
            "placement": engine.placement.to_string(),
            "io": a.model.io.to_string(),
            "backend": engine.ctx.backend_name(),
            "adapter": engine.ctx.info.name,
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "load_bytes": engine.load_bytes,
            "model": m.path.display().to_string(),
        });
        std::fs::write(p, serde_json::to_string_pretty(&j)?)
            .map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

fn chat(cli: &Cli, a: &ChatArgs) -> CliResult<()> {
    a.sample.check()?;
    ResidentSpec::parse(&a.model.resident, usize::MAX)?;
    let path = resolve_model(&a.model.model)?;
    let m = load_model(&path)?;
    let template = ChatTemplate::from_gguf(&m.gguf)?;
    let mut engine = start_engine(cli, &a.model, &m, false)?;
    let mut sampler = Sampler::new(a.sample.params());
    let tk = &m.tokenizer;
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(ChatMessage::new("system", s));
    }
    // Token ids currently in the engine's KV cache.
    let mut cached: Vec<u32> = Vec::new();
    eprintln!(
        "flashlm chat: {} on {} — type a message, Ctrl-D to quit.",
        m.path
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or("model"),
        engine.ctx.describe()
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let text = line.trim_end_matches(['\n', '\r']);
        if text.trim().is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", text));
        let rendered = template.render(&messages, true)?;
        let mut ids = tk.encode(&rendered, true);
        if ids.len() + a.n > engine.max_ctx() {
            eprintln!(
                "[the conversation ({} tokens) no longer fits the context of {}: starting over]",
                ids.len(),
                engine.max_ctx()
            );
            messages.retain(|m| m.role == "system");
            messages.push(ChatMessage::new("user", text));
            let rendered = template.render(&messages, true)?;
            ids = tk.encode(&rendered, true);
            engine.reset();
            cached.clear();
        }
        // Reuse the cached prefix; feed only what is new.
        let common = cached.iter().zip(&ids).take_while(|(a, b)| a == b).count();
        let common = common.min(ids.len().saturating_sub(1));
        engine.truncate(common);
        cached.truncate(common);
        let new = &ids[common..];
        let mut dec = tk.stream_decoder(true);
        let stdout = std::io::stdout();
        let max_new = a.n.min(engine.max_ctx().saturating_sub(ids.len()));
        let (reply, stats) = engine.generate(
            new,
            max_new,
            &mut sampler,
            |id| tk.is_end_of_generation(id),
            |id| {
                if !tk.is_end_of_generation(id)
                    && let Ok(s) = dec.push(id)
                {
                    let mut out = stdout.lock();
                    let _ = out.write_all(s.as_bytes());
                    let _ = out.flush();
                }
                true
            },
        )?;
        print!("{}", dec.finish());
        println!();
        cached.extend_from_slice(new);
        // The last sampled token was not fed to the engine.
        cached.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        let text_reply = tk.decode(
            &reply
                .iter()
                .copied()
                .filter(|&id| !tk.is_end_of_generation(id))
                .collect::<Vec<_>>(),
            true,
        )?;
        messages.push(ChatMessage::new("assistant", &text_reply));
        log::info!(
            "{} tokens at {:.1} tok/s (TTFT {:.0} ms)",
            stats.generated_tokens,
            stats.decode_tok_s,
            stats.ttft_ms
        );
    }
}
