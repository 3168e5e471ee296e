//! Scenario S3 on a smaller shape: a Q4_K llama of about 220 MB streams under a device budget
//! and a host cache far below its size; the device budget holds and the process's peak resident
//! memory stays within the two budgets plus the documented fixed overhead
//! (`flashlm::bench::s3::FIXED_OVERHEAD`; on lavapipe device memory is host memory, so it counts).
mod common;

use std::path::PathBuf;
use std::process::Command;

use flashlm::bench::s3::FIXED_OVERHEAD;

#[test]
fn small_s3_holds_the_budgets() {
    if common::gpu().is_none() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("s3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("s3-small.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
        .args(
            "synth --layers 8 --dim 2048 --ffn 5632 --heads 16 --kv-heads 4 --vocab 16000 \
             --type Q4_K --seed 5 --threads 2 -o"
                .split_whitespace(),
        )
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let size = std::fs::metadata(&model).unwrap().len();
    assert!(size > 150_000_000, "{size}");
    let (gpu, dram) = (96u64 << 20, 64u64 << 20);
    // The run is a child of this test: use the built binary, not this test executable.
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_flashlm"));
    let v = run_with(&exe, &model, gpu, dram);
    let peak_dev = v["peak_device_bytes"].as_u64().unwrap();
    let rss = v["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak_dev <= gpu,
        "device peak {peak_dev} over the budget {gpu}"
    );
    assert!(
        rss <= gpu + dram + FIXED_OVERHEAD,
        "peak RSS {} MiB over {} + {} + {} MiB",
        rss >> 20,
        gpu >> 20,
        dram >> 20,
        FIXED_OVERHEAD >> 20
    );
    // Streaming: most of the model crosses per token.
    assert!(v["flash_bytes_per_token"].as_f64().unwrap() > 0.3 * size as f64);
    assert!(v["generated_ids"].as_array().unwrap().len() == 3);
    let _ = std::fs::remove_dir_all(&dir);
}

fn run_with(
    exe: &std::path::Path,
    model: &std::path::Path,
    gpu: u64,
    dram: u64,
) -> serde_json::Value {
    let stats = model.with_extension("json");
    let out = Command::new(exe)
        .args([
            "run",
            "--temp",
            "0",
            "-p",
            "The history of the world is",
            "-n",
            "3",
        ])
        .arg("-m")
        .arg(model)
        .arg("--gpu-budget")
        .arg(gpu.to_string())
        .arg("--dram-budget")
        .arg(dram.to_string())
        .args(["--io", "direct", "--stats-json"])
        .arg(&stats)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap()
}
