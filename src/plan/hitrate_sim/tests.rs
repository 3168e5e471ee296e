//! The simulator's own checks, and the hit-rate model against it.

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
