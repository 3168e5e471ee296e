//! KV page hit-rate model: how many KV pages a token fetches, and how many of those the host
//! (DRAM) cache serves, so that flash traffic can be planned before running.
//!
//! # Setting
//! Each of `L` layers has `pages` past pages; `home_pages` of them live on the device (the sink
//! page and the window of recent pages), leaving `M = pages - home_pages` candidate pages per
//! layer. Each token, layer after layer, the attended candidates are requested in ascending page
//! order: all `M` of them (exact) or `N` of them (quest top-N, `N < M`). The host cache holds
//! `C` pages shared by all layers; `C_l = C / L` is a layer's share. Rates are steady-state
//! (warm cache, fixed `pages`). A cache hit is decided by the LRU stack distance: the number of
//! distinct other pages requested since the page's previous request; LRU holds the page iff that
//! distance is below `C`.
//!
//! # Exact attention: a cyclic scan of `K = L*M` distinct pages per token
//! - Pinned (admit until full, never evict): the same `min(C, K)` pages stay cached, so
//!   `hit = min(1, C / K)`.
//! - Lru: every stack distance is `K - 1`, so `hit = 1` if `C >= K`, else `0` (the classic
//!   failure of LRU on a cyclic scan).
//!
//! # Quest top-N (`N < M`), reuse `r`
//! A layer's selection keeps a share `r` of the previous token's pages and draws the other
//! `N(1-r)` pages from the `M - N` unselected candidates, all equally likely. A selection
//! overlaps the previous one by at least `2N - M` pages, so `r` is raised to
//! `max(r, (2N - M) / N)`. In the long run every candidate is selected equally often (a real
//! selection with hot pages does better than predicted, under both policies).
//! - Pinned: the cache keeps the first `C` pages it saw, each requested with the same
//!   frequency as any of the `L*M` candidates: `hit = min(1, C / (L*M))`, as for exact.
//! - Lru. Seen from one page, a selected page stays selected with probability `r` and an
//!   unselected one is drawn with probability `q = N(1-r) / (M-N)` per token. A requested page
//!   was therefore either kept from the previous token (share `r`), or drawn after an absence:
//!   last requested `g >= 2` tokens ago with probability `q (1-q)^(g-2)` (share `1 - r`).
//!   Between two requests `g` tokens apart every layer makes `g` request bursts (for the page's
//!   own layer the end of the first and the start of the last burst count as about one),
//!   touching `U(g)` distinct pages, where `U(1) = N` and each token's `N(1-r)` draws land on
//!   untouched pages in proportion `(M - U) / (M - N)`: `U(g) = M - (M-N)(1-q)^(g-1)`. The
//!   stack distance is about `L*U(g) - 1`, so the request hits iff `U(g) <= C_l`. Summing:
//!
//!   `hit = r*[C_l >= N] + (1-r) * (1 - (1-q)^G)`,
//!
//!   where `G`, the number of absence lengths `g = 2..=G+1` short enough to hit, is the largest
//!   integer with `(1-q)^G >= x = (M - C_l) / (M - N)`, i.e. `G = floor(ln x / ln(1-q))`
//!   (`G = 0` when `C_l < N`; every request hits when `C_l >= M`).
//!
//!   This holds from `C = L*N` up, where every selected page the cache holds is touched each
//!   token. The staircase has steps at `C_l = U(g)`, of height `(1-r) q (1-q)^(g-2)`; the stack
//!   distances vary with a page's position within its bursts, so a simulated cache climbs each
//!   step over about one selection (`N` pages of `C`) below its edge. Taking `G` unrounded gives
//!   `hit = r + (1-r) (C_l - N) / (M - N)`, which overestimates at low reuse.
//! - Lru below one selection per layer (`C < L*N`). Here the engine's prefetch matters: a kept
//!   page the cache does not hold is read by the prefetch and used from there, and is neither
//!   admitted nor touched; a kept page the cache holds is skipped by the prefetch and served
//!   (and touched) by the cache; drawn pages that miss are admitted. So a selected page, once
//!   cached, stays cached while it stays selected unless evictions reach it, and the pages
//!   touched or admitted per token settle at the capacity: `hits + admissions = C`, with `L*N
//!   (1-r)` admissions (drawn pages, hardly ever still cached in so small a cache). Hence
//!
//!   `hit = clamp(C / (L*N) - (1-r), 0, r)`,
//!
//!   every hit a kept page, and the other kept pages (`r - hit`) come from the prefetch. A
//!   plain LRU that every request touched would hit nothing here (a cyclic scan); skipping the
//!   prefetched pages is what keeps `C` pages hot. The two regimes meet at `C = L*N` (`hit =
//!   r`). On synthetic traces the simulator's engine-order run
//!   ([`super::hitrate_sim::simulate_prefetching`]) agrees within 0.04; the model is a little
//!   low at the small end, where a few drawn pages are still cached.
//! - When `N >= M` quest attends every candidate: the prediction is the exact one.
//!
//! # Prefetch
//! While layer `l` computes, layer `l+1`'s previous selection is fetched early. A needed page was
//! prefetched when it was also selected for the previous token: share `r` under quest, `1` under
//! exact (for every layer, the first included: its pages are fetched during the previous token).
//! The other `N(1-r)` prefetched pages of a selecting layer are not needed: they were read for
//! nothing, from flash unless the host cache holds them. The cache holds a dropped page as
//! often as a kept one (both were selected one token ago): `hit_wasted` is 1 under LRU from
//! `C >= L*N`, `hit / r` below (0 at `r = 0`), and the hit rate under Pinned. Flash bytes
//! per token are therefore `page_bytes * (L*N*(1-hit) + L*N*(1-r)*(1-hit_wasted))` under quest,
//! not only the first term. The prefetch serves the kept pages the cache does not hold: `r -
//! kept_cached` of the requests (`kept_cached`: `r` under LRU from `C >= L*N`, `hit` below, `r *
//! hit` under Pinned); under exact attention every page is queued early, a prefetch hit.
//!
//! # Lagged selection
//! A layer may choose its pages from the previous token's page scores instead of waiting for
//! its own. Its selection is then known before it runs and is read ahead as exact attention's
//! pages are: no prefetch, nothing read for nothing, every needed page queued early. A kept
//! page the cache lacks is read and used once, not admitted, as a prefetched one is, so the
//! cache evolves as under the prefetch and the hit rate is the quest one above (below one
//! selection per layer too); the flash bytes are the misses alone. Admitting those pages
//! instead would make the selections a cyclic scan of about `L*N` pages under LRU, hitting
//! nothing below `C = L*N`. [`super::hitrate_sim::simulate_lagged`] runs this order.
//!
//! The simulator in [`super::hitrate_sim`] counts hits on synthetic traces of this layout; its
//! tests check the model against it.

use serde::Serialize;

/// Host-cache replacement policy.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub enum Policy {
    /// Admit pages until the cache is full, never evict (right for cyclic scans).
    Pinned,
    /// Least recently used.
    Lru,
}

/// What the model needs to know about a configuration.
#[derive(Clone, Debug, Serialize)]
pub struct KvModelInput {
    pub n_layers: u32,
    pub page_bytes: u64,
    /// Past pages per layer (full ones plus the filling one).
    pub pages: u32,
    /// Device-resident pages per layer (sink + window, the filling page included).
    pub home_pages: u32,
    /// `None`: exact attention; `Some(N)`: quest top-N among the non-home pages.
    pub select: Option<u32>,
    /// Host-cache capacity in pages (all layers together).
    pub cache_pages: u64,
    pub policy: Policy,
    /// Measured selection reuse across tokens, `|S_t ∩ S_{t-1}| / |S_t|` (ignored for exact;
    /// clamped to [0, 1], NaN read as 0).
    pub reuse: f64,
    /// Lagged selection: a layer's pages are chosen from the previous token's scores, known
    /// before the layer runs, so they are queued ahead through the cache like exact
    /// attention's, with no separate prefetch (module docs).
    pub lagged: bool,
}

/// Predicted steady-state KV traffic per token. Rates are 0 when nothing is requested.
#[derive(Clone, Debug, Serialize)]
pub struct KvPrediction {
    /// Non-home pages fetched per token (all layers).
    pub requests_per_token: f64,
    /// Share of those served by the host cache.
    pub hit_rate: f64,
    /// KV bytes read from flash per token: `requests * page_bytes * (1 - hit)`.
    pub flash_bytes_per_token: f64,
    /// KV bytes fetched per token: `requests * page_bytes`.
    pub kv_bytes_per_token: f64,
    /// Share of needed pages already prefetched.
    pub prefetch_hit_rate: f64,
    /// Pages prefetched per token and then not selected (read for nothing; included in
    /// `flash_bytes_per_token` where the host cache does not hold them).
    pub wasted_prefetch_per_token: f64,
    /// KV bytes read from flash per token only once a layer has chosen its pages (needed
    /// pages neither prefetched nor in the host cache): attention waits for them.
    pub demand_flash_bytes_per_token: f64,
    /// Needed KV bytes per token served by page selection's predictive prefetch (0 for
    /// exact attention, whose reads ahead go straight to the device).
    pub prefetched_bytes_per_token: f64,
}

/// Predicts the steady-state KV page traffic of a configuration (see the module docs).
pub fn predict(i: &KvModelInput) -> KvPrediction {
    let l = f64::from(i.n_layers);
    let m = i.pages.saturating_sub(i.home_pages);
    let c = i.cache_pages as f64;
    // (pages per layer, effective reuse); quest with N >= M is exact.
    let (n, r) = match i.select {
        Some(n) if n < m => (n, quest_reuse(i.reuse, n, m)),
        _ => (m, 1.0),
    };
    let requests = l * f64::from(n);
    let hit_rate = if requests <= 0.0 {
        0.0
    } else {
        let all = l * f64::from(m);
        match i.policy {
            Policy::Pinned => (c / all).min(1.0),
            Policy::Lru if c >= all => 1.0,
            Policy::Lru if n == m => 0.0,
            // Below one selection per layer (module docs: prefetched pages bypass the cache).
            Policy::Lru if c < requests => (c / requests - (1.0 - r)).clamp(0.0, r),
            Policy::Lru => r + (1.0 - r) * returning_hits(c / l, f64::from(n), f64::from(m), r),
        }
    };
    let kv_bytes = requests * i.page_bytes as f64;
    // Under quest the previous token's selection is prefetched (module docs): the share 1 - r
    // of it that the new selection drops was read for nothing, unless the cache held it (as
    // often as it holds a kept page).
    // A lagged selection prefetches nothing: its pages are read ahead as exact ones are.
    let quest = n < m && !i.lagged;
    let wasted = if quest { requests * (1.0 - r) } else { 0.0 };
    let kept_cached = match i.policy {
        Policy::Pinned => r * hit_rate,
        Policy::Lru if c >= requests => r,
        Policy::Lru => hit_rate,
    };
    let wasted_hit = match i.policy {
        Policy::Pinned => hit_rate,
        Policy::Lru if c >= requests => 1.0,
        Policy::Lru if r > 0.0 => (hit_rate / r).min(1.0),
        Policy::Lru => 0.0,
    };
    // Kept pages the cache holds are served by it (the prefetch skips them); the other kept
    // pages come from the prefetch. Exact attention queues every page early: all prefetched.
    let prefetch_hit_rate = if requests <= 0.0 {
        0.0
    } else if quest {
        (r - kept_cached).max(0.0)
    } else {
        1.0
    };
    KvPrediction {
        requests_per_token: requests,
        hit_rate,
        flash_bytes_per_token: (requests * (1.0 - hit_rate) + wasted * (1.0 - wasted_hit))
            * i.page_bytes as f64,
        kv_bytes_per_token: kv_bytes,
        prefetch_hit_rate,
        wasted_prefetch_per_token: wasted,
        demand_flash_bytes_per_token: if quest {
            kv_bytes * (1.0 - hit_rate - prefetch_hit_rate).max(0.0)
        } else {
            0.0
        },
        prefetched_bytes_per_token: if quest {
            kv_bytes * prefetch_hit_rate
        } else {
            0.0
        },
    }
}

/// Share of the drawn (not kept) pages that LRU still holds, for a layer share `c_l` with
/// `n <= c_l < m` (module docs: `1 - (1-q)^G`).
fn returning_hits(c_l: f64, n: f64, m: f64, r: f64) -> f64 {
    let q = n * (1.0 - r) / (m - n);
    if !(q > 0.0 && q < 1.0) {
        // q = 0: nothing is drawn; q = 1: every absent page returns only after all M were used.
        return 0.0;
    }
    let x = (m - c_l) / (m - n);
    // ln x <= 0 and ln(1-q) < 0; the small slack keeps exact step edges on the upper level.
    let g = (x.ln() / (1.0 - q).ln() + 1e-9).floor().max(0.0);
    1.0 - (1.0 - q).powf(g)
}

/// The reuse a quest selection of `n` among `m > n` candidates can have: the measured value
/// clamped to [0, 1] and raised to the forced overlap `(2n - m) / n`.
fn quest_reuse(reuse: f64, n: u32, m: u32) -> f64 {
    let r = if reuse.is_nan() {
        0.0
    } else {
        reuse.clamp(0.0, 1.0)
    };
    if n == 0 {
        return r;
    }
    let forced = (2.0 * f64::from(n) - f64::from(m)).max(0.0) / f64::from(n);
    r.max(forced)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(n_layers: u32, pages: u32, home_pages: u32, select: Option<u32>) -> KvModelInput {
        KvModelInput {
            n_layers,
            page_bytes: 4096,
            pages,
            home_pages,
            select,
            cache_pages: 0,
            policy: Policy::Pinned,
            reuse: 0.0,
            lagged: false,
        }
    }

    fn with(i: &KvModelInput, cache_pages: u64, policy: Policy, reuse: f64) -> KvPrediction {
        predict(&KvModelInput {
            cache_pages,
            policy,
            reuse,
            lagged: i.lagged,
            ..i.clone()
        })
    }

    #[test]
    fn dropped_prefetches_are_read_for_nothing() {
        // 12 layers, quest 8 of 61 candidates, half of each selection kept: each token reads
        // 96 selected pages and prefetched 48 it then dropped.
        let i = input(12, 66, 5, Some(8));
        let p = with(&i, 0, Policy::Lru, 0.5);
        assert_eq!(p.requests_per_token, 96.0);
        assert_eq!(p.wasted_prefetch_per_token, 48.0);
        assert_eq!(p.flash_bytes_per_token, 144.0 * 4096.0);
        // The half of each selection that the previous one did not hold is read on demand,
        // once the layer has chosen it; exact attention reads nothing on demand.
        assert_eq!(p.demand_flash_bytes_per_token, 48.0 * 4096.0);
        // The other half came from the prefetch.
        assert_eq!(p.prefetched_bytes_per_token, 48.0 * 4096.0);
        // An LRU cache of one selection per layer holds the previous selection: the dropped
        // prefetches hit it, and so do the kept pages.
        let p = with(&i, 96, Policy::Lru, 0.5);
        assert_eq!(p.hit_rate, 0.5);
        assert_eq!(p.flash_bytes_per_token, 48.0 * 4096.0);
        // Exact attention prefetches only what it needs.
        let p = with(&input(12, 66, 5, None), 0, Policy::Lru, 0.5);
        assert_eq!(p.wasted_prefetch_per_token, 0.0);
        assert_eq!(p.demand_flash_bytes_per_token, 0.0);
        assert_eq!(p.prefetched_bytes_per_token, 0.0);
        assert_eq!(p.flash_bytes_per_token, p.kv_bytes_per_token);
    }

    #[test]
    fn exact_pinned_is_cache_over_cycle_and_lru_is_all_or_nothing() {
        // 30 layers x 61 candidates (66 pages, 5 at home): a cycle of 1830 pages.
        let i = input(30, 66, 5, None);
        let p = with(&i, 500, Policy::Pinned, 0.0);
        assert_eq!(p.requests_per_token, 1830.0);
        assert!((p.hit_rate - 500.0 / 1830.0).abs() < 1e-12);
        assert_eq!(p.kv_bytes_per_token, 1830.0 * 4096.0);
        assert!((p.flash_bytes_per_token - 1330.0 * 4096.0).abs() < 1e-6);
        assert_eq!(p.prefetch_hit_rate, 1.0);
        assert_eq!(with(&i, 5000, Policy::Pinned, 0.0).hit_rate, 1.0);
        for c in [0, 1, 500, 1829] {
            let p = with(&i, c, Policy::Lru, 0.7);
            assert_eq!(p.hit_rate, 0.0, "lru, cache {c}");
            assert_eq!(p.flash_bytes_per_token, p.kv_bytes_per_token);
        }
        assert_eq!(with(&i, 1830, Policy::Lru, 0.0).hit_rate, 1.0);
    }

    #[test]
    fn quest_selecting_every_candidate_is_exact() {
        let exact = input(30, 66, 5, None);
        for select in [61, 62, 1000, u32::MAX] {
            let quest = input(30, 66, 5, Some(select));
            for policy in [Policy::Pinned, Policy::Lru] {
                for c in [0, 100, 500, 1829, 1830, 4000] {
                    let (a, b) = (with(&exact, c, policy, 0.0), with(&quest, c, policy, 0.3));
                    assert_eq!(a.requests_per_token, b.requests_per_token);
                    assert_eq!(
                        a.hit_rate, b.hit_rate,
                        "{policy:?} cache {c} select {select}"
                    );
                    assert_eq!(a.flash_bytes_per_token, b.flash_bytes_per_token);
                    assert_eq!(a.prefetch_hit_rate, b.prefetch_hit_rate);
                }
            }
        }
    }

    #[test]
    fn quest_lru_matches_hand_computed_steps() {
        // 12 layers, M = 61, N = 8: q = N(1-r)/(M-N).
        let i = input(12, 66, 5, Some(8));
        let lru = |c_l: f64, r: f64| with(&i, (c_l * 12.0) as u64, Policy::Lru, r).hit_rate;
        let q0 = 8.0 / 53.0;
        // Below one selection per layer: C/(L*N) - (1-r), at most r, at least 0.
        assert!((lru(7.0, 0.9) - (7.0 / 8.0 - 0.1)).abs() < 1e-12);
        // (C = 94 pages: the 7.9 * 12 pages rounded down.)
        assert!((lru(7.9, 1.0) - 94.0 / 96.0).abs() < 1e-12);
        assert_eq!(lru(4.0, 0.5), 0.0);
        assert_eq!(lru(6.0, 0.5), 0.25);
        assert_eq!(lru(7.0, 0.0), 0.0);
        // The kept pages the cache misses come from the prefetch.
        let p = with(&i, 72, Policy::Lru, 0.5);
        assert_eq!(p.prefetch_hit_rate, 0.25);
        // A quarter from the cache, a quarter prefetched: the other half on demand.
        assert_eq!(p.hit_rate, 0.25);
        assert_eq!(p.demand_flash_bytes_per_token, 48.0 * 4096.0);
        // Flash: 96 requests, 72 of them not from the cache; of the 48 dropped prefetches the
        // cache holds as many as of the kept pages (half).
        assert!((p.flash_bytes_per_token - (72.0 + 24.0) * 4096.0).abs() < 1e-6);
        // r = 0: U(2) = 16 (two disjoint selections), so C_l in [8, 16) holds no returning page
        // and [16, U(3)) holds those absent one token: share q.
        assert_eq!(lru(8.0, 0.0), 0.0);
        assert_eq!(lru(15.9, 0.0), 0.0);
        let u3 = 61.0 - 53.0 * (1.0 - q0) * (1.0 - q0);
        assert!((lru(16.0, 0.0) - q0).abs() < 1e-12);
        assert!((lru(u3 - 0.1, 0.0) - q0).abs() < 1e-12);
        let two = 1.0 - (1.0 - q0) * (1.0 - q0);
        assert!((lru(u3 + 0.1, 0.0) - two).abs() < 1e-12);
        // r = 1: kept pages only.
        assert_eq!(lru(8.0, 1.0), 1.0);
        // r = 0.5 at C_l = 8: kept pages hit, returning ones do not.
        assert_eq!(lru(8.0, 0.5), 0.5);
        assert_eq!(lru(61.0, 0.0), 1.0);
        // Kept pages come from the prefetch when there is no cache, from the cache when it holds
        // everything.
        assert_eq!(with(&i, 0, Policy::Lru, 0.2).prefetch_hit_rate, 0.2);
        assert_eq!(with(&i, 12 * 61, Policy::Lru, 0.2).prefetch_hit_rate, 0.0);
    }

    #[test]
    fn quest_pinned_is_cache_over_all_candidates() {
        let i = input(12, 66, 5, Some(8));
        for (c, want) in [(0, 0.0), (183, 0.25), (732, 1.0), (9999, 1.0)] {
            assert!((with(&i, c, Policy::Pinned, 0.5).hit_rate - want).abs() < 1e-12);
        }
    }

    #[test]
    fn quest_lru_rises_with_cache_and_reuse() {
        let i = input(12, 66, 5, Some(8));
        let mut last_r = vec![0.0; 800];
        for r in [0.0, 0.25, 0.5, 0.75, 0.9, 1.0] {
            let mut last_c = 0.0;
            for c in 0..800 {
                let h = with(&i, c, Policy::Lru, r).hit_rate;
                assert!((0.0..=1.0).contains(&h), "r {r} c {c}: {h}");
                assert!(h >= last_c, "not monotone in cache at r {r} c {c}");
                assert!(
                    h >= last_r[c as usize],
                    "not monotone in reuse at r {r} c {c}"
                );
                last_c = h;
                last_r[c as usize] = h;
            }
        }
    }

    #[test]
    fn forced_overlap_raises_reuse() {
        // 8 of 10 candidates: consecutive selections share at least 6 pages.
        let i = input(4, 12, 2, Some(8));
        assert_eq!(with(&i, 0, Policy::Lru, 0.0).prefetch_hit_rate, 0.75);
        assert_eq!(with(&i, 0, Policy::Lru, 0.9).prefetch_hit_rate, 0.9);
    }

    #[test]
    fn edge_cases_are_finite() {
        let shapes = [
            (0, 10, 2, None),
            (30, 0, 0, None),
            (30, 0, 5, Some(4)),
            (30, 5, 5, None),
            (30, 5, 9, Some(2)),
            (30, 66, 5, Some(0)),
            (30, 66, 0, Some(8)),
            (1, 2, 1, Some(1)),
            (u32::MAX, u32::MAX, 0, None),
            (u32::MAX, u32::MAX, 0, Some(u32::MAX - 1)),
        ];
        let reuses = [
            0.0,
            0.5,
            1.0,
            -3.0,
            7.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for (l, pages, home, select) in shapes {
            let i = KvModelInput {
                page_bytes: u64::MAX,
                ..input(l, pages, home, select)
            };
            for c in [0, 1, 100, u64::MAX] {
                for policy in [Policy::Pinned, Policy::Lru] {
                    for (r, lagged) in reuses.iter().flat_map(|&r| [(r, false), (r, true)]) {
                        let i = KvModelInput {
                            lagged,
                            ..i.clone()
                        };
                        let p = with(&i, c, policy, r);
                        let all = [
                            p.requests_per_token,
                            p.hit_rate,
                            p.flash_bytes_per_token,
                            p.kv_bytes_per_token,
                            p.prefetch_hit_rate,
                        ];
                        assert!(
                            all.iter().all(|v| v.is_finite() && *v >= 0.0),
                            "{i:?} {p:?}"
                        );
                        assert!(p.hit_rate <= 1.0 && p.prefetch_hit_rate <= 1.0);
                        if p.requests_per_token == 0.0 {
                            assert_eq!((p.hit_rate, p.prefetch_hit_rate), (0.0, 0.0));
                            assert_eq!(p.flash_bytes_per_token, 0.0);
                        }
                        if c == 0 {
                            assert_eq!(p.hit_rate, 0.0);
                        }
                    }
                }
            }
        }
        // Zero layers, zero pages and home >= pages request nothing.
        for (l, pages, home) in [(0, 10, 2), (30, 0, 0), (30, 5, 5), (30, 5, 9)] {
            assert_eq!(
                predict(&input(l, pages, home, Some(3))).requests_per_token,
                0.0
            );
        }
    }
}
