//! `run` and `chat`: prompt in, streamed completion out, figures on stderr; sessions that save
//! and resume the KV cache.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use super::progress::{Progress, Unit};
use super::{
    ChatArgs, Cli, CliResult, RunArgs, engine_options, precheck, resolve_model, start_engine,
};
use crate::engine::{Engine, GenStats};
use crate::kv::session::Session;
use crate::model::chat::{ChatMessage, ChatTemplate};
use crate::model::load_model;
use crate::sampling::Sampler;

fn print_stats(engine: &Engine, stats: &GenStats) {
    eprintln!();
    if stats.generated_tokens <= 1 {
        // No decode step ran (-n 0 or 1, a full context, or an end token at once): no
        // per-token figures to give.
        let tokens = if stats.generated_tokens == 0 {
            "no tokens generated".to_string()
        } else {
            format!(
                "1 token (from the prefill), no decode steps | TTFT {:.0} ms",
                stats.ttft_ms
            )
        };
        eprintln!(
            "prefill: {} tokens, {:.1} tok/s | decode: {tokens}",
            stats.prompt_tokens, stats.prefill_tok_s
        );
    } else {
        print_decode_stats(engine, stats);
    }
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

/// The per-token figures of a run that decoded.
fn print_decode_stats(engine: &Engine, stats: &GenStats) {
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
    if engine.plan.kv.streams {
        let p = engine.kv_prediction(stats);
        eprintln!(
            "KV: {:.1} pages/token, {:.0} bytes/token from flash (predicted {:.0}) | host-cache hit rate {:.3} (predicted {:.3}) | written {:.0} bytes/token, {} pages{}",
            stats.kv_pages_per_token,
            stats.kv_flash_bytes_per_token,
            p.flash_bytes_per_token,
            stats.kv_hit_rate,
            p.hit_rate,
            stats.kv_bytes_written_per_token,
            stats.kv_pages_written,
            if engine.plan.kv.select.is_some() {
                format!(
                    " | selection reuse {:.2}, prefetch hit rate {:.2}",
                    stats.selection_reuse, stats.prefetch_hit_rate
                )
            } else {
                String::new()
            }
        );
    }
}

/// A progress line on stderr for prompts whose prefill takes more than a second.
fn show_prefill_progress(engine: &mut Engine) {
    let mut progress: Option<Progress> = None;
    engine.set_prefill_progress(Some(Box::new(move |done, total| {
        // A new prompt starts a new line (and its own clock).
        let p = progress
            .get_or_insert_with(|| Progress::new(Unit::Tokens).quiet_for(Duration::from_secs(1)));
        p.update(done as u64, total as u64);
        if done >= total {
            progress = None;
        }
    })));
}

/// Open `path` as a session for this engine if it exists; a session of another model or
/// configuration is an error naming what differs.
fn open_session(engine: &Engine, path: &Path) -> CliResult<Option<Session>> {
    if !path.exists() {
        return Ok(None);
    }
    let s = Session::open(path).map_err(|e| format!("session {}: {e}", path.display()))?;
    let id = engine.session_identity().map_err(|e| e.to_string())?;
    s.check_identity(&id)
        .map_err(|e| format!("session {}: {e}", path.display()))?;
    Ok(Some(s))
}

/// A prediction as `--stats-json` writes it.
fn prediction_json(p: &crate::plan::perf::Prediction, ttft_ms: f64) -> serde_json::Value {
    serde_json::json!({
        "ms_per_token": p.ms_per_token,
        "compute_ms": p.compute_ms,
        "weight_io_ms": p.weight_io_ms,
        "kv_io_ms": p.kv_io_ms,
        "ttft_ms": ttft_ms,
    })
}

/// The calibration carried to the speed probe of this moment; None (saying why) when the
/// machine is not calibrated or its calibration has no probe.
fn probed_calibration(
    gpu: &crate::gpu::GpuOptions,
) -> CliResult<Option<crate::plan::perf::Calibration>> {
    let Some(cal) = super::calibration() else {
        eprintln!("--probe: this machine is not calibrated (`flashlm calibrate`); no probe taken");
        return Ok(None);
    };
    let Some(mut p) = crate::bench::probe::Prober::for_calibration(Some(&cal), gpu) else {
        if cal.probe.is_none() {
            eprintln!("--probe: the calibration predates the probe; run `flashlm calibrate` again");
        }
        return Ok(None);
    };
    let (c, line) = crate::bench::probe::probed(&cal, &mut p)?;
    eprintln!("{line}");
    Ok(Some(c))
}

pub fn run(cli: &Cli, a: &RunArgs) -> CliResult<()> {
    a.sample.check()?;
    super::check_output_dirs(&[
        ("--session", &a.session),
        ("--trace", &a.trace),
        ("--stats-json", &a.stats_json),
    ])?;
    precheck(&a.model)?;
    let path = resolve_model(&a.model.model)?;
    let m = load_model(&path)?;
    let prompt_ids = m.tokenizer.encode(&a.prompt, false);
    if prompt_ids.is_empty() {
        return Err("the prompt is empty after tokenization".into());
    }
    let mut opts = engine_options(cli, &a.model, m.cfg.n_layers)?;
    opts.trace = a.trace.is_some();
    opts.profile = a.profile;
    if let Some(d) = &a.draft {
        if a.model.kv_select.is_some() {
            return Err("--draft and --kv-select cannot be combined".into());
        }
        opts.logit_rows = d.max + 1;
    }
    // The probe runs before the engine is built, and its engine is gone before this one
    // starts: it neither competes with the run nor counts in its memory.
    let probed = match a.probe {
        true => probed_calibration(&opts.gpu)?,
        false => None,
    };
    let mut engine = start_engine(cli, &a.model, &m, opts, prompt_ids.len() + a.n / 2)?;
    show_prefill_progress(&mut engine);
    let t0 = Instant::now();
    let mut reused = 0;
    if let Some(sp) = &a.session
        && let Some(s) = open_session(&engine, sp)?
    {
        reused = engine.resume(&s, &prompt_ids)?;
        eprintln!(
            "session {}: {reused} of {} prompt tokens loaded in {:.0} ms",
            sp.display(),
            prompt_ids.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut sampler = Sampler::new(a.sample.params());
    let tk = &m.tokenizer;
    let mut dec = tk.stream_decoder(true);
    let stdout = std::io::stdout();
    let emit = |id: u32| {
        if let Ok(s) = dec.push(id) {
            let mut out = stdout.lock();
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        }
        true
    };
    let is_end = |id| !a.ignore_eos && tk.is_end_of_generation(id);
    let (generated, stats, drafting) = match &a.draft {
        Some(d) => {
            let (g, s, ds) = engine.generate_drafted(
                &prompt_ids[reused..],
                a.n,
                &mut sampler,
                d,
                is_end,
                emit,
            )?;
            (g, s, Some(ds))
        }
        None => {
            let (g, s) = engine.generate(&prompt_ids[reused..], a.n, &mut sampler, is_end, emit)?;
            (g, s, None)
        }
    };
    print!("{}", dec.finish());
    println!();
    print_stats(&engine, &stats);
    if let Some(d) = &drafting {
        eprintln!(
            "drafts: {} passes verified {} drafted tokens, {} accepted; {:.2} tokens per pass",
            d.passes, d.drafted, d.accepted, d.tokens_per_pass
        );
    }
    let profile = a.profile.then(|| engine.profile_report());
    if let Some(p) = &profile {
        eprint!("{}", p.to_table());
        eprintln!(
            "kernels {:.1} ms of {:.1} ms of GPU work, {:.1} ms of wall time (prefill and decode)",
            p.total_ms,
            engine.tracer.compute_s * 1e3,
            (stats.prefill_s + stats.decode_s) * 1e3
        );
    }
    let ttft_ms = stats.ttft_ms + load_ms;
    let predicted = super::calibration().map(|cal| {
        let (p, ttft) = engine.predict(&cal, reused, prompt_ids.len() - reused, stats.selection_reuse);
        let measured = if stats.generated_tokens == 0 {
            "nothing generated".to_string()
        } else if stats.generated_tokens == 1 {
            format!("no decode steps, TTFT {:.0} ms", stats.ttft_ms)
        } else {
            format!(
                "{:.1} ms/token, TTFT {:.0} ms",
                stats.ms_per_token, stats.ttft_ms
            )
        };
        eprintln!(
            "predicted: {:.1} ms/token (compute {:.1}, weight I/O {:.1}, KV I/O {:.1}), TTFT {:.0} ms | measured: {measured}",
            p.ms_per_token, p.compute_ms, p.weight_io_ms, p.kv_io_ms, ttft,
        );
        prediction_json(&p, ttft)
    });
    let probed = probed.map(|cal| {
        let (p, ttft) = engine.predict(&cal, reused, prompt_ids.len() - reused, stats.selection_reuse);
        eprintln!(
            "probed prediction: {:.1} ms/token (compute {:.1}, weight I/O {:.1}, KV I/O {:.1}), TTFT {:.0} ms",
            p.ms_per_token, p.compute_ms, p.weight_io_ms, p.kv_io_ms, ttft
        );
        let mut j = prediction_json(&p, ttft);
        j["probe"] = serde_json::json!(cal.probe);
        j
    });
    if reused > 0 {
        eprintln!("TTFT with the session: {ttft_ms:.0} ms (session load included)");
    }
    if let Some(sp) = &a.session {
        let t = Instant::now();
        let st = engine.save_session(sp)?;
        eprintln!(
            "session saved to {}: {} tokens, {} bytes in {:.0} ms",
            sp.display(),
            engine.n_past(),
            st.bytes,
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    if let Some(p) = &a.trace {
        engine.write_trace(p)?;
        eprintln!("trace written to {}", p.display());
    }
    if let Some(p) = &a.stats_json {
        let pred = engine.kv_prediction(&stats);
        let j = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": generated,
            "session_tokens_reused": reused,
            "ttft_ms": ttft_ms,
            "stats": stats,
            "kv_predicted": pred,
            "profile": profile,
            "drafting": drafting,
            "predicted": predicted,
            "probed": probed,
            "gpu_budget": engine.placement.budget,
            "placement": engine.placement.to_string(),
            "kv_page_tokens": engine.plan.kv.page_tokens,
            "kv_home_pages": engine.plan.kv.home_pages,
            "kv_streams": engine.plan.kv.streams,
            "context": engine.max_ctx(),
            "io": engine.run_io().mode,
            "backend": engine.ctx.backend_name(),
            "adapter": engine.ctx.info.name,
            "load_bytes": engine.load_bytes,
            "model": m.path.display().to_string(),
            // Flat copies of the headline figures.
            "prefill_tok_s": stats.prefill_tok_s,
            "decode_tok_s": stats.decode_tok_s,
            "ms_per_token": stats.ms_per_token,
            "flash_bytes_per_token": stats.flash_bytes_per_token,
            "peak_device_bytes": stats.peak_device_bytes,
            "peak_rss_bytes": crate::flash::peak_rss_bytes(),
            "dram_budget": a.model.dram_budget,
            "overlap_efficiency": stats.overlap_efficiency,
            "upload_gb_s": stats.upload_gb_s,
            "flash_to_gpu_gb_s": stats.flash_to_gpu_gb_s,
            "upload_bytes_per_token": stats.upload_bytes_per_token,
            "io_wait_share": stats.io_wait_share,
            "io_s": stats.io_s,
            "read_s": stats.read_s,
            "compute_s": stats.compute_s,
            "prompt_tokens": stats.prompt_tokens,
            "generated_tokens": stats.generated_tokens,
            "kv_bytes_written_per_token": stats.kv_bytes_written_per_token,
            "kv_flash_bytes_per_token": stats.kv_flash_bytes_per_token,
            "kv_hit_rate": stats.kv_hit_rate,
        });
        std::fs::write(p, serde_json::to_string_pretty(&j)?)
            .map_err(|e| format!("writing {}: {e}", p.display()))?;
    }
    Ok(())
}

/// The chat's messages, kept beside its session file.
fn messages_path(session: &Path) -> std::path::PathBuf {
    let mut s = session.as_os_str().to_owned();
    s.push(".chat.json");
    s.into()
}

fn save_chat(engine: &mut Engine, session: &Path, messages: &[ChatMessage]) -> CliResult<()> {
    engine.save_session(session)?;
    let mp = messages_path(session);
    let tmp = mp.with_extension("json.tmp");
    let j: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.content}))
        .collect();
    std::fs::write(&tmp, serde_json::to_string(&j)?)?;
    std::fs::rename(&tmp, &mp)?;
    Ok(())
}

fn load_messages(session: &Path) -> Vec<ChatMessage> {
    let Ok(text) = std::fs::read_to_string(messages_path(session)) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_str::<Vec<serde_json::Value>>(&text) else {
        return Vec::new();
    };
    v.iter()
        .filter_map(|m| {
            Some(ChatMessage::new(
                m.get("role")?.as_str()?,
                m.get("content")?.as_str()?,
            ))
        })
        .collect()
}

pub fn chat(cli: &Cli, a: &ChatArgs) -> CliResult<()> {
    a.sample.check()?;
    super::check_output_dirs(&[("--session", &a.session)])?;
    precheck(&a.model)?;
    let path = resolve_model(&a.model.model)?;
    let m = load_model(&path)?;
    let template = super::sandboxed(ChatTemplate::from_gguf(&m.gguf)?);
    let opts = engine_options(cli, &a.model, m.cfg.n_layers)?;
    let mut engine = start_engine(cli, &a.model, &m, opts, 256)?;
    show_prefill_progress(&mut engine);
    let mut sampler = Sampler::new(a.sample.params());
    let tk = &m.tokenizer;
    let mut messages: Vec<ChatMessage> = Vec::new();
    if let Some(sp) = &a.session
        && let Some(s) = open_session(&engine, sp)?
    {
        messages = load_messages(sp);
        if !messages.is_empty() {
            let ids = s.tokens().to_vec();
            let mut with_next = ids.clone();
            // Load every saved token (the next turn's first token is new).
            with_next.push(u32::MAX);
            let n = engine.resume(&s, &with_next)?;
            eprintln!(
                "[session {}: {} messages, {n} tokens restored]",
                sp.display(),
                messages.len()
            );
        }
    }
    if messages.is_empty()
        && let Some(s) = &a.system
    {
        messages.push(ChatMessage::new("system", s));
    }
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
        }
        // Reuse the cached prefix; feed only what is new.
        let common = engine
            .cached_tokens()
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count()
            .min(ids.len().saturating_sub(1));
        engine.truncate(common);
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
        let text_reply = tk.decode(
            &reply
                .iter()
                .copied()
                .filter(|&id| !tk.is_end_of_generation(id))
                .collect::<Vec<_>>(),
            true,
        )?;
        messages.push(ChatMessage::new("assistant", &text_reply));
        if let Some(sp) = &a.session {
            save_chat(&mut engine, sp, &messages)?;
        }
        log::info!(
            "{} tokens at {:.1} tok/s (TTFT {:.0} ms)",
            stats.generated_tokens,
            stats.decode_tok_s,
            stats.ttft_ms
        );
    }
}
