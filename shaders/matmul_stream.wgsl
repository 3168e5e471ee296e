// The decode rows of matmul_blocks.wgsl read as streams of vec4s (WIDE; included there): each
// of a thread's rows is read one vec4 load per 4 words, in order, as its blocks need them,
// shifted into place by the row start's word within its vec4, in groups of GB blocks that
// are a whole number of vec4s (Q4_1: 4 blocks, 5 vec4s; Q8_0: 8 blocks, 17 vec4s). On CPU
// rasterizers a load costs per lane whatever its width, and a lane's values live in SIMD
// registers: loading as the blocks go keeps few words of each row live.

// A row read as a stream of vec4s: `v` holds the row's next 4 words in order (shifted into
// place from the vec4s that hold them), `u` the last vec4 loaded, `i` the next one's index,
// `a` the row start's word within its vec4.
struct Rd {
    v: vec4<u32>,
    u: vec4<u32>,
    i: u32,
    a: u32,
}

// Words a to a + 3 of the 8 words of p and q (a below 4; a constant folds the selects away).
fn words_from(p: vec4<u32>, q: vec4<u32>, a: u32) -> vec4<u32> {
    let two = (a & 2u) != 0u;
    let m = select(p, vec4<u32>(p.zw, q.xy), two);
    return select(m, vec4<u32>(m.yzw, select(q.x, q.z, two)), (a & 1u) != 0u);
}

// `words_from` for a row start's word a, which is always a multiple of RA.
fn shift(p: vec4<u32>, q: vec4<u32>, a: u32) -> vec4<u32> {
    return words_from(p, q, a & ~(RA - 1u));
}

// The stream of the row at byte rb of weight s from block k.
fn rd_open(s: u32, rb: u32, k: u32) -> Rd {
    let b = rb + k * BLOCK_BYTES;
    let i = b >> 4u;
    let a = (b >> 2u) & 3u;
    let u0 = wload(s, i);
    let u1 = wload(s, i + 1u);
    return Rd(shift(u0, u1, a), u1, i + 2u, a);
}

#ifdef TOUCH
// Touches (TOUCH: bytes of each row). On CPU rasterizers a thread's rows are separate short
// streams, too many at once for the hardware prefetchers, and a load of a word that is not
// cached stalls its lane's load loop. Before the streams start, each thread loads one word of
// every cache line of the first TOUCH bytes of each of its rows, so that those misses are
// waited for together rather than one stream step at a time. The words are folded into
// `touch`, which only an impossible store reads, so that the loads stay.
var<private> touch: u32;

// The first word of vec4 i of weight s: wload's choice of weight, but one word (on CPU
// rasterizers a load costs per component, and a touch needs only its cache line).
fn wtouch(s: u32, i: u32) -> u32 {
#ifdef SWIGLU
    if (s == 1u) {
        return wv(w2[i]).x;
    }
#endif
#ifdef MULTI
#ifndef ONEBUF
    if (s == 1u) {
        return wv(w2[i]).x;
    }
    if (s == 2u) {
        return wv(w3[i]).x;
    }
#endif
#endif
    return wv(w[i]).x;
}
#endif

// Moves the stream on by 4 words; returns the new `v`.
fn rd_adv(s: u32, r: ptr<function, Rd>) -> vec4<u32> {
    let u = wload(s, (*r).i);
    (*r).v = shift((*r).u, u, (*r).a);
    (*r).u = u;
    (*r).i += 1u;
    return (*r).v;
}

#ifdef Q4_1
// Blocks of a group: 4 blocks of 20 bytes are 20 words, 5 vec4s.
const GB: u32 = 4u;

// W x for a Q4_1 block of words dm, q0 to q3, given the block's X and its sum.
fn q41_dot(dmw: u32, q0: u32, q1: u32, q2: u32, q3: u32, xb: Xb, xs: f32) -> f32 {
    let dm = unpack2x16float(dmw);
    let q = Blk(lo4(q0), lo4(q1), lo4(q2), lo4(q3), hi4(q0), hi4(q1), hi4(q2), hi4(q3));
    return dm.x * dot_block(q, xb) + dm.y * xs;
}

// W x for block j (a constant, 0 to 3) of a group of 4: words 5j to 5j + 4 from the group's
// start, which the stream holds in its `v` and the next 4 words (block 3: in the next 8).
fn rd_dot(s: u32, r: ptr<function, Rd>, j: u32, xb: Xb, xs: f32) -> f32 {
    let o = (*r).v;
    let n = rd_adv(s, r);
    if (j == 0u) {
        return q41_dot(o.x, o.y, o.z, o.w, n.x, xb, xs);
    }
    if (j == 1u) {
        return q41_dot(o.y, o.z, o.w, n.x, n.y, xb, xs);
    }
    if (j == 2u) {
        return q41_dot(o.z, o.w, n.x, n.y, n.z, xb, xs);
    }
    // The group's words 16 to 19 are n: the next group starts one vec4 on.
    rd_adv(s, r);
    return q41_dot(o.w, n.x, n.y, n.z, n.w, xb, xs);
}
#endif

#ifdef Q8_0
// Blocks of a group: 8 blocks of 34 bytes are 68 words, 17 vec4s.
const GB: u32 = 8u;

// W x for a Q8_0 block of scale d and 32 signed bytes in words q0 to q7.
fn q8_dot(d: f32, q0: u32, q1: u32, q2: u32, q3: u32, q4: u32, q5: u32, q6: u32, q7: u32, xb: Xb) -> f32 {
    let q = Blk(
        vec4<f32>(unpack4xI8(q0)), vec4<f32>(unpack4xI8(q1)), vec4<f32>(unpack4xI8(q2)),
        vec4<f32>(unpack4xI8(q3)), vec4<f32>(unpack4xI8(q4)), vec4<f32>(unpack4xI8(q5)),
        vec4<f32>(unpack4xI8(q6)), vec4<f32>(unpack4xI8(q7))
    );
    return d * dot_block(q, xb);
}

// W x for block j (a constant, 0 to 7) of a group of 8, from the row's stream. Block j starts
// at byte 34 j: in word 17 j / 2 (of vec4 2 j, its word j / 2), at its high half when j is odd;
// its 9 words (d, then the 32 bytes) lie in vec4s 2 j to 2 j + 2, and the last of them holds
// the start of block j + 1.
fn rd_dot(s: u32, r: ptr<function, Rd>, j: u32, xb: Xb, xs: f32) -> f32 {
    let p = (*r).v;
    let q = rd_adv(s, r);
    let t = rd_adv(s, r);
    if (j == 7u) {
        // The next group starts one vec4 on.
        rd_adv(s, r);
    }
    let o = j / 2u;
    let a = words_from(p, q, o);
    let b = words_from(q, t, o);
    let c = t[o];
    if ((j & 1u) == 0u) {
        // d in the low half of the first word; the bytes from its high half on.
        return q8_dot(
            unpack2x16float(a.x).x,
            (a.x >> 16u) | (a.y << 16u), (a.y >> 16u) | (a.z << 16u),
            (a.z >> 16u) | (a.w << 16u), (a.w >> 16u) | (b.x << 16u),
            (b.x >> 16u) | (b.y << 16u), (b.y >> 16u) | (b.z << 16u),
            (b.z >> 16u) | (b.w << 16u), (b.w >> 16u) | (c << 16u),
            xb
        );
    }
    return q8_dot(unpack2x16float(a.x >> 16u).x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c, xb);
}
#endif

// The sums (W x, W2 x) of block j of a group of a row's streams r (W) and r2 (W2).
fn rd_pair(ws: u32, r: ptr<function, Rd>, r2: ptr<function, Rd>, j: u32, xb: Xb, xs: f32) -> vec2<f32> {
#ifdef SWIGLU
    return vec2<f32>(rd_dot(ws, r, j, xb, xs), rd_dot(1u, r2, j, xb, xs));
#else
    return vec2<f32>(rd_dot(ws, r, j, xb, xs), 0.0);
#endif
}

// Block j (a constant below GB) of the group at block k: each of the thread's rows adds its
// sums, each X (and norm weight) load shared by them.
fn stream_step(
    j: u32, k: u32, ws: u32, x0: u32, lane: u32, q: ptr<function, f32>,
    da: ptr<function, Rd>, db: ptr<function, Rd>, dc: ptr<function, Rd>, dd: ptr<function, Rd>,
    da2: ptr<function, Rd>, db2: ptr<function, Rd>, dc2: ptr<function, Rd>, dd2: ptr<function, Rd>,
    sa: ptr<function, vec2<f32>>, sb: ptr<function, vec2<f32>>,
    sc: ptr<function, vec2<f32>>, sd: ptr<function, vec2<f32>>,
) {
    let c = (k + j) * 8u;
    let g = norm_w(c, lane);
    let xb = x_block(x0 + c, lane, g, q);
    let xs = x_sum(xb);
    *sa += rd_pair(ws, da, da2, j, xb, xs);
    if (RPL > 1u) {
        *sb += rd_pair(ws, db, db2, j, xb, xs);
    }
    if (RPL > 2u) {
        *sc += rd_pair(ws, dc, dc2, j, xb, xs);
    }
    if (RPL > 3u) {
        *sd += rd_pair(ws, dd, dd2, j, xb, xs);
    }
}

// Blocks [0, k0) (k0 a multiple of GB) of the thread's rows at bytes ra to rd (ra2 to rd2 of
// W2), added to their sums.
fn stream_rows(
    ws: u32, ra: u32, rb: u32, rc: u32, rd: u32, ra2: u32, rb2: u32, rc2: u32, rd2: u32,
    x0: u32, k0: u32, lane: u32, q: ptr<function, f32>,
    sa: ptr<function, vec2<f32>>, sb: ptr<function, vec2<f32>>,
    sc: ptr<function, vec2<f32>>, sd: ptr<function, vec2<f32>>,
) {
#ifdef TOUCH
    // Every 64 bytes from the row start, and one past its end: each line the row spans.
    {
        let n = min(p.row_bytes + 64u, TOUCH);
        for (var o = 0u; o < n; o += 64u) {
            touch ^= wtouch(ws, (ra + o) >> 4u);
            if (RPL > 1u) {
                touch ^= wtouch(ws, (rb + o) >> 4u);
            }
            if (RPL > 2u) {
                touch ^= wtouch(ws, (rc + o) >> 4u);
            }
            if (RPL > 3u) {
                touch ^= wtouch(ws, (rd + o) >> 4u);
            }
#ifdef SWIGLU
            touch ^= wtouch(1u, (ra2 + o) >> 4u);
            if (RPL > 1u) {
                touch ^= wtouch(1u, (rb2 + o) >> 4u);
            }
            if (RPL > 2u) {
                touch ^= wtouch(1u, (rc2 + o) >> 4u);
            }
            if (RPL > 3u) {
                touch ^= wtouch(1u, (rd2 + o) >> 4u);
            }
#endif
        }
    }
#endif
    // The streams of rows past RPL, and of W2 without SWIGLU, are never used: their loads are
    // dead code.
    var da = rd_open(ws, ra, 0u);
    var db = rd_open(ws, rb, 0u);
    var dc = rd_open(ws, rc, 0u);
    var dd = rd_open(ws, rd, 0u);
    var da2 = rd_open(1u, ra2, 0u);
    var db2 = rd_open(1u, rb2, 0u);
    var dc2 = rd_open(1u, rc2, 0u);
    var dd2 = rd_open(1u, rd2, 0u);
    for (var k = 0u; k < k0; k += GB) {
        stream_step(0u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        stream_step(1u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        stream_step(2u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        stream_step(3u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        if (GB > 4u) {
            stream_step(4u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        }
        if (GB > 5u) {
            stream_step(5u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        }
        if (GB > 6u) {
            stream_step(6u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        }
        if (GB > 7u) {
            stream_step(7u, k, ws, x0, lane, q, &da, &db, &dc, &dd, &da2, &db2, &dc2, &dd2, sa, sb, sc, sd);
        }
    }
}
