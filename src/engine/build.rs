//! Loading: allocate what the execution plan lists, upload the resident weights, build the
//! dispatch lists.

use std::sync::Arc;
use std::time::Instant;

use super::layers::{self, Buffers, KvBuffers, Layer, Mats};
use super::stats::{IoTotals, KvRunStats};
use super::trace::Tracer;
use super::upload::Uploader;
use super::{Engine, EngineError, EngineOptions, Head, SeqState};
use crate::flash::source::WeightSource;
use crate::gguf::{GgufFile, quant};
use crate::gpu::staging::StagingRing;
use crate::gpu::{GpuBuffer, GpuContext};
use crate::kernels::{self, KvShape, MatmulIo, WeightPart};
use crate::kv::pages::PageMap;
use crate::kv::store::{KvLayout, KvStore};
use crate::model::config::ModelConfig;
use crate::plan::ExecPlan;

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

impl Engine {
    /// As [`Engine::new`], reading weights at run time from `source`.
    pub fn with_source(
        gguf: Arc<GgufFile>,
        source: Arc<dyn WeightSource>,
        opts: &EngineOptions,
    ) -> Result<Self, EngineError> {
        let ctx = Arc::new(GpuContext::new(&opts.gpu)?);
        Self::with_context(gguf, source, opts, ctx)
    }

    /// The plan options the engine plans with on `ctx`: `opts`'s, with the upload path decided
    /// for the adapter and room for the profiler's buffers.
    pub fn device_plan_options(
        opts: &EngineOptions,
        ctx: &GpuContext,
    ) -> Result<crate::plan::PlanOptions, EngineError> {
        let in_place = match opts.upload {
            // Where device memory is host memory. Measured on lavapipe (bench stream, S1, 3
            // rounds side by side): in place 109.4 ms/token against 115.3 through the staging
            // ring, which also leaves room for a resident layer within 16 MiB; the copies the
            // ring saves ran on the device's one queue, between the layers' compute.
            super::UploadMode::Auto => {
                ctx.mappable
                    && matches!(
                        ctx.info.device_type,
                        wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::Cpu
                    )
            }
            super::UploadMode::Staging => false,
            super::UploadMode::InPlace if ctx.mappable => true,
            super::UploadMode::InPlace => {
                return Err(EngineError::InPlaceUnsupported(ctx.describe()));
            }
        };
        let mut popts = opts.plan_options();
        popts.in_place = in_place;
        popts.fuse_norms = kernels::norm_fusion_available(ctx);
        popts.fuse_rope = opts.fuse_rope && kernels::rope_fusion_available(ctx);
        popts.bind_align = u64::from(ctx.limits.min_storage_buffer_offset_alignment);
        if opts.profile && ctx.timestamps {
            popts.extra_bytes += crate::gpu::profile::PROFILE_BYTES;
        }
        Ok(popts)
    }

    /// What the plan depends on about `ctx` (recorded in calibration profiles, so `flashlm
    /// plan` plans as a run on this device would).
    pub fn device_facts(ctx: &GpuContext) -> Result<crate::plan::perf::DeviceFacts, EngineError> {
        let po = Self::device_plan_options(&EngineOptions::default(), ctx)?;
        Ok(crate::plan::perf::DeviceFacts {
            max_binding: ctx.max_binding(),
            auto_in_place: po.in_place,
            fuse_norms: po.fuse_norms,
            fuse_rope: po.fuse_rope,
            bind_align: po.bind_align,
            driver_threads: (ctx.info.device_type == wgpu::DeviceType::Cpu)
                .then(crate::gpu::softdriver::threads_set)
                .flatten()
                .map(|n| n as u32),
        })
    }

    /// As [`Engine::with_source`], on a device already open.
    pub fn with_context(
        gguf: Arc<GgufFile>,
        source: Arc<dyn WeightSource>,
        opts: &EngineOptions,
        ctx: Arc<GpuContext>,
    ) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let cfg = ModelConfig::from_gguf(&gguf)?;
        let popts = Self::device_plan_options(opts, &ctx)?;
        let in_place = popts.in_place;
        let plan = ExecPlan::new(&gguf, &cfg, ctx.max_binding(), &popts)?;
        log::info!("{}", plan.placement);
        let tensor = |name: &str| {
            gguf.tensor(name)
                .cloned()
                .ok_or_else(|| EngineError::MissingTensor(name.to_string()))
        };
        // Tensor bytes come through the weight source (the flash reader), one tensor at a time:
        // no page of the file's map stays in this process and a file that shrinks is an error.
        // They are read once, so around the host cache, which is left to what streams.
        let read = |t: &crate::gguf::TensorInfo| -> Result<Vec<u8>, EngineError> {
            let mut buf = vec![0u8; t.n_bytes as usize];
            source
                .read_uncached(t.offset, &mut buf)
                .map_err(|e| EngineError::Flash(format!("{}: {e}", t.name)))?;
            Ok(buf)
        };
        let vector = |name: &str| -> Result<crate::gpu::GpuBuffer, EngineError> {
            let t = tensor(name)?;
            let mut v = vec![0f32; t.n_elements as usize];
            quant::dequantize(t.ty, &read(&t)?, &mut v);
            Ok(ctx.storage_with(name, f32_bytes(&v))?)
        };
        let kv = &plan.kv;
        let mut load_bytes = 0u64;
        let mut layer_objs = Vec::with_capacity(cfg.n_layers);
        for (l, lw) in plan.layers.iter().enumerate() {
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
            let mats = if plan.placement.resident_layers[l] {
                // The layer's matrices in one buffer where they fit one binding unpadded (the
                // same bytes as apart), as a streamed layer's are in its slot.
                let align = u64::from(ctx.limits.min_storage_buffer_offset_alignment);
                let packed = match kernels::packed_offsets(&lw.layouts, align, ctx.max_binding()) {
                    Some((at, total)) => Some((at, Arc::new(ctx.storage(&n("matrices"), total)?))),
                    None => None,
                };
                let mut m = Vec::with_capacity(lw.files.len());
                for (i, (t, lay)) in lw.files.iter().zip(&lw.layouts).enumerate() {
                    load_bytes += t.n_bytes;
                    let data = read(t)?;
                    m.push(match &packed {
                        Some((at, b)) => lay.upload_into(&ctx, &t.name, &data, b.clone(), at[i])?,
                        None => lay.upload(&ctx, &t.name, &data)?,
                    });
                }
                // Keep the queued writes (host copies) to one layer at a time.
                ctx.flush()?;
                Some(Mats::new(lw.roles.clone(), m)?)
            } else {
                None
            };
            let names = crate::model::config::LayerNames::new(l);
            let qk_norm = if cfg.qk_norm {
                Some([vector(&names.attn_q_norm)?, vector(&names.attn_k_norm)?])
            } else {
                None
            };
            let post_norms = if cfg.post_norms {
                Some([
                    vector(&names.post_attention_norm)?,
                    vector(&names.post_ffw_norm)?,
                ])
            } else {
                None
            };
            let meta = if kv.selects_layer(l) {
                Some(ctx.storage(
                    &n("kv meta"),
                    kv.max_pages as u64 * 2 * kv.kv_dim as u64 * 4,
                )?)
            } else {
                None
            };
            layer_objs.push(Layer {
                attn_norm: vector(&n("attn_norm.weight"))?,
                ffn_norm: vector(&n("ffn_norm.weight"))?,
                bias,
                qk_norm,
                post_norms,
                local: cfg.is_swa(l),
                home: ctx.storage(&n("kv home"), kv.home_slots() as u64 * kv.page_bytes)?,
                meta,
                mats,
            });
        }
        let streamed = plan.streamed_layers();
        let direct_in_place = in_place && source.io_mode() == Some(crate::flash::IoMode::Direct);
        let (slot_bufs, slot_bases, stream_mats) =
            super::slots::layer_slots(&ctx, &plan, &streamed, in_place, direct_in_place)?;
        let n_slots = slot_bufs.len();
        let ring = if plan.placement.streaming || kv.streams {
            Some(StagingRing::new(&ctx, plan.ring_slots, plan.ring_chunk)?)
        } else {
            None
        };
        let s = &plan.sizes;
        let st = crate::gpu::BufferUsage::Storage;
        let bufs = Buffers {
            step: ctx.uniform("step", s.step)?,
            rows: ctx.alloc_as("rows", s.rows, st)?,
            rope_cs: ctx.alloc_as("rope_cs", s.rope_cs, st)?,
            rope_cs_swa: if s.rope_cs_swa > 0 {
                Some(ctx.alloc_as("rope_cs local", s.rope_cs_swa, st)?)
            } else {
                None
            },
            x: ctx.alloc_as("x", s.x, st)?,
            xn: ctx.alloc_as("xn", s.x, st)?,
            q: ctx.alloc_as("q", s.q, st)?,
            att: ctx.alloc_as("att", s.q, st)?,
            h: ctx.alloc_as("h", s.h, st)?,
            k_tmp: ctx.alloc_as("k batch", s.kv_tmp, st)?,
            v_tmp: ctx.alloc_as("v batch", s.kv_tmp, st)?,
            last: ctx.alloc_as("last", s.last, st)?,
            last_n: ctx.alloc_as("last_n", s.last, st)?,
            logits: ctx.alloc_as("logits", s.logits, st)?,
            readback: ctx.alloc_as(
                "logits readback",
                s.logits,
                crate::gpu::BufferUsage::Readback,
            )?,
            part: ctx.alloc_as("attention partials", s.part, st)?,
            running: ctx.alloc_as("attention running", s.running, st)?,
        };
        let selecting = kv.select.is_some();
        let table_words = cfg.n_layers * kv.layer_words as usize;
        let kvb = KvBuffers {
            table: ctx.alloc_as("page table", table_words as u64 * 4, st)?,
            stream: ctx.alloc_as("kv stream pool", kv.stream_slots as u64 * kv.page_bytes, st)?,
            pageout: ctx.alloc_as(
                "kv page-out",
                kv.pageout_pages as u64 * kv.page_bytes,
                crate::gpu::BufferUsage::Readback,
            )?,
            jobs: if selecting {
                Some(ctx.alloc_as("kv meta jobs", (4 + 4 * kv.touched_pages as u64) * 4, st)?)
            } else {
                None
            },
            scores: if selecting {
                Some(ctx.alloc_as("kv scores", kv.max_pages as u64 * kv.n_heads as u64 * 4, st)?)
            } else {
                None
            },
            scores_rb: if selecting {
                Some(ctx.alloc_as(
                    "kv scores readback",
                    kv.max_pages as u64 * kv.n_heads as u64 * 4,
                    crate::gpu::BufferUsage::Readback,
                )?)
            } else {
                None
            },
            scores_lag: if kv.select.is_some_and(|s| s.lagged) {
                Some(ctx.alloc_as(
                    "kv lagged scores readback",
                    cfg.n_layers as u64 * kv.max_pages as u64 * kv.n_heads as u64 * 4,
                    crate::gpu::BufferUsage::Readback,
                )?)
            } else {
                None
            },
        };
        let map = PageMap::new(kv);
        // The grid's z is a round's splits at most: decode rounds can be longer.
        let shape_of = |l: usize, round_splits: u32| KvShape {
            n_heads: cfg.n_heads as u32,
            n_kv_heads: cfg.n_kv_heads as u32,
            head_dim: cfg.head_dim as u32,
            page_tokens: kv.page_tokens,
            f16: kv.f16,
            table_base: l as u32 * kv.layer_words,
            seq_stride: kv.seq_stride,
            round_splits,
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap.unwrap_or(0.0),
            window: cfg.window_of(l).unwrap_or(0),
        };
        let mut decode_lists = Vec::with_capacity(cfg.n_layers);
        let mut prefill_lists = Vec::with_capacity(cfg.n_layers);
        for (l, layer) in layer_objs.iter().enumerate() {
            let mats = match &layer.mats {
                Some(m) => m,
                None => {
                    let si = streamed.iter().position(|&x| x == l).unwrap_or(0);
                    stream_mats
                        .get(si)
                        .ok_or_else(|| EngineError::MissingTensor("a streamed layer".into()))?
                }
            };
            for (tt, out, splits) in [
                (
                    1,
                    &mut decode_lists,
                    kv.decode_round_splits.max(kv.round_splits),
                ),
                (kernels::MM_PREFILL_TT, &mut prefill_lists, kv.round_splits),
            ] {
                out.push(layers::build_lists(
                    &ctx,
                    &cfg,
                    layer,
                    mats,
                    &bufs,
                    &kvb,
                    &shape_of(l, splits),
                    kv.touched_pages,
                    kv.max_pages,
                    tt,
                    plan.fused_norms[l],
                    plan.fused_rope[l],
                )?);
            }
        }
        let output_norm = vector("output_norm.weight")?;
        let n_embd = cfg.n_embd as u32;
        let norm = |rows: u32| {
            kernels::rmsnorm(
                &ctx,
                &bufs.step,
                &bufs.last,
                &output_norm,
                &bufs.last_n,
                n_embd,
                cfg.rms_eps,
                0,
                rows,
            )
        };
        let head_norm = norm(1)?;
        let lr = plan.logit_rows as u32;
        let head_norm_rows = if lr > 1 { Some(norm(lr)?) } else { None };
        let head_io = |rows: u32| MatmulIo {
            x_stride: n_embd,
            y_stride: cfg.vocab_size as u32,
            n_tokens: rows,
            // One row per weight read, like decoding: rows scored together give the logits
            // each would get alone.
            token_tile: 1,
            ..Default::default()
        };
        let hp = &plan.head;
        let head = if plan.placement.head_resident {
            load_bytes += hp.info.n_bytes;
            let w = hp.layout.upload(&ctx, &hp.info.name, &read(&hp.info)?)?;
            let plan1 = head_label(kernels::matmul(
                &ctx,
                &bufs.step,
                &w,
                &bufs.last_n,
                &bufs.logits,
                head_io(1),
            )?);
            let rows_plan = if lr > 1 {
                head_label(kernels::matmul(
                    &ctx,
                    &bufs.step,
                    &w,
                    &bufs.last_n,
                    &bufs.logits,
                    head_io(lr),
                )?)
            } else {
                Vec::new()
            };
            Head::Resident {
                w,
                plan: plan1,
                rows_plan,
            }
        } else {
            // Chunk c goes through slot c % (slots): the layer slots' first buffers, or two
            // chunk slots of its own; at the place its file range lands in (see `SlotLayout`).
            let (slots_h, bases_h, use_h): (Vec<Arc<GpuBuffer>>, Vec<Option<u64>>, Vec<usize>) =
                if hp.in_slots && !slot_bufs.is_empty() {
                    (
                        slot_bufs.iter().map(|b| b[0].clone()).collect(),
                        slot_bases.iter().map(|b| b[0]).collect(),
                        (0..n_slots).collect(),
                    )
                } else {
                    let head_slot = |name: &str| {
                        if in_place {
                            ctx.mappable_storage(name, hp.chunk_bytes)
                        } else {
                            ctx.storage(name, hp.chunk_bytes)
                        }
                    };
                    (
                        vec![
                            Arc::new(head_slot("head slot 0")?),
                            Arc::new(head_slot("head slot 1")?),
                        ],
                        vec![None, None],
                        vec![n_slots, n_slots + 1],
                    )
                };
            let head_room = |c: usize| crate::plan::slots::Region {
                buffer: 0,
                start: 0,
                size: slots_h[c % slots_h.len()].size,
            };
            let mut offsets_h = Vec::with_capacity(hp.n_chunks as usize);
            for c in 0..hp.n_chunks as usize {
                let r0 = c as u64 * hp.chunk_rows as u64;
                let n = (hp.chunk_rows as u64).min(hp.layout.rows as u64 - r0);
                let rb = hp.layout.row_bytes as u64;
                let base = bases_h[c % bases_h.len()];
                offsets_h.push(plan.slot.place(
                    head_room(c),
                    n * rb,
                    hp.info.offset + r0 * rb,
                    base,
                ));
            }
            let build = |rows: u32| -> Result<Vec<kernels::Dispatch>, EngineError> {
                let mut out = Vec::new();
                let mut r0 = 0u32;
                let mut c = 0usize;
                while r0 < hp.layout.rows {
                    let n = hp.chunk_rows.min(hp.layout.rows - r0);
                    let part = WeightPart {
                        ty: hp.layout.ty,
                        cols: hp.layout.cols,
                        row_bytes: hp.layout.row_bytes,
                        buffer: kernels::BufAt {
                            buffer: &slots_h[c % slots_h.len()],
                            offset: offsets_h[c],
                            size: None,
                        },
                        first_row: r0,
                        rows: n,
                        buf_row: 0,
                    };
                    out.push(kernels::matmul_part(
                        &ctx,
                        &bufs.step,
                        &part,
                        None,
                        &bufs.last_n,
                        &bufs.logits,
                        head_io(rows),
                    )?);
                    r0 += n;
                    c += 1;
                }
                Ok(head_label(out))
            };
            let plan1 = build(1)?;
            let rows_plan = if lr > 1 { build(lr)? } else { Vec::new() };
            Head::Streamed {
                slots: slots_h,
                offsets: offsets_h,
                slot_use: use_h,
                plan: plan1,
                rows_plan,
            }
        };
        ctx.flush()?;
        // The resident weights were read through the file's map: drop those pages from this
        // process (the device holds its own copy).
        gguf.release_pages();
        log::info!(
            "planned {} device bytes, {} in use; uploaded {load_bytes} bytes of resident weights in {:.2?}; {} pipelines",
            plan.total,
            ctx.budget.in_use(),
            t0.elapsed(),
            ctx.pipelines.len()
        );
        let tracer = Tracer::new(opts.trace);
        let profiler = if opts.profile {
            crate::gpu::profile::Profiler::new(&ctx)?.map(|mut p| {
                p.keep_spans = opts.trace;
                p
            })
        } else {
            None
        };
        let mut io_ = Uploader::new(ctx.clone(), ring, source, tracer.origin());
        if kv.streams {
            let dir = opts
                .kv_dir
                .clone()
                .unwrap_or_else(|| crate::paths::cache_dir().join("kv"));
            let layout = KvLayout {
                n_layers: cfg.n_layers as u32,
                page_tokens: kv.page_tokens,
                page_bytes: kv.page_bytes,
                max_pages: kv.max_pages,
                max_seqs: kv.max_seqs,
            };
            let mode = io_mode_of(io_.source().as_ref());
            io_.store = Some(Arc::new(KvStore::create(&dir, layout, mode)?));
        }
        let embd = tensor("token_embd.weight")?;
        let n_layers = cfg.n_layers;
        let mut engine = Self {
            placement: plan.placement.clone(),
            max_ctx: plan.max_ctx,
            ubatch: plan.ubatch,
            weight_tickets: (0..streamed.len()).map(|_| None).collect(),
            ctx,
            cfg,
            gguf,
            embd,
            layers: layer_objs,
            stream_mats,
            n_slots,
            head,
            head_norm,
            head_norm_rows,
            _output_norm: output_norm,
            bufs,
            kvb,
            map,
            io_,
            decode_lists,
            prefill_lists,
            streamed,
            prefetched: 0,
            head_early: Default::default(),
            table_mirror: vec![0; table_words],
            table_flushes: 0,
            table_dirty: None,
            pass_no: 0,
            last_submission: None,
            slot_use: vec![None; n_slots + 2],
            pending_prefetch: Vec::new(),
            seqs: (0..plan.kv.max_seqs)
                .map(|_| SeqState {
                    prev_sel: vec![Vec::new(); n_layers],
                    lag_scores: vec![Vec::new(); n_layers],
                    slot_owner: vec![u32::MAX; plan.kv.home_pages as usize],
                    ..Default::default()
                })
                .collect(),
            live: vec![false; plan.kv.max_seqs as usize],
            io: IoTotals::default(),
            kv_stats: KvRunStats::default(),
            tracer,
            profiler,
            profiling: opts.profile,
            in_place,
            decode_form: false,
            load_bytes,
            load_time: std::time::Duration::ZERO,
            prefill_progress: None,
            plan,
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
        self.kv_stats = KvRunStats::default();
        self.tracer.clear();
        if let Some(p) = self.profiler.as_mut() {
            p.clear();
        }
        Ok(())
    }
}

/// The I/O mode of the weight source, for the KV page file (direct unless the source maps).
fn io_mode_of(source: &dyn WeightSource) -> crate::flash::IoMode {
    source.io_mode().unwrap_or(crate::flash::IoMode::Mmap)
}

/// The output head's matrix dispatches, labelled apart from the layers' in profiles.
fn head_label(mut list: Vec<kernels::Dispatch>) -> Vec<kernels::Dispatch> {
    for d in &mut list {
        d.label = "matmul head";
    }
    list
}
