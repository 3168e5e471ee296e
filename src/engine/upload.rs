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
use crate::flash::{Admit, AlignedPool, CacheKey, ChunkSource, HostCache, WeightSource};
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
    /// Seconds from the tracer's start when the engine queued the job, and when the job began
    /// and ended.
    pub queued: f64,
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
    /// Host buffers a KV job gathers its pages in, reused (page-aligned, so that direct reads
    /// of whole records land in them without a bounce copy; the I/O thread runs one job at a
    /// time).
    kv_bufs: AlignedPool,
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
            kv_bufs: AlignedPool::new(2),
            t0,
        }
    }

    pub fn source(&self) -> &Arc<dyn WeightSource> {
        &self.source
    }

    /// Queue `job` for the I/O thread; its report carries the time it was queued.
    fn submit(
        &self,
        need: u64,
        prio: Priority,
        job: impl FnOnce() -> JobResult + Send + 'static,
    ) -> Ticket<JobResult> {
        let queued = self.t0.elapsed().as_secs_f64();
        self.queue
            .submit_at(need, prio, move || job().map(|r| JobReport { queued, ..r }))
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
        self.submit(need, Priority::Weights, move || {
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
        self.submit(need, Priority::Weights, move || {
            let start = t0.elapsed().as_secs_f64();
            let (wait_s, read_s) = super::inplace::fill(&ctx, source.as_ref(), &reqs, after)?;
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
        let bufs = self.kv_bufs.clone();
        let t0 = self.t0;
        self.submit(need, prio, move || {
            let start = t0.elapsed().as_secs_f64();
            let (Some(ring), Some(store)) = (ring, store) else {
                return Err("KV pages streamed without a staging ring or page file".to_string());
            };
            let pb = page_bytes as usize;
            let len = loads.len() * pb;
            let mut buf = bufs
                .take(len)
                .map_err(|e| format!("allocating a host buffer for KV pages: {e}"))?;
            // Every byte of the job's part is written below (a page from the prefetch, the
            // host cache or the file) before it is read.
            let host = &mut buf.as_mut_slice()[..len];
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
            read_runs(&store, seq, layer, &loads, &missing, pb, host, &mut kv)?;
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
            let upload = run_batch(&ctx, &ring, &*host, &reqs)?;
            Ok(JobReport {
                upload,
                start,
                end: t0.elapsed().as_secs_f64(),
                kv,
                ..Default::default()
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
        let bufs = self.kv_bufs.clone();
        let t0 = self.t0;
        self.submit(need, Priority::ColdKv, move || {
            let start = t0.elapsed().as_secs_f64();
            let Some(store) = store else {
                return Err("no KV page file".to_string());
            };
            let pb = page_bytes as usize;
            let loads: Vec<(u32, u32)> = pages.iter().map(|&p| (p, 0)).collect();
            let len = loads.len() * pb;
            let mut buf = bufs
                .take(len)
                .map_err(|e| format!("allocating a host buffer for KV pages: {e}"))?;
            // Only the pages read below are kept.
            let host = &mut buf.as_mut_slice()[..len];
            let mut kv = KvFetch::default();
            let mut missing = Vec::new();
            for (i, &(page, _)) in loads.iter().enumerate() {
                if cache.budget() > 0 && cache.contains(kv_key(seq, layer, page)) {
                    continue;
                }
                missing.push(i);
            }
            read_runs(&store, seq, layer, &loads, &missing, pb, host, &mut kv)?;
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
        ..Default::default()
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
