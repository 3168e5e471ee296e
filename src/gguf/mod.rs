//! GGUF (v2 and v3) reader over a memory map.
//!
//! Every count, length, offset and size read from the file is treated as hostile: it is checked
//! against the bytes that remain and against integer overflow before anything is allocated or
//! sliced. A malformed file yields a [`GgufError`] that names the field and its byte offset.
//!
//! Layout (little-endian):
//! `magic "GGUF" | version u32 | tensor_count u64 | kv_count u64 | kv pairs | tensor infos |
//! padding to alignment | tensor data`. In v1 (unsupported) counts were u32.
//!
//! - A kv pair is `key string | value type u32 | value`; a string is `u64 length | UTF-8 bytes`;
//!   an array value is `element type u32 | u64 count | elements` (see [`value_type`]).
//! - A tensor info is `name string | n_dims u32 | n_dims x u64 dims | type u32 | offset u64`,
//!   the offset being relative to the data section, which starts at the end of the tensor
//!   infos rounded up to `general.alignment` (default [`DEFAULT_ALIGNMENT`]).

pub mod quant;
pub mod writer;

use std::collections::HashMap;
use std::path::Path;

use thiserror::Error;

pub use quant::{GgmlType, dequantize, ggml_type_name, quantize};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Default alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Largest accepted `general.alignment`.
pub const MAX_ALIGNMENT: u64 = 65536;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: u32 = 4;
/// The metadata key that sets the data alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Metadata value type ids as stored in the file.
pub mod value_type {
    pub const UINT8: u32 = 0;
    pub const INT8: u32 = 1;
    pub const UINT16: u32 = 2;
    pub const INT16: u32 = 3;
    pub const UINT32: u32 = 4;
    pub const INT32: u32 = 5;
    pub const FLOAT32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const UINT64: u32 = 10;
    pub const INT64: u32 = 11;
    pub const FLOAT64: u32 = 12;

    /// The fewest bytes one value of type `ty` can take; `None` for an unknown type.
    pub fn min_size(ty: u32) -> Option<u64> {
        Some(match ty {
            UINT8 | INT8 | BOOL => 1,
            UINT16 | INT16 => 2,
            UINT32 | INT32 | FLOAT32 => 4,
            UINT64 | INT64 | FLOAT64 => 8,
            // u64 length.
            STRING => 8,
            // u32 element type + u64 count.
            ARRAY => 12,
            _ => return None,
        })
    }
}

/// The fewest bytes a kv pair can take: an empty key (8), the value type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 4 + 1;
/// The fewest bytes a tensor info can take: an empty name (8), n_dims (4), one dim (8),
/// the type (4) and the offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;
/// Vectors sized from a (checked) count start at most this big and grow as elements are read.
const MAX_PREALLOC: u64 = 1 << 16;

/// Everything that can be wrong with a GGUF file.
#[derive(Debug, Error)]
pub enum GgufError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error("file truncated: {field} at byte {offset} needs {needed} bytes, file has {len}")]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        len: u64,
    },
    #[error("{field} at byte {offset}: count {count} is impossible for a file of {len} bytes")]
    CountTooLarge {
        field: String,
        offset: u64,
        count: u64,
        len: u64,
    },
    #[error("{field} at byte {offset}: string is not valid UTF-8")]
    InvalidUtf8 { field: String, offset: u64 },
    #[error("metadata {key:?} at byte {offset}: unknown value type {ty}")]
    UnknownValueType { key: String, offset: u64, ty: u32 },
    #[error(
        "metadata {key:?} at byte {offset}: arrays nested more than one level are not supported"
    )]
    NestedArray { key: String, offset: u64 },
    #[error("duplicate metadata key {key:?} at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("duplicate tensor name {name:?} at byte {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error(
        "general.alignment = {value} at byte {offset} is invalid (must be a power of two, 1..=65536)"
    )]
    BadAlignment { value: u64, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: {n_dims} dimensions (1..=4 allowed)")]
    BadDimCount {
        name: String,
        offset: u64,
        n_dims: u32,
    },
    #[error("tensor {name:?} at byte {offset}: dimension {dim} is zero")]
    ZeroDimension {
        name: String,
        offset: u64,
        dim: usize,
    },
    #[error("tensor {name:?} at byte {offset}: element count or byte size overflows")]
    SizeOverflow { name: String, offset: u64 },
    #[error("tensor {name:?} at byte {offset}: unknown tensor type id {ty}")]
    UnknownTensorType { name: String, offset: u64, ty: u32 },
    #[error(
        "tensor {name:?} at byte {offset}: type {ty} is not supported yet (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)"
    )]
    UnsupportedTensorType {
        name: String,
        offset: u64,
        ty: &'static str,
    },
    #[error("tensor {name:?}: row length {ne0} is not a multiple of the {ty} block size {block}")]
    BadBlockShape {
        name: String,
        ty: &'static str,
        ne0: u64,
        block: u64,
    },
    #[error("tensor {name:?}: offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {name:?}: data [{start}, {end}) lies past the end of the data section ({data_len} bytes)"
    )]
    TensorOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensors {a:?} and {b:?} overlap in the data section (at data offset {offset})")]
    OverlappingTensors { a: String, b: String, offset: u64 },
    #[error("metadata {key:?}: {problem}")]
    BadMetadata { key: String, problem: String },
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The GGUF value type id (see [`value_type`]).
    pub fn type_id(&self) -> u32 {
        use value_type::*;
        match self {
            MetaValue::U8(_) => UINT8,
            MetaValue::I8(_) => INT8,
            MetaValue::U16(_) => UINT16,
            MetaValue::I16(_) => INT16,
            MetaValue::U32(_) => UINT32,
            MetaValue::I32(_) => INT32,
            MetaValue::F32(_) => FLOAT32,
            MetaValue::Bool(_) => BOOL,
            MetaValue::String(_) => STRING,
            MetaValue::Array(_) => ARRAY,
            MetaValue::U64(_) => UINT64,
            MetaValue::I64(_) => INT64,
            MetaValue::F64(_) => FLOAT64,
        }
    }

    /// A short name of the value's type, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MetaValue::U8(_) => "u8",
            MetaValue::I8(_) => "i8",
            MetaValue::U16(_) => "u16",
            MetaValue::I16(_) => "i16",
            MetaValue::U32(_) => "u32",
            MetaValue::I32(_) => "i32",
            MetaValue::F32(_) => "f32",
            MetaValue::Bool(_) => "bool",
            MetaValue::String(_) => "string",
            MetaValue::Array(_) => "array",
            MetaValue::U64(_) => "u64",
            MetaValue::I64(_) => "i64",
            MetaValue::F64(_) => "f64",
        }
    }

    /// Any integer that fits a u64 (not negative).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => Some(v),
            MetaValue::I8(v) => u64::try_from(v).ok(),
            MetaValue::I16(v) => u64::try_from(v).ok(),
            MetaValue::I32(v) => u64::try_from(v).ok(),
            MetaValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits an i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            MetaValue::U8(v) => Some(v.into()),
            MetaValue::U16(v) => Some(v.into()),
            MetaValue::U32(v) => Some(v.into()),
            MetaValue::U64(v) => i64::try_from(v).ok(),
            MetaValue::I8(v) => Some(v.into()),
            MetaValue::I16(v) => Some(v.into()),
            MetaValue::I32(v) => Some(v.into()),
            MetaValue::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any float or integer, converted to f32 (rounding if needed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetaValue::F32(v) => Some(v),
            MetaValue::F64(v) => Some(v as f32),
            MetaValue::U64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table, validated against the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// GGUF order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub rel_offset: u64,
    /// Absolute offset in the file.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(0)
    }
    /// Number of rows (product of `dims[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.n_elements.checked_div(self.row_len()).unwrap_or(0)
    }
    /// Bytes per row as stored.
    pub fn row_bytes(&self) -> u64 {
        self.n_bytes.checked_div(self.n_rows()).unwrap_or(0)
    }
}

/// A parsed GGUF file; the tensor data stays in the memory map.
pub struct GgufFile {
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    pub file_len: u64,
    pub metadata: HashMap<String, MetaValue>,
    /// Metadata keys in file order.
    pub metadata_order: Vec<String>,
    /// Tensors in file (table) order.
    pub tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    bytes: Bytes,
}

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("file_len", &self.file_len)
            .field("metadata_keys", &self.metadata_order.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

fn bad_meta(key: &str, problem: String) -> GgufError {
    GgufError::BadMetadata {
        key: key.to_owned(),
        problem,
    }
}

fn describe(v: &MetaValue) -> String {
    match v {
        MetaValue::String(_) | MetaValue::Array(_) => v.type_name().to_owned(),
        other => format!("{} {other:?}", other.type_name()),
    }
}

/// Converts each element of an array value, naming the first one that does not fit.
fn convert_array<'a, T>(
    key: &str,
    value: &'a MetaValue,
    what: &str,
    f: impl Fn(&'a MetaValue) -> Option<T>,
) -> Result<Vec<T>, GgufError> {
    let Some(items) = value.as_array() else {
        return Err(bad_meta(
            key,
            format!("expected an array of {what}, found {}", describe(value)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            f(v).ok_or_else(|| {
                bad_meta(
                    key,
                    format!("element {i}: expected {what}, found {}", describe(v)),
                )
            })
        })
        .collect()
}

impl GgufFile {
    /// Memory-map and parse a file.
    ///
    /// The map is read-only; as with any memory map, the file must not be truncated by another
    /// process while this value lives.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is only ever read, through bounds-checked slices; flashlm never
        // writes model files while they are open.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped(map))
    }

    /// Parse an in-memory copy (tests, crafted files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self, GgufError> {
        let h = Parser::new(bytes.as_slice()).parse()?;
        Ok(GgufFile {
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            file_len: h.file_len,
            metadata: h.metadata,
            metadata_order: h.metadata_order,
            tensors: h.tensors,
            tensor_index: h.tensor_index,
            bytes,
        })
    }

    /// The whole file.
    /// Drop this process's mapping of the file's pages (they are read again from the file on
    /// next use), so the page cache can evict them. No-op for in-memory files.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped(m) = &self.bytes {
            // SAFETY: the map is read-only and file-backed; after DONTNEED the next access
            // reads the same bytes from the file again, so no reference observes a change.
            let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }

    /// The stored bytes of a tensor (bounds were checked at parse time).
    ///
    /// # Panics
    /// If `t` does not describe a tensor of this file (it was not taken from [`Self::tensors`]).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        self.slice(t.offset, t.n_bytes).unwrap_or_else(|| {
            panic!(
                "tensor {:?} [{}, +{}) is not within this {}-byte file",
                t.name,
                t.offset,
                t.n_bytes,
                self.bytes().len()
            )
        })
    }

    fn slice(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        self.bytes().get(start..end)
    }

    /// The stored bytes of row `row` of a tensor; `None` past the last row.
    pub fn tensor_row_data(&self, t: &TensorInfo, row: u64) -> Option<&[u8]> {
        if row >= t.n_rows() {
            return None;
        }
        let rb = t.row_bytes();
        self.slice(t.offset.checked_add(row.checked_mul(rb)?)?, rb)
    }

    /// The whole tensor as f32 (see [`Self::tensor_data`] for the panics).
    pub fn dequantize_tensor(&self, t: &TensorInfo) -> Vec<f32> {
        let n = usize::try_from(t.n_elements).unwrap_or(usize::MAX);
        quant::dequantize_to_vec(t.ty, self.tensor_data(t), n)
    }

    /// Row `row` of a tensor as f32; `None` past the last row.
    pub fn dequantize_row(&self, t: &TensorInfo, row: u64) -> Option<Vec<f32>> {
        let data = self.tensor_row_data(t, row)?;
        let n = usize::try_from(t.row_len()).ok()?;
        Some(quant::dequantize_to_vec(t.ty, data, n))
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn get_with<'a, T>(
        &'a self,
        key: &str,
        what: &str,
        f: impl FnOnce(&'a MetaValue) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match f(v) {
                Some(x) => Ok(Some(x)),
                None => Err(bad_meta(
                    key,
                    format!("expected {what}, found {}", describe(v)),
                )),
            },
        }
    }

    /// Any integer type that fits u64 (negative values are an error).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get_with(key, "an unsigned integer", MetaValue::as_u64)
    }
    /// Any float or integer type as f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.get_with(key, "a number", MetaValue::as_f32)
    }
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.get_with(key, "a bool", MetaValue::as_bool)
    }
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.get_with(key, "a string", MetaValue::as_str)
    }
    /// Any array, elements as stored.
    pub fn get_array(&self, key: &str) -> Result<Option<&[MetaValue]>, GgufError> {
        self.get_with(key, "an array", MetaValue::as_array)
    }
    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        self.get(key)
            .map(|v| convert_array(key, v, "strings", MetaValue::as_str))
            .transpose()
    }
    /// An array of numbers as f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        self.get(key)
            .map(|v| convert_array(key, v, "numbers", MetaValue::as_f32))
            .transpose()
    }
    /// An array of integers as i64 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        self.get(key)
            .map(|v| convert_array(key, v, "integers", MetaValue::as_i64))
            .transpose()
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

/// A read that ran past the end: where it started and how many bytes it wanted.
#[derive(Debug, Clone, Copy)]
struct Short {
    offset: u64,
    needed: u64,
}

/// A bounds-checked little-endian reader over the file bytes.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn pos(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Short> {
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

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let at = self.pos();
        let s = self.take(N as u64)?;
        <[u8; N]>::try_from(s).map_err(|_| Short {
            offset: at,
            needed: N as u64,
        })
    }
}

/// What the parser found, before it is joined with the bytes it came from.
struct Parsed {
    version: u32,
    alignment: u64,
    data_offset: u64,
    file_len: u64,
    metadata: HashMap<String, MetaValue>,
    metadata_order: Vec<String>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

struct Parser<'a> {
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
    fn new(buf: &'a [u8]) -> Self {
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
        let start = self.cur.pos();
        let n = self.u64(|| format!("{} length", field()))?;
        let r = self.cur.take(n);
        let bytes = self.ctx(r, &field)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                field: field(),
                offset: start,
            }),
        }
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

    fn parse(mut self) -> Result<Parsed, GgufError> {
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
        let prealloc = |count: u64| count.min(MAX_PREALLOC) as usize;
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
            let value = self.value(ty, ty_at, &key, 0)?;
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

    /// One metadata value of type `ty` (read at `ty_at`); `depth` is 1 inside an array.
    fn value(
        &mut self,
        ty: u32,
        ty_at: u64,
        key: &str,
        depth: u32,
    ) -> Result<MetaValue, GgufError> {
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
            ARRAY => self.array_value(key, depth)?,
            _ => {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    offset: ty_at,
                    ty,
                });
            }
        })
    }

    fn array_value(&mut self, key: &str, depth: u32) -> Result<MetaValue, GgufError> {
        let elem_at = self.cur.pos();
        let elem = self.u32(|| format!("metadata {key:?} array element type"))?;
        let Some(min_size) = value_type::min_size(elem) else {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                offset: elem_at,
                ty: elem,
            });
        };
        if elem == value_type::ARRAY && depth >= 1 {
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
        let mut items = Vec::with_capacity(count.min(MAX_PREALLOC) as usize);
        for _ in 0..count {
            items.push(self.value(elem, elem_at, key, depth.saturating_add(1))?);
        }
        Ok(MetaValue::Array(items))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", MetaValue::String("llama".into()))
            .meta("llama.block_count", MetaValue::U32(2))
            .meta("llama.rope.freq_base", MetaValue::F32(10000.0))
            .meta("flag", MetaValue::Bool(true))
            .meta("neg", MetaValue::I32(-5))
            .meta(
                "tokens",
                MetaValue::Array(vec![
                    MetaValue::String("a".into()),
                    MetaValue::String("bc".into()),
                ]),
            )
            .meta(
                "scores",
                MetaValue::Array(vec![MetaValue::F32(0.5), MetaValue::F32(-1.0)]),
            )
            .meta(
                "types",
                MetaValue::Array(vec![MetaValue::I32(1), MetaValue::I32(3)]),
            )
            .meta(
                "nested",
                MetaValue::Array(vec![
                    MetaValue::Array(vec![MetaValue::U8(1)]),
                    MetaValue::Array(vec![]),
                ]),
            )
            .meta("empty", MetaValue::Array(vec![]));
        let a: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 8.0).collect();
        w.tensor_f32("a", &[32, 2], GgmlType::Q8_0, &a)
            .tensor_f32("b", &[3], GgmlType::F32, &[1.0, 2.0, 3.0])
            .tensor_f32("c", &[32], GgmlType::Q4_1, &a[..32]);
        w
    }

    #[test]
    fn writer_round_trip() {
        let bytes = sample().to_bytes();
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.data_offset % 32, 0);
        assert_eq!(f.file_len % 32, 0);
        assert_eq!(f.metadata_order.len(), 10);
        assert_eq!(f.metadata_order[0], "general.architecture");
        assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
        assert_eq!(f.get_u64("llama.block_count").unwrap(), Some(2));
        assert_eq!(f.get_f32("llama.block_count").unwrap(), Some(2.0));
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), Some(10000.0));
        assert_eq!(f.get_bool("flag").unwrap(), Some(true));
        assert_eq!(f.get_str_array("tokens").unwrap(), Some(vec!["a", "bc"]));
        assert_eq!(f.get_f32_array("scores").unwrap(), Some(vec![0.5, -1.0]));
        assert_eq!(f.get_i64_array("types").unwrap(), Some(vec![1, 3]));
        assert_eq!(f.get_f32_array("types").unwrap(), Some(vec![1.0, 3.0]));
        assert_eq!(f.get_str_array("empty").unwrap(), Some(vec![]));
        assert_eq!(f.get_array("nested").unwrap().map(|a| a.len()), Some(2));

        // Absent keys.
        assert_eq!(f.get_u64("missing").unwrap(), None);
        assert_eq!(f.get_str_array("missing").unwrap(), None);
        // Wrong types.
        assert!(matches!(
            f.get_u64("neg"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_u64("general.architecture"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_str("llama.block_count"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_bool("llama.block_count"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_f32("flag"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_str_array("scores"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_i64_array("scores"),
            Err(GgufError::BadMetadata { .. })
        ));
        assert!(matches!(
            f.get_f32_array("flag"),
            Err(GgufError::BadMetadata { .. })
        ));
        let err = f.get_str_array("nested").unwrap_err().to_string();
        assert!(err.contains("element 0"), "{err}");

        assert_eq!(f.tensors.len(), 3);
        let a = f.tensor("a").unwrap();
        assert_eq!(a.dims, vec![32, 2]);
        assert_eq!(a.ty, GgmlType::Q8_0);
        assert_eq!(
            (
                a.n_elements,
                a.n_bytes,
                a.row_len(),
                a.n_rows(),
                a.row_bytes()
            ),
            (64, 68, 32, 2, 34)
        );
        assert_eq!(a.offset, f.data_offset + a.rel_offset);
        let av = f.dequantize_tensor(a);
        assert!((av[63] - 7.75).abs() < 0.05);
        assert_eq!(f.dequantize_row(a, 1).unwrap(), av[32..].to_vec());
        assert!(f.dequantize_row(a, 2).is_none());
        let b = f.tensor("b").unwrap();
        assert_eq!(b.rel_offset, 96);
        assert_eq!(f.dequantize_tensor(b), vec![1.0, 2.0, 3.0]);
        assert_eq!(f.tensor("c").unwrap().rel_offset, 128);
        assert!(f.tensor("d").is_none());
    }

    #[test]
    fn version_2_and_custom_alignment() {
        let mut w = sample();
        w.version(2).meta(ALIGNMENT_KEY, MetaValue::U64(256));
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.version, 2);
        assert_eq!(f.alignment, 256);
        assert_eq!(f.data_offset % 256, 0);
        for t in &f.tensors {
            assert_eq!(t.rel_offset % 256, 0);
        }
        assert_eq!(
            f.dequantize_tensor(f.tensor("b").unwrap()),
            vec![1.0, 2.0, 3.0]
        );

        // An alignment of 1 packs the data with no padding at all.
        let mut w = sample();
        w.meta(ALIGNMENT_KEY, MetaValue::U8(1));
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.alignment, 1);
        assert_eq!(f.tensor("b").unwrap().rel_offset, 68);
    }

    #[test]
    fn alignment_of_wrong_type() {
        let mut w = GgufWriter::new();
        w.meta(ALIGNMENT_KEY, MetaValue::String("32".into()));
        let err = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
        assert!(
            matches!(err, GgufError::BadMetadata { ref key, .. } if key == ALIGNMENT_KEY),
            "{err}"
        );
    }

    #[test]
    fn empty_file_and_header_only() {
        assert!(matches!(
            GgufFile::from_bytes(Vec::new()),
            Err(GgufError::Truncated {
                offset: 0,
                needed: 4,
                ..
            })
        ));
        let bytes = GgufWriter::new().to_bytes();
        assert_eq!(bytes.len(), 32);
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(
            (f.tensors.len(), f.metadata.len(), f.data_offset),
            (0, 0, 32)
        );
    }

    #[test]
    fn doubly_nested_array_is_rejected() {
        let mut w = GgufWriter::new();
        w.meta(
            "deep",
            MetaValue::Array(vec![MetaValue::Array(vec![MetaValue::Array(vec![])])]),
        );
        let err = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
        assert!(
            matches!(err, GgufError::NestedArray { ref key, .. } if key == "deep"),
            "{err}"
        );
    }

    #[test]
    fn cursor_is_bounds_checked() {
        let buf = [1u8, 2, 3];
        let mut c = Cursor { buf: &buf, pos: 0 };
        assert!(c.take(u64::MAX).is_err());
        assert_eq!(c.array::<2>().unwrap(), [1, 2]);
        let short = c.array::<2>().unwrap_err();
        assert_eq!((short.offset, short.needed), (2, 2));
        assert_eq!(c.remaining(), 1);
        assert_eq!(c.take(1).unwrap(), &[3]);
        assert_eq!(c.take(0).unwrap(), &[] as &[u8]);
        assert!(c.take(1).is_err());
    }

    #[test]
    fn errors_name_field_and_offset() {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", MetaValue::String("llama".into()));
        let mut bytes = w.to_bytes();
        // Cut inside the key's 20 bytes, which start at byte 32 after its length.
        bytes.truncate(40);
        let err = GgufFile::from_bytes(bytes).unwrap_err();
        assert!(
            matches!(err, GgufError::Truncated { ref field, offset: 32, needed: 20, len: 40 } if field == "metadata key #0"),
            "{err:?}"
        );
        assert!(err.to_string().contains("byte 32"), "{err}");
    }
}
