//! The kernel rates `flashlm calibrate` measures on the device alone: matrix products by type
//! and shape (decode and prefill), attention per KV byte, one dispatch and one host round trip.

use std::time::Instant;

use super::{BenchResult, median};
use crate::gguf::{GgmlType, quant};
use crate::gpu::GpuContext;
use crate::kernels::{self, KvShape, MatmulIo, Step};
use crate::plan::perf::MatmulPoint;

pub(super) fn step(ctx: &GpuContext, n: u32) -> BenchResult<crate::gpu::GpuBuffer> {
    let b = ctx.uniform("step", 16)?;
    let s = Step {
        n_tokens: n,
        pos0: 0,
        _pad: [0; 2],
    };
    ctx.write(&b, 0, bytemuck::bytes_of(&s));
    Ok(b)
}

/// `reps` replays of `list` at `n` tokens in one compute pass.
pub(super) fn encode(
    ctx: &GpuContext,
    list: &[kernels::Dispatch],
    n: u32,
    reps: usize,
) -> wgpu::CommandEncoder {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for _ in 0..reps {
            for d in list {
                d.record(&mut pass, n);
            }
        }
    }
    enc
}

/// Seconds for `reps` replays of `list` at `n` tokens, in one submission (after a warm-up).
pub(super) fn time_list(
    ctx: &GpuContext,
    list: &[kernels::Dispatch],
    n: u32,
    reps: usize,
) -> BenchResult<f64> {
    let run = |reps: usize| -> BenchResult<f64> {
        ctx.wait()?;
        let t = Instant::now();
        let enc = encode(ctx, list, n, reps);
        ctx.queue.submit([enc.finish()]);
        ctx.wait()?;
        Ok(t.elapsed().as_secs_f64())
    };
    run(1)?;
    let mut v: Vec<f64> = (0..3).map(|_| run(reps)).collect::<Result<_, _>>()?;
    Ok(median(&mut v))
}

/// Seconds of one host round trip: submit one dispatch and a copy of its output into a mappable
/// buffer, map that buffer and wait for it, as a layer does for its page scores (median of 41,
/// after a warm-up).
pub(super) fn round_trip_s(
    ctx: &GpuContext,
    list: &[kernels::Dispatch],
    out: &crate::gpu::GpuBuffer,
) -> BenchResult<f64> {
    let rb = ctx.alloc_as("round trip", 16, crate::gpu::BufferUsage::Readback)?;
    let once = || -> BenchResult<f64> {
        ctx.wait()?;
        let t = Instant::now();
        let mut enc = encode(ctx, list, 1, 1);
        enc.copy_buffer_to_buffer(out, 0, &rb, 0, 16);
        ctx.queue.submit([enc.finish()]);
        ctx.read_mapped(&rb, 16)?;
        Ok(t.elapsed().as_secs_f64())
    };
    once()?;
    let mut v: Vec<f64> = (0..41).map(|_| once()).collect::<Result<_, _>>()?;
    Ok(median(&mut v))
}

/// Weight bytes the decode rates are timed over (copies of one matrix), well past the caches
/// of the machines flashlm runs on, so that each read comes from memory as in a pass.
pub(super) const COLD_BYTES: u64 = 96 << 20;

/// The synthetic matrices (rows, columns) every weight type is measured on: a small and a
/// 7B-sized one, whose rows are whole blocks of every type.
pub(super) const SYNTHETIC_SHAPES: [[u32; 2]; 2] = [[512, 512], [4096, 4096]];

pub(super) fn point(
    ty: GgmlType,
    rows: u32,
    cols: u32,
    decode: f64,
    prefill: f64,
    model: bool,
) -> MatmulPoint {
    MatmulPoint {
        ty: ty.name().to_string(),
        rows,
        cols,
        bytes: ty.bytes_for(rows as u64 * cols as u64).unwrap_or(0),
        decode_gb_s: decode,
        prefill_gb_s: prefill,
        model,
    }
}

/// Decode and prefill GB/s of a `rows` x `cols` matrix of type `ty` (random weights).
pub(super) fn matmul_rates(
    ctx: &GpuContext,
    ty: GgmlType,
    rows: u32,
    cols: u32,
) -> BenchResult<(f64, f64)> {
    let mut rng = crate::sampling::SplitMix64(ty.id() as u64 + 17);
    let vals: Vec<f32> = (0..rows as usize * cols as usize)
        .map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32) - 0.5)
        .collect();
    let data = quant::quantize(ty, &vals);
    let w = kernels::upload_weight(ctx, "calibration", ty, rows, cols, &data)?;
    let bytes = w.bytes() as f64;
    let tokens = 64u32;
    let x = ctx.storage("x", tokens as u64 * cols as u64 * 4)?;
    let y = ctx.storage("y", tokens as u64 * rows as u64 * 4)?;
    let io = |tt: u32| MatmulIo {
        x_stride: cols,
        y_stride: rows,
        token_tile: tt,
        ..Default::default()
    };
    let s1 = step(ctx, 1)?;
    // Decode reads each matrix once per token, from memory rather than from the caches: time
    // it over enough copies of the matrix that they do not fit the caches between two reads.
    let copies = (COLD_BYTES.div_ceil(w.bytes().max(1)) as usize).clamp(1, 512);
    let mut dec = kernels::matmul(ctx, &s1, &w, &x, &y, io(1))?;
    let mut kept = Vec::with_capacity(copies);
    for _ in 1..copies {
        let c = kernels::upload_weight(ctx, "calibration", ty, rows, cols, &data)?;
        dec.extend(kernels::matmul(ctx, &s1, &c, &x, &y, io(1))?);
        kept.push(c);
    }
    let reps = 16usize.div_ceil(copies).max(2);
    let t = time_list(ctx, &dec, 1, reps)?;
    let decode = bytes * (copies * reps) as f64 / t / 1e9;
    drop((dec, kept));
    let s64 = step(ctx, tokens)?;
    let pre = kernels::matmul(ctx, &s64, &w, &x, &y, io(kernels::MM_PREFILL_TT))?;
    let t = time_list(ctx, &pre, tokens, 2)?;
    let prefill = bytes * tokens as f64 * 2.0 / t / 1e9;
    Ok((decode, prefill))
}

/// KV bytes per second of attention over `keys` keys (a multiple of 64), all heads: `rows` = 1
/// is a decode step; more rows are a prefill batch of one sequence ending at the last key (the
/// row-tiled kernel where the head dim allows), each row counting the keys it attends.
pub fn attention_rate(
    ctx: &GpuContext,
    cfg: &crate::model::config::ModelConfig,
    rows: u32,
    keys: u32,
) -> BenchResult<f64> {
    let page = 64u32;
    let kv_dim = (cfg.n_kv_heads * cfg.head_dim) as u32;
    let pages = keys / page;
    let shape = KvShape {
        n_heads: cfg.n_heads as u32,
        n_kv_heads: cfg.n_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        page_tokens: page,
        f16: true,
        table_base: 0,
        seq_stride: 4 + 2 * pages,
        round_splits: keys / kernels::ATTN_SPLIT_KEYS,
        scale: 0.0,
        softcap: 0.0,
        window: 0,
    };
    let page_bytes = 2 * page as u64 * kv_dim as u64 * 2;
    let pool_bytes = pages as u64 * page_bytes;
    // A decode step reads each layer's pages once per token, the whole model's weights in
    // between: time it over enough copies of the pages (each copy its own page table) that
    // they come from memory, as the matrix rates are. A prefill batch reads its pages once per
    // tile of rows, mostly from the caches, and is timed on one copy.
    let copies = if rows == 1 {
        (COLD_BYTES.div_ceil(pool_bytes.max(1)) as u32).clamp(1, 256)
    } else {
        1
    };
    let pool = ctx.storage("pool", copies as u64 * pool_bytes)?;
    let stream = ctx.storage("stream", 16)?;
    let q = ctx.storage(
        "q",
        (rows * cfg.n_heads as u32 * cfg.head_dim as u32 * 4) as u64,
    )?;
    let row_words: Vec<u32> = (0..rows)
        .flat_map(|t| [0u32, keys - rows + t, 0, 0])
        .collect();
    let n_rows = rows;
    let rows = ctx.storage_with("rows", bytemuck::cast_slice(&row_words))?;
    let tables = (0..copies)
        .map(|c| {
            let mut table = vec![
                0u32,
                3,
                keys / kernels::ATTN_SPLIT_KEYS,
                0,
                pages,
                keys,
                0,
                0,
            ];
            for p in 0..pages {
                table.extend_from_slice(&[p, c * pages + p]);
            }
            ctx.storage_with("table", bytemuck::cast_slice(&table))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let hd2 = (cfg.head_dim + 2) as u64;
    let per_row = cfg.n_heads as u64 * hd2 * 4;
    let part = ctx.storage("part", n_rows as u64 * shape.round_splits as u64 * per_row)?;
    let run = ctx.storage("run", n_rows as u64 * per_row)?;
    let out = ctx.storage(
        "out",
        (n_rows * cfg.n_heads as u32 * cfg.head_dim as u32 * 4) as u64,
    )?;
    let s = step(ctx, n_rows)?;
    let mut list = Vec::with_capacity(2 * copies as usize);
    for tb in &tables {
        let bufs = kernels::AttnBuffers {
            step: &s,
            rows: &rows,
            table: tb,
            q: &q,
            home: &pool,
            stream: &stream,
            part: &part,
            out: &out,
        };
        let tiled = if n_rows > 1 {
            kernels::attention_tiled(ctx, &bufs, &shape)?
        } else {
            None
        };
        list.push(match tiled {
            Some(d) => d,
            None => kernels::attention_partial(ctx, &bufs, &shape)?,
        });
        list.push(kernels::attention_merge(
            ctx, &s, tb, &part, &run, &out, &shape,
        )?);
    }
    let reps = if n_rows > 1 {
        2
    } else {
        16usize.div_ceil(copies as usize).max(2)
    };
    let t = time_list(ctx, &list, n_rows, reps)?;
    // Row t attends keys 0 ..= keys - rows + t.
    let attended: u64 = (0..n_rows as u64)
        .map(|t| (keys - n_rows) as u64 + t + 1)
        .sum();
    let bytes = attended as f64 * kv_dim as f64 * 2.0 * 2.0;
    Ok(bytes * (reps * copies as usize) as f64 / t / 1e9)
}

/// Seconds of page selection's kernels in one selecting layer of a decode step: the page
/// summaries (no page filled: every workgroup returns at once, as on most tokens) and the
/// scores of `pages` pages (f16 pages of 64 tokens). Timed over enough copies of the page
/// summaries (each its own buffer) that they come from memory, as in a pass.
pub fn select_layer_s(
    ctx: &GpuContext,
    cfg: &crate::model::config::ModelConfig,
    pages: u32,
) -> BenchResult<f64> {
    let shape = KvShape {
        n_heads: cfg.n_heads as u32,
        n_kv_heads: cfg.n_kv_heads as u32,
        head_dim: cfg.head_dim as u32,
        page_tokens: 64,
        f16: true,
        table_base: 0,
        seq_stride: 4 + 2 * pages,
        round_splits: 1,
        scale: 0.0,
        softcap: 0.0,
        window: 0,
    };
    let kv_dim = shape.kv_dim() as u64;
    let meta_bytes = pages as u64 * 2 * kv_dim * 4;
    let copies = COLD_BYTES.div_ceil(meta_bytes.max(1)).clamp(1, 256) as usize;
    let s = step(ctx, 1)?;
    let pool = ctx.storage("pool", shape.page_elems() as u64 * 2)?;
    // Job count 0; room for the two jobs a decode step lists.
    let jobs = ctx.storage_with("jobs", bytemuck::cast_slice(&[0u32; 12]))?;
    let table = ctx.storage_with("table", bytemuck::cast_slice(&[0u32, 0, 0, pages]))?;
    let q = ctx.storage("q", (cfg.n_heads * cfg.head_dim * 4) as u64)?;
    let scores = ctx.storage("scores", pages as u64 * cfg.n_heads as u64 * 4)?;
    let metas = (0..copies)
        .map(|_| ctx.storage("meta", meta_bytes))
        .collect::<Result<Vec<_>, _>>()?;
    let mut list = Vec::with_capacity(2 * copies);
    for meta in &metas {
        list.push(kernels::page_meta(ctx, &s, &jobs, &pool, meta, &shape, 2)?);
        list.push(kernels::page_score(
            ctx, &s, &table, &q, meta, &scores, &shape, pages,
        )?);
    }
    let reps = 64usize.div_ceil(copies).max(2);
    Ok(time_list(ctx, &list, 1, reps)? / (reps * copies) as f64)
}
