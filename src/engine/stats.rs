//! Generation and its figures: time per token, bytes per token from flash (weights and KV
//! pages), KV pages written, page-cache hit rates, overlap.

use std::time::Instant;

use super::upload::KvFetch;
use super::{Engine, EngineError};
use crate::gpu::staging::UploadStats;
use crate::sampling::Sampler;

/// I/O figures accumulated by the engine.
#[derive(Debug, Clone, Copy, Default)]
pub struct IoTotals {
    pub upload: UploadStats,
    /// Seconds the I/O thread spent in jobs (reads, waits for free staging, submits).
    pub upload_s: f64,
    /// Seconds the engine thread waited for jobs.
    pub wait_s: f64,
    /// Bytes read from the model file for embedding rows.
    pub embd_bytes: u64,
}

/// KV cache figures accumulated by the engine.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct KvRunStats {
    pub fetch: KvFetch,
    /// Page selection: pages kept again from the previous token, pages kept, selections made.
    pub reuse_hits: u64,
    pub reuse_total: u64,
    pub selected_pages: u64,
    pub candidate_pages: u64,
    pub selections: u64,
    /// Selections that waited for their own page scores (all of plain quest's; a lagged
    /// selection's only without the previous token's scores).
    pub score_waits: u64,
}

/// Figures of one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    /// Decode milliseconds per token.
    pub ms_per_token: f64,
    /// Bytes read from the model file per generated token (after load).
    pub flash_bytes_per_token: f64,
    /// KV bytes the attention needed from off the device per token, and of those read from
    /// flash (the rest came from the host cache or a prefetch).
    pub kv_bytes_per_token: f64,
    pub kv_flash_bytes_per_token: f64,
    /// KV pages brought to the device per token.
    pub kv_pages_per_token: f64,
    /// Share of KV pages served by the host cache.
    pub kv_hit_rate: f64,
    /// Share of selected pages that a predictive prefetch had already read.
    pub prefetch_hit_rate: f64,
    /// Share of selected pages that the previous token had selected too.
    pub selection_reuse: f64,
    /// KV pages and bytes written to the page file per generated token, and in all.
    pub kv_bytes_written_per_token: f64,
    pub kv_pages_written: u64,
    pub kv_bytes_written: u64,
    /// Bytes moved through the staging ring per generated token.
    pub upload_bytes_per_token: f64,
    /// Staging-ring throughput during decode (bytes uploaded / seconds in upload jobs).
    pub upload_gb_s: f64,
    /// The same without the time spent waiting for the GPU to free a staging slot: the
    /// flash-to-GPU path's own rate.
    pub flash_to_gpu_gb_s: f64,
    /// Share of decode time the GPU was not computing (waiting for I/O or the host).
    pub io_wait_share: f64,
    /// Decode time / max(I/O time, GPU compute time); 1.0 is perfect overlap. I/O time is the
    /// I/O thread's time on the flash-to-GPU path (waits for a free staging slot excluded).
    pub overlap_efficiency: f64,
    pub io_s: f64,
    /// Of `io_s`, the time inside file reads.
    pub read_s: f64,
    pub compute_s: f64,
    pub peak_device_bytes: u64,
    /// Milliseconds of each decode step.
    #[serde(skip)]
    pub token_ms: Vec<f64>,
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

impl Engine {
    /// Generate up to `n` tokens after `prompt` (appended to what is cached). `on_token` gets
    /// each new id and returns false to stop; generation also stops at `is_end`.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        sampler: &mut Sampler,
        is_end: impl Fn(u32) -> bool,
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<(Vec<u32>, GenStats), EngineError> {
        let start = Instant::now();
        let mut history: Vec<u32> = self.seqs[0].tokens.clone();
        history.extend_from_slice(prompt);
        let mut logits = self.forward(prompt)?;
        let prefill_s = start.elapsed().as_secs_f64();
        let flash0 = self.io_.source().bytes_read();
        let io0 = self.io;
        let kv0 = self.kv_stats;
        let st0 = self.io_.store.as_ref().map(|s| s.stats());
        let compute0 = self.tracer.compute_s;
        let mut out = Vec::new();
        let mut ttft_ms = 0.0;
        let decode_start = Instant::now();
        let mut decode_forwards = 0usize;
        let mut token_ms = Vec::new();
        while out.len() < n {
            let id = sampler.sample(&logits, &history);
            if out.is_empty() {
                ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            out.push(id);
            history.push(id);
            let go_on = on_token(id);
            if !go_on || is_end(id) || out.len() >= n {
                break;
            }
            let t = Instant::now();
            logits = self.forward(&[id])?;
            token_ms.push(t.elapsed().as_secs_f64() * 1e3);
            decode_forwards += 1;
        }
        let decode_s = decode_start.elapsed().as_secs_f64();
        self.tracer.collect_gpu();
        let read_s = self.io.upload.read_s - io0.upload.read_s;
        let up_bytes = self.io.upload.bytes - io0.upload.bytes;
        let up_s = self.io.upload_s - io0.upload_s;
        let slot_wait_s = self.io.upload.wait_s - io0.upload.wait_s;
        let compute_s = self.tracer.compute_s - compute0;
        let per = decode_forwards.max(1) as f64;
        let kv = self.kv_stats;
        let f = |a: u64, b: u64| (a - b) as f64;
        let pages = f(kv.fetch.pages, kv0.fetch.pages);
        let pb = self.plan.kv.page_bytes as f64;
        let (pw, bw) = match (self.io_.store.as_ref().map(|s| s.stats()), st0) {
            (Some(now), Some(then)) => (
                now.pages_written - then.pages_written,
                now.bytes_written - then.bytes_written,
            ),
            _ => (0, 0),
        };
        let io_s = (up_s - slot_wait_s).max(0.0);
        let stats = GenStats {
            prompt_tokens: prompt.len(),
            generated_tokens: out.len(),
            prefill_s,
            decode_s,
            ttft_ms,
            prefill_tok_s: ratio(prompt.len() as f64, prefill_s),
            decode_tok_s: ratio(decode_forwards as f64, decode_s),
            ms_per_token: decode_s * 1e3 / per,
            flash_bytes_per_token: (self.io_.source().bytes_read() - flash0) as f64 / per
                + f(kv.fetch.flash_bytes, kv0.fetch.flash_bytes) / per,
            kv_bytes_per_token: pages * pb / per,
            kv_flash_bytes_per_token: f(kv.fetch.flash_bytes, kv0.fetch.flash_bytes) / per,
            kv_pages_per_token: pages / per,
            kv_hit_rate: ratio(f(kv.fetch.host_hits, kv0.fetch.host_hits), pages),
            prefetch_hit_rate: ratio(
                f(kv.fetch.prefetch_hits, kv0.fetch.prefetch_hits),
                f(kv.selected_pages, kv0.selected_pages),
            ),
            selection_reuse: ratio(
                f(kv.reuse_hits, kv0.reuse_hits),
                f(kv.reuse_total, kv0.reuse_total),
            ),
            kv_bytes_written_per_token: bw as f64 / per,
            kv_pages_written: pw,
            kv_bytes_written: bw,
            upload_bytes_per_token: up_bytes as f64 / per,
            upload_gb_s: ratio(up_bytes as f64, up_s) / 1e9,
            flash_to_gpu_gb_s: ratio(up_bytes as f64, io_s) / 1e9,
            io_wait_share: if decode_s > 0.0 {
                (1.0 - compute_s / decode_s).clamp(0.0, 1.0)
            } else {
                0.0
            },
            overlap_efficiency: if decode_forwards > 0 {
                decode_s / io_s.max(compute_s).max(1e-9)
            } else {
                0.0
            },
            io_s,
            read_s,
            compute_s,
            peak_device_bytes: self.ctx.budget.peak(),
            token_ms,
        };
        Ok((out, stats))
    }
}

impl Engine {
    /// The page hit-rate model's prediction for this engine's configuration at its current
    /// context, with the selection reuse measured in `stats` (see [`crate::plan::hitrate`]).
    pub fn kv_prediction(&self, stats: &GenStats) -> crate::plan::hitrate::KvPrediction {
        crate::plan::perf::kv_prediction(
            &self.plan,
            self.n_past(),
            self.io_.cache.budget(),
            stats.selection_reuse,
        )
    }
}

/// One kernel's line of the profile.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileRow {
    pub kernel: String,
    pub calls: u64,
    pub total_ms: f64,
    /// GB/s of the weight bytes the kernel read (None when it reads no weights).
    pub gb_s: Option<f64>,
}

/// Where the time went, per kernel (`--profile`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileReport {
    /// "gpu timestamps", or "host timing of submissions" on adapters without timestamps.
    pub source: &'static str,
    pub rows: Vec<ProfileRow>,
    pub total_ms: f64,
    /// Dispatches recorded without timestamps (the query set was full).
    pub untimed: u64,
}

impl ProfileReport {
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "profile ({}): | kernel | calls | total ms | share | GB/s of weights |\n",
            self.source
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {:.2} | {:.1}% | {} |\n",
                r.kernel,
                r.calls,
                r.total_ms,
                100.0 * r.total_ms / self.total_ms.max(1e-12),
                r.gb_s
                    .map(|g| format!("{g:.3}"))
                    .unwrap_or_else(|| "-".into())
            ));
        }
        s.push_str(&format!("| all | | {:.2} | 100% | |\n", self.total_ms));
        if self.untimed > 0 {
            s.push_str(&format!("({} dispatches were not timed)\n", self.untimed));
        }
        s
    }
}

impl Engine {
    /// Per-kernel time since load (after the warm-up): GPU timestamps where the adapter has
    /// them, else the host's timing of whole submissions.
    pub fn profile_report(&mut self) -> ProfileReport {
        self.tracer.collect_gpu();
        if let Some(p) = &self.profiler {
            let mut rows: Vec<ProfileRow> = p
                .totals
                .iter()
                .map(|(k, t)| ProfileRow {
                    kernel: k.to_string(),
                    calls: t.calls,
                    total_ms: t.ns / 1e6,
                    gb_s: (t.bytes > 0 && t.ns > 0.0).then(|| t.bytes as f64 / t.ns),
                })
                .collect();
            rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
            return ProfileReport {
                source: "gpu timestamps",
                total_ms: p.total_s() * 1e3,
                rows,
                untimed: p.missed,
            };
        }
        let mut rows: Vec<ProfileRow> = self
            .tracer
            .by_name
            .iter()
            .map(|(k, (n, s))| ProfileRow {
                kernel: k.clone(),
                calls: *n,
                total_ms: s * 1e3,
                gb_s: None,
            })
            .collect();
        rows.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms));
        ProfileReport {
            source: "host timing of submissions",
            total_ms: rows.iter().map(|r| r.total_ms).sum(),
            rows,
            untimed: 0,
        }
    }
}
