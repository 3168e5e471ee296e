// The BLOCKS entry body of matmul.wgsl (included there; see its header): each thread walks its
// row one whole 32-weight block (or 32-weight chunk of a super-block) at a time, loading the
// block's words once, and reads X as vec4s; SHARE_X hands X values between subgroup lanes.

#ifdef BLOCKS
// The 32 weights of one block in column order, four per vector.
struct Blk {
    a0: vec4<f32>,
    a1: vec4<f32>,
    a2: vec4<f32>,
    a3: vec4<f32>,
    a4: vec4<f32>,
    a5: vec4<f32>,
    a6: vec4<f32>,
    a7: vec4<f32>,
}

// The 32 X values of one block of one token.
struct Xb {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
}

#ifdef Q4_1
const BLOCK_BYTES: u32 = 20u;
#endif
#ifdef Q4_0
const BLOCK_BYTES: u32 = 18u;
#endif
#ifdef Q8_0
const BLOCK_BYTES: u32 = 34u;
#endif

fn lo4(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8(q & 0x0f0f0f0fu));
}

fn hi4(q: u32) -> vec4<f32> {
    return vec4<f32>(unpack4xU8((q >> 4u) & 0x0f0f0f0fu));
}

// Word k of a byte stream starting 2 bytes into word w0 (odd: the stream starts at a word).
fn shifted(odd: bool, w0: u32, w1: u32) -> u32 {
    return select((w0 >> 16u) | (w1 << 16u), w1, odd);
}

#ifndef SUPER
// A block as its quantized values q (as floats) and the d and m that give its weights,
// w = q * d + m, so that a dot product with X is d (q . x) + m (sum of x).
struct Raw {
    q: Blk,
    d: f32,
    m: f32,
}

// Words i to i + 4 of weight s, and (W9) to i + 8.
struct W5 {
    a: vec4<u32>,
    e: u32,
}

struct W9 {
    a: vec4<u32>,
    b: vec4<u32>,
    c: u32,
}

// WIDE (weights bound as vec4s): from the two (W9: three) vec4s that hold them, rather than
// a vec4 load per word (a load costs per component on CPU rasterizers).
fn words5(s: u32, i: u32) -> W5 {
#ifdef WIDE
    let u0 = wload(s, i >> 2u);
    let u1 = wload(s, (i >> 2u) + 1u);
    return W5(words_from(u0, u1, i & 3u), u1[i & 3u]);
#else
    return W5(vec4<u32>(word(s, i), word(s, i + 1u), word(s, i + 2u), word(s, i + 3u)), word(s, i + 4u));
#endif
}

fn words9(s: u32, i: u32) -> W9 {
#ifdef WIDE
    let u0 = wload(s, i >> 2u);
    let u1 = wload(s, (i >> 2u) + 1u);
    let u2 = wload(s, (i >> 2u) + 2u);
    return W9(words_from(u0, u1, i & 3u), words_from(u1, u2, i & 3u), u2[i & 3u]);
#else
    return W9(
        vec4<u32>(word(s, i), word(s, i + 1u), word(s, i + 2u), word(s, i + 3u)),
        vec4<u32>(word(s, i + 4u), word(s, i + 5u), word(s, i + 6u), word(s, i + 7u)),
        word(s, i + 8u)
    );
#endif
}

// Block k of the row at byte offset rb of weight s, undecoded.
fn load_raw(s: u32, rb: u32, k: u32) -> Raw {
#ifdef EXT
    return Raw(ext_block(s, rb, k), 1.0, 0.0);
#else
    let b = rb + k * BLOCK_BYTES;
    let i = b >> 2u;
#ifdef Q4_1
    // f16 d, f16 m, 16 bytes; byte j holds elements j (low nibble) and j + 16 (high).
    let w = words5(s, i);
    let dm = unpack2x16float(w.a.x);
    let q0 = w.a.y;
    let q1 = w.a.z;
    let q2 = w.a.w;
    let q3 = w.e;
    return Raw(Blk(lo4(q0), lo4(q1), lo4(q2), lo4(q3), hi4(q0), hi4(q1), hi4(q2), hi4(q3)), dm.x, dm.y);
#endif
#ifdef Q4_0
    // f16 d, 16 bytes as in Q4_1; w = d * (q - 8). Blocks start at even bytes: the five words
    // from word i hold the whole block.
    let odd = (b & 2u) != 0u;
    let w = words5(s, i);
    let d = unpack2x16float(select(w.a.x, w.a.x >> 16u, odd)).x;
    let q0 = shifted(odd, w.a.x, w.a.y);
    let q1 = shifted(odd, w.a.y, w.a.z);
    let q2 = shifted(odd, w.a.z, w.a.w);
    let q3 = shifted(odd, w.a.w, w.e);
    return Raw(Blk(lo4(q0), lo4(q1), lo4(q2), lo4(q3), hi4(q0), hi4(q1), hi4(q2), hi4(q3)), d, -8.0 * d);
#endif
#ifdef Q8_0
    // f16 d, 32 signed bytes; w = d * q. Nine words from word i hold the block.
    let odd = (b & 2u) != 0u;
    let w = words9(s, i);
    let d = unpack2x16float(select(w.a.x, w.a.x >> 16u, odd)).x;
    return Raw(
        Blk(
            vec4<f32>(unpack4xI8(shifted(odd, w.a.x, w.a.y))),
            vec4<f32>(unpack4xI8(shifted(odd, w.a.y, w.a.z))),
            vec4<f32>(unpack4xI8(shifted(odd, w.a.z, w.a.w))),
            vec4<f32>(unpack4xI8(shifted(odd, w.a.w, w.b.x))),
            vec4<f32>(unpack4xI8(shifted(odd, w.b.x, w.b.y))),
            vec4<f32>(unpack4xI8(shifted(odd, w.b.y, w.b.z))),
            vec4<f32>(unpack4xI8(shifted(odd, w.b.z, w.b.w))),
            vec4<f32>(unpack4xI8(shifted(odd, w.b.w, w.c)))
        ),
        d,
        0.0
    );
#endif
#endif
}

// Block k of the row at byte offset rb of weight s, decoded.
fn load_block(s: u32, rb: u32, k: u32) -> Blk {
#ifdef EXT
    return ext_block(s, rb, k);
#else
    let r = load_raw(s, rb, k);
    let q = r.q;
    return Blk(
        q.a0 * r.d + r.m, q.a1 * r.d + r.m, q.a2 * r.d + r.m, q.a3 * r.d + r.m,
        q.a4 * r.d + r.m, q.a5 * r.d + r.m, q.a6 * r.d + r.m, q.a7 * r.d + r.m
    );
#endif
}
#endif

// The norm weights of this lane's vec4 of the block at vec4 index c (NORM; else ones).
fn norm_w(c: u32, lane: u32) -> vec4<f32> {
#ifdef NORM
    return xv(nw4[c + lane]);
#else
    return vec4<f32>(1.0);
#endif
}

// The block's X values starting at vec4 index i (NORM: times the norm weights g of this lane's
// vec4, adding the squares of the values to *ss).
fn x_block(i: u32, lane: u32, g: vec4<f32>, ss: ptr<function, f32>) -> Xb {
#ifdef SHARE_X
    var v = xv(x4[i + lane]);
#ifdef NORM
    *ss += dot(v, v);
    v *= g;
#endif
    return Xb(
        subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u),
        subgroupBroadcast(v, 3u), subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u),
        subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u)
    );
#else
    return Xb(
        xv(x4[i]), xv(x4[i + 1u]), xv(x4[i + 2u]), xv(x4[i + 3u]),
        xv(x4[i + 4u]), xv(x4[i + 5u]), xv(x4[i + 6u]), xv(x4[i + 7u])
    );
#endif
}

fn dot_block(w: Blk, x: Xb) -> f32 {
    return dot(w.a0, x.v0) + dot(w.a1, x.v1) + dot(w.a2, x.v2) + dot(w.a3, x.v3)
        + dot(w.a4, x.v4) + dot(w.a5, x.v5) + dot(w.a6, x.v6) + dot(w.a7, x.v7);
}

// One token's sums for a block: (W x, W2 x) of the thread's row, and (PAIR) of its second row
// (w3: W's, w4: W2's).
fn token(w: Blk, w2: Blk, w3: Blk, w4: Blk, i: u32, lane: u32, g: vec4<f32>, ss: ptr<function, f32>) -> vec4<f32> {
    let xb = x_block(i, lane, g, ss);
    var s = vec4<f32>(dot_block(w, xb), 0.0, 0.0, 0.0);
#ifdef SWIGLU
    s.y = dot_block(w2, xb);
#endif
#ifdef PAIR
    s.z = dot_block(w3, xb);
#ifdef SWIGLU
    s.w = dot_block(w4, xb);
#endif
#endif
    return s;
}

fn emit(t: u32, n_tok: u32, r: u32, s: vec2<f32>) {
    if (t < n_tok) {
        store(t, r, s.x, s.y);
    }
}

// A token's sums of the thread's row r (PAIR: and of row r + WG, in s.zw).
fn emit_rows(t: u32, n_tok: u32, r: u32, s: vec4<f32>) {
    if (r < seg_rows) {
        emit(t, n_tok, r, s.xy);
    }
#ifdef PAIR
    if (r + WG < seg_rows) {
        emit(t, n_tok, r + WG, s.zw);
    }
#endif
}

// Every lane runs the whole loop (rows past the end read the last row and store nothing), so
// subgroup broadcasts always see a full subgroup. Tokens past the batch read its last token.
@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#ifdef SHARE_X
    @builtin(subgroup_invocation_id) lane: u32,
#endif
) {
#ifndef SHARE_X
    let lane = 0u;
#endif
    let r = begin(wid.x) * ROWS_PER_WG + lid;
#ifdef MULTI
#ifdef ONEBUF
    walk(0u, r, wid.y, lane);
#else
    // One call per segment with its weight as a constant, so each reads one binding without a
    // branch per load (the segment is the same for the whole workgroup).
    if (seg == 0u) {
        walk(0u, r, wid.y, lane);
    } else if (seg == 1u) {
        walk(1u, r, wid.y, lane);
    } else {
        walk(2u, r, wid.y, lane);
    }
#endif
#else
    walk(0u, r, wid.y, lane);
#endif
}

fn walk(ws: u32, r: u32, ty: u32, lane: u32) {
#ifdef ROWS
    rows(ws, r, ty, lane);
#else
    blocks(ws, r, ty, lane);
#endif
}

#ifdef ROWS
// W x for block k of the row at byte rb of weight s, given the sum xs of the block's X.
fn raw_dot(s: u32, rb: u32, k: u32, xb: Xb, xs: f32) -> f32 {
    let r = load_raw(s, rb, k);
    return r.d * dot_block(r.q, xb) + r.m * xs;
}

// Block k's sums (W x, W2 x) for the row at byte rb (rb2 of W2).
fn pair(ws: u32, rb: u32, rb2: u32, k: u32, xb: Xb, xs: f32) -> vec2<f32> {
#ifdef SWIGLU
    return vec2<f32>(raw_dot(ws, rb, k, xb, xs), raw_dot(1u, rb2, k, xb, xs));
#else
    return vec2<f32>(raw_dot(ws, rb, k, xb, xs), 0.0);
#endif
}

// The sum of a block's X values (what the m of every row's block multiplies).
fn x_sum(xb: Xb) -> f32 {
    let o = vec4<f32>(1.0);
    return dot(xb.v0 + xb.v1 + xb.v2 + xb.v3 + xb.v4 + xb.v5 + xb.v6 + xb.v7, o);
}

#ifdef WIDE
#include "matmul_stream"
#endif

// Decode (TT = 1, blocks of 32 weights) with RPL rows a thread (2 to 4; 1 with WIDE): rows r,
// r + WG, ... of the workgroup's, so that each X (and norm weight) load serves RPL rows. On CPU
// rasterizers a load costs per lane, and X had cost nearly as many loads per block as the
// weights.
fn rows(ws: u32, r: u32, t: u32, lane: u32) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let lr = seg_rows - 1u;
    let ra = row_byte(ws, min(r, lr));
    let rb = row_byte(ws, min(r + WG, lr));
    let rc = row_byte(ws, min(r + 2u * WG, lr));
    let rd = row_byte(ws, min(r + 3u * WG, lr));
    let ra2 = row_byte(1u, min(r, lr));
    let rb2 = row_byte(1u, min(r + WG, lr));
    let rc2 = row_byte(1u, min(r + 2u * WG, lr));
    let rd2 = row_byte(1u, min(r + 3u * WG, lr));
    let x0 = (p.x_offset >> 2u) + min(t, n_tok - 1u) * (p.x_stride >> 2u);
    var sa = vec2<f32>(0.0);
    var sb = vec2<f32>(0.0);
    var sc = vec2<f32>(0.0);
    var sd = vec2<f32>(0.0);
    var q = 0.0;
    let n_blocks = p.cols / 32u;
    var k0 = 0u;
#ifdef WIDE
    // Whole groups of GB blocks from each row's stream (matmul_stream.wgsl), then block by
    // block.
    k0 = n_blocks - n_blocks % GB;
    stream_rows(ws, ra, rb, rc, rd, ra2, rb2, rc2, rd2, x0, k0, lane, &q, &sa, &sb, &sc, &sd);
#endif
    for (var k = k0; k < n_blocks; k++) {
        let c = k * 8u;
        let g = norm_w(c, lane);
        let xb = x_block(x0 + c, lane, g, &q);
        let xs = x_sum(xb);
        sa += pair(ws, ra, ra2, k, xb, xs);
        if (RPL > 1u) {
            sb += pair(ws, rb, rb2, k, xb, xs);
        }
        if (RPL > 2u) {
            sc += pair(ws, rc, rc2, k, xb, xs);
        }
        if (RPL > 3u) {
            sd += pair(ws, rd, rd2, k, xb, xs);
        }
    }
#ifdef TOUCH
    // Never true (no dispatch has zero rows), but not known to the compiler: keeps the touches.
    if (p.rows == 0u && touch == 0x9e3779b9u) {
        y[0] = 0.0;
    }
#endif
#ifdef NORM
    let f = 1.0 / sqrt(subgroupAdd(q) / f32(p.cols) + bitcast<f32>(p.eps));
    sa *= f;
    sb *= f;
    sc *= f;
    sd *= f;
#endif
    if (r < seg_rows) {
        emit(t, n_tok, r, sa);
    }
    if (RPL > 1u && r + WG < seg_rows) {
        emit(t, n_tok, r + WG, sb);
    }
    if (RPL > 2u && r + 2u * WG < seg_rows) {
        emit(t, n_tok, r + 2u * WG, sc);
    }
    if (RPL > 3u && r + 3u * WG < seg_rows) {
        emit(t, n_tok, r + 3u * WG, sd);
    }
}
#endif

#ifndef SUPER
// Types without super-blocks have no shared fields: a placeholder, so that both kinds read
// their blocks alike.
alias Hdr = u32;
#endif

// Block (or super-block chunk) k of weight s: of the row at byte rb, or (SUPER) of the
// super-block whose shared fields h holds.
fn block_at(s: u32, h: Hdr, rb: u32, k: u32) -> Blk {
#ifdef SUPER
    return ext_chunk(s, h, k);
#else
    return load_block(s, rb, k);
#endif
}

// Rows r of weight ws (0: W; MULTI: the segment's weight) for the token tile ty.
fn blocks(ws: u32, r: u32, ty: u32, lane: u32) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let rb = row_byte(ws, min(r, seg_rows - 1u));
    let rb2 = row_byte(1u, min(r, seg_rows - 1u));
#ifdef PAIR
    let rc = row_byte(ws, min(r + WG, seg_rows - 1u));
    let rc2 = row_byte(1u, min(r + WG, seg_rows - 1u));
#endif
    let t0 = ty * TT;
    let last = n_tok - 1u;
    let xs = p.x_stride >> 2u;
    let xo = p.x_offset >> 2u;
    // The vec4 index of each token's row of X (x4_: x4 names the binding).
    let x0 = xo + min(t0, last) * xs;
    let x1 = xo + min(t0 + 1u, last) * xs;
    let x2 = xo + min(t0 + 2u, last) * xs;
    let x3 = xo + min(t0 + 3u, last) * xs;
    let x4_ = xo + min(t0 + 4u, last) * xs;
    let x5 = xo + min(t0 + 5u, last) * xs;
    let x6 = xo + min(t0 + 6u, last) * xs;
    let x7 = xo + min(t0 + 7u, last) * xs;
    var s0 = vec4<f32>(0.0);
    var s1 = vec4<f32>(0.0);
    var s2 = vec4<f32>(0.0);
    var s3 = vec4<f32>(0.0);
    var s4 = vec4<f32>(0.0);
    var s5 = vec4<f32>(0.0);
    var s6 = vec4<f32>(0.0);
    var s7 = vec4<f32>(0.0);
    // Sums of squares of each token's X (NORM).
    var q0 = 0.0;
    var q1 = 0.0;
    var q2 = 0.0;
    var q3 = 0.0;
    var q4 = 0.0;
    var q5 = 0.0;
    var q6 = 0.0;
    var q7 = 0.0;
    let n_blocks = p.cols / 32u;
    // Super-block fields shared by several chunks (SUPER), loaded when a new group of chunks
    // starts: of the thread's row of W and W2, and (PAIR) of its second row.
    var hd: Hdr;
    var hd2: Hdr;
    var hc: Hdr;
    var hc2: Hdr;
    for (var k = 0u; k < n_blocks; k++) {
#ifdef SUPER
        if ((k % HDR_EVERY) == 0u) {
            hd = ext_header(ws, rb, k);
#ifdef SWIGLU
            hd2 = ext_header(1u, rb2, k);
#endif
#ifdef PAIR
            hc = ext_header(ws, rc, k);
#ifdef SWIGLU
            hc2 = ext_header(1u, rc2, k);
#endif
#endif
        }
#endif
        let wb = block_at(ws, hd, rb, k);
#ifdef SWIGLU
        let wb2 = block_at(1u, hd2, rb2, k);
#else
        let wb2 = wb;
#endif
#ifdef PAIR
        let wc = block_at(ws, hc, rc, k);
#ifdef SWIGLU
        let wc2 = block_at(1u, hc2, rc2, k);
#else
        let wc2 = wc;
#endif
#else
        let wc = wb;
        let wc2 = wb2;
#endif
        let c = k * 8u;
        let g = norm_w(c, lane);
        s0 += token(wb, wb2, wc, wc2, x0 + c, lane, g, &q0);
        if (TT > 1u) {
            s1 += token(wb, wb2, wc, wc2, x1 + c, lane, g, &q1);
        }
        if (TT > 2u) {
            s2 += token(wb, wb2, wc, wc2, x2 + c, lane, g, &q2);
        }
        if (TT > 3u) {
            s3 += token(wb, wb2, wc, wc2, x3 + c, lane, g, &q3);
        }
        if (TT > 4u) {
            s4 += token(wb, wb2, wc, wc2, x4_ + c, lane, g, &q4);
        }
        if (TT > 5u) {
            s5 += token(wb, wb2, wc, wc2, x5 + c, lane, g, &q5);
        }
        if (TT > 6u) {
            s6 += token(wb, wb2, wc, wc2, x6 + c, lane, g, &q6);
        }
        if (TT > 7u) {
            s7 += token(wb, wb2, wc, wc2, x7 + c, lane, g, &q7);
        }
    }
#ifdef NORM
    // 1 / RMS of each token's X: the lanes' sums together cover the whole row.
    let n = f32(p.cols);
    let eps = bitcast<f32>(p.eps);
    s0 *= 1.0 / sqrt(subgroupAdd(q0) / n + eps);
    if (TT > 1u) {
        s1 *= 1.0 / sqrt(subgroupAdd(q1) / n + eps);
    }
    if (TT > 2u) {
        s2 *= 1.0 / sqrt(subgroupAdd(q2) / n + eps);
    }
    if (TT > 3u) {
        s3 *= 1.0 / sqrt(subgroupAdd(q3) / n + eps);
    }
    if (TT > 4u) {
        s4 *= 1.0 / sqrt(subgroupAdd(q4) / n + eps);
    }
    if (TT > 5u) {
        s5 *= 1.0 / sqrt(subgroupAdd(q5) / n + eps);
    }
    if (TT > 6u) {
        s6 *= 1.0 / sqrt(subgroupAdd(q6) / n + eps);
    }
    if (TT > 7u) {
        s7 *= 1.0 / sqrt(subgroupAdd(q7) / n + eps);
    }
#endif
    emit_rows(t0, n_tok, r, s0);
    if (TT > 1u) {
        emit_rows(t0 + 1u, n_tok, r, s1);
    }
    if (TT > 2u) {
        emit_rows(t0 + 2u, n_tok, r, s2);
    }
    if (TT > 3u) {
        emit_rows(t0 + 3u, n_tok, r, s3);
    }
    if (TT > 4u) {
        emit_rows(t0 + 4u, n_tok, r, s4);
    }
    if (TT > 5u) {
        emit_rows(t0 + 5u, n_tok, r, s5);
    }
    if (TT > 6u) {
        emit_rows(t0 + 6u, n_tok, r, s6);
    }
    if (TT > 7u) {
        emit_rows(t0 + 7u, n_tok, r, s7);
    }
}
#endif
