//! `flashlm bench threads` runs child runs with the software rasterizer's worker threads set,
//! and `flashlm run` names the count it ran with.
mod common;

use std::process::Command;

#[test]
fn bench_threads_runs_each_count_and_writes_its_table() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let json = common::scratch("bench-threads").join("threads.json");
    let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
        .args(["bench", "threads", "-m"])
        .arg(&model)
        .args(["--rounds", "1", "-n", "2", "--threads", "3", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // The driver's own count (one per CPU) first, then 3; all resident and under 16 MiB each.
    let cpus = std::thread::available_parallelism().unwrap().get().min(16);
    for needle in [
        format!("| {cpus} |"),
        "| 3 |".to_string(),
        "| all resident |".to_string(),
        "| 16 MiB budget |".to_string(),
    ] {
        assert!(stdout.contains(&needle), "{needle:?} missing:\n{stdout}");
    }
    for n in [cpus, 3] {
        assert!(
            stderr.contains(&format!("LP_NUM_THREADS={n}, all resident")),
            "{n}: {stderr}"
        );
    }
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), if cpus == 3 { 2 } else { 4 }, "{j}");
    for r in rows {
        let ms = r["ms_per_token"].as_f64().unwrap();
        assert!(ms.is_finite() && ms > 0.0, "{r}");
        if r["threads"].as_u64() == Some(cpus as u64) {
            assert_eq!(r["vs_driver_default"].as_f64(), Some(1.0), "{r}");
        }
    }
    assert_eq!(j["driver_default"].as_u64(), Some(cpus as u64));
}

#[test]
fn run_names_the_driver_threads_of_a_software_rasterizer() {
    let Some(model) = common::model_path() else {
        return;
    };
    let Some(gpu) = common::gpu() else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
        .env("LP_NUM_THREADS", "3")
        .args(["run", "--temp", "0", "-n", "1", "-p", "Hi", "-m"])
        .arg(&model)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    let cpu = gpu.info.device_type == wgpu::DeviceType::Cpu;
    assert_eq!(text.contains("3 driver threads"), cpu, "{text}");
}

#[test]
fn the_driver_threads_do_not_change_the_tokens() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let dir = common::scratch("driver-threads-tokens");
    let ids = |threads: &str| {
        let stats = dir.join(format!("stats-{threads}.json"));
        let out = Command::new(env!("CARGO_BIN_EXE_flashlm"))
            .env("LP_NUM_THREADS", threads)
            .args(["run", "--temp", "0", "--ignore-eos", "-n", "12", "-m"])
            .arg(&model)
            .args([
                "-p",
                "The three largest rivers of Europe are",
                "--stats-json",
            ])
            .arg(&stats)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        j["generated_ids"].clone()
    };
    let one = ids("1");
    assert_eq!(one.as_array().map(Vec::len), Some(12), "{one}");
    assert_eq!(ids("4"), one);
}
