//! The matrix kernels for the Q5_0, Q5_1, IQ4_NL and super-block (Q2_K..Q6_K, IQ4_XS) weight
//! types against the CPU reference: every layout, decode (one token per workgroup) and prefill
//! (8), plain and accumulating, odd row counts (rows of odd block counts also start 2 bytes into
//! a word for the types whose blocks are not a multiple of 4 bytes), two or three row lengths.
//!
//! Weights are random bytes with random finite f16 scale fields, so every code, scale and
//! sign bit pattern is exercised; the CPU reference multiplies by `quant::dequantize` of the same
//! bytes (itself checked bit for bit against gguf-py in `tests/quant_oracle.rs`).
//!
//! Tolerance: |gpu - cpu| <= 1e-4 * sum_c |w_rc x_tc| + 1e-5, as in `tests/kernels.rs`: f32
//! accumulation in another order over the same weights (the GPU may also fuse a weight's
//! `q * scale - min` into one rounding). SwiGLU: 1e-4 * max(|want|, 1) * sqrt(cols).
mod common;

use common::Rng;
use flashlm::gguf::{GgmlType, quant};
use flashlm::gpu::{GpuContext, MatmulLayout};
use flashlm::kernels::{self, MatmulIo, Step};
use flashlm::model::reference::ops;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// The layouts of each adapter class, and the CPU layout with one and with four rows a thread
/// in decode.
const LAYOUTS: [MatmulLayout; 6] = [
    MatmulLayout::CPU,
    MatmulLayout::CPU_PLAIN,
    MatmulLayout::GPU,
    common::CPU_ROW_WALKS[0],
    common::CPU_ROW_WALKS[1],
    common::CPU_ROW_WALKS[2],
];

/// Byte offsets of a block's f16 fields (scales and mins).
fn half_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q5_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        other => panic!("no layout for {other}"),
    }
}

/// Random blocks (f16 fields of magnitude 2^-10..2^-4, either sign) and their CPU decode.
fn random_weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let n = rows * cols;
    let len = ty.bytes_for(n as u64).unwrap() as usize;
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    for block in bytes.chunks_mut(ty.block_bytes() as usize) {
        for &off in half_fields(ty) {
            let v = rng.f32().signum() * 2f32.powf(-10.0 + 6.0 * rng.f32().abs());
            block[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    let deq = quant::dequantize_to_vec(ty, &bytes, n);
    assert!(deq.iter().all(|v| v.is_finite()));
    (bytes, deq)
}

fn step_buffer(ctx: &GpuContext, n_tokens: u32) -> flashlm::gpu::GpuBuffer {
    let buf = ctx
        .buffer(
            "step",
            16,
            wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        )
        .unwrap();
    let s = Step {
        n_tokens,
        pos0: 0,
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

/// Checks Y (less `base`) against W X for every token.
fn check(y: &[f32], w: &[f32], x: &[f32], rows: usize, cols: usize, base: &[f32], what: &str) {
    for t in 0..x.len() / cols {
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

fn shapes(ty: GgmlType) -> &'static [(usize, usize)] {
    if ty.block_len() == 32 {
        // 3 and 5 blocks per row: odd, so alternate rows of 18- and 22-byte blocks start at
        // 2 mod 4.
        &[(37, 96), (5, 160), (19, 64)]
    } else {
        &[(37, 256), (5, 768)]
    }
}

#[test]
fn matmul_new_types_every_layout() {
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(23);
    for ty in TYPES {
        for &(rows, cols) in shapes(ty) {
            let (bytes, deq) = random_weight(&mut rng, ty, rows, cols);
            let gw =
                kernels::upload_weight(&ctx, "w", ty, rows as u32, cols as u32, &bytes).unwrap();
            for layout in LAYOUTS {
                ctx.matmul_layout = layout;
                for (t_count, tt) in [(1usize, 1u32), (3, 8), (13, 8), (9, 1)] {
                    let x = rng.vec(t_count * cols, 1.0);
                    let xb = ctx.storage_with("x", f32s(&x)).unwrap();
                    let base = rng.vec(t_count * rows, 1.0);
                    let zero = vec![0f32; t_count * rows];
                    for acc in [false, true] {
                        let yb = ctx.storage_with("y", f32s(&base)).unwrap();
                        let step = step_buffer(&ctx, t_count as u32);
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
                        let what =
                            format!("{ty} {layout:?} {rows}x{cols} T={t_count} tt={tt} acc={acc}");
                        check(
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
    ctx.check().unwrap();
}

#[test]
fn matmul_new_types_read_x_at_an_offset() {
    // X rows padded and offset (multiples of 4: the block path; 2: the generic path).
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(29);
    for ty in [GgmlType::Q6_K, GgmlType::Q5_0] {
        let (rows, cols) = (11usize, ty.block_len() as usize * 3);
        let (bytes, deq) = random_weight(&mut rng, ty, rows, cols);
        let gw = kernels::upload_weight(&ctx, "w", ty, rows as u32, cols as u32, &bytes).unwrap();
        for layout in LAYOUTS {
            ctx.matmul_layout = layout;
            for (x_offset, pad) in [(4usize, 8usize), (2, 6)] {
                let t_count = 3;
                let stride = cols + pad;
                let xbuf = rng.vec(x_offset + t_count * stride, 1.0);
                let x: Vec<f32> = (0..t_count)
                    .flat_map(|t| xbuf[x_offset + t * stride..][..cols].to_vec())
                    .collect();
                let xb = ctx.storage_with("x", f32s(&xbuf)).unwrap();
                let yb = ctx.storage("y", (t_count * rows * 4) as u64).unwrap();
                let step = step_buffer(&ctx, t_count as u32);
                for tt in [1, 8] {
                    let io = MatmulIo {
                        x_stride: stride as u32,
                        y_stride: rows as u32,
                        x_offset: x_offset as u32,
                        token_tile: tt,
                        ..Default::default()
                    };
                    let list = kernels::matmul(&ctx, &step, &gw, &xb, &yb, io).unwrap();
                    run(&ctx, &list, t_count as u32);
                    let y = ctx.read_f32(&yb, t_count * rows).unwrap();
                    let zero = vec![0f32; t_count * rows];
                    let what = format!("{ty} {layout:?} offset {x_offset} tt={tt}");
                    check(&y, &deq, &x, rows, cols, &zero, &what);
                }
            }
        }
    }
}

#[test]
fn matmul_swiglu_k_quants() {
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(31);
    for ty in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q5_0] {
        for layout in LAYOUTS {
            ctx.matmul_layout = layout;
            let (rows, cols, t_count) = (45usize, ty.block_len() as usize * 2, 5usize);
            let quantized = |rng: &mut Rng| {
                let b = quant::quantize(ty, &rng.vec(rows * cols, 1.0));
                let d = quant::dequantize_to_vec(ty, &b, rows * cols);
                (b, d)
            };
            let (bg, dg) = quantized(&mut rng);
            let (bu, du) = quantized(&mut rng);
            let wg = kernels::upload_weight(&ctx, "g", ty, rows as u32, cols as u32, &bg).unwrap();
            let wu = kernels::upload_weight(&ctx, "u", ty, rows as u32, cols as u32, &bu).unwrap();
            let x = rng.vec(t_count * cols, 1.0);
            let xb = ctx.storage_with("x", f32s(&x)).unwrap();
            let yb = ctx.storage("y", (t_count * rows * 4) as u64).unwrap();
            let step = step_buffer(&ctx, t_count as u32);
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
                            "{ty} {layout:?} tt={tt} t={t} r={r}: {} vs {}",
                            y[t * rows + r],
                            want[r]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn upload_checks_the_row_length_per_type() {
    let Some(ctx) = common::gpu() else { return };
    // 256 columns: whole blocks of every type; 96: not whole super-blocks.
    for ty in TYPES {
        let ok = vec![0u8; ty.bytes_for(2 * 256).unwrap() as usize];
        assert!(
            kernels::upload_weight(&ctx, "w", ty, 2, 256, &ok).is_ok(),
            "{ty}"
        );
        let data = vec![0u8; ty.bytes_for(2 * 96).unwrap_or(512) as usize];
        let res = kernels::upload_weight(&ctx, "w", ty, 2, 96, &data);
        assert_eq!(res.is_err(), ty.block_len() == 256, "{ty}");
    }
    let err = kernels::upload_weight(&ctx, "w", GgmlType::Q4_K, 1, 96, &[0u8; 512])
        .err()
        .unwrap();
    assert!(err.to_string().contains("block length 256"), "{err}");
}

/// Three products of one X in one dispatch (Q, K and V), each into its own Y, against the CPU
/// reference: block types (the block path, with and without shared X) and float types (the
/// generic path), every layout, decode and prefill tiles, plain and accumulating; segments of
/// several workgroups and of part of one.
#[test]
fn matmul_multi_three_products_every_layout() {
    let Some(mut ctx) = common::gpu() else { return };
    let mut rng = Rng(37);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
        GgmlType::F32,
    ] {
        // Q4_1 with 13 blocks, Q8_0 with 18: rows read as streams of vec4s (groups of 4 and 8
        // blocks), then the last blocks as words.
        let cols = match ty {
            GgmlType::Q4_1 => 32 * 13,
            GgmlType::Q8_0 => 32 * 18,
            _ => ty.block_len().max(32) as usize * 3,
        };
        let rows = [70usize, 37, 5];
        let stored: Vec<(Vec<f32>, Vec<u8>)> = rows
            .iter()
            .map(|&r| {
                let b = quant::quantize(ty, &rng.vec(r * cols, 1.0));
                (quant::dequantize_to_vec(ty, &b, r * cols), b)
            })
            .collect();
        // Each weight in its own buffer (the branch per segment), and the three side by side
        // in one (as a layer's matrices are: read from one binding).
        let apart: Vec<kernels::GpuWeight> = rows
            .iter()
            .zip(&stored)
            .map(|(&r, (_, b))| {
                kernels::upload_weight(&ctx, "w", ty, r as u32, cols as u32, b).unwrap()
            })
            .collect();
        let layouts: Vec<kernels::WeightLayout> = rows
            .iter()
            .map(|&r| {
                kernels::WeightLayout::new("w", ty, r as u32, cols as u32, ctx.max_binding())
                    .unwrap()
            })
            .collect();
        let (at, total) = kernels::packed_offsets(&layouts, 16, ctx.max_binding()).unwrap();
        let layer = std::sync::Arc::new(ctx.storage("layer", total).unwrap());
        let together: Vec<kernels::GpuWeight> = layouts
            .iter()
            .zip(&stored)
            .zip(&at)
            .map(|((l, (_, b)), &o)| l.upload_into(&ctx, "w", b, layer.clone(), o).unwrap())
            .collect();
        let mats: Vec<(&Vec<f32>, &kernels::GpuWeight, &kernels::GpuWeight)> = (0..3)
            .map(|i| (&stored[i].0, &apart[i], &together[i]))
            .collect();
        for (layout, one) in LAYOUTS.into_iter().flat_map(|l| [(l, false), (l, true)]) {
            ctx.matmul_layout = layout;
            for (t_count, tt) in [(1usize, 1u32), (11, 8)] {
                let x = rng.vec(t_count * cols, 1.0);
                let xb = ctx.storage_with("x", f32s(&x)).unwrap();
                let step = step_buffer(&ctx, t_count as u32);
                for acc in [false, true] {
                    let bases: Vec<Vec<f32>> =
                        rows.iter().map(|&r| rng.vec(t_count * r, 1.0)).collect();
                    let ys: Vec<_> = bases
                        .iter()
                        .map(|b| ctx.storage_with("y", f32s(b)).unwrap())
                        .collect();
                    let products: Vec<kernels::Product> = (0..3)
                        .map(|i| kernels::Product {
                            w: if one { mats[i].2 } else { mats[i].1 },
                            y: &ys[i],
                            y_stride: rows[i] as u32,
                        })
                        .collect();
                    assert!(kernels::multi_fits(&products));
                    let io = MatmulIo {
                        x_stride: cols as u32,
                        accumulate: acc,
                        token_tile: tt,
                        ..Default::default()
                    };
                    let d = kernels::matmul_multi(&ctx, &step, &products, None, &xb, io).unwrap();
                    run(&ctx, &[d], t_count as u32);
                    for i in 0..3 {
                        let y = ctx.read_f32(&ys[i], t_count * rows[i]).unwrap();
                        let zero = vec![0f32; t_count * rows[i]];
                        let what = format!(
                            "{ty} {layout:?} one buffer {one} product {i} T={t_count} tt={tt} acc={acc}"
                        );
                        let base = if acc { &bases[i] } else { &zero };
                        check(&y, mats[i].0, &x, rows[i], cols, base, &what);
                    }
                }
            }
        }
        // Products of different types or widths do not share a dispatch.
        let other = kernels::upload_weight(
            &ctx,
            "w",
            GgmlType::F32,
            3,
            cols as u32,
            &vec![0u8; 3 * cols * 4],
        )
        .unwrap();
        let y = ctx.storage("y", 64).unwrap();
        let mixed = [
            kernels::Product {
                w: mats[0].1,
                y: &y,
                y_stride: 1,
            },
            kernels::Product {
                w: mats[1].1,
                y: &y,
                y_stride: 1,
            },
            kernels::Product {
                w: &other,
                y: &y,
                y_stride: 1,
            },
        ];
        assert_eq!(kernels::multi_fits(&mixed), ty == GgmlType::F32);
    }
    ctx.check().unwrap();
}

/// Products that apply the RMSNorm of X themselves (X the residual, the norm's weights bound
/// beside it) against the CPU reference's RMSNorm then product: single, gated and the three
/// products of one dispatch; decode and prefill tiles; the CPU layout (where the fusion runs).
#[test]
fn matmul_fused_norm_matches_norm_then_product() {
    let Some(mut ctx) = common::gpu() else { return };
    ctx.matmul_layout = MatmulLayout::CPU;
    if !kernels::norm_fusion_available(&ctx) {
        assert!(
            !common::in_ci() || !ctx.subgroups8,
            "no fusion with 8-wide subgroups"
        );
        return;
    }
    let mut rng = Rng(41);
    let eps = 1e-5f32;
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        assert!(kernels::norm_fuses(&ctx, ty));
        // Q4_1 with 13 blocks, Q8_0 with 18: rows read as streams of vec4s (groups of 4 and 8
        // blocks), then the last blocks as words.
        let cols = match ty {
            GgmlType::Q4_1 => 32 * 13,
            GgmlType::Q8_0 => 32 * 18,
            _ => ty.block_len().max(32) as usize * 3,
        };
        let rows = [70usize, 37, 5];
        let mats: Vec<(Vec<f32>, kernels::GpuWeight)> = rows
            .iter()
            .map(|&r| {
                let b = quant::quantize(ty, &rng.vec(r * cols, 1.0));
                let d = quant::dequantize_to_vec(ty, &b, r * cols);
                let w = kernels::upload_weight(&ctx, "w", ty, r as u32, cols as u32, &b).unwrap();
                (d, w)
            })
            .collect();
        let g: Vec<f32> = (0..cols).map(|_| 0.5 + rng.f32().abs()).collect();
        let gb = ctx.storage_with("g", f32s(&g)).unwrap();
        let norm = Some(kernels::Norm { w: &gb, eps });
        for (t_count, tt) in [(1usize, 1u32), (11, 8)] {
            // Residuals of varied scale, so the norm matters.
            let x: Vec<f32> = rng
                .vec(t_count * cols, 1.0)
                .iter()
                .enumerate()
                .map(|(i, v)| v * (1.0 + (i / cols) as f32))
                .collect();
            let xn: Vec<f32> = (0..t_count)
                .flat_map(|t| ops::rmsnorm(&x[t * cols..(t + 1) * cols], &g, eps))
                .collect();
            let xb = ctx.storage_with("x", f32s(&x)).unwrap();
            let step = step_buffer(&ctx, t_count as u32);
            let io = |ys: usize| MatmulIo {
                x_stride: cols as u32,
                y_stride: ys as u32,
                token_tile: tt,
                ..Default::default()
            };
            let what = |k: &str| format!("{ty} {k} T={t_count} tt={tt}");
            let zero = |r: usize| vec![0f32; t_count * r];
            // One product.
            let yb = ctx.storage("y", (t_count * rows[0] * 4) as u64).unwrap();
            let list =
                kernels::matmul_normed(&ctx, &step, &mats[0].1, None, norm, &xb, &yb, io(rows[0]))
                    .unwrap();
            run(&ctx, &list, t_count as u32);
            let y = ctx.read_f32(&yb, t_count * rows[0]).unwrap();
            check(
                &y,
                &mats[0].0,
                &xn,
                rows[0],
                cols,
                &zero(rows[0]),
                &what("single"),
            );
            // Three in one dispatch.
            let ys: Vec<_> = rows
                .iter()
                .map(|&r| ctx.storage("y", (t_count * r * 4) as u64).unwrap())
                .collect();
            let products: Vec<kernels::Product> = (0..3)
                .map(|i| kernels::Product {
                    w: &mats[i].1,
                    y: &ys[i],
                    y_stride: rows[i] as u32,
                })
                .collect();
            let d = kernels::matmul_multi(&ctx, &step, &products, norm, &xb, io(0)).unwrap();
            run(&ctx, &[d], t_count as u32);
            for i in 0..3 {
                let y = ctx.read_f32(&ys[i], t_count * rows[i]).unwrap();
                check(
                    &y,
                    &mats[i].0,
                    &xn,
                    rows[i],
                    cols,
                    &zero(rows[i]),
                    &what("multi"),
                );
            }
            // Gated: the norm applies to both products before the activation.
            let (bg, bu) = (&mats[1], &mats[1]);
            let hb = ctx.storage("h", (t_count * rows[1] * 4) as u64).unwrap();
            let list = kernels::matmul_normed(
                &ctx,
                &step,
                &bg.1,
                Some((&bu.1, kernels::Gate::Silu)),
                norm,
                &xb,
                &hb,
                io(rows[1]),
            )
            .unwrap();
            run(&ctx, &list, t_count as u32);
            let h = ctx.read_f32(&hb, t_count * rows[1]).unwrap();
            for t in 0..t_count {
                let xt = &xn[t * cols..(t + 1) * cols];
                let a = ops::matvec(&bg.0, rows[1], cols, xt);
                let want = ops::swiglu(&a, &a);
                for r in 0..rows[1] {
                    let tol = 1e-4 * want[r].abs().max(1.0) * (cols as f32).sqrt();
                    assert!(
                        (h[t * rows[1] + r] - want[r]).abs() <= tol,
                        "{} t={t} r={r}: {} vs {}",
                        what("gated"),
                        h[t * rows[1] + r],
                        want[r]
                    );
                }
            }
        }
    }
    // A float product cannot normalize its input: an error, not a wrong result.
    let f = kernels::upload_weight(&ctx, "w", GgmlType::F32, 2, 32, &[0u8; 256]).unwrap();
    let g = ctx.storage("g", 128).unwrap();
    let x = ctx.storage("x", 128).unwrap();
    let y = ctx.storage("y", 64).unwrap();
    let step = step_buffer(&ctx, 1);
    let io = MatmulIo {
        x_stride: 32,
        y_stride: 2,
        token_tile: 1,
        ..Default::default()
    };
    let norm = Some(kernels::Norm { w: &g, eps });
    assert!(kernels::matmul_normed(&ctx, &step, &f, None, norm, &x, &y, io).is_err());
}
