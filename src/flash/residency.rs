//! Memory residency: how much of a file the page cache holds ([`page_cache_residency`]),
//! dropping it from the page cache so benchmarks start cold ([`evict_page_cache`]), and this
//! process's peak resident memory ([`peak_rss_bytes`]).

use std::fs::File;
use std::io;
use std::path::Path;

use serde::Serialize;

use super::FlashError;

/// Residency above this fraction after an eviction means the eviction did not take effect.
pub const EVICTION_THRESHOLD: f64 = 0.05;

/// This process's peak resident memory (`VmHWM`), in bytes, where /proc tells it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Fractions of a file's pages in the page cache before and after an eviction.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Residency {
    pub before: f64,
    pub after: f64,
}

impl Residency {
    /// Whether the eviction took effect (at most [`EVICTION_THRESHOLD`] of the pages remain).
    pub fn effective(&self) -> bool {
        self.after <= EVICTION_THRESHOLD
    }
}

/// Open `path` for reading (page-cache queries and hints).
fn open_plain(path: &Path) -> Result<File, FlashError> {
    File::open(path).map_err(|e| FlashError::Io {
        op: "opening",
        path: path.to_path_buf(),
        offset: 0,
        source: e,
    })
}

/// Fraction of `path`'s pages resident in the page cache (mincore over a fresh map).
pub fn page_cache_residency(path: impl AsRef<Path>) -> Result<f64, FlashError> {
    let path = path.as_ref();
    let file = open_plain(path)?;
    residency_of(path, &file)
}

#[cfg(unix)]
fn residency_of(path: &Path, file: &File) -> Result<f64, FlashError> {
    let io_err = |op, source| FlashError::Io {
        op,
        path: path.to_path_buf(),
        offset: 0,
        source,
    };
    let len = file.metadata().map_err(|e| io_err("inspecting", e))?.len();
    if len == 0 {
        return Ok(0.0);
    }
    // SAFETY: the map is never read; mincore only inspects page-table state.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| io_err("mapping", e))?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = if page > 0 { page as usize } else { 4096 };
    let n = map.len().div_ceil(page);
    let mut vec = vec![0u8; n];
    // SAFETY: the address is the page-aligned start of a live map of `map.len()` bytes and
    // `vec` holds one byte per page of it.
    let r = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr() as *mut _,
        )
    };
    if r != 0 {
        return Err(io_err("checking residency of", io::Error::last_os_error()));
    }
    let resident = vec.iter().filter(|&&v| v & 1 != 0).count();
    Ok(resident as f64 / n as f64)
}

#[cfg(not(unix))]
fn residency_of(_path: &Path, _file: &File) -> Result<f64, FlashError> {
    Err(FlashError::Unsupported(
        "page-cache residency is not available on this platform".into(),
    ))
}

/// Drop `path`'s pages from the page cache (posix_fadvise(DONTNEED) over the whole file, no
/// fsync) and measure residency before and after. Dirty pages, pages mapped by a process, or a
/// platform without the call leave pages behind: check [`Residency::effective`].
pub fn evict_page_cache(path: impl AsRef<Path>) -> Result<Residency, FlashError> {
    let path = path.as_ref();
    let file = open_plain(path)?;
    let before = residency_of(path, &file)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: fadvise on a descriptor we own; it only drops clean cached pages.
        let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if r != 0 {
            return Err(FlashError::Io {
                op: "evicting",
                path: path.to_path_buf(),
                offset: 0,
                source: io::Error::from_raw_os_error(r),
            });
        }
    }
    let after = residency_of(path, &file)?;
    Ok(Residency { before, after })
}
