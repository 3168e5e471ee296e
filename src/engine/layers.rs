//! The device objects of one layer and its dispatch lists, built once at load and replayed every
//! pass.
//!
//! A layer's work is cut where the host may have to act between dispatches:
//! - `pre`: RMSNorm, the Q/K/V products (+ biases), RoPE of Q and K, the store of the batch's K
//!   and V into home pages, and (page selection) the summaries of pages that filled up;
//! - `score` (page selection, decode only): upper bounds of the pages' attention scores, read
//!   back so the host can choose the pages to bring in;
//! - `attn`: one round of split attention over the page list and the merge of its partials
//!   (replayed once per round);
//! - `post`: the output product added into the residual, RMSNorm, the fused gate/up SwiGLU
//!   product and the down product added into the residual.

use crate::gpu::{GpuBuffer, GpuContext};
use crate::kernels::{self, Dispatch, GpuWeight, KvShape, MatmulIo};
use crate::model::config::{ModelConfig, RopeStyle};

use super::EngineError;

/// A layer's seven matrices.
pub struct Mats {
    pub q: GpuWeight,
    pub k: GpuWeight,
    pub v: GpuWeight,
    pub o: GpuWeight,
    pub g: GpuWeight,
    pub u: GpuWeight,
    pub d: GpuWeight,
}

impl Mats {
    /// From the seven matrices in `plan::MATRIX_NAMES` order.
    pub fn from_vec(m: Vec<GpuWeight>) -> Result<Self, EngineError> {
        let [q, k, v, o, g, u, d]: [GpuWeight; 7] = m
            .try_into()
            .map_err(|_| EngineError::MissingTensor("a layer matrix".into()))?;
        Ok(Self {
            q,
            k,
            v,
            o,
            g,
            u,
            d,
        })
    }

    pub fn all(&self) -> [&GpuWeight; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.g, &self.u, &self.d,
        ]
    }
}

/// A layer's device state besides streamed weights.
pub struct Layer {
    pub attn_norm: GpuBuffer,
    pub ffn_norm: GpuBuffer,
    pub bias: Option<[GpuBuffer; 3]>,
    /// Home pages of the KV cache.
    pub home: GpuBuffer,
    /// Per-page key minimum and maximum (page selection).
    pub meta: Option<GpuBuffer>,
    /// Resident weights, or None when the layer streams through a slot.
    pub mats: Option<Mats>,
}

/// Activation buffers shared by every layer.
pub struct Buffers {
    pub step: GpuBuffer,
    pub rows: GpuBuffer,
    pub rope_cs: GpuBuffer,
    pub x: GpuBuffer,
    pub xn: GpuBuffer,
    pub q: GpuBuffer,
    pub att: GpuBuffer,
    pub h: GpuBuffer,
    pub k_tmp: GpuBuffer,
    pub v_tmp: GpuBuffer,
    pub last: GpuBuffer,
    pub last_n: GpuBuffer,
    pub logits: GpuBuffer,
    pub readback: GpuBuffer,
    pub part: GpuBuffer,
    pub running: GpuBuffer,
}

/// Device buffers of the paged KV cache shared by the layers.
pub struct KvBuffers {
    pub table: GpuBuffer,
    pub stream: GpuBuffer,
    pub pageout: GpuBuffer,
    /// Page-summary jobs, scores and their read-back (page selection).
    pub jobs: Option<GpuBuffer>,
    pub scores: Option<GpuBuffer>,
    pub scores_rb: Option<GpuBuffer>,
}

/// A layer's dispatch lists.
pub struct Lists {
    pub pre: Vec<Dispatch>,
    pub score: Option<Dispatch>,
    pub attn: Vec<Dispatch>,
    pub post: Vec<Dispatch>,
}

/// Build the lists of layer `l` computing from `m`, for token tiles of `tt` (1: decode).
#[allow(clippy::too_many_arguments)]
pub fn build_lists(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    l: &Layer,
    m: &Mats,
    b: &Buffers,
    kvb: &KvBuffers,
    shape: &KvShape,
    max_jobs: u32,
    max_pages: u32,
    tt: u32,
) -> Result<Lists, EngineError> {
    let n_embd = cfg.n_embd as u32;
    let hd = cfg.head_dim as u32;
    let q_dim = cfg.n_heads as u32 * hd;
    let kv_dim = cfg.n_kv_heads as u32 * hd;
    let n_ff = cfg.n_ff as u32;
    let neox = cfg.rope_style == RopeStyle::Neox;
    let io = |xs: u32, ys: u32| MatmulIo {
        x_stride: xs,
        y_stride: ys,
        token_tile: tt,
        ..Default::default()
    };
    let mut pre = vec![kernels::rmsnorm(
        ctx,
        &b.step,
        &b.x,
        &l.attn_norm,
        &b.xn,
        n_embd,
        cfg.rms_eps,
        0,
        0,
    )?];
    pre.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.q,
        &b.xn,
        &b.q,
        io(n_embd, q_dim),
    )?);
    pre.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.k,
        &b.xn,
        &b.k_tmp,
        io(n_embd, kv_dim),
    )?);
    pre.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.v,
        &b.xn,
        &b.v_tmp,
        io(n_embd, kv_dim),
    )?);
    if let Some([bq, bk, bv]) = &l.bias {
        pre.push(kernels::add_bias(
            ctx, &b.step, bq, &b.q, q_dim, q_dim, false,
        )?);
        pre.push(kernels::add_bias(
            ctx, &b.step, bk, &b.k_tmp, kv_dim, kv_dim, false,
        )?);
        pre.push(kernels::add_bias(
            ctx, &b.step, bv, &b.v_tmp, kv_dim, kv_dim, false,
        )?);
    }
    let rope_dim = cfg.rope_dim as u32;
    pre.push(kernels::rope(
        ctx,
        &b.step,
        &b.rope_cs,
        &b.q,
        cfg.n_heads as u32,
        hd,
        rope_dim,
        q_dim,
        false,
        neox,
    )?);
    pre.push(kernels::rope(
        ctx,
        &b.step,
        &b.rope_cs,
        &b.k_tmp,
        cfg.n_kv_heads as u32,
        hd,
        rope_dim,
        kv_dim,
        false,
        neox,
    )?);
    pre.push(kernels::kv_store(
        ctx, &b.step, &b.rows, &b.k_tmp, &b.v_tmp, &l.home, shape,
    )?);
    let mut score = None;
    if let (Some(meta), Some(jobs)) = (&l.meta, &kvb.jobs) {
        pre.push(kernels::page_meta(
            ctx, &b.step, jobs, &l.home, meta, shape, max_jobs,
        )?);
        if tt == 1
            && let Some(scores) = &kvb.scores
        {
            score = Some(kernels::page_score(
                ctx, &b.step, &kvb.table, &b.q, meta, scores, shape, max_pages,
            )?);
        }
    }
    let attn = vec![
        kernels::attention_partial(
            ctx,
            &b.step,
            &b.rows,
            &kvb.table,
            &b.q,
            &l.home,
            &kvb.stream,
            &b.part,
            shape,
        )?,
        kernels::attention_merge(ctx, &b.step, &kvb.table, &b.part, &b.running, &b.att, shape)?,
    ];
    let mut post = kernels::matmul(
        ctx,
        &b.step,
        &m.o,
        &b.att,
        &b.x,
        MatmulIo {
            accumulate: true,
            ..io(q_dim, n_embd)
        },
    )?;
    post.push(kernels::rmsnorm(
        ctx,
        &b.step,
        &b.x,
        &l.ffn_norm,
        &b.xn,
        n_embd,
        cfg.rms_eps,
        0,
        0,
    )?);
    post.extend(kernels::matmul_swiglu(
        ctx,
        &b.step,
        &m.g,
        &m.u,
        &b.xn,
        &b.h,
        io(n_embd, n_ff),
    )?);
    post.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.d,
        &b.h,
        &b.x,
        MatmulIo {
            accumulate: true,
            ..io(n_ff, n_embd)
        },
    )?);
    Ok(Lists {
        pre,
        score,
        attn,
        post,
    })
}
