//! Errors of the flash reader ([`FlashError`]) and what changed about a file after it was
//! opened ([`FileChange`]).

use std::fmt;
use std::io;
use std::path::PathBuf;

use thiserror::Error;

/// What changed about a file after it was opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileChange {
    Shrunk { from: u64, to: u64 },
    Vanished,
    Replaced,
}

impl fmt::Display for FileChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileChange::Shrunk { from, to } => {
                write!(f, "it shrank from {from} to {to} bytes")
            }
            FileChange::Vanished => f.write_str("it was removed"),
            FileChange::Replaced => f.write_str("it was replaced by another file"),
        }
    }
}

/// Errors of the flash reader.
#[derive(Debug, Error)]
pub enum FlashError {
    #[error("{op} {} at offset {offset} failed: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        offset: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "read of {len} bytes at offset {offset} is outside {} ({file_len} bytes)",
        path.display()
    )]
    OutOfRange {
        path: PathBuf,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error(
        "short read from {}: got {got} of {wanted} bytes at offset {offset}",
        path.display()
    )]
    ShortRead {
        path: PathBuf,
        offset: u64,
        wanted: u64,
        got: u64,
    },
    #[error("{} changed after it was opened: {change}", path.display())]
    FileChanged { path: PathBuf, change: FileChange },
    #[error(
        "{}: the filesystem does not support direct I/O ({reason}); use --io mmap",
        path.display()
    )]
    DirectUnsupported { path: PathBuf, reason: String },
    #[error("invalid reader options: {0}")]
    InvalidOptions(String),
    #[error("{0}")]
    Unsupported(String),
}
