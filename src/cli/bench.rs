//! `bench`: dispatch to the benchmarks in [`crate::bench`].

use super::{BenchArgs, BenchKind, Cli, CliResult, engine_options, resolve_model};
use crate::gpu::GpuOptions;
use crate::model::load_model;

pub fn bench(cli: &Cli, b: &BenchArgs) -> CliResult<()> {
    super::check_output_dirs(&b.which.outputs())?;
    match &b.which {
        BenchKind::Stream {
            model,
            budgets,
            prompt_tokens,
            n,
            runs,
            json,
        } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let base = engine_options(cli, model, m.cfg.n_layers)?;
            let defaulted = budgets.is_empty();
            let budgets = if defaulted {
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
                io: model.io_mode(),
                upload: None,
            }];
            for (i, b) in budgets.iter().enumerate() {
                scenarios.push(crate::bench::Scenario {
                    name: if i == 0 && *b == 16 << 20 {
                        "S1".into()
                    } else if defaulted && i == 1 {
                        "half-model".into()
                    } else {
                        format!("budget {:.1} MiB", *b as f64 / 1048576.0)
                    },
                    budget: Some(*b),
                    io: model.io_mode(),
                    upload: None,
                });
            }
            // S1 both ways where the adapter can fill layer slots in place: the row above
            // takes the upload path the engine picks for it, this one the other.
            if budgets.first() == Some(&(16 << 20))
                && base.upload == crate::engine::UploadMode::Auto
                && let Some(other) = other_upload(&base)?
            {
                scenarios.insert(
                    2,
                    crate::bench::Scenario {
                        name: match other {
                            crate::engine::UploadMode::InPlace => "S1, in place".into(),
                            _ => "S1, staging".into(),
                        },
                        budget: Some(16 << 20),
                        io: model.io_mode(),
                        upload: Some(other),
                    },
                );
            }
            let report = crate::bench::stream(&m, &base, &scenarios, *prompt_tokens, *n, *runs)?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Resident { model, runs, json } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let report = crate::bench::resident(
                m.gguf.clone(),
                &engine_options(cli, model, m.cfg.n_layers)?,
                &m.tokenizer,
                (*runs).max(1),
            )?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Layouts {
            model,
            rounds,
            json,
        } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let opts = engine_options(cli, model, m.cfg.n_layers)?;
            let report = crate::bench::layouts::run(m.gguf.clone(), &opts, *rounds)?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Threads {
            model,
            threads,
            budget,
            n,
            rounds,
            json,
        } => {
            let report = crate::bench::threads::run(&crate::bench::threads::ThreadsOptions {
                model: resolve_model(model)?,
                threads: threads.clone(),
                budget: (*budget > 0).then_some(*budget),
                tokens: *n,
                rounds: *rounds,
                backend: cli.backend.clone(),
                adapter: cli.adapter.clone(),
            })?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
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
            save_json(json.as_deref(), &report)?;
            if let Some(p) = plot {
                std::fs::write(p, report.to_svg())
                    .map_err(|e| format!("writing {}: {e}", p.display()))?;
            }
            Ok(())
        }
        BenchKind::Types {
            model,
            types,
            runs,
            json,
        } => {
            let shape = match model {
                Some(p) => crate::bench::types::shape_of(
                    &load_model(&resolve_model(&Some(p.clone()))?)?.cfg,
                ),
                None => crate::bench::types::default_shape(crate::gguf::GgmlType::F16),
            };
            let list = if types.is_empty() {
                crate::bench::types::TYPES.to_vec()
            } else {
                types
                    .iter()
                    .map(|t| super::synth::parse_type(t))
                    .collect::<Result<Vec<_>, _>>()?
            };
            let base = crate::engine::EngineOptions {
                gpu: GpuOptions {
                    backend: cli.backend.clone(),
                    adapter: cli.adapter.clone(),
                    budget: None,
                    matmul_layout: None,
                },
                ..Default::default()
            };
            let report = crate::bench::types::run(&base, &shape, &list, *runs)?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Batch {
            model,
            n,
            runs,
            json,
        } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let base = engine_options(cli, model, m.cfg.n_layers)?;
            let mut opts = crate::bench::batch::BatchBenchOptions::s1(model.io_mode(), *n, *runs);
            if let Some(b) = model.gpu_budget {
                opts.budget = b;
            }
            let report = crate::bench::batch::run(&m, &base, &opts)?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)?;
            if !report.outputs_unchanged() {
                return Err("bench batch: outputs NOT EQUAL to decoding alone / plain decoding (see the table)".into());
            }
            Ok(())
        }
        BenchKind::Summary { dir, json } => {
            let s = crate::bench::summary::load(dir);
            println!("{}", s.to_markdown());
            save_json(json.as_deref(), &s)
        }
        BenchKind::S3 {
            model,
            runs,
            n,
            json,
        } => {
            let report = crate::bench::s3::run(model.clone(), *runs, *n)?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Ppl {
            model,
            text,
            prompt_tokens,
            chunks,
            json,
        } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let base = engine_options(cli, model, m.cfg.n_layers)?;
            let report = crate::bench::ppl::run(&crate::bench::ppl::PplOptions {
                model: &m,
                base,
                text: text.clone(),
                ctx: *prompt_tokens,
                chunks: *chunks,
            })?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
        BenchKind::Kv {
            model,
            text,
            prompt_tokens,
            n,
            runs,
            cache_share,
            page_sweep,
            page_sweep_tokens,
            cold_runs,
            json,
        } => {
            let path = resolve_model(&model.model)?;
            let m = load_model(&path)?;
            let base = engine_options(cli, model, m.cfg.n_layers)?;
            let report = crate::bench::kv::run(&crate::bench::kv::KvBenchOptions {
                model: &m,
                base,
                io: model.io_mode(),
                budget: model.gpu_budget.unwrap_or(crate::bench::kv::S2_BUDGET),
                text: text.clone(),
                prompt_tokens: *prompt_tokens,
                n_gen: *n,
                runs: *runs,
                cache_share: *cache_share,
                page_sweep: page_sweep.iter().flatten().copied().collect(),
                page_sweep_tokens: *page_sweep_tokens,
                cold_runs: *cold_runs,
            })?;
            println!("{}", report.to_markdown());
            save_json(json.as_deref(), &report)
        }
    }
}

/// Writes `v` as pretty JSON to `path` when one is given.
fn save_json(path: Option<&std::path::Path>, v: &impl serde::Serialize) -> CliResult<()> {
    if let Some(j) = path {
        std::fs::write(j, serde_json::to_string_pretty(v)?)
            .map_err(|e| format!("writing {}: {e}", j.display()))?;
    }
    Ok(())
}

/// The upload path the engine does not pick on the options' adapter, where both work: None
/// when layer slots cannot be mapped (staging only).
fn other_upload(
    base: &crate::engine::EngineOptions,
) -> CliResult<Option<crate::engine::UploadMode>> {
    use crate::engine::{Engine, UploadMode};
    let ctx = crate::gpu::GpuContext::new(&base.gpu)?;
    if !ctx.mappable {
        return Ok(None);
    }
    let auto_in_place = Engine::device_plan_options(base, &ctx)?.in_place;
    Ok(Some(if auto_in_place {
        UploadMode::Staging
    } else {
        UploadMode::InPlace
    }))
}
