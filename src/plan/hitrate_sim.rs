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
mod tests {
    use super::*;
    use crate::plan::hitrate::{KvModelInput, predict};

    #[test]
    fn cache_sim_counts_by_hand() {
        // Capacity 2, requests A B A C B A.
        let seq = [(0, 1), (0, 2), (0, 1), (1, 7), (0, 2), (0, 1)];
        let run = |policy| {
            let mut c = CacheSim::new(policy, 2);
            let hits: Vec<bool> = seq.iter().map(|&(l, p)| c.access(l, p)).collect();
            (hits, c.hits(), c.misses(), c.len())
        };
        // Lru: C evicts B (A was used after it), then B evicts A, then A evicts C.
        let lru = vec![false, false, true, false, false, false];
        assert_eq!(run(Policy::Lru), (lru, 1, 5, 2));
        // Pinned keeps A and B for good.
        let pinned = vec![false, false, true, false, true, true];
        assert_eq!(run(Policy::Pinned), (pinned, 3, 3, 2));
        let mut empty = CacheSim::new(Policy::Lru, 0);
        assert!(!empty.access(0, 0) && !empty.access(0, 0));
        assert!(empty.is_empty() && empty.misses() == 2);
    }

    #[test]
    fn exact_cyclic_scan_pinned_and_lru() {
        // 30 layers x 61 candidates: a cycle of 1830 pages; 500 pinned pages hit 500 of them.
        let trace = exact_trace(30, 66, 5, 4);
        assert!(trace.iter().all(|t| t.len() == 1830));
        let pinned = simulate(&trace, Policy::Pinned, 500);
        assert_eq!(pinned.per_token[0].hits, 0);
        for t in &pinned.per_token[1..] {
            assert_eq!((t.requests, t.hits, t.prefetch_hits), (1830, 500, 1830));
        }
        let model = |cache_pages, policy| {
            predict(&KvModelInput {
                n_layers: 30,
                page_bytes: 1,
                pages: 66,
                home_pages: 5,
                select: None,
                cache_pages,
                policy,
                reuse: 0.0,
                lagged: false,
            })
        };
        let p = model(500, Policy::Pinned);
        assert!((p.hit_rate - pinned.hit_rate(1)).abs() < 1e-12);
        assert!((p.hit_rate - 500.0 / 1830.0).abs() < 1e-12);
        assert_eq!(p.prefetch_hit_rate, pinned.prefetch_hit_rate(1));
        assert_eq!(simulate(&trace, Policy::Lru, 500).totals(0).hits, 0);
        assert_eq!(simulate(&trace, Policy::Lru, 1829).totals(0).hits, 0);
        assert_eq!(model(1829, Policy::Lru).hit_rate, 0.0);
        assert_eq!(simulate(&trace, Policy::Lru, 1830).hit_rate(1), 1.0);
        assert_eq!(model(1830, Policy::Lru).hit_rate, 1.0);
    }

    /// The model against a simulator on quest traces of 12 layers (fewer layers make the
    /// within-burst effects the model averages out larger), M = 61 candidates, N = 8, 2500
    /// tokens of which the first 500 warm the cache, over reuses and cache sizes: the worst
    /// absolute errors of the hit rate, the prefetch hit rate (0 when lagged) and the flash
    /// pages per request, and a line per point. Lagged: against [`simulate_lagged`], and no
    /// page may be read for nothing or on demand; else against [`simulate_prefetching`].
    fn quest_model_against_simulator(lagged: bool) -> ([f64; 3], String) {
        let (l, pages, home, n) = (12u32, 66u32, 5u32, 8u32);
        let mut report = String::new();
        let mut worst = [0.0f64; 3];
        for (r, seed) in [(0.0, 1), (0.5, 2), (0.9, 3)] {
            let trace = quest_trace(l, pages, home, n, 2500, r, seed);
            let reuse = trace_reuse(&trace);
            for c_l in [0, 2, 4, 6, 7, 9, 12, 20, 30, 40, 50, 58, 61] {
                let c = u64::from(c_l * l);
                for policy in [Policy::Lru, Policy::Pinned] {
                    let model = predict(&KvModelInput {
                        n_layers: l,
                        page_bytes: 1,
                        pages,
                        home_pages: home,
                        select: Some(n),
                        cache_pages: c,
                        policy,
                        reuse,
                        lagged,
                    });
                    let sim = if lagged {
                        assert_eq!(model.wasted_prefetch_per_token, 0.0);
                        assert_eq!(model.demand_flash_bytes_per_token, 0.0);
                        simulate_lagged(&trace, policy, c)
                    } else {
                        simulate_prefetching(&trace, policy, c)
                    };
                    let flash = model.flash_bytes_per_token / model.requests_per_token;
                    let prefetch_err = if lagged {
                        0.0
                    } else {
                        (model.prefetch_hit_rate - sim.prefetch_hit_rate(500)).abs()
                    };
                    let e = [
                        (model.hit_rate - sim.hit_rate(500)).abs(),
                        prefetch_err,
                        (flash - sim.flash_per_request(500)).abs(),
                    ];
                    for (w, e) in worst.iter_mut().zip(e) {
                        *w = w.max(e);
                    }
                    report += &format!(
                        "r {r} (measured {reuse:.3}) C_l {c_l} {policy:?}: hit model {:.4} sim {:.4} | \
                         prefetch model {:.4} sim {:.4} | flash model {flash:.4} sim {:.4}\n",
                        model.hit_rate,
                        sim.hit_rate(500),
                        model.prefetch_hit_rate,
                        sim.prefetch_hit_rate(500),
                        sim.flash_per_request(500),
                    );
                }
            }
        }
        (worst, report)
    }

    /// The model against the engine-order simulator. Tolerances, absolute: hit rate and
    /// prefetch hit rate 0.04, flash pages per request 0.08 (it adds the errors of both; the
    /// model is low where a small cache still holds a few drawn pages). The cache sizes stay
    /// off the edge of the one large step above `C = L*N`, which the simulator climbs over the
    /// `N` pages below it.
    #[test]
    fn quest_model_matches_simulator() {
        let (worst, report) = quest_model_against_simulator(false);
        assert!(
            worst[0] <= 0.04 && worst[1] <= 0.04 && worst[2] <= 0.08,
            "worst {worst:?}\n{report}"
        );
    }

    /// Lagged selection (nothing prefetched, kept pages the cache lacks not admitted) against
    /// its simulator on the same traces: hit rate and flash pages per request within 0.04 (the
    /// hits are the prefetching engine's; nothing is read for nothing).
    #[test]
    fn lagged_quest_model_matches_its_simulator() {
        let (worst, report) = quest_model_against_simulator(true);
        assert!(
            worst[0] <= 0.04 && worst[2] <= 0.04,
            "worst {worst:?}\n{report}"
        );
    }

    #[test]
    fn quest_lru_below_one_selection_per_layer() {
        // 12 layers, 8 of 61 candidates, half of each selection kept: the prefetch keeps
        // C - L*N(1-r) kept pages hot, where a cache every request touches holds none.
        let (l, n) = (12u32, 8u32);
        let trace = quest_trace(l, 66, 5, n, 1500, 0.5, 9);
        for (c, want) in [(l * n / 4, 0.0), (3 * l * n / 4, 0.25), (l * n - 4, 0.46)] {
            if c <= l * n - n {
                let plain = simulate(&trace, Policy::Lru, u64::from(c));
                assert_eq!(plain.totals(0).hits, 0, "cache {c}");
            }
            let got = simulate_prefetching(&trace, Policy::Lru, u64::from(c)).hit_rate(300);
            assert!((got - want).abs() < 0.03, "cache {c}: {got}, want {want}");
        }
        let above = simulate_prefetching(&trace, Policy::Lru, u64::from(l * n + n)).hit_rate(300);
        assert!((above - 0.5).abs() < 0.02, "{above}");
    }

    #[test]
    fn prefetching_by_hand() {
        // One layer, pages 1 and 2 then 2 and 3, a cache of one page. Token 1: both miss
        // (nothing to prefetch), 2 is admitted last. Token 2: the prefetch looks at 1 (not
        // cached: read) and 2 (cached: skipped); 2 hits, 3 misses and evicts 2; 1 was read
        // for nothing.
        let trace = vec![vec![(0, 1), (0, 2)], vec![(0, 2), (0, 3)]];
        let s = simulate_prefetching(&trace, Policy::Lru, 1);
        assert_eq!(
            s.per_token,
            vec![
                TokenCounts {
                    requests: 2,
                    hits: 0,
                    prefetch_hits: 0,
                    flash_reads: 2
                },
                TokenCounts {
                    requests: 2,
                    hits: 1,
                    prefetch_hits: 0,
                    flash_reads: 2
                },
            ]
        );
        // Token 3 asks for 2 and 3 again: 3 is cached (skipped), 2 is prefetched and served
        // from there without entering the cache.
        let mut t3 = trace.clone();
        t3.push(vec![(0, 2), (0, 3)]);
        let s = simulate_prefetching(&t3, Policy::Lru, 1);
        assert_eq!(
            s.per_token[2],
            TokenCounts {
                requests: 2,
                hits: 1,
                prefetch_hits: 1,
                flash_reads: 1
            }
        );
    }

    #[test]
    fn quest_selecting_every_candidate_is_the_exact_trace() {
        let exact = exact_trace(5, 20, 4, 6);
        for select in [16, 17, u32::MAX] {
            let quest = quest_trace(5, 20, 4, select, 6, 0.2, 11);
            assert_eq!(quest, exact);
        }
        for policy in [Policy::Pinned, Policy::Lru] {
            for c in [0, 10, 79, 80] {
                let a = simulate(&exact, policy, c);
                let b = simulate(&quest_trace(5, 20, 4, 16, 6, 0.7, 3), policy, c);
                assert_eq!(a.per_token, b.per_token);
            }
        }
    }

    #[test]
    fn quest_trace_has_the_requested_shape_and_reuse() {
        let trace = quest_trace(3, 40, 6, 10, 50, 0.7, 5);
        assert_eq!(trace, quest_trace(3, 40, 6, 10, 50, 0.7, 5));
        assert_ne!(trace, quest_trace(3, 40, 6, 10, 50, 0.7, 6));
        for token in &trace {
            assert_eq!(token.len(), 30);
            for layer in 0..3 {
                let sel: Vec<u32> = token.iter().filter(|k| k.0 == layer).map(|k| k.1).collect();
                assert_eq!(sel.len(), 10);
                // Candidates lie after the sink page and before the window: 1..=34.
                assert!(sel.windows(2).all(|w| w[0] < w[1]) && sel[0] >= 1 && sel[9] <= 34);
            }
        }
        assert!((trace_reuse(&trace) - 0.7).abs() < 1e-12);
        // 8 of 10 candidates: at least 6 are kept, whatever the reuse asked for.
        let forced = quest_trace(2, 12, 2, 8, 20, 0.0, 1);
        assert!((trace_reuse(&forced) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn degenerate_traces() {
        for trace in [
            quest_trace(4, 0, 0, 3, 5, 0.5, 1),
            quest_trace(4, 5, 5, 3, 5, 0.5, 1),
            quest_trace(4, 5, 9, 3, 5, f64::NAN, 1),
            quest_trace(4, 30, 2, 0, 5, 0.5, 1),
            quest_trace(0, 30, 2, 3, 5, 0.5, 1),
            exact_trace(4, 3, 7, 5),
        ] {
            assert!(trace.iter().all(|t| t.is_empty()));
            let s = simulate(&trace, Policy::Lru, 10);
            assert_eq!((s.hit_rate(0), s.prefetch_hit_rate(0)), (0.0, 0.0));
            assert_eq!(trace_reuse(&trace), 0.0);
        }
        assert!(quest_trace(4, 30, 2, 3, 0, 0.5, 1).is_empty());
        let none = simulate(&[], Policy::Pinned, 0);
        assert_eq!((none.hit_rate(0), none.hit_rate(99)), (0.0, 0.0));
        let cold = simulate(&exact_trace(2, 10, 2, 3), Policy::Pinned, 0);
        assert_eq!(cold.totals(0).hits, 0);
    }
}
