//! The per-token schedule: embeddings in, the layers computed one after another while the next
//! layers' weights and KV pages stream in, logits out.
//!
//! Everything the engine allocates comes from the execution plan ([`crate::plan::ExecPlan`]).
//! A forward pass over a batch of rows (each a sequence and a position):
//! 1. the host gathers the rows' embeddings from the model file and writes them, with the row
//!    table (sequence, position, KV store address) and the RoPE cos/sin table;
//! 2. for each layer L: the host waits for L's streamed weights (if L streams), submits the
//!    pre-attention dispatches, attention in rounds (each round's KV pages that are not on the
//!    device are brought into the stream pool first) and the rest of the layer. Right after L
//!    is submitted, the streamed layer `slots` places ahead and the next layer's KV pages are
//!    queued on the I/O thread (weights before KV pages), so their reads overlap L's compute
//!    (the paper's layer-ahead pipeline);
//! 3. the last row is normed and multiplied by the output head (resident, or streamed in row
//!    chunks through two slots); the logits are read back; KV pages that filled up are read
//!    back and written to the page file once.
//!
//! Prefill batches use matrix-matrix kernels (several tokens per weight read); decode uses T = 1.

mod batch;
mod build;
pub mod draft;
mod head;
mod inplace;
mod kvio;
mod layers;
mod measure;
mod pass;
mod predict;
mod select;
pub mod session;
mod slots;
mod stats;
mod table;
pub mod trace;
mod upload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::flash::source::{ChunkSource, SourceError, WeightSource};
use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::gpu::staging::StagingError;
use crate::gpu::{GpuBuffer, GpuContext, GpuError, GpuOptions};
use crate::kernels::{Dispatch, KernelError};
use crate::kv::pages::PageMap;
use crate::model::config::ModelConfig;
use crate::plan::{ExecPlan, KvSelect, PlanError, PlanOptions};
pub use crate::plan::{Placement, PlacementError, ResidentSpec};
pub use stats::{GenStats, IoTotals, KvRunStats, ProfileReport, ProfileRow};
use trace::Tracer;
use upload::Uploader;

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
    #[error(transparent)]
    Plan(PlanError),
    #[error(transparent)]
    Kv(#[from] crate::kv::KvError),
    #[error(transparent)]
    Session(#[from] crate::kv::SessionError),
    #[error("reading the model file failed: {0}")]
    Flash(String),
    #[error("moving data to the device failed: {0}")]
    Transfer(String),
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
    #[error("sequence {0} is not open")]
    BadSequence(u32),
    #[error("all {0} sequences are in use")]
    NoFreeSequence(usize),
    #[error(
        "in-place uploads need an adapter whose storage buffers the host can map ({0} has none); use --upload staging or auto"
    )]
    InPlaceUnsupported(String),
    #[error("writing the trace failed: {0}")]
    Trace(std::io::Error),
    #[error("the plan does not fit this device: {0}")]
    PlanMismatch(String),
}

impl From<PlanError> for EngineError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::Placement(p) => EngineError::Placement(p),
            e => EngineError::Plan(e),
        }
    }
}

/// Reads through the GGUF file's own checked reads (the default when no flash reader is given):
/// a file that shrinks under the process is an error, not a fault.
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
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        self.file.read_at(offset, dst)?;
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
    /// Context length in tokens (default: the model's, at most 2048).
    pub ctx: Option<usize>,
    /// Tokens per forward batch.
    pub ubatch: usize,
    /// Streamed layers read ahead of the one computing (layer slots = prefetch + 1).
    pub prefetch: usize,
    /// Staging ring: slots (0: enough to hold one streamed layer) and bytes per slot.
    pub ring_slots: usize,
    pub ring_chunk: u64,
    /// Bytes per output-head chunk when the head streams through chunk slots of its own (None:
    /// through the layer slots where layers stream, see [`PlanOptions::head_chunk`]).
    pub head_chunk: Option<u64>,
    /// What to keep resident (default: decided from the budget).
    pub resident: ResidentSpec,
    /// Keep trace spans (for `--trace`).
    pub trace: bool,
    /// Store the KV cache in f16 (half the bytes of f32).
    pub kv_f16: bool,
    /// Tokens per KV page (default: the plan's).
    pub kv_page: Option<u32>,
    /// Recent KV pages kept on the device beyond those a batch writes.
    pub kv_window: u32,
    /// Page selection (None: exact attention).
    pub kv_select: Option<KvSelect>,
    /// Where the KV page file goes (default: `kv` under the cache directory).
    pub kv_dir: Option<PathBuf>,
    /// Rows of logits a pass can return (for scoring every position of a batch).
    pub logit_rows: usize,
    /// Bytes per storage binding at most, below the device's limit (splits weights into more
    /// parts; for tests of the split paths).
    pub max_binding: Option<u64>,
    /// Sequences held at once (batched decoding).
    pub max_seqs: usize,
    /// Time every kernel with GPU timestamp queries (`--profile`).
    pub profile: bool,
    /// How streamed weights reach their slots.
    pub upload: UploadMode,
    /// Let decode attention apply RoPE and store the new key and value where the device can
    /// ([`kernels::rope_fusion_available`]); false keeps them a dispatch of their own (tests
    /// compare the two).
    pub fuse_rope: bool,
}

/// How streamed weights reach their layer slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadMode {
    /// In place on integrated GPUs and CPU rasterizers that offer mappable storage buffers
    /// (device memory is host memory), else through the staging ring.
    Auto,
    /// Read into the staging ring, then copied into the slots by the device.
    Staging,
    /// Read straight into mapped layer slots (no staging copy); needs mappable storage buffers.
    InPlace,
}

impl std::str::FromStr for UploadMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "staging" => Ok(Self::Staging),
            "in-place" => Ok(Self::InPlace),
            _ => Err(format!(
                "unknown upload mode {s:?}: expected auto, staging or in-place"
            )),
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        let p = PlanOptions::default();
        Self {
            gpu: GpuOptions::default(),
            ctx: None,
            ubatch: p.ubatch,
            prefetch: p.prefetch,
            ring_slots: p.ring_slots,
            ring_chunk: p.ring_chunk,
            head_chunk: p.head_chunk,
            resident: ResidentSpec::Auto,
            trace: false,
            kv_f16: true,
            kv_page: None,
            kv_window: 0,
            kv_select: None,
            kv_dir: None,
            logit_rows: 1,
            profile: false,
            upload: UploadMode::Auto,
            max_binding: None,
            max_seqs: 1,
            fuse_rope: true,
        }
    }
}

impl EngineOptions {
    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            budget: self.gpu.budget,
            ctx: self.ctx,
            ubatch: self.ubatch,
            prefetch: self.prefetch,
            ring_slots: self.ring_slots,
            ring_chunk: self.ring_chunk,
            head_chunk: self.head_chunk,
            bind_align: 256,
            resident: self.resident.clone(),
            kv_f16: self.kv_f16,
            kv_page: self.kv_page,
            kv_window: self.kv_window,
            kv_select: self.kv_select,
            logit_rows: self.logit_rows,
            extra_bytes: 0,
            in_place: false,
            max_binding: self.max_binding,
            max_seqs: self.max_seqs,
            fuse_norms: false,
            fuse_rope: false,
        }
    }
}

enum Head {
    Resident {
        w: crate::kernels::GpuWeight,
        plan: Vec<Dispatch>,
        rows_plan: Vec<Dispatch>,
    },
    /// Chunk c streams through `slots[c % slots.len()]` (the layer slots' first buffers, or
    /// two chunk slots of the head's own) from byte `offsets[c]`; `slot_use[i]` is the entry of
    /// `Engine::slot_use` that slot `i` shares.
    Streamed {
        slots: Vec<Arc<GpuBuffer>>,
        offsets: Vec<u64>,
        slot_use: Vec<usize>,
        plan: Vec<Dispatch>,
        rows_plan: Vec<Dispatch>,
    },
}

/// State of the sequence in the KV cache.
#[derive(Debug, Clone, Default)]
struct SeqState {
    /// Tokens whose keys and values are cached, in order.
    tokens: Vec<u32>,
    /// Pages `[0, written)` are in the page file.
    written: u32,
    /// The pages each layer selected for the previous token (page selection).
    prev_sel: Vec<Vec<u32>>,
    /// Each layer's page scores from the last decode step (lagged selection):
    /// `[page * heads + head]` for the pages that step scored (none when empty).
    lag_scores: Vec<Vec<f32>>,
    /// The page each home slot holds (the same in every layer).
    slot_owner: Vec<u32>,
}

/// The GPU engine for one model.
pub struct Engine {
    pub ctx: Arc<GpuContext>,
    pub cfg: ModelConfig,
    pub plan: ExecPlan,
    pub placement: Placement,
    gguf: Arc<GgufFile>,
    embd: TensorInfo,
    layers: Vec<layers::Layer>,
    /// Each streamed layer's matrices, seen in its layer slot.
    stream_mats: Vec<layers::Mats>,
    /// Layer slots streamed layers compute from.
    n_slots: usize,
    head: Head,
    head_norm: Dispatch,
    head_norm_rows: Option<Dispatch>,
    _output_norm: GpuBuffer,
    bufs: layers::Buffers,
    kvb: layers::KvBuffers,
    map: PageMap,
    io_: Uploader,
    decode_lists: Vec<layers::Lists>,
    prefill_lists: Vec<layers::Lists>,
    /// Streamed layer indices, in order.
    streamed: Vec<usize>,
    /// Weight uploads queued for streamed layers (by index into `streamed`).
    weight_tickets: Vec<Option<crate::flash::queue::Ticket<upload::JobResult>>>,
    /// Streamed layers of the next pass whose uploads are already queued.
    prefetched: usize,
    /// The page table as the host last wrote it, and the byte range written since the last
    /// submission: every submission first writes that range in one go (one staging write a
    /// submission instead of two a layer; see `table_write`).
    table_mirror: Vec<u32>,
    table_dirty: Option<(usize, usize)>,
    /// Page-table writes to the device since load (`table_writes`).
    table_flushes: u64,
    /// The output head's first chunks, queued during this pass's layers (`prequeue_head`).
    head_early: std::collections::VecDeque<crate::flash::queue::Ticket<upload::JobResult>>,
    /// Passes begun: with the layer, the need stamp of what the transfer queue reads.
    pass_no: u64,
    /// The latest submission: a job that refills a slot waits for it (queued right after the
    /// compute that last reads the slot) before the slot is mapped.
    last_submission: Option<wgpu::SubmissionIndex>,
    /// The submission that last read each layer slot (then the output head's own two chunk
    /// slots): a job that refills a slot waits for it before mapping the slot.
    slot_use: Vec<Option<wgpu::SubmissionIndex>>,
    /// Predictive KV prefetches in flight.
    pending_prefetch: Vec<crate::flash::queue::Ticket<upload::JobResult>>,
    /// Per sequence (index = sequence id); sequence 0 is the default one.
    seqs: Vec<SeqState>,
    /// Which sequences `new_seq` has handed out.
    live: Vec<bool>,
    max_ctx: usize,
    ubatch: usize,
    pub io: IoTotals,
    pub kv_stats: KvRunStats,
    pub tracer: Tracer,
    /// Per-kernel GPU time (`--profile` on an adapter with timestamp queries).
    pub profiler: Option<crate::gpu::profile::Profiler>,
    /// `--profile` was asked for (with or without timestamp queries).
    pub profiling: bool,
    /// Streamed weights are written in place into mappable slots.
    pub in_place: bool,
    /// Run every row with the decode-form kernels (verification of drafted tokens).
    decode_form: bool,
    /// Bytes uploaded at load.
    pub load_bytes: u64,
    pub load_time: Duration,
    /// Told (tokens done, tokens in all) before the first and after each batch of a prompt
    /// longer than one batch.
    prefill_progress: Option<ProgressFn>,
}

/// A progress callback: (done, total).
pub type ProgressFn = Box<dyn FnMut(usize, usize) + Send>;

impl Engine {
    /// Plan under the budget, upload what stays resident, build the dispatch lists.
    pub fn new(gguf: Arc<GgufFile>, opts: &EngineOptions) -> Result<Self, EngineError> {
        let source = Arc::new(MapSource::new(gguf.clone()));
        Self::with_source(gguf, source, opts)
    }

    /// Tokens currently in the KV cache.
    pub fn n_past(&self) -> usize {
        self.seqs[0].tokens.len()
    }

    /// The tokens currently in the KV cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.seqs[0].tokens
    }

    /// KV cache capacity in tokens.
    pub fn max_ctx(&self) -> usize {
        self.max_ctx
    }

    /// Forget the conversation.
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Bytes read from the model file since load (weights and embedding rows).
    pub fn flash_bytes(&self) -> u64 {
        self.io_.source().bytes_read()
    }

    /// Writes of the page table to the device since load: one per decode pass whose layers'
    /// pages are known at its start and fit one round each, not one per submission.
    pub fn table_writes(&self) -> u64 {
        self.table_flushes
    }

    /// The KV page file, when pages leave the device.
    pub fn kv_file(&self) -> Option<&std::path::Path> {
        self.io_.store.as_ref().map(|s| s.path())
    }

    /// Write the collected spans as a Chrome trace.
    pub fn write_trace(&mut self, path: &std::path::Path) -> Result<(), EngineError> {
        self.tracer.collect_gpu();
        if let Some(p) = &self.profiler {
            // GPU kernel spans on the timestamp clock, aligned so the first kernel starts with
            // the first GPU work the host saw.
            let host0 = self.tracer.first_gpu_start().unwrap_or(0.0);
            let gpu0 = p.spans.iter().map(|s| s.1).fold(f64::INFINITY, f64::min);
            for &(label, a, b) in &p.spans {
                self.tracer.span_at(
                    label,
                    "kernel",
                    trace::TID_KERNEL,
                    host0 + (a - gpu0) / 1e9,
                    host0 + (b - gpu0) / 1e9,
                );
            }
        }
        self.tracer.write(path).map_err(EngineError::Trace)
    }

    /// Append `tokens` to the sequence and return the logits after the last one.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut last = Vec::new();
        // Only the last token's logits: score from past the end.
        self.forward_rows(tokens, tokens.len(), &mut |_, l| {
            last = l.to_vec();
        })?;
        Ok(last)
    }

    /// Append `tokens` to the sequence; `on_logits(i, logits)` gets the logits after token `i`
    /// for every `i >= first_scored` (all of them are computed in batches of the plan's logit
    /// rows) and always for the last token.
    pub fn forward_rows(
        &mut self,
        tokens: &[u32],
        first_scored: usize,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let needed = self.n_past() + tokens.len();
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
        self.io_.source().check().map_err(EngineError::Flash)?;
        let long = tokens.len() > self.ubatch;
        if long && let Some(f) = self.prefill_progress.as_mut() {
            f(0, tokens.len());
        }
        let mut done = 0;
        for chunk in tokens.chunks(self.ubatch) {
            let last_chunk = done + chunk.len() == tokens.len();
            let scored = (first_scored.max(done)..done + chunk.len())
                .map(|i| i - done)
                .collect::<Vec<_>>();
            let want: Vec<usize> = if last_chunk && scored.last() != Some(&(chunk.len() - 1)) {
                let mut s = scored;
                s.push(chunk.len() - 1);
                s
            } else {
                scored
            };
            self.run_batch(&[(0, chunk)], &want, &mut |i, l| on_logits(done + i, l))?;
            done += chunk.len();
            if long && let Some(f) = self.prefill_progress.as_mut() {
                f(done, tokens.len());
            }
        }
        Ok(())
    }

    /// Report the progress of long prompts (more than one batch) through `f`: (tokens done,
    /// tokens in all) before the first batch (0) and after each; `None` stops reporting.
    pub fn set_prefill_progress(&mut self, f: Option<ProgressFn>) {
        self.prefill_progress = f;
    }

    /// Wait until the reads queued so far have run: `forward` returns with the next pass's
    /// first streamed layers (and maybe KV pages) still being read, so a caller that changes
    /// the model file between passes waits here first (a memory-mapped read of a file that
    /// shrinks under it kills the process with SIGBUS; a read after the change fails cleanly).
    pub fn settle(&self) {
        let _ = self.io_.queue.drain();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Queued uploads copy into buffers this engine owns: let them finish first.
        self.settle();
        let _ = self.ctx.wait();
    }
}
