//! Row-wise kernels: RMSNorm, rotary embedding, bias add, and the host-side RoPE table.

use bytemuck::{Pod, Zeroable};

use super::{
    BufAt, Dispatch, KernelError, TokenAxis, make_dispatch, make_dispatch_at, params_buffer,
};
use crate::gpu::{Defines, GpuContext};

/// Device bytes of one RMSNorm, RoPE or bias dispatch's parameters.
pub const ROW_PARAMS_BYTES: u64 = 32;
const _: () = assert!(std::mem::size_of::<NormParams>() == 32);
const _: () = assert!(std::mem::size_of::<RopeParams>() == 32);
const _: () = assert!(std::mem::size_of::<EltParams>() == 32);

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
    let spec = NormSpec {
        n,
        eps,
        x_offset,
        n_tokens,
        ..Default::default()
    };
    rmsnorm_ext(ctx, step, Some(x), w, y, &spec)
}

/// The shape of an RMSNorm dispatch.
#[derive(Debug, Clone, Copy)]
pub struct NormSpec {
    /// Values normalized together (a row, or one head).
    pub n: u32,
    /// Groups of `n` per token (1: a row; the head count: each head on its own).
    pub heads: u32,
    pub eps: f32,
    pub x_offset: u32,
    /// Token count (0: the step's).
    pub n_tokens: u32,
    /// Add into Y instead of writing it.
    pub acc: bool,
}

impl Default for NormSpec {
    fn default() -> Self {
        Self {
            n: 0,
            heads: 1,
            eps: 1e-6,
            x_offset: 0,
            n_tokens: 0,
            acc: false,
        }
    }
}

/// RMSNorm of each token's `heads` groups of `n` values, weights `w` shared by the groups; reads
/// X (None: normalizes Y in place) and writes (or, with `acc`, adds into) Y.
pub fn rmsnorm_ext(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    x: Option<&wgpu::Buffer>,
    w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    s: &NormSpec,
) -> Result<Dispatch, KernelError> {
    let heads = s.heads.max(1);
    let mut defines = Defines::new();
    if x.is_none() {
        defines = defines.flag("INPLACE");
    }
    if s.acc {
        defines = defines.flag("ACC");
    }
    if ctx.lane_kernels {
        defines = defines.flag("LANES");
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "rmsnorm", "main", &defines)?;
    let stride = s.n.checked_mul(heads).ok_or_else(|| KernelError::Shape {
        kernel: "rmsnorm",
        problem: format!("{} heads of {} overflow", heads, s.n),
    })?;
    let p = NormParams {
        n: s.n,
        x_stride: stride,
        y_stride: stride,
        eps: s.eps,
        x_offset: s.x_offset,
        n_tokens: s.n_tokens,
        _pad: [0; 2],
    };
    let params = params_buffer(ctx, "rmsnorm params", &p)?;
    let (grid, axis) = if s.n_tokens != 0 {
        ([s.n_tokens, heads, 1], TokenAxis::Fixed)
    } else {
        ([1, heads, 1], TokenAxis::X(1))
    };
    let mut bufs: Vec<(u32, BufAt<'_>)> = vec![(1, step.into()), (3, w.into()), (4, y.into())];
    if let Some(x) = x {
        bufs.push((2, x.into()));
    }
    Ok(make_dispatch_at(
        ctx, "rmsnorm", pipeline, params, &bufs, grid, axis,
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

/// (cos, sin) of (pos0 + t) * base^(-2i / rope_dim) for t in [0, n_tokens), i in [0, rope_dim/2).
pub fn rope_table(pos0: u32, n_tokens: u32, rope_dim: u32, base: f32) -> Vec<f32> {
    let positions: Vec<u32> = (0..n_tokens).map(|t| pos0 + t).collect();
    rope_table_at(&positions, rope_dim, base)
}

/// (cos, sin) of pos * base^(-2i / rope_dim) for each position, i in [0, rope_dim/2).
pub fn rope_table_at(positions: &[u32], rope_dim: u32, base: f32) -> Vec<f32> {
    let freqs: Vec<f64> = (0..rope_dim / 2)
        .map(|i| (base as f64).powf(-((2 * i) as f64) / rope_dim as f64))
        .collect();
    rope_table_freqs(positions, &freqs, 1.0)
}

/// (cos, sin) × `mscale` of pos · freqs[i] for each position and pair (the frequencies of
/// [`crate::model::rope::RopeConfig::freqs`]).
pub fn rope_table_freqs(positions: &[u32], freqs: &[f64], mscale: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(positions.len() * freqs.len() * 2);
    for &p in positions {
        for f in freqs {
            let theta = p as f64 * f;
            out.push(theta.cos() as f32 * mscale);
            out.push(theta.sin() as f32 * mscale);
        }
    }
    out
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct RooflineParams {
    n4: u32,
    _pad: [u32; 3],
}

/// Stream the first `bytes` of `src` (whole loads of 16 bytes, or of 32 with `wide`: 64-bit
/// words, where the device has them) with one XOR a load, over `workgroups` workgroups writing
/// one word each into `dst`: the memory roofline.
pub fn roofline(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    src: &wgpu::Buffer,
    bytes: u64,
    dst: &wgpu::Buffer,
    workgroups: u32,
    wide: bool,
) -> Result<Dispatch, KernelError> {
    if wide && !ctx.int64 {
        return Err(KernelError::Shape {
            kernel: "roofline",
            problem: "64-bit loads need a device with 64-bit integers".into(),
        });
    }
    let defines = if wide {
        Defines::new().flag("W64")
    } else {
        Defines::new()
    };
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "roofline", "main", &defines)?;
    let unit = if wide { 32 } else { 16 };
    let n4 = u32::try_from(bytes / unit).map_err(|_| KernelError::Shape {
        kernel: "roofline",
        problem: format!("{bytes} bytes is too many"),
    })?;
    let params = params_buffer(ctx, "roofline params", &RooflineParams { n4, _pad: [0; 3] })?;
    Ok(make_dispatch(
        ctx,
        "roofline",
        pipeline,
        params,
        &[step, src, dst],
        [workgroups.max(1), 1, 1],
        TokenAxis::Fixed,
    ))
}

/// A dispatch of one workgroup that does nothing (per-dispatch overhead).
pub fn empty_dispatch(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    src: &wgpu::Buffer,
    dst: &wgpu::Buffer,
) -> Result<Dispatch, KernelError> {
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "roofline", "empty", &Defines::new())?;
    let params = params_buffer(ctx, "empty params", &RooflineParams::default())?;
    Ok(make_dispatch(
        ctx,
        "empty",
        pipeline,
        params,
        &[step, src, dst],
        [1, 1, 1],
        TokenAxis::Fixed,
    ))
}
