//! Per-kernel GPU time from timestamp queries (`--profile`).
//!
//! Each profiled dispatch writes a timestamp before and after itself inside its compute pass;
//! at the end of a forward pass the queries are resolved, read back and summed per kernel label.
//! Adapters without timestamp queries inside passes get no profiler (the caller falls back to
//! host timing of whole submissions and says so).

use std::collections::BTreeMap;

use super::{GpuBuffer, GpuContext, GpuError};

/// Timestamps one forward pass can hold (two per dispatch), in sets of [`SET_QUERIES`].
pub const PROFILE_QUERIES: u32 = 16384;
/// Queries per query set (the most wgpu allows).
const SET_QUERIES: u32 = 4096;

/// Device bytes the profiler allocates (resolve and read-back buffers).
pub const PROFILE_BYTES: u64 = 2 * PROFILE_QUERIES as u64 * 8;

/// Totals of one kernel label.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct KernelTotals {
    pub calls: u64,
    pub ns: f64,
    /// Bytes the dispatches read from weights (0 when not known).
    pub bytes: u64,
}

/// Timestamp queries around dispatches.
pub struct Profiler {
    sets: Vec<wgpu::QuerySet>,
    resolve: GpuBuffer,
    readback: GpuBuffer,
    period_ns: f64,
    next: u32,
    pending: Vec<(&'static str, u64)>,
    /// Dispatches that found no free query (counted, not timed).
    pub missed: u64,
    pub totals: BTreeMap<&'static str, KernelTotals>,
    /// (label, start, end) in ns of the GPU clock, kept when spans are wanted.
    pub spans: Vec<(&'static str, f64, f64)>,
    pub keep_spans: bool,
}

impl Profiler {
    /// A profiler, or None when the device has no timestamp queries inside passes.
    pub fn new(ctx: &GpuContext) -> Result<Option<Self>, GpuError> {
        if !ctx.timestamps {
            return Ok(None);
        }
        let sets = (0..PROFILE_QUERIES / SET_QUERIES)
            .map(|_| {
                ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: SET_QUERIES,
                })
            })
            .collect();
        let bytes = PROFILE_QUERIES as u64 * 8;
        let resolve = ctx.buffer(
            "profile resolve",
            bytes,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        )?;
        let readback = ctx.buffer(
            "profile readback",
            bytes,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        )?;
        Ok(Some(Self {
            sets,
            resolve,
            readback,
            period_ns: ctx.queue.get_timestamp_period() as f64,
            next: 0,
            pending: Vec::new(),
            missed: 0,
            totals: BTreeMap::new(),
            spans: Vec::new(),
            keep_spans: false,
        }))
    }

    /// Reserve the two queries of a dispatch labelled `label` that reads `bytes` of weights;
    /// returns the first query index, or None when the set is full.
    pub fn reserve(&mut self, label: &'static str, bytes: u64) -> Option<(&wgpu::QuerySet, u32)> {
        if self.next + 2 > PROFILE_QUERIES {
            self.missed += 1;
            return None;
        }
        let i = self.next;
        self.next += 2;
        self.pending.push((label, bytes));
        Some((&self.sets[(i / SET_QUERIES) as usize], i % SET_QUERIES))
    }

    /// Resolve and read back the queries written since the last collection (waits for the GPU).
    pub fn collect(&mut self, ctx: &GpuContext) -> Result<(), GpuError> {
        if self.next == 0 {
            return Ok(());
        }
        let n = self.next;
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        for (k, set) in self.sets.iter().enumerate() {
            let first = k as u32 * SET_QUERIES;
            if first >= n {
                break;
            }
            let count = (n - first).min(SET_QUERIES);
            enc.resolve_query_set(set, 0..count, &self.resolve, first as u64 * 8);
        }
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, n as u64 * 8);
        ctx.queue.submit([enc.finish()]);
        let raw = ctx.read_mapped(&self.readback, n as u64 * 8)?;
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&raw);
        for (k, (label, bytes)) in self.pending.drain(..).enumerate() {
            let (a, b) = (ticks[2 * k], ticks[2 * k + 1]);
            let ns = b.saturating_sub(a) as f64 * self.period_ns;
            let t = self.totals.entry(label).or_default();
            t.calls += 1;
            t.ns += ns;
            t.bytes += bytes;
            if self.keep_spans {
                self.spans
                    .push((label, a as f64 * self.period_ns, b as f64 * self.period_ns));
            }
        }
        self.next = 0;
        Ok(())
    }

    /// Forget the totals (after a warm-up).
    pub fn clear(&mut self) {
        self.totals.clear();
        self.spans.clear();
        self.missed = 0;
    }

    /// Sum of all kernel time, in seconds.
    pub fn total_s(&self) -> f64 {
        self.totals.values().map(|t| t.ns).sum::<f64>() / 1e9
    }
}
