//! Builders of crafted GGUF files shared by the GGUF integration tests.
#![allow(dead_code)]

use flashlm::gguf::writer::GgufBytes;
use flashlm::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, MetaValue};

pub const F32: u32 = 0;
pub const Q4_1: u32 = 3;
/// A type id GGUF files may carry that this reader does not support.
pub const Q8_K: u32 = 15;

/// A GGUF header with the given counts.
pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.put_u32(version);
    b.put_u64(n_tensors);
    b.put_u64(n_kv);
    b
}

/// A `key | type | value` metadata pair with a raw value.
pub fn kv(b: &mut Vec<u8>, key: &str, ty: u32, value: &[u8]) {
    b.put_str(key);
    b.put_u32(ty);
    b.extend_from_slice(value);
}

/// A tensor info with whatever dims, type id and offset are given.
pub fn info(b: &mut Vec<u8>, name: &str, dims: &[u64], ty: u32, offset: u64) {
    b.put_str(name);
    b.put_u32(dims.len() as u32);
    for &d in dims {
        b.put_u64(d);
    }
    b.put_u32(ty);
    b.put_u64(offset);
}

/// Pads to `alignment` and appends `data_len` bytes of tensor data.
pub fn with_data(mut b: Vec<u8>, alignment: usize, data_len: usize) -> Vec<u8> {
    b.resize(b.len().next_multiple_of(alignment), 0);
    b.extend((0..data_len).map(|i| i as u8));
    b
}

/// A file with one tensor and no metadata, followed by `data_len` bytes of data.
pub fn one_tensor(dims: &[u64], ty: u32, offset: u64, data_len: usize) -> Vec<u8> {
    let mut b = header(3, 1, 0);
    info(&mut b, "t", dims, ty, offset);
    with_data(b, 32, data_len)
}

/// A file with no tensors and one metadata pair.
pub fn one_kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    let mut b = header(3, 0, 1);
    kv(&mut b, key, ty, value);
    with_data(b, 32, 0)
}

pub fn parse_err(bytes: Vec<u8>) -> GgufError {
    GgufFile::from_bytes(bytes).expect_err("a malformed file must not parse")
}

/// A small valid file: a few kinds of metadata and two tensors, the last one ending the file.
pub fn small_valid() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", MetaValue::U32(1))
        .meta("eps", MetaValue::F32(1e-5))
        .meta("tokens", MetaValue::Array(vec!["<s>", "x"].into()))
        .meta("ids", MetaValue::Array(vec![-1i32, 2].into()));
    let q: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
    w.tensor_f32("q", &[32], GgmlType::Q8_0, &q).tensor_f32(
        "w",
        &[4, 2],
        GgmlType::F32,
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    );
    w.to_bytes()
}

/// xorshift64*: a tiny deterministic generator.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
