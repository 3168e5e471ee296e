//! The attention KV cache on flash.
//!
//! [`pages`] decides where each page lives (device home slots or the stream pool) and builds the
//! page lists attention reads.
//! [`store`] keeps a run's KV pages (P tokens of one layer of one sequence each) in a page file:
//! written once when full, read back many times. [`session`] saves the tokens and pages of a
//! conversation to a file that a later run loads instead of recomputing the shared prefix.
//! [`prefix`] names full pages by a SHA-256 chain over their tokens, so requests that share a
//! prompt prefix reuse its pages. [`select`] ranks pages for page selection from their scores.

pub mod pages;
pub mod prefix;
pub mod select;
pub mod session;
pub mod store;

use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// Errors of the KV page file ([`store::KvStore`]).
#[derive(Debug, Error)]
pub enum KvError {
    #[error("invalid KV layout: {0}")]
    BadLayout(String),
    #[error("KV {what} {value} is out of range (there are {limit})")]
    OutOfRange {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("KV page buffer holds {got} bytes, expected {expected}")]
    BadLength { expected: u64, got: u64 },
    #[error("KV page {page} of layer {layer}, sequence {seq} is already written")]
    AlreadyWritten { seq: u32, layer: u32, page: u32 },
    #[error("KV page {page} of layer {layer}, sequence {seq} has not been written")]
    NotWritten { seq: u32, layer: u32, page: u32 },
    #[error(
        "KV page {page} of layer {layer}, sequence {seq} read back with a wrong checksum (the page file is corrupt)"
    )]
    Checksum { seq: u32, layer: u32, page: u32 },
    #[error(
        "KV page {page} of layer {layer}, sequence {seq} was dropped or rewritten while it was being read"
    )]
    Raced { seq: u32, layer: u32, page: u32 },
    #[error("{op} KV page file {} at offset {offset} failed: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "KV page file {}: the filesystem does not support direct I/O ({reason}); use --io mmap",
        path.display()
    )]
    DirectUnsupported { path: PathBuf, reason: String },
    #[error(
        "KV page file {} shrank to {len} bytes (expected {expected}) while in use",
        path.display()
    )]
    Shrunk {
        path: PathBuf,
        len: u64,
        expected: u64,
    },
}

/// Errors of saved sessions ([`session`]).
#[derive(Debug, Error)]
pub enum SessionError {
    #[error("{op} session file {} failed: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a flashlm session file (bad magic)", path.display())]
    BadMagic { path: PathBuf },
    #[error(
        "session file {} has format version {found}; this build reads version {supported}",
        path.display()
    )]
    Version {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error(
        "session file {} is truncated: {len} bytes, the header implies {expected}",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        len: u64,
        expected: u64,
    },
    #[error("session file {} is corrupt: {what}", path.display())]
    Corrupt { path: PathBuf, what: String },
    #[error(
        "the saved session does not match this run: {field} differs (saved {saved}, now {current})"
    )]
    Mismatch {
        field: &'static str,
        saved: String,
        current: String,
    },
    #[error("session {what} {value} is out of range (there are {limit})")]
    OutOfRange {
        what: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("session page buffer holds {got} bytes, expected {expected}")]
    BadLength { expected: u64, got: u64 },
    #[error("cannot save session: {0}")]
    Invalid(String),
    #[error("producing KV page {page} of layer {layer} for the session failed: {source}")]
    Page {
        layer: u32,
        page: u32,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("injected fault: {0}")]
    Fault(String),
}
