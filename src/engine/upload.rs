//! The engine's side of the transfer queue: jobs that read weights and KV pages and move them
//! through the staging ring into device buffers, on the I/O thread, in priority order.
//!
//! A job's copies are submitted after everything the engine had submitted when it queued the
//! job, so a job may overwrite a slot that earlier compute read; the engine waits for a job's
//! ticket before it submits compute that reads the job's bytes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::flash::queue::{Priority, Ticket, TransferQueue};
use crate::flash::{Admit, CacheKey, ChunkSource, HostCache, WeightSource};
use crate::gpu::GpuContext;
use crate::gpu::staging::{StagingError, StagingRing, UploadReq, UploadStats};
use crate::kv::store::KvStore;

/// One range to upload, with an owned destination.
pub struct OwnedReq {
    pub src_offset: u64,
    pub len: u64,
    pub dst: wgpu::Buffer,
    pub dst_offset: u64,
}

/// What a finished job reports.
#[derive(Debug, Clone, Default)]
pub struct JobReport {
    pub upload: UploadStats,
    /// Seconds from the tracer's start when the job began and ended.
    pub start: f64,
    pub end: f64,
    pub kv: KvFetch,
}

/// KV page traffic of one job.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct KvFetch {
    /// Pages brought to the device, and of those: served by the host cache, by a prefetch,
    /// read from flash.
    pub pages: u64,
    pub host_hits: u64,
    pub prefetch_hits: u64,
    pub flash_pages: u64,
    pub flash_bytes: u64,
}

impl KvFetch {
    pub fn add(&mut self, o: &KvFetch) {
        self.pages += o.pages;
        self.host_hits += o.host_hits;
        self.prefetch_hits += o.prefetch_hits;
        self.flash_pages += o.flash_pages;
        self.flash_bytes += o.flash_bytes;
    }
}

pub type JobResult = Result<JobReport, String>;

/// Key space of KV pages in the host cache: a = (seq << 32) | layer, b = page.
pub const KV_KEYS: u32 = 1;

fn kv_key(seq: u32, layer: u32, page: u32) -> CacheKey {
    CacheKey::new(KV_KEYS, ((seq as u64) << 32) | layer as u64, page as u64)
}

/// Pages read ahead into host memory by predictive prefetch: (layer, page) -> bytes.
pub type PrefetchBuf = Arc<Mutex<HashMap<(u32, u32), Vec<u8>>>>;

/// The upload side of the engine.
pub struct Uploader {
    pub queue: TransferQueue,
    ctx: Arc<GpuContext>,
    ring: Option<Arc<Mutex<StagingRing>>>,
    source: Arc<dyn WeightSource>,
    pub cache: Arc<HostCache>,
    pub store: Option<Arc<KvStore>>,
    pub prefetched: PrefetchBuf,
    t0: Instant,
}

impl Uploader {
    pub fn new(
        ctx: Arc<GpuContext>,
        ring: Option<StagingRing>,
        source: Arc<dyn WeightSource>,
        t0: Instant,
    ) -> Self {
        let cache = source
            .host_cache()
            .unwrap_or_else(|| Arc::new(HostCache::new(0)));
        Self {
            queue: TransferQueue::new(),
            ctx,
            ring: ring.map(|r| Arc::new(Mutex::new(r))),
            source,
            cache,
            store: None,
            prefetched: Arc::new(Mutex::new(HashMap::new())),
            t0,
        }
    }

    pub fn source(&self) -> &Arc<dyn WeightSource> {
        &self.source
    }

    /// Queue weight ranges of the model file, needed at `need` (the layer ordinal, see
    /// [`TransferQueue::submit_at`]).
    pub fn weights(
        &self,
        need: u64,
        reqs: Vec<OwnedReq>,
        hints: Vec<(u64, u64)>,
    ) -> Ticket<JobResult> {
        let ring = self.ring.clone();
        let ctx = self.ctx.clone();
        let source = self.source.clone();
        let t0 = self.t0;
        self.queue.submit_at(need, Priority::Weights, move || {
            let start = t0.elapsed().as_secs_f64();
            let Some(ring) = ring else {
                return Err("no staging ring".to_string());
            };
            let upload = run_batch(&ctx, &ring, source.as_ref(), &reqs)?;
            Ok(weights_done(source.as_ref(), hints, upload, start, t0))
        })
    }

    /// Queue weight ranges read straight into mappable device buffers (no staging copy): each
    /// destination is mapped once the device is done with it, filled from the file, unmapped.
    /// `after`: the submission that last reads the destinations (the job blocks on it rather
    /// than polling for the maps).
    pub fn weights_in_place(
        &self,
        need: u64,
        reqs: Vec<OwnedReq>,
        hints: Vec<(u64, u64)>,
        after: Option<wgpu::SubmissionIndex>,
    ) -> Ticket<JobResult> {
        let ctx = self.ctx.clone();
        let source = self.source.clone();
        let t0 = self.t0;
        self.queue.submit_at(need, Priority::Weights, move || {
            let start = t0.elapsed().as_secs_f64();
            let (wait_s, read_s) = fill_in_place(&ctx, source.as_ref(), &reqs, after)?;
            let upload = UploadStats {
                bytes: reqs.iter().map(|r| r.len).sum(),
                chunks: reqs.len() as u32,
                read_s,
                wait_s,
                wraps: 0,
            };
            Ok(weights_done(source.as_ref(), hints, upload, start, t0))
        })
    }

    /// Queue KV pages of (seq, layer) into stream-pool slots: (page, slot) pairs. Pages come
    /// from a prefetch, the host cache, or the page file (runs of consecutive pages in one
    /// read); pages read from flash enter the host cache under `admit`, but for those in
    /// `transient` (sorted), which are used once and left out.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_pages(
        &self,
        need: u64,
        prio: Priority,
        seq: u32,
        layer: u32,
        loads: Vec<(u32, u32)>,
        page_bytes: u64,
        pool: wgpu::Buffer,
        admit: Admit,
        transient: Vec<u32>,
    ) -> Ticket<JobResult> {
        let ring = self.ring.clone();
        let ctx = self.ctx.clone();
        let cache = self.cache.clone();
        let store = self.store.clone();
        let pre = self.prefetched.clone();
        let t0 = self.t0;
        self.queue.submit_at(need, prio, move || {
            let start = t0.elapsed().as_secs_f64();
            let (Some(ring), Some(store)) = (ring, store) else {
                return Err("KV pages streamed without a staging ring or page file".to_string());
            };
            let pb = page_bytes as usize;
            let mut host = vec![0u8; loads.len() * pb];
            let mut kv = KvFetch {
                pages: loads.len() as u64,
                ..Default::default()
            };
            let mut missing: Vec<usize> = Vec::new();
            {
                let mut pf = pre.lock().unwrap_or_else(|p| p.into_inner());
                for (i, &(page, _)) in loads.iter().enumerate() {
                    let dst = &mut host[i * pb..(i + 1) * pb];
                    if let Some(b) = pf.remove(&(layer, page))
                        && b.len() == pb
                    {
                        dst.copy_from_slice(&b);
                        kv.prefetch_hits += 1;
                        continue;
                    }
                    if cache.budget() > 0 && cache.get(kv_key(seq, layer, page), dst) {
                        kv.host_hits += 1;
                        continue;
                    }
                    missing.push(i);
                }
            }
            read_runs(&store, seq, layer, &loads, &missing, pb, &mut host, &mut kv)?;
            if cache.budget() > 0 {
                for &i in &missing {
                    let page = loads[i].0;
                    if transient.binary_search(&page).is_err() {
                        cache.insert(kv_key(seq, layer, page), &host[i * pb..(i + 1) * pb], admit);
                    }
                }
            }
            let reqs: Vec<OwnedReq> = loads
                .iter()
                .enumerate()
                .map(|(i, &(_, slot))| OwnedReq {
                    src_offset: (i * pb) as u64,
                    len: page_bytes,
                    dst: pool.clone(),
                    dst_offset: slot as u64 * page_bytes,
                })
                .collect();
            let upload = run_batch(&ctx, &ring, &host, &reqs)?;
            Ok(JobReport {
                upload,
                start,
                end: t0.elapsed().as_secs_f64(),
                kv,
            })
        })
    }

    /// Read pages of (seq, layer) into host memory ahead of need (predictive prefetch).
    pub fn prefetch_pages(
        &self,
        need: u64,
        seq: u32,
        layer: u32,
        pages: Vec<u32>,
        page_bytes: u64,
    ) -> Ticket<JobResult> {
        let cache = self.cache.clone();
        let store = self.store.clone();
        let pre = self.prefetched.clone();
        let t0 = self.t0;
        self.queue.submit_at(need, Priority::ColdKv, move || {
            let start = t0.elapsed().as_secs_f64();
            let Some(store) = store else {
                return Err("no KV page file".to_string());
            };
            let pb = page_bytes as usize;
            let loads: Vec<(u32, u32)> = pages.iter().map(|&p| (p, 0)).collect();
            let mut host = vec![0u8; loads.len() * pb];
            let mut kv = KvFetch::default();
            let mut missing = Vec::new();
            for (i, &(page, _)) in loads.iter().enumerate() {
                if cache.budget() > 0 && cache.contains(kv_key(seq, layer, page)) {
                    continue;
                }
                missing.push(i);
            }
            read_runs(&store, seq, layer, &loads, &missing, pb, &mut host, &mut kv)?;
            let mut pf = pre.lock().unwrap_or_else(|p| p.into_inner());
            // What was read ahead for this layer's previous token and not used is stale now.
            pf.retain(|&(l, _), _| l != layer);
            for &i in &missing {
                pf.insert((layer, loads[i].0), host[i * pb..(i + 1) * pb].to_vec());
            }
            Ok(JobReport {
                start,
                end: t0.elapsed().as_secs_f64(),
                kv,
                ..Default::default()
            })
        })
    }
}

/// The end of a weight job: the read ranges go back to the source (`hints`), and its report.
fn weights_done(
    source: &dyn WeightSource,
    hints: Vec<(u64, u64)>,
    upload: UploadStats,
    start: f64,
    t0: Instant,
) -> JobReport {
    for (off, len) in hints {
        source.release(off, len);
    }
    JobReport {
        upload,
        start,
        end: t0.elapsed().as_secs_f64(),
        kv: KvFetch::default(),
    }
}

/// Read the listed pages (indices into `loads`) from the page file, consecutive pages in one
/// read each.
#[allow(clippy::too_many_arguments)]
fn read_runs(
    store: &KvStore,
    seq: u32,
    layer: u32,
    loads: &[(u32, u32)],
    idx: &[usize],
    pb: usize,
    host: &mut [u8],
    kv: &mut KvFetch,
) -> Result<(), String> {
    let mut k = 0;
    while k < idx.len() {
        let mut e = k + 1;
        while e < idx.len()
            && idx[e] == idx[e - 1] + 1
            && loads[idx[e]].0 == loads[idx[e - 1]].0 + 1
        {
            e += 1;
        }
        let first = loads[idx[k]].0;
        let n = (e - k) as u32;
        let dst = &mut host[idx[k] * pb..(idx[k] + n as usize) * pb];
        store
            .read_pages(seq, layer, first, n, dst)
            .map_err(|e| e.to_string())?;
        kv.flash_pages += n as u64;
        kv.flash_bytes += n as u64 * pb as u64;
        k = e;
    }
    Ok(())
}

/// Map every destination buffer of `reqs` for writing, once each over the span its requests
/// cover (all requested at once, so their waits for the device overlap), read the source ranges
/// into them, from up to the reader's thread count at a time (a layer's tensors are short
/// reads: one after another they would leave the flash idle between them), and unmap; returns
/// (seconds waiting for the maps, seconds reading).
fn fill_in_place(
    ctx: &GpuContext,
    src: &dyn WeightSource,
    reqs: &[OwnedReq],
    after: Option<wgpu::SubmissionIndex>,
) -> Result<(f64, f64), String> {
    let mut ranges = Vec::with_capacity(reqs.len());
    for r in reqs {
        let end = r.dst_offset + r.len.div_ceil(4) * 4;
        if !r.dst_offset.is_multiple_of(8) || end > r.dst.size() {
            return Err(format!(
                "in-place upload range [{}, {end}) does not fit the {}-byte buffer",
                r.dst_offset,
                r.dst.size()
            ));
        }
        ranges.push(r.dst_offset..end);
    }
    // One map per buffer, over the span of its requests (which must not overlap).
    let mut spans: Vec<(&wgpu::Buffer, std::ops::Range<u64>)> = Vec::new();
    for (r, range) in reqs.iter().zip(&ranges) {
        match spans.iter_mut().find(|(b, _)| *b == &r.dst) {
            Some((_, span)) => {
                span.start = span.start.min(range.start);
                span.end = span.end.max(range.end);
            }
            None => spans.push((&r.dst, range.clone())),
        }
    }
    for (i, a) in ranges.iter().enumerate() {
        for (j, b) in ranges.iter().enumerate().skip(i + 1) {
            if reqs[i].dst == reqs[j].dst && a.start < b.end && b.start < a.end {
                return Err(format!(
                    "in-place upload ranges [{}, {}) and [{}, {}) of one buffer overlap",
                    a.start, a.end, b.start, b.end
                ));
            }
        }
    }
    let t = Instant::now();
    let (tx, rx) = std::sync::mpsc::channel();
    for (i, (buf, span)) in spans.iter().enumerate() {
        let tx = tx.clone();
        buf.slice(span.clone())
            .map_async(wgpu::MapMode::Write, move |res| {
                let _ = tx.send((i, res));
            });
    }
    drop(tx);
    // Callbacks run inside some thread's poll. Block until the submission that last reads
    // the destinations is done (which also runs the callbacks of maps it held back), rather
    // than polling on a timer; then poll without blocking on other work until every request
    // has answered (mapped or failed) before the buffers may be touched or unmapped.
    if let Some(idx) = after {
        ctx.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: Some(std::time::Duration::from_secs(120)),
            })
            .map_err(|e| format!("waiting for the device before filling a layer slot: {e}"))?;
    } else {
        ctx.device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| e.to_string())?;
    }
    let mut mapped = vec![false; spans.len()];
    let mut failure = None;
    let mut answered = 0;
    while answered < spans.len() {
        match rx.recv_timeout(std::time::Duration::from_micros(50)) {
            Ok((i, res)) => {
                answered += 1;
                match res {
                    Ok(()) => mapped[i] = true,
                    Err(e) => failure = Some(format!("mapping a layer slot failed: {e}")),
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                ctx.device
                    .poll(wgpu::PollType::Poll)
                    .map_err(|e| e.to_string())?;
                if t.elapsed().as_secs() > 120 {
                    return Err("mapping a layer slot timed out".to_string());
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    let waited = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let res = match failure {
        Some(e) => Err(e),
        None => read_mapped(src, reqs, &ranges),
    };
    for ((buf, _), m) in spans.iter().zip(mapped) {
        if m {
            buf.unmap();
        }
    }
    res.map(|()| (waited, t.elapsed().as_secs_f64()))
}

/// Read each request's source range into its mapped destination `ranges` (zeroing the padding
/// after it), over up to the source's reader thread count.
fn read_mapped(
    src: &dyn WeightSource,
    reqs: &[OwnedReq],
    ranges: &[std::ops::Range<u64>],
) -> Result<(), String> {
    let mut views = Vec::with_capacity(reqs.len());
    for (r, range) in reqs.iter().zip(ranges) {
        views.push(
            r.dst
                .slice(range.clone())
                .get_mapped_range_mut()
                .map_err(|e| e.to_string())?,
        );
    }
    let mut jobs: Vec<(&OwnedReq, &mut [u8])> = Vec::with_capacity(reqs.len());
    for (r, view) in reqs.iter().zip(views.iter_mut()) {
        let mut w = view.slice(..);
        let len = w.len();
        let ptr = w.as_raw_element_ptr();
        // SAFETY: `view` maps exactly `len` bytes of its own buffer range (the ranges of one
        // buffer do not overlap, checked above), held exclusively until `views` drops after
        // the reads; the memory is initialized (wgpu zero-fills buffers) and only written
        // through this slice.
        let bytes: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr(), len) };
        bytes[r.len as usize..].fill(0);
        jobs.push((r, bytes));
    }
    let threads = src
        .reader_options()
        .map_or(1, |o| o.threads)
        .clamp(1, jobs.len().max(1));
    let read = |(r, bytes): (&OwnedReq, &mut [u8])| {
        src.read_into(r.src_offset, &mut bytes[..r.len as usize])
            .map_err(|e| format!("reading {} bytes at {}: {e}", r.len, r.src_offset))
    };
    let res = if threads == 1 {
        jobs.into_iter().try_for_each(read)
    } else {
        let queue = Mutex::new(jobs.into_iter());
        let next = || queue.lock().unwrap_or_else(|p| p.into_inner()).next();
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        while let Some(j) = next() {
                            read(j)?;
                        }
                        Ok::<(), String>(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|w| {
                w.join()
                    .unwrap_or_else(|_| Err("an in-place reader thread panicked".to_string()))
            })
        })
    };
    drop(views);
    res
}

fn run_batch(
    ctx: &GpuContext,
    ring: &Mutex<StagingRing>,
    src: &(impl ChunkSource + ?Sized),
    reqs: &[OwnedReq],
) -> Result<UploadStats, String> {
    let borrowed: Vec<UploadReq<'_>> = reqs
        .iter()
        .map(|r| UploadReq {
            src_offset: r.src_offset,
            len: r.len,
            dst: &r.dst,
            dst_offset: r.dst_offset,
        })
        .collect();
    let mut ring = ring.lock().unwrap_or_else(|p| p.into_inner());
    ring.upload_batch(ctx, src, &borrowed)
        .map_err(|e: StagingError| e.to_string())
}
