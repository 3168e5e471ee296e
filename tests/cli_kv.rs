//! The `flashlm` binary with the KV cache on flash: a session saved by one process and resumed
//! by another gives the ids of an uninterrupted run; mismatched, truncated and corrupted
//! sessions are refused with messages that say why; `session-info` and `eval ppl` work; numeric
//! flags are bounded.
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashlm"))
}

fn tmp(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cli-kv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn run(
    model: &Path,
    dir: &Path,
    prompt: &str,
    extra: &[&str],
    json: &str,
) -> (Output, serde_json::Value) {
    let stats = dir.join(json);
    let out = bin()
        .args([
            "run",
            "-n",
            "8",
            "--temp",
            "0",
            "--ctx",
            "256",
            "--kv-page",
            "16",
        ])
        .arg("-m")
        .arg(model)
        .arg("--prompt")
        .arg(prompt)
        .arg("--kv-dir")
        .arg(dir.join("kv"))
        .arg("--stats-json")
        .arg(&stats)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{extra:?}: {err}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    (out, v)
}

#[test]
fn session_saved_then_resumed_in_a_new_process() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let dir = tmp("session");
    let session = dir.join("s.session");
    let first = "Anne Elliot walked slowly along the shore, thinking of the letter";
    let second = format!("{first} she had read that morning, and of what it meant for her");
    for budget in [None, Some("16MiB")] {
        let _ = std::fs::remove_file(&session);
        let mut extra: Vec<&str> = Vec::new();
        if let Some(b) = budget {
            extra.extend(["--gpu-budget", b, "--io", "mmap"]);
        }
        // The uninterrupted run of the longer prompt.
        let (_, plain) = run(&model, &dir, &second, &extra, "plain.json");
        // A first process saves the session, a second resumes it with the longer prompt.
        let mut with_s = extra.clone();
        let sp = session.to_str().unwrap();
        with_s.extend(["--session", sp]);
        let (_, a) = run(&model, &dir, first, &with_s, "a.json");
        assert_eq!(a["session_tokens_reused"], 0);
        assert!(session.exists());
        let (out, b) = run(&model, &dir, &second, &with_s, "b.json");
        let n_first = a["prompt_ids"].as_array().unwrap().len();
        assert_eq!(
            b["session_tokens_reused"].as_u64().unwrap() as usize,
            n_first,
            "budget {budget:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            b["generated_ids"], plain["generated_ids"],
            "budget {budget:?}"
        );
        // The session now holds the longer conversation.
        let info = bin().arg("session-info").arg(&session).output().unwrap();
        let text = String::from_utf8_lossy(&info.stdout);
        assert!(info.status.success() && text.contains("tokens"), "{text}");
    }
    // Checked against its model, and against another model (a synthetic one).
    let info = bin()
        .arg("session-info")
        .arg(&session)
        .arg("-m")
        .arg(&model)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&info.stdout);
    assert!(
        info.status.success() && text.contains("matches model"),
        "{text}"
    );
    let other = dir.join("other.gguf");
    flashlm::model::synthetic::write_synthetic_file(
        &flashlm::model::synthetic::SyntheticSpec::tiny(flashlm::gguf::GgmlType::F32),
        1,
        1,
        &other,
        &mut |_, _| {},
    )
    .unwrap();
    let info = bin()
        .arg("session-info")
        .arg(&session)
        .arg("-m")
        .arg(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&info.stderr);
    assert!(
        !info.status.success() && err.contains("not the model"),
        "{err}"
    );
    // Another page size: refused, naming it, nothing generated.
    let out = bin()
        .args([
            "run",
            "-n",
            "4",
            "--temp",
            "0",
            "--ctx",
            "256",
            "--kv-page",
            "32",
            "--session",
        ])
        .arg(&session)
        .arg("-m")
        .arg(&model)
        .args(["--prompt", first])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("page"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Truncated and corrupted sessions: refused with a reason.
    let bytes = std::fs::read(&session).unwrap();
    let bad = dir.join("bad.session");
    for (what, data) in [
        ("truncated", bytes[..bytes.len() / 2].to_vec()),
        ("corrupted", {
            let mut b = bytes.clone();
            b[40] ^= 0x55;
            b
        }),
    ] {
        std::fs::write(&bad, &data).unwrap();
        let out = bin()
            .args([
                "run",
                "-n",
                "2",
                "--temp",
                "0",
                "--ctx",
                "256",
                "--kv-page",
                "16",
                "--session",
            ])
            .arg(&bad)
            .arg("-m")
            .arg(&model)
            .args(["--prompt", first])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} session accepted: {err}");
        assert!(
            err.contains("session") && !err.contains("panicked"),
            "{what}: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn eval_ppl_reports_perplexity() {
    let Some(model) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let dir = tmp("ppl");
    let text = dir.join("t.txt");
    let full = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/data/persuasion.txt"))
        .unwrap();
    std::fs::write(&text, &full[..3000]).unwrap();
    let json = dir.join("ppl.json");
    let out = bin()
        .args([
            "eval",
            "ppl",
            "--ctx",
            "64",
            "--chunks",
            "2",
            "--gpu-budget",
            "16MiB",
            "--io",
            "mmap",
        ])
        .arg("-m")
        .arg(&model)
        .arg("--file")
        .arg(&text)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("PPL = "), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let p = v["report"]["ppl"].as_f64().unwrap();
    assert!(p > 1.0 && p < 200.0, "perplexity of English prose: {p}");
    assert_eq!(v["report"]["chunks"], 2);
    // Too short a text for one chunk: a clear error.
    std::fs::write(&text, "Too short.").unwrap();
    let out = bin()
        .args(["eval", "ppl", "--ctx", "64"])
        .arg("-m")
        .arg(&model)
        .arg("--file")
        .arg(&text)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("token"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn numeric_flags_are_bounded() {
    for args in [
        vec!["--prefetch", "18446744073709551615"],
        vec!["--ctx", "0"],
        vec!["--kv-page", "3"],
        vec!["--kv-page", "4096"],
        vec!["--io-threads", "0"],
        vec!["--ubatch", "100000"],
        vec!["--kv-select", "quest:0"],
        vec!["--kv-select", "quest:150%"],
        vec!["--kv-select", "lru:4"],
        vec!["--kv-select", "quest-lag:0"],
        vec!["--kv-select", "quest-lag:101%"],
        vec!["--kv-select", "quest-lag:"],
        vec!["-n", "-1"],
        vec!["--resident", "0-18446744073709551614"],
        vec!["--resident", "0-4000000000"],
        vec!["--io-chunk", "0"],
        vec!["--io-chunk", "2GiB"],
        vec!["--head-chunk", "100"],
        vec!["--head-chunk", "1TiB"],
    ] {
        let out = bin()
            .args(["run", "--prompt", "hi", "-m"])
            .arg(file!())
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            err.contains(args[0].trim_start_matches('-')) || err.contains(args[1]),
            "{args:?}: {err}"
        );
    }
}
