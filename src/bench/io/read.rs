//! Host-side cold reads of `bench io`: the raw baseline (one plain buffered `read`,
//! [`raw_cold`]) and one [`FlashFile`] setting of the sweep ([`flash_point`]).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::Instant;

use super::cold::{Log, evict, gbps};
use super::{BenchResult, Point};
use crate::bench::median;
use crate::flash::{FlashFile, IoMode, ReaderOptions, Residency};

/// A sweep point whose first run takes longer than this is not repeated.
const REPEAT_UNDER_S: f64 = 0.5;

/// Bytes a sweep point reads, untimed, outside its range before its timed read.
const WARM_UP: usize = 4 << 20;

/// Plain buffered `read` of the range into `buf` after an eviction.
pub(super) fn raw_cold(
    path: &Path,
    offset: u64,
    buf: &mut [u8],
    repeats: usize,
    log: &mut Log,
) -> BenchResult<Point> {
    let mut v = Vec::new();
    let mut last = None;
    let mut cold = true;
    for _ in 0..repeats {
        let c = evict(path, log)?;
        cold &= c.cold;
        last = Some(c.residency);
        let mut f =
            std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))?;
        let t = Instant::now();
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(buf))
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        v.push(gbps(buf.len() as u64, t.elapsed().as_secs_f64()));
    }
    Ok(Point {
        mode: "raw read".into(),
        threads: 1,
        chunk: buf.len() as u64,
        gb_s: median(&mut v),
        runs: v.len(),
        bytes_read: buf.len() as u64,
        reads: 1,
        residency: last.unwrap_or(Residency {
            before: 0.0,
            after: 0.0,
        }),
        cold,
    })
}

/// Cold reads of the range with a [`FlashFile`] of the given options.
pub(super) fn flash_point(
    path: &Path,
    opts: ReaderOptions,
    offset: u64,
    buf: &mut [u8],
    repeats: usize,
    log: &mut Log,
) -> BenchResult<Point> {
    let mut v = Vec::new();
    let mut cold = true;
    let mut last = Residency {
        before: 0.0,
        after: 0.0,
    };
    let (mut bytes_read, mut reads) = (0, 0);
    for r in 0..repeats.max(1) {
        let c = evict(path, log)?;
        cold &= c.cold;
        last = c.residency;
        let f = FlashFile::open(path, opts)?;
        if opts.mode == IoMode::Mmap {
            f.advise_sequential()?;
        }
        warm_up(&f, offset, buf.len() as u64)?;
        let t = Instant::now();
        f.read_into(offset, buf)?;
        let s = t.elapsed().as_secs_f64();
        v.push(gbps(buf.len() as u64, s));
        bytes_read = f.bytes_read();
        reads = f.reads();
        // Unmap before the next eviction: mapped pages cannot be evicted.
        drop(f);
        if r == 0 && s > REPEAT_UNDER_S {
            break;
        }
    }
    Ok(Point {
        mode: opts.mode.to_string(),
        threads: opts.threads,
        chunk: opts.chunk as u64,
        gb_s: median(&mut v),
        runs: v.len(),
        bytes_read,
        reads,
        residency: last,
        cold,
    })
}

/// Read [`WARM_UP`] bytes of `f` past the range `[offset, offset + len)` (or before it, where
/// the file ends too soon), untimed, with the reader's own threads: the engine reads flash as a
/// stream, and on the development VM the first read after the disk has idled ran 20-25% slower
/// than the ones right after it, whichever part of the file they read (4 reads in a row of 32
/// MiB in 1 MiB pieces over 4 threads: 1.12 then 1.38 GB/s, 1.55 then 1.85; a sweep point that
/// timed one read from idle priced the engine's reads that much low). Nothing when the file has
/// no room outside the range.
fn warm_up(f: &FlashFile, offset: u64, len: u64) -> BenchResult<()> {
    let n = WARM_UP as u64;
    let end = offset + len;
    let at = if f.len() >= end + n {
        end
    } else if offset >= n {
        offset - n
    } else {
        return Ok(());
    };
    let mut buf = super::cold::HostBuf::new(WARM_UP, at as usize);
    f.read_into(at, buf.get())?;
    Ok(())
}
