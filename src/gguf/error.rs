//! The errors of the GGUF reader.

use thiserror::Error;

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
    #[error(
        "{path}: the file shrank from {expected} to {found} bytes while open (truncated or rewritten in place)"
    )]
    FileShrunk {
        path: String,
        expected: u64,
        found: u64,
    },
    #[error("read of {len} bytes at byte {offset} lies past the end of the {file_len}-byte file")]
    ReadOutOfBounds {
        offset: u64,
        len: u64,
        file_len: u64,
    },
}

pub(crate) fn bad_meta(key: &str, problem: String) -> GgufError {
    GgufError::BadMetadata {
        key: key.to_owned(),
        problem,
    }
}
