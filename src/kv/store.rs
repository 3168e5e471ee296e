//! The per-run KV page file.
//!
//! The attention KV cache is kept in pages of `page_tokens` tokens of one layer of one
//! sequence (the K rows, then the V rows: `page_bytes` of payload). A full page is written to
//! the page file exactly once and read back later, possibly many times.
//!
//! Each page owns a record of [`KvLayout::record_bytes`] (the payload rounded up to 4 KiB, so
//! direct I/O can move whole records). Record `(seq, layer, page)` starts at
//! `((seq × n_layers + layer) × max_pages + page) × record_bytes`: the pages of one
//! `(seq, layer)` are contiguous, and a run of them is one read. The file is created sparse at
//! its full size and removed when the store is dropped (unless [`KvStore::keep`] was called).
//!
//! The index (which pages are written, and their crc32) lives in memory behind a mutex; the
//! I/O runs outside the lock, so one thread can write pages while others read.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use super::KvError;
use crate::flash::direct::{is_direct_refusal, open_rw, pread_full, pwrite_all};
use crate::flash::{AlignedBuf, AlignedPool, DIRECT_ALIGN, IoMode, PooledBuf};

/// Largest accepted `page_bytes` (buffers of whole pages are allocated in memory).
pub const MAX_PAGE_BYTES: u64 = 1 << 30;

/// Bounce buffers kept for reuse in direct mode.
const POOL_BUFFERS: usize = 4;

/// Shape of a KV page file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvLayout {
    pub n_layers: u32,
    pub page_tokens: u32,
    /// Payload bytes of one page (K rows then V rows).
    pub page_bytes: u64,
    /// Pages per layer per sequence.
    pub max_pages: u32,
    pub max_seqs: u32,
}

impl KvLayout {
    /// Bytes each page occupies in the file: `page_bytes` rounded up to 4096.
    pub fn record_bytes(&self) -> u64 {
        self.page_bytes
            .div_ceil(DIRECT_ALIGN as u64)
            .saturating_mul(DIRECT_ALIGN as u64)
    }

    /// Number of records and file size, or why the layout is unusable.
    fn validate(&self) -> Result<(usize, u64), KvError> {
        let bad = |s: String| Err(KvError::BadLayout(s));
        for (name, v) in [
            ("n_layers", self.n_layers),
            ("page_tokens", self.page_tokens),
            ("max_pages", self.max_pages),
            ("max_seqs", self.max_seqs),
        ] {
            if v == 0 {
                return bad(format!("{name} must be at least 1"));
            }
        }
        if self.page_bytes == 0 || self.page_bytes > MAX_PAGE_BYTES {
            return bad(format!(
                "page_bytes must be between 1 and {MAX_PAGE_BYTES}, got {}",
                self.page_bytes
            ));
        }
        let records = u64::from(self.max_seqs)
            .checked_mul(u64::from(self.n_layers))
            .and_then(|r| r.checked_mul(u64::from(self.max_pages)));
        let bytes = records.and_then(|r| r.checked_mul(self.record_bytes()));
        match (records.and_then(|r| usize::try_from(r).ok()), bytes) {
            (Some(r), Some(b)) if b <= i64::MAX as u64 => Ok((r, b)),
            _ => bad(format!(
                "{} sequences × {} layers × {} pages of {} bytes do not fit in a file",
                self.max_seqs,
                self.n_layers,
                self.max_pages,
                self.record_bytes()
            )),
        }
    }
}

/// Counters of a [`KvStore`]. Bytes are those moved to or from storage: whole records in
/// direct mode (payload plus alignment padding), payload only in mmap mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct KvStoreStats {
    pub pages_written: u64,
    pub bytes_written: u64,
    pub pages_read: u64,
    pub bytes_read: u64,
}

/// What the index knows about one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Empty,
    /// A write is in flight; `epoch` tells this write apart from a later one after a drop.
    Writing {
        epoch: u64,
    },
    Written {
        crc: u32,
        epoch: u64,
    },
}

struct Index {
    slots: Vec<Slot>,
    next_epoch: u64,
}

/// The open file and, in mmap mode, its map. Declared before [`Remover`] in [`KvStore`] so
/// the descriptor is closed before the file is removed.
struct Io {
    file: File,
    map: Option<memmap2::Mmap>,
}

/// Removes the page file on drop unless told to keep it.
struct Remover {
    path: PathBuf,
    keep: bool,
}

impl Drop for Remover {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The per-run KV page file. All methods take `&self` and may be called from many threads.
pub struct KvStore {
    io: Io,
    layout: KvLayout,
    mode: IoMode,
    record: u64,
    file_bytes: u64,
    index: Mutex<Index>,
    pool: AlignedPool,
    pages_written: AtomicU64,
    bytes_written: AtomicU64,
    pages_read: AtomicU64,
    bytes_read: AtomicU64,
    remover: Remover,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("path", &self.remover.path)
            .field("layout", &self.layout)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

/// Distinguishes the page files of one process.
static FILE_COUNTER: AtomicU64 = AtomicU64::new(0);

fn io_err(op: &'static str, path: &Path, offset: u64, source: std::io::Error) -> KvError {
    KvError::Io {
        op,
        path: path.to_path_buf(),
        offset,
        source,
    }
}

/// Create `dir/kv-<pid>-<n>.bin`, skipping names left behind by an earlier process.
fn create_unique(dir: &Path) -> Result<(PathBuf, File), KvError> {
    let pid = std::process::id();
    let mut last = None;
    for _ in 0..1000 {
        let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("kv-{pid}-{n}.bin"));
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(io_err("creating", &path, 0, e)),
        }
    }
    let e = last.unwrap_or_else(|| std::io::Error::other("no free name"));
    Err(io_err("creating", dir, 0, e))
}

impl KvStore {
    /// Create a new, uniquely named file `kv-<pid>-<n>.bin` in `dir` (created if missing),
    /// sized (sparse) for `max_seqs × n_layers × max_pages` records. Removed on drop.
    pub fn create(dir: &Path, layout: KvLayout, mode: IoMode) -> Result<Self, KvError> {
        let (records, file_bytes) = layout.validate()?;
        let mut slots = Vec::new();
        slots.try_reserve_exact(records).map_err(|_| {
            KvError::BadLayout(format!("cannot allocate an index of {records} pages"))
        })?;
        slots.resize(records, Slot::Empty);
        std::fs::create_dir_all(dir).map_err(|e| io_err("creating the directory of", dir, 0, e))?;
        let (path, file) = create_unique(dir)?;
        // From here on, an error removes the new file.
        let remover = Remover { path, keep: false };
        let path = remover.path.as_path();
        file.set_len(file_bytes)
            .map_err(|e| io_err("sizing", path, file_bytes, e))?;
        let unsupported = |reason: String| KvError::DirectUnsupported {
            path: path.to_path_buf(),
            reason,
        };
        let io = match mode {
            IoMode::Mmap => {
                // SAFETY: the map is only read, through `read_pages`, which checks first that
                // the file has not shrunk (a truncated map would fault). Pages are written once
                // with pwrite before the index lets anyone read them.
                let map = unsafe { memmap2::Mmap::map(&file) }
                    .map_err(|e| io_err("mapping", path, 0, e))?;
                Io {
                    file,
                    map: Some(map),
                }
            }
            IoMode::Direct => {
                drop(file);
                let file = open_rw(path, true).map_err(|e| {
                    if is_direct_refusal(&e) {
                        unsupported(format!("opening for direct I/O failed: {e}"))
                    } else {
                        io_err("opening", path, 0, e)
                    }
                })?;
                // Some filesystems accept the flag at open and refuse the first transfer.
                let mut probe = AlignedBuf::new(DIRECT_ALIGN)
                    .map_err(|e| io_err("allocating for", path, 0, e))?;
                if let Err(e) = pread_full(&file, probe.as_mut_slice(), 0) {
                    return Err(if is_direct_refusal(&e) {
                        unsupported(format!("an aligned read failed: {e}"))
                    } else {
                        io_err("reading", path, 0, e)
                    });
                }
                Io { file, map: None }
            }
        };
        Ok(Self {
            io,
            layout,
            mode,
            record: layout.record_bytes(),
            file_bytes,
            index: Mutex::new(Index {
                slots,
                next_epoch: 0,
            }),
            pool: AlignedPool::new(POOL_BUFFERS),
            pages_written: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            pages_read: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            remover,
        })
    }

    pub fn path(&self) -> &Path {
        &self.remover.path
    }

    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Keep the file when the store is dropped (for inspection).
    pub fn keep(&mut self) {
        self.remover.keep = true;
    }

    pub fn stats(&self) -> KvStoreStats {
        KvStoreStats {
            pages_written: self.pages_written.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            pages_read: self.pages_read.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
        }
    }

    fn check(&self, what: &'static str, value: u32, limit: u32) -> Result<(), KvError> {
        if value < limit {
            Ok(())
        } else {
            Err(KvError::OutOfRange {
                what,
                value: value.into(),
                limit: limit.into(),
            })
        }
    }

    /// Index of record `(seq, layer, page)`, all three checked.
    fn slot_index(&self, seq: u32, layer: u32, page: u32) -> Result<usize, KvError> {
        let l = &self.layout;
        self.check("sequence", seq, l.max_seqs)?;
        self.check("layer", layer, l.n_layers)?;
        self.check("page", page, l.max_pages)?;
        // In range of the index, whose length was checked at creation.
        let i = (u64::from(seq) * u64::from(l.n_layers) + u64::from(layer))
            * u64::from(l.max_pages)
            + u64::from(page);
        Ok(i as usize)
    }

    /// File offset of record `(seq, layer, page)`:
    /// `((seq × n_layers + layer) × max_pages + page) × record_bytes`.
    pub fn offset(&self, seq: u32, layer: u32, page: u32) -> Result<u64, KvError> {
        // Below the file size, which was checked at creation.
        Ok(self.slot_index(seq, layer, page)? as u64 * self.record)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        // The index is consistent between statements: a panic elsewhere cannot tear it.
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_written(&self, seq: u32, layer: u32, page: u32) -> bool {
        self.checksum(seq, layer, page).is_some()
    }

    /// The crc32 of a written page.
    pub fn checksum(&self, seq: u32, layer: u32, page: u32) -> Option<u32> {
        let i = self.slot_index(seq, layer, page).ok()?;
        match self.lock().slots.get(i) {
            Some(Slot::Written { crc, .. }) => Some(*crc),
            _ => None,
        }
    }

    /// Forget pages `>= from_page` of `seq` in every layer (a rewound or finished sequence);
    /// they may be written again afterwards. Out-of-range arguments forget nothing.
    pub fn drop_pages(&self, seq: u32, from_page: u32) {
        let l = self.layout;
        if seq >= l.max_seqs || from_page >= l.max_pages {
            return;
        }
        let mut idx = self.lock();
        for layer in 0..l.n_layers {
            let Ok(first) = self.slot_index(seq, layer, from_page) else {
                return;
            };
            let end = first + (l.max_pages - from_page) as usize;
            if let Some(s) = idx.slots.get_mut(first..end) {
                s.fill(Slot::Empty);
            }
        }
    }

    fn take_buf(&self, len: usize) -> Result<PooledBuf, KvError> {
        self.pool
            .take(len)
            .map_err(|e| io_err("allocating for", self.path(), 0, e))
    }

    fn bad_length(&self, n: u64, got: usize) -> KvError {
        KvError::BadLength {
            expected: n.saturating_mul(self.layout.page_bytes),
            got: got as u64,
        }
    }

    /// Write a full page exactly once (`data.len() == page_bytes`). Writing a page that is
    /// already written (or being written) is [`KvError::AlreadyWritten`] unless it was
    /// dropped with [`drop_pages`](Self::drop_pages) since. Direct mode writes the whole
    /// record from an aligned buffer (zero padding after the payload); mmap mode writes
    /// through the page cache. The page's crc32 is kept in memory.
    pub fn write_page(&self, seq: u32, layer: u32, page: u32, data: &[u8]) -> Result<(), KvError> {
        let i = self.slot_index(seq, layer, page)?;
        if data.len() as u64 != self.layout.page_bytes {
            return Err(self.bad_length(1, data.len()));
        }
        let epoch = {
            let mut idx = self.lock();
            let epoch = idx.next_epoch;
            match idx.slots.get_mut(i) {
                Some(s @ Slot::Empty) => *s = Slot::Writing { epoch },
                _ => return Err(KvError::AlreadyWritten { seq, layer, page }),
            }
            idx.next_epoch += 1;
            epoch
        };
        let crc = crc32fast::hash(data);
        let offset = i as u64 * self.record;
        let result = self.write_record(offset, data);
        let mut idx = self.lock();
        let Some(slot) = idx.slots.get_mut(i) else {
            return result.map(|_| ());
        };
        match result {
            Ok(bytes) => {
                // A page dropped while it was being written stays dropped.
                if *slot == (Slot::Writing { epoch }) {
                    *slot = Slot::Written { crc, epoch };
                }
                self.pages_written.fetch_add(1, Ordering::Relaxed);
                self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                if *slot == (Slot::Writing { epoch }) {
                    *slot = Slot::Empty;
                }
                Err(e)
            }
        }
    }

    /// Store one page's payload at `offset`; returns the bytes written to storage.
    fn write_record(&self, offset: u64, data: &[u8]) -> Result<u64, KvError> {
        let path = self.path();
        if self.mode == IoMode::Mmap {
            pwrite_all(&self.io.file, data, offset)
                .map_err(|e| io_err("writing", path, offset, e))?;
            return Ok(data.len() as u64);
        }
        // `record` <= MAX_PAGE_BYTES rounded up, so it fits in usize.
        let rec = self.record as usize;
        let mut buf = self.take_buf(rec)?;
        let b = &mut buf.as_mut_slice()[..rec];
        b[..data.len()].copy_from_slice(data);
        b[data.len()..].fill(0);
        pwrite_all(&self.io.file, b, offset)
            .map(|_| rec as u64)
            .map_err(|e| io_err("writing", path, offset, e))
    }

    /// Read `n` consecutive written pages of `(seq, layer)` starting at `first` into `dst`
    /// (`dst.len() == n × page_bytes`) with one file read, then verify every page's crc32
    /// ([`KvError::Checksum`] on a mismatch). Unwritten pages are [`KvError::NotWritten`].
    pub fn read_pages(
        &self,
        seq: u32,
        layer: u32,
        first: u32,
        n: u32,
        dst: &mut [u8],
    ) -> Result<(), KvError> {
        let l = self.layout;
        let start = self.slot_index(seq, layer, first)?;
        match first.checked_add(n) {
            Some(end) if end <= l.max_pages => {}
            _ => {
                return Err(KvError::OutOfRange {
                    what: "page run end",
                    value: u64::from(first) + u64::from(n),
                    limit: l.max_pages.into(),
                });
            }
        }
        // n × page_bytes <= max_pages × MAX_PAGE_BYTES: no overflow in u64.
        if dst.len() as u64 != u64::from(n) * l.page_bytes {
            return Err(self.bad_length(n.into(), dst.len()));
        }
        if n == 0 {
            return Ok(());
        }
        let mut want = Vec::with_capacity(n as usize);
        {
            let idx = self.lock();
            for (k, slot) in idx.slots[start..start + n as usize].iter().enumerate() {
                match *slot {
                    Slot::Written { crc, epoch } => want.push((crc, epoch)),
                    _ => {
                        let page = first + k as u32;
                        return Err(KvError::NotWritten { seq, layer, page });
                    }
                }
            }
        }
        let offset = start as u64 * self.record;
        let bytes = self.read_records(offset, n, dst)?;
        let pb = l.page_bytes as usize;
        for (k, (chunk, &(crc, epoch))) in dst.chunks_exact(pb).zip(&want).enumerate() {
            if crc32fast::hash(chunk) != crc {
                let page = first + k as u32;
                let same =
                    self.lock().slots.get(start + k).copied() == Some(Slot::Written { crc, epoch });
                return Err(if same {
                    KvError::Checksum { seq, layer, page }
                } else {
                    KvError::Raced { seq, layer, page }
                });
            }
        }
        self.pages_read.fetch_add(n.into(), Ordering::Relaxed);
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Copy the payloads of `n` records from `offset` into `dst`; returns the bytes read
    /// from storage.
    fn read_records(&self, offset: u64, n: u32, dst: &mut [u8]) -> Result<u64, KvError> {
        let path = self.path();
        let pb = self.layout.page_bytes as usize;
        let rec = self.record as usize;
        if let Some(map) = &self.io.map {
            self.check_size()?;
            let base = usize::try_from(offset).map_err(|_| self.shrunk(map.len() as u64))?;
            for (k, d) in dst.chunks_exact_mut(pb).enumerate() {
                // Within the map: the record lies inside the file, which has not shrunk.
                let s = base + k * rec;
                match map.get(s..s + pb) {
                    Some(src) => d.copy_from_slice(src),
                    None => return Err(self.shrunk(map.len() as u64)),
                }
            }
            return Ok(dst.len() as u64);
        }
        let total = (n as usize).checked_mul(rec).ok_or_else(|| {
            io_err(
                "reading",
                path,
                offset,
                std::io::Error::other("read too large"),
            )
        })?;
        let short = |got: usize| {
            self.check_size().err().unwrap_or_else(|| {
                let msg = format!("short read: got {got} of {total} bytes");
                io_err("reading", path, offset, std::io::Error::other(msg))
            })
        };
        // Whole records straight into the caller's memory when it is aligned.
        if pb == rec && (dst.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN) {
            let got = pread_full(&self.io.file, dst, offset)
                .map_err(|e| io_err("reading", path, offset, e))?;
            return if got == total {
                Ok(total as u64)
            } else {
                Err(short(got))
            };
        }
        let mut buf = self.take_buf(total)?;
        let r = pread_full(&self.io.file, &mut buf.as_mut_slice()[..total], offset);
        match r {
            Ok(got) if got == total => {
                let src = buf.as_mut_slice();
                for (k, d) in dst.chunks_exact_mut(pb).enumerate() {
                    d.copy_from_slice(&src[k * rec..k * rec + pb]);
                }
                Ok(total as u64)
            }
            Ok(got) => Err(short(got)),
            Err(e) => Err(io_err("reading", path, offset, e)),
        }
    }

    fn shrunk(&self, len: u64) -> KvError {
        KvError::Shrunk {
            path: self.path().to_path_buf(),
            len,
            expected: self.file_bytes,
        }
    }

    /// The file still has its full size (one fstat of the open descriptor).
    fn check_size(&self) -> Result<(), KvError> {
        let len = self
            .io
            .file
            .metadata()
            .map_err(|e| io_err("inspecting", self.path(), 0, e))?
            .len();
        if len < self.file_bytes {
            return Err(self.shrunk(len));
        }
        Ok(())
    }
}
