//! A host-memory cache of file ranges under a byte budget (`--dram-budget`), least recently
//! used first out.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;

use super::{FlashError, FlashFile};

/// Counters of a [`DramCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    /// Bytes served from the cache.
    pub hit_bytes: u64,
    /// Bytes read from the file on misses.
    pub miss_bytes: u64,
    /// Entries dropped to stay under the budget.
    pub evictions: u64,
    /// Bytes held now.
    pub cached_bytes: u64,
    pub entries: u64,
}

struct Entry {
    data: Arc<[u8]>,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<(u64, usize), Entry>,
    /// Last-use tick → key, oldest first.
    order: BTreeMap<u64, (u64, usize)>,
    used: u64,
    tick: u64,
    stats: CacheStats,
}

impl Inner {
    fn touch(&mut self, key: (u64, usize)) -> Option<Arc<[u8]>> {
        self.tick += 1;
        let tick = self.tick;
        let e = self.map.get_mut(&key)?;
        self.order.remove(&e.tick);
        e.tick = tick;
        self.order.insert(tick, key);
        Some(e.data.clone())
    }
}

/// Byte ranges of one file kept in host memory, keyed by (file offset, length), evicted least
/// recently used first so that the bytes held never exceed the budget. A range larger than the
/// budget is read and returned but not kept.
pub struct DramCache {
    budget: u64,
    inner: Mutex<Inner>,
}

impl DramCache {
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            budget: budget_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The data stays consistent even if a holder panicked: every update completes before
        // anything that could panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The `len` bytes at `offset` of `file`: from the cache, else read from the file (and kept
    /// when they fit the budget).
    pub fn get(&self, file: &FlashFile, offset: u64, len: usize) -> Result<Arc<[u8]>, FlashError> {
        let key = (offset, len);
        {
            let mut g = self.lock();
            if let Some(d) = g.touch(key) {
                g.stats.hits += 1;
                g.stats.hit_bytes += len as u64;
                return Ok(d);
            }
        }
        // Read without holding the lock so other ranges stay available meanwhile.
        let mut buf = vec![0u8; len];
        file.read_into(offset, &mut buf)?;
        let data: Arc<[u8]> = Arc::from(buf);
        let mut g = self.lock();
        g.stats.misses += 1;
        g.stats.miss_bytes += len as u64;
        if let Some(d) = g.touch(key) {
            // Another thread read the same range meanwhile.
            return Ok(d);
        }
        let size = len as u64;
        if size > self.budget {
            return Ok(data);
        }
        while g.used + size > self.budget {
            let Some((_, old)) = g.order.pop_first() else {
                break;
            };
            if let Some(e) = g.map.remove(&old) {
                g.used -= e.data.len() as u64;
                g.stats.evictions += 1;
            }
        }
        g.tick += 1;
        let tick = g.tick;
        g.order.insert(tick, key);
        g.map.insert(
            key,
            Entry {
                data: data.clone(),
                tick,
            },
        );
        g.used += size;
        Ok(data)
    }

    /// Whether the range is cached (does not count as a use).
    pub fn contains(&self, offset: u64, len: usize) -> bool {
        self.lock().map.contains_key(&(offset, len))
    }

    pub fn stats(&self) -> CacheStats {
        let g = self.lock();
        CacheStats {
            cached_bytes: g.used,
            entries: g.map.len() as u64,
            ..g.stats
        }
    }

    /// Bytes held now (never more than the budget).
    pub fn cached_bytes(&self) -> u64 {
        self.lock().used
    }

    pub fn clear(&self) {
        let mut g = self.lock();
        g.map.clear();
        g.order.clear();
        g.used = 0;
    }
}
