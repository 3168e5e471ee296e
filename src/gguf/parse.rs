//! The GGUF parser: a bounds-checked cursor over the file bytes and the header reader.
//!
//! Every count, length and offset is checked against the bytes that remain before anything is
//! allocated: an array of `n` elements is only read when `n` elements of at least the smallest
//! size its type allows fit in the rest of the file, and it is then stored in one typed vector
//! sized exactly (see [`MetaArray`]), so metadata costs about its size in the file.

use std::collections::HashMap;

use super::error::bad_meta;
use super::value::{MetaArray, MetaValue, StrArrayBuilder, describe};
use super::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GgmlType, GgufError, MAX_ALIGNMENT, MAX_DIMS,
    TensorInfo, value_type,
};

/// The fewest bytes a kv pair can take: an empty key (8), the value type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes a tensor info can take: an empty name (8), n_dims (4), one dim (8),
/// the type (4) and the offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// A read that ran past the end: where it started and how many bytes it wanted.
#[derive(Debug, Clone, Copy)]
pub(super) struct Short {
    pub(super) offset: u64,
    pub(super) needed: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
#[derive(Clone, Copy)]
pub(super) struct Cursor<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl<'a> Cursor<'a> {
    pub(super) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(super) fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    pub(super) fn take(&mut self, n: u64) -> Result<&'a [u8], Short> {
        let short = Short {
            offset: self.pos(),
            needed: n,
        };
        let n = usize::try_from(n).map_err(|_| short)?;
        let end = self.pos.checked_add(n).ok_or(short)?;
        let s = self.buf.get(self.pos..end).ok_or(short)?;
        self.pos = end;
        Ok(s)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let at = self.pos();
        let s = self.take(N as u64)?;
        <[u8; N]>::try_from(s).map_err(|_| Short {
            offset: at,
            needed: N as u64,
        })
    }
}

/// What the parser found, before it is joined with the bytes it came from.
pub(super) struct Parsed {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) data_offset: u64,
    pub(super) file_len: u64,
    pub(super) metadata: HashMap<String, MetaValue>,
    pub(super) metadata_order: Vec<String>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
}

pub(super) struct Parser<'a> {
    cur: Cursor<'a>,
    len: u64,
}

macro_rules! read_le {
    ($name:ident, $ty:ty) => {
        fn $name(&mut self, field: impl FnOnce() -> String) -> Result<$ty, GgufError> {
            let r = self.cur.array().map(<$ty>::from_le_bytes);
            self.ctx(r, field)
        }
    };
}

impl<'a> Parser<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Parser {
            cur: Cursor { buf, pos: 0 },
            len: buf.len() as u64,
        }
    }

    fn ctx<T>(&self, r: Result<T, Short>, field: impl FnOnce() -> String) -> Result<T, GgufError> {
        r.map_err(|s| GgufError::Truncated {
            field: field(),
            offset: s.offset,
            needed: s.needed,
            len: self.len,
        })
    }

    read_le!(u8, u8);
    read_le!(i8, i8);
    read_le!(u16, u16);
    read_le!(i16, i16);
    read_le!(u32, u32);
    read_le!(i32, i32);
    read_le!(u64, u64);
    read_le!(i64, i64);
    read_le!(f32, f32);
    read_le!(f64, f64);

    /// A `u64 length | UTF-8 bytes` string.
    fn string(&mut self, field: impl Fn() -> String) -> Result<String, GgufError> {
        self.str_ref(field).map(str::to_owned)
    }

    /// A `u64 length | UTF-8 bytes` string, borrowed from the file.
    fn str_ref(&mut self, field: impl Fn() -> String) -> Result<&'a str, GgufError> {
        let start = self.cur.pos();
        let n = self.u64(|| format!("{} length", field()))?;
        let r = self.cur.take(n);
        let bytes = self.ctx(r, &field)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::InvalidUtf8 {
            field: field(),
            offset: start,
        })
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in what remains.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        offset: u64,
        field: impl FnOnce() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.cur.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                field: field(),
                offset,
                count,
                len: self.len,
            }),
        }
    }

    pub(super) fn parse(mut self) -> Result<Parsed, GgufError> {
        let magic = {
            let r = self.cur.array::<4>();
            self.ctx(r, || "magic".to_owned())?
        };
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = self.u32(|| "version".to_owned())?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let tensor_count_at = self.cur.pos();
        let tensor_count = self.u64(|| "tensor_count".to_owned())?;
        let kv_count_at = self.cur.pos();
        let kv_count = self.u64(|| "kv_count".to_owned())?;
        self.check_count(kv_count, MIN_KV_BYTES, kv_count_at, || {
            "kv_count".to_owned()
        })?;
        self.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, tensor_count_at, || {
            "tensor_count".to_owned()
        })?;

        // Metadata.
        // Counts were checked against the bytes that remain, so sizing maps and lists exactly
        // costs at most a fixed multiple of the file size (and avoids the doubled peak of
        // growing them).
        let prealloc = |count: u64| usize::try_from(count).unwrap_or(0);
        let mut metadata = HashMap::with_capacity(prealloc(kv_count));
        let mut metadata_order = Vec::with_capacity(prealloc(kv_count));
        let mut alignment_at = 0;
        for i in 0..kv_count {
            let key_at = self.cur.pos();
            let key = self.string(|| format!("metadata key #{i}"))?;
            if metadata.contains_key(&key) {
                return Err(GgufError::DuplicateKey {
                    key,
                    offset: key_at,
                });
            }
            let ty_at = self.cur.pos();
            let ty = self.u32(|| format!("metadata {key:?} value type"))?;
            if key == ALIGNMENT_KEY {
                alignment_at = self.cur.pos();
            }
            let value = self.value(ty, ty_at, &key)?;
            metadata_order.push(key.clone());
            metadata.insert(key, value);
        }

        let alignment = match metadata.get(ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => {
                let value = v.as_u64().ok_or_else(|| {
                    bad_meta(
                        ALIGNMENT_KEY,
                        format!(
                            "at byte {alignment_at}: expected an unsigned integer, found {}",
                            describe(v)
                        ),
                    )
                })?;
                if !value.is_power_of_two() || value > MAX_ALIGNMENT {
                    return Err(GgufError::BadAlignment {
                        value,
                        offset: alignment_at,
                    });
                }
                value
            }
        };

        // Tensor infos.
        self.check_count(tensor_count, MIN_TENSOR_INFO_BYTES, tensor_count_at, || {
            "tensor_count".to_owned()
        })?;
        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(prealloc(tensor_count));
        let mut tensor_index = HashMap::with_capacity(prealloc(tensor_count));
        for i in 0..tensor_count {
            let t = self.tensor_info(i)?;
            if tensor_index.contains_key(&t.info.name) {
                return Err(GgufError::DuplicateTensor {
                    name: t.info.name,
                    offset: t.at,
                });
            }
            tensor_index.insert(t.info.name.clone(), tensors.len());
            tensors.push(t.info);
        }

        // The data section.
        let header_end = self.cur.pos();
        let data_offset = header_end
            .checked_next_multiple_of(alignment)
            .unwrap_or(u64::MAX);
        if data_offset > self.len {
            return Err(GgufError::Truncated {
                field: "padding before the tensor data".to_owned(),
                offset: header_end,
                needed: data_offset.saturating_sub(header_end),
                len: self.len,
            });
        }
        let data_len = self.len.saturating_sub(data_offset);
        for t in &mut tensors {
            if !t.rel_offset.is_multiple_of(alignment) {
                return Err(GgufError::Misaligned {
                    name: t.name.clone(),
                    offset: t.rel_offset,
                    alignment,
                });
            }
            let end = t.rel_offset.checked_add(t.n_bytes);
            match end.and_then(|e| data_offset.checked_add(e).map(|abs| (e, abs))) {
                Some((e, _)) if e <= data_len => {
                    t.offset = data_offset.saturating_add(t.rel_offset);
                }
                _ => {
                    return Err(GgufError::TensorOutOfBounds {
                        name: t.name.clone(),
                        start: t.rel_offset,
                        end: end.unwrap_or(u64::MAX),
                        data_len,
                    });
                }
            }
        }
        let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
        by_offset.sort_by_key(|t| t.rel_offset);
        for pair in by_offset.windows(2) {
            if let [a, b] = pair
                && a.rel_offset.saturating_add(a.n_bytes) > b.rel_offset
            {
                return Err(GgufError::OverlappingTensors {
                    a: a.name.clone(),
                    b: b.name.clone(),
                    offset: b.rel_offset,
                });
            }
        }

        Ok(Parsed {
            version,
            alignment,
            data_offset,
            file_len: self.len,
            metadata,
            metadata_order,
            tensors,
            tensor_index,
        })
    }

    /// One metadata value of type `ty` (read at `ty_at`).
    fn value(&mut self, ty: u32, ty_at: u64, key: &str) -> Result<MetaValue, GgufError> {
        use value_type::*;
        let field = || format!("metadata {key:?} value");
        Ok(match ty {
            UINT8 => MetaValue::U8(self.u8(field)?),
            INT8 => MetaValue::I8(self.i8(field)?),
            UINT16 => MetaValue::U16(self.u16(field)?),
            INT16 => MetaValue::I16(self.i16(field)?),
            UINT32 => MetaValue::U32(self.u32(field)?),
            INT32 => MetaValue::I32(self.i32(field)?),
            FLOAT32 => MetaValue::F32(self.f32(field)?),
            // Any non-zero byte reads as true, as in the reference reader.
            BOOL => MetaValue::Bool(self.u8(field)? != 0),
            STRING => MetaValue::String(self.string(field)?),
            UINT64 => MetaValue::U64(self.u64(field)?),
            INT64 => MetaValue::I64(self.i64(field)?),
            FLOAT64 => MetaValue::F64(self.f64(field)?),
            ARRAY => MetaValue::Array(self.array_value(key, 0)?),
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    offset: ty_at,
                    ty,
                });
            }
        })
    }

    /// An array value; `depth` is 1 for an array inside an array.
    fn array_value(&mut self, key: &str, depth: u32) -> Result<MetaArray, GgufError> {
        use value_type::*;
        let elem_at = self.cur.pos();
        let elem = self.u32(|| format!("metadata {key:?} array element type"))?;
        let Some(min_size) = value_type::min_size(elem) else {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                offset: elem_at,
                ty: elem,
            });
        };
        if elem == ARRAY && depth >= 1 {
            return Err(GgufError::NestedArray {
                key: key.to_owned(),
                offset: elem_at,
            });
        }
        let count_at = self.cur.pos();
        let count = self.u64(|| format!("metadata {key:?} array count"))?;
        self.check_count(count, min_size, count_at, || {
            format!("metadata {key:?} array count")
        })?;
        // `count * min_size` fits in the rest of the file, so `count` fits a usize and a vector
        // of `count` elements costs at most what they take in the file (inner arrays: 40
        // bytes for at least 12).
        let n = usize::try_from(count).map_err(|_| GgufError::CountTooLarge {
            field: format!("metadata {key:?} array count"),
            offset: count_at,
            count,
            len: self.len,
        })?;
        let field = || format!("metadata {key:?} array elements");
        if elem == STRING {
            return self.string_array(key, n);
        }
        if elem == ARRAY {
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(self.array_value(key, depth.saturating_add(1))?);
            }
            return Ok(MetaArray::Array(items));
        }
        // Fixed-size elements: `min_size` is their exact size.
        let r = self.cur.take(count.saturating_mul(min_size));
        let bytes = self.ctx(r, field)?;
        Ok(match elem {
            UINT8 => MetaArray::U8(bytes.to_vec()),
            INT8 => MetaArray::I8(le_vec(bytes, i8::from_le_bytes)),
            UINT16 => MetaArray::U16(le_vec(bytes, u16::from_le_bytes)),
            INT16 => MetaArray::I16(le_vec(bytes, i16::from_le_bytes)),
            UINT32 => MetaArray::U32(le_vec(bytes, u32::from_le_bytes)),
            INT32 => MetaArray::I32(le_vec(bytes, i32::from_le_bytes)),
            FLOAT32 => MetaArray::F32(le_vec(bytes, f32::from_le_bytes)),
            BOOL => MetaArray::Bool(bytes.iter().map(|&b| b != 0).collect()),
            UINT64 => MetaArray::U64(le_vec(bytes, u64::from_le_bytes)),
            INT64 => MetaArray::I64(le_vec(bytes, i64::from_le_bytes)),
            FLOAT64 => MetaArray::F64(le_vec(bytes, f64::from_le_bytes)),
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    offset: elem_at,
                    ty: elem,
                });
            }
        })
    }

    /// `n` strings (already checked to be possible), stored in one text sized exactly.
    fn string_array(&mut self, key: &str, n: usize) -> Result<MetaArray, GgufError> {
        // A first pass over a copy of the cursor measures the text; malformed entries stop it
        // and are reported by the second pass.
        let mut scan = self.cur;
        let mut text_len = 0usize;
        for _ in 0..n {
            let Ok(len) = scan.array::<8>().map(u64::from_le_bytes) else {
                break;
            };
            let Ok(s) = scan.take(len) else {
                break;
            };
            text_len = text_len.saturating_add(s.len());
        }
        let mut out = StrArrayBuilder::with_capacity(n, text_len);
        for i in 0..n {
            let s = self.str_ref(|| format!("metadata {key:?} string #{i}"))?;
            out.push(s);
        }
        Ok(MetaArray::String(out.finish()))
    }

    /// Reads and checks one tensor info; its absolute offset is filled in later.
    fn tensor_info(&mut self, i: u64) -> Result<RawTensor, GgufError> {
        let at = self.cur.pos();
        let name = self.string(|| format!("tensor #{i} name"))?;
        let n_dims_at = self.cur.pos();
        let n_dims = self.u32(|| format!("tensor {name:?} n_dims"))?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            return Err(GgufError::BadDimCount {
                name,
                offset: n_dims_at,
                n_dims,
            });
        }
        // (offset, value) of each dimension.
        let mut dims_at = Vec::with_capacity(MAX_DIMS as usize);
        for d in 0..n_dims {
            let pos = self.cur.pos();
            dims_at.push((pos, self.u64(|| format!("tensor {name:?} dims[{d}]"))?));
        }
        let ty_at = self.cur.pos();
        let ty_id = self.u32(|| format!("tensor {name:?} type"))?;
        let rel_offset = self.u64(|| format!("tensor {name:?} offset"))?;

        if let Some((dim, &(offset, _))) = dims_at.iter().enumerate().find(|(_, d)| d.1 == 0) {
            return Err(GgufError::ZeroDimension { name, offset, dim });
        }
        let ty = match GgmlType::from_id(ty_id) {
            Ok(ty) => ty,
            Err(None) => {
                return Err(GgufError::UnknownTensorType {
                    name,
                    offset: ty_at,
                    ty: ty_id,
                });
            }
            Err(Some(ty)) => {
                return Err(GgufError::UnsupportedTensorType {
                    name,
                    offset: ty_at,
                    ty,
                });
            }
        };
        let dims: Vec<u64> = dims_at.iter().map(|&(_, d)| d).collect();
        let dims_offset = dims_at.first().map_or(at, |&(o, _)| o);
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| i64::try_from(n).is_ok());
        let Some(n_elements) = n_elements else {
            return Err(GgufError::SizeOverflow {
                name,
                offset: dims_offset,
            });
        };
        let ne0 = dims.first().copied().unwrap_or(0);
        if !ne0.is_multiple_of(ty.block_len()) {
            return Err(GgufError::BadBlockShape {
                name,
                ty: ty.name(),
                ne0,
                block: ty.block_len(),
            });
        }
        let Some(n_bytes) = ty.bytes_for(n_elements) else {
            return Err(GgufError::SizeOverflow {
                name,
                offset: dims_offset,
            });
        };
        Ok(RawTensor {
            at,
            info: TensorInfo {
                name,
                dims,
                ty,
                rel_offset,
                offset: 0,
                n_elements,
                n_bytes,
            },
        })
    }
}

/// A tensor info and where its entry starts in the file.
struct RawTensor {
    at: u64,
    info: TensorInfo,
}
/// Decodes little-endian values of `N` bytes each (`bytes.len()` is a multiple of `N`).
fn le_vec<T, const N: usize>(bytes: &[u8], f: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| f(<[u8; N]>::try_from(c).unwrap_or([0; N])))
        .collect()
}
