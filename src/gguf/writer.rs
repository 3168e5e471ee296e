//! A small GGUF writer: builds valid files for tests, tiny synthetic models and tools.
//!
//! The layout matches what the reader expects and what ggml writes: header, metadata, tensor
//! infos, zero padding up to the alignment, then each tensor's data, each padded with zeros to
//! the alignment (so the file ends on an alignment boundary).
//!
//! The writer does not validate what it is given (tensor data that does not match its dims and
//! type, duplicate keys or names, an invalid `general.alignment` are all written as asked), so
//! tests can also use it to build malformed files.
//!
//! Large files are written with a [`GgufLayout`] (the header and every offset, computed from the
//! tensors' shapes and types before any data exists) and a [`GgufStreamWriter`], which takes
//! each tensor's data in pieces, in order, and adds the padding.

use std::io::Write;
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
        let sizes = self.tensors.iter().map(|t| t.3.len() as u64);
        // In-memory data cannot add up to 2^64 bytes.
        let (offsets, _) = data_offsets(sizes, alignment).unwrap_or_default();
        let infos = self
            .tensors
            .iter()
            .zip(&offsets)
            .map(|((name, dims, ty, _), &off)| (name.as_str(), dims.as_slice(), *ty, off));
        let mut out = encode_header(self.version.unwrap_or(3), &self.metadata, infos, alignment);
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

/// The alignment `metadata` lays the data out with: the last `general.alignment`, when it is a
/// power of two in `1..=65536`, else the default (the rule of [`GgufWriter::meta`]).
fn alignment_of(metadata: &[(String, MetaValue)]) -> u64 {
    match metadata
        .iter()
        .rev()
        .find(|(k, _)| k == ALIGNMENT_KEY)
        .and_then(|(_, v)| v.as_u64())
    {
        Some(a) if a.is_power_of_two() && a <= MAX_ALIGNMENT => a,
        _ => DEFAULT_ALIGNMENT,
    }
}

/// Each tensor's offset in the data section and the section's padded end, for data of `sizes`
/// bytes each padded to `alignment`; `None` on overflow.
fn data_offsets(sizes: impl Iterator<Item = u64>, alignment: u64) -> Option<(Vec<u64>, u64)> {
    let mut offsets = Vec::new();
    let mut rel = 0u64;
    for n in sizes {
        offsets.push(rel);
        rel = rel.checked_add(n)?.checked_next_multiple_of(alignment)?;
    }
    Some((offsets, rel))
}

/// Header, metadata and tensor infos (`name, dims, type, data offset`), padded to `alignment`.
fn encode_header<'a>(
    version: u32,
    metadata: &[(String, MetaValue)],
    infos: impl ExactSizeIterator<Item = (&'a str, &'a [u64], GgmlType, u64)>,
    alignment: u64,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&GGUF_MAGIC);
    out.put_u32(version);
    out.put_u64(infos.len() as u64);
    out.put_u64(metadata.len() as u64);
    for (key, value) in metadata {
        out.put_str(key);
        out.put_u32(value.type_id());
        out.put_value(value);
    }
    for (name, dims, ty, offset) in infos {
        out.put_str(name);
        out.put_u32(dims.len() as u32);
        for &d in dims {
            out.put_u64(d);
        }
        out.put_u32(ty.id());
        out.put_u64(offset);
    }
    pad_to(&mut out, alignment);
    out
}

/// What goes wrong while laying out or streaming a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    #[error("tensor {name:?}: {problem}")]
    BadTensor { name: String, problem: String },
    #[error("the tensor data would pass 2^64 bytes")]
    TooLarge,
    #[error("tensor {name:?}: {got} bytes of data given, it holds {expected}")]
    TooMuchData {
        name: String,
        expected: u64,
        got: u64,
    },
    #[error("{extra} bytes of data given after the last tensor")]
    PastEnd { extra: u64 },
    #[error("tensor {name:?}: only {got} of its {expected} bytes were written")]
    Incomplete {
        name: String,
        expected: u64,
        got: u64,
    },
    #[error("write failed: {0}")]
    Io(#[from] std::io::Error),
}

/// A tensor to lay out: its name, GGUF dims (`dims[0]` contiguous) and type.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// A tensor's place in a laid-out file.
#[derive(Debug, Clone, PartialEq)]
pub struct LaidOutTensor {
    pub entry: TensorEntry,
    /// Offset from the start of the data section (a multiple of the alignment).
    pub offset: u64,
    /// Data bytes, without the padding that follows.
    pub n_bytes: u64,
}

/// A GGUF v3 file planned before its tensor data exists: the exact header bytes (with every
/// offset final) and where each tensor's data goes.
#[derive(Debug, Clone)]
pub struct GgufLayout {
    /// Header, metadata, tensor infos and the padding up to the data section.
    pub header: Vec<u8>,
    pub tensors: Vec<LaidOutTensor>,
    pub alignment: u64,
    /// Size of the whole file (the data section ends on an alignment boundary).
    pub file_size: u64,
}

impl GgufLayout {
    /// Lay out `tensors` (in this order) after `metadata`.
    ///
    /// Every tensor must be readable: 1 to 4 non-zero dims, a row length that is a whole
    /// number of its type's blocks, a byte size that fits in 64 bits.
    ///
    /// # Panics
    /// If a metadata array mixes element types.
    pub fn new(
        metadata: &[(String, MetaValue)],
        tensors: &[TensorEntry],
    ) -> Result<Self, GgufWriteError> {
        let alignment = alignment_of(metadata);
        let mut sizes = Vec::with_capacity(tensors.len());
        for t in tensors {
            let bad = |problem: String| GgufWriteError::BadTensor {
                name: t.name.clone(),
                problem,
            };
            if t.dims.is_empty() || t.dims.len() > super::MAX_DIMS as usize {
                return Err(bad(format!("{} dims (1 to 4 allowed)", t.dims.len())));
            }
            if t.dims.contains(&0) {
                return Err(bad(format!("a zero dimension in {:?}", t.dims)));
            }
            let block = t.ty.block_len();
            if !t.dims[0].is_multiple_of(block) {
                return Err(bad(format!(
                    "row length {} is not a multiple of the {} block length {block}",
                    t.dims[0], t.ty
                )));
            }
            let n_bytes = t
                .dims
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d))
                .and_then(|n| t.ty.bytes_for(n))
                .ok_or_else(|| bad(format!("{:?} of {} overflows 64 bits", t.dims, t.ty)))?;
            sizes.push(n_bytes);
        }
        let (offsets, data_len) =
            data_offsets(sizes.iter().copied(), alignment).ok_or(GgufWriteError::TooLarge)?;
        let infos = tensors
            .iter()
            .zip(&offsets)
            .map(|(t, &off)| (t.name.as_str(), t.dims.as_slice(), t.ty, off));
        let header = encode_header(3, metadata, infos, alignment);
        let file_size = (header.len() as u64)
            .checked_add(data_len)
            .ok_or(GgufWriteError::TooLarge)?;
        let tensors = tensors
            .iter()
            .zip(offsets.into_iter().zip(sizes))
            .map(|(entry, (offset, n_bytes))| LaidOutTensor {
                entry: entry.clone(),
                offset,
                n_bytes,
            })
            .collect();
        Ok(Self {
            header,
            tensors,
            alignment,
            file_size,
        })
    }

    /// Where the data section starts in the file.
    pub fn data_start(&self) -> u64 {
        self.header.len() as u64
    }
}

/// Writes a [`GgufLayout`]'s file front to back: the header at once, then each tensor's data
/// in pieces of any size, in layout order, with the padding after each tensor added here.
pub struct GgufStreamWriter<'a, W: Write> {
    out: W,
    layout: &'a GgufLayout,
    /// The tensor awaiting data.
    next: usize,
    /// Bytes of it written so far.
    in_tensor: u64,
    position: u64,
}

impl<'a, W: Write> GgufStreamWriter<'a, W> {
    /// Write the header to `out`.
    pub fn new(mut out: W, layout: &'a GgufLayout) -> Result<Self, GgufWriteError> {
        out.write_all(&layout.header)?;
        let mut w = Self {
            out,
            layout,
            next: 0,
            in_tensor: 0,
            position: layout.data_start(),
        };
        w.close_full_tensors()?;
        Ok(w)
    }

    /// The tensor the next bytes belong to (`None` once every tensor is written).
    pub fn current(&self) -> Option<&'a LaidOutTensor> {
        self.layout.tensors.get(self.next)
    }

    /// Bytes written so far, padding included.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// Append data to the current tensor (never past its end).
    pub fn write(&mut self, data: &[u8]) -> Result<(), GgufWriteError> {
        let len = data.len() as u64;
        let Some(t) = self.current() else {
            return Err(GgufWriteError::PastEnd { extra: len });
        };
        let got = self.in_tensor.saturating_add(len);
        if got > t.n_bytes {
            return Err(GgufWriteError::TooMuchData {
                name: t.entry.name.clone(),
                expected: t.n_bytes,
                got,
            });
        }
        self.out.write_all(data)?;
        self.in_tensor = got;
        self.position += len;
        self.close_full_tensors()
    }

    /// Pad after every complete tensor and move on to the next.
    fn close_full_tensors(&mut self) -> Result<(), GgufWriteError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while let Some(t) = self.current() {
            if self.in_tensor < t.n_bytes {
                break;
            }
            let end = self.layout.data_start() + t.offset + t.n_bytes;
            let mut pad = end.next_multiple_of(self.layout.alignment) - end;
            while pad > 0 {
                let n = pad.min(ZEROS.len() as u64);
                self.out.write_all(&ZEROS[..n as usize])?;
                pad -= n;
                self.position += n;
            }
            self.next += 1;
            self.in_tensor = 0;
        }
        Ok(())
    }

    /// Check that every tensor was written in full, flush, and hand back the output.
    pub fn finish(mut self) -> Result<W, GgufWriteError> {
        if let Some(t) = self.current() {
            return Err(GgufWriteError::Incomplete {
                name: t.entry.name.clone(),
                expected: t.n_bytes,
                got: self.in_tensor,
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, dims: &[u64], ty: GgmlType) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
        }
    }

    fn metadata() -> Vec<(String, MetaValue)> {
        vec![
            ("general.name".into(), MetaValue::String("t".into())),
            ("list".into(), MetaValue::Array(vec![1i32, -2].into())),
        ]
    }

    /// Bytes `0, 1, 2, …` (mod 251) for tensor `k`, offset by `k`.
    fn data(k: usize, n: u64) -> Vec<u8> {
        (0..n).map(|i| ((i + k as u64) % 251) as u8).collect()
    }

    #[test]
    fn streamed_file_equals_the_in_memory_writer() {
        let entries = [
            entry("a", &[3], GgmlType::F32),
            entry("b", &[64, 3], GgmlType::Q8_0),
            entry("c", &[5, 1, 1], GgmlType::F16),
            entry("d", &[32, 2], GgmlType::Q4_1),
        ];
        let layout = GgufLayout::new(&metadata(), &entries).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in metadata() {
            w.meta(&k, v);
        }
        let mut streamed = GgufStreamWriter::new(Vec::new(), &layout).unwrap();
        for (k, t) in layout.tensors.iter().enumerate() {
            let bytes = data(k, t.n_bytes);
            w.tensor(&t.entry.name, &t.entry.dims, t.entry.ty, bytes.clone());
            // Uneven pieces: one byte, then the rest in 7-byte steps.
            let (first, rest) = bytes.split_at(1);
            streamed.write(first).unwrap();
            for piece in rest.chunks(7) {
                streamed.write(piece).unwrap();
            }
        }
        assert_eq!(streamed.position(), layout.file_size);
        let out = streamed.finish().unwrap();
        assert_eq!(out, w.to_bytes());
        assert_eq!(out.len() as u64, layout.file_size);
        // Sizes by hand: 12, 3 * 2 * 34 = 204, 10, 2 * 20 = 40; offsets padded to 32.
        let sizes: Vec<u64> = layout.tensors.iter().map(|t| t.n_bytes).collect();
        let offsets: Vec<u64> = layout.tensors.iter().map(|t| t.offset).collect();
        assert_eq!(sizes, [12, 204, 10, 40]);
        assert_eq!(offsets, [0, 32, 256, 288]);
        assert_eq!(layout.file_size, layout.data_start() + 288 + 64);
        let g = crate::gguf::GgufFile::from_bytes(out).unwrap();
        assert_eq!(g.tensors.len(), 4);
        assert_eq!(g.tensor_data(&g.tensors[1]), &data(1, 204)[..]);
    }

    #[test]
    fn honours_a_larger_alignment() {
        let mut meta = metadata();
        meta.push((ALIGNMENT_KEY.into(), MetaValue::U32(256)));
        let layout = GgufLayout::new(&meta, &[entry("a", &[3], GgmlType::F32)]).unwrap();
        assert_eq!(layout.alignment, 256);
        assert_eq!(layout.data_start() % 256, 0);
        assert_eq!(layout.file_size, layout.data_start() + 256);
    }

    #[test]
    fn wrong_amounts_of_data_are_errors() {
        let layout = GgufLayout::new(&metadata(), &[entry("a", &[4], GgmlType::F32)]).unwrap();
        let mut w = GgufStreamWriter::new(Vec::new(), &layout).unwrap();
        let err = w.write(&[0; 17]).unwrap_err().to_string();
        assert!(err.contains("17 bytes") && err.contains("16"), "{err}");
        w.write(&[0; 15]).unwrap();
        let err = GgufStreamWriter::finish(w).unwrap_err().to_string();
        assert!(err.contains("15 of its 16"), "{err}");

        let mut w = GgufStreamWriter::new(Vec::new(), &layout).unwrap();
        w.write(&[0; 16]).unwrap();
        assert!(w.current().is_none());
        let err = w.write(&[0]).unwrap_err().to_string();
        assert!(err.contains("after the last tensor"), "{err}");
    }

    #[test]
    fn unreadable_tensors_are_rejected() {
        let cases = [
            (entry("a", &[], GgmlType::F32), "0 dims"),
            (entry("a", &[1, 1, 1, 1, 1], GgmlType::F32), "5 dims"),
            (entry("a", &[4, 0], GgmlType::F32), "zero dimension"),
            (entry("a", &[48, 2], GgmlType::Q4_0), "not a multiple"),
            (entry("a", &[u64::MAX / 2, 4], GgmlType::F32), "overflows"),
        ];
        for (e, want) in cases {
            let err = GgufLayout::new(&[], &[e]).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        // Each fits, the sum does not.
        let big = entry("a", &[1 << 61], GgmlType::F32);
        let mut b = big.clone();
        b.name = "b".into();
        let err = GgufLayout::new(&[], &[big, b]).unwrap_err();
        assert!(matches!(err, GgufWriteError::TooLarge), "{err}");
    }
}
