//! The performance model: what a plan should cost per token, from this machine's measured
//! constants (`flashlm calibrate`).
//!
//! Per decoded token:
//! - compute C = (Σ over the matrix products of weight bytes ÷ the kernel's GB/s for that type
//!   and shape, timed with the weights coming from memory rather than the caches, as in a pass,
//!   plus dispatches × the cost of one dispatch) × the in-pass factor calibration measured on
//!   resident runs, plus attended KV bytes ÷ the attention kernel's GB/s (no factor: the runs
//!   the factor is fitted on attend to a few dozen tokens), plus page selection's kernels in
//!   each selecting layer beyond their dispatches (a cost per layer and per page scored);
//! - weight I/O W = streamed weight bytes not held in the host cache ÷ the flash rate of the I/O
//!   mode, + streamed bytes ÷ the upload rate (the copy from staging memory to the device), +
//!   the bytes the host cache serves ÷ the host copy rate (copied into a slot or staging);
//! - KV I/O K = the KV bytes the page hit-rate model says come from flash ÷ the flash rate of
//!   one reader at the size of a KV read (a run of pages), + KV bytes brought to the device ÷
//!   the upload rate, + the host copies of the pages (cache and prefetch hits into the job's
//!   buffer, every page from it into staging) ÷ the host copy rate;
//! - the layer-ahead pipeline overlaps compute with I/O: with K₁ the KV I/O of each layer's
//!   first round through the stream pool (read ahead; the later rounds' attention waits for
//!   their pages), T = max(C, W + K₁) + β · min(C, W + K₁) + (K − K₁), where β (0: perfect
//!   overlap, 1: none) is measured by calibration from streamed runs of two layer sizes and
//!   taken at the size of the plan's streamed layers; with page selection, the pages a layer
//!   reads only once it has chosen them (neither prefetched nor cached) count with K − K₁, and
//!   each selecting layer's wait for its page scores (read back first; the device idles until
//!   the host has chosen the pages and submitted the rest of the layer) counts as compute; a
//!   calibrated share of the host copies is added unhidden (on a CPU rasterizer a copy takes
//!   a core the kernels run on);
//!   reads go through the staging ring one slot at a time (pieces of at most a slot), and a
//!   ring smaller than a layer holds reads back until the device frees its slots. The pipeline
//!   is simulated pass after pass (`pipeline::simulate_steady`): a decode step's first layers
//!   are read while the step before it finishes its output head.
//!
//! Prefill of a prompt of n tokens in batches of b: each batch pays its compute (prefill kernel
//! rates, per token, times the prefill's in-pass factor measured like the decode's, on models of
//! two sizes and taken at the size of the model's decode step; attention at its own rate) and, when
//! weights stream, a full pass of weight I/O; TTFT adds one decode step's head.

use serde::Serialize;

pub use super::calibration::{
    Calibration, DeviceFacts, FlashRate, MAX_MEASURED_ROWS, MatmulPoint, OverlapPoint,
    PROBE_LARGE_PIECE, PROBE_SMALL_PIECE, PrefillPoint, Probe, SelectCost,
};
use super::pipeline::{Stage, simulate_steady};
pub use super::work::{
    HeadWork, MatrixWork, RunIo, StageWork, TokenWork, kv_prediction, streamed_weight_bytes,
    token_work,
};

/// A prediction, in milliseconds.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Prediction {
    pub compute_ms: f64,
    pub weight_io_ms: f64,
    pub kv_io_ms: f64,
    pub ms_per_token: f64,
    /// The pass with perfect overlap (the pipeline simulation), and the compute and I/O time
    /// it hides; `ms_per_token` adds back the calibrated share of the hidden time.
    pub pipelined_ms: f64,
    pub overlapped_ms: f64,
}

/// Milliseconds per decoded token for `w` on the machine `c` describes.
pub fn predict_token(c: &Calibration, w: &TokenWork) -> Prediction {
    let compute_s = (c.products_s(&w.matrices, false)
        + c.products_s(&[w.head.matrix()], false)
        + w.dispatches as f64 * c.dispatch_s)
        * c.compute_factor_for(pass_bytes(w))
        + attention_s(c, w)
        + selection_s(c, w)
        + waits_s(c, w);
    let flash = c.flash_gb_s(&w.mode, w.piece, w.threads).max(1e-6) * 1e9;
    let up = c.upload_gb_s.max(1e-6) * 1e9;
    let weight_s = w.weight_flash_bytes as f64 / flash
        + w.weight_upload_bytes as f64 / up
        + c.host_copy_s(w.weight_copy_bytes);
    let kv_flash = kv_flash_rate(c, w, flash);
    let kv_s =
        w.kv_flash_bytes / kv_flash + w.kv_upload_bytes / up + c.host_copy_s(w.kv_copy_bytes);
    let serial = w.kv_serial_share.clamp(0.0, 1.0);
    let io = weight_s + kv_s * (1.0 - serial);
    let beta = c.beta_for(w.layer_bytes);
    let (pipelined, overlapped) = if w.stages.is_empty() {
        (compute_s.max(io), compute_s.min(io))
    } else {
        let p = simulate_steady(
            &stages(c, w, flash, kv_flash, up),
            w.slots,
            w.in_place,
            w.ring_share,
        );
        (p.total_s, (p.serial_s - p.total_s).max(0.0))
    };
    // What overlap does not hide on this machine (calibrated).
    // KV rounds after a layer's first wait for their pages: not hidden.
    // The share of the host copies that takes the cores compute needs (calibrated).
    let t =
        pipelined + beta * overlapped + kv_s * serial + c.copy_beta.clamp(0.0, 1.0) * copy_s(c, w);
    Prediction {
        compute_ms: compute_s * 1e3,
        weight_io_ms: weight_s * 1e3,
        kv_io_ms: kv_s * 1e3,
        ms_per_token: t * 1e3,
        pipelined_ms: pipelined * 1e3,
        overlapped_ms: overlapped * 1e3,
    }
}

/// Seconds a decode step's compute waits for page scores: the device idles from each wait's
/// submission until the host has ranked the pages and submitted the rest of its layer, while
/// the I/O thread reads on (so it counts as compute, hidden where I/O is longer).
pub fn waits_s(c: &Calibration, w: &TokenWork) -> f64 {
    w.syncs as f64 * c.sync_s
}

/// Seconds of the I/O thread's host copies in a decode step that run beside compute: the
/// streamed weight bytes the host cache serves, and the KV copies outside the share of the KV
/// I/O that waits for attention (already added whole).
pub fn copy_s(c: &Calibration, w: &TokenWork) -> f64 {
    let serial = w.kv_serial_share.clamp(0.0, 1.0);
    c.host_copy_s(w.weight_copy_bytes) + c.host_copy_s(w.kv_copy_bytes) * (1.0 - serial)
}

/// Seconds of a decode step's attention over its KV bytes at the calibrated attention rate.
/// The in-pass factors are not put on it: they are fitted to passes whose time is their matrix
/// products (short contexts), while the attention rate is timed over KV coming from memory, as
/// in a pass over a long context.
pub fn attention_s(c: &Calibration, w: &TokenWork) -> f64 {
    w.attn_bytes as f64 / (c.attn_gb_s.max(1e-6) * 1e9)
}

/// Seconds of page selection's kernels in a decode step beyond their dispatches (the page
/// summaries and scores of every selecting layer), at their calibrated cost and, like
/// attention, without the in-pass factor (0 where the calibration did not measure them).
pub fn selection_s(c: &Calibration, w: &TokenWork) -> f64 {
    c.select
        .map_or(0.0, |s| s.seconds(w.select_layers, w.select_pages))
}

/// Weight bytes of the matrices of one decode step (the head aside): the size the in-pass
/// factors are measured and taken at.
pub fn pass_bytes(w: &TokenWork) -> u64 {
    w.matrices.iter().map(|m| m.bytes).sum()
}

/// Bytes per second of KV page reads: one thread reading runs of `w.kv_piece` bytes (the
/// weights' rate when unknown).
fn kv_flash_rate(c: &Calibration, w: &TokenWork, flash: f64) -> f64 {
    if w.kv_piece == 0 {
        flash
    } else {
        c.flash_gb_s(&w.mode, w.kv_piece, 1).max(1e-6) * 1e9
    }
}

/// The stages of `w` in seconds: each layer's matrix products at the decode rates plus an equal
/// share of the dispatches and attention; reads at the flash rate, copies at the upload rate.
fn stages(c: &Calibration, w: &TokenWork, flash: f64, kv_flash: f64, up: f64) -> Vec<Stage> {
    let n_layers = w.stages.iter().filter(|s| s.pool == 0).count().max(1) as f64;
    let factor = c.compute_factor_for(pass_bytes(w));
    let dispatches = w.dispatches as f64 * c.dispatch_s / n_layers;
    let attention = (attention_s(c, w) + selection_s(c, w) + waits_s(c, w)) / n_layers;
    w.stages
        .iter()
        .map(|s| Stage {
            compute_s: if s.pool == 0 {
                (c.products_s(&s.matrices, false) + dispatches) * factor + attention
            } else {
                c.products_s(&s.matrices, false) * factor
            },
            // The I/O thread's host copies run between its reads.
            read_s: s.flash_bytes / flash
                + s.kv_flash_bytes / kv_flash
                + c.host_copy_s(s.copy_bytes),
            upload_s: s.upload_bytes / up,
            pool: s.pool,
            pieces: s.pieces,
            from_first_slot: s.from_first_slot,
        })
        .collect()
}

/// Milliseconds of prefill for `n` tokens after `past` cached ones, in batches of `batch` (the
/// time to first token: the last batch's logits give the first generated token). Each batch
/// computes its tokens through the layers at the prefill rates (times the prefill's in-pass
/// factor), each row's attention over the tokens before it at the attention rate (no factor:
/// see [`attention_s`]), and, when weights stream, pays the layers' weight
/// I/O; the output head runs once, for the last token (at the decode rate), and streams only
/// then. (KV pages read back during a long prefill are not counted.)
pub fn predict_prefill(c: &Calibration, w: &TokenWork, past: usize, n: usize, batch: usize) -> f64 {
    let batches = n.div_ceil(batch.max(1)).max(1);
    let per_token_compute = c.products_s(&w.matrices, true);
    let head_compute = if w.head.bytes > 0 {
        c.products_s(&[w.head.matrix()], false)
    } else {
        0.0
    };
    let flash = c.flash_gb_s(&w.mode, w.piece, w.threads).max(1e-6) * 1e9;
    let up = c.upload_gb_s.max(1e-6) * 1e9;
    // The head's share of the streamed bytes, read from flash in the same proportion.
    let streamed = w.weight_upload_bytes.max(w.weight_flash_bytes).max(1) as f64;
    let head_share = (w.head.streamed_bytes as f64 / streamed).min(1.0);
    let upload_share = if w.weight_upload_bytes > 0 { 1.0 } else { 0.0 };
    let head_io = w.weight_flash_bytes as f64 * head_share / flash
        + w.head.streamed_bytes as f64 * upload_share / up;
    let io_pass = w.weight_flash_bytes as f64 * (1.0 - head_share) / flash
        + (w.weight_upload_bytes as f64 - w.head.streamed_bytes as f64 * upload_share).max(0.0)
            / up;
    let beta = c.beta_for(w.layer_bytes);
    let attn = w.kv_bytes_per_key as f64 / (c.prefill_attn().max(1e-6) * 1e9);
    let factor = c.prefill_factor_for(pass_bytes(w));
    let mut total = 0.0;
    let mut left = n;
    let mut before = past as f64;
    for i in 0..batches {
        let t = left.min(batch.max(1));
        left -= t;
        let last = i + 1 == batches;
        // Rows before+1 ..= before+t each attend to every token up to themselves.
        let keys = t as f64 * before + (t * (t + 1) / 2) as f64;
        before += t as f64;
        let compute = (per_token_compute * t as f64
            + w.dispatches as f64 * c.dispatch_s
            + if last { head_compute } else { 0.0 })
            * factor
            + keys * attn;
        let io = io_pass + if last { head_io } else { 0.0 };
        total += compute.max(io) + beta * compute.min(io);
    }
    total * 1e3
}

/// Milliseconds of attention in [`predict_prefill`]'s prefill of `n` tokens after `past`
/// cached ones (the part its in-pass factor is not put on).
pub fn prefill_attention_ms(c: &Calibration, w: &TokenWork, past: usize, n: usize) -> f64 {
    // Rows past+1 ..= past+n each attend to every token up to themselves, whatever the batches.
    let keys = n as f64 * past as f64 + (n * (n + 1) / 2) as f64;
    keys * w.kv_bytes_per_key as f64 / (c.prefill_attn().max(1e-6) * 1e9) * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::plan::calibration::tests::{cal, mat};

    #[test]
    fn beta_by_layer_size() {
        let mut c = cal();
        // No sizes: the one β.
        assert_eq!(c.beta_for(5_000_000), 0.25);
        c.overlap_points = vec![
            OverlapPoint {
                layer_bytes: 25_000_000,
                beta: 0.7,
            },
            OverlapPoint {
                layer_bytes: 2_500_000,
                beta: 0.2,
            },
        ];
        // Held at the ends (and for no streamed layer), linear in log(bytes) between: 7.9 MB
        // is about halfway from 2.5 to 25 MB in log terms.
        assert_eq!(c.beta_for(0), 0.2);
        assert_eq!(c.beta_for(1_000_000), 0.2);
        assert_eq!(c.beta_for(100_000_000), 0.7);
        let mid = (2_500_000f64 * 25_000_000f64).sqrt() as u64;
        assert!((c.beta_for(mid) - 0.45).abs() < 1e-6, "{}", c.beta_for(mid));
        // A prediction uses the β of its streamed layers' size.
        let w = TokenWork {
            matrices: vec![mat("Q4_1", 60_000_000)],
            weight_flash_bytes: 80_000_000,
            weight_upload_bytes: 80_000_000,
            piece: 1 << 20,
            threads: 4,
            mode: "direct".into(),
            layer_bytes: 100_000_000,
            ..Default::default()
        };
        // Compute 60 ms, I/O 40 + 8 = 48 ms: 60 + 0.7 × 48.
        let p = predict_token(&c, &w);
        assert!((p.ms_per_token - 93.6).abs() < 1e-9, "{p:?}");
    }

    #[test]
    fn hand_computed_token() {
        // 60 MB of Q4_1 at 1 GB/s = 60 ms, 20 MB of Q8_0 at 2 GB/s = 10 ms, 500 dispatches of
        // 20 µs = 10 ms, 8 MB of KV at 4 GB/s = 2 ms: compute 82 ms.
        // 80 MB streamed from flash at 2 GB/s (1 MiB pieces, 4 threads) = 40 ms, uploaded at
        // 10 GB/s = 8 ms; KV 4 MB from flash = 2 ms, 6 MB uploaded = 0.6 ms: I/O 50.6 ms.
        // T = 82 + 0.25 × 50.6 = 94.65 ms.
        let w = TokenWork {
            matrices: vec![mat("Q4_1", 60_000_000), mat("Q8_0", 20_000_000)],
            dispatches: 500,
            attn_bytes: 8_000_000,
            weight_flash_bytes: 80_000_000,
            weight_upload_bytes: 80_000_000,
            kv_flash_bytes: 4e6,
            kv_upload_bytes: 6e6,
            piece: 1 << 20,
            threads: 4,
            mode: "direct".into(),
            ..Default::default()
        };
        let p = predict_token(&cal(), &w);
        assert!((p.compute_ms - 82.0).abs() < 1e-9, "{p:?}");
        assert!((p.weight_io_ms - 48.0).abs() < 1e-9, "{p:?}");
        assert!((p.kv_io_ms - 2.6).abs() < 1e-9, "{p:?}");
        assert!((p.ms_per_token - 94.65).abs() < 1e-9, "{p:?}");
        // A pass whose matrix products and dispatches run 1.5x slower in place: compute
        // 80 x 1.5 + 2 (attention takes no factor) = 122 ms, I/O hidden behind it.
        let slow = Calibration {
            compute_scale: 1.5,
            ..cal()
        };
        let p = predict_token(&slow, &w);
        assert!((p.compute_ms - 122.0).abs() < 1e-9, "{p:?}");
        assert!(
            (p.ms_per_token - (122.0 + 0.25 * 50.6)).abs() < 1e-9,
            "{p:?}"
        );
        // Measured on two model sizes: this work's 80 MB decode step takes the factor measured
        // at 80 MB (1.5), not the one at 8 MB nor the unsized one.
        let sized = Calibration {
            compute_points: vec![
                PrefillPoint {
                    pass_bytes: 8_000_000,
                    scale: 0.5,
                },
                PrefillPoint {
                    pass_bytes: 80_000_000,
                    scale: 1.5,
                },
            ],
            compute_scale: 0.5,
            ..cal()
        };
        let p = predict_token(&sized, &w);
        assert!((p.compute_ms - 122.0).abs() < 1e-9, "{p:?}");
        assert!((sized.compute_factor_for(8_000_000) - 0.5).abs() < 1e-12);
        // Out-of-range factors are clamped; nonsense ones ignored.
        for (k, f) in [(100.0, 4.0), (0.0, 1.0), (f64::NAN, 1.0), (-2.0, 1.0)] {
            let c = Calibration {
                compute_scale: k,
                ..cal()
            };
            assert_eq!(c.compute_factor(), f);
        }
        // Small pieces read at the small-piece rate.
        let small = TokenWork {
            piece: 60 << 10,
            ..w.clone()
        };
        assert!(predict_token(&cal(), &small).weight_io_ms > 160.0);
        // KV pages read in runs of 64 KiB by one thread: at the 64 KiB rate (0.5 GB/s), 4 MB
        // take 8 ms (+ 0.6 ms of upload); the weights keep their rate.
        let short_runs = TokenWork {
            kv_piece: 64 << 10,
            ..w.clone()
        };
        let p = predict_token(&cal(), &short_runs);
        assert!((p.kv_io_ms - 8.6).abs() < 1e-9, "{p:?}");
        assert!((p.weight_io_ms - 48.0).abs() < 1e-9, "{p:?}");
        // Half of the KV I/O in rounds that wait for their pages: 1.3 ms join the pipeline
        // (I/O 49.3 ms under 82 ms of compute), 1.3 ms are added unhidden:
        // T = 82 + 0.25 × 49.3 + 1.3 = 95.625 ms.
        let rounds = TokenWork {
            kv_serial_share: 0.5,
            ..w.clone()
        };
        let p = predict_token(&cal(), &rounds);
        assert!((p.ms_per_token - 95.625).abs() < 1e-9, "{p:?}");
        // 28 selecting layers each waiting 0.5 ms for their page scores: 14 ms of compute
        // (the device idles), here all of it to the token: 96 + 0.25 × 50.6.
        let selecting = TokenWork {
            syncs: 28,
            ..w.clone()
        };
        let c = Calibration {
            sync_s: 0.5e-3,
            ..cal()
        };
        let p = predict_token(&c, &selecting);
        assert!((p.ms_per_token - 108.65).abs() < 1e-9, "{p:?}");
        // Without a measured round trip (an older profile) they cost nothing.
        assert!((predict_token(&cal(), &selecting).ms_per_token - 94.65).abs() < 1e-9);
        // Their page summaries and scores: 28 layers of 50 µs + 28 × 34 pages of 2.5 µs =
        // 1.4 + 2.38 ms more compute, not scaled by the in-pass factor: compute 99.78 ms,
        // T = 99.78 + 0.25 × 50.6 = 112.43 ms.
        let scoring = TokenWork {
            select_layers: 28,
            select_pages: 28 * 34,
            ..selecting.clone()
        };
        let priced = Calibration {
            select: Some(SelectCost {
                layer_s: 50e-6,
                page_s: 2.5e-6,
            }),
            ..c.clone()
        };
        let p = predict_token(&priced, &scoring);
        assert!((p.compute_ms - 99.78).abs() < 1e-9, "{p:?}");
        assert!((p.ms_per_token - 112.43).abs() < 1e-9, "{p:?}");
        // Unmeasured (an older profile): priced as their dispatches only.
        assert!((predict_token(&c, &scoring).ms_per_token - 108.65).abs() < 1e-9);
        // Host copies: 40 MB of weights from the host cache at 10 GB/s (4 ms) and 10 MB of KV
        // (1 ms), half of the KV I/O waiting for attention: 4.5 ms run beside compute, of
        // which a copy share of 0.5 adds 2.25 ms to the token whatever the rest hides.
        let copying = TokenWork {
            weight_copy_bytes: 40e6,
            kv_copy_bytes: 10e6,
            kv_serial_share: 0.5,
            ..w.clone()
        };
        let hidden = Calibration {
            host_copy_gb_s: 10.0,
            ..cal()
        };
        let shared = Calibration {
            copy_beta: 0.5,
            ..hidden.clone()
        };
        assert!((copy_s(&hidden, &copying) - 4.5e-3).abs() < 1e-12);
        let (a, b) = (
            predict_token(&hidden, &copying),
            predict_token(&shared, &copying),
        );
        assert!(
            (b.ms_per_token - a.ms_per_token - 2.25).abs() < 1e-9,
            "{a:?} {b:?}"
        );
        // Prefill: 100 tokens in batches of 64: per token 60 MB / 8 GB/s + 20 MB / Q8_0
        // (unmeasured for prefill: the slowest measured, 8) = 10 ms; batch 1: 640 ms + 10 ms
        // of dispatches vs 48 ms of I/O: 650 + 12 = 662; batch 2: 360 + 10 = 370 + 12 = 382.
        let ms = predict_prefill(&cal(), &w, 0, 100, 64);
        assert!((ms - 1044.0).abs() < 1e-6, "{ms}");
        // A prefill running twice as fast in place as its kernels alone: compute 325 ms and
        // 185 ms, the I/O unchanged: 325 + 0.25 × 48 + 185 + 0.25 × 48 = 534.
        let quick = Calibration {
            prefill_scale: 0.5,
            compute_scale: 3.0,
            ..cal()
        };
        let ms = predict_prefill(&quick, &w, 0, 100, 64);
        assert!((ms - 534.0).abs() < 1e-6, "{ms}");
        // With 40 kB of KV a key, attended at 4 GB/s and not halved: batch 1's rows attend
        // 64 x 65 / 2 = 2080 keys (20.8 ms), batch 2's 36 x 64 + 36 x 37 / 2 = 2970 (29.7 ms):
        // 345.8 + 12 + 214.7 + 12 = 584.5 ms, 50.5 ms of it attention.
        let attending = TokenWork {
            kv_bytes_per_key: 40_000,
            ..w.clone()
        };
        let ms = predict_prefill(&quick, &attending, 0, 100, 64);
        assert!((ms - 584.5).abs() < 1e-6, "{ms}");
        let attn = prefill_attention_ms(&quick, &attending, 0, 100);
        assert!((attn - 50.5).abs() < 1e-9, "{attn}");
        // Measured on two models, the factor of the nearer size in log terms: this work's
        // 80 MB decode step lies past the larger model's 40 MB, whose factor (0.5) holds.
        let sized = Calibration {
            prefill_points: vec![
                PrefillPoint {
                    pass_bytes: 40_000_000,
                    scale: 0.5,
                },
                PrefillPoint {
                    pass_bytes: 4_000_000,
                    scale: 2.0,
                },
            ],
            ..cal()
        };
        let ms = predict_prefill(&sized, &w, 0, 100, 64);
        assert!((ms - 534.0).abs() < 1e-6, "{ms}");
        assert_eq!(sized.prefill_factor_for(1_000_000), 2.0);
        let mid = (4_000_000f64 * 40_000_000f64).sqrt() as u64;
        assert!((sized.prefill_factor_for(mid) - 1.25).abs() < 1e-6);
        for (k, f) in [(100.0, 4.0), (0.1, 0.25), (f64::NAN, 1.0), (-2.0, 1.0)] {
            let c = Calibration {
                prefill_scale: k,
                ..cal()
            };
            assert_eq!(c.prefill_factor(), f);
        }
        // The same work with the 20 MB of Q8_0 as the output head, streamed: the layers'
        // 60 MB at 8 GB/s = 7.5 ms per token; their I/O 60 MB / 2 GB/s + 60 MB / 10 GB/s =
        // 36 ms a batch; the head once, in the last batch: 20 MB / 2 GB/s (decode rate) =
        // 10 ms of compute and 10 + 2 = 12 ms of I/O. Batch 1: 480 + 10 = 490 vs 36: 499;
        // batch 2: 270 + 10 + 10 = 290 vs 48: 302. Total 801.
        let with_head = TokenWork {
            matrices: vec![mat("Q4_1", 60_000_000)],
            head: HeadWork {
                ty: "Q8_0".into(),
                bytes: 20_000_000,
                streamed_bytes: 20_000_000,
                rows: 20_000,
                cols: 1000,
            },
            ..w.clone()
        };
        let ms = predict_prefill(&cal(), &with_head, 0, 100, 64);
        assert!((ms - 801.0).abs() < 1e-6, "{ms}");
        // Attention alone: 4 MB of K and V per cached token at 4 GB/s = 1 ms per key. Three
        // tokens after 10 cached, in batches of 2: rows 11 and 12 (23 keys), then row 13.
        let attention = TokenWork {
            kv_bytes_per_key: 4_000_000,
            ..Default::default()
        };
        let ms = predict_prefill(&cal(), &attention, 10, 3, 2);
        assert!((ms - 36.0).abs() < 1e-6, "{ms}");
    }
}
