//! The per-token schedule: embeddings in, the layers computed one after another while the next
//! layers' weights stream in, logits out.
//!
//! A forward pass over a batch of T tokens at positions [pos0, pos0 + T):
//! 1. the host gathers the T embedding rows from the model file and writes them, with the
//!    step values (T, pos0) and the RoPE cos/sin table, into device buffers;
//! 2. for each layer L, one submission replays L's prebuilt dispatches: RMSNorm, Q/K/V products
//!    (K and V written straight into the cache rows), RoPE, attention, the output product added
//!    into the residual, RMSNorm, the fused gate/up SwiGLU product and the down product added
//!    into the residual. A streamed layer computes from a slot; right after L is submitted,
//!    the streamed layer `slots` places ahead is read from flash into the staging ring and
//!    copied into the slot L just used (the queue orders the copy after L's compute), so the
//!    reads of L+1.. overlap L's compute (the paper's layer-ahead pipeline);
//! 3. the last token's row is normed and multiplied by the output head (resident, or streamed
//!    in row chunks through two slots); the logits are read back.
//!
//! Prefill batches use matrix-matrix kernels (several tokens per weight read); decode uses T = 1.

pub mod placement;
pub mod trace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile, TensorInfo, quant};
use crate::gpu::staging::{ChunkSource, StagingError, StagingRing, UploadReq, UploadStats};
use crate::gpu::{GpuBuffer, GpuContext, GpuError, GpuOptions};
use crate::kernels::{self, Dispatch, GpuWeight, KernelError, MatmulIo, Step, WeightPart};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::sampling::Sampler;
pub use placement::{Costs, Placement, PlacementError, ResidentSpec};
use trace::{TID_HOST, TID_IO, Tracer};

#[derive(Debug, Error)]
pub enum EngineError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] crate::model::config::ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(transparent)]
    Staging(#[from] StagingError),
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("reading the model file failed: {0}")]
    Flash(String),
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    #[error("streaming needs every layer to have the same shapes: {0}")]
    UnevenLayers(String),
    #[error(
        "context full: {needed} positions needed, the context holds {max} (raise --ctx, up to the model's {model_max}, or the budget)"
    )]
    ContextFull {
        needed: usize,
        max: usize,
        model_max: usize,
    },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadToken { id: u32, vocab: usize },
    #[error("the prompt is empty: nothing to condition on")]
    EmptyPrompt,
    #[error("writing the trace failed: {0}")]
    Trace(std::io::Error),
}

/// Where the engine reads weight bytes at run time: the flash reader, or any byte source.
pub trait WeightSource: ChunkSource + Send + Sync {
    /// Bytes read from storage so far.
    fn bytes_read(&self) -> u64;
    /// Fail when the file changed under the run (shrunk, removed, replaced).
    fn check(&self) -> Result<(), String>;
    /// Hint that `[offset, offset + len)` is needed soon.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Hint that `[offset, offset + len)` is not needed until its next turn.
    fn release(&self, _offset: u64, _len: u64) {}
}

/// Reads through the GGUF file's own memory map (the default when no flash reader is given).
pub struct MapSource {
    file: Arc<GgufFile>,
    read: std::sync::atomic::AtomicU64,
}

impl MapSource {
    pub fn new(file: Arc<GgufFile>) -> Self {
        Self {
            file,
            read: Default::default(),
        }
    }
}

impl ChunkSource for MapSource {
    fn read_into(
        &self,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.file.bytes().read_into(offset, dst)?;
        self.read
            .fetch_add(dst.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

impl WeightSource for MapSource {
    fn bytes_read(&self) -> u64 {
        self.read.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub gpu: GpuOptions,
    /// KV cache length in tokens (default: the model's context, at most 2048, shrunk to fit the
    /// budget).
    pub ctx: Option<usize>,
    /// Tokens per prefill batch.
    pub ubatch: usize,
    /// Streamed layers read ahead of the one computing (layer slots = prefetch + 1).
    pub prefetch: usize,
    /// Staging ring: slots (0: enough to hold one streamed layer plus one chunk, so a layer's
    /// upload never waits for the GPU to finish the layer before it) and bytes per slot.
    pub ring_slots: usize,
    pub ring_chunk: u64,
    /// Bytes per output-head chunk when the head streams.
    pub head_chunk: u64,
    /// What to keep resident (default: decided from the budget).
    pub resident: ResidentSpec,
    /// Keep trace spans (for `--trace`).
    pub trace: bool,
    /// Store the KV cache in f16 (half the bytes of f32).
    pub kv_f16: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            gpu: GpuOptions::default(),
            ctx: None,
            ubatch: 64,
            prefetch: 1,
            ring_slots: 0,
            ring_chunk: 512 * 1024,
            head_chunk: 512 * 1024,
            resident: ResidentSpec::Auto,
            trace: false,
            kv_f16: true,
        }
    }
}

/// A layer's seven matrices.
struct Mats {
    q: GpuWeight,
    k: GpuWeight,
    v: GpuWeight,
    o: GpuWeight,
    g: GpuWeight,
    u: GpuWeight,
    d: GpuWeight,
}

impl Mats {
    /// From the seven matrices in `MATRIX_NAMES` order.
    fn from_vec(m: Vec<GpuWeight>) -> Result<Self, EngineError> {
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

    fn all(&self) -> [&GpuWeight; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.g, &self.u, &self.d,
        ]
    }
}

const MATRIX_NAMES: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

struct Layer {
    attn_norm: GpuBuffer,
    ffn_norm: GpuBuffer,
    bias: Option<[GpuBuffer; 3]>,
    k_cache: GpuBuffer,
    v_cache: GpuBuffer,
    /// The seven matrices in the file, in `MATRIX_NAMES` order.
    files: Vec<TensorInfo>,
    /// Resident weights, or None when the layer streams through a slot.
    mats: Option<Mats>,
}

enum Head {
    Resident {
        w: GpuWeight,
        plan: Vec<Dispatch>,
    },
    Streamed {
        info: TensorInfo,
        slots: [GpuBuffer; 2],
        chunk_rows: u32,
        /// One dispatch per chunk; chunk c computes from slot c % 2.
        plan: Vec<Dispatch>,
    },
}

struct Buffers {
    step: GpuBuffer,
    rope_cs: GpuBuffer,
    x: GpuBuffer,
    xn: GpuBuffer,
    q: GpuBuffer,
    att: GpuBuffer,
    h: GpuBuffer,
    last: GpuBuffer,
    last_n: GpuBuffer,
    logits: GpuBuffer,
    readback: GpuBuffer,
    /// The batch's keys and values before they are packed into an f16 cache.
    kv_tmp: Option<[GpuBuffer; 2]>,
}

/// I/O figures accumulated by the engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct IoTotals {
    pub upload: UploadStats,
    /// Seconds inside upload calls (reads, waits for free staging, submits).
    pub upload_s: f64,
    /// Bytes read from the model file for embedding rows.
    pub embd_bytes: u64,
}

/// Figures of one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Decode milliseconds per token.
    pub ms_per_token: f64,
    /// Bytes read from the model file per generated token (after load).
    pub flash_bytes_per_token: f64,
    /// Bytes moved through the staging ring per generated token.
    pub upload_bytes_per_token: f64,
    /// Staging-ring throughput during decode (bytes uploaded / seconds inside uploads).
    pub upload_gb_s: f64,
    /// The same without the time spent waiting for the GPU to free a staging slot: the
    /// flash-to-GPU path's own rate.
    pub flash_to_gpu_gb_s: f64,
    /// Share of decode time the GPU was not computing (waiting for I/O or the host).
    pub io_wait_share: f64,
    /// Decode time / max(I/O time, GPU compute time); 1.0 is perfect overlap. I/O time is the
    /// host's time on the flash-to-GPU path: reading into staging memory and queueing the copies
    /// (waits for the GPU to free a staging slot excluded).
    pub overlap_efficiency: f64,
    pub io_s: f64,
    /// Of `io_s`, the time inside file reads.
    pub read_s: f64,
    pub compute_s: f64,
    pub peak_device_bytes: u64,
    /// Milliseconds of each decode step.
    #[serde(skip)]
    pub token_ms: Vec<f64>,
}

/// The GPU engine for one model.
pub struct Engine {
    pub ctx: GpuContext,
    pub cfg: ModelConfig,
    pub placement: Placement,
    source: Box<dyn WeightSource>,
    embd: TensorInfo,
    layers: Vec<Layer>,
    slots: Vec<Mats>,
    head: Head,
    head_norm: Dispatch,
    _output_norm: GpuBuffer,
    bufs: Buffers,
    ring: Option<StagingRing>,
    decode_plans: Vec<Vec<Dispatch>>,
    prefill_plans: Vec<Vec<Dispatch>>,
    /// Streamed layer indices, in order.
    streamed: Vec<usize>,
    /// Streamed layers of the next pass whose uploads are already queued.
    prefetched: usize,
    n_past: usize,
    max_ctx: usize,
    ubatch: usize,
    pub io: IoTotals,
    pub tracer: Tracer,
    /// Bytes uploaded at load.
    pub load_bytes: u64,
    pub load_time: Duration,
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn round16(n: u64) -> u64 {
    n.max(16).div_ceil(16) * 16
}

/// Device bytes of a weight matrix as `kernels::upload_weight` splits it.
fn weight_bytes(t: &TensorInfo, max_binding: u64) -> u64 {
    let rb = t.row_bytes().max(1);
    let rows = t.n_rows();
    let rows_fit = (max_binding.saturating_sub(16) / rb).max(1);
    let per_part = rows_fit.min(65_535 * kernels::MM_ROWS_PER_WG as u64);
    let mut total = 0;
    let mut r = 0;
    while r < rows {
        let n = per_part.min(rows - r);
        total += round16(n * rb);
        r += n;
    }
    total
}

fn dims(t: &TensorInfo) -> Result<(u32, u32), EngineError> {
    let bad = || KernelError::Shape {
        kernel: "weights",
        problem: format!("{}: dimensions do not fit 32 bits", t.name),
    };
    Ok((
        u32::try_from(t.n_rows()).map_err(|_| bad())?,
        u32::try_from(t.row_len()).map_err(|_| bad())?,
    ))
}

/// An empty weight matrix on the device, split like `upload_weight` splits (a layer slot).
fn alloc_weight(ctx: &GpuContext, label: &str, t: &TensorInfo) -> Result<GpuWeight, EngineError> {
    let (rows, cols) = dims(t)?;
    let rb = kernels::row_bytes(t.ty, cols).ok_or_else(|| KernelError::Shape {
        kernel: "weights",
        problem: format!("{label}: row size overflows"),
    })?;
    let rows_fit = ((ctx.max_binding().saturating_sub(16)) / rb.max(1) as u64).max(1);
    let per_part = rows_fit.min(65_535 * kernels::MM_ROWS_PER_WG as u64) as u32;
    let mut parts = Vec::new();
    let mut r0 = 0;
    while r0 < rows {
        let n = per_part.min(rows - r0);
        parts.push((
            ctx.storage(&format!("{label}[{r0}..]"), n as u64 * rb as u64)?,
            r0,
            n,
        ));
        r0 += n;
    }
    Ok(GpuWeight {
        ty: t.ty,
        rows,
        cols,
        row_bytes: rb,
        parts,
    })
}

impl Engine {
    /// Plan the placement under the budget, upload what stays resident, build the dispatch lists.
    pub fn new(gguf: Arc<GgufFile>, opts: &EngineOptions) -> Result<Self, EngineError> {
        let source = Box::new(MapSource::new(gguf.clone()));
        Self::with_source(gguf, source, opts)
    }

    /// As [`Engine::new`], reading weights at run time from `source`.
    pub fn with_source(
        gguf: Arc<GgufFile>,
        source: Box<dyn WeightSource>,
        opts: &EngineOptions,
    ) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let ctx = GpuContext::new(&opts.gpu)?;
        let tensor = |name: &str| -> Result<TensorInfo, EngineError> {
            gguf.tensor(name)
                .cloned()
                .ok_or_else(|| EngineError::MissingTensor(name.to_string()))
        };
        let n_embd = cfg.n_embd;
        let q_dim = cfg.n_heads * cfg.head_dim;
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let ubatch = opts.ubatch.clamp(1, 512);
        let max_binding = ctx.max_binding();

        // Sizes for the placement.
        let mut layer_files = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let files = MATRIX_NAMES
                .iter()
                .map(|m| tensor(&format!("blk.{l}.{m}.weight")))
                .collect::<Result<Vec<_>, _>>()?;
            layer_files.push(files);
        }
        let layer_bytes: Vec<u64> = layer_files
            .iter()
            .map(|f| f.iter().map(|t| weight_bytes(t, max_binding)).sum())
            .collect();
        let head_info = if cfg.tied_output {
            tensor("token_embd.weight")?
        } else {
            tensor("output.weight")?
        };
        let head_bytes = weight_bytes(&head_info, max_binding);
        let head_row = head_info.row_bytes().max(1);
        let chunk_rows = (opts.head_chunk / head_row).clamp(1, head_info.n_rows().max(1));
        let head_chunk = round16(chunk_rows * head_row);
        let n_head_chunks = head_info.n_rows().div_ceil(chunk_rows);
        let f = |n: usize| round16((n * 4) as u64);
        let kv_f16 = opts.kv_f16 && kv_dim % 2 == 0;
        let kv_elt: u64 = if kv_f16 { 2 } else { 4 };
        let activations = 16
            + if kv_f16 { 2 * f(ubatch * kv_dim) } else { 0 }
            + f(ubatch * cfg.rope_dim.max(2))
            + 2 * f(ubatch * n_embd)
            + 2 * f(ubatch * q_dim)
            + f(ubatch * cfg.n_ff)
            + 2 * f(n_embd)
            + 2 * f(cfg.vocab_size);
        let norms = cfg.n_layers as u64 * 2 * f(n_embd)
            + f(n_embd)
            + if cfg.has_qkv_bias {
                cfg.n_layers as u64 * (f(q_dim) + 2 * f(kv_dim))
            } else {
                0
            };
        let per_layer_dispatches = 13 + if cfg.has_qkv_bias { 3 } else { 0 };
        let dispatches =
            cfg.n_layers as u64 * 2 * per_layer_dispatches + 2 + n_head_chunks.max(4) + 64;
        let params = dispatches * 48;
        let ring_chunk = opts.ring_chunk.max(4096).div_ceil(4096) * 4096;
        let largest_layer: u64 = layer_files
            .iter()
            .map(|f| f.iter().map(|t| t.n_bytes).sum::<u64>())
            .max()
            .unwrap_or(0);
        // Uploads are queued behind the compute already submitted, so a staging slot comes back
        // only when the GPU has passed that point: hold a whole layer to never stall on it.
        let ring_slots = if opts.ring_slots == 0 {
            (largest_layer.div_ceil(ring_chunk) as usize + 1).clamp(3, 64)
        } else {
            opts.ring_slots
        };
        let ring = crate::gpu::staging::ring_bytes(ring_slots, ring_chunk);
        let kv_per_token = cfg.n_layers as u64 * 2 * kv_dim as u64 * kv_elt;
        let slots_wanted = (opts.prefetch + 1).min(cfg.n_layers.max(1));
        let budget = opts.gpu.budget.unwrap_or(u64::MAX);
        let default_ctx = cfg.context_length.clamp(1, 2048);
        let max_layer = layer_bytes.iter().copied().max().unwrap_or(0);
        if layer_bytes.iter().any(|&b| b != max_layer) {
            log::debug!("layers differ in size; slots are sized for the largest");
        }
        let mut costs = Costs {
            kv: 0,
            activations,
            norms,
            params,
            ring,
            layer: max_layer,
            head: head_bytes,
            head_chunk,
        };
        let max_ctx = match opts.ctx {
            Some(c) => c.clamp(1, cfg.context_length.max(1)),
            None if opts.gpu.budget.is_none() => default_ctx,
            None => {
                // Under a budget the KV cache competes with resident weights: take what the
                // budget leaves beside the streaming minimum, at most 512 tokens (ask for more
                // with --ctx).
                let fixed = costs.activations + costs.norms + costs.params;
                let stream_min = fixed + ring + slots_wanted as u64 * max_layer + 2 * head_chunk;
                let all = fixed + cfg.n_layers as u64 * max_layer + head_bytes;
                let need = all.min(stream_min);
                let room = budget.saturating_sub(need) / kv_per_token.max(1);
                (room as usize).clamp(1, default_ctx.min(512))
            }
        };
        costs.kv = max_ctx as u64 * kv_per_token;
        let placement = placement::plan(costs, cfg.n_layers, budget, slots_wanted, &opts.resident)?;
        log::info!("{placement}");
        // Streamed layers share slots: they must all have the first streamed layer's shapes.
        let mut streamed_files = layer_files
            .iter()
            .enumerate()
            .filter(|(l, _)| !placement.resident_layers[*l])
            .map(|(_, f)| f);
        if let Some(first) = streamed_files.next() {
            for files in streamed_files {
                for (a, b) in files.iter().zip(first) {
                    if a.ty != b.ty || a.dims != b.dims {
                        return Err(EngineError::UnevenLayers(format!(
                            "{} differs from {}",
                            a.name, b.name
                        )));
                    }
                }
            }
        }

        let mut load_bytes = 0u64;
        let upload_matrix =
            |t: &TensorInfo, load_bytes: &mut u64| -> Result<GpuWeight, EngineError> {
                let (rows, cols) = dims(t)?;
                *load_bytes += t.n_bytes;
                Ok(kernels::upload_weight(
                    &ctx,
                    &t.name,
                    t.ty,
                    rows,
                    cols,
                    gguf.tensor_data(t),
                )?)
            };
        let vector = |name: &str| -> Result<GpuBuffer, EngineError> {
            let t = tensor(name)?;
            let mut v = vec![0f32; t.n_elements as usize];
            quant::dequantize(t.ty, gguf.tensor_data(&t), &mut v);
            Ok(ctx.storage_with(name, f32_bytes(&v))?)
        };

        let mut layers = Vec::with_capacity(cfg.n_layers);
        for (l, files) in layer_files.into_iter().enumerate() {
            let n = |s: &str| format!("blk.{l}.{s}");
            let bias = if cfg.has_qkv_bias {
                Some([
                    vector(&n("attn_q.bias"))?,
                    vector(&n("attn_k.bias"))?,
                    vector(&n("attn_v.bias"))?,
                ])
            } else {
                None
            };
            let mats = if placement.resident_layers[l] {
                let mut m = Vec::with_capacity(7);
                for t in &files {
                    m.push(upload_matrix(t, &mut load_bytes)?);
                }
                Some(Mats::from_vec(m)?)
            } else {
                None
            };
            let kv_bytes = max_ctx as u64 * kv_dim as u64 * kv_elt;
            layers.push(Layer {
                attn_norm: vector(&n("attn_norm.weight"))?,
                ffn_norm: vector(&n("ffn_norm.weight"))?,
                bias,
                k_cache: ctx.storage(&n("k_cache"), kv_bytes)?,
                v_cache: ctx.storage(&n("v_cache"), kv_bytes)?,
                files,
                mats,
            });
        }
        let streamed: Vec<usize> = (0..cfg.n_layers)
            .filter(|&l| !placement.resident_layers[l])
            .collect();
        let mut slots = Vec::new();
        if let Some(first) = streamed.first() {
            let files = &layers[*first].files;
            for s in 0..placement.slots {
                let mut m = Vec::with_capacity(7);
                for t in files {
                    m.push(alloc_weight(&ctx, &format!("slot{s}.{}", t.name), t)?);
                }
                slots.push(Mats::from_vec(m)?);
            }
        }
        let ring = if placement.streaming {
            Some(StagingRing::new(&ctx, ring_slots, ring_chunk)?)
        } else {
            None
        };

        let u = ubatch;
        let fb = |n: usize| (n * 4) as u64;
        let bufs = Buffers {
            step: ctx.buffer(
                "step",
                16,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            )?,
            rope_cs: ctx.storage("rope_cs", fb(u * cfg.rope_dim.max(2)))?,
            x: ctx.storage("x", fb(u * n_embd))?,
            xn: ctx.storage("xn", fb(u * n_embd))?,
            q: ctx.storage("q", fb(u * q_dim))?,
            att: ctx.storage("att", fb(u * q_dim))?,
            h: ctx.storage("h", fb(u * cfg.n_ff))?,
            last: ctx.storage("last", fb(n_embd))?,
            last_n: ctx.storage("last_n", fb(n_embd))?,
            logits: ctx.storage("logits", fb(cfg.vocab_size))?,
            readback: ctx.buffer(
                "logits readback",
                fb(cfg.vocab_size),
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )?,
            kv_tmp: if kv_f16 {
                Some([
                    ctx.storage("k batch", fb(u * kv_dim))?,
                    ctx.storage("v batch", fb(u * kv_dim))?,
                ])
            } else {
                None
            },
        };

        // Dispatch lists: a streamed layer is bound to slot (its index among streamed) % slots.
        let mut decode_plans = Vec::with_capacity(cfg.n_layers);
        let mut prefill_plans = Vec::with_capacity(cfg.n_layers);
        for (l, layer) in layers.iter().enumerate() {
            let mats = match &layer.mats {
                Some(m) => m,
                None => {
                    let si = streamed.iter().position(|&x| x == l).unwrap_or(0);
                    &slots[si % slots.len().max(1)]
                }
            };
            decode_plans.push(build_layer_plan(&ctx, &cfg, layer, mats, &bufs, 1)?);
            prefill_plans.push(build_layer_plan(
                &ctx,
                &cfg,
                layer,
                mats,
                &bufs,
                kernels::MM_PREFILL_TT,
            )?);
        }
        let output_norm = vector("output_norm.weight")?;
        let head_norm = kernels::rmsnorm(
            &ctx,
            &bufs.step,
            &bufs.last,
            &output_norm,
            &bufs.last_n,
            n_embd as u32,
            cfg.rms_eps,
            0,
            1,
        )?;
        let head_io = MatmulIo {
            x_stride: n_embd as u32,
            y_stride: cfg.vocab_size as u32,
            n_tokens: 1,
            token_tile: 1,
            ..Default::default()
        };
        let head = if placement.head_resident {
            let w = upload_matrix(&head_info, &mut load_bytes)?;
            let plan = kernels::matmul(&ctx, &bufs.step, &w, &bufs.last_n, &bufs.logits, head_io)?;
            Head::Resident { w, plan }
        } else {
            let (rows, cols) = dims(&head_info)?;
            let rb = head_info.row_bytes() as u32;
            let slots_h = [
                ctx.storage("head slot 0", head_chunk)?,
                ctx.storage("head slot 1", head_chunk)?,
            ];
            let chunk_rows = chunk_rows as u32;
            let mut plan = Vec::new();
            let mut r0 = 0u32;
            let mut c = 0usize;
            while r0 < rows {
                let n = chunk_rows.min(rows - r0);
                let part = WeightPart {
                    ty: head_info.ty,
                    cols,
                    row_bytes: rb,
                    buffer: &slots_h[c % 2],
                    first_row: r0,
                    rows: n,
                };
                plan.push(kernels::matmul_part(
                    &ctx,
                    &bufs.step,
                    &part,
                    None,
                    &bufs.last_n,
                    &bufs.logits,
                    head_io,
                )?);
                r0 += n;
                c += 1;
            }
            Head::Streamed {
                info: head_info.clone(),
                slots: slots_h,
                chunk_rows,
                plan,
            }
        };
        ctx.flush()?;
        log::info!(
            "uploaded {load_bytes} bytes of resident weights in {:.2?}; {} pipelines",
            t0.elapsed(),
            ctx.pipelines.len()
        );
        let embd = tensor("token_embd.weight")?;
        let mut engine = Self {
            ctx,
            cfg,
            placement,
            source,
            embd,
            layers,
            slots,
            head,
            head_norm,
            _output_norm: output_norm,
            bufs,
            ring,
            decode_plans,
            prefill_plans,
            streamed,
            prefetched: 0,
            n_past: 0,
            max_ctx,
            ubatch,
            io: IoTotals::default(),
            tracer: Tracer::new(opts.trace),
            load_bytes,
            load_time: Duration::ZERO,
        };
        engine.warm_up()?;
        engine.load_time = t0.elapsed();
        Ok(engine)
    }

    /// Run both dispatch lists once so drivers finish compiling before the first real token.
    fn warm_up(&mut self) -> Result<(), EngineError> {
        let n = 2.min(self.max_ctx);
        self.forward(&vec![0; n])?;
        self.reset();
        self.forward(&[0])?;
        self.reset();
        self.io = IoTotals::default();
        self.tracer = Tracer::new(self.tracer.keeps());
        Ok(())
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// KV cache capacity in tokens.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Forget the conversation (the KV cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Drop cached positions from `n` on (to rewind a conversation).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Bytes read from the model file since load (weights and embedding rows).
    pub fn flash_bytes(&self) -> u64 {
        self.source.bytes_read()
    }

    /// Write the collected spans as a Chrome trace.
    pub fn write_trace(&mut self, path: &std::path::Path) -> Result<(), EngineError> {
        self.tracer.collect_gpu();
        self.tracer.write(path).map_err(EngineError::Trace)
    }

    /// Append `tokens` to the sequence and return the logits after the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let needed = self.n_past + tokens.len();
        if needed > self.max_ctx {
            return Err(EngineError::ContextFull {
                needed,
                max: self.max_ctx,
                model_max: self.cfg.context_length,
            });
        }
        for &id in tokens {
            if id as usize >= self.cfg.vocab_size || id as u64 >= self.embd.n_rows() {
                return Err(EngineError::BadToken {
                    id,
                    vocab: self.cfg.vocab_size,
                });
            }
        }
        self.source.check().map_err(EngineError::Flash)?;
        let chunks: Vec<&[u32]> = tokens.chunks(self.ubatch).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            self.run_batch(chunk, i == last)?;
        }
        let t = self.tracer.now();
        let bytes = self
            .ctx
            .read_mapped(&self.bufs.readback, (self.cfg.vocab_size * 4) as u64)?;
        self.tracer.span("wait for logits", "wait", TID_HOST, t);
        self.tracer.collect_gpu();
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Read streamed layer `si` (index into `streamed`) into slot `si % slots`.
    fn upload_layer(&mut self, si: usize) -> Result<(), EngineError> {
        let l = self.streamed[si];
        let slot = si % self.slots.len();
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let t = self.tracer.now();
        // Ask for the streamed layer after this one ahead of its read.
        if let Some(&after) = self.streamed.get((si + 1) % self.streamed.len()) {
            for t_info in &self.layers[after].files {
                self.source.prefetch(t_info.offset, t_info.n_bytes);
            }
        }
        // The whole layer in one batch: few submissions, copies bounded by the ring's size.
        let mut reqs = Vec::new();
        for (t_info, w) in self.layers[l].files.iter().zip(self.slots[slot].all()) {
            for (buf, r0, n) in &w.parts {
                reqs.push(UploadReq {
                    src_offset: t_info.offset + *r0 as u64 * w.row_bytes as u64,
                    len: *n as u64 * w.row_bytes as u64,
                    dst: buf,
                    dst_offset: 0,
                });
            }
        }
        let st = ring.upload_batch(&self.ctx, self.source.as_ref(), &reqs)?;
        for t_info in &self.layers[l].files {
            self.source.release(t_info.offset, t_info.n_bytes);
        }
        self.io.upload.add(&st);
        self.io.upload_s += self.tracer.now() - t;
        self.tracer
            .span(format!("read+upload layer {l}"), "io", TID_IO, t);
        Ok(())
    }

    fn submit_compute(&mut self, enc: wgpu::CommandEncoder, name: String) {
        self.ctx.queue.submit([enc.finish()]);
        self.tracer.gpu_submitted(&self.ctx.queue, name);
    }

    /// One batch through all layers; with `want_logits` also the output head.
    fn run_batch(&mut self, tokens: &[u32], want_logits: bool) -> Result<(), EngineError> {
        let t = tokens.len();
        let pos0 = self.n_past;
        let n_embd = self.cfg.n_embd;
        let th = self.tracer.now();
        // Embedding rows, gathered from the file.
        let mut x = vec![0f32; t * n_embd];
        let row_bytes = self.embd.row_bytes() as usize;
        let mut row = vec![0u8; row_bytes];
        for (i, &id) in tokens.iter().enumerate() {
            let off = self.embd.offset + id as u64 * row_bytes as u64;
            self.source
                .read_into(off, &mut row)
                .map_err(|e| EngineError::Flash(e.to_string()))?;
            quant::dequantize(self.embd.ty, &row, &mut x[i * n_embd..(i + 1) * n_embd]);
            self.io.embd_bytes += row_bytes as u64;
        }
        let step = Step {
            n_tokens: t as u32,
            pos0: pos0 as u32,
            _pad: [0; 2],
        };
        self.ctx
            .write(&self.bufs.step, 0, bytemuck::bytes_of(&step));
        self.ctx.write(&self.bufs.x, 0, f32_bytes(&x));
        let cs = kernels::rope_table(
            pos0 as u32,
            t as u32,
            self.cfg.rope_dim as u32,
            self.cfg.rope_base,
        );
        self.ctx.write(&self.bufs.rope_cs, 0, f32_bytes(&cs));
        self.tracer.span("embed", "host", TID_HOST, th);

        let n_s = self.streamed.len();
        let window = self.slots.len().min(n_s);
        while self.prefetched < window {
            let k = self.prefetched;
            self.upload_layer(k)?;
            self.prefetched += 1;
        }
        self.prefetched = 0;
        if !self.placement.streaming {
            // Everything resident: all layers in one submission.
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            let plans = if t == 1 {
                &self.decode_plans
            } else {
                &self.prefill_plans
            };
            for plan in plans {
                kernels::record_all(&mut enc, plan, t as u32);
            }
            self.submit_compute(enc, "layers".into());
        }
        for l in 0..self.layers.len() {
            if !self.placement.streaming {
                break;
            }
            let mut enc = self
                .ctx
                .device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("layer"),
                });
            {
                let plan = if t == 1 {
                    &self.decode_plans[l]
                } else {
                    &self.prefill_plans[l]
                };
                kernels::record_all(&mut enc, plan, t as u32);
            }
            self.submit_compute(enc, format!("layer {l}"));
            if self.layers[l].mats.is_none() {
                let si = self.streamed.iter().position(|&x| x == l).unwrap_or(0);
                let next = si + self.slots.len();
                if next < n_s {
                    self.upload_layer(next)?;
                }
            }
        }
        if want_logits {
            let row = (n_embd * 4) as u64;
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(&self.bufs.x, (t as u64 - 1) * row, &self.bufs.last, 0, row);
            kernels::record_all(&mut enc, std::slice::from_ref(&self.head_norm), 1);
            match &self.head {
                Head::Resident { plan, .. } => {
                    kernels::record_all(&mut enc, plan, 1);
                    self.submit_compute(enc, "output head".into());
                }
                Head::Streamed { .. } => {
                    self.submit_compute(enc, "output norm".into());
                    self.stream_head()?;
                }
            }
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            enc.copy_buffer_to_buffer(
                &self.bufs.logits,
                0,
                &self.bufs.readback,
                0,
                (self.cfg.vocab_size * 4) as u64,
            );
            self.ctx.queue.submit([enc.finish()]);
        }
        // Queue the next pass's first streamed layers now, behind this pass's compute.
        while self.prefetched < window {
            let k = self.prefetched;
            self.upload_layer(k)?;
            self.prefetched += 1;
        }
        self.n_past += t;
        if !want_logits {
            self.ctx.wait()?;
        }
        Ok(())
    }

    /// Output head in row chunks through two slots: chunk c + 1 is read while c computes.
    fn stream_head(&mut self) -> Result<(), EngineError> {
        let Head::Streamed {
            info,
            slots,
            chunk_rows,
            plan,
        } = &self.head
        else {
            return Ok(());
        };
        let Some(ring) = self.ring.as_mut() else {
            return Ok(());
        };
        let rb = info.row_bytes();
        let rows = info.n_rows();
        let n_chunks = plan.len();
        let chunk_range = |c: usize| {
            let r0 = c as u64 * *chunk_rows as u64;
            let n = (*chunk_rows as u64).min(rows - r0);
            (info.offset + r0 * rb, n * rb)
        };
        let mut st = UploadStats::default();
        let t = self.tracer.now();
        for c in 0..n_chunks.min(2) {
            let (off, len) = chunk_range(c);
            st.add(&ring.upload(&self.ctx, self.source.as_ref(), off, len, &slots[c % 2], 0)?);
        }
        for c in 0..n_chunks {
            let mut enc = self.ctx.device.create_command_encoder(&Default::default());
            kernels::record_all(&mut enc, std::slice::from_ref(&plan[c]), 1);
            self.ctx.queue.submit([enc.finish()]);
            self.tracer
                .gpu_submitted(&self.ctx.queue, format!("output head chunk {c}"));
            if c + 2 < n_chunks {
                let (off, len) = chunk_range(c + 2);
                st.add(&ring.upload(
                    &self.ctx,
                    self.source.as_ref(),
                    off,
                    len,
                    &slots[c % 2],
                    0,
                )?);
            }
        }
        self.io.upload.add(&st);
        self.io.upload_s += self.tracer.now() - t;
        self.tracer.span("read+upload output head", "io", TID_IO, t);
        Ok(())
    }

    /// Generate up to `n` tokens after `prompt` (appended to what is cached). `on_token` gets
    /// each new id and returns false to stop; generation also stops at `is_end`.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        is_end: impl Fn(u32) -> bool,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        let start = Instant::now();
        let mut history: Vec<u32> = prompt.to_vec();
        let mut logits = self.forward(prompt)?;
        let prefill_s = start.elapsed().as_secs_f64();
        let flash0 = self.source.bytes_read();
        let io0 = self.io;
        let compute0 = self.tracer.compute_s;
        let mut out = Vec::new();
        let mut ttft_ms = 0.0;
        let decode_start = Instant::now();
        let mut decode_forwards = 0usize;
        let mut token_ms = Vec::new();
        while out.len() < n {
            let id = sampler.sample(&logits, &history);
            if out.is_empty() {
                ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            out.push(id);
            history.push(id);
            let go_on = on_token(id);
            if !go_on || is_end(id) || out.len() >= n {
                break;
            }
            let t = Instant::now();
            logits = self.forward(&[id])?;
            token_ms.push(t.elapsed().as_secs_f64() * 1e3);
            decode_forwards += 1;
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        self.tracer.collect_gpu();
        let read_s = self.io.upload.read_s - io0.upload.read_s;
        let up_bytes = self.io.upload.bytes - io0.upload.bytes;
        let up_s = self.io.upload_s - io0.upload_s;
        let wait_s = self.io.upload.wait_s - io0.upload.wait_s;
        let compute_s = self.tracer.compute_s - compute0;
        let per = decode_forwards.max(1) as f64;
        let stats = GenStats {
            prompt_tokens: prompt.len(),
            generated_tokens: out.len(),
            prefill_s,
            decode_s,
            ttft_ms,
            prefill_tok_s: prompt.len() as f64 / prefill_s.max(1e-9),
            decode_tok_s: if decode_forwards > 0 {
                decode_forwards as f64 / decode_s.max(1e-9)
            } else {
                0.0
            },
            ms_per_token: decode_s * 1e3 / per,
            flash_bytes_per_token: (self.source.bytes_read() - flash0) as f64 / per,
            upload_bytes_per_token: up_bytes as f64 / per,
            upload_gb_s: if up_s > 0.0 {
                up_bytes as f64 / up_s / 1e9
            } else {
                0.0
            },
            flash_to_gpu_gb_s: if up_s - wait_s > 0.0 {
                up_bytes as f64 / (up_s - wait_s) / 1e9
            } else {
                0.0
            },
            io_wait_share: if decode_s > 0.0 {
                (1.0 - compute_s / decode_s).clamp(0.0, 1.0)
            } else {
                0.0
            },
            overlap_efficiency: if decode_forwards > 0 {
                decode_s / (up_s - wait_s).max(compute_s).max(1e-9)
            } else {
                0.0
            },
            io_s: up_s - wait_s,
            read_s,
            compute_s,
            peak_device_bytes: self.ctx.budget.peak(),
            token_ms,
        };
        Ok((out, stats))
    }
}

fn build_layer_plan(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    l: &Layer,
    m: &Mats,
    b: &Buffers,
    tt: u32,
) -> Result<Vec<Dispatch>, EngineError> {
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
    let mut plan = Vec::new();
    plan.push(kernels::rmsnorm(
        ctx,
        &b.step,
        &b.x,
        &l.attn_norm,
        &b.xn,
        n_embd,
        cfg.rms_eps,
        0,
        0,
    )?);
    plan.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.q,
        &b.xn,
        &b.q,
        io(n_embd, q_dim),
    )?);
    // f32 cache: K and V land straight in the cache rows at pos0 + t. f16 cache: they land in
    // batch buffers, get their bias and RoPE there, and are packed into the cache afterwards.
    let (k_dst, v_dst, at_pos): (&wgpu::Buffer, &wgpu::Buffer, bool) = match &b.kv_tmp {
        Some([kt, vt]) => (kt, vt, false),
        None => (&l.k_cache, &l.v_cache, true),
    };
    let kv_io = MatmulIo {
        y_at_pos: at_pos,
        ..io(n_embd, kv_dim)
    };
    plan.extend(kernels::matmul(ctx, &b.step, &m.k, &b.xn, k_dst, kv_io)?);
    plan.extend(kernels::matmul(ctx, &b.step, &m.v, &b.xn, v_dst, kv_io)?);
    if let Some([bq, bk, bv]) = &l.bias {
        plan.push(kernels::add_bias(
            ctx, &b.step, bq, &b.q, q_dim, q_dim, false,
        )?);
        plan.push(kernels::add_bias(
            ctx, &b.step, bk, k_dst, kv_dim, kv_dim, at_pos,
        )?);
        plan.push(kernels::add_bias(
            ctx, &b.step, bv, v_dst, kv_dim, kv_dim, at_pos,
        )?);
    }
    let rope_dim = cfg.rope_dim as u32;
    plan.push(kernels::rope(
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
    plan.push(kernels::rope(
        ctx,
        &b.step,
        &b.rope_cs,
        k_dst,
        cfg.n_kv_heads as u32,
        hd,
        rope_dim,
        kv_dim,
        at_pos,
        neox,
    )?);
    if b.kv_tmp.is_some() {
        plan.push(kernels::kv_store_f16(
            ctx, &b.step, k_dst, &l.k_cache, kv_dim,
        )?);
        plan.push(kernels::kv_store_f16(
            ctx, &b.step, v_dst, &l.v_cache, kv_dim,
        )?);
    }
    plan.push(kernels::attention(
        ctx,
        &b.step,
        &b.q,
        &l.k_cache,
        &l.v_cache,
        &b.att,
        cfg.n_heads as u32,
        cfg.n_kv_heads as u32,
        hd,
        b.kv_tmp.is_some(),
    )?);
    plan.extend(kernels::matmul(
        ctx,
        &b.step,
        &m.o,
        &b.att,
        &b.x,
        MatmulIo {
            accumulate: true,
            ..io(q_dim, n_embd)
        },
    )?);
    plan.push(kernels::rmsnorm(
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
    plan.extend(kernels::matmul_swiglu(
        ctx,
        &b.step,
        &m.g,
        &m.u,
        &b.xn,
        &b.h,
        io(n_embd, n_ff),
    )?);
    plan.extend(kernels::matmul(
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
    Ok(plan)
}

/// Measurements used by the benchmarks.
impl Engine {
    /// Weight bytes one decode step's matrix products read.
    pub fn matvec_weight_bytes(&self) -> u64 {
        let mut total = 0;
        for l in &self.layers {
            for t in &l.files {
                total += t.n_bytes;
            }
        }
        let head = match &self.head {
            Head::Resident { w, .. } => w.bytes(),
            Head::Streamed { info, .. } => info.n_bytes,
        };
        total + head
    }

    /// Run every decode matrix product `reps` times in one submission; returns seconds.
    /// Only meaningful with everything resident.
    pub fn time_matvecs(&mut self, reps: usize) -> Result<f64, EngineError> {
        let step = Step {
            n_tokens: 1,
            pos0: 0,
            _pad: [0; 2],
        };
        self.ctx
            .write(&self.bufs.step, 0, bytemuck::bytes_of(&step));
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            let head: &[Dispatch] = match &self.head {
                Head::Resident { plan, .. } => plan,
                Head::Streamed { plan, .. } => plan,
            };
            for _ in 0..reps {
                for d in self
                    .decode_plans
                    .iter()
                    .flatten()
                    .chain(head)
                    .filter(|d| d.label == "matmul")
                {
                    d.record(&mut pass, 1);
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }

    /// Copy every resident weight buffer the decode products read `reps` times (a plain device
    /// memcpy of the same bytes); returns seconds.
    pub fn time_weight_copies(&mut self, reps: usize) -> Result<f64, EngineError> {
        let mut parts: Vec<&GpuBuffer> = Vec::new();
        for l in &self.layers {
            if let Some(m) = &l.mats {
                for w in m.all() {
                    parts.extend(w.parts.iter().map(|p| &p.0));
                }
            }
        }
        if let Head::Resident { w, .. } = &self.head {
            parts.extend(w.parts.iter().map(|p| &p.0));
        }
        let max = parts.iter().map(|b| b.size).max().unwrap_or(16);
        let scratch = self.ctx.storage("copy scratch", max)?;
        self.ctx.wait()?;
        let t0 = Instant::now();
        let mut enc = self.ctx.device.create_command_encoder(&Default::default());
        for _ in 0..reps {
            for b in &parts {
                enc.copy_buffer_to_buffer(b, 0, &scratch, 0, b.size);
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.ctx.wait()?;
        Ok(t0.elapsed().as_secs_f64())
    }
}
