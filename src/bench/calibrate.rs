//! `flashlm calibrate`: measure this machine's constants for the performance model
//! ([`crate::plan::perf`]) and save them to the cache directory.
//!
//! - flash GB/s by piece size and threads, direct and mmap, from a cold page cache (the `bench io`
//!   sweep over a smaller range);
//! - upload GB/s (device copies from mapped staging buffers into layer slots);
//! - matrix-product GB/s per weight type, decode (one token) and prefill (64 tokens), on each
//!   of the model's matrix shapes and, for every type the kernels read, on two synthetic ones;
//! - the cost of one dispatch; attention GB/s of KV bytes (these kernel rates in `rates.rs`);
//! - the overlap of compute and I/O, fitted from short streamed runs of the model and of a
//!   synthetic model with 25 MB layers (written once to the cache directory);
//! - the speed probe of the moment ([`super::probe`]), which the benches compare theirs with.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::median;
use crate::engine::{Engine, EngineOptions};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, ReaderOptions};
use crate::gguf::GgmlType;
use crate::gpu::{GpuContext, GpuOptions};
use crate::kernels;
use crate::model::LoadedModel;
use crate::model::synthetic::SyntheticSpec;
use crate::plan::history::Entry;
use crate::plan::perf::{
    Calibration, FlashRate, MAX_MEASURED_ROWS, OverlapPoint, PrefillPoint, SelectCost,
};
use crate::sampling::{Sampler, SamplerParams};

mod fit;
mod rates;

use fit::{fitted_beta, fitted_copy_beta, fitted_prefill_point, fitted_scale, fitted_sync_s};
use rates::{SYNTHETIC_SHAPES, matmul_rates, point, round_trip_s, step, time_list};
pub use rates::{attention_rate, select_layer_s};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Runs of each engine that [`interleaved_medians`] counts.
const ENGINE_RUNS: usize = 5;

/// The statistics of the runs with the median ms/token of each engine: [`ENGINE_RUNS`] runs of
/// 12 tokens after `prompt`, each from an empty context, the engines taking turns (so a slow
/// spell of a shared machine falls on both rather than on one), after one warm-up run each
/// that is not counted (its first steps build the pipelines, which made a single short run
/// read up to a third slow). The time to first token returned is the median of the runs' own.
/// Besides: each engine's ms/token run by run (the same turn at the same index).
fn interleaved_medians(
    engines: &mut [&mut Engine],
    prompt: &[u32],
    sm: &mut Sampler,
) -> BenchResult<(Vec<crate::engine::GenStats>, Vec<Vec<f64>>)> {
    let mut runs: Vec<Vec<crate::engine::GenStats>> = engines.iter().map(|_| Vec::new()).collect();
    for r in 0..=ENGINE_RUNS {
        for (e, out) in engines.iter_mut().zip(runs.iter_mut()) {
            e.reset();
            let (_, st) = e.generate(prompt, 12, sm, |_| false, |_| true)?;
            if r > 0 {
                out.push(st);
            }
        }
    }
    let per_turn = runs
        .iter()
        .map(|v| v.iter().map(|s| s.ms_per_token).collect())
        .collect();
    let medians = runs
        .into_iter()
        .map(|mut v| {
            let mut ttft: Vec<f64> = v.iter().map(|s| s.ttft_ms).collect();
            ttft.sort_by(f64::total_cmp);
            v.sort_by(|a, b| a.ms_per_token.total_cmp(&b.ms_per_token));
            let mut st = v.swap_remove(ENGINE_RUNS / 2);
            st.ttft_ms = ttft[ENGINE_RUNS / 2];
            st
        })
        .collect();
    Ok((medians, per_turn))
}

/// Measure everything; `model` supplies the shapes and the file to read. Stamped with the
/// time and the machine's speed while it was measured (the resident decode the compute factor
/// was fitted on), for [`crate::plan::history`].
pub fn run(model: &LoadedModel, gpu: &GpuOptions) -> BenchResult<Entry> {
    // Flash: the bench io sweep over 32 MiB, with the staging ring for the upload rate.
    eprintln!("flash reads (cold page cache)...");
    let io = super::io::run(&super::io::IoBenchOptions {
        model: model.path.clone(),
        bytes: 32 << 20,
        repeats: 1,
        gpu: None,
    })?;
    let flash: Vec<FlashRate> = io
        .sweep
        .iter()
        .map(|p| FlashRate {
            mode: p.mode.clone(),
            piece: p.chunk,
            threads: p.threads,
            gb_s: p.gb_s,
        })
        .collect();
    let ctx = GpuContext::new(gpu)?;
    // Upload: what a streamed layer costs the device after its bytes are read into a mapped
    // staging buffer: a device copy from staging into a layer slot, 32 MiB at a time.
    let up_bytes = 32u64 << 20;
    let dst = ctx.storage("upload", up_bytes)?;
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("calibration staging"),
        size: up_bytes,
        usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::MAP_WRITE,
        // The copy's cost does not depend on the bytes (buffers start zeroed).
        mapped_at_creation: false,
    });
    let mut ups = Vec::new();
    for _ in 0..5 {
        ctx.wait()?;
        let t = Instant::now();
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(&staging, 0, &dst, 0, up_bytes);
        ctx.queue.submit([enc.finish()]);
        ctx.wait()?;
        ups.push(up_bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    let upload_gb_s = median(&mut ups);
    let host_copy_gb_s = host_copy_rate();
    eprintln!("upload {upload_gb_s:.2} GB/s, host memory copy {host_copy_gb_s:.2} GB/s");
    // Matrix products: every shape of the model's (rows capped), then every type the kernels
    // read on synthetic shapes, so that another model (`flashlm plan -m`, the S3 model) is
    // priced at its own types' rates. The per-type rates are the model's largest matrix.
    let mut shapes: Vec<(GgmlType, u32, u32, u64)> = model
        .gguf
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .map(|t| {
            let rows = t.n_rows().min(MAX_MEASURED_ROWS);
            (t.ty, rows as u32, t.row_len() as u32, t.n_bytes)
        })
        .collect();
    shapes.sort_by_key(|&(ty, r, c, b)| (ty.id(), r, c, std::cmp::Reverse(b)));
    shapes.dedup_by_key(|&mut (ty, r, c, _)| (ty.id(), r, c));
    let mut matvec_gb_s = BTreeMap::new();
    let mut prefill_gb_s = BTreeMap::new();
    let mut largest: BTreeMap<String, u64> = BTreeMap::new();
    let mut matmul_points = Vec::new();
    for &(ty, rows, cols, bytes) in &shapes {
        let (d, p) = matmul_rates(&ctx, ty, rows, cols)?;
        let name = ty.name().to_string();
        eprintln!("{name} {rows} x {cols}: decode {d:.3} GB/s, prefill {p:.2} GB/s x tokens");
        if largest.get(&name).is_none_or(|&b| bytes > b) {
            largest.insert(name.clone(), bytes);
            matvec_gb_s.insert(name.clone(), d);
            prefill_gb_s.insert(name.clone(), p);
        }
        matmul_points.push(point(ty, rows, cols, d, p, true));
    }
    for ty in GgmlType::ALL {
        for [rows, cols] in SYNTHETIC_SHAPES {
            if ty.bytes_for(cols as u64).is_none() {
                continue;
            }
            match matmul_rates(&ctx, ty, rows, cols) {
                Ok((d, p)) => {
                    eprintln!(
                        "{ty} {rows} x {cols} (synthetic): decode {d:.3} GB/s, prefill {p:.2} GB/s x tokens"
                    );
                    matmul_points.push(point(ty, rows, cols, d, p, false));
                }
                // A type the kernels do not run is not a calibration failure.
                Err(e) => eprintln!("{ty}: not measured ({e})"),
            }
        }
    }
    // One dispatch.
    let s = step(&ctx, 1)?;
    let a = ctx.storage("a", 16)?;
    let b = ctx.storage("b", 16)?;
    let empty = vec![kernels::empty_dispatch(&ctx, &s, &a, &b)?];
    let dispatch_s = time_list(&ctx, &empty, 1, 2000)? / 2000.0;
    let sync_s = (round_trip_s(&ctx, &empty, &b)? - dispatch_s).max(0.0);
    // Attention's rates move by tens of percent from one timing to the next on a shared
    // machine (and take no in-pass factor): medians of 7 timings each, in turns.
    let (mut decode_attn, mut prefill_attn) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        decode_attn.push(attention_rate(&ctx, &model.cfg, 1, 2048)?);
        prefill_attn.push(attention_rate(&ctx, &model.cfg, 64, 2048)?);
    }
    let attn_gb_s = median(&mut decode_attn);
    let prefill_attn_gb_s = median(&mut prefill_attn);
    eprintln!(
        "dispatch {:.1} µs, host round trip {:.1} µs, attention {attn_gb_s:.2} GB/s of KV (decode), {prefill_attn_gb_s:.2} GB/s over the rows of a 64-row prefill",
        dispatch_s * 1e6,
        sync_s * 1e6
    );
    let select = select_cost(&ctx, &model.cfg, dispatch_s)?;
    eprintln!(
        "page selection: {:.1} µs a selecting layer beyond its two dispatches + {:.2} µs a page scored",
        select.layer_s * 1e6,
        select.page_s * 1e6
    );
    drop(ctx);
    // In-pass compute, then overlap: short resident runs, and streamed runs under a budget
    // that streams every layer (medians, after a warm-up run).
    let mut cal = Calibration {
        flash,
        upload_gb_s,
        host_copy_gb_s,
        matvec_gb_s,
        prefill_gb_s,
        matmul_points,
        dispatch_s,
        sync_s,
        attn_gb_s,
        prefill_attn_gb_s,
        select: Some(select),
        ..Default::default()
    };
    // As long as the prompts the prefill rates are timed on (one batch of 64 tokens), so that
    // the prefill's in-pass factor is fitted where those rates hold.
    let prompt: Vec<u32> = (0..64)
        .map(|i| (i * 7 + 1) % model.cfg.vocab_size as u32)
        .collect();
    let mut sm = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    // In-pass compute: a resident run (no I/O) against what the kernel rates add up to for
    // its pass; then the overlap, from a fully streamed run in the same turns.
    // Besides: the streamed run served by the host cache (its copies), and a resident run with
    // page selection on pages small enough to leave pages out (its waits for the scores),
    // with the same engine attending every page as its pair.
    let mut resident = calibration_engine(model, gpu, None, false)?;
    let mut streamed = calibration_engine(model, gpu, Some("none"), false)?;
    let mut cached = calibration_engine(model, gpu, Some("none"), true)?;
    let mut selecting = small_page_engine(model, gpu, true)?;
    let mut dense = small_page_engine(model, gpu, false)?;
    let (mut medians, per_turn) = interleaved_medians(
        &mut [
            &mut resident,
            &mut streamed,
            &mut cached,
            &mut selecting,
            &mut dense,
        ],
        &prompt,
        &mut sm,
    )?;
    let (st_r, st, st_c, st_s, st_d) = (
        medians.remove(0),
        medians.remove(0),
        medians.remove(0),
        medians.remove(0),
        medians.remove(0),
    );
    let resident_ms = st_r.ms_per_token;
    let (scale, kernels_ms) = fitted_scale(
        &cal,
        &resident.token_work(st_r.selection_reuse),
        st_r.ms_per_token,
    );
    // Kept as measured; `compute_factor` bounds it where it is used.
    cal.compute_scale = scale;
    let small_compute = PrefillPoint {
        pass_bytes: crate::plan::perf::pass_bytes(&resident.token_work(st_r.selection_reuse)),
        scale,
    };
    eprintln!(
        "compute: resident run {:.1} ms/token, kernels at their rates {kernels_ms:.1} ms: x{:.2}",
        st_r.ms_per_token,
        cal.compute_factor()
    );
    // A selecting layer's wait for its page scores inside a pass: how much more the selecting
    // run took than its dense pair, turn by turn (median), beyond what the model predicts
    // between them with waits of a bare round trip, per wait (at least that). The pair has
    // the same pages, batches and context, so what the model misprices in both cancels.
    let ws = selecting.token_work(st_s.selection_reuse);
    let wd = dense.token_work(st_d.selection_reuse);
    let bare = cal.sync_s;
    let p_sel = crate::plan::perf::predict_token(&cal, &ws).ms_per_token;
    let p_dense = crate::plan::perf::predict_token(&cal, &wd).ms_per_token;
    let mut gaps: Vec<f64> = per_turn[3]
        .iter()
        .zip(&per_turn[4])
        .map(|(s, d)| s - d)
        .collect();
    let gap = median(&mut gaps);
    cal.sync_s = fitted_sync_s(bare, p_sel - p_dense, gap, ws.syncs);
    eprintln!(
        "page selection in a pass: resident run {:.1} ms/token, its dense pair {:.1}, {gap:+.1} ms turn by turn (median); predicted {:+.1} ms with {} waits of a bare round trip ({:.1} µs): {:.1} µs a wait",
        st_s.ms_per_token,
        st_d.ms_per_token,
        p_sel - p_dense,
        ws.syncs,
        bare * 1e6,
        cal.sync_s * 1e6
    );
    drop(selecting);
    drop(dense);
    let small_prefill = fitted_prefill_point(&cal, &resident, prompt.len(), st_r.ttft_ms);
    cal.prefill_scale = small_prefill.scale;
    drop(resident);
    cal.adapter = streamed.ctx.info.name.clone();
    cal.device = Some(Engine::device_facts(&streamed.ctx)?);
    let w = streamed.token_work(st.selection_reuse);
    let pred = crate::plan::perf::predict_token(&cal, &w);
    cal.overlap_beta = fitted_beta(&pred, st.ms_per_token);
    eprintln!(
        "overlap: streamed run {:.1} ms/token, compute {:.1} ms, I/O {:.1} ms, pipelined {:.1} ms: beta {:.2}",
        st.ms_per_token,
        pred.compute_ms,
        pred.weight_io_ms + pred.kv_io_ms,
        pred.pipelined_ms,
        cal.overlap_beta
    );
    let small = OverlapPoint {
        layer_bytes: w.layer_bytes,
        beta: cal.overlap_beta,
    };
    drop(streamed);
    // The host copies' share: the same run with every streamed weight byte in the host cache.
    cal.copy_beta = 0.0;
    let wc = cached.token_work(st_c.selection_reuse);
    let hidden = crate::plan::perf::predict_token(&cal, &wc);
    let copy_ms = crate::plan::perf::copy_s(&cal, &wc) * 1e3;
    cal.copy_beta = fitted_copy_beta(hidden.ms_per_token, st_c.ms_per_token, copy_ms);
    eprintln!(
        "host copies: streamed from the host cache {:.1} ms/token, predicted with the copies hidden {:.1} ms, copies {copy_ms:.1} ms: share {:.2}",
        st_c.ms_per_token, hidden.ms_per_token, cal.copy_beta
    );
    drop(cached);
    // The overlap again on layers of a 7B model's order of size (a synthetic model in the
    // cache directory, written once): how much a pass hides changes with what a layer costs.
    let (big, big_compute, big_prefill) = big_overlap_point(&cal, gpu, &prompt, &mut sm)?;
    cal.overlap_points = vec![small, big];
    cal.compute_points = vec![small_compute, big_compute];
    cal.prefill_points = vec![small_prefill, big_prefill];
    // The speed probe of this moment, for the benches to compare theirs with.
    let path = std::fs::canonicalize(&model.path).unwrap_or_else(|_| model.path.clone());
    let probe = super::probe::Prober::new(&path, gpu)?.take()?;
    eprintln!(
        "speed probe: resident {:.1} ms/token, direct reads {:.2} GB/s (64 KiB) / {:.2} GB/s (1 MiB)",
        probe.resident_ms, probe.flash_small_gb_s, probe.flash_large_gb_s
    );
    cal.probe = Some(probe);
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Entry {
        at,
        method: crate::plan::history::METHOD,
        resident_ms,
        calibration: cal,
    })
}

/// Page selection's cost in one selecting layer: its kernels timed at a few and at many pages
/// (medians of 5 timings each, in turns), split into a part per page and a fixed part beyond
/// the two dispatches already priced; neither below 0.
fn select_cost(
    ctx: &GpuContext,
    cfg: &crate::model::config::ModelConfig,
    dispatch_s: f64,
) -> BenchResult<SelectCost> {
    const FEW: u32 = 16;
    const MANY: u32 = 256;
    let (mut few, mut many) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        few.push(select_layer_s(ctx, cfg, FEW)?);
        many.push(select_layer_s(ctx, cfg, MANY)?);
    }
    let (few, many) = (median(&mut few), median(&mut many));
    let page_s = ((many - few) / (MANY - FEW) as f64).max(0.0);
    Ok(SelectCost {
        layer_s: (few - FEW as f64 * page_s - 2.0 * dispatch_s).max(0.0),
        page_s,
    })
}

/// GB/s of one thread copying 32 MiB between host buffers (both touched first), median of 5.
fn host_copy_rate() -> f64 {
    let n = 32usize << 20;
    let src: Vec<u8> = (0..n).map(|i| i as u8).collect();
    let mut dst = vec![1u8; n];
    let mut rates: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            n as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
        })
        .collect();
    median(&mut rates)
}

/// An engine over `model` for the calibration's runs (`resident`: a `--resident` spec; None:
/// the default placement), a 256-token context; with `cache_weights`, a host cache holding
/// every weight byte that streams.
fn calibration_engine(
    model: &LoadedModel,
    gpu: &GpuOptions,
    resident: Option<&str>,
    cache_weights: bool,
) -> BenchResult<Engine> {
    let mut o = EngineOptions {
        gpu: gpu.clone(),
        ctx: Some(256),
        ..Default::default()
    };
    if let Some(r) = resident {
        o.resident =
            crate::plan::ResidentSpec::parse(r, model.cfg.n_layers).map_err(|e| e.to_string())?;
    }
    let e = engine_on(model, &o, 0)?;
    if !cache_weights {
        return Ok(e);
    }
    // The plan with no host cache says what streams.
    let dram = crate::plan::perf::streamed_weight_bytes(&e.plan);
    drop(e);
    engine_on(model, &o, dram)
}

/// An engine over `model` with options `o` and a host cache of `dram` bytes.
fn engine_on(model: &LoadedModel, o: &EngineOptions, dram: u64) -> BenchResult<Engine> {
    let file = FlashFile::open(&model.path, ReaderOptions::default())?;
    Ok(Engine::with_source(
        model.gguf.clone(),
        Arc::new(FlashSource::new(file, dram)),
        o,
    )?)
}

/// A resident engine on the calibrated model with 4-token pages and batches of 8 (so that the
/// recent window a batch needs is 3 pages): with `select`, it selects a quarter of its pages
/// (the first two layers dense), so that the calibration's short prompt leaves pages out;
/// without, it attends every page (the selecting one's pair).
fn small_page_engine(model: &LoadedModel, gpu: &GpuOptions, select: bool) -> BenchResult<Engine> {
    let kv_select = if select {
        Some(crate::plan::KvSelect::parse("quest:25%", 2)?)
    } else {
        None
    };
    let o = EngineOptions {
        gpu: gpu.clone(),
        ctx: Some(256),
        ubatch: 8,
        kv_page: Some(4),
        kv_select,
        ..Default::default()
    };
    engine_on(model, &o, 0)
}

/// The synthetic model the overlap is measured on a second time: 6 layers of about 25 MB.
fn overlap_spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 6,
        n_embd: 2048,
        n_heads: 16,
        n_kv_heads: 4,
        n_ff: 5632,
        vocab: 4096,
        weight_type: GgmlType::Q4_K,
        ctx: 256,
        untied_output: false,
    }
}

/// β of a fully streamed run of the [`overlap_spec`] model (medians after a warm-up, in turns
/// with a resident run of it that scales `cal`'s kernel rates), with `cal`'s other rates.
fn big_overlap_point(
    cal: &Calibration,
    gpu: &GpuOptions,
    prompt: &[u32],
    sm: &mut Sampler,
) -> BenchResult<(OverlapPoint, PrefillPoint, PrefillPoint)> {
    let spec = overlap_spec();
    let path = crate::paths::cache_dir().join("calibration-overlap.gguf");
    super::s3::ensure_model(&path, &spec)?;
    let model = crate::model::load_model(&path)?;
    let mut resident = calibration_engine(&model, gpu, Some("all"), false)?;
    let mut streamed = calibration_engine(&model, gpu, Some("none"), false)?;
    let prompt: Vec<u32> = prompt
        .iter()
        .map(|&t| t % model.cfg.vocab_size as u32)
        .collect();
    // Resident and streamed in turns, and the compute side scaled to the resident run of the
    // same turns: β is then what streaming adds beyond the pipeline, not the machine's drift
    // since the kernel rates were measured.
    let (mut medians, _) = interleaved_medians(&mut [&mut resident, &mut streamed], &prompt, sm)?;
    let (st_r, st) = (medians.remove(0), medians.remove(0));
    let mut local = cal.clone();
    local.compute_points.clear();
    local.compute_scale = fitted_scale(cal, &resident.token_work(0.0), st_r.ms_per_token).0;
    let compute = PrefillPoint {
        pass_bytes: crate::plan::perf::pass_bytes(&resident.token_work(0.0)),
        scale: local.compute_scale,
    };
    let prefill = fitted_prefill_point(cal, &resident, prompt.len(), st_r.ttft_ms);
    drop(resident);
    let w = streamed.token_work(st.selection_reuse);
    let pred = crate::plan::perf::predict_token(&local, &w);
    let beta = fitted_beta(&pred, st.ms_per_token);
    eprintln!(
        "overlap, {:.1} MB layers: resident run {:.1} ms/token, streamed {:.1}, compute {:.1} ms, I/O {:.1} ms, pipelined {:.1} ms: beta {beta:.2}",
        w.layer_bytes as f64 / 1e6,
        st_r.ms_per_token,
        st.ms_per_token,
        pred.compute_ms,
        pred.weight_io_ms + pred.kv_io_ms,
        pred.pipelined_ms
    );
    Ok((
        OverlapPoint {
            layer_bytes: w.layer_bytes,
            beta,
        },
        compute,
        prefill,
    ))
}
