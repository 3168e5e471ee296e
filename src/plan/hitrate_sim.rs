//! KV page-cache simulator, the check on [`super::hitrate`]'s model: [`CacheSim`] runs a
//! [`Policy`] over a request trace (per token, the `(layer, page)` requests in order) and counts
//! hits; [`simulate`] sends every request to the cache, [`simulate_prefetching`] does what the
//! engine does for selecting layers (the previous selection is prefetched around the cache),
//! [`simulate_lagged`] what it does under lagged selection (kept pages read around it);
//! [`exact_trace`] and [`quest_trace`] generate synthetic traces with the layout the model
//! assumes (candidates requested layer after layer, in ascending page order).

use super::hitrate::Policy;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A host page cache that counts its hits and misses.
#[derive(Clone, Debug)]
pub struct CacheSim {
    policy: Policy,
    capacity: u64,
    /// Cached page -> stamp of its last use.
    stamp: HashMap<(u32, u32), u64>,
    /// Stamp -> page, oldest first (Lru only).
    by_age: BTreeMap<u64, (u32, u32)>,
    clock: u64,
    hits: u64,
    misses: u64,
}

impl CacheSim {
    pub fn new(policy: Policy, capacity: u64) -> Self {
        CacheSim {
            policy,
            capacity,
            stamp: HashMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
            hits: 0,
            misses: 0,
        }
    }

    /// Requests a page; returns whether the cache held it. A miss admits the page (Pinned: if
    /// there is room; Lru: evicting the least recently used page when full).
    pub fn access(&mut self, layer: u32, page: u32) -> bool {
        let key = (layer, page);
        self.clock += 1;
        if let Some(old) = self.stamp.get_mut(&key) {
            self.hits += 1;
            if self.policy == Policy::Lru {
                self.by_age.remove(old);
                *old = self.clock;
                self.by_age.insert(self.clock, key);
            }
            return true;
        }
        self.misses += 1;
        if self.capacity == 0 {
            return false;
        }
        if self.stamp.len() as u64 >= self.capacity {
            if self.policy == Policy::Pinned {
                return false;
            }
            if let Some((_, oldest)) = self.by_age.pop_first() {
                self.stamp.remove(&oldest);
            }
        }
        self.stamp.insert(key, self.clock);
        if self.policy == Policy::Lru {
            self.by_age.insert(self.clock, key);
        }
        false
    }

    /// Whether the cache holds a page, without counting or touching it.
    pub fn contains(&self, layer: u32, page: u32) -> bool {
        self.stamp.contains_key(&(layer, page))
    }

    pub fn hits(&self) -> u64 {
        self.hits
    }

    pub fn misses(&self) -> u64 {
        self.misses
    }

    /// Pages held now.
    pub fn len(&self) -> usize {
        self.stamp.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamp.is_empty()
    }
}

/// Counts of one token of a simulated trace.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TokenCounts {
    pub requests: u64,
    /// Served by the host cache.
    pub hits: u64,
    /// Served by the prefetch ([`simulate`]: also requested by the previous token).
    pub prefetch_hits: u64,
    /// Pages read from flash: misses, and ([`simulate_prefetching`]) prefetched pages.
    pub flash_reads: u64,
}

/// The outcome of [`simulate`]: counts per token.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SimResult {
    pub per_token: Vec<TokenCounts>,
}

impl SimResult {
    /// Counts summed over the tokens from `warmup` on.
    pub fn totals(&self, warmup: usize) -> TokenCounts {
        let mut t = TokenCounts::default();
        for c in self.per_token.iter().skip(warmup) {
            t.requests += c.requests;
            t.hits += c.hits;
            t.prefetch_hits += c.prefetch_hits;
            t.flash_reads += c.flash_reads;
        }
        t
    }

    /// Pages read from flash per request over the tokens from `warmup` on.
    pub fn flash_per_request(&self, warmup: usize) -> f64 {
        let t = self.totals(warmup);
        ratio(t.flash_reads, t.requests)
    }

    /// Host-cache hit rate over the tokens from `warmup` on (0 without requests).
    pub fn hit_rate(&self, warmup: usize) -> f64 {
        let t = self.totals(warmup);
        ratio(t.hits, t.requests)
    }

    /// Prefetch hit rate over the tokens from `warmup` on (0 without requests).
    pub fn prefetch_hit_rate(&self, warmup: usize) -> f64 {
        let t = self.totals(warmup);
        ratio(t.prefetch_hits, t.requests)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Runs a trace (per token, the `(layer, page)` requests in order) through a cold cache.
pub fn simulate(trace: &[Vec<(u32, u32)>], policy: Policy, capacity: u64) -> SimResult {
    let mut cache = CacheSim::new(policy, capacity);
    let mut previous: HashSet<(u32, u32)> = HashSet::new();
    let mut per_token = Vec::with_capacity(trace.len());
    for token in trace {
        let mut counts = TokenCounts::default();
        for &(layer, page) in token {
            counts.requests += 1;
            let hit = cache.access(layer, page);
            counts.hits += u64::from(hit);
            counts.flash_reads += u64::from(!hit);
            counts.prefetch_hits += u64::from(previous.contains(&(layer, page)));
        }
        previous = token.iter().copied().collect();
        per_token.push(counts);
    }
    SimResult { per_token }
}

/// Runs a trace as the engine runs a selecting layer: before a layer's requests, the pages it
/// requested for the previous token that the cache does not hold are prefetched from flash
/// (a look that neither counts nor touches); a request is then served by the prefetch (the
/// cache untouched), else by the cache (a hit, touched), else read from flash and admitted
/// after the layer's hits. Prefetched pages not requested were read for nothing.
pub fn simulate_prefetching(trace: &[Vec<(u32, u32)>], policy: Policy, capacity: u64) -> SimResult {
    simulate_selecting(trace, policy, capacity, true)
}

/// Runs a trace as the engine runs a layer under lagged selection: its pages are read ahead
/// with nothing prefetched; a request is served by the cache (a hit, touched), else read from
/// flash, and admitted after the layer's hits only when the layer did not request it for the
/// previous token (a kept page the cache lacks is used once and not admitted, as a prefetched
/// one is in [`simulate_prefetching`]).
pub fn simulate_lagged(trace: &[Vec<(u32, u32)>], policy: Policy, capacity: u64) -> SimResult {
    simulate_selecting(trace, policy, capacity, false)
}

fn simulate_selecting(
    trace: &[Vec<(u32, u32)>],
    policy: Policy,
    capacity: u64,
    prefetch: bool,
) -> SimResult {
    let mut cache = CacheSim::new(policy, capacity);
    let mut previous: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut per_token = Vec::with_capacity(trace.len());
    for token in trace {
        let mut counts = TokenCounts::default();
        let mut current: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        // The requests of each layer in turn (a trace lists a layer's requests together).
        let mut at = 0;
        while at < token.len() {
            let layer = token[at].0;
            let end = at + token[at..].iter().take_while(|k| k.0 == layer).count();
            let fetched: HashSet<u32> = previous
                .get(&layer)
                .into_iter()
                .flatten()
                .copied()
                .filter(|&p| !cache.contains(layer, p))
                .collect();
            if prefetch {
                counts.flash_reads += fetched.len() as u64;
            }
            // As the engine's page job does: every cache look first, then the misses admitted.
            let mut missed = Vec::new();
            for &(_, page) in &token[at..end] {
                counts.requests += 1;
                if fetched.contains(&page) {
                    if prefetch {
                        counts.prefetch_hits += 1;
                    } else {
                        counts.flash_reads += 1;
                    }
                } else if cache.contains(layer, page) {
                    counts.hits += u64::from(cache.access(layer, page));
                } else {
                    missed.push(page);
                }
            }
            for page in missed {
                counts.flash_reads += 1;
                cache.access(layer, page);
            }
            current.insert(layer, token[at..end].iter().map(|k| k.1).collect());
            at = end;
        }
        previous = current;
        per_token.push(counts);
    }
    SimResult { per_token }
}

/// Mean over layers and tokens (from the second on) of `|S_t ∩ S_{t-1}| / |S_t|`, where `S_t` is
/// a layer's set of requested pages; layers with an empty `S_t` are left out (0 if none is left).
pub fn trace_reuse(trace: &[Vec<(u32, u32)>]) -> f64 {
    let (mut sum, mut count) = (0.0, 0u64);
    for pair in trace.windows(2) {
        let previous: HashSet<(u32, u32)> = pair[0].iter().copied().collect();
        let mut per_layer: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for &key in &pair[1] {
            let e = per_layer.entry(key.0).or_default();
            e.0 += 1;
            e.1 += u64::from(previous.contains(&key));
        }
        for (size, kept) in per_layer.into_values() {
            sum += ratio(kept, size);
            count += 1;
        }
    }
    if count == 0 { 0.0 } else { sum / count as f64 }
}

/// Page ids of the candidates of a layer: after the sink page (when there is a home page at
/// all), before the window.
fn candidates(pages: u32, home_pages: u32) -> std::ops::Range<u32> {
    let sink = home_pages.min(1);
    sink..sink + pages.saturating_sub(home_pages)
}

/// Exact attention: every token requests every candidate of every layer, layer by layer, in
/// ascending page order.
pub fn exact_trace(
    n_layers: u32,
    pages: u32,
    home_pages: u32,
    tokens: usize,
) -> Vec<Vec<(u32, u32)>> {
    let one: Vec<(u32, u32)> = (0..n_layers)
        .flat_map(|l| candidates(pages, home_pages).map(move |p| (l, p)))
        .collect();
    vec![one; tokens]
}

/// Quest top-`select`: the first token draws `select` candidates per layer uniformly; each later
/// one keeps `round(reuse * select)` pages of the previous selection (at least the forced
/// overlap `2*select - M`) chosen uniformly, and draws the rest uniformly from the other
/// candidates. Requests go layer by layer in ascending page order. `select >= M` requests every
/// candidate. The same arguments give the same trace.
pub fn quest_trace(
    n_layers: u32,
    pages: u32,
    home_pages: u32,
    select: u32,
    tokens: usize,
    reuse: f64,
    seed: u64,
) -> Vec<Vec<(u32, u32)>> {
    let cands: Vec<u32> = candidates(pages, home_pages).collect();
    let m = cands.len();
    let n = (select as usize).min(m);
    let r = if reuse.is_nan() {
        0.0
    } else {
        reuse.clamp(0.0, 1.0)
    };
    // r * n <= n fits usize; the forced overlap keeps the draw within the other candidates.
    let keep = ((r * n as f64).round() as usize).clamp((2 * n).saturating_sub(m), n);
    let mut rng = SplitMix64(seed);
    let mut selection: Vec<Vec<u32>> = (0..n_layers)
        .map(|_| {
            let mut all = cands.clone();
            rng.pick(&mut all, n);
            all
        })
        .collect();
    let mut trace = Vec::with_capacity(tokens);
    for t in 0..tokens {
        let mut token = Vec::new();
        for (layer, sel) in (0u32..).zip(selection.iter_mut()) {
            if t > 0 && n < m {
                let in_sel: HashSet<u32> = sel.iter().copied().collect();
                let mut others: Vec<u32> = cands
                    .iter()
                    .copied()
                    .filter(|p| !in_sel.contains(p))
                    .collect();
                rng.pick(sel, keep);
                rng.pick(&mut others, n - keep);
                sel.extend_from_slice(&others);
            }
            sel.sort_unstable();
            token.extend(sel.iter().map(|&p| (layer, p)));
        }
        trace.push(token);
    }
    trace
}

/// SplitMix64, for seeded synthetic traces.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Keeps a uniform choice of `k` (at most `v.len()`) elements of `v`, in arbitrary order.
    fn pick(&mut self, v: &mut Vec<u32>, k: usize) {
        let k = k.min(v.len());
        for i in 0..k {
            let j = i + self.below(v.len() - i);
            v.swap(i, j);
        }
        v.truncate(k);
    }
}

#[cfg(test)]
mod tests;
