//! A small GGUF writer: builds valid files for tests, tiny synthetic models and tools.
//!
//! The layout matches what the reader expects and what ggml writes: header, metadata, tensor
//! infos, zero padding up to the alignment, then each tensor's data, each padded with zeros to
//! the alignment (so the file ends on an alignment boundary).
//!
//! The writer does not validate what it is given (tensor data that does not match its dims and
//! type, duplicate keys or names, an invalid `general.alignment` are all written as asked), so
//! tests can also use it to build malformed files.

use std::path::Path;

use super::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgmlType, MAX_ALIGNMENT, MetaArray, MetaValue,
};

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, MetaValue)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: Option<u64>,
    version: Option<u32>,
}

/// Appends little-endian GGUF primitives to a byte vector (also handy for crafting files by
/// hand in tests).
pub trait GgufBytes {
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    /// A `u64 length | bytes` string.
    fn put_str(&mut self, s: &str);
    /// A value without its type id.
    fn put_value(&mut self, v: &MetaValue);
    /// An array value (`element type | count | elements`).
    fn put_array(&mut self, a: &MetaArray);
}

impl GgufBytes for Vec<u8> {
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_str(&mut self, s: &str) {
        self.put_u64(s.len() as u64);
        self.extend_from_slice(s.as_bytes());
    }
    fn put_value(&mut self, v: &MetaValue) {
        match v {
            MetaValue::U8(x) => self.push(*x),
            MetaValue::I8(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U16(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I16(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::U32(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I32(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F32(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Bool(x) => self.push(u8::from(*x)),
            MetaValue::String(s) => self.put_str(s),
            MetaValue::U64(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::I64(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::F64(x) => self.extend_from_slice(&x.to_le_bytes()),
            MetaValue::Array(a) => self.put_array(a),
        }
    }
    fn put_array(&mut self, a: &MetaArray) {
        self.put_u32(a.elem_type());
        self.put_u64(a.len() as u64);
        match a {
            MetaArray::U8(v) => self.extend_from_slice(v),
            MetaArray::I8(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::U16(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::I16(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::U32(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::I32(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::F32(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::Bool(v) => v.iter().for_each(|&x| self.push(u8::from(x))),
            MetaArray::U64(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::I64(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::F64(v) => v
                .iter()
                .for_each(|x| self.extend_from_slice(&x.to_le_bytes())),
            MetaArray::String(v) => v.iter().for_each(|x| self.put_str(x)),
            MetaArray::Array(v) => v.iter().for_each(|x| self.put_array(x)),
        }
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = out.len() as u64;
    let target = len.next_multiple_of(alignment);
    out.resize(target as usize, 0);
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Write this version number in the header instead of 3 (the layout stays v3's, which is
    /// also v2's).
    pub fn version(&mut self, version: u32) -> &mut Self {
        self.version = Some(version);
        self
    }

    /// Add a metadata pair (`general.alignment` given here is honoured when laying out data).
    ///
    /// An alignment that is not a power of two in `1..=65536` is written as given, but the data
    /// is then laid out with the default alignment.
    pub fn meta(&mut self, key: &str, value: MetaValue) -> &mut Self {
        if key == ALIGNMENT_KEY {
            self.alignment = value.as_u64();
        }
        self.metadata.push((key.to_owned(), value));
        self
    }

    /// Add a tensor with GGUF dims (`dims[0]` contiguous) and its stored bytes.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors
            .push((name.to_owned(), dims.to_vec(), ty, data));
        self
    }

    /// Add a tensor from f32 values, stored as `ty` (quantized with the reference quantizer).
    ///
    /// # Panics
    /// If `values.len()` is not a whole number of `ty` blocks.
    pub fn tensor_f32(
        &mut self,
        name: &str,
        dims: &[u64],
        ty: GgmlType,
        values: &[f32],
    ) -> &mut Self {
        let data = super::quant::quantize(ty, values);
        self.tensor(name, dims, ty, data)
    }

    /// The alignment the data is laid out with.
    pub fn layout_alignment(&self) -> u64 {
        match self.alignment {
            Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
            _ => DEFAULT_ALIGNMENT,
        }
    }

    /// Serialize: header, metadata, tensor infos, padding, aligned data.
    pub fn to_bytes(&self) -> Vec<u8> {
        let alignment = self.layout_alignment();
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.put_u32(self.version.unwrap_or(3));
        out.put_u64(self.tensors.len() as u64);
        out.put_u64(self.metadata.len() as u64);
        for (key, value) in &self.metadata {
            out.put_str(key);
            out.put_u32(value.type_id());
            out.put_value(value);
        }
        let mut rel = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            out.put_str(name);
            out.put_u32(dims.len() as u32);
            for &d in dims {
                out.put_u64(d);
            }
            out.put_u32(ty.id());
            out.put_u64(rel);
            rel = (rel + data.len() as u64).next_multiple_of(alignment);
        }
        pad_to(&mut out, alignment);
        for (_, _, _, data) in &self.tensors {
            out.extend_from_slice(data);
            pad_to(&mut out, alignment);
        }
        out
    }

    /// Serialize to a file.
    pub fn write(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_bytes())
    }
}
