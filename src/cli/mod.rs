//! The command line: `run`, `chat`, `serve`, `info`, `session-info`, `eval`, `bench`, `synth`,
//! `--list-adapters`.
//!
//! A token's path starts here: [`run`] loads the model, starts the engine with the options
//! [`engine_options`] builds from the flags, and streams the completion.

mod args;
mod bench;
mod bench_args;
mod eval;
mod plan;
mod progress;
mod run;
mod serve;
mod synth;

use std::path::{Path, PathBuf};

pub use args::*;
pub use bench_args::{BenchArgs, BenchKind};
pub use synth::SynthArgs;

use crate::engine::{Engine, EngineOptions, ResidentSpec};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, ReaderOptions};
use crate::gpu::{GpuContext, GpuOptions};
use crate::model::chat::ChatTemplate;
use crate::model::{LoadedModel, load_model};
use crate::paths;
use crate::plan::KvSelect;
use crate::plan::history::History;
use crate::plan::perf::Calibration;

pub(crate) type CliResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Files a command writes at its end (`--session`, `--trace`, `--json`...) must have a
/// directory to go to: said before the work, not after it.
pub(crate) fn check_output_dirs(outputs: &[(&str, &Option<std::path::PathBuf>)]) -> CliResult<()> {
    for (flag, path) in outputs {
        let Some(p) = path else { continue };
        let dir = match p.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            return Err(format!(
                "{flag} {}: the directory {} does not exist",
                p.display(),
                dir.display()
            )
            .into());
        }
    }
    Ok(())
}

/// The model file to use: the flag, else the default (with instructions when it is missing).
pub fn resolve_model(arg: &Option<PathBuf>) -> CliResult<PathBuf> {
    match arg {
        Some(p) => {
            if p.is_dir() {
                return Err(format!("{} is a directory, not a model file", p.display()).into());
            }
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

/// Engine options from the model flags.
pub fn engine_options(cli: &Cli, m: &ModelArgs, n_layers: usize) -> CliResult<EngineOptions> {
    let kv_select = match &m.kv_select {
        Some(s) => Some(KvSelect::parse(s, m.kv_select_dense_layers)?),
        None => None,
    };
    Ok(EngineOptions {
        gpu: GpuOptions {
            backend: cli.backend.clone(),
            adapter: cli.adapter.clone(),
            budget: m.gpu_budget,
            matmul_layout: None,
        },
        ctx: m.ctx,
        ubatch: m.ubatch,
        prefetch: m.prefetch.unwrap_or(1),
        kv_f16: m.kv == "f16",
        kv_page: m.kv_page,
        kv_window: m.kv_window,
        kv_select,
        kv_dir: m.kv_dir.clone(),
        upload: m.upload,
        ring_chunk: m
            .ring_chunk
            .unwrap_or(crate::plan::PlanOptions::default().ring_chunk),
        head_chunk: m.head_chunk,
        resident: ResidentSpec::parse(&m.resident, n_layers)?,
        ..Default::default()
    })
}

/// Say so when `--ctx` asks for more than the model's context length (the plan caps it there).
pub fn note_ctx_cap(m: &ModelArgs, model: &LoadedModel) {
    let max = model.cfg.context_length;
    if let Some(c) = m.ctx
        && c > max
    {
        eprintln!("note: --ctx {c} is past the model's context length; the context is {max}");
    }
}

/// Check the flags that need no model before loading anything.
pub fn precheck(m: &ModelArgs) -> CliResult<()> {
    // Syntax of --resident (layer numbers are checked against the model later, and can never
    // pass the most layers any model may have).
    ResidentSpec::parse(&m.resident, crate::model::config::MAX_LAYERS as usize)?;
    if let Some(s) = &m.kv_select {
        KvSelect::parse(s, m.kv_select_dense_layers)?;
    }
    if let Some(p) = m.kv_page
        && !p.is_power_of_two()
    {
        return Err(format!("--kv-page must be a power of two, got {p}").into());
    }
    Ok(())
}

/// The calibration profile of this machine, if `flashlm calibrate` was run.
pub fn calibration() -> Option<Calibration> {
    Calibration::load(&Calibration::path()).ok()
}

/// Open the model file for run-time reads and start the engine; prints the placement. Unless
/// the flags fix them, the planner picks the placement, prefetch depth, staging-ring size and
/// I/O mode when this machine is calibrated (`n_past` is the context to plan for), on the
/// device the engine then runs on; otherwise the fixed rules apply, and it says so once.
pub fn start_engine(
    cli: &Cli,
    m: &ModelArgs,
    model: &LoadedModel,
    mut opts: EngineOptions,
    n_past: usize,
) -> CliResult<Engine> {
    note_ctx_cap(m, model);
    let ctx = std::sync::Arc::new(GpuContext::new(&opts.gpu)?);
    let mut mode = m.io_mode();
    let po = Engine::device_plan_options(&opts, &ctx)?;
    if plan::open_knobs(m, &po) {
        match calibration() {
            Some(cal) => {
                if let Some(c) = plan::choose_for(m, model, &po, ctx.max_binding(), &cal, n_past) {
                    eprintln!("{}", plan::planner_line(&c, m, &po));
                    opts.prefetch = c.prefetch;
                    opts.ring_chunk = c.ring_chunk;
                    opts.resident = c.resident.clone();
                    mode = c.io;
                }
            }
            None => plan::say_uncalibrated(),
        }
    }
    let file = FlashFile::open(
        &model.path,
        ReaderOptions {
            mode,
            threads: m.io_threads.max(1),
            chunk: usize::try_from(m.io_chunk).map_err(|_| "--io-chunk is too large")?,
        },
    )?;
    let source = std::sync::Arc::new(FlashSource::new(file, m.dram_budget));
    let engine = Engine::with_context(model.gguf.clone(), source, &opts, ctx)?;
    let _ = cli;
    let kv = &engine.plan.kv;
    eprintln!(
        "{} | context {} tokens | KV: {}-token pages, {} of {} per layer on the device{} | I/O {} | {}",
        engine.placement,
        engine.max_ctx(),
        kv.page_tokens,
        kv.home_pages,
        kv.max_pages,
        if kv.streams {
            ", the rest on flash"
        } else {
            ""
        },
        mode,
        engine.ctx.describe()
    );
    Ok(engine)
}

/// `template` rendering in a child process with memory and time limits (a template comes from
/// the model file: see model::chat::sandbox); in this process, with a warning, when this
/// program cannot be found.
fn sandboxed(template: ChatTemplate) -> ChatTemplate {
    match crate::model::chat::Sandbox::current_exe() {
        Ok(sandbox) => template.with_sandbox(sandbox),
        Err(e) => {
            log::warn!("{e}; chat templates render in this process");
            template
        }
    }
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
        Some(Command::Info { path, model }) => {
            info(&resolve_model(&path.clone().or_else(|| model.clone()))?)
        }
        Some(Command::Calibrate { model, fresh }) => {
            let path = resolve_model(model)?;
            let m = load_model(&path)?;
            let gpu = GpuOptions {
                backend: cli.backend.clone(),
                adapter: cli.adapter.clone(),
                budget: None,
                matmul_layout: None,
            };
            let measured = crate::bench::calibrate::run(&m, &gpu)?;
            let hp = History::path();
            let mut history = if *fresh {
                History::default()
            } else {
                History::load(&hp).unwrap_or_else(|e| {
                    eprintln!("warning: {e}; the calibration history starts again");
                    History::default()
                })
            };
            history.push(measured.clone());
            history.save(&hp)?;
            let saved = history
                .median()
                .cloned()
                .unwrap_or_else(|| measured.clone());
            let p = Calibration::path();
            saved.calibration.save(&p)?;
            println!("{}", measured.calibration.to_markdown());
            println!("{}", history.describe(&saved));
            if saved.at != measured.at {
                println!("\n{}", saved.calibration.to_markdown());
            }
            eprintln!("saved to {} (history: {})", p.display(), hp.display());
            Ok(())
        }
        Some(Command::Plan {
            model,
            prompt_tokens,
            n,
            max_binding,
        }) => plan::plan_cmd(&cli, model, *prompt_tokens, *n, *max_binding),
        Some(Command::SessionInfo { file, model }) => {
            let s = crate::kv::session::Session::open(file)?;
            println!("{}", s.info());
            if let Some(p) = model {
                let m = load_model(&resolve_model(&Some(p.clone()))?)?;
                let id = s.identity();
                let hash = crate::kv::session::model_hash(&m.gguf)?;
                if hash != id.model_hash {
                    return Err(format!(
                        "{} is not the model this session was saved from (its header hash differs)",
                        p.display()
                    )
                    .into());
                }
                if m.cfg.summary() != id.config {
                    return Err(format!(
                        "{} has another config than the one this session was saved with",
                        p.display()
                    )
                    .into());
                }
                println!("matches model {} (header hash and config)", p.display());
            }
            Ok(())
        }
        Some(Command::Run(a)) => run::run(&cli, a),
        Some(Command::Chat(a)) => run::chat(&cli, a),
        Some(Command::Eval(e)) => eval::eval(&cli, e),
        Some(Command::Bench(b)) => bench::bench(&cli, b),
        Some(Command::Synth(a)) => synth::synth(a),
        Some(Command::Serve(a)) => serve::serve(&cli, a),
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
