//! The host-memory cache (`--dram-budget`): one byte budget shared by weight ranges and KV
//! pages.
//!
//! Entries are admitted in one of two ways:
//! - [`Admit::Pinned`]: kept until the budget is used up and never evicted. Streamed weights
//!   and exact-attention KV pages are read in the same cyclic order every token; under LRU a
//!   cache smaller than the cycle would never hit, while pinning serves a fixed share of the
//!   cycle from DRAM every token.
//! - [`Admit::Lru`]: evicted least recently used first to make room for newer LRU entries;
//!   for KV pages chosen by page selection, whose accesses repeat from token to token.
//!
//! A pinned admission may evict LRU entries (pinned data is the more valuable); an LRU admission
//! never evicts pinned data. Nothing is ever held beyond the budget.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;

/// A cached range: a key space (weights, KV pages of a store, ...) and two numbers within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub space: u32,
    pub a: u64,
    pub b: u64,
}

impl CacheKey {
    pub fn new(space: u32, a: u64, b: u64) -> Self {
        Self { space, a, b }
    }
}

/// How an entry is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Pinned,
    Lru,
}

/// Counters of a [`HostCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_bytes: u64,
    /// Of `hit_bytes`, bytes of weight ranges (key space 0).
    pub weight_hit_bytes: u64,
    /// Entries dropped to make room.
    pub evictions: u64,
    /// Bytes held now, and of those pinned.
    pub cached_bytes: u64,
    pub pinned_bytes: u64,
    pub entries: u64,
}

struct Entry {
    data: Box<[u8]>,
    /// LRU tick; `None` for pinned entries.
    tick: Option<u64>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<CacheKey, Entry>,
    /// Last-use tick → key of LRU entries, oldest first.
    order: BTreeMap<u64, CacheKey>,
    used: u64,
    pinned: u64,
    tick: u64,
    stats: CacheStats,
}

/// Byte ranges kept in host memory under a budget.
pub struct HostCache {
    budget: u64,
    inner: Mutex<Inner>,
}

impl HostCache {
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

    /// Copy the entry `key` into `dst` when it is cached with exactly that length (a hit);
    /// otherwise count a miss and return false.
    pub fn get(&self, key: CacheKey, dst: &mut [u8]) -> bool {
        let mut g = self.lock();
        g.tick += 1;
        let tick = g.tick;
        let (hit, old_tick) = match g.map.get_mut(&key) {
            Some(e) if e.data.len() == dst.len() => {
                dst.copy_from_slice(&e.data);
                let old = e.tick;
                if e.tick.is_some() {
                    e.tick = Some(tick);
                }
                (true, old)
            }
            _ => (false, None),
        };
        if let Some(old) = old_tick {
            g.order.remove(&old);
            g.order.insert(tick, key);
        }
        if hit {
            g.stats.hits += 1;
            g.stats.hit_bytes += dst.len() as u64;
            if key.space == 0 {
                g.stats.weight_hit_bytes += dst.len() as u64;
            }
        } else {
            g.stats.misses += 1;
        }
        hit
    }

    /// Whether `key` is cached (not counted as a use).
    pub fn contains(&self, key: CacheKey) -> bool {
        self.lock().map.contains_key(&key)
    }

    /// Keep a copy of `data` under `key` if the policy lets it in; returns whether it is kept.
    pub fn insert(&self, key: CacheKey, data: &[u8], admit: Admit) -> bool {
        let size = data.len() as u64;
        if size == 0 || size > self.budget {
            return false;
        }
        let mut g = self.lock();
        if g.map.contains_key(&key) {
            return true;
        }
        // Room: free bytes, plus (for pinned data, and for LRU data) LRU entries to evict.
        let evictable = g.used - g.pinned;
        if g.used + size > self.budget && g.used + size - evictable > self.budget {
            return false;
        }
        while g.used + size > self.budget {
            let Some((_, old)) = g.order.pop_first() else {
                return false;
            };
            if let Some(e) = g.map.remove(&old) {
                g.used -= e.data.len() as u64;
                g.stats.evictions += 1;
            }
        }
        let tick = match admit {
            Admit::Pinned => {
                g.pinned += size;
                None
            }
            Admit::Lru => {
                g.tick += 1;
                let t = g.tick;
                g.order.insert(t, key);
                Some(t)
            }
        };
        g.used += size;
        g.map.insert(
            key,
            Entry {
                data: data.into(),
                tick,
            },
        );
        true
    }

    /// Drop every entry of key space `space` whose `a` satisfies `pred` (e.g. the pages of a
    /// finished sequence).
    pub fn remove_where(&self, space: u32, pred: impl Fn(u64, u64) -> bool) {
        let mut g = self.lock();
        let keys: Vec<CacheKey> = g
            .map
            .keys()
            .filter(|k| k.space == space && pred(k.a, k.b))
            .copied()
            .collect();
        for k in keys {
            if let Some(e) = g.map.remove(&k) {
                g.used -= e.data.len() as u64;
                match e.tick {
                    Some(t) => {
                        g.order.remove(&t);
                    }
                    None => g.pinned -= e.data.len() as u64,
                }
            }
        }
    }

    pub fn stats(&self) -> CacheStats {
        let g = self.lock();
        CacheStats {
            cached_bytes: g.used,
            pinned_bytes: g.pinned,
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
        g.pinned = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(a: u64) -> CacheKey {
        CacheKey::new(1, a, 0)
    }

    #[test]
    fn lru_evicts_oldest_and_pinned_stays() {
        let c = HostCache::new(300);
        let d = [7u8; 100];
        assert!(c.insert(k(1), &d, Admit::Lru));
        assert!(c.insert(k(2), &d, Admit::Lru));
        assert!(c.insert(k(3), &d, Admit::Pinned));
        let mut buf = [0u8; 100];
        assert!(c.get(k(1), &mut buf)); // 1 is now newer than 2
        assert!(c.insert(k(4), &d, Admit::Lru)); // evicts 2
        assert!(c.contains(k(1)) && !c.contains(k(2)) && c.contains(k(3)) && c.contains(k(4)));
        // A pinned admission evicts LRU data; an LRU one never evicts pinned data.
        assert!(c.insert(k(5), &d, Admit::Pinned));
        assert!(c.insert(k(6), &d, Admit::Pinned));
        assert_eq!(c.stats().pinned_bytes, 300);
        assert!(!c.insert(k(7), &d, Admit::Lru));
        assert!(!c.insert(k(8), &d, Admit::Pinned));
        assert!(c.cached_bytes() <= 300);
        // Wrong length is a miss.
        let mut small = [0u8; 10];
        assert!(!c.get(k(3), &mut small));
        c.remove_where(1, |a, _| a == 5);
        assert!(!c.contains(k(5)));
        assert_eq!(c.stats().pinned_bytes, 200);
        let s = c.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
        assert!(!HostCache::new(0).insert(k(1), &d, Admit::Pinned));
    }
}
