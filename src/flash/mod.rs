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
//! threads (the caller and reader threads the file keeps, `pool`). [`evict_page_cache`] and [`page_cache_residency`] let benchmarks start cold and
//! check that they did.
//!
//! Where things live: `file` holds [`FlashFile`], [`ReaderOptions`] and [`IoMode`] (the read
//! path in `file/read.rs`); `error` the reader's errors; `sys` the platform primitives (aligned
//! bounce buffers, `pread`, opening for direct I/O); `residency` page-cache residency, eviction
//! and peak RSS; `direct` positional I/O for files flashlm writes itself; `size` size parsing
//! and formatting.

mod cache;
pub(crate) mod direct;
mod error;
mod file;
mod pool;
mod residency;
mod size;
mod sys;

pub use cache::{Admit, CacheKey, CacheStats, HostCache};
pub use error::{FileChange, FlashError};
pub use file::{FlashFault, FlashFile, IoMode, MAX_CHUNK, ReaderOptions};
pub use residency::{
    EVICTION_THRESHOLD, Residency, evict_page_cache, page_cache_residency, peak_rss_bytes,
};
pub use size::{format_size, parse_size};
pub use source::{ChunkSource, DirectReads, SourceError, WeightSource};
pub use sys::DIRECT_ALIGN;
pub(crate) use sys::{AlignedBuf, AlignedPool, PooledBuf};
// For `direct`, which reaches them as `super::…`.
use sys::{einval, pread};

pub mod queue;
pub mod source;
