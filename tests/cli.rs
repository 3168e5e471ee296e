//! The `flashlm` binary: run with a budget, stats JSON, trace, and clear errors for bad input.
mod common;

use std::path::PathBuf;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashlm"))
}

fn tmp(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn unparsable_sizes_and_bad_values_fail_clearly() {
    for (args, needle) in [
        (vec!["--gpu-budget", "lots"], "lots"),
        (vec!["--gpu-budget=-5MiB"], "-5MiB"),
        (vec!["--dram-budget", "12XB"], "12XB"),
        (vec!["--io", "floppy"], "floppy"),
        (vec!["--resident", "head,x"], "\"x\""),
    ] {
        let mut cmd = bin();
        cmd.args(["run", "--prompt", "hi", "-m"])
            .arg(file!())
            .args(&args);
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // A file that is not a model.
    let out = bin().args(["info"]).arg(file!()).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("GGUF") && !err.contains("panicked"), "{err}");
}

#[test]
fn run_under_budget_writes_stats_and_trace() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let dir = tmp("run");
    let stats = dir.join("stats.json");
    let trace = dir.join("trace.json");
    let out = bin()
        .args([
            "run",
            "--prompt",
            "The capital of France is",
            "-n",
            "3",
            "--temp",
            "0",
        ])
        .args(["--gpu-budget", "16MiB", "--ctx", "64", "--io", "mmap", "-m"])
        .arg(&model)
        .arg("--stats-json")
        .arg(&stats)
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("placement (budget 16.00 MiB"), "{stderr}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!(
        j["prompt_ids"],
        serde_json::json!([504, 3575, 282, 4649, 314])
    );
    assert_eq!(j["generated_ids"], serde_json::json!([7042, 30, 198]));
    for key in [
        "prefill_tok_s",
        "decode_tok_s",
        "ttft_ms",
        "flash_bytes_per_token",
        "peak_device_bytes",
        "backend",
        "adapter",
        "upload_gb_s",
        "io_wait_share",
        "overlap_efficiency",
    ] {
        assert!(!j[key].is_null(), "missing {key}");
    }
    assert!(j["peak_device_bytes"].as_u64().unwrap() <= 16 << 20);
    // Streaming every layer: more than the layer weights cross per token.
    assert!(j["flash_bytes_per_token"].as_f64().unwrap() > 50e6);
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("read+upload layer")),
        "no read spans"
    );
    assert!(
        names.iter().any(|n| n.starts_with("layer ")),
        "no compute spans"
    );
    assert!(
        events
            .iter()
            .all(|e| e["ph"] == "M" || e["dur"].as_f64().is_some())
    );
}

#[test]
fn budget_below_minimum_is_reported_by_the_cli() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let out = bin()
        .args(["run", "--prompt", "hi", "--gpu-budget", "2MiB", "-m"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("below the minimum") && err.contains("layer slots"),
        "{err}"
    );
}

#[test]
fn outputs_into_a_missing_directory_fail_before_the_work() {
    // Said before the model is even opened (the model here is this source file), so nothing is
    // generated only to be lost when the file cannot be written at the end.
    let dir = tmp("missing-out");
    let gone = dir.join("no-such-dir");
    for (cmd, flag) in [
        ("run", "--session"),
        ("run", "--trace"),
        ("run", "--stats-json"),
        ("chat", "--session"),
        ("bench resident", "--json"),
        ("bench io", "--plot"),
    ] {
        let mut c = bin();
        c.args(cmd.split(' '));
        if cmd == "run" {
            c.args(["--prompt", "hi"]);
        }
        let out = c
            .arg("-m")
            .arg(file!())
            .arg(flag)
            .arg(gone.join("out.file"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cmd} {flag}: {err}");
        assert!(
            err.contains(flag) && err.contains("does not exist") && !err.contains("GGUF"),
            "{cmd} {flag}: {err}"
        );
    }
}

#[test]
fn a_directory_as_the_model_is_named_as_one() {
    let dir = tmp("dir-model");
    let out = bin()
        .args(["run", "--prompt", "hi", "-m"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is a directory"), "{err}");
}

#[test]
fn a_context_past_the_models_length_is_capped_with_a_note() {
    let Some(model) = common::model_path() else {
        return;
    };
    let run = |ctx: &str| {
        let out = bin()
            .args(["plan", "--ctx", ctx, "-m"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
    };
    // SmolLM2-135M's context length is 8192.
    let text = run("100000");
    assert!(
        text.contains("--ctx 100000 is past the model's context length")
            && text.contains("context 8192 tokens"),
        "{text}"
    );
    let text = run("4096");
    assert!(!text.contains("past the model's context length"), "{text}");
    assert!(text.contains("context 4096 tokens"), "{text}");
}

#[test]
fn a_run_without_decode_steps_gives_no_per_token_figures() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    for (n, says) in [
        ("0", "decode: no tokens generated"),
        ("1", "decode: 1 token (from the prefill), no decode steps"),
    ] {
        let out = bin()
            .args(["run", "--prompt", "The capital of France is", "-n", n, "-m"])
            .arg(&model)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "-n {n}: {err}");
        assert!(err.contains(says), "-n {n}: {err}");
        assert!(
            !err.contains("tok/s (") && !err.contains("overlap efficiency"),
            "-n {n}: {err}"
        );
        assert!(err.contains("peak device memory"), "-n {n}: {err}");
    }
}

#[test]
fn missing_default_model_says_how_to_get_it() {
    let out = bin()
        .env("FLASHLM_MODEL", "/nonexistent/model.gguf")
        .args(["run", "--prompt", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fetch-model.sh"), "{err}");
}

#[test]
fn info_list_adapters_and_chat() {
    let Some(model) = common::model_path() else {
        return;
    };
    let out = bin().arg("info").arg(&model).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("tensors: 272"), "{text}");
    assert!(text.contains("Q4_1") && text.contains("Q8_0"), "{text}");
    assert!(text.contains("chat template: from the file"), "{text}");
    if common::gpu().is_none() {
        return;
    }
    let out = bin().arg("--list-adapters").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("0: "));

    // Two turns over stdin, then end of input.
    use std::io::Write;
    let mut child = bin()
        .args(["chat", "--temp", "0", "-n", "6", "--ctx", "256", "-m"])
        .arg(&model)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\nAnd of Italy?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One reply line per turn.
    assert!(
        stdout.lines().filter(|l| !l.trim().is_empty()).count() >= 2,
        "{stdout}"
    );
    assert!(stdout.contains("Paris"), "{stdout}");
}
