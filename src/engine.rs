//! The per-token schedule: embeddings in, one compute pass over all layers, logits out.
//!
//! A forward pass over a batch of T tokens at positions [pos0, pos0 + T):
//! 1. the host gathers the T embedding rows from the model file and writes them, with the
//!    step values (T, pos0) and the RoPE cos/sin table, into device buffers;
//! 2. one compute pass replays the prebuilt dispatch list: per layer RMSNorm, Q/K/V products
//!    (K and V written straight into the cache rows), RoPE, attention, the output product added
//!    into the residual, RMSNorm, the fused gate/up SwiGLU product and the down product added
//!    into the residual;
//! 3. the last token's row is normed and multiplied by the output head; the logits are read back.
//!
//! Prefill uses matrix-matrix kernels (several tokens per weight read); decode uses T = 1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile, TensorInfo, quant};
use crate::gpu::{GpuBuffer, GpuContext, GpuError, GpuOptions};
use crate::kernels::{self, Dispatch, GpuWeight, KernelError, MatmulIo, Step};
use crate::model::config::{ModelConfig, RopeStyle};
use crate::sampling::Sampler;

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
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    #[error(
        "context full: {needed} positions needed, the context holds {max} (raise --ctx, up to the model's {model_max})"
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
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub gpu: GpuOptions,
    /// KV cache length in tokens (default: the model's context, at most 2048).
    pub ctx: Option<usize>,
    /// Tokens per prefill batch.
    pub ubatch: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            gpu: GpuOptions::default(),
            ctx: None,
            ubatch: 64,
        }
    }
}

struct LayerWeights {
    attn_norm: GpuBuffer,
    wq: GpuWeight,
    wk: GpuWeight,
    wv: GpuWeight,
    wo: GpuWeight,
    bias: Option<[GpuBuffer; 3]>,
    ffn_norm: GpuBuffer,
    wg: GpuWeight,
    wu: GpuWeight,
    wd: GpuWeight,
    k_cache: GpuBuffer,
    v_cache: GpuBuffer,
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
    /// Bytes read from the model file per generated token (after load).
    pub flash_bytes_per_token: f64,
    pub peak_device_bytes: u64,
}

/// The GPU engine for one model.
pub struct Engine {
    pub ctx: GpuContext,
    pub cfg: ModelConfig,
    gguf: Arc<GgufFile>,
    embd: TensorInfo,
    layers: Vec<LayerWeights>,
    _output_norm: GpuBuffer,
    _output: Option<GpuWeight>,
    bufs: Buffers,
    decode_plan: Vec<Dispatch>,
    prefill_plan: Vec<Dispatch>,
    logits_plan: Vec<Dispatch>,
    n_past: usize,
    max_ctx: usize,
    ubatch: usize,
    /// Bytes read from the model file since load (embedding rows).
    flash_bytes: u64,
    /// Bytes uploaded at load.
    pub load_bytes: u64,
    pub load_time: Duration,
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl Engine {
    /// Upload the model and build the dispatch lists.
    pub fn new(gguf: Arc<GgufFile>, opts: &EngineOptions) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let ctx = GpuContext::new(&opts.gpu)?;
        let max_ctx = opts
            .ctx
            .unwrap_or_else(|| cfg.context_length.min(2048))
            .clamp(1, cfg.context_length.max(1));
        let ubatch = opts.ubatch.clamp(1, 512);
        let tensor = |name: &str| -> Result<&TensorInfo, EngineError> {
            gguf.tensor(name)
                .ok_or_else(|| EngineError::MissingTensor(name.to_string()))
        };
        let mut load_bytes = 0u64;
        let mut matrix = |name: &str| -> Result<GpuWeight, EngineError> {
            let t = tensor(name)?;
            let rows = u32::try_from(t.n_rows()).map_err(|_| KernelError::Shape {
                kernel: "upload",
                problem: format!("{name}: too many rows"),
            })?;
            let cols = u32::try_from(t.row_len()).map_err(|_| KernelError::Shape {
                kernel: "upload",
                problem: format!("{name}: rows too long"),
            })?;
            load_bytes += t.n_bytes;
            Ok(kernels::upload_weight(
                &ctx,
                name,
                t.ty,
                rows,
                cols,
                gguf.tensor_data(t),
            )?)
        };
        let mut vectors = Vec::new();
        let mut vector = |name: &str| -> Result<GpuBuffer, EngineError> {
            let t = tensor(name)?;
            let mut v = vec![0f32; t.n_elements as usize];
            quant::dequantize(t.ty, gguf.tensor_data(t), &mut v);
            vectors.push(t.n_bytes);
            Ok(ctx.storage_with(name, f32_bytes(&v))?)
        };

        let n_embd = cfg.n_embd;
        let q_dim = cfg.n_heads * cfg.head_dim;
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
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
            let kv_bytes = (max_ctx * kv_dim * 4) as u64;
            layers.push(LayerWeights {
                attn_norm: vector(&n("attn_norm.weight"))?,
                wq: matrix(&n("attn_q.weight"))?,
                wk: matrix(&n("attn_k.weight"))?,
                wv: matrix(&n("attn_v.weight"))?,
                wo: matrix(&n("attn_output.weight"))?,
                bias,
                ffn_norm: vector(&n("ffn_norm.weight"))?,
                wg: matrix(&n("ffn_gate.weight"))?,
                wu: matrix(&n("ffn_up.weight"))?,
                wd: matrix(&n("ffn_down.weight"))?,
                k_cache: ctx.storage(&format!("blk.{l}.k_cache"), kv_bytes)?,
                v_cache: ctx.storage(&format!("blk.{l}.v_cache"), kv_bytes)?,
            });
        }
        let output_norm = vector("output_norm.weight")?;
        let output = if cfg.tied_output {
            matrix("token_embd.weight")?
        } else {
            matrix("output.weight")?
        };
        load_bytes += vectors.iter().sum::<u64>();
        let embd = tensor("token_embd.weight")?.clone();

        let u = ubatch;
        let f = |n: usize| (n * 4) as u64;
        let bufs = Buffers {
            step: ctx.buffer(
                "step",
                16,
                wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            )?,
            rope_cs: ctx.storage("rope_cs", f(u * cfg.rope_dim.max(2)))?,
            x: ctx.storage("x", f(u * n_embd))?,
            xn: ctx.storage("xn", f(u * n_embd))?,
            q: ctx.storage("q", f(u * q_dim))?,
            att: ctx.storage("att", f(u * q_dim))?,
            h: ctx.storage("h", f(u * cfg.n_ff))?,
            last: ctx.storage("last", f(n_embd))?,
            last_n: ctx.storage("last_n", f(n_embd))?,
            logits: ctx.storage("logits", f(cfg.vocab_size))?,
            readback: ctx.buffer(
                "logits readback",
                f(cfg.vocab_size),
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )?,
        };
        let decode_plan = build_layers_plan(&ctx, &cfg, &layers, &bufs, 1)?;
        let prefill_plan = build_layers_plan(&ctx, &cfg, &layers, &bufs, kernels::MM_PREFILL_TT)?;
        let mut logits_plan = vec![kernels::rmsnorm(
            &ctx,
            &bufs.step,
            &bufs.last,
            &output_norm,
            &bufs.last_n,
            n_embd as u32,
            cfg.rms_eps,
            0,
            1,
        )?];
        logits_plan.extend(kernels::matmul(
            &ctx,
            &bufs.step,
            &output,
            &bufs.last_n,
            &bufs.logits,
            MatmulIo {
                x_stride: n_embd as u32,
                y_stride: cfg.vocab_size as u32,
                n_tokens: 1,
                token_tile: 1,
                ..Default::default()
            },
        )?);
        ctx.wait()?;
        log::info!(
            "uploaded {} layers, {} bytes of weights in {:.2?}; {} pipelines",
            cfg.n_layers,
            load_bytes,
            t0.elapsed(),
            ctx.pipelines.len()
        );
        let mut engine = Self {
            ctx,
            cfg,
            gguf,
            embd,
            layers,
            _output_norm: output_norm,
            _output: Some(output),
            bufs,
            decode_plan,
            prefill_plan,
            logits_plan,
            n_past: 0,
            max_ctx,
            ubatch,
            flash_bytes: 0,
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
        self.flash_bytes = 0;
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

    /// Bytes read from the model file since load.
    pub fn flash_bytes(&self) -> u64 {
        self.flash_bytes
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
        let chunks: Vec<&[u32]> = tokens.chunks(self.ubatch).collect();
        let last = chunks.len() - 1;
        for (i, chunk) in chunks.into_iter().enumerate() {
            self.run_batch(chunk, i == last)?;
        }
        let bytes = self
            .ctx
            .read_mapped(&self.bufs.readback, (self.cfg.vocab_size * 4) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// One batch through all layers; with `want_logits` also the output head.
    fn run_batch(&mut self, tokens: &[u32], want_logits: bool) -> Result<(), EngineError> {
        let t = tokens.len();
        let pos0 = self.n_past;
        let n_embd = self.cfg.n_embd;
        // Embedding rows, gathered from the file.
        let mut x = vec![0f32; t * n_embd];
        let row_bytes = self.embd.row_bytes() as usize;
        let data = self.gguf.tensor_data(&self.embd);
        for (i, &id) in tokens.iter().enumerate() {
            let a = id as usize * row_bytes;
            quant::dequantize(
                self.embd.ty,
                &data[a..a + row_bytes],
                &mut x[i * n_embd..(i + 1) * n_embd],
            );
            self.flash_bytes += row_bytes as u64;
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

        let mut enc = self
            .ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("forward"),
            });
        let plan = if t == 1 {
            &self.decode_plan
        } else {
            &self.prefill_plan
        };
        kernels::record_all(&mut enc, plan, t as u32);
        if want_logits {
            let row = (n_embd * 4) as u64;
            enc.copy_buffer_to_buffer(&self.bufs.x, (t as u64 - 1) * row, &self.bufs.last, 0, row);
            kernels::record_all(&mut enc, &self.logits_plan, 1);
            enc.copy_buffer_to_buffer(
                &self.bufs.logits,
                0,
                &self.bufs.readback,
                0,
                (self.cfg.vocab_size * 4) as u64,
            );
        }
        self.ctx.queue.submit([enc.finish()]);
        self.n_past += t;
        if !want_logits {
            self.ctx.wait()?;
        }
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
        let flash0 = self.flash_bytes;
        let mut out = Vec::new();
        let mut ttft_ms = 0.0;
        let decode_start = Instant::now();
        let mut decode_forwards = 0usize;
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
            logits = self.forward(&[id])?;
            decode_forwards += 1;
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
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
            flash_bytes_per_token: (self.flash_bytes - flash0) as f64 / out.len().max(1) as f64,
            peak_device_bytes: self.ctx.budget.peak(),
        };
        Ok((out, stats))
    }
}

fn build_layers_plan(
    ctx: &GpuContext,
    cfg: &ModelConfig,
    layers: &[LayerWeights],
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
    for l in layers {
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
            &l.wq,
            &b.xn,
            &b.q,
            io(n_embd, q_dim),
        )?);
        let at_pos = MatmulIo {
            y_at_pos: true,
            ..io(n_embd, kv_dim)
        };
        plan.extend(kernels::matmul(
            ctx, &b.step, &l.wk, &b.xn, &l.k_cache, at_pos,
        )?);
        plan.extend(kernels::matmul(
            ctx, &b.step, &l.wv, &b.xn, &l.v_cache, at_pos,
        )?);
        if let Some([bq, bk, bv]) = &l.bias {
            plan.push(kernels::add_bias(
                ctx, &b.step, bq, &b.q, q_dim, q_dim, false,
            )?);
            plan.push(kernels::add_bias(
                ctx, &b.step, bk, &l.k_cache, kv_dim, kv_dim, true,
            )?);
            plan.push(kernels::add_bias(
                ctx, &b.step, bv, &l.v_cache, kv_dim, kv_dim, true,
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
            &l.k_cache,
            cfg.n_kv_heads as u32,
            hd,
            rope_dim,
            kv_dim,
            true,
            neox,
        )?);
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
        )?);
        plan.extend(kernels::matmul(
            ctx,
            &b.step,
            &l.wo,
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
            &l.wg,
            &l.wu,
            &b.xn,
            &b.h,
            io(n_embd, n_ff),
        )?);
        plan.extend(kernels::matmul(
            ctx,
            &b.step,
            &l.wd,
            &b.h,
            &b.x,
            MatmulIo {
                accumulate: true,
                ..io(n_ff, n_embd)
            },
        )?);
    }
    Ok(plan)
}

/// Measurements used by the benchmarks.
impl Engine {
    /// Weight bytes one decode step's matrix products read.
    pub fn matvec_weight_bytes(&self) -> u64 {
        let mut total = 0;
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.wg, &l.wu, &l.wd] {
                total += w.bytes();
            }
        }
        total + self._output.as_ref().map(|w| w.bytes()).unwrap_or(0)
    }

    /// Run every decode matrix product `reps` times in one submission; returns seconds.
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
            for _ in 0..reps {
                for d in self
                    .decode_plan
                    .iter()
                    .chain(&self.logits_plan)
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

    /// Copy every weight buffer the decode products read `reps` times (a plain device memcpy
    /// of the same bytes); returns seconds.
    pub fn time_weight_copies(&mut self, reps: usize) -> Result<f64, EngineError> {
        let mut parts: Vec<&GpuBuffer> = Vec::new();
        for l in &self.layers {
            for w in [&l.wq, &l.wk, &l.wv, &l.wo, &l.wg, &l.wu, &l.wd] {
                parts.extend(w.parts.iter().map(|p| &p.0));
            }
        }
        if let Some(o) = &self._output {
            parts.extend(o.parts.iter().map(|p| &p.0));
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
