//! `bench s3`: the paper's "7B in little memory" — a 7B-shaped synthetic model (32 layers, d 4096,
//! FFN 11008, 32/8 heads, Q4_K) under `--gpu-budget 512MiB --dram-budget 1GiB --io direct`.
//!
//! Each run is a separate process (`flashlm run`), so its peak resident memory (VmHWM) is its
//! own: on a device whose memory is host memory (lavapipe, integrated GPUs) it includes the
//! device allocations, so the bound checked is GPU budget + DRAM budget + a fixed overhead
//! (the program, the driver, compiled pipelines, I/O buffers).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::median;
use crate::flash::{FlashFile, IoMode, ReaderOptions};
use crate::gguf::GgmlType;
use crate::model::synthetic::{SyntheticSpec, write_synthetic_file};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Memory a run uses besides its two budgets (program, driver, pipelines, I/O buffers, the
/// tokenizer and metadata), as measured on the development VM with margin.
pub const FIXED_OVERHEAD: u64 = 384 << 20;

/// The 7B shape.
pub fn spec_7b() -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 32,
        n_embd: 4096,
        n_heads: 32,
        n_kv_heads: 8,
        n_ff: 11008,
        vocab: 32000,
        weight_type: GgmlType::Q4_K,
        ctx: 4096,
        untied_output: true,
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct S3Report {
    pub model_bytes: u64,
    pub gpu_budget: u64,
    pub dram_budget: u64,
    pub runs: usize,
    pub tokens: usize,
    pub ms_per_token: f64,
    pub flash_bytes_per_token: f64,
    pub direct_read_gb_s: f64,
    /// ms/token over the time the flash bytes take at the direct-read rate.
    pub over_io_bound: f64,
    pub peak_device_bytes: u64,
    pub peak_rss_bytes: u64,
    pub rss_bound: u64,
    pub placement: String,
    /// Median time to first token of the runs, and the performance model's ms/token and TTFT
    /// each run printed (medians; None when this machine is not calibrated).
    pub ttft_ms: f64,
    pub predicted_ms_per_token: Option<f64>,
    pub predicted_ttft_ms: Option<f64>,
}

/// Write the 7B-shaped model to `path` unless a file of the right size is there.
pub fn ensure_model(path: &Path, spec: &SyntheticSpec) -> BenchResult<u64> {
    let size = crate::model::synthetic::synthetic_file_size(spec)?;
    if std::fs::metadata(path).map(|m| m.len()).ok() == Some(size) {
        return Ok(size);
    }
    eprintln!("writing {} ({} bytes)...", path.display(), size);
    let mut last = 0u64;
    write_synthetic_file(spec, 7, 2, path, &mut |done, total| {
        if done - last > total / 20 {
            last = done;
            eprintln!("  {:.0}%", done as f64 * 100.0 / total as f64);
        }
    })?;
    Ok(size)
}

/// Direct-I/O read rate of `path` from a cold page cache (4 threads, 1 MiB pieces), over up to
/// `bytes`.
pub fn direct_read_gb_s(path: &Path, bytes: u64) -> BenchResult<f64> {
    crate::flash::evict_page_cache(path)?;
    let f = FlashFile::open(path, ReaderOptions::default())?;
    let n = bytes.min(f.len());
    let mut buf = vec![0u8; 64 << 20];
    let t = std::time::Instant::now();
    let mut off = 0;
    while off < n {
        let k = (n - off).min(buf.len() as u64) as usize;
        f.read_into(off, &mut buf[..k])?;
        off += k as u64;
    }
    Ok(n as f64 / t.elapsed().as_secs_f64() / 1e9)
}

/// Run `flashlm run` on `model` in a child process and return its stats JSON.
pub fn run_child(
    model: &Path,
    gpu: u64,
    dram: u64,
    io: IoMode,
    tokens: usize,
) -> BenchResult<serde_json::Value> {
    super::run_child("S3", |c| {
        c.args(["--temp", "0", "-p", "The history of the world is"])
            .arg("-n")
            .arg(tokens.to_string())
            .arg("-m")
            .arg(model)
            .arg("--gpu-budget")
            .arg(gpu.to_string())
            .arg("--dram-budget")
            .arg(dram.to_string())
            .arg("--io")
            .arg(io.to_string());
    })
}

pub fn run(path: Option<PathBuf>, runs: usize, tokens: usize) -> BenchResult<S3Report> {
    let spec = spec_7b();
    let path = path.unwrap_or_else(|| crate::paths::cache_dir().join("synth-7b-q4k.gguf"));
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d)?;
    }
    let size = ensure_model(&path, &spec)?;
    let (gpu, dram) = (512u64 << 20, 1u64 << 30);
    let mut ms = Vec::new();
    let mut bytes = Vec::new();
    let mut rates = Vec::new();
    let mut peak_dev = 0u64;
    let mut peak_rss = 0u64;
    let mut placement = String::new();
    let (mut ttft, mut pred, mut pred_ttft) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..runs.max(1) {
        rates.push(direct_read_gb_s(&path, 2 << 30)?);
        crate::flash::evict_page_cache(&path)?;
        let v = run_child(&path, gpu, dram, IoMode::Direct, tokens)?;
        let m = v["ms_per_token"].as_f64().unwrap_or(0.0);
        let b = v["flash_bytes_per_token"].as_f64().unwrap_or(0.0);
        let p = v["predicted"]["ms_per_token"].as_f64();
        eprintln!(
            "S3 run {}: {m:.0} ms/token{}, {b:.0} flash bytes/token",
            r + 1,
            p.map(|p| format!(" (predicted {p:.0})"))
                .unwrap_or_default()
        );
        // The run's own TTFT (prefill and first token, as the prediction counts it).
        if let Some(t) = v["stats"]["ttft_ms"].as_f64() {
            ttft.push(t);
        }
        pred.extend(p);
        pred_ttft.extend(v["predicted"]["ttft_ms"].as_f64());
        ms.push(m);
        bytes.push(b);
        peak_dev = peak_dev.max(v["peak_device_bytes"].as_u64().unwrap_or(0));
        peak_rss = peak_rss.max(v["peak_rss_bytes"].as_u64().unwrap_or(0));
        placement = v["placement"].as_str().unwrap_or("").to_string();
    }
    let ms = median(&mut ms);
    let b = median(&mut bytes);
    let rate = median(&mut rates);
    Ok(S3Report {
        model_bytes: size,
        gpu_budget: gpu,
        dram_budget: dram,
        runs: runs.max(1),
        tokens,
        ms_per_token: ms,
        flash_bytes_per_token: b,
        direct_read_gb_s: rate,
        over_io_bound: ms / (b / (rate * 1e9) * 1e3).max(1e-9),
        peak_device_bytes: peak_dev,
        peak_rss_bytes: peak_rss,
        rss_bound: gpu + dram + FIXED_OVERHEAD,
        placement,
        ttft_ms: median(&mut ttft),
        predicted_ms_per_token: (!pred.is_empty()).then(|| median(&mut pred)),
        predicted_ttft_ms: (!pred_ttft.is_empty()).then(|| median(&mut pred_ttft)),
    })
}

impl S3Report {
    pub fn to_markdown(&self) -> String {
        let mib = |b: u64| format!("{:.0} MiB", b as f64 / 1048576.0);
        format!(
            "7B-shaped synthetic model (32 layers, d 4096, FFN 11008, 32/8 heads, vocab 32000, Q4_K): {:.2} GB; \
             `--gpu-budget {} --dram-budget {} --io direct`; {} runs of {} tokens (median).\n\n\
             | figure | value |\n|---|---|\n\
             | placement | {} |\n\
             | ms/token | {:.0} |\n\
             | ms/token predicted (performance model, same runs) | {} |\n\
             | time to first token, ms: measured / predicted | {:.0} / {} |\n\
             | flash bytes/token | {:.0} |\n\
             | direct read rate (cold, same runs) | {:.2} GB/s |\n\
             | ms/token over the I/O bound (bytes/token ÷ direct rate) | {:.2} |\n\
             | peak device bytes (budget {}) | {} |\n\
             | peak resident memory of the process | {} |\n\
             | bound: GPU budget + DRAM budget + fixed overhead {} | {} ({}) |\n",
            self.model_bytes as f64 / 1e9,
            mib(self.gpu_budget),
            mib(self.dram_budget),
            self.runs,
            self.tokens,
            self.placement,
            self.ms_per_token,
            match self.predicted_ms_per_token {
                Some(p) => format!(
                    "{p:.0} ({:+.0}%)",
                    (p / self.ms_per_token.max(1e-9) - 1.0) * 100.0
                ),
                None => "not calibrated (`flashlm calibrate`)".into(),
            },
            self.ttft_ms,
            self.predicted_ttft_ms
                .map_or("not calibrated".into(), |p| format!("{p:.0}")),
            self.flash_bytes_per_token,
            self.direct_read_gb_s,
            self.over_io_bound,
            mib(self.gpu_budget),
            mib(self.peak_device_bytes),
            mib(self.peak_rss_bytes),
            mib(FIXED_OVERHEAD),
            mib(self.rss_bound),
            if self.peak_rss_bytes <= self.rss_bound {
                "held"
            } else {
                "EXCEEDED"
            }
        )
    }
}
