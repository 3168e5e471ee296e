//! Three matrix products of one X in one dispatch: Q, K and V (or any three weights of one
//! type and width), each written to its own Y. Saves the dispatches, and spreads three
//! small matrices over the device as one.

use bytemuck::{Pod, Zeroable};

use super::matmul::{MatmulParams, matmul_defines_rpl, norm_defines};
use super::{
    BufAt, Dispatch, GpuWeight, KernelError, MatmulIo, Norm, TokenAxis, make_dispatch_at,
    params_buffer,
};
use crate::gguf::GgmlType;
use crate::gpu::GpuContext;

/// Products one dispatch carries.
pub const MULTI_MAX: usize = 3;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Segs {
    rows: [u32; 4],
    wg0: [u32; 4],
    row0: [u32; 4],
    y_stride: [u32; 4],
    y_offset: [u32; 4],
    base: [u32; 4],
}

/// Device bytes of a multi-product dispatch's parameters (both uniforms).
pub const MULTI_PARAMS_BYTES: u64 =
    (std::mem::size_of::<MatmulParams>() + std::mem::size_of::<Segs>()) as u64;

/// One product of a [`matmul_multi`]: its weight, its Y and the floats between tokens in Y.
pub struct Product<'a> {
    pub w: &'a GpuWeight,
    pub y: &'a wgpu::Buffer,
    pub y_stride: u32,
}

/// Whether matrices given as (type, columns, row bytes, parts) can share one dispatch: exactly
/// three of one type and width, each in one buffer.
pub fn multi_shareable(mats: &[(GgmlType, u32, u32, usize)]) -> bool {
    let Some(&(ty, cols, rb, _)) = mats.first() else {
        return false;
    };
    mats.len() == MULTI_MAX
        && mats
            .iter()
            .all(|&(t, c, r, parts)| t == ty && c == cols && r == rb && parts == 1)
}

/// [`multi_shareable`] for the products' weights.
pub fn multi_fits(products: &[Product<'_>]) -> bool {
    let mats: Vec<_> = products
        .iter()
        .map(|p| (p.w.ty, p.w.cols, p.w.row_bytes, p.w.parts.len()))
        .collect();
    multi_shareable(&mats)
}

/// Where the products' weights start in the one buffer they all lie in, in bytes, when they do
/// (one part each, at offsets the kernel can read as vec4s, in a buffer that fits a binding).
fn one_buffer(products: &[Product<'_>], max_binding: u64) -> Option<[u32; 4]> {
    let buf = &products.first()?.w.parts.first()?.buf;
    let mut base = [0u32; 4];
    for (i, pr) in products.iter().enumerate() {
        let p = pr.w.parts.first()?;
        if pr.w.parts.len() != 1 || !std::sync::Arc::ptr_eq(&p.buf, buf) || p.offset % 16 != 0 {
            return None;
        }
        *base.get_mut(i)? = u32::try_from(p.offset).ok()?;
    }
    (buf.size <= max_binding.min(u64::from(u32::MAX))).then_some(base)
}

/// Y_i (+)= W_i X for each product, in one dispatch (see [`multi_fits`]), normalizing X first
/// when `norm` is given. `io` gives X and the token axis; its `y_stride` and `y_offset` are
/// replaced by each product's.
pub fn matmul_multi(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    products: &[Product<'_>],
    norm: Option<Norm<'_>>,
    x: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Dispatch, KernelError> {
    if !multi_fits(products) {
        return Err(KernelError::Shape {
            kernel: "matmul_multi",
            problem: format!(
                "{} products of differing types, widths or split weights cannot share a dispatch",
                products.len()
            ),
        });
    }
    let first = products[0].w;
    let rpl = ctx.matmul_layout.multi_rows_per_lane;
    let mut defines = matmul_defines_rpl(ctx, first.ty, first.cols, io, None, rpl)?.flag("MULTI");
    let one = one_buffer(products, ctx.max_binding());
    if one.is_some() {
        defines = defines.flag("ONEBUF");
    }
    if norm.is_some() {
        defines = norm_defines(ctx, first.ty, defines)?;
    }
    let pipeline = ctx.pipelines.get(&ctx.device, "matmul", "main", &defines)?;
    let rpw = ctx.matmul_layout.rows_per_wg;
    let tt = io.token_tile.max(1);
    let mut sg = Segs::default();
    let mut wg = 0u32;
    for (i, pr) in products.iter().enumerate() {
        sg.rows[i] = pr.w.rows;
        sg.wg0[i] = wg;
        sg.row0[i] = 0;
        sg.y_stride[i] = pr.y_stride;
        sg.y_offset[i] = io.y_offset + pr.w.parts[0].r0;
        sg.base[i] = one.map_or(0, |b| b[i]);
        wg += pr.w.rows.div_ceil(rpw);
    }
    let p = MatmulParams {
        rows: first.rows,
        cols: first.cols,
        row_bytes: first.row_bytes,
        x_stride: io.x_stride,
        y_stride: products[0].y_stride,
        y_offset: io.y_offset,
        y_at_pos: io.y_at_pos as u32,
        x_offset: io.x_offset,
        n_tokens: io.n_tokens,
        w_row0: 0,
        w2_row0: 0,
        eps: norm.map_or(0, |n| n.eps.to_bits()),
    };
    let params = params_buffer(ctx, "matmul params", &p)?;
    let segs = params_buffer(ctx, "matmul segments", &sg)?;
    let mut bufs: Vec<(u32, BufAt<'_>)> = vec![
        (1, step.into()),
        (3, x.into()),
        (4, products[0].y.into()),
        (7, products[1].y.into()),
        (8, products[2].y.into()),
        (9, (&*segs).into()),
    ];
    if one.is_some() {
        // The whole buffer the three lie in (it fits one binding: a layer's buffer).
        bufs.push((2, (&products[0].w.parts[0].buf.buffer).into()));
    } else {
        bufs.push((2, products[0].w.bind(0)));
        bufs.push((5, products[1].w.bind(0)));
        bufs.push((6, products[2].w.bind(0)));
    }
    if let Some(n) = &norm {
        bufs.push((10, n.w.into()));
    }
    let mut grid = [wg, 1, 1];
    let axis = if io.n_tokens != 0 {
        grid[1] = io.n_tokens.div_ceil(tt);
        TokenAxis::Fixed
    } else {
        TokenAxis::Y(tt)
    };
    let mut d = make_dispatch_at(ctx, "matmul qkv", pipeline, params, &bufs, grid, axis);
    d.bytes = products
        .iter()
        .map(|pr| pr.w.rows as u64 * pr.w.row_bytes as u64)
        .sum();
    d.keep(segs);
    Ok(d)
}
