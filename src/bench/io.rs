//! `flashlm bench io`: how fast model bytes come off flash, each way the engine can read them,
//! measured on the same bytes from a verified-cold page cache.
//!
//! - raw cold read: one plain sequential `read` with a large buffer (the baseline);
//! - direct and mmap reads swept over piece size × reader threads;
//! - the full path through the staging ring into device buffers, for the best direct and mmap
//!   settings and a few ring chunk sizes, as a fraction of the raw cold read.
//!
//! This file holds the options, the sweep settings and [`run`], which drives the measurements;
//! the submodules hold the pieces:
//! - `cold`: page-aligned host buffers, page-cache eviction and its log;
//! - `read`: the raw cold read and one [`FlashFile`](crate::flash::FlashFile) setting of the
//!   sweep;
//! - `ring`: one measurement of the staging-ring path;
//! - `report`: the report types and their Markdown and SVG output.

mod cold;
mod read;
mod report;
mod ring;

pub use report::{IoReport, Point, RingPoint};

use std::path::PathBuf;
use std::time::Instant;

use crate::flash::{DIRECT_ALIGN, FlashError, IoMode, ReaderOptions, format_size};
use crate::gpu::{GpuContext, GpuOptions};
use cold::{HostBuf, Log};
use read::{flash_point, raw_cold};
use ring::ring_point;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Piece sizes of the sweep: 4 KiB to 16 MiB in powers of 4.
pub const SWEEP_CHUNKS: [usize; 7] = [
    4 << 10,
    16 << 10,
    64 << 10,
    256 << 10,
    1 << 20,
    4 << 20,
    16 << 20,
];
/// Reader threads of the sweep.
pub const SWEEP_THREADS: [usize; 4] = [1, 2, 4, 8];
/// Staging-ring chunk sizes tried for the full path.
pub const RING_CHUNKS: [u64; 3] = [1 << 20, 4 << 20, 16 << 20];
/// Staging-ring slots.
pub const RING_SLOTS: usize = 4;
/// Largest device buffer the full path fills.
pub const MAX_DST_BUFFER: u64 = 128 << 20;

/// What to measure.
#[derive(Debug, Clone)]
pub struct IoBenchOptions {
    pub model: PathBuf,
    /// Bytes to read (capped at the tensor data region).
    pub bytes: u64,
    /// Repeats per measurement (the median is reported).
    pub repeats: usize,
    /// Measure the staging-ring path (needs a GPU adapter).
    pub gpu: Option<GpuOptions>,
}

/// Run the whole benchmark; progress goes to stderr.
pub fn run(o: &IoBenchOptions) -> BenchResult<IoReport> {
    let t_all = Instant::now();
    let path = o.model.as_path();
    let repeats = o.repeats.max(1);
    // Parse the header for the data region, then let go of the map before measuring.
    let (data_offset, file_len) = {
        let g =
            crate::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        (g.data_offset, g.file_len)
    };
    let offset = data_offset.next_multiple_of(DIRECT_ALIGN as u64);
    if offset >= file_len {
        return Err(format!("{} has no tensor data to read", path.display()).into());
    }
    if o.bytes == 0 {
        return Err("--bytes must be at least 1 byte".into());
    }
    let bytes = o.bytes.min(file_len - offset);
    let len = usize::try_from(bytes).map_err(|_| "--bytes does not fit in memory")?;
    let mut log = Log::default();
    if bytes < o.bytes {
        log.notes.push(format!(
            "--bytes capped at the tensor data of the file: {}",
            format_size(bytes)
        ));
    }
    eprintln!(
        "bench io: {} bytes at offset {offset} of {} ({} bytes)",
        bytes,
        path.display(),
        file_len
    );
    let mut buf = HostBuf::new(len, offset as usize);

    let raw = raw_cold(path, offset, buf.get(), repeats, &mut log)?;
    eprintln!("raw cold read: {:.3} GB/s", raw.gb_s);

    let mut sweep = Vec::new();
    for mode in [IoMode::Direct, IoMode::Mmap] {
        for &threads in &SWEEP_THREADS {
            for &chunk in &SWEEP_CHUNKS {
                let opts = ReaderOptions {
                    mode,
                    threads,
                    chunk,
                };
                match flash_point(path, opts, offset, buf.get(), repeats, &mut log) {
                    Ok(p) => {
                        eprintln!(
                            "{mode:>6} threads {threads} chunk {:>8}: {:.3} GB/s",
                            format_size(chunk as u64),
                            p.gb_s
                        );
                        sweep.push(p);
                    }
                    Err(e) if is_direct_unsupported(&*e) => {
                        log.notes.push(format!("direct I/O skipped: {e}"));
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
            if mode == IoMode::Direct && sweep.is_empty() {
                break;
            }
        }
    }
    // Best among the cold points; among all when none was cold.
    let best = |m: IoMode| {
        let of_mode = || sweep.iter().filter(|p| p.mode == m.to_string());
        let any_cold = of_mode().any(|p| p.cold);
        of_mode()
            .filter(|p| p.cold || !any_cold)
            .max_by(|a, b| a.gb_s.total_cmp(&b.gb_s))
            .cloned()
    };
    let best_direct = best(IoMode::Direct);
    let best_mmap = best(IoMode::Mmap);

    // The best direct setting once more with every byte through bounce buffers.
    let direct_unaligned_dst = match &best_direct {
        Some(p) => {
            let mut skewed = HostBuf::new(len, offset as usize + 64);
            let opts = ReaderOptions {
                mode: IoMode::Direct,
                threads: p.threads,
                chunk: p.chunk as usize,
            };
            let mut q = flash_point(path, opts, offset, skewed.get(), repeats, &mut log)?;
            q.mode = "direct, unaligned dst".into();
            eprintln!("direct into an unaligned destination: {:.3} GB/s", q.gb_s);
            Some(q)
        }
        None => None,
    };
    drop(buf);

    let mut ring = Vec::new();
    let mut adapter = None;
    if let Some(gpu_opts) = &o.gpu {
        match GpuContext::new(gpu_opts) {
            Err(e) => log.notes.push(format!("staging-ring path skipped: {e}")),
            Ok(ctx) => {
                adapter = Some(ctx.describe());
                let part = MAX_DST_BUFFER.min(ctx.limits.max_buffer_size) / 16 * 16;
                let mut dst = Vec::new();
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(part);
                    dst.push(ctx.storage(&format!("bench-io-dst[{}]", dst.len()), n)?);
                    left -= n;
                }
                for b in [&best_direct, &best_mmap].into_iter().flatten() {
                    let opts = ReaderOptions {
                        mode: b.mode.parse()?,
                        threads: b.threads,
                        chunk: b.chunk as usize,
                    };
                    for &rc in &RING_CHUNKS {
                        let p = ring_point(
                            &ctx, &dst, path, opts, rc, offset, bytes, repeats, raw.gb_s, &mut log,
                        )?;
                        eprintln!(
                            "ring {} ({} threads, {} pieces), ring chunk {}: {:.3} GB/s = {:.2} × raw",
                            p.mode,
                            p.threads,
                            format_size(p.chunk),
                            format_size(p.ring_chunk),
                            p.gb_s,
                            p.ratio_to_raw
                        );
                        ring.push(p);
                    }
                }
            }
        }
    }
    let ring_over_raw = ring
        .iter()
        .map(|p| p.ratio_to_raw)
        .max_by(|a, b| a.total_cmp(b));
    if log.failed > 0 {
        log.notes.push(format!(
            "eviction did not take effect in {} of {} attempts (up to {:.0}% of the file still cached: pages mapped by another process, dirty, or no permission); those figures include page-cache hits",
            log.failed,
            log.evictions,
            log.worst_after * 100.0
        ));
    }
    let notes = log.notes;
    let eviction_effective = raw.cold
        && sweep.iter().all(|p| p.cold)
        && ring.iter().all(|p| p.cold)
        && direct_unaligned_dst.as_ref().is_none_or(|p| p.cold);
    Ok(IoReport {
        model: path.display().to_string(),
        file_len,
        offset,
        bytes,
        repeats,
        raw_cold: raw,
        sweep,
        direct_unaligned_dst,
        best_direct,
        best_mmap,
        ring,
        ring_over_raw,
        adapter,
        eviction_effective,
        evictions: log.evictions,
        evictions_failed: log.failed,
        notes,
        seconds: t_all.elapsed().as_secs_f64(),
    })
}

fn is_direct_unsupported(e: &(dyn std::error::Error + 'static)) -> bool {
    matches!(
        e.downcast_ref::<FlashError>(),
        Some(FlashError::DirectUnsupported { .. })
    )
}

/// GB/s of cold direct reads of `bytes` (at most the file's tensor data) from the start of
/// `path`'s tensor data by one thread in pieces of `piece` bytes (the setting of the sweep's
/// point at that piece size), median of `repeats`, as the speed probe takes it.
pub(crate) fn direct_read_gb_s(
    path: &std::path::Path,
    piece: u64,
    bytes: u64,
    repeats: usize,
) -> BenchResult<f64> {
    let (data_offset, file_len) = {
        let g =
            crate::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        (g.data_offset, g.file_len)
    };
    let offset = data_offset.next_multiple_of(DIRECT_ALIGN as u64);
    let len = bytes.min(file_len.saturating_sub(offset));
    if len == 0 {
        return Err(format!("{} has no tensor data to read", path.display()).into());
    }
    let len = usize::try_from(len).map_err(|_| "read size does not fit in memory")?;
    let chunk = usize::try_from(piece.max(1)).map_err(|_| "piece size does not fit in memory")?;
    let mut buf = HostBuf::new(len, offset as usize);
    let opts = ReaderOptions {
        mode: IoMode::Direct,
        threads: 1,
        chunk,
    };
    Ok(flash_point(path, opts, offset, buf.get(), repeats, &mut Log::default())?.gb_s)
}
