//! The full path of `bench io`: cold uploads from flash through a staging ring into device
//! buffers ([`ring_point`]).

use std::path::Path;
use std::time::Instant;

use super::cold::{Log, evict, gbps};
use super::{BenchResult, RING_SLOTS, RingPoint};
use crate::flash::{FlashFile, ReaderOptions};
use crate::gpu::GpuContext;
use crate::gpu::staging::StagingRing;

/// Cold uploads of the range through a staging ring into device buffers.
#[allow(clippy::too_many_arguments)]
pub(super) fn ring_point(
    ctx: &GpuContext,
    dst: &[crate::gpu::GpuBuffer],
    path: &Path,
    opts: ReaderOptions,
    ring_chunk: u64,
    offset: u64,
    bytes: u64,
    repeats: usize,
    raw_gb_s: f64,
    log: &mut Log,
) -> BenchResult<RingPoint> {
    let mut ring = StagingRing::new(ctx, RING_SLOTS, ring_chunk)?;
    let mut runs = Vec::new();
    let mut cold = true;
    for _ in 0..repeats.max(1) {
        let c = evict(path, log)?;
        cold &= c.cold;
        let f = FlashFile::open(path, opts)?;
        ctx.wait()?;
        let t = Instant::now();
        let mut stats = crate::gpu::staging::UploadStats::default();
        let mut done = 0u64;
        for b in dst {
            if done >= bytes {
                break;
            }
            let n = (bytes - done).min(b.size);
            stats.add(&ring.upload(ctx, &f, offset + done, n, b, 0)?);
            done += n;
        }
        ctx.wait()?;
        let s = t.elapsed().as_secs_f64();
        runs.push((gbps(bytes, s), stats));
        drop(f);
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (gb_s, stats) = runs[runs.len() / 2];
    Ok(RingPoint {
        mode: opts.mode.to_string(),
        threads: opts.threads,
        chunk: opts.chunk as u64,
        ring_chunk: ring.chunk_bytes(),
        ring_slots: ring.slots(),
        gb_s,
        runs: runs.len(),
        read_s: stats.read_s,
        wait_s: stats.wait_s,
        ratio_to_raw: gb_s / raw_gb_s.max(1e-12),
        cold,
    })
}
