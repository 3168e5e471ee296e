//! Byte sources the upload path reads from, and the engine's weight source: the flash reader
//! behind the shared host-memory cache.
//!
//! Streamed weights are read in the same order every token, a cyclic pattern in which an LRU
//! cache smaller than the cycle never hits. Weight ranges are therefore *pinned* in the
//! [`HostCache`]: the first ones seen stay until `--dram-budget` is used up, and those bytes come
//! from DRAM every token, the rest from flash. Only misses count as flash reads. Bytes read once
//! at load (resident weights, norms) and embedding rows bypass the cache
//! ([`WeightSource::read_uncached`]).

use std::sync::Arc;

use super::cache::{Admit, CacheKey, HostCache};
use super::{FlashError, FlashFile};

/// Error type of a [`ChunkSource`] read.
pub type SourceError = Box<dyn std::error::Error + Send + Sync>;

/// Something that can fill a buffer with the bytes at an offset.
pub trait ChunkSource: Send + Sync {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError>;

    /// Alignment the source reads fastest into: the staging ring places the bytes at offset `o`
    /// at a staging address congruent to `o` modulo this (direct I/O could then read straight
    /// into staging memory instead of through a bounce buffer).
    fn preferred_alignment(&self) -> u64 {
        1
    }
}

/// A plain byte slice as a source (tests, data already in memory).
impl ChunkSource for [u8] {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        let a = usize::try_from(offset)?;
        let b = a
            .checked_add(dst.len())
            .filter(|&b| b <= self.len())
            .ok_or("read past the end of the source")?;
        dst.copy_from_slice(&self[a..b]);
        Ok(())
    }
}

impl ChunkSource for Vec<u8> {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        self.as_slice().read_into(offset, dst)
    }
}

impl<T: ChunkSource + ?Sized> ChunkSource for Arc<T> {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        (**self).read_into(offset, dst)
    }
    fn preferred_alignment(&self) -> u64 {
        (**self).preferred_alignment()
    }
}

impl ChunkSource for FlashFile {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        FlashFile::read_into(self, offset, dst).map_err(|e| e.into())
    }
}

/// Where the engine reads weight bytes at run time: the flash reader, or any byte source.
pub trait WeightSource: ChunkSource {
    /// Bytes read from storage so far.
    fn bytes_read(&self) -> u64;
    /// Fail when the file changed under the run (shrunk, removed, replaced).
    fn check(&self) -> Result<(), String>;
    /// Read around the host cache: bytes read once, at load (resident weights, norms), and the
    /// small scattered embedding rows. Pinned, they would hold `--dram-budget` for good (load
    /// bytes are never read again), so the cache holds exactly the weights that stream each
    /// token and KV pages, as the page hit-rate model assumes.
    fn read_uncached(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        self.read_into(offset, dst)
    }
    /// Hint that `[offset, offset + len)` is needed soon.
    fn prefetch(&self, _offset: u64, _len: u64) {}
    /// Hint that `[offset, offset + len)` is not needed until its next turn.
    fn release(&self, _offset: u64, _len: u64) {}
    /// The host cache in front of the source, if any (shared with KV pages).
    fn host_cache(&self) -> Option<Arc<HostCache>> {
        None
    }
    /// How the source reads its file, if it reads one through the flash reader.
    fn io_mode(&self) -> Option<super::IoMode> {
        None
    }
    /// The flash reader's settings (mode, threads, piece size), if it reads through one.
    fn reader_options(&self) -> Option<super::ReaderOptions> {
        None
    }
    /// Where reads go straight from the device with no copy (direct I/O): the alignment of
    /// file offset, length and address that allows it, and the file's length (an aligned read
    /// may not pass it). None: every read is as good as any other.
    fn direct_reads(&self) -> Option<DirectReads> {
        None
    }
    /// Call `f` on up to `n` threads at once (this one among them) and return when every call
    /// has returned: the flash reader's own threads where the source has them, else threads
    /// started for this call.
    fn parallel(&self, n: usize, f: &(dyn Fn() + Sync)) {
        std::thread::scope(|s| {
            for _ in 1..n {
                s.spawn(f);
            }
            f();
        });
    }
}

/// See [`WeightSource::direct_reads`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectReads {
    pub align: u64,
    pub file_len: u64,
}

/// Cache key space of weight ranges (KV pages use others).
pub const WEIGHT_KEYS: u32 = 0;

/// A flash file with the host cache in front of it.
pub struct FlashSource {
    file: FlashFile,
    cache: Arc<HostCache>,
}

impl FlashSource {
    /// A source with a cache of its own of `dram_budget` bytes.
    pub fn new(file: FlashFile, dram_budget: u64) -> Self {
        Self::with_cache(file, Arc::new(HostCache::new(dram_budget)))
    }

    /// A source sharing `cache` (with the KV pages).
    pub fn with_cache(file: FlashFile, cache: Arc<HostCache>) -> Self {
        Self { file, cache }
    }

    pub fn file(&self) -> &FlashFile {
        &self.file
    }

    /// Weight bytes held in DRAM, and weight bytes served from it so far.
    pub fn dram_stats(&self) -> (u64, u64) {
        let s = self.cache.stats();
        (s.pinned_bytes, s.weight_hit_bytes)
    }

    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<(), FlashError> {
        if self.cache.budget() == 0 {
            return self.file.read_into(offset, dst);
        }
        let key = CacheKey::new(WEIGHT_KEYS, offset, dst.len() as u64);
        if self.cache.get(key, dst) {
            return Ok(());
        }
        self.file.read_into(offset, dst)?;
        self.cache.insert(key, dst, Admit::Pinned);
        Ok(())
    }
}

impl ChunkSource for FlashSource {
    fn read_into(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        Ok(self.read(offset, dst)?)
    }

    // No placement preference: measured on lavapipe (S1, direct I/O, paired runs), O_DIRECT
    // reads into pooled, pre-faulted bounce buffers plus a copy beat reads straight into
    // mapped staging memory (318 and 287 against 384 and 364 ms/token). A platform where
    // the direct path wins can return 4096 here.
}

impl WeightSource for FlashSource {
    fn bytes_read(&self) -> u64 {
        self.file.bytes_read()
    }
    fn read_uncached(&self, offset: u64, dst: &mut [u8]) -> Result<(), SourceError> {
        Ok(self.file.read_into(offset, dst)?)
    }
    fn check(&self) -> Result<(), String> {
        self.file.check_unchanged().map_err(|e| e.to_string())
    }
    fn prefetch(&self, offset: u64, len: u64) {
        let _ = self.file.prefetch(offset, len);
    }
    fn release(&self, offset: u64, len: u64) {
        let _ = self.file.release(offset, len);
    }
    fn host_cache(&self) -> Option<Arc<HostCache>> {
        Some(self.cache.clone())
    }
    fn io_mode(&self) -> Option<super::IoMode> {
        Some(self.file.mode())
    }
    fn reader_options(&self) -> Option<super::ReaderOptions> {
        Some(self.file.options())
    }
    fn direct_reads(&self) -> Option<DirectReads> {
        (self.file.mode() == super::IoMode::Direct).then(|| DirectReads {
            align: super::DIRECT_ALIGN as u64,
            file_len: self.file.len(),
        })
    }
    fn parallel(&self, n: usize, f: &(dyn Fn() + Sync)) {
        self.file.parallel(n, f);
    }
}
