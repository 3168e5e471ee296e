//! What one decoded token reads and runs under a plan: the matrix bytes by type, the
//! dispatches, the attended KV bytes, the weight and KV bytes read from flash and uploaded,
//! step by step for the pipeline simulation. [`super::perf`] turns it into time.

use serde::Serialize;

use super::ExecPlan;
use super::hitrate::{KvModelInput, KvPrediction, Policy, predict};

/// What one decoded token reads and runs, as the plan lays it out.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TokenWork {
    /// The layers' matrix products (the head's is [`TokenWork::head`]).
    pub matrices: Vec<MatrixWork>,
    pub dispatches: u64,
    /// Host round trips a pass waits for: each selecting layer reads its page scores back
    /// before it reads and attends the pages it keeps (none while every candidate is kept).
    pub syncs: u64,
    /// KV bytes attention reads (all layers).
    pub attn_bytes: u64,
    /// Layers that score pages to select them, and the pages they score (summed over them).
    pub select_layers: u64,
    pub select_pages: u64,
    /// Streamed weight bytes read from flash (after the host cache), and uploaded.
    pub weight_flash_bytes: u64,
    pub weight_upload_bytes: u64,
    /// KV bytes from flash (after the host cache) and uploaded.
    pub kv_flash_bytes: f64,
    pub kv_upload_bytes: f64,
    /// Bytes the I/O thread copies in host memory: streamed weight bytes the host cache
    /// serves (into their slot or the staging ring), and KV pages (host-cache hits into the
    /// job's buffer, prefetched pages twice, then every fetched page into the staging ring).
    pub weight_copy_bytes: f64,
    pub kv_copy_bytes: f64,
    /// Piece size and threads of the weights' flash reads; I/O mode.
    pub piece: u64,
    pub threads: usize,
    pub mode: String,
    /// Bytes of one KV read: the page file is read a run of consecutive pages of one layer
    /// at a time, by one thread (the transfer queue's); 0: at the weights' piece and threads.
    pub kv_piece: u64,
    /// Share of the KV I/O that waits for attention: a layer's pages go through the stream
    /// pool in rounds, and only the first round is read ahead (behind the previous layer's
    /// compute); each later round is read while the one before it attends, its attention
    /// waiting for its pages. With page selection, the pages a layer reads only once it has
    /// chosen them (neither prefetched nor cached) wait too. 1 - (1 - demand) / rounds; 0 when
    /// a layer's pages fit one round and none are read on demand.
    pub kv_serial_share: f64,
    /// The pass step by step (layers in order, then the head), for the pipeline simulation;
    /// empty: compute and I/O overlap as a whole.
    pub stages: Vec<StageWork>,
    /// Layer slots streamed layers cycle through; reads go straight into them (no ring).
    pub slots: usize,
    pub in_place: bool,
    /// The share of the largest streamed layer the staging ring holds, when below 1 (reads
    /// beyond it wait for the device); None: a whole layer, or reads in place.
    pub ring_share: Option<f64>,
    /// Weight bytes of the largest streamed layer (0: none streams): the overlap share β
    /// depends on it.
    pub layer_bytes: u64,
    /// The output head's part of the above (a prefill runs it once, for its last token).
    pub head: HeadWork,
    /// K and V bytes of one cached token over all layers: a prefilled row's attention reads
    /// this much per token before it.
    pub kv_bytes_per_key: u64,
}

/// The output head's matrix: its type, its bytes, and the bytes of it that stream (0 when
/// resident; included in [`TokenWork::weight_upload_bytes`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct HeadWork {
    pub ty: String,
    pub bytes: u64,
    pub streamed_bytes: u64,
    /// Its rows (the vocabulary) and row length.
    pub rows: u64,
    pub cols: u64,
}

impl HeadWork {
    pub fn matrix(&self) -> MatrixWork {
        MatrixWork {
            ty: self.ty.clone(),
            rows: self.rows,
            cols: self.cols,
            bytes: self.bytes,
        }
    }
}

/// One matrix a pass multiplies by: the kernels' speed depends on its type and shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MatrixWork {
    pub ty: String,
    pub rows: u64,
    pub cols: u64,
    pub bytes: u64,
}

impl MatrixWork {
    pub fn of(t: &crate::gguf::TensorInfo) -> Self {
        MatrixWork {
            ty: t.ty.name().to_string(),
            rows: t.n_rows(),
            cols: t.row_len(),
            bytes: t.n_bytes,
        }
    }
}

impl TokenWork {
    /// Weight bytes of the matrix products of type `ty` (the head's included).
    pub fn matrix_bytes(&self, ty: &str) -> u64 {
        let head = if self.head.ty == ty {
            self.head.bytes
        } else {
            0
        };
        head + self
            .matrices
            .iter()
            .filter(|m| m.ty == ty)
            .map(|m| m.bytes)
            .sum::<u64>()
    }
}

/// What one step of a pass reads and runs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageWork {
    /// Its matrix products.
    pub matrices: Vec<MatrixWork>,
    /// Weight bytes read from flash (after the host cache), KV page bytes read from flash,
    /// and both copied from staging to the device.
    pub flash_bytes: f64,
    pub kv_flash_bytes: f64,
    pub upload_bytes: f64,
    /// Bytes copied in host memory (see [`TokenWork::weight_copy_bytes`]).
    pub copy_bytes: f64,
    /// 0: the layer slots (layers, and the output head's chunks when they go through them),
    /// 1: the output head's own chunk slots.
    pub pool: usize,
    pub pieces: usize,
    /// Its pieces take the pool's slots from the first again (the head's chunk c goes through
    /// slot c mod slots), instead of going on from the previous stage's.
    pub from_first_slot: bool,
}

/// Weight bytes that stream from flash each token under `plan` (streamed layers, and the head
/// when it streams).
pub fn streamed_weight_bytes(plan: &ExecPlan) -> u64 {
    plan.streamed_layers()
        .iter()
        .map(|&l| plan.layers[l].files.iter().map(|t| t.n_bytes).sum::<u64>())
        .sum::<u64>()
        + if plan.placement.head_resident {
            0
        } else {
            plan.head.info.n_bytes
        }
}

/// The page hit-rate model for `plan` with `n_past` cached tokens, a host cache of `dram` bytes
/// (weights pinned first) and selection reuse `reuse`.
pub fn kv_prediction(plan: &ExecPlan, n_past: usize, dram: u64, reuse: f64) -> KvPrediction {
    let kv = &plan.kv;
    let n = n_past.max(1) as u64;
    let (pages, candidates) = pages_and_candidates(kv, n);
    let (pages, candidates) = (pages as u32, candidates as u32);
    let home = kv.home_pages.min(pages);
    let cache_bytes = dram.saturating_sub(streamed_weight_bytes(plan));
    let cache_pages = cache_bytes / kv.page_bytes.max(1);
    let n_layers = plan.layers.len() as u32;
    let Some(sel) = kv.select else {
        return predict(&KvModelInput {
            n_layers,
            page_bytes: kv.page_bytes,
            pages,
            home_pages: home,
            select: None,
            cache_pages,
            policy: Policy::Pinned,
            reuse: 0.0,
            lagged: false,
        });
    };
    // Dense layers scan every page and pin what they read; the others select (LRU). A pinned
    // admission evicts LRU pages, so the dense layers' pages take the cache first and the
    // selecting layers share the rest.
    let dense = sel.dense_layers.min(n_layers);
    let selecting = n_layers - dense;
    let keep = sel.keep(candidates);
    let away = pages.saturating_sub(home);
    let n_eff = if candidates == 0 {
        0
    } else {
        ((keep as u64 * away as u64).div_ceil(candidates as u64)) as u32
    };
    let dense_cache = cache_pages.min(dense as u64 * away as u64);
    let part = |layers: u32, select: Option<u32>, policy, cache_pages| {
        predict(&KvModelInput {
            n_layers: layers,
            page_bytes: kv.page_bytes,
            pages,
            home_pages: home,
            select,
            cache_pages,
            policy,
            reuse,
            lagged: sel.lagged,
        })
    };
    let d = part(dense, None, Policy::Pinned, dense_cache);
    let s = part(
        selecting,
        Some(n_eff),
        Policy::Lru,
        cache_pages - dense_cache,
    );
    let flash = d.flash_bytes_per_token + s.flash_bytes_per_token;
    let bytes = d.kv_bytes_per_token + s.kv_bytes_per_token;
    // The hit rate of the needed pages (wasted prefetches are in the flash bytes only).
    let hits = d.hit_rate * d.kv_bytes_per_token + s.hit_rate * s.kv_bytes_per_token;
    KvPrediction {
        requests_per_token: d.requests_per_token + s.requests_per_token,
        hit_rate: if bytes > 0.0 { hits / bytes } else { 0.0 },
        flash_bytes_per_token: flash,
        kv_bytes_per_token: bytes,
        prefetch_hit_rate: s.prefetch_hit_rate,
        wasted_prefetch_per_token: s.wasted_prefetch_per_token,
        demand_flash_bytes_per_token: d.demand_flash_bytes_per_token
            + s.demand_flash_bytes_per_token,
        prefetched_bytes_per_token: d.prefetched_bytes_per_token + s.prefetched_bytes_per_token,
    }
}

/// How the run reads: I/O mode, piece size and threads, host cache, in-place uploads.
#[derive(Debug, Clone)]
pub struct RunIo {
    pub mode: String,
    pub piece: u64,
    pub threads: usize,
    pub dram: u64,
    pub in_place: bool,
}

impl RunIo {
    /// Piece size and readers of one flash read under a staging ring of `ring_chunk`-byte
    /// slots: through the ring a read fills one slot at a time, split into pieces of at most
    /// `piece` bytes over at most `threads` readers; read in place it fills a whole layer (one
    /// run of the file, `slots::layer_span`) or matrix part, in pieces over all the readers.
    pub fn read_shape(&self, ring_chunk: u64) -> (u64, usize) {
        if self.in_place {
            return (self.piece.max(1), self.threads.max(1));
        }
        let piece = self.piece.min(ring_chunk).max(1);
        let threads = self.threads.min(ring_chunk.div_ceil(piece) as usize).max(1);
        (piece, threads)
    }
}

/// What one decode step reads and runs under `plan` with `n_past` cached tokens.
pub fn token_work(plan: &ExecPlan, n_past: usize, io: &RunIo, reuse: f64) -> TokenWork {
    let matrices: Vec<MatrixWork> = plan
        .layers
        .iter()
        .flat_map(|lw| lw.files.iter().map(MatrixWork::of))
        .collect();
    let head = &plan.head.info;
    // Per layer: the norms, biases and per-head norms, RoPE with the KV store, the matrix
    // dispatches (Q, K and V as one where they share it), attention per round and its merge
    // (none for a lone one-split round), page summaries and scores with selection.
    let kv = &plan.kv;
    let n = n_past.max(1) as u64;
    let splits = n.div_ceil(crate::kernels::ATTN_SPLIT_KEYS as u64);
    let rounds = splits
        .div_ceil(kv.decode_round_splits.max(kv.round_splits).max(1) as u64)
        .max(1);
    let merges = if rounds == 1 && splits <= 1 {
        0
    } else {
        rounds
    };
    let mut dispatches = 0u64;
    let mut select_layers = 0u64;
    for (l, &d) in plan.layer_dispatches.iter().enumerate() {
        dispatches += d + rounds + merges;
        if kv.selects_layer(l) {
            dispatches += 2;
            select_layers += 1;
        }
    }
    dispatches += 1 + if plan.placement.head_resident {
        plan.head.layout.parts.len() as u64
    } else {
        plan.head.n_chunks as u64
    };
    let elt = if kv.f16 { 2 } else { 4 };
    let n_layers = plan.layers.len() as u64;
    let mut syncs = 0;
    let attended = match kv.select {
        Some(sel) => {
            let (pages, cand) = pages_and_candidates(kv, n);
            let keep = sel.keep(cand as u32) as u64;
            let dense = (sel.dense_layers as u64).min(n_layers);
            if keep < cand {
                // One read-back per selecting layer, or one per token when lagged.
                syncs = if sel.lagged { 1 } else { n_layers - dense };
            }
            let sel_keys = ((pages - cand + keep) * kv.page_tokens as u64).min(n);
            (dense * n + (n_layers - dense) * sel_keys) as f64 / n_layers.max(1) as f64
        }
        None => n as f64,
    };
    let attn_bytes = (attended * kv.kv_dim as f64 * 2.0 * elt as f64 * n_layers as f64) as u64;
    let streamed = streamed_weight_bytes(plan);
    let (piece, threads) = io.read_shape(plan.ring_chunk);
    let largest = plan
        .streamed_layers()
        .iter()
        .map(|&l| plan.layers[l].files.iter().map(|t| t.n_bytes).sum::<u64>())
        .max()
        .unwrap_or(0);
    let ring = plan.ring_slots as u64 * plan.ring_chunk;
    let ring_share = (!io.in_place && ring < largest).then(|| ring as f64 / largest as f64);
    let p = kv_prediction(plan, n_past, io.dram, reuse);
    // The host cache pins the first weight bytes it sees, and a pass reads the streamed
    // layers in order, then the head: the first of them come from DRAM every token, the
    // rest from flash. `flash_part` takes a stage's bytes in that order.
    let mut dram_left = io.dram;
    let mut flash_part = |bytes: u64| {
        let cached = bytes.min(dram_left);
        dram_left -= cached;
        (bytes - cached) as f64
    };
    let kv_flash = p.flash_bytes_per_token / n_layers.max(1) as f64;
    let kv_up = p.kv_bytes_per_token / n_layers.max(1) as f64;
    let rounds = kv_rounds(kv, kv_up);
    // The first round of each layer's pages joins the layer's reads in the pipeline, but for
    // the pages a selecting layer reads only once it has chosen them; the rest are added after
    // it, unhidden (see `kv_serial_share`).
    let demand = if p.flash_bytes_per_token > 0.0 {
        (p.demand_flash_bytes_per_token / p.flash_bytes_per_token).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let ahead = (1.0 - demand) / rounds;
    let kv_serial_share = 1.0 - ahead;
    // Pages not read from flash are copied into the job's host buffer first, prefetched pages
    // twice (out of the prefetch's read buffer, then into the job's); then every fetched page
    // goes from the job's buffer into the staging ring.
    let per_layer = |bytes: f64| bytes / n_layers.max(1) as f64;
    let kv_copy = kv_up
        + per_layer(p.kv_bytes_per_token * p.hit_rate)
        + 2.0 * per_layer(p.prefetched_bytes_per_token);
    let (kv_flash_ahead, kv_up_ahead) = (kv_flash * ahead, kv_up * ahead);
    let mut stages: Vec<StageWork> = plan
        .layers
        .iter()
        .enumerate()
        .map(|(l, lw)| {
            let matrices = lw.files.iter().map(MatrixWork::of).collect();
            let bytes: u64 = if plan.placement.resident_layers[l] {
                0
            } else {
                lw.files.iter().map(|t| t.n_bytes).sum()
            };
            let flash_bytes = flash_part(bytes);
            StageWork {
                matrices,
                flash_bytes,
                kv_flash_bytes: kv_flash_ahead,
                upload_bytes: if io.in_place { 0.0 } else { bytes as f64 } + kv_up_ahead,
                copy_bytes: bytes as f64 - flash_bytes + kv_copy * ahead,
                pool: 0,
                pieces: 1,
                from_first_slot: false,
            }
        })
        .collect();
    let head_bytes = if plan.placement.head_resident {
        0
    } else {
        head.n_bytes
    };
    let head_flash = flash_part(head_bytes);
    // Read in place, the chunks need no copy; through the layer slots they share the
    // layers' slots (chunk c in slot c mod slots).
    stages.push(StageWork {
        matrices: vec![MatrixWork::of(head)],
        flash_bytes: head_flash,
        kv_flash_bytes: 0.0,
        upload_bytes: if io.in_place { 0.0 } else { head_bytes as f64 },
        copy_bytes: head_bytes as f64 - head_flash,
        pool: if plan.head.in_slots { 0 } else { 1 },
        pieces: if head_bytes > 0 {
            plan.head.n_chunks.max(1) as usize
        } else {
            1
        },
        from_first_slot: plan.head.in_slots,
    });
    TokenWork {
        matrices,
        dispatches,
        syncs,
        attn_bytes,
        select_layers,
        // The scores cover the full pages.
        select_pages: select_layers * (n / kv.page_tokens.max(1) as u64),
        weight_flash_bytes: streamed.saturating_sub(io.dram),
        weight_upload_bytes: if io.in_place { 0 } else { streamed },
        kv_flash_bytes: p.flash_bytes_per_token,
        kv_upload_bytes: p.kv_bytes_per_token,
        // The host cache serves the first streamed bytes a pass reads (`flash_part`).
        weight_copy_bytes: streamed.min(io.dram) as f64,
        kv_copy_bytes: kv_copy * n_layers as f64,
        piece,
        threads,
        mode: io.mode.clone(),
        kv_piece: kv_read_piece(kv, n, kv_flash.min(kv_up / rounds)),
        kv_serial_share,
        stages,
        slots: plan.placement.slots,
        in_place: io.in_place,
        ring_share,
        layer_bytes: largest,
        head: HeadWork {
            ty: head.ty.name().to_string(),
            bytes: head.n_bytes,
            streamed_bytes: head_bytes,
            rows: head.n_rows(),
            cols: head.row_len(),
        },
        kv_bytes_per_key: kv.kv_dim as u64 * 2 * elt * n_layers,
    }
}

/// Pages holding `n` (at least 1) cached tokens, and the candidates page selection ranks
/// among them: all but the sink and the window.
fn pages_and_candidates(kv: &super::KvPlan, n: u64) -> (u64, u64) {
    let pages = (n.max(1) - 1) / kv.page_tokens.max(1) as u64 + 1;
    (pages, pages.saturating_sub(1 + kv.select_window as u64))
}

/// Rounds a layer's `layer_bytes` of fetched pages take through one sequence's part of the
/// stream pool (its half while the other half attends, when it is cut in two); at least 1.
fn kv_rounds(kv: &super::KvPlan, layer_bytes: f64) -> f64 {
    let pages = (layer_bytes / kv.page_bytes.max(1) as f64).ceil();
    let per_round = (kv.stream_slots / kv.max_seqs.max(1) / kv.halves.max(1)).max(1) as f64;
    (pages / per_round).ceil().max(1.0)
}

/// Bytes of one KV read with `n` cached tokens and `layer_flash` KV bytes read from flash per
/// layer and round: without selection a round's missing pages are one run (one read); with selection
/// the chosen pages lie scattered, and a share s of the candidates chosen at random makes
/// runs of 1 / (1 - s) pages on average.
fn kv_read_piece(kv: &super::KvPlan, n: u64, layer_flash: f64) -> u64 {
    let page = kv.page_bytes.max(1);
    let run = match kv.select {
        None => layer_flash,
        Some(sel) => {
            let cand = pages_and_candidates(kv, n).1.max(1);
            let share = (sel.keep(cand as u32) as f64 / cand as f64).min(0.95);
            (page as f64 / (1.0 - share)).min(layer_flash)
        }
    };
    (run as u64).max(page)
}

#[cfg(test)]
mod tests {
    use super::super::{KvPlan, KvSelect, SelectSpec};
    use super::*;

    /// 64-token pages of 48 KiB, 64 per layer, 3 at home, a pool of `slots` pages in `halves`.
    fn kv(slots: u32, halves: u32, select: Option<KvSelect>) -> KvPlan {
        KvPlan {
            f16: true,
            n_heads: 9,
            head_dim: 64,
            kv_dim: 192,
            page_tokens: 64,
            page_bytes: 49152,
            max_pages: 64,
            touched_pages: 2,
            home_pages: 3,
            select_window: 2,
            streams: true,
            round_splits: 1,
            decode_round_splits: 1,
            unit_splits: 1,
            unit_pages: 4,
            stream_slots: slots,
            halves,
            pageout_pages: 1,
            max_seqs: 1,
            seq_stride: 132,
            layer_words: 136,
            select,
            max_binding: u64::MAX,
        }
    }

    #[test]
    fn kv_rounds_and_read_sizes() {
        let page = 49152.0;
        // 61 pages through halves of 16: 4 rounds; through a whole pool of 64: 1.
        assert_eq!(kv_rounds(&kv(32, 2, None), 61.0 * page), 4.0);
        assert_eq!(kv_rounds(&kv(64, 1, None), 61.0 * page), 1.0);
        assert_eq!(kv_rounds(&kv(32, 2, None), 0.0), 1.0);
        // Exact: a round's pages are one read.
        assert_eq!(
            kv_read_piece(&kv(32, 2, None), 4096, 16.0 * page),
            16 * 49152
        );
        // Selection of a quarter of the 61 candidates (16): runs of 1 / (1 - 16/61) pages.
        let quest = KvSelect {
            spec: SelectSpec::Percent(25.0),
            dense_layers: 2,
            lagged: false,
        };
        let piece = kv_read_piece(&kv(32, 2, Some(quest)), 4096, 16.0 * page);
        let want = page / (1.0 - 16.0 / 61.0);
        assert!((piece as f64 - want).abs() <= 1.0, "{piece} vs {want}");
        // Never below a page.
        assert_eq!(kv_read_piece(&kv(32, 2, None), 4096, 10.0), 49152);
    }
}
