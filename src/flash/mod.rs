//! The bottom I/O layer: the flash reader (model bytes read from SSD/NVMe into caller memory,
//! usually mapped staging memory), the byte-source traits the upload path reads through
//! ([`source`]), the host-memory cache shared by weights and KV pages ([`HostCache`]) and the
//! priority transfer queue ([`queue`]).
//!
//! Two modes:
//! - [`IoMode::Direct`] bypasses the OS page cache (O_DIRECT on Linux, F_NOCACHE on macOS,
//!   FILE_FLAG_NO_BUFFERING on Windows). Reads go through 4 KiB-aligned bounce buffers, or
//!   straight into the destination when file offset, length and address line up.
//! - [`IoMode::Mmap`] maps the file and copies out of the map, with madvise hints
//!   ([`FlashFile::prefetch`], [`FlashFile::release`]).
//!
//! Large reads are split at `chunk`-sized boundaries of the file and read by up to `threads`
//! threads. [`evict_page_cache`] and [`page_cache_residency`] let benchmarks start cold and
//! check that they did.

mod cache;
pub(crate) mod direct;
mod size;

pub use cache::{Admit, CacheKey, CacheStats, HostCache};
pub use size::{format_size, parse_size};
pub use source::{ChunkSource, SourceError, WeightSource};

pub mod queue;
pub mod source;

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Serialize;
use thiserror::Error;

/// Alignment of offsets, lengths and addresses for direct I/O.
pub const DIRECT_ALIGN: usize = 4096;

/// Residency above this fraction after an eviction means the eviction did not take effect.
pub const EVICTION_THRESHOLD: f64 = 0.05;

/// Most bytes one memcpy moves out of the map in mmap mode.
const MMAP_COPY_STEP: usize = 256 << 10;

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

/// Faults the tests can inject into a [`FlashFile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashFault {
    /// A read covering file offset `at` stops there with a short-read error.
    ShortRead { at: u64 },
    /// A read covering file offset `at` fails with an I/O error.
    IoError { at: u64 },
}

/// A heap buffer aligned for direct I/O.
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer is plain owned memory; access goes through &self / &mut self.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> io::Result<Self> {
        let len = len.max(DIRECT_ALIGN).next_multiple_of(DIRECT_ALIGN);
        let layout = std::alloc::Layout::from_size_align(len, DIRECT_ALIGN)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(p).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("allocating a {len}-byte bounce buffer failed"),
            )
        })?;
        Ok(Self { ptr, layout })
    }
    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `len` initialized (zeroed) bytes, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// File identity at open time, to notice replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
}

fn identity(m: &std::fs::Metadata) -> Option<Identity> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(Identity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        None
    }
}

/// Positional read that does not move a shared file cursor (safe from many threads).
fn pread(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    loop {
        #[cfg(unix)]
        let r = {
            use std::os::unix::fs::FileExt;
            file.read_at(buf, offset)
        };
        #[cfg(windows)]
        let r = {
            use std::os::windows::fs::FileExt;
            file.seek_read(buf, offset)
        };
        match r {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
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

    /// Reset [`bytes_read`](Self::bytes_read) and [`reads`](Self::reads) to zero.
    pub fn reset_counters(&self) {
        self.bytes_read.store(0, Ordering::Relaxed);
        self.reads.store(0, Ordering::Relaxed);
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

    fn check_faults(&self, offset: u64, len: u64) -> Result<(), FlashError> {
        let Ok(faults) = self.faults.lock() else {
            return Ok(());
        };
        for f in faults.iter() {
            match *f {
                FlashFault::ShortRead { at } if at >= offset && at < offset + len => {
                    return Err(FlashError::ShortRead {
                        path: self.path.clone(),
                        offset,
                        wanted: len,
                        got: at - offset,
                    });
                }
                FlashFault::IoError { at } if at >= offset && at < offset + len => {
                    return Err(self.io_err("reading", at, io::Error::other("injected I/O error")));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Read exactly `dst.len()` bytes at `offset`.
    ///
    /// The read is split into pieces at multiples of the piece size in the file and spread
    /// over up to `threads` threads (the calling thread is one of them).
    pub fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let len = dst.len() as u64;
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| FlashError::OutOfRange {
                path: self.path.clone(),
                offset,
                len,
                file_len: self.len,
            })?;
        if len == 0 {
            return Ok(());
        }
        self.check_faults(offset, len)?;
        if self.opts.mode == IoMode::Mmap {
            // Touching pages past the end of a shrunk file raises SIGBUS.
            self.check_size()?;
        }
        let piece = self.piece as u64;
        let n_pieces = (end - 1) / piece - offset / piece + 1;
        let workers = (self.opts.threads as u64).min(n_pieces) as usize;
        if workers <= 1 {
            let mut pos = offset;
            let mut rest = dst;
            while pos < end {
                let next = ((pos / piece + 1) * piece).min(end);
                let (head, tail) = rest.split_at_mut((next - pos) as usize);
                self.read_piece(pos, head)?;
                rest = tail;
                pos = next;
            }
            return Ok(());
        }
        // Pieces in file order; workers take the next one as they finish, so the device sees
        // requests in ascending order with `workers` of them in flight.
        let mut pieces = Vec::with_capacity(n_pieces as usize);
        let mut pos = offset;
        let mut rest = dst;
        while pos < end {
            let next = ((pos / piece + 1) * piece).min(end);
            let (head, tail) = rest.split_at_mut((next - pos) as usize);
            pieces.push((pos, head));
            rest = tail;
            pos = next;
        }
        let queue = Mutex::new(pieces.into_iter());
        let failed = AtomicBool::new(false);
        let first_err: Mutex<Option<FlashError>> = Mutex::new(None);
        let work = || {
            while !failed.load(Ordering::Relaxed) {
                let next = match queue.lock() {
                    Ok(mut q) => q.next(),
                    Err(_) => None,
                };
                let Some((pos, buf)) = next else { break };
                if let Err(e) = self.read_piece(pos, buf) {
                    failed.store(true, Ordering::Relaxed);
                    if let Ok(mut slot) = first_err.lock()
                        && slot.is_none()
                    {
                        *slot = Some(e);
                    }
                    break;
                }
            }
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                s.spawn(work);
            }
            work();
        });
        if let Some(e) = first_err.into_inner().ok().flatten() {
            return Err(e);
        }
        if failed.load(Ordering::Relaxed) {
            return Err(self.io_err(
                "reading",
                offset,
                io::Error::other("a reader thread failed"),
            ));
        }
        Ok(())
    }

    fn read_piece(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        match &self.map {
            Some(map) => {
                // Copy in bounded steps: a single huge memcpy may walk several far-apart
                // streams at once (large-copy strategies of the C library), which defeats the
                // kernel's sequential readahead on a cold map.
                let a = offset as usize;
                for (i, d) in dst.chunks_mut(MMAP_COPY_STEP).enumerate() {
                    let s = a + i * MMAP_COPY_STEP;
                    d.copy_from_slice(&map[s..s + d.len()]);
                }
                self.bytes_read
                    .fetch_add(dst.len() as u64, Ordering::Relaxed);
                self.reads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            None => match self.opts.mode {
                IoMode::Direct => self.direct_piece(offset, dst),
                // An empty file has no map and no bytes to read.
                IoMode::Mmap => Ok(()),
            },
        }
    }

    /// Direct read of one piece: the aligned middle straight into `dst` when the address and
    /// the file offset share their alignment, everything else through a bounce buffer.
    fn direct_piece(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN as u64;
        let end = offset + dst.len() as u64;
        let congruent = (dst.as_ptr() as u64) % a == offset % a;
        let mid_start = offset.next_multiple_of(a);
        let mid_end = end / a * a;
        if congruent && mid_start < mid_end {
            let h = (mid_start - offset) as usize;
            let m = (mid_end - offset) as usize;
            let (head, rest) = dst.split_at_mut(h);
            let (mid, tail) = rest.split_at_mut(m - h);
            if !head.is_empty() {
                self.bounce_read(offset, head)?;
            }
            self.aligned_read(mid_start, mid, mid.len() as u64)?;
            if !tail.is_empty() {
                self.bounce_read(mid_end, tail)?;
            }
            return Ok(());
        }
        self.bounce_read(offset, dst)
    }

    /// Read `dst.len()` bytes at `offset` through aligned bounce buffers.
    fn bounce_read(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN as u64;
        let mut buf = self.take_bounce()?;
        let cap = buf.len() as u64;
        let end = offset + dst.len() as u64;
        let mut pos = offset;
        let mut result = Ok(());
        while pos < end {
            let a0 = pos / a * a;
            let a1 = end.next_multiple_of(a).min(a0 + cap);
            let upto = a1.min(end);
            let need = upto - a0;
            let window = &mut buf.as_mut_slice()[..(a1 - a0) as usize];
            if let Err(e) = self.aligned_read(a0, window, need) {
                result = Err(e);
                break;
            }
            let s = (pos - offset) as usize;
            let n = (upto - pos) as usize;
            dst[s..s + n].copy_from_slice(&window[(pos - a0) as usize..(pos - a0) as usize + n]);
            pos = upto;
        }
        self.give_bounce(buf);
        result
    }

    /// Aligned direct read of `buf.len()` bytes at `offset` (both aligned) of which at least
    /// `need` must arrive (the aligned tail may lie past the end of the file).
    fn aligned_read(&self, offset: u64, buf: &mut [u8], need: u64) -> Result<(), FlashError> {
        let a = DIRECT_ALIGN;
        let mut got = 0usize;
        while (got as u64) < need {
            let n = pread(&self.file, &mut buf[got..], offset + got as u64)
                .map_err(|e| self.io_err("reading", offset + got as u64, e))?;
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.bytes_read
                .fetch_add((buf.len() - got) as u64, Ordering::Relaxed);
            got += n;
            // End of file, or an unaligned remainder (only at the end of the file).
            if n == 0 || n % a != 0 {
                break;
            }
        }
        if (got as u64) < need {
            self.check_unchanged()?;
            return Err(FlashError::ShortRead {
                path: self.path.clone(),
                offset,
                wanted: need,
                got: got as u64,
            });
        }
        Ok(())
    }

    fn take_bounce(&self) -> Result<AlignedBuf, FlashError> {
        if let Ok(mut pool) = self.bounce.lock()
            && let Some(b) = pool.pop()
        {
            return Ok(b);
        }
        AlignedBuf::new(self.piece).map_err(|e| self.io_err("allocating for", 0, e))
    }

    fn give_bounce(&self, b: AlignedBuf) {
        if let Ok(mut pool) = self.bounce.lock() {
            pool.push(b);
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

fn einval() -> i32 {
    #[cfg(unix)]
    {
        libc::EINVAL
    }
    #[cfg(not(unix))]
    {
        // ERROR_INVALID_PARAMETER
        87
    }
}

/// Open for reading with the page cache bypassed.
fn open_direct(path: &Path) -> Result<File, FlashError> {
    let unsupported = |reason: String| FlashError::DirectUnsupported {
        path: path.to_path_buf(),
        reason,
    };
    let io_err = |source: io::Error| FlashError::Io {
        op: "opening",
        path: path.to_path_buf(),
        offset: 0,
        source,
    };
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
    {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
            Ok(f) => Ok(f),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                Err(unsupported(format!("opening with O_DIRECT failed: {e}")))
            }
            Err(e) => Err(io_err(e)),
        }
    }
    #[cfg(any(target_os = "macos", target_os = "ios"))]
    {
        use std::os::unix::io::AsRawFd;
        let f = File::open(path).map_err(io_err)?;
        // SAFETY: fcntl on a descriptor we own, with an integer argument.
        let r = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_NOCACHE, 1) };
        if r == -1 {
            return Err(unsupported(format!(
                "fcntl(F_NOCACHE) failed: {}",
                io::Error::last_os_error()
            )));
        }
        Ok(f)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::OpenOptionsExt;
        const FILE_FLAG_NO_BUFFERING: u32 = 0x2000_0000;
        match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(FILE_FLAG_NO_BUFFERING)
            .open(path)
        {
            Ok(f) => Ok(f),
            Err(e) if e.raw_os_error() == Some(87) => Err(unsupported(format!(
                "opening with FILE_FLAG_NO_BUFFERING failed: {e}"
            ))),
            Err(e) => Err(io_err(e)),
        }
    }
    #[cfg(not(any(
        target_os = "linux",
        target_os = "android",
        target_os = "freebsd",
        target_os = "macos",
        target_os = "ios",
        windows
    )))]
    {
        let _ = io_err;
        Err(unsupported("not implemented on this platform".into()))
    }
}

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
    fn aligned_buffers_are_aligned() {
        let mut b = AlignedBuf::new(5000).unwrap();
        assert_eq!(b.len(), 8192);
        assert_eq!(b.as_mut_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
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
