//! The flash reader: [`FlashFile`], a model file read by offset from many threads, and how it
//! reads ([`IoMode`], [`ReaderOptions`]): opening, counters, injected faults, change checks and
//! madvise hints. The read path itself (pieces, threads, bounce buffers) is in [`read`].

mod read;

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::pool::ReaderPool;
use super::sys::{AlignedBuf, DIRECT_ALIGN, Identity, einval, identity, open_direct};
use super::{FileChange, FlashError};

/// Largest `chunk` accepted by [`FlashFile::open`].
pub const MAX_CHUNK: usize = 1 << 30;

/// How the file is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// Memory-map the file and copy from the map (the page cache serves repeated reads).
    Mmap,
    /// Read with the page cache bypassed.
    Direct,
}

impl FromStr for IoMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mmap" => Ok(IoMode::Mmap),
            "direct" => Ok(IoMode::Direct),
            _ => Err(format!(
                "unknown I/O mode {s:?}: expected \"mmap\" (memory-mapped, through the page cache) or \"direct\" (bypassing the page cache)"
            )),
        }
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoMode::Mmap => "mmap",
            IoMode::Direct => "direct",
        })
    }
}

/// How a [`FlashFile`] reads.
///
/// The default is direct I/O, 4 threads, 1 MiB pieces. `flashlm bench io` (64 MiB of model
/// data, verified-cold page cache, three runs on the development VM: virtio disk, ext4, 2
/// cores) gave:
/// - direct I/O is bound by per-request cost below 256 KiB (4 KiB: 0.05–0.2 GB/s, 64 KiB:
///   0.4–0.86 GB/s) and flat from 256 KiB–1 MiB up (0.73–1.08 GB/s at 1 MiB; 4 and 8 threads
///   0.1–0.2 GB/s above 1 thread); 4 threads × 1 MiB was within the run-to-run noise of the
///   best setting (8 threads, 256 KiB–4 MiB) while a 4 MiB staging-ring chunk still splits
///   into one piece per thread, and it keeps the bounce buffers at 4 × 1 MiB;
/// - mmap from a cold cache stayed at 0.6–0.9 GB/s at every setting (page-fault and readahead
///   bound), below direct's plateau, and it fills the page cache with bytes the staging ring
///   copies once; the raw buffered cold read was 0.74–1.2 GB/s.
///
/// Use `mmap` where the filesystem refuses direct I/O or the model fits in RAM and is read
/// many times (the page cache then serves repeats at memory speed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderOptions {
    pub mode: IoMode,
    /// Most threads one read uses (1: the calling thread only).
    pub threads: usize,
    /// Bytes per piece a thread reads at a time. Pieces start at multiples of `chunk` in the
    /// file; in direct mode `chunk` is rounded up to a multiple of 4 KiB.
    pub chunk: usize,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        Self {
            mode: IoMode::Direct,
            threads: 4,
            chunk: 1 << 20,
        }
    }
}

/// Faults the tests can inject into a [`FlashFile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashFault {
    /// A read covering file offset `at` stops there with a short-read error.
    ShortRead { at: u64 },
    /// A read covering file offset `at` fails with an I/O error.
    IoError { at: u64 },
}

/// A model file on flash, read by offset from many threads.
pub struct FlashFile {
    path: PathBuf,
    file: File,
    len: u64,
    id: Option<Identity>,
    opts: ReaderOptions,
    /// Piece size actually used (rounded to [`DIRECT_ALIGN`] in direct mode).
    piece: usize,
    map: Option<memmap2::Mmap>,
    bounce: Mutex<Vec<AlignedBuf>>,
    faults: Mutex<Vec<FlashFault>>,
    bytes_read: AtomicU64,
    reads: AtomicU64,
    /// Bytes direct reads copied out of bounce buffers (destinations not placed as their file
    /// offsets sit within a page).
    bounced: AtomicU64,
    /// The reader threads beside the caller (`threads` - 1), started by the first read that
    /// splits; None where they could not be started (reads then stay on the caller).
    pool: OnceLock<Option<ReaderPool>>,
}

impl fmt::Debug for FlashFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlashFile")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl FlashFile {
    /// Open `path` for reading in the given mode.
    pub fn open(path: impl AsRef<Path>, opts: ReaderOptions) -> Result<Self, FlashError> {
        let path = path.as_ref().to_path_buf();
        if opts.chunk == 0 || opts.chunk > MAX_CHUNK {
            return Err(FlashError::InvalidOptions(format!(
                "chunk must be between 1 byte and {MAX_CHUNK} bytes, got {}",
                opts.chunk
            )));
        }
        if opts.threads == 0 || opts.threads > 256 {
            return Err(FlashError::InvalidOptions(format!(
                "threads must be between 1 and 256, got {}",
                opts.threads
            )));
        }
        let io_err = |op: &'static str, source: io::Error| FlashError::Io {
            op,
            path: path.clone(),
            offset: 0,
            source,
        };
        let file = match opts.mode {
            IoMode::Mmap => File::open(&path).map_err(|e| io_err("opening", e))?,
            IoMode::Direct => open_direct(&path)?,
        };
        let meta = file.metadata().map_err(|e| io_err("inspecting", e))?;
        if !meta.is_file() {
            return Err(io_err(
                "opening",
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        let len = meta.len();
        let piece = match opts.mode {
            IoMode::Mmap => opts.chunk,
            IoMode::Direct => opts.chunk.next_multiple_of(DIRECT_ALIGN),
        };
        let map = match opts.mode {
            IoMode::Mmap if len > 0 => {
                // SAFETY: the map is only read. A file truncated by someone else would raise
                // SIGBUS on access, so every read checks the size first (see `read_into`).
                let m = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| io_err("mapping", e))?;
                Some(m)
            }
            _ => None,
        };
        let f = Self {
            path,
            file,
            len,
            id: identity(&meta),
            opts,
            piece,
            map,
            bounce: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
            bytes_read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            bounced: AtomicU64::new(0),
            pool: OnceLock::new(),
        };
        if opts.mode == IoMode::Direct && len > 0 {
            // Some filesystems accept the flag at open and refuse the first read.
            let mut probe = [0u8; 1];
            match f.read_into(0, &mut probe) {
                Ok(()) => {}
                Err(FlashError::Io { source, .. }) if source.raw_os_error() == Some(einval()) => {
                    return Err(FlashError::DirectUnsupported {
                        path: f.path.clone(),
                        reason: format!("an aligned read failed: {source}"),
                    });
                }
                Err(e) => return Err(e),
            }
            f.bytes_read.store(0, Ordering::Relaxed);
            f.reads.store(0, Ordering::Relaxed);
            f.bounced.store(0, Ordering::Relaxed);
        }
        Ok(f)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File length at open.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn options(&self) -> ReaderOptions {
        self.opts
    }

    pub fn mode(&self) -> IoMode {
        self.opts.mode
    }

    /// Bytes requested from storage so far, including alignment overhead in direct mode.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// Storage requests so far: `pread` calls in direct mode, piece copies from the map in mmap
    /// mode.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Bytes direct reads have copied out of bounce buffers: a destination that does not sit
    /// at its file offset's place within a page takes a copy.
    pub fn bounced_bytes(&self) -> u64 {
        self.bounced.load(Ordering::Relaxed)
    }

    /// Reset [`bytes_read`](Self::bytes_read), [`reads`](Self::reads) and
    /// [`bounced_bytes`](Self::bounced_bytes) to zero.
    pub fn reset_counters(&self) {
        self.bytes_read.store(0, Ordering::Relaxed);
        self.reads.store(0, Ordering::Relaxed);
        self.bounced.store(0, Ordering::Relaxed);
    }

    /// Inject a fault that stays until [`clear_faults`](Self::clear_faults) (tests).
    pub fn inject_fault(&self, fault: FlashFault) {
        if let Ok(mut v) = self.faults.lock() {
            v.push(fault);
        }
    }

    pub fn clear_faults(&self) {
        if let Ok(mut v) = self.faults.lock() {
            v.clear();
        }
    }

    fn io_err(&self, op: &'static str, offset: u64, source: io::Error) -> FlashError {
        FlashError::Io {
            op,
            path: self.path.clone(),
            offset,
            source,
        }
    }

    /// The file has not shrunk since open (one fstat on the open descriptor).
    fn check_size(&self) -> Result<(), FlashError> {
        let now = self
            .file
            .metadata()
            .map_err(|e| self.io_err("inspecting", 0, e))?
            .len();
        if now < self.len {
            return Err(FlashError::FileChanged {
                path: self.path.clone(),
                change: FileChange::Shrunk {
                    from: self.len,
                    to: now,
                },
            });
        }
        Ok(())
    }

    /// Fails when the file shrank, was removed or was replaced since it was opened
    /// (an fstat of the open descriptor and a stat of the path).
    pub fn check_unchanged(&self) -> Result<(), FlashError> {
        self.check_size()?;
        match std::fs::metadata(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(FlashError::FileChanged {
                path: self.path.clone(),
                change: FileChange::Vanished,
            }),
            Err(e) => Err(self.io_err("inspecting", 0, e)),
            Ok(m) => {
                if self.id.is_some() && identity(&m) != self.id {
                    return Err(FlashError::FileChanged {
                        path: self.path.clone(),
                        change: FileChange::Replaced,
                    });
                }
                Ok(())
            }
        }
    }

    /// Clamp `[offset, offset + len)` to the file.
    fn clamp(&self, offset: u64, len: u64) -> Option<(usize, usize)> {
        let end = offset.saturating_add(len).min(self.len);
        (offset < end).then(|| (offset as usize, (end - offset) as usize))
    }

    /// Ask the OS to start reading `[offset, offset + len)` ahead of use (mmap mode:
    /// madvise(WILLNEED); direct mode: nothing, the page cache is not used).
    pub fn prefetch(&self, offset: u64, len: u64) -> Result<(), FlashError> {
        #[cfg(unix)]
        if let (Some(map), Some((o, n))) = (&self.map, self.clamp(offset, len)) {
            self.check_size()?;
            map.advise_range(memmap2::Advice::WillNeed, o, n)
                .map_err(|e| self.io_err("prefetching", offset, e))?;
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
        Ok(())
    }

    /// Drop this process's mapping of `[offset, offset + len)` after use (mmap mode:
    /// madvise(DONTNEED); the pages stay in the page cache until the OS needs them; direct mode:
    /// nothing).
    pub fn release(&self, offset: u64, len: u64) -> Result<(), FlashError> {
        #[cfg(unix)]
        if let (Some(map), Some((o, n))) = (&self.map, self.clamp(offset, len)) {
            // SAFETY: the map is read-only and file-backed: after DONTNEED the next access
            // reads the same bytes from the file again; no Rust reference observes a change.
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, o, n) }
                .map_err(|e| self.io_err("releasing", offset, e))?;
        }
        #[cfg(not(unix))]
        let _ = (offset, len);
        Ok(())
    }

    /// Hint that the map will be read front to back (mmap mode: madvise(SEQUENTIAL), which
    /// widens readahead; direct mode: nothing).
    pub fn advise_sequential(&self) -> Result<(), FlashError> {
        #[cfg(unix)]
        if let Some(map) = &self.map {
            map.advise(memmap2::Advice::Sequential)
                .map_err(|e| self.io_err("advising", 0, e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_mode_parses_and_prints() {
        assert_eq!("mmap".parse::<IoMode>(), Ok(IoMode::Mmap));
        assert_eq!(" Direct ".parse::<IoMode>(), Ok(IoMode::Direct));
        let e = "odirect".parse::<IoMode>().unwrap_err();
        assert!(e.contains("\"mmap\"") && e.contains("\"direct\""), "{e}");
        assert_eq!(IoMode::Mmap.to_string(), "mmap");
        assert_eq!(IoMode::Direct.to_string(), "direct");
    }
    #[test]
    fn bad_options_are_errors() {
        let dir = std::env::temp_dir().join(format!("flashlm-opt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.bin");
        std::fs::write(&p, [1u8; 10]).unwrap();
        for opts in [
            ReaderOptions {
                chunk: 0,
                ..Default::default()
            },
            ReaderOptions {
                threads: 0,
                ..Default::default()
            },
        ] {
            let e = FlashFile::open(&p, opts).unwrap_err();
            assert!(matches!(e, FlashError::InvalidOptions(_)), "{e}");
        }
        let e = FlashFile::open(dir.join("missing"), ReaderOptions::default()).unwrap_err();
        assert!(matches!(e, FlashError::Io { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
