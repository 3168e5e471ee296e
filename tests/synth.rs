//! Synthetic GGUF files of any shape, written by `write_synthetic_file`: they load and run, their
//! tensor table agrees with the `gguf` Python package's reader, and sizes are known without
//! writing (the `flashlm synth` command itself: tests/synth_cli.rs).
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::model::config::ModelConfig;
use flashlm::model::reference::CpuModel;
use flashlm::model::synthetic::{
    SyntheticSpec, part_path, synthetic_file_size, write_synthetic_file,
};
use flashlm::model::tokenizer::Tokenizer;

/// A scratch directory (next to the build), removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("synth-{name}-{}", std::process::id()));
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

fn spec(ty: GgmlType) -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 3,
        n_embd: 192,
        n_heads: 6,
        n_kv_heads: 2,
        n_ff: 416,
        vocab: 1500,
        weight_type: ty,
        ctx: 512,
        untied_output: true,
    }
}

/// Every tensor's name, GGUF dims and type, in file order, written out from the llama layout
/// (independently of the generator's own list).
fn expected_tensors(s: &SyntheticSpec) -> Vec<(String, Vec<u64>, GgmlType)> {
    let (e, ff, v) = (s.n_embd as u64, s.n_ff as u64, s.vocab as u64);
    let kv = (s.n_embd / s.n_heads * s.n_kv_heads) as u64;
    let w = s.weight_type;
    let mut out = vec![("token_embd.weight".to_string(), vec![e, v], w)];
    for l in 0..s.n_layers {
        for (part, dims, ty) in [
            ("attn_norm", vec![e], GgmlType::F32),
            ("attn_q", vec![e, e], w),
            ("attn_k", vec![e, kv], w),
            ("attn_v", vec![e, kv], w),
            ("attn_output", vec![e, e], w),
            ("ffn_norm", vec![e], GgmlType::F32),
            ("ffn_gate", vec![e, ff], w),
            ("ffn_up", vec![e, ff], w),
            ("ffn_down", vec![ff, e], w),
        ] {
            out.push((format!("blk.{l}.{part}.weight"), dims, ty));
        }
    }
    out.push(("output_norm.weight".to_string(), vec![e], GgmlType::F32));
    if s.untied_output {
        out.push(("output.weight".to_string(), vec![e, v], w));
    }
    out
}

/// Bytes of `n` values of `ty`, from the block sizes of the GGUF format.
fn bytes_of(ty: GgmlType, n: u64) -> u64 {
    match ty {
        GgmlType::F32 => n * 4,
        GgmlType::F16 | GgmlType::BF16 => n * 2,
        GgmlType::Q4_0 => n / 32 * 18,
        GgmlType::Q4_1 => n / 32 * 20,
        GgmlType::Q8_0 => n / 32 * 34,
        #[allow(unreachable_patterns)]
        other => panic!("no size for {other} in this test"),
    }
}

fn write(s: &SyntheticSpec, seed: u64, path: &Path) -> u64 {
    write_synthetic_file(s, seed, 2, path, &mut |_, _| {}).unwrap()
}

#[test]
fn small_synth_file_loads_decodes_and_runs() {
    let dir = TempDir::new("load");
    let s = spec(GgmlType::Q8_0);
    let path = dir.path("m.gguf");
    let size = write(&s, 7, &path);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size);
    assert!(!part_path(&path).exists());

    let g = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(
        (
            cfg.n_layers,
            cfg.n_embd,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.n_ff
        ),
        (3, 192, 6, 2, 416)
    );
    assert_eq!(
        (cfg.vocab_size, cfg.head_dim, cfg.context_length),
        (1500, 32, 512)
    );
    let names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    let want = expected_tensors(&s);
    assert_eq!(names, want.iter().map(|t| t.0.as_str()).collect::<Vec<_>>());
    for (t, (_, dims, ty)) in g.tensors.iter().zip(&want) {
        assert_eq!((&t.dims, t.ty), (dims, *ty), "{}", t.name);
    }

    // Matrices ~ N(0, 1/cols), norms ~ 1 + N(0, 0.01), as dequantized by the reader.
    let moments = |name: &str| {
        let v = g.dequantize_tensor(g.tensor(name).unwrap()).unwrap();
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = v
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    };
    let (m, sd) = moments("blk.1.ffn_down.weight");
    assert!(
        m.abs() < 0.002 && (sd * 416f64.sqrt() - 1.0).abs() < 0.03,
        "{m} {sd}"
    );
    let (m, sd) = moments("output.weight");
    assert!(
        m.abs() < 0.002 && (sd * 192f64.sqrt() - 1.0).abs() < 0.03,
        "{m} {sd}"
    );
    let (m, sd) = moments("blk.2.attn_norm.weight");
    assert!(
        (m - 1.0).abs() < 0.03 && (sd - 0.1).abs() < 0.03,
        "{m} {sd}"
    );

    // The tokenizer: every id decodes, text round-trips, merged tokens are used.
    let tk = Tokenizer::from_gguf(&g).unwrap();
    assert_eq!(tk.n_vocab(), 1500);
    for id in 0..1500u32 {
        assert!(!tk.token_bytes(id).unwrap().is_empty(), "id {id}");
    }
    let text = "the quick brown fox, then the rest";
    let ids = tk.encode(text, false);
    assert!(ids.len() < text.len(), "no merges applied: {ids:?}");
    assert!(
        ids.iter().any(|&i| i >= 267),
        "no generated token used: {ids:?}"
    );
    assert_eq!(tk.decode(&ids, false).unwrap(), text);

    // The CPU reference: finite logits of a sane scale, greedy tokens that vary.
    let cpu = CpuModel::from_gguf(&g, &cfg).unwrap();
    let out = cpu.greedy(&ids, 12).unwrap();
    let distinct: std::collections::HashSet<_> = out.iter().collect();
    assert!(distinct.len() >= 3, "greedy tokens barely vary: {out:?}");

    // The engine on the GPU agrees with the reference.
    if common::gpu().is_none() {
        return;
    }
    let mut st = cpu.new_state_kv(64, true);
    let mut want = Vec::new();
    for (pos, &id) in ids.iter().enumerate() {
        want = cpu.forward(&mut st, id, pos).unwrap();
    }
    assert!(want.iter().all(|x| x.is_finite()));
    let mut engine = Engine::new(g.clone(), &EngineOptions::default()).unwrap();
    let got = engine.forward(&ids).unwrap();
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let d = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale;
    assert!(d < 1e-3, "GPU logits differ from the CPU reference by {d}");
}
/// The Python interpreter with the `gguf` package: `$FLASHLM_PYTHON`, else `python3`; `None`
/// (with a note) when gguf is not importable, outside CI.
fn python_with_gguf() -> Option<String> {
    let py = std::env::var("FLASHLM_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let ok = Command::new(&py)
        .args(["-c", "import gguf"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some(py);
    }
    if common::in_ci() {
        panic!("CI=true but {py} cannot import gguf (scripts/test.sh installs it)");
    }
    eprintln!("skipping: {py} cannot import gguf (pip install gguf==0.19.0)");
    None
}

#[test]
fn tensor_table_matches_the_gguf_python_reader() {
    let Some(py) = python_with_gguf() else {
        return;
    };
    let dir = TempDir::new("oracle");
    for (k, ty) in [GgmlType::Q4_1, GgmlType::F16].into_iter().enumerate() {
        let mut s = spec(ty);
        s.untied_output = k == 0;
        let path = dir.path(&format!("m{k}.gguf"));
        let size = write(&s, 11, &path);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/gguf_tensors.py");
        let out = Command::new(&py).arg(script).arg(&path).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        eprintln!("gguf {} read {}", j["gguf"], path.display());
        assert_eq!(j["alignment"], 32);
        assert_eq!(j["n_tokens"], 1500);
        assert_eq!(j["n_merges"], 1500 - 259);
        assert_eq!(j["block_count"], 3);

        // Names, shapes, types as written out above; offsets packed at 32-byte alignment
        // from gguf's data offset; sizes from the block layouts; the last ends the file.
        let want = expected_tensors(&s);
        let got = j["tensors"].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        let mut offset = j["data_offset"].as_u64().unwrap();
        assert_eq!(offset % 32, 0);
        let g = GgufFile::open(&path).unwrap();
        for ((t, (name, dims, ty)), mine) in got.iter().zip(&want).zip(&g.tensors) {
            let n_bytes = bytes_of(*ty, dims.iter().product());
            assert_eq!(t["name"], name.as_str());
            assert_eq!(t["shape"], serde_json::json!(dims), "{name}");
            assert_eq!(t["type"], ty.name(), "{name}");
            assert_eq!(t["offset"], offset, "{name}");
            assert_eq!(t["n_bytes"], n_bytes, "{name}");
            // flashlm's reader agrees.
            assert_eq!(g.data_offset + mine.rel_offset, offset, "{name}");
            assert_eq!(mine.n_bytes, n_bytes, "{name}");
            offset = (offset + n_bytes).next_multiple_of(32);
        }
        assert_eq!(offset, size);
    }
}

#[test]
fn seven_b_shape_size_is_known_without_writing() {
    let s = SyntheticSpec {
        n_layers: 32,
        n_embd: 4096,
        n_heads: 32,
        n_kv_heads: 8,
        n_ff: 11008,
        vocab: 32000,
        weight_type: GgmlType::Q4_0,
        ctx: 4096,
        untied_output: false,
    };
    let size = synthetic_file_size(&s).unwrap();
    // Weights: per layer q, o 4096²; k, v 4096 x 1024; gate, up, down 4096 x 11008; plus the
    // 32000 x 4096 embedding, at 18 bytes per 32. Norms: 65 x 4096 f32. Every size is a
    // multiple of 32, so there is no padding between tensors.
    let layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 11008u64;
    let weights = (32 * layer + 32000 * 4096) / 32 * 18;
    let data = weights + 65 * 4096 * 4;
    assert_eq!(weights, 3_263_496_192);
    let header = size - data;
    // The header holds the 32000-token vocabulary and its merges: well under 2 MB.
    assert!(
        (100_000..2_000_000).contains(&header),
        "header {header} bytes"
    );
    assert!((3.2e9..3.4e9).contains(&(size as f64)), "{size} bytes");

    // Q4_K stores 256 weights in 144 bytes, the same 4.5 bits per weight as Q4_0: the same
    // file size, where this build reads Q4_K.
    if let Ok(q4_k) = GgmlType::from_id(12) {
        let k = SyntheticSpec {
            weight_type: q4_k,
            ..s.clone()
        };
        assert_eq!(synthetic_file_size(&k).unwrap(), size);
    }
    // Untied, a second 32000 x 4096 matrix, and 53 more header bytes for its entry (name,
    // dim count, two dims, type, offset), which move the padded data start by 32 or 64.
    let u = SyntheticSpec {
        untied_output: true,
        ..s
    };
    let extra = synthetic_file_size(&u).unwrap() - size - 32000 * 4096 / 32 * 18;
    assert!(extra == 32 || extra == 64, "{extra}");
}
