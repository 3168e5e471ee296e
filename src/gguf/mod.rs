//! GGUF (v2 and v3) reader over a memory map.
//!
//! Every count, length, offset and size read from the file is treated as hostile: it is checked
//! against the bytes that remain and against integer overflow before anything is allocated or
//! sliced. A malformed file yields a [`GgufError`] that names the field and its byte offset.
//! Metadata costs about its size in the file: arrays are kept as typed vectors ([`MetaArray`]).
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
//!
//! # A file that changes while open
//!
//! [`GgufFile::open`] memory-maps the file. Reading a page of a map whose file was truncated
//! since kills the process with `SIGBUS`, so tensor bytes are read through checked accessors:
//! [`GgufFile::read_at`] copies with `pread` (a shrunk file is an error, never a signal) and
//! [`GgufFile::try_tensor_data`] checks the file's current size before handing out a slice of
//! the map. [`GgufFile::tensor_data`] and [`GgufFile::bytes`] do not check.

mod access;
mod error;
mod parse;
pub mod quant;
mod value;
pub mod writer;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::Path;

pub use error::GgufError;
pub use quant::{GgmlType, dequantize, ggml_type_name, quantize};
pub use value::{MetaArray, MetaValue, StrArray, StrArrayBuilder};
pub use writer::GgufWriter;

use error::bad_meta;
use value::describe;

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

    /// A short name of type `ty`, for messages.
    pub fn name(ty: u32) -> &'static str {
        match ty {
            UINT8 => "u8",
            INT8 => "i8",
            UINT16 => "u16",
            INT16 => "i16",
            UINT32 => "u32",
            INT32 => "i32",
            FLOAT32 => "f32",
            BOOL => "bool",
            STRING => "string",
            ARRAY => "array",
            UINT64 => "u64",
            INT64 => "i64",
            FLOAT64 => "f64",
            _ => "unknown",
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
    /// The file's length when it was parsed.
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
    /// A map of the file, with the open file (for its current size and for `pread`).
    Mapped {
        map: memmap2::Mmap,
        file: std::fs::File,
        path: String,
    },
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped { map, .. } => map,
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

/// Converts each element of an array value, naming the first one that does not fit.
fn convert_array<T>(
    key: &str,
    value: &MetaValue,
    what: &str,
    f: impl Fn(&MetaArray, usize) -> Option<T>,
) -> Result<Vec<T>, GgufError> {
    let Some(items) = value.as_array() else {
        return Err(bad_meta(
            key,
            format!("expected an array of {what}, found {}", describe(value)),
        ));
    };
    (0..items.len())
        .map(|i| {
            f(items, i).ok_or_else(|| {
                let found = items
                    .get(i)
                    .map_or_else(|| "nothing".to_owned(), |v| describe(&v));
                bad_meta(key, format!("element {i}: expected {what}, found {found}"))
            })
        })
        .collect()
}

impl GgufFile {
    /// Memory-map and parse a file.
    ///
    /// The map is read-only. Read tensor bytes with [`Self::read_at`] or
    /// [`Self::try_tensor_data`], which notice a file truncated since it was opened (reading a
    /// truncated map directly kills the process with `SIGBUS`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is only ever read, through bounds-checked slices. A file truncated
        // under the map is the one hazard left: see the module documentation.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::parse(Bytes::Mapped {
            map,
            file,
            path: path.display().to_string(),
        })
    }

    /// Parse an in-memory copy (tests, crafted files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::parse(Bytes::Owned(bytes))
    }

    fn parse(bytes: Bytes) -> Result<Self, GgufError> {
        let h = parse::Parser::new(bytes.as_slice()).parse()?;
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

    /// Drop this process's mapping of the file's pages (they are read again from the file on
    /// next use), so the page cache can evict them. No-op for in-memory files.
    pub fn release_pages(&self) {
        #[cfg(unix)]
        if let Bytes::Mapped { map, .. } = &self.bytes {
            // SAFETY: the map is read-only and file-backed; after DONTNEED the next access
            // reads the same bytes from the file again, so no reference observes a change.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    }

    /// The whole file, unchecked.
    ///
    /// For a mapped file, reading a part that was truncated away since [`Self::open`] raises
    /// `SIGBUS`; prefer [`Self::read_at`] or [`Self::header_bytes`].
    pub fn bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
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
    pub fn get_array(&self, key: &str) -> Result<Option<&MetaArray>, GgufError> {
        self.get_with(key, "an array", MetaValue::as_array)
    }
    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        if let Some(MetaArray::String(s)) = v.as_array() {
            return Ok(Some(s.iter().collect()));
        }
        convert_array(key, v, "strings", |_, _| None::<&str>).map(Some)
    }
    /// An array of numbers as f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        self.get(key)
            .map(|v| convert_array(key, v, "numbers", MetaArray::number_f32))
            .transpose()
    }
    /// An array of integers as i64 (e.g. `tokenizer.ggml.token_type`).
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        self.get(key)
            .map(|v| convert_array(key, v, "integers", MetaArray::integer_i64))
            .transpose()
    }
}
