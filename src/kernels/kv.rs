//! The paged KV cache's kernels (`shaders/attention.wgsl`, `shaders/kv.wgsl`): the split-K
//! attention over page lists and its merge, the store of a batch's keys and values into home
//! pages, and the page summaries and scores of page selection.

use bytemuck::{Pod, Zeroable};

use super::{Dispatch, KernelError, TokenAxis, make_dispatch, params_buffer};
use crate::gpu::{Defines, GpuContext};

/// Keys per attention split (`SPLIT` in attention.wgsl).
pub const ATTN_SPLIT_KEYS: u32 = 512;

/// Device bytes of one attention or merge dispatch's parameters.
pub const ATTN_PARAMS_BYTES: u64 = std::mem::size_of::<AttnParams>() as u64;
/// Device bytes of one KV store, page-summary or score dispatch's parameters.
pub const KV_PARAMS_BYTES: u64 = std::mem::size_of::<KvParams>() as u64;
/// Device bytes of the RoPE-and-store dispatch's parameters.
pub const ROPE_STORE_PARAMS_BYTES: u64 = std::mem::size_of::<RopeStoreParams>() as u64;

/// Shapes shared by the paged-KV kernels of one layer.
#[derive(Debug, Clone, Copy, Default)]
pub struct KvShape {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub page_tokens: u32,
    /// KV values are packed f16 pairs (else f32).
    pub f16: bool,
    /// Word offset of this layer's region in the page table, and words per sequence there.
    pub table_base: u32,
    pub seq_stride: u32,
    /// Partial results per (row, head) the attention writes in one round.
    pub round_splits: u32,
    /// Score scale (0: 1/sqrt(head_dim)).
    pub scale: f32,
    /// Attention logit soft-cap (0: none).
    pub softcap: f32,
    /// Sliding window in positions (0: none).
    pub window: u32,
}

impl KvShape {
    pub fn kv_dim(&self) -> u32 {
        self.n_kv_heads * self.head_dim
    }
    /// Elements (K and V) of one page.
    pub fn page_elems(&self) -> u32 {
        2 * self.page_tokens * self.kv_dim()
    }
    fn check(&self, kernel: &'static str) -> Result<(), KernelError> {
        let bad = |problem: String| Err(KernelError::Shape { kernel, problem });
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!(
                "{} heads are not a multiple of {} KV heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.page_tokens == 0 || self.head_dim == 0 {
            return bad("empty pages or heads".into());
        }
        if self.f16 && !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "an f16 KV cache needs an even head dim, not {}",
                self.head_dim
            ));
        }
        Ok(())
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct AttnParams {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    kv_dim: u32,
    page_tokens: u32,
    page_elems: u32,
    table_base: u32,
    seq_stride: u32,
    round_splits: u32,
    o_stride: u32,
    scale: f32,
    softcap: f32,
    window: u32,
    _pad: [u32; 2],
}

fn attn_params(s: &KvShape) -> AttnParams {
    AttnParams {
        n_heads: s.n_heads,
        n_kv_heads: s.n_kv_heads,
        head_dim: s.head_dim,
        q_stride: s.n_heads * s.head_dim,
        kv_dim: s.kv_dim(),
        page_tokens: s.page_tokens,
        page_elems: s.page_elems(),
        table_base: s.table_base,
        seq_stride: s.seq_stride,
        round_splits: s.round_splits.max(1),
        o_stride: s.n_heads * s.head_dim,
        scale: if s.scale > 0.0 {
            s.scale
        } else {
            1.0 / (s.head_dim as f32).sqrt()
        },
        softcap: s.softcap,
        window: s.window,
        _pad: [0; 2],
    }
}

fn attn_defines(s: &KvShape) -> Defines {
    let mut d = merge_defines(s);
    if s.softcap > 0.0 {
        d = d.flag("SOFTCAP");
    }
    if s.window > 0 {
        d = d.flag("SWA");
    }
    d
}

fn merge_defines(s: &KvShape) -> Defines {
    let dpt = s.head_dim.div_ceil(64).max(1);
    let mut d = Defines::new().val("DPT", format!("{dpt}u"));
    if s.f16 {
        d = d.flag("KV_F16");
    }
    if s.head_dim.is_multiple_of(4) {
        d = d.flag("VEC4");
    }
    d
}

/// The buffers the split-wise attention kernels bind: the step, the rows' (sequence,
/// position), the page table, Q, the layer's home pool, the stream pool, the partials and the
/// output.
#[derive(Clone, Copy)]
pub struct AttnBuffers<'a> {
    pub step: &'a wgpu::Buffer,
    pub rows: &'a wgpu::Buffer,
    pub table: &'a wgpu::Buffer,
    pub q: &'a wgpu::Buffer,
    pub home: &'a wgpu::Buffer,
    pub stream: &'a wgpu::Buffer,
    pub part: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
}

impl<'a> AttnBuffers<'a> {
    /// In binding order (bindings 1 to 8).
    fn list(&self) -> [&'a wgpu::Buffer; 8] {
        [
            self.step,
            self.rows,
            self.table,
            self.q,
            self.home,
            self.stream,
            self.part,
            self.out,
        ]
    }
}

/// Partial attention of the batch's rows over this round's splits of their page lists: grid
/// (heads, rows, round splits; recorded with the round's own split count); results go to
/// `part`. A round that is the only one and has one split also writes the rows' outputs to
/// `out`, so its merge can be left out (running it anyway writes the same values).
pub fn attention_partial(
    ctx: &GpuContext,
    b: &AttnBuffers<'_>,
    s: &KvShape,
) -> Result<Dispatch, KernelError> {
    s.check("attention")?;
    // CPU rasterizers: a subgroup per (KV head, row, split) with the head dim across its
    // lanes, so each K and V row is read once for the group's query heads (see
    // attention_tiled.wgsl); else, a subgroup per (head, row, split) with keys across lanes.
    if ctx.lane_kernels && attention_tiles(s.head_dim) {
        let (defines, x) = group_defines(s);
        let pipeline = ctx
            .pipelines
            .get(&ctx.device, "attention_tiled", "main_group", &defines)?;
        return split_dispatch(ctx, "attention", pipeline, s, &b.list(), x, 1);
    }
    let lanes = ctx.lane_kernels && s.head_dim.is_multiple_of(4);
    let (entry, defines) = if lanes {
        let d = attn_defines(s)
            .flag("LANES")
            .val("HD4", format!("{}u", s.head_dim / 4));
        ("main_lanes", d)
    } else {
        ("main", attn_defines(s))
    };
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "attention", entry, &defines)?;
    split_dispatch(ctx, "attention", pipeline, s, &b.list(), s.n_heads, 1)
}

/// Query heads one decode attention subgroup serves (its KV head's, in blocks of at most this).
const GROUP_HEADS: u32 = 8;

/// The defines of the subgroup-per-KV-head decode attention (`main_group`) and its grid's x.
fn group_defines(s: &KvShape) -> (Defines, u32) {
    let group = s.n_heads / s.n_kv_heads.max(1);
    let gb = group.min(GROUP_HEADS);
    let d = attn_defines(s)
        .flag("GROUP")
        .val("G", format!("{group}u"))
        .val("GB", format!("{gb}u"))
        .val("HD8", format!("{}u", s.head_dim / 8))
        .val("NB", format!("{}u", (s.head_dim / 8).div_ceil(8)));
    (d, s.n_kv_heads * group.div_ceil(gb))
}

/// Whether this device's decode attention can do [`rope_store`]'s work itself
/// ([`attention_rope`]): the subgroup kernel of CPU rasterizers (where a dispatch costs tens
/// of microseconds), with room for its ten storage bindings. Head dims must also be multiples
/// of 8 ([`attention_tiles`]).
pub fn rope_fusion_available(ctx: &GpuContext) -> bool {
    ctx.lane_kernels && ctx.limits.max_storage_buffers_per_shader_stage >= 10
}

/// The new rows [`attention_rope`] rotates and stores: what [`rope_store`] takes.
pub struct RopeRows<'a> {
    /// The batch's (cos, sin) table.
    pub cs: &'a wgpu::Buffer,
    pub k: &'a wgpu::Buffer,
    pub v: &'a wgpu::Buffer,
    pub rope_dim: u32,
    pub neox: bool,
}

/// [`attention_partial`] for a batch of one row that also does [`rope_store`]'s work, so that
/// dispatch is left out: Q is rotated as it is read, the row's own key and value come from
/// `r.k` and `r.v` wherever the keys reach their home element, and one subgroup per KV head
/// stores them there (see attention_tiled.wgsl, ROPE). `b.q` is left unrotated and the home
/// pool holds what [`rope_store`] would store. None where [`rope_fusion_available`] or
/// [`attention_tiles`] is false. Only for one-row batches: another row of the same sequence
/// would read this row's key before it is stored.
pub fn attention_rope(
    ctx: &GpuContext,
    b: &AttnBuffers<'_>,
    r: &RopeRows<'_>,
    s: &KvShape,
) -> Result<Option<Dispatch>, KernelError> {
    s.check("attention")?;
    if !rope_fusion_available(ctx) || !attention_tiles(s.head_dim) {
        return Ok(None);
    }
    check_rope_dim("attention", r.rope_dim, s.head_dim)?;
    let (mut defines, x) = group_defines(s);
    defines = defines
        .flag("ROPE")
        .val("ROPE_DIM", format!("{}u", r.rope_dim));
    if r.neox {
        defines = defines.flag("NEOX");
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "attention_tiled", "main_group", &defines)?;
    let l = b.list();
    let buffers = [
        l[0], l[1], l[2], l[3], l[4], l[5], l[6], l[7], r.cs, r.k, r.v,
    ];
    split_dispatch(ctx, "attention", pipeline, s, &buffers, x, 1).map(Some)
}

/// RoPE rotates pairs of a head's first `rope_dim` dims.
fn check_rope_dim(kernel: &'static str, rope_dim: u32, head_dim: u32) -> Result<(), KernelError> {
    if !rope_dim.is_multiple_of(2) || rope_dim > head_dim {
        return Err(KernelError::Shape {
            kernel,
            problem: format!("rope dim {rope_dim} must be even and at most head dim {head_dim}"),
        });
    }
    Ok(())
}

/// A split-wise attention dispatch: grid (`x` head groups, ceil(rows / tile), round splits).
fn split_dispatch(
    ctx: &GpuContext,
    label: &'static str,
    pipeline: std::sync::Arc<wgpu::ComputePipeline>,
    s: &KvShape,
    buffers: &[&wgpu::Buffer],
    x: u32,
    tile: u32,
) -> Result<Dispatch, KernelError> {
    let params = params_buffer(ctx, "attention params", &attn_params(s))?;
    let mut d = make_dispatch(
        ctx,
        label,
        pipeline,
        params,
        buffers,
        [x, 1, s.round_splits.max(1)],
        TokenAxis::Y(tile),
    );
    d.splits_z = true;
    Ok(d)
}

/// Whether [`attention_tiled`] takes a head dim (it reads K and V rows 8 values at a time).
pub fn attention_tiles(head_dim: u32) -> bool {
    head_dim.is_multiple_of(8)
}

/// Rows per workgroup of [`attention_tiled`]: one SIMD row of a CPU rasterizer, else a tile
/// whose shared keys a GPU broadcasts from cache.
pub fn attention_tile_rows(ctx: &GpuContext) -> u32 {
    if ctx.lane_kernels { 8 } else { 32 }
}

/// [`attention_partial`] for a prefill batch of one sequence in position order: a workgroup
/// per (head, tile of consecutive rows, split) reads each key once for the whole tile (grid
/// (heads, ceil(rows / tile), round splits)). Same partials, same keys per row; the sums run
/// in another order, so the results differ from [`attention_partial`]'s by rounding. `None`
/// when the head dim is not a multiple of 8 (see [`attention_tiles`]).
pub fn attention_tiled(
    ctx: &GpuContext,
    b: &AttnBuffers<'_>,
    s: &KvShape,
) -> Result<Option<Dispatch>, KernelError> {
    s.check("attention tiled")?;
    if !attention_tiles(s.head_dim) {
        return Ok(None);
    }
    let tile = attention_tile_rows(ctx);
    let mut defines = attn_defines(s)
        .val("HD8", format!("{}u", s.head_dim / 8))
        .val("TILE", format!("{tile}u"));
    if ctx.lane_kernels {
        // The tile is one 8-lane subgroup: its lanes load a key's blocks between them.
        defines = defines
            .flag("LANES")
            .val("NB", format!("{}u", (s.head_dim / 8).div_ceil(8)));
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "attention_tiled", "main_tiled", &defines)?;
    split_dispatch(
        ctx,
        "attention tiled",
        pipeline,
        s,
        &b.list(),
        s.n_heads,
        tile,
    )
    .map(Some)
}

/// Fold a round's partials into the running state; after the last round write the output.
#[allow(clippy::too_many_arguments)]
pub fn attention_merge(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    table: &wgpu::Buffer,
    part: &wgpu::Buffer,
    running: &wgpu::Buffer,
    out: &wgpu::Buffer,
    s: &KvShape,
) -> Result<Dispatch, KernelError> {
    s.check("attention merge")?;
    let defines = merge_defines(s).flag("MERGE");
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "attention", "merge", &defines)?;
    let params = params_buffer(ctx, "merge params", &attn_params(s))?;
    Ok(make_dispatch(
        ctx,
        "attention merge",
        pipeline,
        params,
        &[step, table, part, running, out],
        [s.n_heads, 1, 1],
        TokenAxis::Y(1),
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct KvParams {
    kv_dim: u32,
    page_tokens: u32,
    page_elems: u32,
    n_heads: u32,
    head_dim: u32,
    n_kv_heads: u32,
    table_base: u32,
    max_jobs: u32,
}

fn kv_params(s: &KvShape, max_jobs: u32) -> KvParams {
    KvParams {
        kv_dim: s.kv_dim(),
        page_tokens: s.page_tokens,
        page_elems: s.page_elems(),
        n_heads: s.n_heads,
        head_dim: s.head_dim,
        n_kv_heads: s.n_kv_heads,
        table_base: s.table_base,
        max_jobs,
    }
}

/// Store the batch's keys and values (T x kv_dim f32 each) into the layer's home pool at the
/// elements the row table gives.
pub fn kv_store(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    rows: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    pool: &wgpu::Buffer,
    s: &KvShape,
) -> Result<Dispatch, KernelError> {
    s.check("kv_store")?;
    let mut defines = Defines::new().flag("STORE");
    let width = if s.f16 {
        defines = defines.flag("KV_F16");
        s.kv_dim() / 2
    } else {
        s.kv_dim()
    };
    let pipeline = ctx.pipelines.get(&ctx.device, "kv", "store", &defines)?;
    let params = params_buffer(ctx, "kv store params", &kv_params(s, 0))?;
    Ok(make_dispatch(
        ctx,
        "kv_store",
        pipeline,
        params,
        &[step, rows, k, v, pool],
        [width.div_ceil(64), 1, 1],
        TokenAxis::Y(1),
    ))
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct RopeStoreParams {
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    kv_dim: u32,
    page_tokens: u32,
    q_pairs: u32,
    _pad: u32,
}

/// RoPE of the batch's queries `q` (T x n_heads*head_dim, in place) and keys `k`, then the
/// store of the rotated keys and the values `v` (T x kv_dim f32 each; `k` is left unrotated)
/// into the layer's home pool at the elements the row table gives: what `rope` on Q, `rope` on
/// K and [`kv_store`] do, in one dispatch. `cs` is the batch's (cos, sin) table.
#[allow(clippy::too_many_arguments)]
pub fn rope_store(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    cs: &wgpu::Buffer,
    q: &wgpu::Buffer,
    rows: &wgpu::Buffer,
    k: &wgpu::Buffer,
    v: &wgpu::Buffer,
    pool: &wgpu::Buffer,
    s: &KvShape,
    rope_dim: u32,
    neox: bool,
) -> Result<Dispatch, KernelError> {
    s.check("rope_store")?;
    check_rope_dim("rope_store", rope_dim, s.head_dim)?;
    let mut defines = Defines::new();
    let units = if s.f16 {
        defines = defines.flag("KV_F16");
        s.kv_dim() / 2
    } else {
        s.kv_dim()
    };
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "rope_store", "main", &defines)?;
    let q_pairs = s.n_heads * rope_dim / 2;
    let p = RopeStoreParams {
        n_heads: s.n_heads,
        head_dim: s.head_dim,
        rope_dim,
        neox: neox as u32,
        kv_dim: s.kv_dim(),
        page_tokens: s.page_tokens,
        q_pairs,
        _pad: 0,
    };
    let params = params_buffer(ctx, "rope store params", &p)?;
    Ok(make_dispatch(
        ctx,
        "rope_store",
        pipeline,
        params,
        &[step, cs, q, rows, k, v, pool],
        [(q_pairs + units).div_ceil(64), 1, 1],
        TokenAxis::Y(1),
    ))
}

/// Per-channel key minimum and maximum of the pages listed in `jobs` (up to `max_jobs`).
pub fn page_meta(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    jobs: &wgpu::Buffer,
    pool: &wgpu::Buffer,
    meta: &wgpu::Buffer,
    s: &KvShape,
    max_jobs: u32,
) -> Result<Dispatch, KernelError> {
    s.check("page_meta")?;
    let mut defines = Defines::new().flag("META");
    if s.f16 {
        defines = defines.flag("KV_F16");
    }
    let pipeline = ctx
        .pipelines
        .get(&ctx.device, "kv", "page_meta", &defines)?;
    let params = params_buffer(ctx, "page meta params", &kv_params(s, max_jobs))?;
    Ok(make_dispatch(
        ctx,
        "page_meta",
        pipeline,
        params,
        &[step, jobs, pool, meta],
        [max_jobs.max(1), 1, 1],
        TokenAxis::Fixed,
    ))
}

/// Upper bounds of q . k per (page, head) for the pages counted in the table header.
#[allow(clippy::too_many_arguments)]
pub fn page_score(
    ctx: &GpuContext,
    step: &wgpu::Buffer,
    table: &wgpu::Buffer,
    q: &wgpu::Buffer,
    meta: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    s: &KvShape,
    max_pages: u32,
) -> Result<Dispatch, KernelError> {
    s.check("page_score")?;
    let mut defines = Defines::new().flag("SCORE");
    if s.head_dim.is_multiple_of(4) {
        defines = defines.flag("VEC4");
    }
    let pipeline = ctx.pipelines.get(&ctx.device, "kv", "score", &defines)?;
    let params = params_buffer(ctx, "page score params", &kv_params(s, 0))?;
    Ok(make_dispatch(
        ctx,
        "page_score",
        pipeline,
        params,
        &[step, table, q, meta, scores],
        [(max_pages * s.n_heads).div_ceil(64).max(1), 1, 1],
        TokenAxis::Fixed,
    ))
}
