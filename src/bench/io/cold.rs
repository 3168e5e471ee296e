//! Cold-cache plumbing of `bench io`: page-aligned host buffers ([`HostBuf`]), page-cache
//! eviction with retries and its log ([`evict`], [`Log`]), and the GB/s arithmetic.

use std::path::Path;

use super::BenchResult;
use crate::flash::{DIRECT_ALIGN, Residency, evict_page_cache};

/// Extra eviction attempts when pages stay cached.
const EVICT_RETRIES: usize = 5;

/// A page-aligned host buffer (a `Vec` with its start skipped forward).
pub(super) struct HostBuf {
    v: Vec<u8>,
    skew: usize,
    len: usize,
}

impl HostBuf {
    /// `len` bytes whose address is congruent to `phase` modulo 4096.
    pub(super) fn new(len: usize, phase: usize) -> Self {
        let mut v = vec![0u8; len + 2 * DIRECT_ALIGN];
        // Touch every page now so the measured reads do not pay for first-touch faults.
        for i in (0..v.len()).step_by(4096) {
            v[i] = 1;
        }
        let base = v.as_ptr() as usize % DIRECT_ALIGN;
        let skew = (DIRECT_ALIGN + phase % DIRECT_ALIGN - base) % DIRECT_ALIGN;
        Self { v, skew, len }
    }
    pub(super) fn get(&mut self) -> &mut [u8] {
        &mut self.v[self.skew..self.skew + self.len]
    }
}

pub(super) struct Cold {
    pub(super) residency: Residency,
    pub(super) cold: bool,
}

/// Evictions of a run and the notes to print.
#[derive(Debug, Default)]
pub(super) struct Log {
    pub(super) notes: Vec<String>,
    pub(super) evictions: u64,
    pub(super) failed: u64,
    pub(super) worst_after: f64,
}

pub(super) fn evict(path: &Path, log: &mut Log) -> BenchResult<Cold> {
    let mut r = evict_page_cache(path)?;
    // Another process may hold the file mapped for a moment (a test, a run): retry briefly.
    for _ in 0..EVICT_RETRIES {
        if r.effective() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let again = evict_page_cache(path)?;
        r = Residency {
            before: r.before,
            after: again.after,
        };
    }
    log.evictions += 1;
    if !r.effective() {
        log.failed += 1;
        log.worst_after = log.worst_after.max(r.after);
    }
    Ok(Cold {
        residency: r,
        cold: r.effective(),
    })
}

pub(super) fn gbps(bytes: u64, s: f64) -> f64 {
    bytes as f64 / s.max(1e-9) / 1e9
}
