//! Timing of the per-token schedule: spans for flash reads, uploads, GPU compute and waits,
//! written as Chrome trace-event JSON (opens in Perfetto or chrome://tracing).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Trace rows: host I/O and GPU compute.
pub const TID_IO: u32 = 1;
pub const TID_GPU: u32 = 2;
pub const TID_HOST: u32 = 3;
pub const TID_KERNEL: u32 = 4;

#[derive(Debug, Clone)]
struct Span {
    name: String,
    cat: &'static str,
    tid: u32,
    start: f64,
    end: f64,
}

/// Collects spans (always timed; kept only when a trace file was asked for).
pub struct Tracer {
    t0: Instant,
    keep: bool,
    spans: Vec<Span>,
    /// Completion times of GPU work, filled by queue callbacks: (name, submitted at, done at).
    gpu_done: Arc<Mutex<Vec<(String, f64, f64)>>>,
    last_gpu_end: f64,
    /// Seconds of GPU compute collected so far.
    pub compute_s: f64,
    /// GPU time per submission name (digits dropped): calls and seconds (host timing).
    pub by_name: std::collections::BTreeMap<String, (u64, f64)>,
}

impl Tracer {
    pub fn new(keep: bool) -> Self {
        Self {
            t0: Instant::now(),
            keep,
            spans: Vec::new(),
            gpu_done: Arc::new(Mutex::new(Vec::new())),
            last_gpu_end: 0.0,
            compute_s: 0.0,
            by_name: Default::default(),
        }
    }

    /// Forget the spans and totals so far, keeping the time origin.
    pub fn clear(&mut self) {
        self.spans.clear();
        if let Ok(mut g) = self.gpu_done.lock() {
            g.clear();
        }
        self.last_gpu_end = 0.0;
        self.compute_s = 0.0;
        self.by_name.clear();
    }

    /// Whether spans are kept for a trace file.
    pub fn keeps(&self) -> bool {
        self.keep
    }

    /// Seconds since the tracer started.
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    pub fn span(&mut self, name: impl Into<String>, cat: &'static str, tid: u32, start: f64) {
        let end = self.now();
        if self.keep {
            self.spans.push(Span {
                name: name.into(),
                cat,
                tid,
                start,
                end,
            });
        }
    }

    /// Keep a span measured elsewhere (the I/O thread), in seconds since the tracer's start.
    pub fn span_at(
        &mut self,
        name: impl Into<String>,
        cat: &'static str,
        tid: u32,
        start: f64,
        end: f64,
    ) {
        if self.keep {
            self.spans.push(Span {
                name: name.into(),
                cat,
                tid,
                start,
                end,
            });
        }
    }

    /// Start of the first GPU span kept, in seconds.
    pub fn first_gpu_start(&self) -> Option<f64> {
        self.spans
            .iter()
            .filter(|s| s.tid == TID_GPU)
            .map(|s| s.start)
            .reduce(f64::min)
    }

    /// The instant times are measured from.
    pub fn origin(&self) -> Instant {
        self.t0
    }

    /// Note a submission of GPU work; its span ends when the queue reports it done.
    pub fn gpu_submitted(&mut self, queue: &wgpu::Queue, name: impl Into<String>) {
        let submitted = self.now();
        let t0 = self.t0;
        let done = self.gpu_done.clone();
        let name = name.into();
        queue.on_submitted_work_done(move || {
            let end = t0.elapsed().as_secs_f64();
            if let Ok(mut d) = done.lock() {
                d.push((name, submitted, end));
            }
        });
    }

    /// Fold finished GPU work into compute time (and spans). A piece of work starts when it was
    /// submitted or when the previous one ended, whichever is later.
    pub fn collect_gpu(&mut self) {
        let done: Vec<_> = match self.gpu_done.lock() {
            Ok(mut d) => d.drain(..).collect(),
            Err(_) => return,
        };
        for (name, submitted, end) in done {
            let start = submitted.max(self.last_gpu_end).min(end);
            self.compute_s += end - start;
            self.last_gpu_end = end;
            let key: String = name.chars().filter(|c| !c.is_ascii_digit()).collect();
            let e = self.by_name.entry(key).or_default();
            e.0 += 1;
            e.1 += end - start;
            if self.keep {
                self.spans.push(Span {
                    name,
                    cat: "compute",
                    tid: TID_GPU,
                    start,
                    end,
                });
            }
        }
    }

    /// Write the spans as Chrome trace-event JSON.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut events = vec![
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": TID_IO, "args": {"name": "flash read + upload"}}),
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": TID_GPU, "args": {"name": "GPU compute"}}),
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": TID_HOST, "args": {"name": "host"}}),
            serde_json::json!({"name": "thread_name", "ph": "M", "pid": 1, "tid": TID_KERNEL, "args": {"name": "GPU kernels (timestamp queries; clock aligned at the first kernel)"}}),
        ];
        for s in &self.spans {
            events.push(serde_json::json!({
                "name": s.name,
                "cat": s.cat,
                "ph": "X",
                "pid": 1,
                "tid": s.tid,
                "ts": s.start * 1e6,
                "dur": ((s.end - s.start) * 1e6).max(0.0),
            }));
        }
        let doc = serde_json::json!({ "traceEvents": events, "displayTimeUnit": "ms" });
        std::fs::write(path, serde_json::to_string(&doc)?)
    }
}
