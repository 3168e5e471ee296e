//! The device objects of one layer and its dispatch lists, built once at load and replayed every
//! pass.
//!
//! A layer's work is cut where the host may have to act between dispatches:
//! - `pre`: RMSNorm (or the products normalize X as they read it, where the device can), the
//!   Q/K/V products (one dispatch when they share a type and width, + biases;
//!   fused QKV: one dispatch per piece of each of Q, K and V), per-head Q/K norms, RoPE of Q and K with the store of the batch's K and V
//!   into home pages in one dispatch (the local table on sliding-window layers), and (page
//!   selection) the summaries of pages that filled up;
//! - `score` (page selection, decode only): upper bounds of the pages' attention scores, read
//!   back so the host can choose the pages to bring in;
//! - `attn`: one round of split attention over the page list and the merge of its partials
//!   (replayed once per round);
//! - `post`: the output product added into the residual (with post norms: written, normed and
//!   added by the norm), RMSNorm, the gated gate/up product (SwiGLU or GeGLU; fused gate/up: the
//!   gate and up rows of one matrix) and the down product added into the residual likewise.

use crate::gpu::{GpuBuffer, GpuContext};
use crate::kernels::{
    self, Dispatch, Gate, GpuWeight, KvShape, MatmulIo, NormSpec, SecondWeight, WeightPart,
};
use crate::model::config::{FfnAct, ModelConfig, RopeStyle};
use crate::plan::MatrixRole;

use super::EngineError;

/// A layer's matrices, in the plan's order (`plan::layer_matrices`).
pub struct Mats {
    roles: Vec<MatrixRole>,
    w: Vec<GpuWeight>,
}

impl Mats {
    /// From the matrices of `roles`, in that order.
    pub fn new(roles: Vec<MatrixRole>, w: Vec<GpuWeight>) -> Result<Self, EngineError> {
        if roles.len() != w.len() {
            return Err(EngineError::MissingTensor(format!(
                "a layer matrix ({} of {})",
                w.len(),
                roles.len()
            )));
        }
        Ok(Self { roles, w })
    }

    pub fn get(&self, role: MatrixRole) -> Result<&GpuWeight, EngineError> {
        self.roles
            .iter()
            .position(|&r| r == role)
            .map(|i| &self.w[i])
            .ok_or_else(|| EngineError::MissingTensor(format!("layer matrix {role:?}")))
    }

    pub fn all(&self) -> &[GpuWeight] {
        &self.w
    }
}

/// A layer's device state besides streamed weights.
pub struct Layer {
    pub attn_norm: GpuBuffer,
    pub ffn_norm: GpuBuffer,
    pub bias: Option<[GpuBuffer; 3]>,
    /// Per-head norms of Q and K.
    pub qk_norm: Option<[GpuBuffer; 2]>,
    /// Post-attention and post-FFN norms.
    pub post_norms: Option<[GpuBuffer; 2]>,
    /// Local (sliding-window) layer: rotates with the local RoPE table.
    pub local: bool,
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
    /// The RoPE table of local layers when they rotate differently.
    pub rope_cs_swa: Option<GpuBuffer>,
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
    /// Every layer's scores of a token, read back at its end (lagged selection).
    pub scores_lag: Option<GpuBuffer>,
}

/// A layer's dispatch lists.
pub struct Lists {
    pub pre: Vec<Dispatch>,
    pub score: Option<Dispatch>,
    pub attn: Vec<Dispatch>,
    /// The same with the row-tiled attention (prefill lists of a head dim that allows it;
    /// else empty), for batches of one sequence.
    pub attn_tiled: Vec<Dispatch>,
    /// Decode lists of layers the plan fuses RoPE into attention for ([`Plan::fused_rope`]):
    /// the attention of a one-row batch that rotates Q and the new key and stores the key and
    /// value itself ([`kernels::attention_rope`]), with its merge; empty otherwise.
    pub rope_attn: Vec<Dispatch>,
    pub post: Vec<Dispatch>,
}

impl Lists {
    /// The dispatches before attention for a batch of `rows` rows, and the attention when it is
    /// the fused one: with one row and [`Self::rope_attn`], `pre` less its last dispatch
    /// (RoPE with the KV store, which the fused attention does).
    pub fn before_attention(&self, rows: usize) -> (&[Dispatch], Option<&[Dispatch]>) {
        match self.pre.split_last() {
            Some((_, head)) if rows == 1 && !self.rope_attn.is_empty() => {
                (head, Some(&self.rope_attn))
            }
            _ => (&self.pre, None),
        }
    }
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
    fused_norms: [bool; 2],
    fuse_rope: bool,
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
    let norm = |x: Option<&GpuBuffer>, w: &GpuBuffer, y: &GpuBuffer, n: u32, heads: u32, acc| {
        let spec = NormSpec {
            n,
            heads,
            eps: cfg.rms_eps,
            acc,
            ..Default::default()
        };
        kernels::rmsnorm_ext(ctx, &b.step, x.map(|x| &**x), w, y, &spec)
    };
    // The attention input's RMSNorm: a dispatch of its own into xn, or applied by the Q/K/V
    // products to the residual as they read it.
    let mut pre = Vec::new();
    let (qkv_x, qkv_norm) = if fused_norms[0] {
        (
            &b.x,
            Some(kernels::Norm {
                w: &l.attn_norm,
                eps: cfg.rms_eps,
            }),
        )
    } else {
        pre.push(norm(Some(&b.x), &l.attn_norm, &b.xn, n_embd, 1, false)?);
        (&b.xn, None)
    };
    if cfg.fused_qkv {
        // Rows [0, q) of attn_qkv are Q, then K, then V: one dispatch per piece of each.
        let w = m.get(MatrixRole::Qkv)?;
        let parts: Vec<(u32, u32)> = w.parts.iter().map(|p| (p.r0, p.n)).collect();
        let targets = [
            (0, q_dim, &b.q, q_dim),
            (q_dim, q_dim + kv_dim, &b.k_tmp, kv_dim),
            (q_dim + kv_dim, q_dim + 2 * kv_dim, &b.v_tmp, kv_dim),
        ];
        for (lo, hi, y, width) in targets {
            for (i, in_part, rows) in kernels::row_pieces(&parts, lo, hi) {
                let part = WeightPart {
                    ty: w.ty,
                    cols: w.cols,
                    row_bytes: w.row_bytes,
                    buffer: w.bind(i),
                    first_row: w.parts[i].r0 + in_part - lo,
                    rows,
                    buf_row: in_part,
                };
                pre.push(kernels::matmul_part_with(
                    ctx,
                    &b.step,
                    &part,
                    None,
                    qkv_norm,
                    qkv_x,
                    y,
                    io(n_embd, width),
                )?);
            }
        }
    } else {
        let products = [
            (MatrixRole::Q, &b.q, q_dim),
            (MatrixRole::K, &b.k_tmp, kv_dim),
            (MatrixRole::V, &b.v_tmp, kv_dim),
        ]
        .into_iter()
        .map(|(role, y, width)| {
            Ok(kernels::Product {
                w: m.get(role)?,
                y,
                y_stride: width,
            })
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
        if kernels::multi_fits(&products) {
            // One dispatch for Q, K and V.
            pre.push(kernels::matmul_multi(
                ctx,
                &b.step,
                &products,
                qkv_norm,
                qkv_x,
                io(n_embd, q_dim),
            )?);
        } else {
            for pr in &products {
                pre.extend(kernels::matmul_normed(
                    ctx,
                    &b.step,
                    pr.w,
                    None,
                    qkv_norm,
                    qkv_x,
                    pr.y,
                    io(n_embd, pr.y_stride),
                )?);
            }
        }
    }
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
    if let Some([qn, kn]) = &l.qk_norm {
        pre.push(norm(None, qn, &b.q, hd, cfg.n_heads as u32, false)?);
        pre.push(norm(None, kn, &b.k_tmp, hd, cfg.n_kv_heads as u32, false)?);
    }
    let rope_dim = cfg.rope_dim as u32;
    let cs = match (&b.rope_cs_swa, l.local) {
        (Some(swa), true) => swa,
        _ => &b.rope_cs,
    };
    pre.push(kernels::rope_store(
        ctx, &b.step, cs, &b.q, &b.rows, &b.k_tmp, &b.v_tmp, &l.home, shape, rope_dim, neox,
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
    // The split attention, and (prefill lists) the row-tiled one, each with its merge.
    let merge =
        || kernels::attention_merge(ctx, &b.step, &kvb.table, &b.part, &b.running, &b.att, shape);
    let bufs = kernels::AttnBuffers {
        step: &b.step,
        rows: &b.rows,
        table: &kvb.table,
        q: &b.q,
        home: &l.home,
        stream: &kvb.stream,
        part: &b.part,
        out: &b.att,
    };
    let attn = vec![kernels::attention_partial(ctx, &bufs, shape)?, merge()?];
    let mut attn_tiled = Vec::new();
    if tt > 1
        && let Some(a) = kernels::attention_tiled(ctx, &bufs, shape)?
    {
        attn_tiled = vec![a, merge()?];
    }
    // RoPE with the KV store inside decode attention: `rope_store` must then be `pre`'s last
    // dispatch (no page summaries follow it: the plan fuses only layers that do not select).
    let mut rope_attn = Vec::new();
    if tt == 1 && fuse_rope {
        let new_rows = kernels::RopeRows {
            cs,
            k: &b.k_tmp,
            v: &b.v_tmp,
            rope_dim,
            neox,
        };
        let fused = kernels::attention_rope(ctx, &bufs, &new_rows, shape)?;
        match (fused, pre.last()) {
            (Some(a), Some(last)) if last.label == "rope_store" => rope_attn = vec![a, merge()?],
            _ => {
                return Err(EngineError::PlanMismatch(
                    "it fuses RoPE into decode attention, which this device cannot".into(),
                ));
            }
        }
    }
    // A residual add: fused into the product, or (post norms) through the norm.
    let residual = |post: &mut Vec<Dispatch>,
                    w: &GpuWeight,
                    x: &GpuBuffer,
                    xs: u32,
                    pn: Option<&GpuBuffer>|
     -> Result<(), EngineError> {
        match pn {
            None => post.extend(kernels::matmul(
                ctx,
                &b.step,
                w,
                x,
                &b.x,
                MatmulIo {
                    accumulate: true,
                    ..io(xs, n_embd)
                },
            )?),
            Some(pn) => {
                post.extend(kernels::matmul(ctx, &b.step, w, x, &b.xn, io(xs, n_embd))?);
                post.push(norm(Some(&b.xn), pn, &b.x, n_embd, 1, true)?);
            }
        }
        Ok(())
    };
    let (post_attn, post_ffw) = match &l.post_norms {
        Some([a, f]) => (Some(a), Some(f)),
        None => (None, None),
    };
    let mut post = Vec::new();
    residual(
        &mut post,
        m.get(MatrixRole::Output)?,
        &b.att,
        q_dim,
        post_attn,
    )?;
    // The FFN input's RMSNorm, likewise.
    let (ffn_x, ffn_norm) = if fused_norms[1] {
        (
            &b.x,
            Some(kernels::Norm {
                w: &l.ffn_norm,
                eps: cfg.rms_eps,
            }),
        )
    } else {
        post.push(norm(Some(&b.x), &l.ffn_norm, &b.xn, n_embd, 1, false)?);
        (&b.xn, None)
    };
    let act = match cfg.ffn_act {
        FfnAct::Silu => Gate::Silu,
        FfnAct::GeluTanh => Gate::GeluTanh,
    };
    if cfg.fused_gate_up {
        // Gate rows [0, n_ff) and up rows [n_ff, 2 n_ff) of one matrix.
        let w = m.get(MatrixRole::GateUp)?;
        let parts: Vec<(u32, u32)> = w.parts.iter().map(|p| (p.r0, p.n)).collect();
        for pc in kernels::paired_pieces(&parts, n_ff) {
            let part = WeightPart {
                ty: w.ty,
                cols: w.cols,
                row_bytes: w.row_bytes,
                buffer: w.bind(pc.gate.0),
                first_row: pc.out_row,
                rows: pc.rows,
                buf_row: pc.gate.1,
            };
            let second = SecondWeight {
                buffer: w.bind(pc.up.0),
                buf_row: pc.up.1,
                act,
            };
            post.push(kernels::matmul_part_with(
                ctx,
                &b.step,
                &part,
                Some(second),
                ffn_norm,
                ffn_x,
                &b.h,
                io(n_embd, n_ff),
            )?);
        }
    } else {
        post.extend(kernels::matmul_normed(
            ctx,
            &b.step,
            m.get(MatrixRole::Gate)?,
            Some((m.get(MatrixRole::Up)?, act)),
            ffn_norm,
            ffn_x,
            &b.h,
            io(n_embd, n_ff),
        )?);
    }
    residual(&mut post, m.get(MatrixRole::Down)?, &b.h, n_ff, post_ffw)?;
    Ok(Lists {
        pre,
        score,
        attn,
        attn_tiled,
        rope_attn,
        post,
    })
}
