// Quantized matrix products: Y[t, r] (+)= sum_c W[r, c] * X[t, c].
//
// W is one part of a weight tensor exactly as stored in the GGUF file (rows [w_row0, w_row0 +
// rows) of its buffer; W2's rows start at w2_row0 of its own), read as raw u32 words: no
// dequantized copy exists on the device. Each workgroup
// handles ROWS_PER_WG rows and TT tokens; TPR threads share a row, each walking 8-weight units.
// With TT = 1 this is the decode matrix-vector product; with TT > 1 every weight unit read is
// reused across TT tokens (prefill).
//
// Defines: one of F32 / F16 / BF16 / Q4_0 / Q4_1 / Q8_0, or EXT with one of the types decoded in
// matmul_quant.wgsl (included at the end); ROWS_PER_WG, TPR (power of two), TT;
// ACC (add into Y: fused residual); SWIGLU (a second weight W2 and Y = silu(W X) * (W2 X));
// GELU (with SWIGLU: Y = gelu_tanh(W X) * (W2 X) instead);
// REDUCE (TPR > 1: lanes of a row combine through workgroup memory); RAGGED (float types whose
// row length may not be a multiple of 8).
//
// MULTI (not with SWIGLU): up to three weights of one type and width in one dispatch, each
// with its own rows, starting row and Y (W, W2, W3 into Y, Y2, Y3: Q, K and V from one X). The
// grid's workgroups are cut into segments at `sg.wg0` (no workgroup straddles two), and
// `begin` sets the segment's values for the invocation.
//
// NORM (BLOCKS with SHARE_X): X is the residual before its RMSNorm; the product normalizes it
// itself: X values are multiplied by the norm weight `nw4` as they are read, each lane sums the
// squares of the X values it loads (together the lanes load each once), and each token's sum is
// scaled by 1 / sqrt(mean square + eps) at the end (eps: the bits of `p.eps`). Saves the norm's
// dispatch and its pass over X.
//
// BLOCKS (quantized types, TPR = 1, TT <= 8, X offset and stride multiples of 4): a separate
// entry body where each thread walks its row one whole 32-weight block (or 32-weight chunk of a
// super-block) at a time, loading the block's words once, and reads X as vec4s. With SHARE_X as well (8-wide subgroups) each lane
// of a subgroup loads one vec4 of the block's 32 X values and subgroup broadcasts hand them to
// the other lanes, so a block costs one X load per lane and token instead of eight.

struct Params {
    rows: u32,
    cols: u32,
    row_bytes: u32,
    x_stride: u32,
    y_stride: u32,
    y_offset: u32,
    y_at_pos: u32,
    x_offset: u32,
    n_tokens: u32,
    w_row0: u32,
    w2_row0: u32,
    eps: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> w: array<u32>;
#ifdef BLOCKS
@group(0) @binding(3) var<storage, read> x4: array<vec4<f32>>;
#else
@group(0) @binding(3) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#ifdef SWIGLU
@group(0) @binding(5) var<storage, read> w2: array<u32>;
#endif
#ifdef NORM
@group(0) @binding(10) var<storage, read> nw4: array<vec4<f32>>;
#endif
#ifdef MULTI
// Per segment (x, y, z): rows, first workgroup, first row in its buffer, Y stride, Y offset.
struct Segs {
    rows: vec4<u32>,
    wg0: vec4<u32>,
    row0: vec4<u32>,
    y_stride: vec4<u32>,
    y_offset: vec4<u32>,
}
@group(0) @binding(5) var<storage, read> w2: array<u32>;
@group(0) @binding(6) var<storage, read> w3: array<u32>;
@group(0) @binding(7) var<storage, read_write> y2: array<f32>;
@group(0) @binding(8) var<storage, read_write> y3: array<f32>;
@group(0) @binding(9) var<uniform> sg: Segs;
#endif

// This invocation's segment (0 without MULTI) and its values.
var<private> seg: u32;
var<private> seg_rows: u32;
var<private> seg_row0: u32;
var<private> seg_y_stride: u32;
var<private> seg_y_offset: u32;

// Set the segment of workgroup `wx`; returns the workgroup's index within its segment.
fn begin(wx: u32) -> u32 {
#ifdef MULTI
    var s = 0u;
    if (wx >= sg.wg0.y) {
        s = 1u;
    }
    if (wx >= sg.wg0.z) {
        s = 2u;
    }
    seg = s;
    seg_rows = sg.rows[s];
    seg_row0 = sg.row0[s];
    seg_y_stride = sg.y_stride[s];
    seg_y_offset = sg.y_offset[s];
    return wx - sg.wg0[s];
#else
    seg = 0u;
    seg_rows = p.rows;
    seg_row0 = p.w_row0;
    seg_y_stride = p.y_stride;
    seg_y_offset = p.y_offset;
    return wx;
#endif
}

const WG: u32 = ROWS_PER_WG * TPR;

#ifdef REDUCE
var<workgroup> red: array<f32, WG * TT>;
#ifdef SWIGLU
var<workgroup> red2: array<f32, WG * TT>;
#endif
#endif

fn word(s: u32, i: u32) -> u32 {
#ifdef SWIGLU
    if (s == 1u) {
        return w2[i];
    }
#endif
#ifdef MULTI
    if (s == 1u) {
        return w2[i];
    }
    if (s == 2u) {
        return w3[i];
    }
#endif
    return w[i];
}

// Byte offset of row r of weight s (0: W, 1: W2; MULTI: the segment's).
fn row_byte(s: u32, r: u32) -> u32 {
#ifdef MULTI
    return (r + seg_row0) * p.row_bytes;
#else
    return (r + select(seg_row0, p.w2_row0, s == 1u)) * p.row_bytes;
#endif
}

// 16 bits at an even byte offset.
fn half_at(s: u32, off: u32) -> u32 {
    return (word(s, off >> 2u) >> ((off & 2u) * 8u)) & 0xffffu;
}

// 32 bits at an even byte offset.
fn word_at2(s: u32, off: u32) -> u32 {
    let i = off >> 2u;
    if ((off & 2u) == 0u) {
        return word(s, i);
    }
    return (word(s, i) >> 16u) | (word(s, i + 1u) << 16u);
}

fn nibbles(q: u32, sh: u32) -> vec4<f32> {
    return vec4<f32>(
        f32((q >> sh) & 15u),
        f32((q >> (8u + sh)) & 15u),
        f32((q >> (16u + sh)) & 15u),
        f32((q >> (24u + sh)) & 15u)
    );
}

fn sbytes(q: u32) -> vec4<f32> {
    return vec4<f32>(
        f32(bitcast<i32>(q << 24u) >> 24u),
        f32(bitcast<i32>(q << 16u) >> 24u),
        f32(bitcast<i32>(q << 8u) >> 24u),
        f32(bitcast<i32>(q) >> 24u)
    );
}

#ifndef BLOCKS
struct Unit {
    a: vec4<f32>,
    b: vec4<f32>,
}

// The 8 weights of row r, columns [8u, 8u + 8).
fn load_unit(s: u32, r: u32, u: u32) -> Unit {
#ifdef EXT
    return ext_unit(s, r, u);
#else
    let rb = row_byte(s, r);
#ifdef Q4_1
    // Block: f16 d, f16 m, 16 bytes; byte j holds elements j (low) and j + 16 (high).
    let blk = (rb + (u >> 2u) * 20u) >> 2u;
    let sub = u & 3u;
    let dm = unpack2x16float(word(s, blk));
    let wi = blk + 1u + (sub & 1u) * 2u;
    let sh = (sub >> 1u) * 4u;
    return Unit(nibbles(word(s, wi), sh) * dm.x + dm.y, nibbles(word(s, wi + 1u), sh) * dm.x + dm.y);
#endif
#ifdef Q4_0
    // Block: f16 d, 16 bytes; w = d * (q - 8).
    let blk = rb + (u >> 2u) * 18u;
    let sub = u & 3u;
    let d = unpack2x16float(half_at(s, blk)).x;
    let qo = blk + 2u + (sub & 1u) * 8u;
    let sh = (sub >> 1u) * 4u;
    return Unit((nibbles(word_at2(s, qo), sh) - 8.0) * d, (nibbles(word_at2(s, qo + 4u), sh) - 8.0) * d);
#endif
#ifdef Q8_0
    // Block: f16 d, 32 signed bytes; w = d * q.
    let blk = rb + (u >> 2u) * 34u;
    let d = unpack2x16float(half_at(s, blk)).x;
    let qo = blk + 2u + (u & 3u) * 8u;
    return Unit(sbytes(word_at2(s, qo)) * d, sbytes(word_at2(s, qo + 4u)) * d);
#endif
#ifdef F32
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let c = u * 8u + i;
        if (c < p.cols) {
            v[i] = bitcast<f32>(word(s, (rb >> 2u) + c));
        }
    }
    return Unit(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
#endif
#ifdef F16
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let c = u * 8u + i;
        if (c < p.cols) {
            v[i] = unpack2x16float(half_at(s, rb + c * 2u)).x;
        }
    }
    return Unit(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
#endif
#ifdef BF16
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let c = u * 8u + i;
        if (c < p.cols) {
            v[i] = bitcast<f32>(half_at(s, rb + c * 2u) << 16u);
        }
    }
    return Unit(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
#endif
#endif
}

fn xval(i: u32, c: u32) -> f32 {
#ifdef RAGGED
    if (c >= p.cols) {
        return 0.0;
    }
#endif
    return x[i];
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let lr = lid / TPR;
    let lt = lid % TPR;
    let r = begin(wid.x) * ROWS_PER_WG + lr;
    let t0 = wid.y * TT;
    var acc: array<f32, TT>;
#ifdef SWIGLU
    var acc2: array<f32, TT>;
#endif
    if (r < seg_rows) {
        let n_units = (p.cols + 7u) / 8u;
        for (var u = lt; u < n_units; u += TPR) {
            let wu = load_unit(seg, r, u);
#ifdef SWIGLU
            let wv = load_unit(1u, r, u);
#endif
            let c = u * 8u;
            for (var t = 0u; t < TT; t++) {
                if (t0 + t < n_tok) {
                    let xb = p.x_offset + (t0 + t) * p.x_stride + c;
                    let xa = vec4<f32>(xval(xb, c), xval(xb + 1u, c + 1u), xval(xb + 2u, c + 2u), xval(xb + 3u, c + 3u));
                    let xc = vec4<f32>(xval(xb + 4u, c + 4u), xval(xb + 5u, c + 5u), xval(xb + 6u, c + 6u), xval(xb + 7u, c + 7u));
                    acc[t] += dot(wu.a, xa) + dot(wu.b, xc);
#ifdef SWIGLU
                    acc2[t] += dot(wv.a, xa) + dot(wv.b, xc);
#endif
                }
            }
        }
    }
#ifdef REDUCE
    for (var t = 0u; t < TT; t++) {
        red[lid * TT + t] = acc[t];
#ifdef SWIGLU
        red2[lid * TT + t] = acc2[t];
#endif
    }
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {
        if (lt < s) {
            for (var t = 0u; t < TT; t++) {
                red[lid * TT + t] += red[(lid + s) * TT + t];
#ifdef SWIGLU
                red2[lid * TT + t] += red2[(lid + s) * TT + t];
#endif
            }
        }
        workgroupBarrier();
    }
#endif
#ifdef REDUCE
    // Lanes 0..TT of each row write one token each.
    if (lt < TT && r < seg_rows) {
        let t = t0 + lt;
        if (t < n_tok) {
            var v = red[lr * TPR * TT + lt];
#ifdef SWIGLU
            let v2 = red2[lr * TPR * TT + lt];
#else
            let v2 = 0.0;
#endif
            store(t, r, v, v2);
        }
    }
#else
    // One thread per row: it holds every token's sum.
    if (r < seg_rows) {
        for (var t = 0u; t < TT; t++) {
            if (t0 + t < n_tok) {
#ifdef SWIGLU
                store(t0 + t, r, acc[t], acc2[t]);
#else
                store(t0 + t, r, acc[t], 0.0);
#endif
            }
        }
    }
#endif
}

#endif

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
// Block k of the row at byte offset rb of weight s.
fn load_block(s: u32, rb: u32, k: u32) -> Blk {
#ifdef EXT
    return ext_block(s, rb, k);
#else
    let b = rb + k * BLOCK_BYTES;
    let i = b >> 2u;
#ifdef Q4_1
    // f16 d, f16 m, 16 bytes; byte j holds elements j (low nibble) and j + 16 (high).
    let dm = unpack2x16float(word(s, i));
    let q0 = word(s, i + 1u);
    let q1 = word(s, i + 2u);
    let q2 = word(s, i + 3u);
    let q3 = word(s, i + 4u);
    return Blk(
        lo4(q0) * dm.x + dm.y, lo4(q1) * dm.x + dm.y, lo4(q2) * dm.x + dm.y, lo4(q3) * dm.x + dm.y,
        hi4(q0) * dm.x + dm.y, hi4(q1) * dm.x + dm.y, hi4(q2) * dm.x + dm.y, hi4(q3) * dm.x + dm.y
    );
#endif
#ifdef Q4_0
    // f16 d, 16 bytes as in Q4_1; w = d * (q - 8). Blocks start at even bytes: the five words
    // from word i hold the whole block.
    let odd = (b & 2u) != 0u;
    let w0 = word(s, i);
    let w1 = word(s, i + 1u);
    let w2 = word(s, i + 2u);
    let w3 = word(s, i + 3u);
    let w4 = word(s, i + 4u);
    let d = unpack2x16float(select(w0, w0 >> 16u, odd)).x;
    let q0 = shifted(odd, w0, w1);
    let q1 = shifted(odd, w1, w2);
    let q2 = shifted(odd, w2, w3);
    let q3 = shifted(odd, w3, w4);
    return Blk(
        (lo4(q0) - 8.0) * d, (lo4(q1) - 8.0) * d, (lo4(q2) - 8.0) * d, (lo4(q3) - 8.0) * d,
        (hi4(q0) - 8.0) * d, (hi4(q1) - 8.0) * d, (hi4(q2) - 8.0) * d, (hi4(q3) - 8.0) * d
    );
#endif
#ifdef Q8_0
    // f16 d, 32 signed bytes; w = d * q. Nine words from word i hold the block.
    let odd = (b & 2u) != 0u;
    let w0 = word(s, i);
    let w1 = word(s, i + 1u);
    let w2 = word(s, i + 2u);
    let w3 = word(s, i + 3u);
    let w4 = word(s, i + 4u);
    let w5 = word(s, i + 5u);
    let w6 = word(s, i + 6u);
    let w7 = word(s, i + 7u);
    let w8 = word(s, i + 8u);
    let d = unpack2x16float(select(w0, w0 >> 16u, odd)).x;
    return Blk(
        vec4<f32>(unpack4xI8(shifted(odd, w0, w1))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w1, w2))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w2, w3))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w3, w4))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w4, w5))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w5, w6))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w6, w7))) * d,
        vec4<f32>(unpack4xI8(shifted(odd, w7, w8))) * d
    );
#endif
#endif
}
#endif

// The block's X values starting at vec4 index i (NORM: times the norm weights g of this lane's
// vec4, adding the squares of the values to *ss).
fn x_block(i: u32, lane: u32, g: vec4<f32>, ss: ptr<function, f32>) -> Xb {
#ifdef SHARE_X
    var v = x4[i + lane];
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
    return Xb(x4[i], x4[i + 1u], x4[i + 2u], x4[i + 3u], x4[i + 4u], x4[i + 5u], x4[i + 6u], x4[i + 7u]);
#endif
}

fn dot_block(w: Blk, x: Xb) -> f32 {
    return dot(w.a0, x.v0) + dot(w.a1, x.v1) + dot(w.a2, x.v2) + dot(w.a3, x.v3)
        + dot(w.a4, x.v4) + dot(w.a5, x.v5) + dot(w.a6, x.v6) + dot(w.a7, x.v7);
}

// One token's sums for a block: (W x, W2 x).
fn token(w: Blk, w2: Blk, i: u32, lane: u32, g: vec4<f32>, ss: ptr<function, f32>) -> vec2<f32> {
    let xb = x_block(i, lane, g, ss);
#ifdef SWIGLU
    return vec2<f32>(dot_block(w, xb), dot_block(w2, xb));
#else
    return vec2<f32>(dot_block(w, xb), 0.0);
#endif
}

fn emit(t: u32, n_tok: u32, r: u32, s: vec2<f32>) {
    if (t < n_tok) {
        store(t, r, s.x, s.y);
    }
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
    // One call per segment with its weight as a constant, so each reads one binding without a
    // branch per load (the segment is the same for the whole workgroup).
    if (seg == 0u) {
        blocks(0u, r, wid.y, lane);
    } else if (seg == 1u) {
        blocks(1u, r, wid.y, lane);
    } else {
        blocks(2u, r, wid.y, lane);
    }
#else
    blocks(0u, r, wid.y, lane);
#endif
}

// Rows r of weight ws (0: W; MULTI: the segment's weight) for the token tile ty.
fn blocks(ws: u32, r: u32, ty: u32, lane: u32) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let rb = row_byte(ws, min(r, seg_rows - 1u));
    let rb2 = row_byte(1u, min(r, seg_rows - 1u));
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
    var s0 = vec2<f32>(0.0);
    var s1 = vec2<f32>(0.0);
    var s2 = vec2<f32>(0.0);
    var s3 = vec2<f32>(0.0);
    var s4 = vec2<f32>(0.0);
    var s5 = vec2<f32>(0.0);
    var s6 = vec2<f32>(0.0);
    var s7 = vec2<f32>(0.0);
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
#ifdef SUPER
    // Super-block fields shared by several chunks, loaded when a new group of chunks starts.
    var hd: Hdr;
    var hd2: Hdr;
#endif
    for (var k = 0u; k < n_blocks; k++) {
#ifdef SUPER
        if ((k % HDR_EVERY) == 0u) {
            hd = ext_header(ws, rb, k);
#ifdef SWIGLU
            hd2 = ext_header(1u, rb2, k);
#endif
        }
        let wb = ext_chunk(ws, hd, k);
#ifdef SWIGLU
        let wb2 = ext_chunk(1u, hd2, k);
#else
        let wb2 = wb;
#endif
#else
        let wb = load_block(ws, rb, k);
#ifdef SWIGLU
        let wb2 = load_block(1u, rb2, k);
#else
        let wb2 = wb;
#endif
#endif
        let c = k * 8u;
#ifdef NORM
        let g = nw4[c + lane];
#else
        let g = vec4<f32>(1.0);
#endif
        s0 += token(wb, wb2, x0 + c, lane, g, &q0);
        if (TT > 1u) {
            s1 += token(wb, wb2, x1 + c, lane, g, &q1);
        }
        if (TT > 2u) {
            s2 += token(wb, wb2, x2 + c, lane, g, &q2);
        }
        if (TT > 3u) {
            s3 += token(wb, wb2, x3 + c, lane, g, &q3);
        }
        if (TT > 4u) {
            s4 += token(wb, wb2, x4_ + c, lane, g, &q4);
        }
        if (TT > 5u) {
            s5 += token(wb, wb2, x5 + c, lane, g, &q5);
        }
        if (TT > 6u) {
            s6 += token(wb, wb2, x6 + c, lane, g, &q6);
        }
        if (TT > 7u) {
            s7 += token(wb, wb2, x7 + c, lane, g, &q7);
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
    if (r < seg_rows) {
        emit(t0, n_tok, r, s0);
        if (TT > 1u) {
            emit(t0 + 1u, n_tok, r, s1);
        }
        if (TT > 2u) {
            emit(t0 + 2u, n_tok, r, s2);
        }
        if (TT > 3u) {
            emit(t0 + 3u, n_tok, r, s3);
        }
        if (TT > 4u) {
            emit(t0 + 4u, n_tok, r, s4);
        }
        if (TT > 5u) {
            emit(t0 + 5u, n_tok, r, s5);
        }
        if (TT > 6u) {
            emit(t0 + 6u, n_tok, r, s6);
        }
        if (TT > 7u) {
            emit(t0 + 7u, n_tok, r, s7);
        }
    }
}
#endif

fn store(t: u32, r: u32, v: f32, v2: f32) {
    var yo = seg_y_offset + t * seg_y_stride + r;
    if (p.y_at_pos != 0u) {
        yo += step.pos0 * seg_y_stride;
    }
    var o = v;
#ifdef SWIGLU
#ifdef GELU
    o = gelu_tanh(v) * v2;
#else
    o = v / (1.0 + exp(-v)) * v2;
#endif
#endif
#ifdef MULTI
    if (seg == 1u) {
#ifdef ACC
        y2[yo] += o;
#else
        y2[yo] = o;
#endif
        return;
    }
    if (seg == 2u) {
#ifdef ACC
        y3[yo] += o;
#else
        y3[yo] = o;
#endif
        return;
    }
#endif
#ifdef ACC
    y[yo] += o;
#else
    y[yo] = o;
#endif
}

#ifdef GELU
// GELU, tanh approximation, with a tanh that cannot overflow.
fn gelu_tanh(g: f32) -> f32 {
    let u = 0.7978845608 * g * (1.0 + 0.044715 * g * g);
    let e = exp(-2.0 * abs(u));
    let th = sign(u) * (1.0 - e) / (1.0 + e);
    return 0.5 * g * (1.0 + th);
}
#endif

#include "matmul_quant"
