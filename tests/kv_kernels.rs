//! The paged KV kernels against the CPU reference: split attention over page lists whose pages
//! sit in random slots of two pools, folded over rounds; the store of a batch into home pages;
//! the page summaries and scores of page selection.
//!
//! Tolerance: attention 1e-4 relative to max(1, |reference|) (f32 accumulation in another order);
//! results must be bit-identical whatever the rounds and the pools, since the split boundaries
//! depend only on the keys. Sliding windows and soft-capping are covered the same way.
mod common;

use common::Rng;
use flashlm::gpu::{GpuBuffer, GpuContext};
use flashlm::kernels::{self, ATTN_SPLIT_KEYS, KvShape, Step};
use flashlm::kv::pages::{PageList, PageMap, STREAM_BIT};
use flashlm::model::reference::ops;

fn f32s(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn step_buffer(ctx: &GpuContext, n_tokens: u32) -> GpuBuffer {
    let buf = ctx.uniform("step", 16).unwrap();
    let s = Step {
        n_tokens,
        pos0: 0,
        _pad: [0; 2],
    };
    ctx.write(&buf, 0, bytemuck::bytes_of(&s));
    buf
}

fn halves(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

struct Case {
    nh: usize,
    nkv: usize,
    hd: usize,
    page: u32,
    /// Positions cached before the batch, and rows in the batch.
    past: usize,
    rows: usize,
    f16: bool,
    /// Sliding window (0: none); the list then starts at the first page the batch's window
    /// reaches.
    window: u32,
    /// Attention logit soft-cap (0: none).
    softcap: f32,
}

/// Run paged attention for `c` with pages placed by `seed` and `round_splits` splits per round
/// (`tiled`: the row-tiled prefill kernel); returns the output and the reference.
fn attend(
    ctx: &GpuContext,
    c: &Case,
    seed: u64,
    round_splits: u32,
    tiled: bool,
) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng(1000 + c.hd as u64 + c.page as u64);
    let n_keys = c.past + c.rows;
    let kv_dim = c.nkv * c.hd;
    let p = c.page as usize;
    let n_pages = n_keys.div_ceil(p);
    let mut k = rng.vec(n_pages * p * kv_dim, 1.0);
    let mut v = rng.vec(n_pages * p * kv_dim, 1.0);
    if c.f16 {
        for x in k.iter_mut().chain(v.iter_mut()) {
            *x = half::f16::from_f32(*x).to_f32();
        }
    }
    let q = rng.vec(c.rows * c.nh * c.hd, 1.0);
    // Pages to pools: a random half to each, in shuffled slots.
    let mut place = Rng(seed);
    let mut home_n = 0u32;
    let mut stream_n = 0u32;
    let mut slots = Vec::new();
    for _ in 0..n_pages {
        if place.next_u64().is_multiple_of(2) {
            slots.push(home_n);
            home_n += 1;
        } else {
            slots.push(STREAM_BIT | stream_n);
            stream_n += 1;
        }
    }
    let page_elems = 2 * p * kv_dim;
    let mut home = vec![0f32; home_n.max(1) as usize * page_elems];
    let mut strm = vec![0f32; stream_n.max(1) as usize * page_elems];
    for (pg, &s) in slots.iter().enumerate() {
        let pool = if s & STREAM_BIT != 0 {
            &mut strm
        } else {
            &mut home
        };
        let base = (s & !STREAM_BIT) as usize * page_elems;
        let kp = &k[pg * p * kv_dim..(pg + 1) * p * kv_dim];
        let vp = &v[pg * p * kv_dim..(pg + 1) * p * kv_dim];
        pool[base..base + p * kv_dim].copy_from_slice(kp);
        pool[base + p * kv_dim..base + 2 * p * kv_dim].copy_from_slice(vp);
    }
    let bytes = |x: &[f32]| if c.f16 { halves(x) } else { f32s(x).to_vec() };
    let max_pages = n_pages as u32;
    let seq_stride = 4 + 2 * max_pages;
    let shape = KvShape {
        n_heads: c.nh as u32,
        n_kv_heads: c.nkv as u32,
        head_dim: c.hd as u32,
        page_tokens: c.page,
        f16: c.f16,
        table_base: 0,
        seq_stride,
        round_splits,
        scale: 0.7 / (c.hd as f32).sqrt(),
        softcap: c.softcap,
        window: c.window,
    };
    let map = PageMap {
        page_tokens: c.page,
        max_pages,
        home_pages: max_pages,
        round_splits,
        decode_round_splits: round_splits,
        stream_slots: stream_n,
        halves: 1,
        kv_dim: kv_dim as u32,
    };
    let first = if c.window > 0 {
        (c.past + 1).saturating_sub(c.window as usize)
    } else {
        0
    };
    let mut list = PageList::exact_from(&map, first, n_keys - 1);
    for e in list.entries.iter_mut() {
        e.1 = slots[e.0 as usize];
    }
    let rows: Vec<u32> = (0..c.rows)
        .flat_map(|t| [0, (c.past + t) as u32, 0, 0])
        .collect();
    let hb = ctx.storage_with("home", &bytes(&home)).unwrap();
    let sb = ctx.storage_with("stream", &bytes(&strm)).unwrap();
    let qb = ctx.storage_with("q", f32s(&q)).unwrap();
    let rb = ctx
        .storage_with("rows", bytemuck::cast_slice(&rows))
        .unwrap();
    let tb = ctx.storage("table", (4 + seq_stride as u64) * 4).unwrap();
    let part_n = c.rows * c.nh * round_splits as usize * (c.hd + 2);
    let part = ctx.storage("part", (part_n * 4) as u64).unwrap();
    let run = ctx
        .storage("run", (c.rows * c.nh * (c.hd + 2) * 4) as u64)
        .unwrap();
    let ob = ctx.storage("o", (c.rows * c.nh * c.hd * 4) as u64).unwrap();
    let step = step_buffer(ctx, c.rows as u32);
    let bufs = kernels::AttnBuffers {
        step: &step,
        rows: &rb,
        table: &tb,
        q: &qb,
        home: &hb,
        stream: &sb,
        part: &part,
        out: &ob,
    };
    let partial = if tiled {
        kernels::attention_tiled(ctx, &bufs, &shape)
            .unwrap()
            .expect("a head dim the tiled kernel takes")
    } else {
        kernels::attention_partial(ctx, &bufs, &shape).unwrap()
    };
    let d = [
        partial,
        kernels::attention_merge(ctx, &step, &tb, &part, &run, &ob, &shape).unwrap(),
    ];
    let total = (list.keys).div_ceil(ATTN_SPLIT_KEYS);
    let rounds = map.rounds(list.keys);
    assert_eq!(rounds.iter().map(|r| r.splits).sum::<u32>(), total);
    for (i, r) in rounds.iter().enumerate() {
        let last = i + 1 == rounds.len();
        let mut words = vec![
            r.first_split,
            (i == 0) as u32 | if last { 2 } else { 0 },
            r.splits,
            0,
        ];
        list.words(&mut words);
        ctx.write(&tb, 0, bytemuck::cast_slice(&words));
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        kernels::record_all(&mut enc, &d, c.rows as u32);
        ctx.queue.submit([enc.finish()]);
    }
    ctx.wait().unwrap();
    let out = ctx.read_f32(&ob, c.rows * c.nh * c.hd).unwrap();
    let mut want = Vec::new();
    for t in 0..c.rows {
        let seen = c.past + t + 1;
        let shape = ops::AttnShape {
            n_heads: c.nh,
            n_kv_heads: c.nkv,
            head_dim: c.hd,
            scale: 0.7 / (c.hd as f32).sqrt(),
            softcap: (c.softcap > 0.0).then_some(c.softcap),
        };
        let from = if c.window > 0 {
            seen.saturating_sub(c.window as usize)
        } else {
            0
        };
        want.extend(ops::attention_range(
            &q[t * c.nh * c.hd..(t + 1) * c.nh * c.hd],
            &k[..seen * kv_dim],
            &v[..seen * kv_dim],
            &shape,
            from,
            seen,
        ));
    }
    (out, want)
}

#[test]
fn paged_attention_matches_reference_over_pages_pools_and_rounds() {
    let Some(mut ctx) = common::gpu() else { return };
    // Every attention kernel: the workgroup one; where the device has 8-wide subgroups, the
    // lane kernels (a KV head's query heads per subgroup with the head dim across its lanes,
    // or keys across the lanes where the head dim is not a multiple of 8); and the row-tiled
    // prefill kernel at both tile widths (8 rows with lane kernels, 32 without).
    let lane_modes: &[bool] = if ctx.subgroups8 {
        &[false, true]
    } else {
        &[false]
    };
    for &lanes in lane_modes {
        ctx.lane_kernels = lanes;
        for tiled in [false, true] {
            attention_cases(&ctx, lanes, tiled);
        }
    }
}

fn attention_cases(ctx: &GpuContext, lanes: bool, tiled: bool) {
    let cases = [
        // Many splits: 1-token pages, two rounds of splits.
        (9, 3, 64, 1, 1100, 1, true),
        (9, 3, 64, 16, 1300, 3, true),
        (4, 4, 32, 64, 70, 5, false),
        (6, 2, 80, 16, 1030, 2, false),
        (2, 1, 128, 1024, 1600, 1, true),
        (3, 1, 17, 4, 9, 3, false),
        (3, 1, 18, 8, 600, 2, true),
        // Rows across tiles of 8 and not filling the last one; a page of 7 tokens.
        (9, 3, 64, 16, 1300, 13, true),
        (4, 2, 40, 7, 530, 37, false),
        // More query heads per KV head than one decode subgroup serves (blocks of 8).
        (9, 1, 64, 16, 700, 2, true),
        (16, 1, 32, 8, 600, 3, false),
    ];
    // Sliding windows (some reaching past a split, some inside one page) and soft-capping.
    let windowed = [
        (4, 2, 32, 16, 1300, 5, true, 37, 0.0),
        (4, 2, 32, 1, 1100, 3, false, 600, 2.5),
        (3, 1, 18, 8, 40, 6, false, 4, 0.0),
        (2, 1, 64, 64, 700, 2, true, 100, 1.0),
        (4, 2, 32, 1, 1100, 11, false, 600, 2.5),
        (2, 2, 64, 8, 900, 19, true, 50, 0.0),
    ];
    let cases = cases
        .iter()
        .map(|&(a, b, c, d, e, f, g)| (a, b, c, d, e, f, g, 0, 0.0))
        .chain(windowed);
    for (nh, nkv, hd, page, past, rows, f16, window, softcap) in cases {
        if tiled && !kernels::attention_tiles(hd as u32) {
            continue;
        }
        let c = Case {
            nh,
            nkv,
            hd,
            page,
            past,
            rows,
            f16,
            window,
            softcap,
        };
        let splits_per_page = (page / ATTN_SPLIT_KEYS).max(1);
        let all = ((past + rows) as u32).div_ceil(ATTN_SPLIT_KEYS).max(1);
        let (one, want) = attend(
            ctx,
            &c,
            1,
            all.div_ceil(splits_per_page) * splits_per_page,
            tiled,
        );
        for (i, (&g, &w)) in one.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "lanes={lanes} tiled={tiled} nh={nh} hd={hd} page={page} past={past} i={i}: {g} vs {w}"
            );
        }
        // Other pools, one split per round: the same bits.
        let (many, _) = attend(ctx, &c, 2, splits_per_page, tiled);
        let (same_pools, _) = attend(ctx, &c, 1, splits_per_page, tiled);
        let (other_pools, _) = attend(
            ctx,
            &c,
            2,
            all.div_ceil(splits_per_page) * splits_per_page,
            tiled,
        );
        assert!(
            one == same_pools,
            "tiled={tiled} nh={nh} hd={hd} page={page}: rounds changed the result"
        );
        assert!(
            one == other_pools,
            "tiled={tiled} nh={nh} hd={hd} page={page}: pools changed the result"
        );
        assert!(
            one == many,
            "tiled={tiled} nh={nh} hd={hd} page={page}: rounds and pools changed the result"
        );
    }
}

#[test]
fn store_meta_and_score_kernels() {
    let Some(ctx) = common::gpu() else { return };
    let mut rng = Rng(77);
    let (nh, nkv, page) = (6usize, 2usize, 8u32);
    let p = page as usize;
    // Head dims a multiple of 4 (the scores read vec4s) and not.
    for (hd, f16) in [(16usize, false), (16, true), (6, false), (6, true)] {
        let kv_dim = nkv * hd;
        let shape = KvShape {
            n_heads: nh as u32,
            n_kv_heads: nkv as u32,
            head_dim: hd as u32,
            page_tokens: page,
            f16,
            table_base: 0,
            seq_stride: 0,
            round_splits: 1,
            ..Default::default()
        };
        let elt = if f16 { 2 } else { 4 };
        let page_bytes = 2 * p * kv_dim * elt;
        let slots = 4;
        // Store 5 rows at positions 6..11 of pages 0 and 1 placed in slots 3 and 1.
        let rows_n = 5;
        let ks = rng.vec(rows_n * kv_dim, 1.0);
        let vs = rng.vec(rows_n * kv_dim, 1.0);
        let slot_of = |pg: usize| if pg == 0 { 3 } else { 1 };
        let pos: Vec<usize> = (6..6 + rows_n).collect();
        let rows: Vec<u32> = pos
            .iter()
            .flat_map(|&ps| {
                let elem = slot_of(ps / p) * 2 * p * kv_dim + (ps % p) * kv_dim;
                [0, ps as u32, elem as u32, 0]
            })
            .collect();
        let pool = ctx.storage("pool", (slots * page_bytes) as u64).unwrap();
        let kb = ctx.storage_with("k", f32s(&ks)).unwrap();
        let vb = ctx.storage_with("v", f32s(&vs)).unwrap();
        let rb = ctx
            .storage_with("rows", bytemuck::cast_slice(&rows))
            .unwrap();
        let step = step_buffer(&ctx, rows_n as u32);
        let d = [kernels::kv_store(&ctx, &step, &rb, &kb, &vb, &pool, &shape).unwrap()];
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        kernels::record_all(&mut enc, &d, rows_n as u32);
        ctx.queue.submit([enc.finish()]);
        let raw = ctx.read_buffer(&pool, (slots * page_bytes) as u64).unwrap();
        let at = |e: usize| -> f32 {
            if f16 {
                half::f16::from_le_bytes([raw[2 * e], raw[2 * e + 1]]).to_f32()
            } else {
                f32::from_le_bytes([raw[4 * e], raw[4 * e + 1], raw[4 * e + 2], raw[4 * e + 3]])
            }
        };
        let round = |x: f32| {
            if f16 {
                half::f16::from_f32(x).to_f32()
            } else {
                x
            }
        };
        for (t, &ps) in pos.iter().enumerate() {
            let base = slot_of(ps / p) * 2 * p * kv_dim + (ps % p) * kv_dim;
            for j in 0..kv_dim {
                assert_eq!(
                    at(base + j),
                    round(ks[t * kv_dim + j]),
                    "hd={hd} f16={f16} K row {t}"
                );
                assert_eq!(at(base + p * kv_dim + j), round(vs[t * kv_dim + j]));
            }
        }
        // Page summary of page 0 (slot 3, rows 6 and 7 written) and the score bound.
        let jobs = [1u32, 0, 0, 0, 0, 3, page, 0];
        let jb = ctx
            .storage_with("jobs", bytemuck::cast_slice(&jobs))
            .unwrap();
        let meta = ctx.storage("meta", (2 * 2 * kv_dim * 4) as u64).unwrap();
        let dm = kernels::page_meta(&ctx, &step, &jb, &pool, &meta, &shape, 1).unwrap();
        let table = [0u32, 0, 0, 1];
        let tb = ctx
            .storage_with("table", bytemuck::cast_slice(&table))
            .unwrap();
        let q = rng.vec(nh * hd, 1.0);
        let qb = ctx.storage_with("q", f32s(&q)).unwrap();
        let sc = ctx.storage("scores", (2 * nh * 4) as u64).unwrap();
        let ds = kernels::page_score(&ctx, &step, &tb, &qb, &meta, &sc, &shape, 2).unwrap();
        let d2 = [dm, ds];
        let mut enc = ctx.device.create_command_encoder(&Default::default());
        kernels::record_all(&mut enc, &d2, 1);
        ctx.queue.submit([enc.finish()]);
        let mm = ctx.read_f32(&meta, 2 * kv_dim).unwrap();
        let scores = ctx.read_f32(&sc, nh).unwrap();
        let mut keys = Vec::new();
        for r in 0..p {
            keys.push(
                (0..kv_dim)
                    .map(|j| at(3 * 2 * p * kv_dim + r * kv_dim + j))
                    .collect::<Vec<_>>(),
            );
        }
        for j in 0..kv_dim {
            let lo = keys.iter().map(|k| k[j]).fold(f32::INFINITY, f32::min);
            let hi = keys.iter().map(|k| k[j]).fold(f32::NEG_INFINITY, f32::max);
            assert_eq!((mm[j], mm[kv_dim + j]), (lo, hi), "f16={f16} channel {j}");
        }
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let bound: f32 = (0..hd)
                .map(|d| {
                    let qd = q[h * hd + d];
                    (qd * mm[kvh * hd + d]).max(qd * mm[kv_dim + kvh * hd + d])
                })
                .sum();
            assert!(
                (scores[h] - bound).abs() <= 1e-5 * bound.abs().max(1.0),
                "hd={hd} head {h}: {} against {bound}",
                scores[h]
            );
            // An upper bound of every key's score.
            for k in &keys {
                let s: f32 = (0..hd).map(|d| q[h * hd + d] * k[kvh * hd + d]).sum();
                assert!(s <= scores[h] + 1e-4, "head {h}: {s} > bound {}", scores[h]);
            }
        }
    }
}

/// RoPE of Q and K with the store of K and V, in one dispatch, against the CPU reference's
/// RoPE and the page layout: both rotation styles, partial rotation, f32 and f16 pools, rows
/// in two pages placed in arbitrary slots. K's input buffer is left unrotated.
#[test]
fn rope_store_matches_reference_rope_and_page_layout() {
    use flashlm::model::config::RopeStyle;
    let Some(ctx) = common::gpu() else { return };
    let mut rng = Rng(91);
    for style in [RopeStyle::Normal, RopeStyle::Neox] {
        for (nh, nkv, hd, rope_dim, page) in [
            (6usize, 2usize, 16usize, 16usize, 8u32),
            (5, 5, 10, 6, 4),
            (4, 1, 64, 32, 16),
        ] {
            for f16 in [false, true] {
                let kv_dim = nkv * hd;
                let q_dim = nh * hd;
                let p = page as usize;
                let shape = KvShape {
                    n_heads: nh as u32,
                    n_kv_heads: nkv as u32,
                    head_dim: hd as u32,
                    page_tokens: page,
                    f16,
                    table_base: 0,
                    seq_stride: 0,
                    round_splits: 1,
                    ..Default::default()
                };
                let rows_n = 5;
                let pos0 = p + 3;
                let q = rng.vec(rows_n * q_dim, 1.0);
                let ks = rng.vec(rows_n * kv_dim, 1.0);
                let vs = rng.vec(rows_n * kv_dim, 1.0);
                let slot_of = |pg: usize| if pg == 1 { 2 } else { 0 };
                let pos: Vec<usize> = (pos0..pos0 + rows_n).collect();
                let rows: Vec<u32> = pos
                    .iter()
                    .flat_map(|&ps| {
                        let elem = slot_of(ps / p) * 2 * p * kv_dim + (ps % p) * kv_dim;
                        [0, ps as u32, elem as u32, 0]
                    })
                    .collect();
                let base = 10000.0f32;
                let cs = kernels::rope_table(pos0 as u32, rows_n as u32, rope_dim as u32, base);
                let elt = if f16 { 2 } else { 4 };
                let pool_bytes = 3 * 2 * p * kv_dim * elt;
                let pool = ctx.storage("pool", pool_bytes as u64).unwrap();
                let qb = ctx.storage_with("q", f32s(&q)).unwrap();
                let kb = ctx.storage_with("k", f32s(&ks)).unwrap();
                let vb = ctx.storage_with("v", f32s(&vs)).unwrap();
                let csb = ctx.storage_with("cs", f32s(&cs)).unwrap();
                let rb = ctx
                    .storage_with("rows", bytemuck::cast_slice(&rows))
                    .unwrap();
                let step = step_buffer(&ctx, rows_n as u32);
                let d = [kernels::rope_store(
                    &ctx,
                    &step,
                    &csb,
                    &qb,
                    &rb,
                    &kb,
                    &vb,
                    &pool,
                    &shape,
                    rope_dim as u32,
                    style == RopeStyle::Neox,
                )
                .unwrap()];
                let mut enc = ctx.device.create_command_encoder(&Default::default());
                kernels::record_all(&mut enc, &d, rows_n as u32);
                ctx.queue.submit([enc.finish()]);
                let raw = ctx.read_buffer(&pool, pool_bytes as u64).unwrap();
                let at = |e: usize| -> f32 {
                    if f16 {
                        half::f16::from_le_bytes([raw[2 * e], raw[2 * e + 1]]).to_f32()
                    } else {
                        f32::from_le_bytes([
                            raw[4 * e],
                            raw[4 * e + 1],
                            raw[4 * e + 2],
                            raw[4 * e + 3],
                        ])
                    }
                };
                let tol = if f16 { 2e-3 } else { 1e-5 };
                let gq = ctx.read_f32(&qb, rows_n * q_dim).unwrap();
                assert_eq!(
                    ctx.read_f32(&kb, rows_n * kv_dim).unwrap(),
                    ks,
                    "the key input is left as it was"
                );
                let what = format!("{style:?} ({nh},{nkv},{hd},{rope_dim},{page}) f16={f16}");
                for (t, &ps) in pos.iter().enumerate() {
                    let mut wq = q[t * q_dim..(t + 1) * q_dim].to_vec();
                    ops::rope_inplace(&mut wq, nh, hd, rope_dim, ps, base, style);
                    for i in 0..q_dim {
                        assert!(
                            (gq[t * q_dim + i] - wq[i]).abs() <= 1e-5,
                            "{what} q t={t} i={i}"
                        );
                    }
                    let mut wk = ks[t * kv_dim..(t + 1) * kv_dim].to_vec();
                    ops::rope_inplace(&mut wk, nkv, hd, rope_dim, ps, base, style);
                    let e0 = slot_of(ps / p) * 2 * p * kv_dim + (ps % p) * kv_dim;
                    for j in 0..kv_dim {
                        let (k, v) = (at(e0 + j), at(e0 + p * kv_dim + j));
                        assert!(
                            (k - wk[j]).abs() <= tol,
                            "{what} k t={t} j={j}: {k} vs {}",
                            wk[j]
                        );
                        let wv = vs[t * kv_dim + j];
                        assert!((v - wv).abs() <= tol, "{what} v t={t} j={j}: {v} vs {wv}");
                    }
                }
            }
        }
    }
}
