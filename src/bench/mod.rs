//! Benchmarks behind `flashlm bench` (and `cargo bench`). Each reports medians of several runs
//! measured side by side in one process.

pub mod batch;
pub mod calibrate;
pub mod io;
pub mod kv;
pub mod layouts;
pub mod ppl;
pub mod probe;
mod resident;
pub mod s3;
mod stream;
pub mod summary;
pub mod threads;
pub mod types;

pub use resident::{ResidentReport, resident};
pub use stream::{Scenario, StreamReport, StreamRow, stream};

/// A fixed English passage used as the benchmark prompt.
pub const BENCH_TEXT: &str = "The history of computing is a story of ever smaller machines doing ever larger \
amounts of work. Early computers filled whole rooms, consumed enormous amounts of power and were \
programmed by rewiring panels by hand. The invention of the transistor, and later of the integrated \
circuit, changed everything: memory became cheap, processors became fast, and storage moved from \
punched cards to magnetic disks and finally to flash. Today a laptop carries more memory than all";

pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Evict the model file from the page cache, then read it once sequentially: GB/s.
pub fn raw_cold_read(path: &std::path::Path) -> Result<(f64, bool), Box<dyn std::error::Error>> {
    use std::io::Read;
    let res = crate::flash::evict_page_cache(path)?;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    let t = std::time::Instant::now();
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let s = t.elapsed().as_secs_f64();
    Ok((total as f64 / s / 1e9, res.effective()))
}

/// Run `flashlm run` in a child process (this executable) with the arguments and environment
/// `configure` adds, and return the stats JSON it wrote (`--stats-json`). `what` names the run
/// in the error when it fails.
pub(crate) fn run_child(
    what: &str,
    configure: impl FnOnce(&mut std::process::Command),
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("flashlm-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let stats = dir.join("stats.json");
    let mut c = std::process::Command::new(std::env::current_exe()?);
    c.arg("run");
    configure(&mut c);
    let out = c.arg("--stats-json").arg(&stats).output()?;
    if !out.status.success() {
        return Err(format!(
            "flashlm run ({what}) failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats)?)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(v)
}
