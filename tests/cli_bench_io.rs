//! `flashlm bench io` runs end to end on a small range and writes its table, JSON and plot.
mod common;

use std::path::PathBuf;
use std::process::Command;

fn out_dir(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-bench-io-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn bench_io_writes_table_json_and_plot() {
    let Some(model) = common::model_path() else {
        return;
    };
    // The staging-ring part needs an adapter; measure it only where one exists.
    let gpu = common::gpu().is_some();
    let dir = out_dir("full");
    let json = dir.join("io.json");
    let svg = dir.join("io.svg");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flashlm"));
    cmd.args(["bench", "io", "--model"])
        .arg(&model)
        .args(["--bytes", "1MiB", "--repeats", "1", "--json"])
        .arg(&json)
        .arg("--plot")
        .arg(&svg);
    if !gpu {
        cmd.arg("--no-gpu");
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for needle in [
        "| path | setting | GB/s |",
        "| raw cold read |",
        "| best mmap |",
        "| mode | threads | 4 KiB | 16 KiB | 64 KiB | 256 KiB | 1 MiB | 4 MiB | 16 MiB |",
        "| mmap | 8 |",
    ] {
        assert!(stdout.contains(needle), "{needle:?} missing:\n{stdout}");
    }
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "model",
        "file_len",
        "offset",
        "bytes",
        "raw_cold",
        "sweep",
        "best_direct",
        "best_mmap",
        "ring",
        "ring_over_raw",
        "eviction_effective",
        "evictions",
        "evictions_failed",
        "notes",
    ] {
        assert!(j.get(key).is_some(), "JSON key {key} missing: {j}");
    }
    assert_eq!(j["bytes"], 1 << 20);
    assert_eq!(j["offset"].as_u64().unwrap() % 4096, 0);
    let raw = &j["raw_cold"];
    for key in ["gb_s", "residency", "cold"] {
        assert!(raw.get(key).is_some(), "raw_cold.{key} missing: {raw}");
    }
    assert!(raw["residency"]["before"].is_f64() && raw["residency"]["after"].is_f64());
    let sweep = j["sweep"].as_array().unwrap();
    // 7 piece sizes × 4 thread counts × 2 modes (direct may be refused by the filesystem).
    assert!(sweep.len() == 56 || sweep.len() == 28, "{}", sweep.len());
    for p in sweep {
        assert!(p["gb_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["bytes_read"].as_u64().unwrap() >= 1 << 20, "{p}");
    }
    if gpu {
        let ring = j["ring"].as_array().unwrap();
        assert!(!ring.is_empty(), "{j}");
        assert!(j["ring_over_raw"].as_f64().unwrap() > 0.0);
        assert!(stdout.contains("| staging ring (mmap) |"), "{stdout}");
        assert!(stdout.contains("staging ring / raw cold read:"), "{stdout}");
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("<polyline") && svg.contains("mmap, 8 threads"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_io_rejects_bad_sizes_and_missing_models() {
    let dir = out_dir("bad");
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["bench", "io", "--bytes=-5"]);
    assert!(e.contains("negative"), "{e}");
    let e = run(&["bench", "io", "--no-gpu", "--bytes", "0"]);
    assert!(e.contains("--bytes"), "{e}");
    let e = run(&["bench", "io", "--bytes", "12XB"]);
    assert!(e.contains("unknown unit"), "{e}");
    let missing = dir.join("missing.gguf");
    let e = run(&[
        "bench",
        "io",
        "--no-gpu",
        "--model",
        missing.to_str().unwrap(),
    ]);
    assert!(e.contains("does not exist"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
