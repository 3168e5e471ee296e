//! Saved sessions: the tokens in the KV cache, the KV pages of every layer and an identity
//! record, so a later run whose prompt shares a prefix loads those pages instead of
//! recomputing them.
//!
//! # File format (version 1, little-endian)
//!
//! | offset | bytes | field |
//! |-------:|------:|-------|
//! | 0   | 8  | magic `FLMKVSES` |
//! | 8   | 4  | format version (1) |
//! | 12  | 4  | flags (0) |
//! | 16  | 32 | model hash ([`model_hash`]) |
//! | 48  | 4  | `page_tokens` (≥ 1) |
//! | 52  | 4  | `n_layers` (≥ 1) |
//! | 56  | 8  | `page_bytes` (1 ..= 1 GiB) |
//! | 64  | 8  | `n_tokens` |
//! | 72  | 4  | `n_pages` per layer, = ⌈n_tokens / page_tokens⌉ |
//! | 76  | 4  | `config_len` (≤ 1 MiB) |
//! | 80  | 4  | `kv_type_len` (≤ 4 KiB) |
//! | 84  | 4  | crc32 of the strings section |
//! | 88  | 4  | crc32 of the tokens section |
//! | 92  | 4  | crc32 of the page index section |
//! | 96  | 28 | reserved, zero |
//! | 124 | 4  | crc32 of bytes 0..124 (header checksum) |
//!
//! Then, packed: the strings section (`config` then `kv_type`, UTF-8, without terminators);
//! the tokens section (`n_tokens` × u32); the page index section (`n_layers × n_pages` × u32,
//! the crc32 of each page, layer-major); zero padding up to the next multiple of 4096, the
//! data offset; the pages (`n_layers × n_pages` × `page_bytes`, page `(l, p)` at
//! `data offset + (l × n_pages + p) × page_bytes`; the last page of a layer may be only partly
//! filled with tokens and is stored whole). The file ends there: its length is exactly what the
//! header implies.
//!
//! Saving writes a temporary file next to the target, syncs it, renames it over the target and
//! syncs the directory, so a crash at any point leaves the previous session intact.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

mod save;
pub use save::{PageError, PageFill, SaveFault, SaveStats, save};

use super::SessionError;
use super::store::MAX_PAGE_BYTES;
use crate::flash::direct::pread_full;

const MAGIC: &[u8; 8] = b"FLMKVSES";
/// The format version this build writes and reads.
pub const VERSION: u32 = 1;
const HEADER_BYTES: usize = 128;
const DATA_ALIGN: u64 = 4096;
/// Largest accepted config string.
pub const MAX_CONFIG_BYTES: u32 = 1 << 20;
/// Largest accepted KV type string.
pub const MAX_KV_TYPE_BYTES: u32 = 4096;

/// What a session was computed with; a session only resumes a run with the same identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionIdentity {
    pub model_hash: [u8; 32],
    pub config: String,
    pub kv_type: String,
    pub page_tokens: u32,
    pub n_layers: u32,
    pub page_bytes: u64,
}

/// SHA-256 over the model file's bytes before its tensor data (header, metadata, tensor table),
/// copied out in pieces with checked reads, so a file truncated under the process is an error
/// rather than a fault.
pub fn model_hash(gguf: &crate::gguf::GgufFile) -> Result<[u8; 32], crate::gguf::GgufError> {
    const PIECE: u64 = 1 << 20;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; PIECE.min(gguf.data_offset) as usize];
    let mut off = 0u64;
    while off < gguf.data_offset {
        let n = PIECE.min(gguf.data_offset - off) as usize;
        gguf.read_at(off, &mut buf[..n])?;
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok(h.finalize().into())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sizes of the sections of a session file.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    n_pages: u32,
    /// Pages of all layers.
    total_pages: u64,
    /// End of the page index section.
    meta_end: u64,
    data_offset: u64,
    file_bytes: u64,
}

/// Section sizes, or `None` when they overflow.
fn geometry(
    strings: u64,
    n_tokens: u64,
    n_pages: u32,
    n_layers: u32,
    page_bytes: u64,
) -> Option<Geometry> {
    let total_pages = u64::from(n_layers).checked_mul(n_pages.into())?;
    let meta_end = (HEADER_BYTES as u64)
        .checked_add(strings)?
        .checked_add(n_tokens.checked_mul(4)?)?
        .checked_add(total_pages.checked_mul(4)?)?;
    let data_offset = meta_end.checked_next_multiple_of(DATA_ALIGN)?;
    let file_bytes = data_offset.checked_add(total_pages.checked_mul(page_bytes)?)?;
    Some(Geometry {
        n_pages,
        total_pages,
        meta_end,
        data_offset,
        file_bytes,
    })
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> SessionError {
    SessionError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// An opened, validated session file.
#[derive(Debug)]
pub struct Session {
    path: PathBuf,
    file: File,
    file_bytes: u64,
    id: SessionIdentity,
    tokens: Vec<u32>,
    n_pages: u32,
    page_crcs: Vec<u32>,
    data_offset: u64,
}

/// A summary of a session file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SessionInfo {
    pub path: PathBuf,
    pub file_bytes: u64,
    pub tokens: u64,
    /// Pages per layer.
    pub pages: u32,
    pub n_layers: u32,
    pub page_tokens: u32,
    pub page_bytes: u64,
    pub kv_type: String,
    pub model_hash: String,
    pub config: String,
}

impl fmt::Display for SessionInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "session    {}", self.path.display())?;
        writeln!(
            f,
            "file       {} bytes ({})",
            self.file_bytes,
            crate::flash::format_size(self.file_bytes)
        )?;
        writeln!(f, "tokens     {}", self.tokens)?;
        writeln!(
            f,
            "pages      {} per layer × {} layers",
            self.pages, self.n_layers
        )?;
        writeln!(
            f,
            "page size  {} tokens, {} bytes",
            self.page_tokens, self.page_bytes
        )?;
        writeln!(f, "KV type    {}", self.kv_type)?;
        let short = self.model_hash.get(..16).unwrap_or(&self.model_hash);
        writeln!(f, "model      sha256 {short}…")?;
        write!(f, "config     {}", self.config)
    }
}

impl Session {
    /// Open and validate a session file: magic, version, header checksum, identity, tokens,
    /// page index, and that the file length is exactly what the header implies. Page data is
    /// verified as it is read ([`read_page`](Self::read_page)).
    pub fn open(path: &Path) -> Result<Self, SessionError> {
        let file = File::open(path).map_err(|e| io_err("opening", path, e))?;
        let len = file
            .metadata()
            .map_err(|e| io_err("inspecting", path, e))?
            .len();
        let corrupt = |what: String| SessionError::Corrupt {
            path: path.to_path_buf(),
            what,
        };
        let truncated = |expected: u64| SessionError::Truncated {
            path: path.to_path_buf(),
            len,
            expected,
        };
        let mut h = [0u8; HEADER_BYTES];
        let got = pread_full(&file, &mut h, 0).map_err(|e| io_err("reading", path, e))?;
        if got >= MAGIC.len() && &h[..MAGIC.len()] != MAGIC {
            return Err(SessionError::BadMagic {
                path: path.to_path_buf(),
            });
        }
        if got >= 12 && u32_at(&h, 8) != VERSION {
            return Err(SessionError::Version {
                path: path.to_path_buf(),
                found: u32_at(&h, 8),
                supported: VERSION,
            });
        }
        if got < HEADER_BYTES {
            return Err(truncated(HEADER_BYTES as u64));
        }
        if crc32fast::hash(&h[..HEADER_BYTES - 4]) != u32_at(&h, HEADER_BYTES - 4) {
            return Err(corrupt("the header checksum does not match".into()));
        }
        if u32_at(&h, 12) != 0 || h[96..HEADER_BYTES - 4].iter().any(|&b| b != 0) {
            return Err(corrupt("unknown flags or reserved bytes are set".into()));
        }
        let mut model_hash = [0u8; 32];
        model_hash.copy_from_slice(&h[16..48]);
        let page_tokens = u32_at(&h, 48);
        let n_layers = u32_at(&h, 52);
        let page_bytes = u64_at(&h, 56);
        let n_tokens = u64_at(&h, 64);
        let n_pages = u32_at(&h, 72);
        let config_len = u32_at(&h, 76);
        let kv_type_len = u32_at(&h, 80);
        if page_tokens == 0 || n_layers == 0 || page_bytes == 0 || page_bytes > MAX_PAGE_BYTES {
            return Err(corrupt(format!(
                "impossible page shape ({page_tokens} tokens, {n_layers} layers, {page_bytes} bytes)"
            )));
        }
        if u64::from(n_pages) != n_tokens.div_ceil(page_tokens.into()) {
            return Err(corrupt(format!(
                "{n_pages} pages cannot hold {n_tokens} tokens of {page_tokens} a page"
            )));
        }
        if config_len > MAX_CONFIG_BYTES || kv_type_len > MAX_KV_TYPE_BYTES {
            return Err(corrupt("identity strings are too long".into()));
        }
        let strings = u64::from(config_len) + u64::from(kv_type_len);
        let g = geometry(strings, n_tokens, n_pages, n_layers, page_bytes)
            .ok_or_else(|| corrupt("section sizes overflow".into()))?;
        if len < g.file_bytes {
            return Err(truncated(g.file_bytes));
        }
        if len > g.file_bytes {
            return Err(corrupt(format!(
                "{len} bytes where the header implies {}",
                g.file_bytes
            )));
        }
        // Everything between the header and the pages, bounded by the file's length.
        let meta_len = usize::try_from(g.data_offset - HEADER_BYTES as u64).map_err(|_| {
            corrupt("the token and page index sections do not fit in memory".into())
        })?;
        let mut meta = Vec::new();
        meta.try_reserve_exact(meta_len).map_err(|_| {
            corrupt("the token and page index sections do not fit in memory".into())
        })?;
        meta.resize(meta_len, 0);
        let got = pread_full(&file, &mut meta, HEADER_BYTES as u64)
            .map_err(|e| io_err("reading", path, e))?;
        if got < meta_len {
            return Err(truncated(g.file_bytes));
        }
        let (strings_b, rest) = meta.split_at(strings as usize);
        let (tok_b, rest) = rest.split_at(n_tokens as usize * 4);
        let (index_b, padding) = rest.split_at(g.total_pages as usize * 4);
        let section = |b: &[u8], at: usize, name: &str| {
            if crc32fast::hash(b) == u32_at(&h, at) {
                Ok(())
            } else {
                Err(corrupt(format!("the {name} checksum does not match")))
            }
        };
        section(strings_b, 84, "identity")?;
        section(tok_b, 88, "token")?;
        section(index_b, 92, "page index")?;
        if padding.iter().any(|&b| b != 0) {
            return Err(corrupt("padding before the pages is not zero".into()));
        }
        let (config_b, kv_b) = strings_b.split_at(config_len as usize);
        let text = |b: &[u8], name: &str| {
            String::from_utf8(b.to_vec()).map_err(|_| corrupt(format!("the {name} is not UTF-8")))
        };
        let id = SessionIdentity {
            model_hash,
            config: text(config_b, "config")?,
            kv_type: text(kv_b, "KV type")?,
            page_tokens,
            n_layers,
            page_bytes,
        };
        let words = |b: &[u8]| b.chunks_exact(4).map(|c| u32_at(c, 0)).collect();
        Ok(Session {
            path: path.to_path_buf(),
            file,
            file_bytes: len,
            id,
            tokens: words(tok_b),
            n_pages,
            page_crcs: words(index_b),
            data_offset: g.data_offset,
        })
    }

    /// [`SessionError::Mismatch`] naming the first field that differs from `current`.
    pub fn check_identity(&self, current: &SessionIdentity) -> Result<(), SessionError> {
        let s = &self.id;
        let c = current;
        let fields: [(&'static str, String, String); 6] = [
            ("model file", hex(&s.model_hash), hex(&c.model_hash)),
            ("config", s.config.clone(), c.config.clone()),
            ("KV type", s.kv_type.clone(), c.kv_type.clone()),
            (
                "page size (tokens)",
                s.page_tokens.to_string(),
                c.page_tokens.to_string(),
            ),
            ("layers", s.n_layers.to_string(), c.n_layers.to_string()),
            (
                "page bytes",
                s.page_bytes.to_string(),
                c.page_bytes.to_string(),
            ),
        ];
        match fields.into_iter().find(|(_, a, b)| a != b) {
            Some((field, saved, current)) => Err(SessionError::Mismatch {
                field,
                saved,
                current,
            }),
            None => Ok(()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn identity(&self) -> &SessionIdentity {
        &self.id
    }

    /// Pages per layer.
    pub fn n_pages(&self) -> u32 {
        self.n_pages
    }

    /// Read page `page` of `layer` into `dst` (`page_bytes` long), verifying its crc32.
    pub fn read_page(&self, layer: u32, page: u32, dst: &mut [u8]) -> Result<(), SessionError> {
        let range = |what, value: u32, limit: u32| {
            if value < limit {
                Ok(())
            } else {
                Err(SessionError::OutOfRange {
                    what,
                    value: value.into(),
                    limit: limit.into(),
                })
            }
        };
        range("layer", layer, self.id.n_layers)?;
        range("page", page, self.n_pages)?;
        if dst.len() as u64 != self.id.page_bytes {
            return Err(SessionError::BadLength {
                expected: self.id.page_bytes,
                got: dst.len() as u64,
            });
        }
        // Both in range: the page lies inside the file, whose length was checked at open.
        let k = u64::from(layer) * u64::from(self.n_pages) + u64::from(page);
        let offset = self.data_offset + k * self.id.page_bytes;
        let got =
            pread_full(&self.file, dst, offset).map_err(|e| io_err("reading", &self.path, e))?;
        if got < dst.len() {
            let len = self.file.metadata().map(|m| m.len()).unwrap_or(0);
            return Err(SessionError::Truncated {
                path: self.path.clone(),
                len,
                expected: self.file_bytes,
            });
        }
        if self.page_crcs.get(k as usize) != Some(&crc32fast::hash(dst)) {
            return Err(SessionError::Corrupt {
                path: self.path.clone(),
                what: format!("page {page} of layer {layer} does not match its checksum"),
            });
        }
        Ok(())
    }

    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            path: self.path.clone(),
            file_bytes: self.file_bytes,
            tokens: self.tokens.len() as u64,
            pages: self.n_pages,
            n_layers: self.id.n_layers,
            page_tokens: self.id.page_tokens,
            page_bytes: self.id.page_bytes,
            kv_type: self.id.kv_type.clone(),
            model_hash: hex(&self.id.model_hash),
            config: self.id.config.clone(),
        }
    }
}
