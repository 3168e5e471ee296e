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
// `begin` sets the segment's values for the invocation. ONEBUF: the three weights lie in W's
// binding, each from byte `sg.base` (a layer's buffer), and one walk serves every segment;
// else a branch per segment picks the binding (on lavapipe that branch cost about a quarter of
// the product: every branch's body seems to run, the lanes outside it masked).
//
// NORM (BLOCKS with SHARE_X): X is the residual before its RMSNorm; the product normalizes it
// itself: X values are multiplied by the norm weight `nw4` as they are read, each lane sums the
// squares of the X values it loads (together the lanes load each once), and each token's sum is
// scaled by 1 / sqrt(mean square + eps) at the end (eps: the bits of `p.eps`). Saves the norm's
// dispatch and its pass over X.
//
// BLOCKS (quantized types, TPR = 1, TT <= 8, X offset and stride multiples of 4): a separate
// entry body (matmul_blocks.wgsl, included) where each thread walks its row one whole 32-weight
// block (or 32-weight chunk of a super-block) at a time, loading the block's words once, and
// reads X as vec4s. With SHARE_X as well (8-wide subgroups) each lane of a subgroup loads one
// vec4 of the block's 32 X values and subgroup broadcasts hand them to the other lanes, so a
// block costs one X load per lane and token instead of eight.
//
// PAIR (BLOCKS, TT > 1): each thread walks two rows, r and r + WG (WG: half the workgroup's
// rows; with SWIGLU, of both weights), so that each load of a token's X serves twice the
// weights (a load costs per lane on CPU rasterizers; the dot products cost much less).
//
// ROWS (BLOCKS, TT = 1, 32-weight blocks) with RPL (2 to 4; 1 with WIDE): the workgroup's
// ROWS_PER_WG rows are walked by ROWS_PER_WG / RPL threads, RPL rows each (WG apart), so one X
// load serves RPL rows, and each block's sum is d (q . x) + m (sum of x), with the sum of x
// shared by the rows.
//
// WIDE (ROWS; Q4_1, or Q8_0 with an even number of blocks a row): weights are bound as vec4s
// and each row is read as a stream of them (matmul_stream.wgsl), one load per 4 words, in
// groups of GB blocks; a row's last (blocks mod GB) blocks are read as words. RA: the multiple
// of words every row start is (4: no shifts).

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

// W64: 16-byte loads (a vec4 of weight words, of X or of norm weights) are bound as two
// 64-bit words and split back: on CPU rasterizers a load costs per lane and component whatever
// the component's width, so the same 16 bytes cost two loads instead of four.
#ifdef W64
fn halves(a: vec2<u64>) -> vec4<u32> {
    return vec4<u32>(u32(a.x), u32(a.x >> 32u), u32(a.y), u32(a.y >> 32u));
}
#endif

// The unit of a weight load: a word, or (WIDE) four words at once.
#ifdef WIDE
alias Wv = vec4<u32>;
#ifdef W64
alias Wb = vec2<u64>;

fn wv(a: Wb) -> Wv {
    return halves(a);
}
#else
alias Wb = vec4<u32>;

fn wv(a: Wb) -> Wv {
    return a;
}
#endif
#else
alias Wv = u32;
alias Wb = u32;

fn wv(a: Wb) -> Wv {
    return a;
}
#endif

// The unit of an X (and norm weight) load: a vec4 of floats.
#ifdef W64
alias Xv = vec2<u64>;

fn xv(a: Xv) -> vec4<f32> {
    return bitcast<vec4<f32>>(halves(a));
}
#else
alias Xv = vec4<f32>;

fn xv(a: Xv) -> vec4<f32> {
    return a;
}
#endif

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> w: array<Wb>;
#ifdef BLOCKS
@group(0) @binding(3) var<storage, read> x4: array<Xv>;
#else
@group(0) @binding(3) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#ifdef SWIGLU
@group(0) @binding(5) var<storage, read> w2: array<Wb>;
#endif
#ifdef NORM
@group(0) @binding(10) var<storage, read> nw4: array<Xv>;
#endif
#ifdef MULTI
// Per segment (x, y, z): rows, first workgroup, first row in its buffer, Y stride, Y offset,
// and (ONEBUF) the byte its weight starts at in W's binding.
struct Segs {
    rows: vec4<u32>,
    wg0: vec4<u32>,
    row0: vec4<u32>,
    y_stride: vec4<u32>,
    y_offset: vec4<u32>,
    base: vec4<u32>,
}
#ifndef ONEBUF
@group(0) @binding(5) var<storage, read> w2: array<Wb>;
@group(0) @binding(6) var<storage, read> w3: array<Wb>;
#endif
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
var<private> seg_base: u32;

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
    seg_base = sg.base[s];
    return wx - sg.wg0[s];
#else
    seg = 0u;
    seg_rows = p.rows;
    seg_row0 = p.w_row0;
    seg_y_stride = p.y_stride;
    seg_y_offset = p.y_offset;
    seg_base = 0u;
    return wx;
#endif
}

#ifdef ROWS
const WG: u32 = ROWS_PER_WG / RPL;
#else
#ifdef PAIR
const WG: u32 = ROWS_PER_WG / 2u;
#else
const WG: u32 = ROWS_PER_WG * TPR;
#endif
#endif

#ifdef REDUCE
var<workgroup> red: array<f32, WG * TT>;
#ifdef SWIGLU
var<workgroup> red2: array<f32, WG * TT>;
#endif
#endif

// Load unit i of weight s (0: W, 1: W2; MULTI: the segment's weight).
fn wload(s: u32, i: u32) -> Wv {
#ifdef SWIGLU
    if (s == 1u) {
        return wv(w2[i]);
    }
#endif
#ifdef MULTI
#ifndef ONEBUF
    if (s == 1u) {
        return wv(w2[i]);
    }
    if (s == 2u) {
        return wv(w3[i]);
    }
#endif
#endif
    return wv(w[i]);
}

// Word i of weight s.
fn word(s: u32, i: u32) -> u32 {
#ifdef WIDE
    return wload(s, i >> 2u)[i & 3u];
#else
    return wload(s, i);
#endif
}

// Byte offset of row r of weight s (0: W, 1: W2; MULTI: the segment's).
fn row_byte(s: u32, r: u32) -> u32 {
#ifdef MULTI
    return seg_base + (r + seg_row0) * p.row_bytes;
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

#include "matmul_blocks"

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
