//! Matrix products: Y (+)= W X for every weight type, the gated FFN form, and the fused
//! RMSNorm of X, over weights split into parts that each fit a binding.

use bytemuck::{Pod, Zeroable};

use super::{BufAt, Dispatch, GpuWeight, KernelError, TokenAxis, make_dispatch_at, params_buffer};
use crate::gguf::GgmlType;
use crate::gpu::{Defines, GpuContext};

/// Device bytes of one matrix dispatch's parameters.
pub const MATMUL_PARAMS_BYTES: u64 = std::mem::size_of::<MatmulParams>() as u64;

/// The matrix kernel's defines that select the weight type: its name, plus `EXT` for the types
/// decoded in `shaders/matmul_quant.wgsl` and `SUPER` for the 256-weight super-block types.
pub fn weight_type_defines(ty: GgmlType) -> Defines {
    let mut d = Defines::new().flag(ty.name());
    if ty.is_quantized() && !matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
        d = d.flag("EXT");
        if ty.block_len() > 32 {
            d = d.flag("SUPER");
        }
    }
    d
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(super) struct MatmulParams {
    pub(super) rows: u32,
    pub(super) cols: u32,
    pub(super) row_bytes: u32,
    pub(super) x_stride: u32,
    pub(super) y_stride: u32,
    pub(super) y_offset: u32,
    pub(super) y_at_pos: u32,
    pub(super) x_offset: u32,
    pub(super) n_tokens: u32,
    pub(super) w_row0: u32,
    pub(super) w2_row0: u32,
    /// RMSNorm epsilon (f32 bits) of a product that normalizes its X.
    pub(super) eps: u32,
}

/// Where a matrix product reads and writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct MatmulIo {
    /// Floats between consecutive tokens in X and Y.
    pub x_stride: u32,
    pub y_stride: u32,
    /// Float offsets of token 0 in X and of row 0 in Y.
    pub x_offset: u32,
    pub y_offset: u32,
    /// Write at rows pos0 + t of Y (a KV cache) instead of row t.
    pub y_at_pos: bool,
    /// Add into Y (fused residual).
    pub accumulate: bool,
    /// Use this token count instead of the step's (0: the step's).
    pub n_tokens: u32,
    /// Tokens per workgroup: 1 for decode, [`MM_PREFILL_TT`] for prefill.
    pub token_tile: u32,
}

/// Y = W X (or Y += W X), one dispatch per part of W.
pub fn matmul(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuWeight,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Vec<Dispatch>, KernelError> {
    matmul_impl(ctx, step, w, None, None, x, y, io)
}

/// Y = silu(Wg X) * (Wu X): the fused gate/up projection of a SwiGLU FFN.
pub fn matmul_swiglu(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    wg: &GpuWeight,
    wu: &GpuWeight,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Vec<Dispatch>, KernelError> {
    matmul_gated(ctx, step, wg, wu, x, y, io, Gate::Silu)
}

/// Y = act(Wg X) * (Wu X) for a gated FFN with activation `act`.
#[allow(clippy::too_many_arguments)]
pub fn matmul_gated(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    wg: &GpuWeight,
    wu: &GpuWeight,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
    act: Gate,
) -> Result<Vec<Dispatch>, KernelError> {
    matmul_normed(ctx, step, wg, Some((wu, act)), None, x, y, io)
}

/// The activation of a gated product: `act(W X) * (W2 X)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
}

/// [`matmul`] or, with `w2`, [`matmul_gated`], normalizing X first when `norm` is given
/// (only where [`norm_fuses`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_normed(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuWeight,
    w2: Option<(&GpuWeight, Gate)>,
    norm: Option<Norm<'_>>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Vec<Dispatch>, KernelError> {
    if let Some((wu, _)) = w2
        && (w.ty != wu.ty
            || w.rows != wu.rows
            || w.cols != wu.cols
            || w.parts.len() != wu.parts.len())
    {
        return Err(KernelError::Shape {
            kernel: "matmul_swiglu",
            problem: "gate and up weights differ in type or shape".into(),
        });
    }
    matmul_impl(ctx, step, w, w2, norm, x, y, io)
}

#[allow(clippy::too_many_arguments)]
fn matmul_impl(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuWeight,
    w2: Option<(&GpuWeight, Gate)>,
    norm: Option<Norm<'_>>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Vec<Dispatch>, KernelError> {
    let mut out = Vec::with_capacity(w.parts.len());
    for (i, p) in w.parts.iter().enumerate() {
        let part = WeightPart {
            ty: w.ty,
            cols: w.cols,
            row_bytes: w.row_bytes,
            buffer: w.bind(i),
            first_row: p.r0,
            rows: p.n,
            buf_row: 0,
        };
        let second = w2.map(|(w2, act)| SecondWeight {
            buffer: w2.bind(i),
            buf_row: 0,
            act,
        });
        out.push(matmul_part_with(ctx, step, &part, second, norm, x, y, io)?);
    }
    Ok(out)
}

/// The second weight of a gated product: its buffer (from the offset its row 0 is at), the row
/// in it that matches the first weight's first row, and the activation.
#[derive(Clone, Copy)]
pub struct SecondWeight<'a> {
    pub buffer: BufAt<'a>,
    pub buf_row: u32,
    pub act: Gate,
}

/// `rows` rows of a weight matrix held in one buffer (bound from the offset its row 0 is at),
/// starting at row `buf_row` there; they land at rows [first_row, first_row + rows) of Y.
#[derive(Clone, Copy)]
pub struct WeightPart<'a> {
    pub ty: GgmlType,
    pub cols: u32,
    pub row_bytes: u32,
    pub buffer: BufAt<'a>,
    pub first_row: u32,
    pub rows: u32,
    pub buf_row: u32,
}

/// The matrix kernel's defines for weights of type `ty` and `cols` columns read as `io` says
/// (`gate`: the gated form).
pub(super) fn matmul_defines(
    ctx: &GpuContext,
    ty: GgmlType,
    cols: u32,
    io: MatmulIo,
    gate: Option<Gate>,
) -> Result<Defines, KernelError> {
    matmul_defines_rpl(ctx, ty, cols, io, gate, ctx.matmul_layout.rows_per_lane)
}

/// [`matmul_defines`] with `rpl` rows a thread in decode in place of the layout's.
pub(super) fn matmul_defines_rpl(
    ctx: &GpuContext,
    ty: GgmlType,
    cols: u32,
    io: MatmulIo,
    gate: Option<Gate>,
    rpl: u32,
) -> Result<Defines, KernelError> {
    let tt = io.token_tile.max(1);
    let layout = ctx.matmul_layout;
    if !u64::from(cols).is_multiple_of(ty.block_len()) {
        return Err(KernelError::Shape {
            kernel: "matmul",
            problem: format!(
                "{} columns is not a multiple of the {} block length {}",
                cols,
                ty,
                ty.block_len()
            ),
        });
    }
    if layout.tpr > 1 && tt > layout.tpr {
        return Err(KernelError::Shape {
            kernel: "matmul",
            problem: format!("token tile {tt} exceeds {} threads per row", layout.tpr),
        });
    }
    let mut defines = weight_type_defines(ty)
        .val("ROWS_PER_WG", format!("{}u", layout.rows_per_wg))
        .val("TPR", format!("{}u", layout.tpr))
        .val("TT", format!("{tt}u"));
    if layout.tpr > 1 {
        defines = defines.flag("REDUCE");
    }
    if ty.is_quantized()
        && layout.tpr == 1
        && tt <= 8
        && io.x_offset.is_multiple_of(4)
        && io.x_stride.is_multiple_of(4)
    {
        defines = defines.flag("BLOCKS");
        // Loads of 16 bytes (X, norm weights, streamed weight rows) as two 64-bit words: half
        // the loads on CPU rasterizers, split back into words in the shader.
        if layout.load64 && ctx.int64 {
            defines = defines.flag("W64");
        }
        // Broadcasts need every lane of a subgroup: whole subgroups of 8 per workgroup.
        if layout.share_x && ctx.subgroups8 && layout.rows_per_wg.is_multiple_of(8) {
            defines = defines.flag("SHARE_X");
        }
        // Prefill products with two rows a thread (half the workgroup's rows apart, so its
        // threads stay whole subgroups of 8).
        if tt > 1 && layout.prefill_rows_per_lane == 2 && layout.rows_per_wg.is_multiple_of(16) {
            defines = defines.flag("PAIR");
        }
        // Decode with several rows a thread (at most 4), or Q4_1 / Q8_0 rows read as streams
        // of vec4s (one row a thread or more): whole subgroups of threads.
        // Streams need word-aligned rows (Q8_0: an even number of 34-byte blocks).
        let wide = layout.load_words >= 4
            && (ty == GgmlType::Q4_1 || (ty == GgmlType::Q8_0 && (cols / 32).is_multiple_of(2)));
        if tt == 1
            && ty.block_len() == 32
            && ((2..=4).contains(&rpl) || (rpl == 1 && wide))
            && layout.rows_per_wg.is_multiple_of(rpl * 8)
        {
            defines = defines.flag("ROWS").val("RPL", format!("{rpl}u"));
            if wide {
                // Row starts are multiples of the row's words' largest power-of-two factor
                // (up to 4): the loads then need no (or only a two-word) shift.
                let words = ty.bytes_for(u64::from(cols)).unwrap_or(0) / 4;
                let ra = [4, 2, 1]
                    .into_iter()
                    .find(|a| words.is_multiple_of(*a))
                    .unwrap_or(1);
                defines = defines.flag("WIDE").val("RA", format!("{ra}u"));
                if layout.touch_bytes > 0 {
                    defines = defines.val("TOUCH", format!("{}u", layout.touch_bytes));
                }
            }
        }
    }
    if matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && !cols.is_multiple_of(8) {
        defines = defines.flag("RAGGED");
    }
    if io.accumulate {
        defines = defines.flag("ACC");
    }
    if let Some(act) = gate {
        defines = defines.flag("SWIGLU");
        if act == Gate::GeluTanh {
            defines = defines.flag("GELU");
        }
    }
    Ok(defines)
}

/// `defines` with the fused norm, or an error where the device cannot fuse it for `ty`.
pub(super) fn norm_defines(
    ctx: &GpuContext,
    ty: GgmlType,
    defines: Defines,
) -> Result<Defines, KernelError> {
    if !norm_fuses(ctx, ty) {
        return Err(KernelError::Shape {
            kernel: "matmul",
            problem: format!("this device's {ty} products cannot normalize their input"),
        });
    }
    Ok(defines.flag("NORM"))
}

/// One dispatch of Y (+)= W X over a part of W (rows land at `first_row` of Y); with `w2`, the
/// gated form `act(W X) * (W2 X)` over the matching rows of the second weight.
pub fn matmul_part(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &WeightPart<'_>,
    w2: Option<SecondWeight<'_>>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Dispatch, KernelError> {
    matmul_part_with(ctx, step, w, w2, None, x, y, io)
}

/// The RMSNorm a product applies to its X itself (see [`norm_fuses`]): X is the residual,
/// `w` the norm's weights.
#[derive(Clone, Copy)]
pub struct Norm<'a> {
    pub w: &'a wgpu::Buffer,
    pub eps: f32,
}

/// Whether the matrix kernels can apply an RMSNorm of X themselves on this device for weights
/// of type `ty`: the block path with X shared through 8-wide subgroups.
pub fn norm_fuses(ctx: &GpuContext, ty: GgmlType) -> bool {
    norm_fusion_available(ctx) && ty.is_quantized()
}

/// Whether this device's matrix kernels can fuse an RMSNorm for some weight type.
pub fn norm_fusion_available(ctx: &GpuContext) -> bool {
    let l = ctx.matmul_layout;
    l.tpr == 1 && l.share_x && ctx.subgroups8 && l.rows_per_wg.is_multiple_of(8)
}

/// [`matmul_part`], normalizing X first when `norm` is given (only where [`norm_fuses`]).
#[allow(clippy::too_many_arguments)]
pub fn matmul_part_with(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &WeightPart<'_>,
    w2: Option<SecondWeight<'_>>,
    norm: Option<Norm<'_>>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Dispatch, KernelError> {
    let mut defines = matmul_defines(ctx, w.ty, w.cols, io, w2.map(|s| s.act))?;
    if norm.is_some() {
        defines = norm_defines(ctx, w.ty, defines)?;
    }
    let layout = ctx.matmul_layout;
    let tt = io.token_tile.max(1);
    let pipeline = ctx.pipelines.get(&ctx.device, "matmul", "main", &defines)?;
    let p = MatmulParams {
        rows: w.rows,
        cols: w.cols,
        row_bytes: w.row_bytes,
        x_stride: io.x_stride,
        y_stride: io.y_stride,
        y_offset: io.y_offset + w.first_row,
        y_at_pos: io.y_at_pos as u32,
        x_offset: io.x_offset,
        n_tokens: io.n_tokens,
        w_row0: w.buf_row,
        w2_row0: w2.map(|s| s.buf_row).unwrap_or(0),
        eps: norm.map_or(0, |n| n.eps.to_bits()),
    };
    let params = params_buffer(ctx, "matmul params", &p)?;
    let mut grid = [w.rows.div_ceil(layout.rows_per_wg), 1, 1];
    let mut bufs: Vec<(u32, BufAt<'_>)> = vec![
        (1, step.into()),
        (2, w.buffer),
        (3, x.into()),
        (4, y.into()),
    ];
    if let Some(w2) = &w2 {
        bufs.push((5, w2.buffer));
    }
    if let Some(n) = &norm {
        bufs.push((10, n.w.into()));
    }
    let axis = if io.n_tokens != 0 {
        grid[1] = io.n_tokens.div_ceil(tt);
        TokenAxis::Fixed
    } else {
        TokenAxis::Y(tt)
    };
    let label = match (&w2, io.accumulate) {
        (Some(_), _) => "matmul gated",
        (None, true) => "matmul +residual",
        (None, false) => "matmul",
    };
    let mut d = make_dispatch_at(ctx, label, pipeline, params, &bufs, grid, axis);
    d.bytes = w.rows as u64 * w.row_bytes as u64 * if w2.is_some() { 2 } else { 1 };
    Ok(d)
}
