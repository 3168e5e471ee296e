//! Typed wrappers over `shaders/*.wgsl`.
//!
//! Each builder validates its sizes, writes its static parameters once into a small uniform
//! buffer, and returns [`Dispatch`]es: a cached pipeline, a bind group and a workgroup grid.
//! Values that change per forward pass (token count, first position) come from the shared
//! `Step` uniform, so a built dispatch list is replayed token after token without rebuilding.

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use thiserror::Error;

use crate::gpu::{GpuBuffer, GpuContext, GpuError};

mod kv;
mod matmul;
mod multi;
mod ops;
mod weights;
pub use kv::*;
pub use matmul::*;
pub use multi::*;
pub use ops::*;
pub use weights::*;

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
    /// Weight bytes one dispatch reads (0 when not a weight product).
    pub bytes: u64,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    grid: [u32; 3],
    axis: TokenAxis,
    /// A second parameter buffer the dispatch reads, kept alive with it.
    _extra: Option<GpuBuffer>,
    /// Grid z is the number of attention splits of the round being recorded (at most the
    /// built grid's z), when the recorder gives it.
    splits_z: bool,
    _params: GpuBuffer,
}

impl Dispatch {
    /// Keep `b` (a buffer the bind group reads) alive as long as the dispatch.
    fn keep(&mut self, b: GpuBuffer) {
        self._extra = Some(b);
    }

    /// Record into a compute pass for a batch of `n_tokens` tokens.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, n_tokens: u32) {
        self.record_round(pass, n_tokens, None);
    }

    /// [`Self::record`] for an attention round of `splits` splits (grid z of the split-wise
    /// kernels; `None`: the built grid, every split a round can hold).
    pub fn record_round(
        &self,
        pass: &mut wgpu::ComputePass<'_>,
        n_tokens: u32,
        splits: Option<u32>,
    ) {
        let mut g = self.grid;
        match self.axis {
            TokenAxis::Fixed => {}
            TokenAxis::X(tile) => g[0] = n_tokens.div_ceil(tile),
            TokenAxis::Y(tile) => g[1] = n_tokens.div_ceil(tile),
        }
        if self.splits_z
            && let Some(z) = splits
        {
            g[2] = z.min(g[2]);
        }
        if g.contains(&0) {
            return;
        }
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(g[0], g[1], g[2]);
    }
}

/// Record a list of dispatches in one compute pass, with timestamps around each when a profiler
/// is given.
pub fn record_all_with(
    encoder: &mut wgpu::CommandEncoder,
    list: &[Dispatch],
    n_tokens: u32,
    prof: Option<&mut crate::gpu::profile::Profiler>,
) {
    record_round_with(encoder, list, n_tokens, None, prof);
}

/// [`record_all_with`] for an attention round of `splits` splits (see
/// [`Dispatch::record_round`]).
pub fn record_round_with(
    encoder: &mut wgpu::CommandEncoder,
    list: &[Dispatch],
    n_tokens: u32,
    splits: Option<u32>,
    prof: Option<&mut crate::gpu::profile::Profiler>,
) {
    let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
        label: Some("forward"),
        timestamp_writes: None,
    });
    let Some(p) = prof else {
        for d in list {
            d.record_round(&mut pass, n_tokens, splits);
        }
        return;
    };
    for d in list {
        match p.reserve(d.label, d.bytes) {
            Some((set, i)) => {
                pass.write_timestamp(set, i);
                d.record_round(&mut pass, n_tokens, splits);
                pass.write_timestamp(set, i + 1);
            }
            None => d.record_round(&mut pass, n_tokens, splits),
        }
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

fn params_buffer<T: Pod>(ctx: &GpuContext, label: &str, p: &T) -> Result<GpuBuffer, GpuError> {
    let buf = ctx.buffer(
        label,
        std::mem::size_of::<T>() as u64,
        wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
    )?;
    ctx.write(&buf, 0, bytemuck::bytes_of(p));
    Ok(buf)
}

/// A buffer a dispatch binds from byte `offset`, `size` bytes (None: to its end): a weight
/// placed inside a shared buffer (a layer slot), or a whole buffer.
#[derive(Clone, Copy)]
pub struct BufAt<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: Option<u64>,
}

impl<'a> From<&'a wgpu::Buffer> for BufAt<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        Self {
            buffer,
            offset: 0,
            size: None,
        }
    }
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
    let at: Vec<(u32, BufAt<'_>)> = buffers
        .iter()
        .enumerate()
        .map(|(i, b)| (i as u32 + 1, BufAt::from(*b)))
        .collect();
    make_dispatch_at(ctx, label, pipeline, params, &at, grid, axis)
}

/// As `make_dispatch`, with each buffer's binding number given.
fn make_dispatch_at(
    ctx: &GpuContext,
    label: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    params: GpuBuffer,
    buffers: &[(u32, BufAt<'_>)],
    grid: [u32; 3],
    axis: TokenAxis,
) -> Dispatch {
    let layout = pipeline.get_bind_group_layout(0);
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: params.as_entire_binding(),
    }];
    for (binding, b) in buffers {
        entries.push(wgpu::BindGroupEntry {
            binding: *binding,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: b.buffer,
                offset: b.offset,
                size: b.size.and_then(wgpu::BufferSize::new),
            }),
        });
    }
    let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some(label),
        layout: &layout,
        entries: &entries,
    });
    Dispatch {
        label,
        bytes: 0,
        pipeline,
        bind_group,
        grid,
        splits_z: false,
        _extra: None,
        axis,
        _params: params,
    }
}
