//! The execution plan: the single source of every device size and of what streams.
//!
//! [`ExecPlan::new`] reads the model's tensor table and the options and decides, under the
//! device-memory budget: the context length and batch sizes, how each weight matrix is split
//! into parts, which layers (and whether the output head) stay resident, the staging ring and
//! layer slots, and the paged KV cache's shape — page size, pages kept on the device per layer
//! ("home": the attention sink and a window of recent pages), the stream pool for pages read
//! back from flash, and how many attention splits run per round. The engine allocates exactly
//! what the plan lists (a test checks the device bytes in use against [`ExecPlan::total`]).
//!
//! Order of the budget: fixed costs (activations, norms, kernel parameters, the page tables and
//! the smallest KV that runs) first; then weights ([`placement`]); then what is left grows the
//! KV cache's home pages (all of them: the KV cache never touches flash), then the splits per
//! attention round.

pub mod calibration;
pub mod choose;
mod counts;
pub mod history;
pub mod hitrate;
pub mod hitrate_sim;
pub mod kvplan;
pub mod perf;
pub mod pipeline;
pub mod placement;
pub mod slots;
pub mod work;

use thiserror::Error;

use crate::gguf::{GgufFile, TensorInfo};
use crate::kernels::{
    self, ATTN_PARAMS_BYTES, KV_PARAMS_BYTES, KernelError, ROPE_STORE_PARAMS_BYTES, WeightLayout,
};
use crate::model::config::{ModelConfig, OUTPUT, TOKEN_EMBD};
pub use crate::model::tensors::{MatrixRole, layer_matrices};
use counts::fuses_rope;
pub use counts::{layer_vector_bytes, row_dispatches};
pub use kvplan::{KvPlan, KvSelect, SelectSpec};
pub use placement::{Costs, Placement, PlacementError, ResidentSpec};

#[derive(Debug, Error)]
pub enum PlanError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error("tensor {0} is missing from the model file")]
    MissingTensor(String),
    #[error("streaming needs every layer to have the same shapes: {0}")]
    UnevenLayers(String),
    #[error("{0}")]
    Kv(String),
}

/// What the caller asks of the plan.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    /// Device-memory budget (None: what the adapter allows).
    pub budget: Option<u64>,
    /// Context length in tokens (default: the model's, at most 2048).
    pub ctx: Option<usize>,
    /// Tokens per forward batch.
    pub ubatch: usize,
    /// Streamed layers read ahead of the one computing.
    pub prefetch: usize,
    /// Staging ring slots (0: enough for one streamed layer) and bytes per slot.
    pub ring_slots: usize,
    pub ring_chunk: u64,
    /// Bytes per output-head chunk when the head streams through two chunk slots of its own
    /// (None: through the layer slots while layers stream, where they hold chunks of at least
    /// [`slots::DEFAULT_HEAD_CHUNK`], else chunk slots of that size).
    pub head_chunk: Option<u64>,
    /// Storage binding offsets must be multiples of this (the device's limit).
    pub bind_align: u64,
    pub resident: ResidentSpec,
    pub kv_f16: bool,
    /// Tokens per KV page (default [`kvplan::DEFAULT_PAGE_TOKENS`]).
    pub kv_page: Option<u32>,
    /// Recent pages kept on the device beyond those one batch writes.
    pub kv_window: u32,
    /// Page selection (None: exact attention over every page).
    pub kv_select: Option<KvSelect>,
    /// Rows of logits one head pass computes (1, or more for scoring whole batches).
    pub logit_rows: usize,
    /// Device bytes allocated besides the plan's own (e.g. the profiler's buffers).
    pub extra_bytes: u64,
    /// Streamed weights are written in place into mappable layer slots (device memory is host
    /// memory): the staging ring then only carries KV pages, so it needs no layer's worth.
    pub in_place: bool,
    /// Bytes per storage binding at most, below the device's limit (None: the device's): splits
    /// weights into more parts, as a device with smaller bindings would.
    pub max_binding: Option<u64>,
    /// Sequences the engine can hold at once (batched decoding; each has its own KV pages).
    pub max_seqs: usize,
    /// The device's matrix kernels can apply a layer's RMSNorms themselves
    /// ([`kernels::norm_fusion_available`]): the norms of layers whose products allow it are
    /// then no dispatches of their own.
    pub fuse_norms: bool,
    /// The device's decode attention can apply RoPE and store the new key and value itself
    /// ([`kernels::rope_fusion_available`]): layers that do not select pages then have no
    /// RoPE dispatch at decode.
    pub fuse_rope: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            budget: None,
            ctx: None,
            ubatch: 64,
            prefetch: 1,
            ring_slots: 0,
            ring_chunk: 512 * 1024,
            head_chunk: None,
            bind_align: 256,
            resident: ResidentSpec::Auto,
            kv_f16: true,
            kv_page: None,
            kv_window: 0,
            kv_select: None,
            logit_rows: 1,
            extra_bytes: 0,
            in_place: false,
            max_binding: None,
            max_seqs: 1,
            fuse_norms: false,
            fuse_rope: false,
        }
    }
}

/// A layer's matrices ([`layer_matrices`] of the architecture) in the file and their device
/// layout.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub roles: Vec<MatrixRole>,
    pub files: Vec<TensorInfo>,
    pub layouts: Vec<WeightLayout>,
}

impl LayerWeights {
    pub fn device_bytes(&self) -> u64 {
        self.layouts.iter().map(|l| l.device_bytes()).sum()
    }
    fn layout(&self, role: MatrixRole) -> Option<&WeightLayout> {
        self.roles
            .iter()
            .position(|&r| r == role)
            .map(|i| &self.layouts[i])
    }
    /// Which of the layer's two input RMSNorms (before attention, before the FFN) its products
    /// apply themselves, on a device that can ([`PlanOptions::fuse_norms`]): those whose
    /// consumers are all quantized.
    pub fn fused_norms(&self, available: bool) -> [bool; 2] {
        let quantized = |roles: &[MatrixRole]| {
            let present: Vec<&WeightLayout> =
                roles.iter().filter_map(|&r| self.layout(r)).collect();
            !present.is_empty() && present.iter().all(|l| l.ty.is_quantized())
        };
        [
            available && quantized(&[MatrixRole::Q, MatrixRole::K, MatrixRole::V, MatrixRole::Qkv]),
            available && quantized(&[MatrixRole::Gate, MatrixRole::Up, MatrixRole::GateUp]),
        ]
    }

    /// Whether Q, K and V share one dispatch ([`kernels::multi_shareable`]).
    pub fn qkv_shared(&self) -> bool {
        let mats: Option<Vec<_>> = [MatrixRole::Q, MatrixRole::K, MatrixRole::V]
            .iter()
            .map(|&r| {
                self.layout(r)
                    .map(|l| (l.ty, l.cols, l.row_bytes, l.parts.len()))
            })
            .collect();
        mats.is_some_and(|m| kernels::multi_shareable(&m))
    }

    /// Single-product matrix dispatches of one forward list: one per part, a gated pair sharing
    /// theirs; a fused matrix one per piece of each of its sub-matrices; Q, K and V none when
    /// they share a dispatch ([`Self::qkv_shared`]).
    pub fn dispatches(&self, cfg: &ModelConfig) -> u64 {
        let parts = |role| self.layout(role).map_or(0, |l| l.parts.len() as u64);
        let shared = self.qkv_shared();
        let mut n = 0u64;
        for &role in &self.roles {
            n += match role {
                MatrixRole::Q | MatrixRole::K | MatrixRole::V if shared => 0,
                MatrixRole::Up => 0,
                MatrixRole::Qkv => {
                    let Some(l) = self.layout(role) else { continue };
                    let p: Vec<(u32, u32)> = l.parts.clone();
                    let (q, kv) = (cfg.q_dim() as u32, cfg.kv_dim() as u32);
                    [(0, q), (q, q + kv), (q + kv, q + 2 * kv)]
                        .iter()
                        .map(|&(a, b)| kernels::row_pieces(&p, a, b).len() as u64)
                        .sum()
                }
                MatrixRole::GateUp => self.layout(role).map_or(0, |l| {
                    kernels::paired_pieces(&l.parts, cfg.n_ff as u32).len() as u64
                }),
                r => parts(r),
            };
        }
        n
    }
}

/// Bytes of each activation buffer (16-byte rounded, as allocated).
#[derive(Debug, Clone, Default)]
pub struct Sizes {
    pub step: u64,
    pub rows: u64,
    pub rope_cs: u64,
    /// The RoPE table of local layers (0 when they rotate as global ones).
    pub rope_cs_swa: u64,
    pub x: u64,
    pub q: u64,
    pub h: u64,
    pub kv_tmp: u64,
    pub last: u64,
    pub logits: u64,
    pub part: u64,
    pub running: u64,
}

impl Sizes {
    fn total(&self) -> u64 {
        self.step
            + self.rows
            + self.rope_cs
            + self.rope_cs_swa
            + 2 * self.x
            + 2 * self.q
            + self.h
            + 2 * self.kv_tmp
            + 2 * self.last
            + 2 * self.logits
            + self.part
            + self.running
    }
}

/// The output head in the file, its layout, and its chunks when it streams.
#[derive(Debug, Clone)]
pub struct HeadPlan {
    pub info: TensorInfo,
    pub layout: WeightLayout,
    pub chunk_rows: u32,
    pub n_chunks: u32,
    pub chunk_bytes: u64,
    /// The chunks go through the layer slots (else through two chunk slots of their own).
    pub in_slots: bool,
}

/// Everything the engine allocates and how it runs.
#[derive(Debug, Clone)]
pub struct ExecPlan {
    pub max_ctx: usize,
    pub ubatch: usize,
    pub logit_rows: usize,
    pub layers: Vec<LayerWeights>,
    pub head: HeadPlan,
    pub ring_slots: usize,
    pub ring_chunk: u64,
    /// A layer slot's buffers and where each matrix part goes in them.
    pub slot: slots::SlotLayout,
    pub placement: Placement,
    pub kv: KvPlan,
    pub sizes: Sizes,
    pub norms: u64,
    pub params: u64,
    /// Dispatches of each layer's decode step besides attention: norms, biases, per-head
    /// norms, RoPE with the KV store (unless fused), the matrix products.
    pub layer_dispatches: Vec<u64>,
    /// Per layer, whether its decode attention applies RoPE and stores the new key and value
    /// itself ([`PlanOptions::fuse_rope`], head dims the kernel takes, no page selection).
    pub fused_rope: Vec<bool>,
    /// Per layer, the input RMSNorms (attention, FFN) its products apply themselves.
    pub fused_norms: Vec<[bool; 2]>,
    /// Device bytes the plan allocates in all.
    pub total: u64,
}

pub(crate) fn round16(n: u64) -> u64 {
    n.max(16).div_ceil(16) * 16
}

impl ExecPlan {
    /// Plan `gguf` (whose config is `cfg`) on a device with `max_binding` bytes per binding.
    pub fn new(
        gguf: &GgufFile,
        cfg: &ModelConfig,
        max_binding: u64,
        o: &PlanOptions,
    ) -> Result<Self, PlanError> {
        let max_binding = o.max_binding.map_or(max_binding, |c| c.min(max_binding));
        let tensor = |name: &str| -> Result<TensorInfo, PlanError> {
            gguf.tensor(name)
                .cloned()
                .ok_or_else(|| PlanError::MissingTensor(name.to_string()))
        };
        let layout = |t: &TensorInfo| -> Result<WeightLayout, PlanError> {
            let bad = || KernelError::Shape {
                kernel: "weights",
                problem: format!("{}: dimensions do not fit 32 bits", t.name),
            };
            let rows = u32::try_from(t.n_rows()).map_err(|_| bad())?;
            let cols = u32::try_from(t.row_len()).map_err(|_| bad())?;
            Ok(WeightLayout::new(&t.name, t.ty, rows, cols, max_binding)?)
        };
        let roles = layer_matrices(cfg);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for l in 0..cfg.n_layers {
            let names = crate::model::config::LayerNames::new(l);
            let files = roles
                .iter()
                .map(|r| tensor(r.name(&names)))
                .collect::<Result<Vec<_>, _>>()?;
            let layouts = files.iter().map(layout).collect::<Result<Vec<_>, _>>()?;
            layers.push(LayerWeights {
                roles: roles.clone(),
                files,
                layouts,
            });
        }
        let head_info = tensor(if cfg.tied_output { TOKEN_EMBD } else { OUTPUT })?;
        let head_layout = layout(&head_info)?;
        let head_row = head_info.row_bytes().max(1);
        let head_rows = head_info.n_rows().max(1);
        let own_chunks = slots::HeadChunks::of(
            o.head_chunk.unwrap_or(slots::DEFAULT_HEAD_CHUNK),
            head_row,
            head_rows,
            false,
        );

        let ubatch = o.ubatch.clamp(1, 512);
        // A batched decode pass scores one row per sequence in one head pass.
        let logit_rows = o.logit_rows.max(o.max_seqs).clamp(1, ubatch);
        let max_ctx = o.ctx.unwrap_or(2048).clamp(1, cfg.context_length.max(1));
        let budget = o.budget.unwrap_or(u64::MAX);
        let mut kv_min = KvPlan::minimal(cfg, o, max_ctx, ubatch)?;
        kv_min.max_binding = max_binding;
        if kv_min.home_slots() as u64 * kv_min.page_bytes > max_binding {
            return Err(PlanError::Kv(format!(
                "{} KV pages of {} bytes exceed the device's binding limit of {max_binding} bytes (use a smaller --kv-page or --ubatch)",
                kv_min.home_pages, kv_min.page_bytes
            )));
        }

        let f = |n: usize| round16((n * 4) as u64);
        let q_dim = cfg.n_heads * cfg.head_dim;
        let kv_dim = cfg.n_kv_heads * cfg.head_dim;
        let part_row = (cfg.n_heads * (cfg.head_dim + 2) * 4) as u64;
        let mut sizes = Sizes {
            step: 16,
            rows: round16(ubatch as u64 * 16),
            rope_cs: f(ubatch * cfg.rope_dim.max(2)),
            rope_cs_swa: if cfg.split_rope() {
                f(ubatch * cfg.rope_dim.max(2))
            } else {
                0
            },
            x: f(ubatch * cfg.n_embd),
            q: f(ubatch * q_dim),
            h: f(ubatch * cfg.n_ff),
            kv_tmp: f(ubatch * kv_dim),
            last: f(logit_rows * cfg.n_embd),
            logits: f(logit_rows * cfg.vocab_size),
            part: round16(ubatch as u64 * part_row * kv_min.round_splits as u64),
            running: round16(ubatch as u64 * part_row),
        };
        let norms = cfg.n_layers as u64 * layer_vector_bytes(cfg) + f(cfg.n_embd);
        // Kernel parameters: every dispatch of the decode and prefill lists of every layer,
        // and the head's.
        let row = kernels::ROW_PARAMS_BYTES;
        let mm = kernels::MATMUL_PARAMS_BYTES;
        let mut params = 0u64;
        for (l, lw) in layers.iter().enumerate() {
            let select = kv_min.selects_layer(l);
            let fused = lw.fused_norms(o.fuse_norms);
            // The decode list's attention with RoPE inside, and its merge.
            let rope_attn = if fuses_rope(o, cfg, select) {
                2 * ATTN_PARAMS_BYTES
            } else {
                0
            };
            let per_list = (row_dispatches(cfg) - fused.iter().filter(|&&f| f).count() as u64)
                * row
                + lw.dispatches(cfg) * mm
                + if lw.qkv_shared() {
                    kernels::MULTI_PARAMS_BYTES
                } else {
                    0
                }
                + ROPE_STORE_PARAMS_BYTES
                + 2 * ATTN_PARAMS_BYTES
                + if select { KV_PARAMS_BYTES } else { 0 };
            // The prefill list's row-tiled attention and its merge.
            let tiled = if kernels::attention_tiles(cfg.head_dim as u32) {
                2 * ATTN_PARAMS_BYTES
            } else {
                0
            };
            params += 2 * per_list + tiled + rope_attn + if select { KV_PARAMS_BYTES } else { 0 };
        }
        let head_resident_params = row + head_layout.parts.len() as u64 * mm;
        let head_lists = if logit_rows > 1 { 2 } else { 1 };

        let ring_chunk = o.ring_chunk.max(4096).div_ceil(4096) * 4096;
        let largest_layer: u64 = layers
            .iter()
            .map(|w| w.files.iter().map(|t| t.n_bytes).sum::<u64>())
            .max()
            .unwrap_or(0);
        let pieces = layers
            .first()
            .map(|w| w.layouts.iter().map(|l| l.parts.len() as u64).sum())
            .unwrap_or(1);
        // Uploads queue behind the compute already submitted, so a staging slot comes back
        // only when the GPU has passed that point: hold a whole layer to never stall on it.
        let auto_slots = if o.ring_slots == 0 && o.in_place {
            // KV pages and output-head chunks only: a few slots.
            (crate::gpu::staging::slots_for(own_chunks.chunk_bytes, 1, ring_chunk) + 2).clamp(3, 64)
        } else if o.ring_slots == 0 {
            (crate::gpu::staging::slots_for(largest_layer, pieces, ring_chunk) + 1).clamp(3, 64)
        } else {
            o.ring_slots
        };
        let slot = slots::SlotLayout::for_layers(&layers, o.in_place, max_binding, o.bind_align);
        let slot_bytes = slot.bytes();
        let slot_chunks = if o.head_chunk.is_none() {
            slots::HeadChunks::in_slots(&slot, head_row, head_rows, max_binding)
        } else {
            None
        };
        let stream_params = |c: &slots::HeadChunks| head_lists * (row + c.n_chunks as u64 * mm);
        let slots_wanted = (o.prefetch + 1).min(cfg.n_layers.max(1));
        let head_params_max = (head_lists * head_resident_params)
            .max(stream_params(&own_chunks))
            .max(slot_chunks.as_ref().map_or(0, stream_params));
        // Everything resident with every KV page at home needs no staging ring; if that does
        // not fit, the pages go to flash and come back through the ring.
        let mut kv_full = kv_min.clone();
        kv_full.home_pages = kv_full.max_pages;
        kv_full.streams = false;
        kv_full.stream_slots = 0;
        let all_home = kv_full.device_bytes(cfg.n_layers)
            + sizes.total()
            + o.extra_bytes
            + norms
            + params
            + head_params_max
            + layers.iter().map(|w| w.device_bytes()).sum::<u64>()
            + head_layout.device_bytes();
        // Pages also leave the device when a layer's pages would not fit one binding.
        let home_fits_binding = kv_full.max_pages as u64 * kv_full.page_bytes <= max_binding;
        let costs_for = |ring: u64| Costs {
            activations: sizes.total() + o.extra_bytes,
            resident_extra: if kv_min.streams && (all_home > budget || !home_fits_binding) {
                ring
            } else {
                0
            },
            kv: kv_min.device_bytes(cfg.n_layers),
            norms,
            params: params + head_params_max,
            ring,
            layer: slot_bytes,
            layers: layers.iter().map(|w| w.device_bytes()).collect(),
            head: head_layout.device_bytes(),
            head_chunk: own_chunks.chunk_bytes,
            head_in_slots: slot_chunks.is_some(),
        };
        // An automatic ring holds a whole layer so uploads never wait on a slot; when that does
        // not fit the budget, the smallest ring (three slots, uploads then wait on the GPU) does.
        let mut ring_slots = auto_slots;
        let mut placed = placement::plan(
            costs_for(crate::gpu::staging::ring_bytes(ring_slots, ring_chunk)),
            cfg.n_layers,
            budget,
            slots_wanted,
            &o.resident,
        );
        if placed.is_err() && o.ring_slots == 0 && auto_slots > 3 {
            ring_slots = 3;
            placed = placement::plan(
                costs_for(crate::gpu::staging::ring_bytes(ring_slots, ring_chunk)),
                cfg.n_layers,
                budget,
                slots_wanted,
                &o.resident,
            );
        }
        let placement = placed?;
        // Streamed layers share slots: they must all have the first streamed layer's shapes
        // (their weight types may differ).
        let mut streamed = (0..cfg.n_layers).filter(|&l| !placement.resident_layers[l]);
        if let Some(first) = streamed.next() {
            for l in streamed {
                for (a, b) in layers[l].files.iter().zip(&layers[first].files) {
                    if a.dims != b.dims {
                        return Err(PlanError::UnevenLayers(format!(
                            "{} differs from {}",
                            a.name, b.name
                        )));
                    }
                }
            }
        }
        // The head's chunks: through the layer slots when some layer streams in them.
        let chunks = match slot_chunks {
            Some(c) if placement.slots > 0 => c,
            _ => own_chunks,
        };
        let head = HeadPlan {
            chunk_rows: chunks.chunk_rows,
            n_chunks: chunks.n_chunks,
            chunk_bytes: chunks.chunk_bytes,
            in_slots: chunks.in_slots,
            layout: head_layout,
            info: head_info,
        };
        let head_params = if placement.head_resident {
            head_lists * head_resident_params
        } else {
            stream_params(&chunks)
        };
        params += head_params;
        // The KV cache takes what the weights left.
        let spare = placement
            .budget
            .saturating_sub(placement.total - head_params_max + head_params);
        let kv = kv_min.grow(cfg, spare, ubatch as u64 * part_row, ubatch as u32);
        // The ring reserved for a KV cache that pages to flash beside resident weights is not
        // allocated when the pages all fit after all.
        let unused_ring = if !placement.streaming && !kv.streams {
            placement.costs.resident_extra
        } else {
            0
        };
        sizes.part = round16(ubatch as u64 * part_row * kv.round_splits as u64);
        let total = placement.total - placement.costs.kv - placement.costs.activations
            + kv.device_bytes(cfg.n_layers)
            + sizes.total()
            + o.extra_bytes
            - head_params_max
            + head_params
            - unused_ring;
        let mut placement = placement;
        placement.total = total;
        let fused_norms: Vec<[bool; 2]> = layers
            .iter()
            .map(|lw| lw.fused_norms(o.fuse_norms))
            .collect();
        let fused_rope: Vec<bool> = (0..layers.len())
            .map(|l| fuses_rope(o, cfg, kv.selects_layer(l)))
            .collect();
        let layer_dispatches = layers
            .iter()
            .zip(&fused_norms)
            .zip(&fused_rope)
            .map(|((lw, f), &r)| {
                row_dispatches(cfg) - f.iter().filter(|&&x| x).count() as u64
                    + u64::from(!r)
                    + lw.dispatches(cfg)
                    + lw.qkv_shared() as u64
            })
            .collect();
        Ok(Self {
            max_ctx,
            ubatch,
            logit_rows,
            layers,
            head,
            ring_slots,
            ring_chunk,
            slot,
            placement,
            kv,
            sizes,
            norms,
            params,
            layer_dispatches,
            fused_rope,
            fused_norms,
            total,
        })
    }

    /// Streamed layer indices, in order.
    pub fn streamed_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&l| !self.placement.resident_layers[l])
            .collect()
    }
}
