//! Typed wrappers over `shaders/*.wgsl`.
//!
//! Each builder validates its sizes, writes its static parameters once into a small uniform
//! buffer, and returns [`Dispatch`]es: a cached pipeline, a bind group and a workgroup grid.
//! Values that change per forward pass (token count, first position) come from the shared
//! `Step` uniform, so a built dispatch list is replayed token after token without rebuilding.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use thiserror::Error;

use crate::gguf::GgmlType;
use crate::gpu::{Defines, GpuBuffer, GpuContext, GpuError};

/// Rows per workgroup of the matrix kernels on GPUs (the fewest of any layout).
pub const MM_ROWS_PER_WG: u32 = 4;
/// Most threads per row of the matrix kernels.
pub const MM_TPR: u32 = 16;
/// Tokens per workgroup of the prefill matrix kernel.
pub const MM_PREFILL_TT: u32 = 8;
const MAX_WORKGROUPS: u32 = 65_535;

#[derive(Debug, Error)]
pub enum KernelError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{kernel}: {problem}")]
    Shape {
        kernel: &'static str,
        problem: String,
    },
}

/// The per-forward values every kernel reads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct Step {
    pub n_tokens: u32,
    pub pos0: u32,
    pub _pad: [u32; 2],
}

/// How the batch's token count maps onto the workgroup grid.
#[derive(Clone, Copy, Debug)]
enum TokenAxis {
    /// Fixed grid.
    Fixed,
    /// Grid x is ceil(T / tile) (x holds the base count 1).
    X(u32),
    /// Grid y is ceil(T / tile).
    Y(u32),
}

/// One recorded compute dispatch.
pub struct Dispatch {
    pub label: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
    axis: TokenAxis,
    _params: GpuBuffer,
}

impl Dispatch {
    /// Record into a compute pass for a batch of `n_tokens` tokens.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        let mut g = self.grid;
        match self.axis {
            TokenAxis::Fixed => {}
            TokenAxis::X(tile) => g[0] = n_tokens.div_ceil(tile),
            TokenAxis::Y(tile) => g[1] = n_tokens.div_ceil(tile),
        }
        if g.contains(&0) {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(g[0], g[1], g[2]);
    }
}

/// Record a list of dispatches in one compute pass.
pub fn record_all(encoder: &mut wgpu::CommandEncoder, list: &[Dispatch], n_tokens: u32) {
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some("forward"),
        timestamp_writes: None,
    });
    for d in list {
        d.record(&mut pass, n_tokens);
    }
}

/// A weight matrix on the device, stored as in the file, split into parts of whole rows so each
/// part fits one storage binding and one dispatch grid.
pub struct GpuWeight {
    pub ty: GgmlType,
    pub rows: u32,
    pub cols: u32,
    pub row_bytes: u32,
    /// (buffer, first row, row count)
    pub parts: Vec<(GpuBuffer, u32, u32)>,
}

impl GpuWeight {
    pub fn bytes(&self) -> u64 {
        self.rows as u64 * self.row_bytes as u64
    }
}

/// Bytes per stored row of a `cols`-wide matrix of type `ty`.
pub fn row_bytes(ty: GgmlType, cols: u32) -> Option<u32> {
    let b = ty.bytes_for(cols as u64)?;
    u32::try_from(b).ok()
}

/// Upload a weight matrix (`rows` x `cols`, stored bytes `data`) as one or more parts.
pub fn upload_weight(
    ctx: &GpuContext,
    label: &str,
    ty: GgmlType,
    rows: u32,
    cols: u32,
    data: &[u8],
) -> Result<GpuWeight, KernelError> {
    let shape = |problem: String| KernelError::Shape {
        kernel: "upload_weight",
        problem,
    };
    if !u64::from(cols).is_multiple_of(ty.block_len()) {
        return Err(shape(format!(
            "{label}: {cols} columns is not a multiple of the {ty} block length {}",
            ty.block_len()
        )));
    }
    let rb = row_bytes(ty, cols).ok_or_else(|| shape(format!("{label}: row size overflows")))?;
    if data.len() as u64 != rows as u64 * rb as u64 {
        return Err(shape(format!(
            "{label}: {} bytes given, {} expected",
            data.len(),
            rows as u64 * rb as u64
        )));
    }
    let max_bind = ctx.max_binding().min(u32::MAX as u64);
    // Keep a little slack for the 2-byte over-reads of unaligned block formats.
    let rows_fit = ((max_bind.saturating_sub(16)) / rb.max(1) as u64).max(1);
    let rows_per_part = rows_fit.min((MAX_WORKGROUPS * MM_ROWS_PER_WG) as u64) as u32;
    if (rb as u64) + 16 > max_bind {
        return Err(shape(format!(
            "{label}: one row of {rb} bytes exceeds the binding limit {max_bind}"
        )));
    }
    let mut parts = Vec::new();
    let mut r0 = 0u32;
    while r0 < rows {
        let n = rows_per_part.min(rows - r0);
        let a = r0 as usize * rb as usize;
        let b = a + n as usize * rb as usize;
        let buf = ctx.storage_with(&format!("{label}[{r0}..]"), &data[a..b])?;
        parts.push((buf, r0, n));
        r0 += n;
    }
    Ok(GpuWeight {
        ty,
        rows,
        cols,
        row_bytes: rb,
        parts,
    })
}

fn type_flag(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::F32 => "F32",
        GgmlType::F16 => "F16",
        GgmlType::BF16 => "BF16",
        GgmlType::Q4_0 => "Q4_0",
        GgmlType::Q4_1 => "Q4_1",
        GgmlType::Q8_0 => "Q8_0",
        GgmlType::Q5_0 => "Q5_0",
        GgmlType::Q5_1 => "Q5_1",
        GgmlType::Q2_K => "Q2_K",
        GgmlType::Q3_K => "Q3_K",
        GgmlType::Q4_K => "Q4_K",
        GgmlType::Q5_K => "Q5_K",
        GgmlType::Q6_K => "Q6_K",
        GgmlType::IQ4_NL => "IQ4_NL",
        GgmlType::IQ4_XS => "IQ4_XS",
    }
}

/// The matrix kernel's defines that select the weight type: its name, plus `EXT` for the types
/// decoded in `shaders/matmul_quant.wgsl` and `SUPER` for the 256-weight super-block types.
pub fn weight_type_defines(ty: GgmlType) -> Defines {
    let mut d = Defines::new().flag(type_flag(ty));
    if ty.is_quantized() && !matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
        d = d.flag("EXT");
        if ty.block_len() > 32 {
            d = d.flag("SUPER");
        }
    }
    d
}

fn params_buffer<T: Pod>(ctx: &GpuContext, label: &str, p: &T) -> Result<GpuBuffer, GpuError> {
    let buf = ctx.buffer(
        label,
        std::mem::size_of::<T>() as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    )?;
    ctx.write(&buf, 0, bytemuck::bytes_of(p));
    Ok(buf)
}

fn make_dispatch(
    ctx: &GpuContext,
    label: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    params: GpuBuffer,
    buffers: &[&wgpu::Buffer],
    grid: [u32; 3],
    axis: TokenAxis,
) -> Dispatch {
    let layout = pipeline.get_bind_group_layout(0);
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: params.as_entire_binding(),
    }];
    for (i, b) in buffers.iter().enumerate() {
        entries.push(wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource: b.as_entire_binding(),
        });
    }
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &layout,
        entries: &entries,
    });
    Dispatch {
        label,
        pipeline,
        bind_group,
        grid,
        axis,
        _params: params,
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct MatmulParams {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    y_offset: u32,
    y_at_pos: u32,
    x_offset: u32,
    n_tokens: u32,
    _pad: [u32; 3],
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
    matmul_impl(ctx, step, w, None, x, y, io)
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
    if wg.ty != wu.ty
        || wg.rows != wu.rows
        || wg.cols != wu.cols
        || wg.parts.len() != wu.parts.len()
    {
        return Err(KernelError::Shape {
            kernel: "matmul_swiglu",
            problem: "gate and up weights differ in type or shape".into(),
        });
    }
    matmul_impl(ctx, step, wg, Some(wu), x, y, io)
}

fn matmul_impl(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &GpuWeight,
    w2: Option<&GpuWeight>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Vec<Dispatch>, KernelError> {
    let mut out = Vec::with_capacity(w.parts.len());
    for (i, (buf, r0, n)) in w.parts.iter().enumerate() {
        let part = WeightPart {
            ty: w.ty,
            cols: w.cols,
            row_bytes: w.row_bytes,
            buffer: buf,
            first_row: *r0,
            rows: *n,
        };
        let second = w2.map(|w2| &*w2.parts[i].0);
        out.push(matmul_part(ctx, step, &part, second, x, y, io)?);
    }
    Ok(out)
}

/// Rows [first_row, first_row + rows) of a weight matrix held in one buffer.
#[derive(Clone, Copy)]
pub struct WeightPart<'a> {
    pub ty: GgmlType,
    pub cols: u32,
    pub row_bytes: u32,
    pub buffer: &'a wgpu::Buffer,
    pub first_row: u32,
    pub rows: u32,
}

/// One dispatch of Y (+)= W X over a part of W (rows land at `first_row` of Y); with `w2`, the
/// fused SwiGLU form over the matching part of the up projection.
pub fn matmul_part(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    w: &WeightPart<'_>,
    w2: Option<&wgpu::Buffer>,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    io: MatmulIo,
) -> Result<Dispatch, KernelError> {
    let tt = io.token_tile.max(1);
    let layout = ctx.matmul_layout;
    if !u64::from(w.cols).is_multiple_of(w.ty.block_len()) {
        return Err(KernelError::Shape {
            kernel: "matmul",
            problem: format!(
                "{} columns is not a multiple of the {} block length {}",
                w.cols,
                w.ty,
                w.ty.block_len()
            ),
        });
    }
    if layout.tpr > 1 && tt > layout.tpr {
        return Err(KernelError::Shape {
            kernel: "matmul",
            problem: format!("token tile {tt} exceeds {} threads per row", layout.tpr),
        });
    }
    let mut defines = weight_type_defines(w.ty)
        .val("ROWS_PER_WG", format!("{}u", layout.rows_per_wg))
        .val("TPR", format!("{}u", layout.tpr))
        .val("TT", format!("{tt}u"));
    if layout.tpr > 1 {
        defines = defines.flag("REDUCE");
    }
    if w.ty.is_quantized()
        && layout.tpr == 1
        && tt <= 8
        && io.x_offset.is_multiple_of(4)
        && io.x_stride.is_multiple_of(4)
    {
        defines = defines.flag("BLOCKS");
        // Broadcasts need every lane of a subgroup: whole subgroups of 8 per workgroup.
        if layout.share_x && ctx.subgroups8 && layout.rows_per_wg.is_multiple_of(8) {
            defines = defines.flag("SHARE_X");
        }
    }
    if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) && !w.cols.is_multiple_of(8) {
        defines = defines.flag("RAGGED");
    }
    if io.accumulate {
        defines = defines.flag("ACC");
    }
    if w2.is_some() {
        defines = defines.flag("SWIGLU");
    }
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
        _pad: [0; 3],
    };
    let params = params_buffer(ctx, "matmul params", &p)?;
    let mut grid = [w.rows.div_ceil(layout.rows_per_wg), 1, 1];
    let mut bufs: Vec<&wgpu::Buffer> = vec![step, w.buffer, x, y];
    if let Some(w2) = w2 {
        bufs.push(w2);
    }
    let axis = if io.n_tokens != 0 {
        grid[1] = io.n_tokens.div_ceil(tt);
        TokenAxis::Fixed
    } else {
        TokenAxis::Y(tt)
    };
    Ok(make_dispatch(
        ctx, "matmul", pipeline, params, &bufs, grid, axis,
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct NormParams {
    n: u32,
    x_stride: u32,
    y_stride: u32,
    eps: f32,
    x_offset: u32,
    n_tokens: u32,
    _pad: [u32; 2],
}

/// Y[t] = rmsnorm(X[t]) * w for each token.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: u32,
    eps: f32,
    x_offset: u32,
    n_tokens: u32,
) -> Result<Dispatch, KernelError> {
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "rmsnorm", "main", &Defines::new())?;
    let p = NormParams {
        n,
        x_stride: n,
        y_stride: n,
        eps,
        x_offset,
        n_tokens,
        _pad: [0; 2],
    };
    let params = params_buffer(ctx, "rmsnorm params", &p)?;
    let (grid, axis) = if n_tokens != 0 {
        ([n_tokens, 1, 1], TokenAxis::Fixed)
    } else {
        ([1, 1, 1], TokenAxis::X(1))
    };
    Ok(make_dispatch(
        ctx,
        "rmsnorm",
        pipeline,
        params,
        &[step, x, w, y],
        grid,
        axis,
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct RopeParams {
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    stride: u32,
    offset: u32,
    at_pos: u32,
    neox: u32,
    n_tokens: u32,
}

/// Rotary embedding of `n_heads` heads of X in place; `cs` holds (cos, sin) per token and pair.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    cs: &wgpu::Buffer,
    x: &wgpu::Buffer,
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    stride: u32,
    at_pos: bool,
    neox: bool,
) -> Result<Dispatch, KernelError> {
    if !rope_dim.is_multiple_of(2) || rope_dim > head_dim {
        return Err(KernelError::Shape {
            kernel: "rope",
            problem: format!("rope dim {rope_dim} must be even and at most head dim {head_dim}"),
        });
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "rope", "main", &Defines::new())?;
    let p = RopeParams {
        n_heads,
        head_dim,
        rope_dim,
        stride,
        offset: 0,
        at_pos: at_pos as u32,
        neox: neox as u32,
        n_tokens: 0,
    };
    let params = params_buffer(ctx, "rope params", &p)?;
    let grid = [(n_heads * rope_dim / 2).div_ceil(64), 1, 1];
    Ok(make_dispatch(
        ctx,
        "rope",
        pipeline,
        params,
        &[step, cs, x],
        grid,
        TokenAxis::Y(1),
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct AttnParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    kv_stride: u32,
    o_stride: u32,
    scale: f32,
    n_tokens: u32,
}

/// Causal attention of the batch's queries over the KV cache (positions [0, pos0 + t]); with
/// `kv_f16` the cache holds packed f16 pairs.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    q: &wgpu::Buffer,
    k_cache: &wgpu::Buffer,
    v_cache: &wgpu::Buffer,
    out: &wgpu::Buffer,
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    kv_f16: bool,
) -> Result<Dispatch, KernelError> {
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return Err(KernelError::Shape {
            kernel: "attention",
            problem: format!("{n_heads} heads are not a multiple of {n_kv_heads} KV heads"),
        });
    }
    if kv_f16 && !head_dim.is_multiple_of(2) {
        return Err(KernelError::Shape {
            kernel: "attention",
            problem: format!("an f16 KV cache needs an even head dim, not {head_dim}"),
        });
    }
    let dpt = head_dim.div_ceil(64).max(1);
    let mut defines = Defines::new().val("DPT", format!("{dpt}u"));
    if kv_f16 {
        defines = defines.flag("KV_F16");
    }
    // Q's and the caches' strides are whole heads: all multiples of 4 with the head size.
    if head_dim.is_multiple_of(4) {
        defines = defines.flag("VEC4");
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "attention", "main", &defines)?;
    let p = AttnParams {
        n_heads,
        n_kv_heads,
        head_dim,
        q_stride: n_heads * head_dim,
        kv_stride: n_kv_heads * head_dim,
        o_stride: n_heads * head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        n_tokens: 0,
    };
    let params = params_buffer(ctx, "attention params", &p)?;
    Ok(make_dispatch(
        ctx,
        "attention",
        pipeline,
        params,
        &[step, q, k_cache, v_cache, out],
        [n_heads, 1, 1],
        TokenAxis::Y(1),
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct EltParams {
    n: u32,
    stride: u32,
    offset: u32,
    at_pos: u32,
    n_tokens: u32,
    _pad: [u32; 3],
}

/// Y[t, i] += B[i] for each token row (rows at the cache position when `at_pos`).
pub fn add_bias(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    b: &wgpu::Buffer,
    y: &wgpu::Buffer,
    n: u32,
    stride: u32,
    at_pos: bool,
) -> Result<Dispatch, KernelError> {
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "elementwise", "add_bias", &Defines::new())?;
    let p = EltParams {
        n,
        stride,
        offset: 0,
        at_pos: at_pos as u32,
        n_tokens: 0,
        _pad: [0; 3],
    };
    let params = params_buffer(ctx, "bias params", &p)?;
    Ok(make_dispatch(
        ctx,
        "add_bias",
        pipeline,
        params,
        &[step, b, y],
        [n.div_ceil(64), 1, 1],
        TokenAxis::Y(1),
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct KvParams {
    n: u32,
    _pad: [u32; 3],
}

/// Store the batch's rows of `src` (T x n f32) at cache rows pos0 + t as packed f16.
pub fn kv_store_f16(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    src: &wgpu::Buffer,
    cache: &wgpu::Buffer,
    n: u32,
) -> Result<Dispatch, KernelError> {
    if !n.is_multiple_of(2) {
        return Err(KernelError::Shape {
            kernel: "kv_store_f16",
            problem: format!("row length {n} is odd"),
        });
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "kv", "store_f16", &Defines::new())?;
    let params = params_buffer(ctx, "kv params", &KvParams { n, _pad: [0; 3] })?;
    Ok(make_dispatch(
        ctx,
        "kv_store",
        pipeline,
        params,
        &[step, src, cache],
        [(n / 2).div_ceil(64), 1, 1],
        TokenAxis::Y(1),
    ))
}

/// (cos, sin) of (pos0 + t) * base^(-2i / rope_dim) for t in [0, n_tokens), i in [0, rope_dim/2).
pub fn rope_table(pos0: u32, n_tokens: u32, rope_dim: u32, base: f32) -> Vec<f32> {
    let half = (rope_dim / 2) as usize;
    let mut out = Vec::with_capacity(n_tokens as usize * half * 2);
    for t in 0..n_tokens {
        // In f64: at positions in the thousands an f32 angle is off by ~1e-4 radians.
        let pos = (pos0 + t) as f64;
        for i in 0..half {
            let freq = (base as f64).powf(-((2 * i) as f64) / rope_dim as f64);
            let theta = pos * freq;
            out.push(theta.cos() as f32);
            out.push(theta.sin() as f32);
        }
    }
    out
}
