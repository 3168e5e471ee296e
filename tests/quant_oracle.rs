//! flashlm's CPU dequantizers and quantizers against fixtures written by the `gguf` Python
//! package (see `tests/oracle/gen_quant_fixtures.py`, which records the versions used).
//!
//! Dequantization must match bit for bit: both sides compute each weight in f32 with the same
//! operations in the same order (e.g. `(d * sc) * q - dmin * m`), and the random f16 scales
//! include subnormals, zeros and negative values. Quantized bytes must equal gguf's exactly
//! for the types gguf can quantize (`Q4_0`, `Q4_1`, `Q5_0`, `Q5_1`, `Q8_0`).

use std::path::PathBuf;

use flashlm::gguf::{GgmlType, quant};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quants")
}

fn read(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn manifest() -> serde_json::Value {
    serde_json::from_slice(&read("manifest.json")).expect("manifest.json parses")
}

fn ty_named(name: &str) -> GgmlType {
    GgmlType::ALL
        .into_iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("fixture for unknown type {name}"))
}

#[test]
fn fixtures_cover_every_block_type() {
    let m = manifest();
    let types = m["types"].as_object().expect("types");
    for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
        let e = types
            .get(ty.name())
            .unwrap_or_else(|| panic!("no fixture for {ty}"));
        assert_eq!(e["block"].as_u64(), Some(ty.block_len()), "{ty}");
    }
    assert!(m["gguf"].as_str().is_some_and(|v| !v.is_empty()));
}

#[test]
fn dequantize_matches_gguf_bit_for_bit() {
    let m = manifest();
    for (name, e) in m["types"].as_object().expect("types") {
        let ty = ty_named(name);
        let blocks = read(&format!("{name}.blocks"));
        let want = f32s(&read(&format!("{name}.deq")));
        let n = e["blocks"].as_u64().unwrap() as usize * ty.block_len() as usize;
        assert_eq!(want.len(), n, "{name}");
        assert_eq!(ty.bytes_for(n as u64), Some(blocks.len() as u64), "{name}");
        let got = quant::dequantize_to_vec(ty, &blocks, n);
        let mut nonzero = 0;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{name}: weight {i} (block {}): flashlm {g} gguf {w}",
                i / ty.block_len() as usize
            );
            nonzero += usize::from(*w != 0.0);
        }
        // Random blocks: almost every weight is non-zero, so the comparison means something.
        assert!(
            nonzero > n / 2,
            "{name}: only {nonzero} of {n} weights non-zero"
        );
    }
}

#[test]
fn quantize_matches_gguf_bytes() {
    let m = manifest();
    let mut checked = Vec::new();
    for (name, e) in m["types"].as_object().expect("types") {
        if e["quantized"].as_bool() != Some(true) {
            continue;
        }
        let ty = ty_named(name);
        let x = f32s(&read(&format!("{name}.qin")));
        let want = read(&format!("{name}.qout"));
        let got = quant::quantize(ty, &x);
        assert_eq!(got.len(), want.len(), "{name}");
        let bb = ty.block_bytes() as usize;
        for (b, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g, w, "{name}: block {b} differs");
        }
        checked.push(ty);
    }
    for ty in [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_0,
        GgmlType::Q8_0,
    ] {
        assert!(checked.contains(&ty), "no quantizer fixture for {ty}");
    }
}
