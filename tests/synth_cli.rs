//! The `flashlm synth` command: a written file runs under a small budget, a 200 MB model is
//! written in little memory, failures leave no partial file behind, bad input fails clearly.
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::model::synthetic::{SyntheticSpec, part_path, synthetic_file_size};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flashlm"))
}

/// A scratch directory (next to the build), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("synth-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn cli_run_streams_a_synth_file_under_a_small_budget() {
    if common::gpu().is_none() {
        return;
    }
    let dir = TempDir::new("run");
    let path = dir.path("m.gguf");
    let args = "synth --layers 4 --dim 256 --ffn 512 --heads 8 --kv-heads 2 --vocab 2000 \
                --type Q4_1 --seed 3 -o";
    let out = bin()
        .args(args.split_whitespace())
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stats = dir.path("stats.json");
    let out = bin()
        .args([
            "run",
            "-p",
            "the cat sat on the mat",
            "-n",
            "6",
            "--temp",
            "0",
        ])
        .args("--gpu-budget 4MiB --resident none --stats-json".split_whitespace())
        .arg(&stats)
        .arg("-m")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    // Every layer was read from the file, and greedy decoding produced varied tokens.
    assert!(j["flash_bytes_per_token"].as_f64().unwrap() > 0.0, "{j}");
    let ids: Vec<u64> = j["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 6, "{j}");
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert!(
        distinct.len() >= 2 && ids.iter().all(|&i| i < 2000),
        "{ids:?}"
    );
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `VmHWM` (peak resident memory) in bytes from a `/proc/PID/status` text.
fn vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Run `cmd` to the end, reading the child's peak resident memory from
/// `/proc/PID/status` every 10 ms meanwhile. Returns its success, stdout, stderr, and the last
/// peak read (the peak up to at most 10 ms before the end). `wait4`'s `ru_maxrss` cannot serve:
/// it also counts the test process's own memory, shared with the child until it execs.
fn run_polled(mut cmd: Command) -> (bool, String, String, u64) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).unwrap();
            s
        })
    };
    let t_out = drain(Box::new(child.stdout.take().unwrap()));
    let t_err = drain(Box::new(child.stderr.take().unwrap()));
    let proc_status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        // After the exec (the program's own image, not the test's shared one).
        if let Ok(text) = std::fs::read_to_string(&proc_status)
            && text.contains("Name:\tflashlm")
        {
            peak = vm_hwm(&text).unwrap_or(peak).max(peak);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    (
        status.success(),
        t_out.join().unwrap(),
        t_err.join().unwrap(),
        peak,
    )
}

/// The `peak memory 23.2 MiB` the program reports, in bytes.
fn reported_peak(stdout: &str) -> Option<u64> {
    let rest = stdout.split("peak memory ").nth(1)?;
    let mut it = rest.split_whitespace();
    let v: f64 = it.next()?.parse().ok()?;
    let unit = match it.next()? {
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        _ => return None,
    };
    Some((v * unit) as u64)
}

#[test]
fn streamed_write_of_a_200_mb_model_keeps_memory_small() {
    let dir = TempDir::new("rss");
    let path = dir.path("m.gguf");
    let mut cmd = bin();
    let args = "synth --layers 14 --dim 1024 --ffn 2816 --heads 16 --kv-heads 4 --vocab 32000 \
                --type Q8_0 --threads 2 -o";
    cmd.args(args.split_whitespace()).arg(&path);
    let (ok, stdout, stderr, peak) = run_polled(cmd);
    assert!(ok, "{stderr}");
    let size = std::fs::metadata(&path).unwrap().len();
    let s = SyntheticSpec {
        n_layers: 14,
        n_embd: 1024,
        n_heads: 16,
        n_kv_heads: 4,
        n_ff: 2816,
        vocab: 32000,
        weight_type: GgmlType::Q8_0,
        ctx: 4096,
        untied_output: false,
    };
    assert_eq!(size, synthetic_file_size(&s).unwrap());
    assert!(size > 190_000_000, "{size} bytes");
    eprintln!(
        "wrote {size} bytes with a peak RSS of {:.1} MiB; {stdout}",
        peak as f64 / 1048576.0
    );
    // Two threads hold a 1 MiB block of f32 values and its quantized bytes each; the rest is
    // the program itself, the vocabulary and the header.
    assert!(peak > 0 && peak < 64 << 20, "peak RSS {peak} bytes");
    // The program's own report (VmHWM at its end, to 0.1 MiB) is at least what was seen from
    // outside.
    let reported = reported_peak(&stdout).unwrap();
    assert!(
        reported + (128 << 10) >= peak && reported < 64 << 20,
        "{stdout}"
    );
    // Progress went to stderr, ending at 100%.
    assert!(stderr.contains("100.0%"), "{stderr}");
    assert!(!part_path(&path).exists());
    let g = GgufFile::open(&path).unwrap();
    assert_eq!(g.tensors.len(), 1 + 14 * 9 + 1);
    assert_eq!(g.file_len, size);
}

#[test]
fn a_failed_write_removes_the_partial_file() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new("fail");
    let path = dir.path("m.gguf");
    let mut cmd = bin();
    let args = "synth --layers 4 --dim 512 --ffn 1024 --heads 8 --vocab 1000 --type F32 -o";
    cmd.args(args.split_whitespace()).arg(&path);
    // Files may not grow past 1 MiB, and the signal that would kill the writer is ignored, so
    // the write fails with EFBIG like a disk that filled up.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("writing") && err.contains("m.gguf failed"),
        "{err}"
    );
    assert!(err.contains("partial file was removed"), "{err}");
    assert!(!path.exists() && !part_path(&path).exists(), "{err}");
}

#[test]
fn cli_errors_are_clear() {
    let dir = TempDir::new("errors");
    let shape = ["synth", "--layers", "1", "--dim", "64", "--heads", "2"];
    // `--ffn 64` unless `extra` sets it.
    let run = |extra: &[&str], out: &Path| {
        let ffn: &[&str] = if extra.contains(&"--ffn") {
            &[]
        } else {
            &["--ffn", "64"]
        };
        let o = bin()
            .args(shape)
            .args(ffn)
            .args(extra)
            .arg("-o")
            .arg(out)
            .output()
            .unwrap();
        assert!(!o.status.success(), "{extra:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let missing = dir.path("no/such/dir/m.gguf");
    let err = run(&[], &missing);
    assert!(
        err.contains("cannot create") && err.contains("m.gguf.part"),
        "{err}"
    );

    let existing = dir.path("exists.gguf");
    std::fs::write(&existing, b"keep").unwrap();
    let err = run(&[], &existing);
    assert!(err.contains("--force"), "{err}");
    assert_eq!(std::fs::read(&existing).unwrap(), b"keep");

    let err = run(&["--kv-heads", "3"], &dir.path("a.gguf"));
    assert!(
        err.contains("3 kv heads do not divide the 2 heads"),
        "{err}"
    );
    let err = run(&["--type", "Q4_0", "--ffn", "48"], &dir.path("a.gguf"));
    assert!(
        err.contains("not a multiple of the Q4_0 block length 32"),
        "{err}"
    );
    let err = run(&["--type", "Q9_9"], &dir.path("a.gguf"));
    assert!(err.contains("unknown type"), "{err}");
    let err = run(&["--vocab", "10"], &dir.path("a.gguf"));
    assert!(err.contains("--vocab must be from 267"), "{err}");
    if let Err(Some(name)) = GgmlType::from_id(14) {
        let err = run(&["--type", name], &dir.path("a.gguf"));
        assert!(
            err.contains(&format!("{name} is not supported by this build")),
            "{err}"
        );
    }

    // About 2^56 bytes (64 PiB) of F32 weights: refused before anything is written.
    let huge = dir.path("huge.gguf");
    let o = bin()
        .args(
            "synth --layers 4096 --dim 1048576 --ffn 1024 --heads 1024 --vocab 300 --type F32 -o"
                .split_whitespace(),
        )
        .arg(&huge)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("not enough free space"), "{err}");
    assert!(!huge.exists() && !part_path(&huge).exists());

    // --dry-run prints the size and writes nothing.
    let dry = dir.path("dry.gguf");
    let o = bin()
        .args(shape)
        .args(["--ffn", "64", "--dry-run", "-o"])
        .arg(&dry)
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = SyntheticSpec {
        n_layers: 1,
        n_embd: 64,
        n_heads: 2,
        n_kv_heads: 2,
        n_ff: 64,
        vocab: 32000,
        weight_type: GgmlType::Q4_0,
        ctx: 4096,
        untied_output: false,
    };
    let size = synthetic_file_size(&s).unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains(&format!("({size} bytes)")), "{stdout}");
    assert!(!dry.exists());
}
