//! The planner on the command line: which knobs the flags leave open, the choice for a run,
//! and `flashlm plan`.

use std::sync::atomic::{AtomicBool, Ordering};

use super::{
    Cli, CliResult, ModelArgs, calibration, engine_options, note_ctx_cap, precheck, resolve_model,
};
use crate::engine::UploadMode;
use crate::flash::IoMode;
use crate::model::{LoadedModel, load_model};
use crate::plan::choose::{Choice, RING_CHUNKS, Space, choose};
use crate::plan::perf::{Calibration, RunIo, predict_prefill, predict_token, token_work};
use crate::plan::{ExecPlan, PlanOptions, ResidentSpec};

/// The device binding limit plans assume when no device is open.
pub const PLAN_MAX_BINDING: u64 = 128 << 20;

/// The knobs the flags leave open, each with the values the planner tries; a knob a flag
/// fixes has the flag's value (`--resident` other than auto, `--prefetch`, `--io`,
/// `--ring-chunk`).
pub fn space(m: &ModelArgs, po: &PlanOptions) -> Space {
    Space {
        prefetches: m.prefetch.map_or_else(|| vec![1, 2, 3], |p| vec![p]),
        modes: m
            .io
            .map_or_else(|| vec![IoMode::Direct, IoMode::Mmap], |io| vec![io]),
        ring_chunks: m
            .ring_chunk
            .map_or_else(|| RING_CHUNKS.to_vec(), |c| vec![c]),
        placements: po.resident == ResidentSpec::Auto,
    }
}

/// Whether any knob is left to the planner.
pub fn open_knobs(m: &ModelArgs, po: &PlanOptions) -> bool {
    let s = space(m, po);
    s.placements || s.prefetches.len() > 1 || s.modes.len() > 1 || s.ring_chunks.len() > 1
}

/// The flags that fixed a knob, for the planner's line.
fn fixed_flags(m: &ModelArgs, po: &PlanOptions) -> String {
    let mut v = Vec::new();
    if po.resident != ResidentSpec::Auto {
        v.push("--resident");
    }
    if m.prefetch.is_some() {
        v.push("--prefetch");
    }
    if m.io.is_some() {
        v.push("--io");
    }
    if m.ring_chunk.is_some() {
        v.push("--ring-chunk");
    }
    if v.is_empty() {
        String::new()
    } else {
        format!("; fixed by {}", v.join(", "))
    }
}

/// The planner's line: everything chosen, and which flags fixed a knob.
pub fn planner_line(c: &Choice, m: &ModelArgs, po: &PlanOptions) -> String {
    format!("planner: {}{}", c.describe(), fixed_flags(m, po))
}

/// How a run of `m` reads (`in_place`: streamed weights go straight into their slots).
pub fn run_io(m: &ModelArgs, mode: IoMode, in_place: bool) -> RunIo {
    RunIo {
        mode: mode.to_string(),
        piece: m.io_chunk,
        threads: m.io_threads,
        dram: m.dram_budget,
        in_place,
    }
}

/// The planner's choice for `m` under `po` (the plan options the engine will plan with) at a
/// context of `n_past` tokens, on a device of `max_binding` bytes per binding. None when no
/// knob is open or nothing plans.
pub fn choose_for(
    m: &ModelArgs,
    model: &LoadedModel,
    po: &PlanOptions,
    max_binding: u64,
    cal: &Calibration,
    n_past: usize,
) -> Option<Choice> {
    if !open_knobs(m, po) {
        return None;
    }
    choose(
        &model.gguf,
        &model.cfg,
        po,
        max_binding,
        cal,
        n_past,
        &space(m, po),
        &run_io(m, m.io_mode(), po.in_place),
    )
}

static SAID_UNCALIBRATED: AtomicBool = AtomicBool::new(false);

/// Say once per process that the fixed rules apply for want of a calibration.
pub fn say_uncalibrated() {
    if !SAID_UNCALIBRATED.swap(true, Ordering::Relaxed) {
        eprintln!(
            "planner: this machine is not calibrated, so the fixed rules apply (the flags' values, else: layers resident first to last, then the head; prefetch 1; direct I/O; 512 KiB ring slots); `flashlm calibrate` lets the planner choose them"
        );
    }
}

/// `flashlm plan`: the choice a run would make and its prediction, without a GPU.
///
/// The decode step is predicted at a context of `prompt + n / 2` tokens (as `run` plans: the
/// middle of its decode), at most the plan's context (`--ctx`); the time to first token for a
/// prompt of `prompt` tokens. No device is opened: the calibration profile's record of the
/// calibrated device gives its binding limit, what `--upload auto` does there and whether its
/// products apply the layers' norms (a profile without that record: a 128 MiB limit, the staging
/// path, separate norms); `--upload in-place` plans reads straight into the layer slots.
pub fn plan_cmd(
    cli: &Cli,
    m: &ModelArgs,
    prompt: usize,
    n: usize,
    max_binding: Option<u64>,
) -> CliResult<()> {
    precheck(m)?;
    let path = resolve_model(&m.model)?;
    let model = load_model(&path)?;
    note_ctx_cap(m, &model);
    let opts = engine_options(cli, m, model.cfg.n_layers)?;
    let mut po = opts.plan_options();
    po.in_place = m.upload == UploadMode::InPlace;
    let cal = calibration();
    // The calibrated device's facts, where the profile has them: its binding limit, what
    // `--upload auto` does there, whether its products apply the layers' norms.
    let facts = cal.as_ref().and_then(|c| c.device);
    if let Some(f) = facts {
        po.fuse_norms = f.fuse_norms;
        po.fuse_rope = f.fuse_rope;
        po.bind_align = f.bind_align;
        if m.upload == UploadMode::Auto {
            po.in_place = f.auto_in_place;
        }
    }
    let max_binding = max_binding
        .or(facts.map(|f| f.max_binding))
        .unwrap_or(PLAN_MAX_BINDING);
    let mut mode = m.io_mode();
    match &cal {
        Some(c) => {
            if let Some(ch) = choose_for(m, &model, &po, max_binding, c, prompt + n / 2) {
                println!("{}", planner_line(&ch, m, &po));
                ch.apply(&mut po);
                mode = ch.io;
            }
        }
        None if open_knobs(m, &po) => println!(
            "planner: this machine is not calibrated, so the fixed rules apply; `flashlm calibrate` lets the planner choose"
        ),
        None => {}
    }
    let plan = ExecPlan::new(&model.gguf, &model.cfg, max_binding, &po)?;
    let kv = &plan.kv;
    println!("{}", plan.placement);
    println!(
        "context {} tokens; batches of {}; prefetch {}; I/O {mode}; uploads {}; staging ring {} x {} bytes",
        plan.max_ctx,
        plan.ubatch,
        po.prefetch,
        if po.in_place {
            "in place"
        } else {
            "through the staging ring"
        },
        plan.ring_slots,
        plan.ring_chunk
    );
    println!(
        "KV: {}-token pages of {} bytes, {} of {} per layer on the device{}, {} splits per round ({} at decode), a stream pool of {} pages",
        kv.page_tokens,
        kv.page_bytes,
        kv.home_pages,
        kv.max_pages,
        if kv.streams {
            ", the rest on flash"
        } else {
            ""
        },
        kv.round_splits,
        kv.decode_round_splits,
        kv.stream_slots
    );
    let Some(cal) = cal else {
        println!(
            "no prediction: this machine is not calibrated (run `flashlm calibrate`, which saves {})",
            Calibration::path().display()
        );
        return Ok(());
    };
    let at = (prompt + n / 2).min(plan.max_ctx);
    let w = token_work(&plan, at, &run_io(m, mode, po.in_place), 0.5);
    let p = predict_token(&cal, &w);
    let ttft = predict_prefill(&cal, &w, 0, prompt, plan.ubatch);
    println!(
        "predicted (calibration of {}), decode at a context of {at} tokens (--prompt-tokens + -n/2): {:.1} ms/token = compute {:.1} ms, weight I/O {:.1} ms, KV I/O {:.1} ms (overlap beta {:.2}); TTFT for {prompt} tokens {:.0} ms",
        cal.adapter,
        p.ms_per_token,
        p.compute_ms,
        p.weight_io_ms,
        p.kv_io_ms,
        cal.overlap_beta,
        ttft
    );
    println!(
        "per token: {} weight bytes from flash, {:.0} KV bytes from flash, {} dispatches; reads of {} bytes over {} threads",
        w.weight_flash_bytes, w.kv_flash_bytes, w.dispatches, w.piece, w.threads
    );
    Ok(())
}
