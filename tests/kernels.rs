//! Each kernel against the CPU reference on seeded random inputs, for every weight type, with
//! sizes that are not multiples of the workgroup or block size.
//!
//! Tolerances: matrix products |gpu - cpu| <= 1e-4 * sum_c |w_rc x_tc| + 1e-5 (f32 accumulation
//! in another order over the same dequantized weights); norms, RoPE and attention 1e-4 relative
//! to the largest magnitude in the output plus 1e-5.
mod common;

use common::Rng;
use flashlm::gguf::{GgmlType, quant};
use flashlm::gpu::{GpuContext, MatmulLayout};
use flashlm::kernels::{self, MatmulIo, Step};
use flashlm::model::config::RopeStyle;
use flashlm::model::reference::ops;

const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q8_0,
];

fn step_buffer(ctx: &GpuContext, n_tokens: u32, pos0: u32) -> flashlm::gpu::GpuBuffer {
    let buf = ctx
        .buffer(
            "step",
            16,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )
        .unwrap();
    let s = Step {
        n_tokens,
        pos0,
        _pad: [0; 2],
    };
    ctx.write(&buf, 0, bytemuck::bytes_of(&s));
    buf
}

fn run(ctx: &GpuContext, list: &[kernels::Dispatch], n_tokens: u32) {
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    kernels::record_all(&mut enc, list, n_tokens);
    ctx.queue.submit([enc.finish()]);
    ctx.wait().unwrap();
}

fn f32s(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Quantize random weights, then return (stored bytes, the dequantized values the CPU uses).
fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let w = rng.vec(rows * cols, 1.0);
    let bytes = quant::quantize(ty, &w);
    let mut deq = vec![0f32; rows * cols];
    quant::dequantize(ty, &bytes, &mut deq);
    (bytes, deq)
}

fn check_matmul(
    y: &[f32],
    w: &[f32],
    x: &[f32],
    rows: usize,
    cols: usize,
    base: &[f32],
    what: &str,
) {
    let t_count = x.len() / cols;
    for t in 0..t_count {
        let xt = &x[t * cols..(t + 1) * cols];
        let want = ops::matvec(w, rows, cols, xt);
        for r in 0..rows {
            let mag: f32 = (0..cols).map(|c| (w[r * cols + c] * xt[c]).abs()).sum();
            let tol = 1e-4 * mag + 1e-5;
            let got = y[t * rows + r] - base[t * rows + r];
            assert!(
                (got - want[r]).abs() <= tol,
                "{what}: token {t} row {r}: gpu {got} cpu {} (tol {tol})",
                want[r]
            );
        }
    }
}

#[test]
fn matmul_every_type_odd_sizes() {
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(7);
    for (ty, layout) in TYPES.into_iter().flat_map(|t| {
        [
            (t, MatmulLayout::CPU),
            (t, MatmulLayout::CPU_PLAIN),
            (t, MatmulLayout::GPU),
            (t, common::CPU_ROW_WALKS[0]),
            (t, common::CPU_ROW_WALKS[1]),
            (t, common::CPU_ROW_WALKS[2]),
        ]
    }) {
        ctx.matmul_layout = layout;
        let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        // Rows never a multiple of the 4 rows per workgroup; float types with ragged columns.
        let shapes: &[(usize, usize)] = if float {
            &[(37, 21), (5, 96), (66, 131)]
        } else {
            // 8, 12, 14 and 18 blocks: Q4_1 and Q8_0 rows read as streams of vec4s, row starts
            // 4, 2 (Q4_1) and 1 (Q8_0) words apart, rows ending in 1 to 3 (Q4_1) and 2 to 6
            // (Q8_0) blocks past the streams' groups.
            &[
                (37, 64),
                (5, 96),
                (66, 160),
                (9, 256),
                (7, 576),
                (11, 384),
                (6, 448),
            ]
        };
        for &(rows, cols) in shapes {
            let (bytes, deq) = weights(&mut rng, ty, rows, cols);
            let gw =
                kernels::upload_weight(&ctx, "w", ty, rows as u32, cols as u32, &bytes).unwrap();
            for (t_count, tt) in [(1usize, 1u32), (3, 8), (13, 8), (9, 1)] {
                let x = rng.vec(t_count * cols, 1.0);
                let xb = ctx.storage_with("x", f32s(&x)).unwrap();
                let base = rng.vec(t_count * rows, 1.0);
                for acc in [false, true] {
                    let yb = ctx.storage_with("y", f32s(&base)).unwrap();
                    let step = step_buffer(&ctx, t_count as u32, 0);
                    let io = MatmulIo {
                        x_stride: cols as u32,
                        y_stride: rows as u32,
                        accumulate: acc,
                        token_tile: tt,
                        ..Default::default()
                    };
                    let list = kernels::matmul(&ctx, &step, &gw, &xb, &yb, io).unwrap();
                    run(&ctx, &list, t_count as u32);
                    let y = ctx.read_f32(&yb, t_count * rows).unwrap();
                    let zero = vec![0f32; t_count * rows];
                    let what =
                        format!("{ty:?} {layout:?} {rows}x{cols} T={t_count} tt={tt} acc={acc}");
                    check_matmul(
                        &y,
                        &deq,
                        &x,
                        rows,
                        cols,
                        if acc { &base } else { &zero },
                        &what,
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_swiglu_matches_reference() {
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(11);
    for (ty, layout) in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::F16]
        .into_iter()
        .flat_map(|t| {
            [
                (t, MatmulLayout::CPU),
                (t, MatmulLayout::CPU_PLAIN),
                (t, MatmulLayout::GPU),
                (t, common::CPU_ROW_WALKS[0]),
                (t, common::CPU_ROW_WALKS[1]),
                (t, common::CPU_ROW_WALKS[2]),
            ]
        })
    {
        ctx.matmul_layout = layout;
        // Q4_1 with 13 blocks, Q8_0 with 18: rows read as streams of vec4s, then words.
        let cols = match ty {
            GgmlType::Q4_1 => 416,
            GgmlType::Q8_0 => 576,
            _ => 96,
        };
        let (rows, t_count) = (45usize, 5usize);
        let (bg, dg) = weights(&mut rng, ty, rows, cols);
        let (bu, du) = weights(&mut rng, ty, rows, cols);
        let wg = kernels::upload_weight(&ctx, "g", ty, rows as u32, cols as u32, &bg).unwrap();
        let wu = kernels::upload_weight(&ctx, "u", ty, rows as u32, cols as u32, &bu).unwrap();
        let x = rng.vec(t_count * cols, 1.0);
        let xb = ctx.storage_with("x", f32s(&x)).unwrap();
        let yb = ctx.storage("y", (t_count * rows * 4) as u64).unwrap();
        let step = step_buffer(&ctx, t_count as u32, 0);
        for tt in [1, 8] {
            let io = MatmulIo {
                x_stride: cols as u32,
                y_stride: rows as u32,
                token_tile: tt,
                ..Default::default()
            };
            let list = kernels::matmul_swiglu(&ctx, &step, &wg, &wu, &xb, &yb, io).unwrap();
            run(&ctx, &list, t_count as u32);
            let y = ctx.read_f32(&yb, t_count * rows).unwrap();
            for t in 0..t_count {
                let xt = &x[t * cols..(t + 1) * cols];
                let want = ops::swiglu(
                    &ops::matvec(&dg, rows, cols, xt),
                    &ops::matvec(&du, rows, cols, xt),
                );
                for r in 0..rows {
                    let tol = 1e-4 * want[r].abs().max(1.0) * (cols as f32).sqrt();
                    assert!(
                        (y[t * rows + r] - want[r]).abs() <= tol,
                        "{ty:?} tt={tt} t={t} r={r}: {} vs {}",
                        y[t * rows + r],
                        want[r]
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_split_into_parts_and_written_at_position() {
    // A weight split over several buffers writes each part's rows at the right place, and
    // y_at_pos writes token t at row pos0 + t (the KV cache path).
    let Some(ctx) = common::gpu() else { return };
    let mut rng = Rng(3);
    let (rows, cols, t_count, pos0) = (23usize, 64usize, 3usize, 5usize);
    let ty = GgmlType::Q4_0;
    let (bytes, deq) = weights(&mut rng, ty, rows, cols);
    let rb = bytes.len() / rows;
    // Build the split weight by hand: parts of 10, 10 and 3 rows, each placed after a
    // different number of garbage bytes in its buffer (bound from that offset, as a weight in
    // a layer slot is).
    let align = ctx.limits.min_storage_buffer_offset_alignment as usize;
    let mut parts = Vec::new();
    for (k, (r0, n)) in [(0usize, 10usize), (10, 10), (20, 3)]
        .into_iter()
        .enumerate()
    {
        let offset = k * align;
        let mut data = vec![0xa5u8; offset];
        data.extend_from_slice(&bytes[r0 * rb..(r0 + n) * rb]);
        let buf = ctx.storage_with("part", &data).unwrap();
        parts.push(kernels::Part {
            buf: std::sync::Arc::new(buf),
            offset: offset as u64,
            r0: r0 as u32,
            n: n as u32,
        });
    }
    let gw = kernels::GpuWeight {
        ty,
        rows: rows as u32,
        cols: cols as u32,
        row_bytes: rb as u32,
        parts,
    };
    let x = rng.vec(t_count * cols, 1.0);
    let xb = ctx.storage_with("x", f32s(&x)).unwrap();
    let yb = ctx
        .storage("y", ((pos0 + t_count) * rows * 4) as u64)
        .unwrap();
    let step = step_buffer(&ctx, t_count as u32, pos0 as u32);
    let io = MatmulIo {
        x_stride: cols as u32,
        y_stride: rows as u32,
        y_at_pos: true,
        token_tile: 8,
        ..Default::default()
    };
    let list = kernels::matmul(&ctx, &step, &gw, &xb, &yb, io).unwrap();
    assert_eq!(list.len(), 3);
    run(&ctx, &list, t_count as u32);
    let y = ctx.read_f32(&yb, (pos0 + t_count) * rows).unwrap();
    assert!(
        y[..pos0 * rows].iter().all(|&v| v == 0.0),
        "rows before pos0 untouched"
    );
    let zero = vec![0f32; t_count * rows];
    check_matmul(&y[pos0 * rows..], &deq, &x, rows, cols, &zero, "split");
}

#[test]
fn rmsnorm_matches_reference() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = Rng(5);
    for (n, t_count) in [(1usize, 1usize), (63, 2), (576, 3), (1000, 7)] {
        let x = rng.vec(n * t_count, 3.0);
        let w = rng.vec(n, 1.0);
        let xb = ctx.storage_with("x", f32s(&x)).unwrap();
        let wb = ctx.storage_with("w", f32s(&w)).unwrap();
        let yb = ctx.storage("y", (n * t_count * 4) as u64).unwrap();
        let step = step_buffer(&ctx, t_count as u32, 0);
        let d = kernels::rmsnorm(&ctx, &step, &xb, &wb, &yb, n as u32, 1e-5, 0, 0).unwrap();
        run(&ctx, &[d], t_count as u32);
        let y = ctx.read_f32(&yb, n * t_count).unwrap();
        for t in 0..t_count {
            let want = ops::rmsnorm(&x[t * n..(t + 1) * n], &w, 1e-5);
            let mag = want.iter().fold(0f32, |a, v| a.max(v.abs()));
            for i in 0..n {
                assert!(
                    (y[t * n + i] - want[i]).abs() <= 1e-4 * mag + 1e-5,
                    "n={n} t={t} i={i}"
                );
            }
        }
    }
}

#[test]
fn rope_matches_reference_both_styles() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = Rng(9);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (n_heads, head_dim, rope_dim, t_count, pos0) in [
            (3usize, 64usize, 64usize, 4usize, 0usize),
            (5, 10, 6, 3, 17),
            (1, 128, 128, 1, 4000),
        ] {
            let stride = n_heads * head_dim;
            let x = rng.vec(t_count * stride, 1.0);
            let xb = ctx.storage_with("x", f32s(&x)).unwrap();
            let base = 10000.0f32;
            let cs = kernels::rope_table(pos0 as u32, t_count as u32, rope_dim as u32, base);
            let csb = ctx.storage_with("cs", f32s(&cs)).unwrap();
            let step = step_buffer(&ctx, t_count as u32, pos0 as u32);
            let d = kernels::rope(
                &ctx,
                &step,
                &csb,
                &xb,
                n_heads as u32,
                head_dim as u32,
                rope_dim as u32,
                stride as u32,
                false,
                style == RopeStyle::Neox,
            )
            .unwrap();
            run(&ctx, &[d], t_count as u32);
            let y = ctx.read_f32(&xb, t_count * stride).unwrap();
            for t in 0..t_count {
                let mut want = x[t * stride..(t + 1) * stride].to_vec();
                ops::rope_inplace(
                    &mut want,
                    n_heads,
                    head_dim,
                    rope_dim,
                    pos0 + t,
                    base,
                    style,
                );
                for i in 0..stride {
                    assert!(
                        (y[t * stride + i] - want[i]).abs() <= 1e-4,
                        "{style:?} cfg=({n_heads},{head_dim},{rope_dim},{pos0}) t={t} i={i}: {} vs {} (x {})",
                        y[t * stride + i],
                        want[i],
                        x[t * stride + i]
                    );
                }
            }
        }
    }
}

/// The roofline kernel reads every byte it is given: the XOR of its workgroups' words is the
/// XOR of all the buffer's 32-bit words (each workgroup's 256 threads fold in the step's token
/// count an even number of times), with 16-byte loads and, where the device has 64-bit
/// integers, 32-byte ones; odd sizes, with a tail past the last whole load left out.
#[test]
fn roofline_reads_every_word() {
    let Some(ctx) = common::gpu() else {
        return;
    };
    let mut rng = Rng(41);
    let step = step_buffer(&ctx, 3, 0);
    for units in [1usize, 7, 4099, 70_001] {
        for wide in [false, true] {
            if wide && !ctx.int64 {
                continue;
            }
            let unit = if wide { 32 } else { 16 };
            let words: Vec<u32> = (0..units * unit / 4 + 3)
                .map(|_| rng.next_u64() as u32)
                .collect();
            let src = ctx
                .storage_with("roofline src", bytemuck::cast_slice(&words))
                .unwrap();
            let groups = 5u32;
            let dst = ctx.storage("roofline dst", u64::from(groups) * 4).unwrap();
            let bytes = (units * unit) as u64;
            let d = kernels::roofline(&ctx, &step, &src, bytes, &dst, groups, wide).unwrap();
            run(&ctx, &[d], 3);
            let out = ctx.read_buffer(&dst, u64::from(groups) * 4).unwrap();
            let got = bytemuck::cast_slice::<u8, u32>(&out)
                .iter()
                .fold(0, |a, w| a ^ w);
            let want = words[..units * unit / 4].iter().fold(0, |a, w| a ^ w);
            assert_eq!(got, want, "{units} loads of {unit} bytes");
        }
    }
}
