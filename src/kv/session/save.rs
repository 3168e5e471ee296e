//! Writing session files atomically (the format is described in the parent module).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::{
    Geometry, HEADER_BYTES, MAGIC, MAX_CONFIG_BYTES, MAX_KV_TYPE_BYTES, SessionIdentity, VERSION,
    geometry, io_err,
};
use crate::flash::direct::pwrite_all;
use crate::kv::SessionError;
use crate::kv::store::MAX_PAGE_BYTES;

/// Why a page could not be produced for [`save`].
pub type PageError = Box<dyn std::error::Error + Send + Sync>;

/// Fills the `page_bytes` of page `(layer, page)`: `fill(layer, page, buf)`.
pub type PageFill<'a> = dyn FnMut(u32, u32, &mut [u8]) -> Result<(), PageError> + 'a;

/// Fault injection for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaveFault {
    /// Stop writing after this many bytes as if the process died: the temporary file stays as
    /// it was and nothing is renamed. A save that needs fewer bytes is not affected.
    CrashAfterBytes(u64),
    /// Fail the step that syncs and renames the finished temporary file.
    FailRename,
}

/// What [`save`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SaveStats {
    /// Length of the session file.
    pub bytes: u64,
    pub tokens: u64,
    /// Pages of all layers.
    pub pages: u64,
}

/// Distinguishes the temporary files of one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The temporary file being written; counts bytes for [`SaveFault::CrashAfterBytes`].
struct TmpWriter {
    file: File,
    path: PathBuf,
    written: u64,
    limit: Option<u64>,
}

impl TmpWriter {
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> Result<(), SessionError> {
        let mut take = bytes.len();
        if let Some(limit) = self.limit {
            let left = limit.saturating_sub(self.written);
            take = take.min(usize::try_from(left).unwrap_or(usize::MAX));
        }
        pwrite_all(&self.file, &bytes[..take], offset)
            .map_err(|e| io_err("writing", &self.path, e))?;
        self.written += take as u64;
        if take < bytes.len() {
            return Err(SessionError::Fault(format!(
                "simulated crash after writing {} bytes of {}",
                self.written,
                self.path.display()
            )));
        }
        Ok(())
    }
}

fn check_identity_fields(id: &SessionIdentity) -> Result<(), SessionError> {
    let bad = |s: String| Err(SessionError::Invalid(s));
    if id.page_tokens == 0 || id.n_layers == 0 {
        return bad("page_tokens and n_layers must be at least 1".into());
    }
    if id.page_bytes == 0 || id.page_bytes > MAX_PAGE_BYTES {
        return bad(format!(
            "page_bytes must be between 1 and {MAX_PAGE_BYTES}, got {}",
            id.page_bytes
        ));
    }
    if id.config.len() > MAX_CONFIG_BYTES as usize {
        return bad(format!(
            "the config string is over {MAX_CONFIG_BYTES} bytes"
        ));
    }
    if id.kv_type.len() > MAX_KV_TYPE_BYTES as usize {
        return bad(format!(
            "the KV type string is over {MAX_KV_TYPE_BYTES} bytes"
        ));
    }
    Ok(())
}

fn put_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}

/// Save a session atomically: write `<dir>/.<name>.tmp-<pid>-<n>`, sync it, rename it over
/// `path`, sync the directory. A failure at any point leaves the previous file at `path`
/// intact and removes the temporary file when possible (an injected crash leaves it, as a
/// dead process would). `page(layer, page, buf)` fills the `page_bytes` of one page (the
/// buffer starts zeroed); there are ⌈tokens.len() / page_tokens⌉ pages per layer.
pub fn save(
    path: &Path,
    id: &SessionIdentity,
    tokens: &[u32],
    page: &mut PageFill<'_>,
    fault: Option<SaveFault>,
) -> Result<SaveStats, SessionError> {
    check_identity_fields(id)?;
    let n_tokens = tokens.len() as u64;
    let n_pages = u32::try_from(n_tokens.div_ceil(id.page_tokens.into()))
        .map_err(|_| SessionError::Invalid(format!("{n_tokens} tokens are too many pages")))?;
    let strings = (id.config.len() + id.kv_type.len()) as u64;
    let g = geometry(strings, n_tokens, n_pages, id.n_layers, id.page_bytes)
        .ok_or_else(|| SessionError::Invalid("the session does not fit in a file".into()))?;
    let name = path
        .file_name()
        .ok_or_else(|| SessionError::Invalid(format!("{} names no file", path.display())))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}-{n}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| io_err("creating", &tmp, e))?;
    let limit = match fault {
        Some(SaveFault::CrashAfterBytes(n)) => Some(n),
        _ => None,
    };
    let mut w = TmpWriter {
        file,
        path: tmp,
        written: 0,
        limit,
    };
    let result = write_body(&mut w, id, tokens, page, &g).and_then(|()| {
        w.file
            .sync_all()
            .map_err(|e| io_err("syncing", &w.path, e))?;
        if fault == Some(SaveFault::FailRename) {
            return Err(SessionError::Fault(format!(
                "renaming {} failed",
                w.path.display()
            )));
        }
        std::fs::rename(&w.path, path).map_err(|e| io_err("renaming over", path, e))
    });
    if let Err(e) = result {
        if !matches!(e, SessionError::Fault(_)) || fault == Some(SaveFault::FailRename) {
            let _ = std::fs::remove_file(&w.path);
        }
        return Err(e);
    }
    sync_dir(dir)?;
    Ok(SaveStats {
        bytes: g.file_bytes,
        tokens: n_tokens,
        pages: g.total_pages,
    })
}

/// Make a rename in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), SessionError> {
    #[cfg(unix)]
    {
        let d = File::open(dir).map_err(|e| io_err("opening the directory of", dir, e))?;
        d.sync_all()
            .map_err(|e| io_err("syncing the directory of", dir, e))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Write the pages, then the header, strings, tokens, index and padding.
fn write_body(
    w: &mut TmpWriter,
    id: &SessionIdentity,
    tokens: &[u32],
    page: &mut PageFill<'_>,
    g: &Geometry,
) -> Result<(), SessionError> {
    let page_len = usize::try_from(id.page_bytes)
        .map_err(|_| SessionError::Invalid("page_bytes does not fit in memory".into()))?;
    let mut buf = vec![0u8; page_len];
    let mut index = Vec::new();
    // Four bytes per page, bounded by the file size computed above.
    let index_len = usize::try_from(g.total_pages.saturating_mul(4))
        .map_err(|_| SessionError::Invalid("the page index does not fit in memory".into()))?;
    index
        .try_reserve_exact(index_len)
        .map_err(|_| SessionError::Invalid("the page index does not fit in memory".into()))?;
    let mut offset = g.data_offset;
    for layer in 0..id.n_layers {
        for p in 0..g.n_pages {
            buf.fill(0);
            page(layer, p, &mut buf).map_err(|source| SessionError::Page {
                layer,
                page: p,
                source,
            })?;
            put_u32(&mut index, crc32fast::hash(&buf));
            w.write_at(offset, &buf)?;
            offset += id.page_bytes;
        }
    }
    let mut tok = Vec::with_capacity(tokens.len().saturating_mul(4));
    for &t in tokens {
        put_u32(&mut tok, t);
    }
    let mut strings = id.config.as_bytes().to_vec();
    strings.extend_from_slice(id.kv_type.as_bytes());

    let mut h = Vec::with_capacity(g.data_offset as usize);
    h.extend_from_slice(MAGIC);
    put_u32(&mut h, VERSION);
    put_u32(&mut h, 0);
    h.extend_from_slice(&id.model_hash);
    put_u32(&mut h, id.page_tokens);
    put_u32(&mut h, id.n_layers);
    h.extend_from_slice(&id.page_bytes.to_le_bytes());
    h.extend_from_slice(&(tokens.len() as u64).to_le_bytes());
    put_u32(&mut h, g.n_pages);
    // Both checked against their (u32) limits above.
    put_u32(&mut h, id.config.len() as u32);
    put_u32(&mut h, id.kv_type.len() as u32);
    put_u32(&mut h, crc32fast::hash(&strings));
    put_u32(&mut h, crc32fast::hash(&tok));
    put_u32(&mut h, crc32fast::hash(&index));
    h.resize(HEADER_BYTES - 4, 0);
    let crc = crc32fast::hash(&h);
    put_u32(&mut h, crc);
    h.extend_from_slice(&strings);
    h.extend_from_slice(&tok);
    h.extend_from_slice(&index);
    debug_assert_eq!(h.len() as u64, g.meta_end);
    h.resize(g.data_offset as usize, 0);
    w.write_at(0, &h)
}
