// Quantized matrix products: Y[t, r] (+)= sum_c W[r, c] * X[t, c].
//
// W is one part of a weight tensor exactly as stored in the GGUF file (rows [0, rows) of the
// part), read as raw u32 words: no dequantized copy exists on the device. Each workgroup
// handles ROWS_PER_WG rows and TT tokens; TPR threads share a row, each walking 8-weight units.
// With TT = 1 this is the decode matrix-vector product; with TT > 1 every weight unit read is
// reused across TT tokens (prefill).
//
// Defines: one of F32 / F16 / BF16 / Q4_0 / Q4_1 / Q8_0; ROWS_PER_WG, TPR (power of two), TT;
// ACC (add into Y: fused residual); SWIGLU (a second weight W2 and Y = silu(W X) * (W2 X));
// REDUCE (TPR > 1: lanes of a row combine through workgroup memory); RAGGED (float types whose
// row length may not be a multiple of 8).

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
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

struct Step {
    n_tokens: u32,
    pos0: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<uniform> step: Step;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#ifdef SWIGLU
@group(0) @binding(5) var<storage, read> w2: array<u32>;
#endif

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
    return w[i];
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

struct Unit {
    a: vec4<f32>,
    b: vec4<f32>,
}

// The 8 weights of row r, columns [8u, 8u + 8).
fn load_unit(s: u32, r: u32, u: u32) -> Unit {
    let rb = r * p.row_bytes;
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
    let r = wid.x * ROWS_PER_WG + lr;
    let t0 = wid.y * TT;
    var acc: array<f32, TT>;
#ifdef SWIGLU
    var acc2: array<f32, TT>;
#endif
    if (r < p.rows) {
        let n_units = (p.cols + 7u) / 8u;
        for (var u = lt; u < n_units; u += TPR) {
            let wu = load_unit(0u, r, u);
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
    if (lt < TT && r < p.rows) {
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
    if (r < p.rows) {
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

fn store(t: u32, r: u32, v: f32, v2: f32) {
    var yo = p.y_offset + t * p.y_stride + r;
    if (p.y_at_pos != 0u) {
        yo += step.pos0 * p.y_stride;
    }
    var o = v;
#ifdef SWIGLU
    o = v / (1.0 + exp(-v)) * v2;
#endif
#ifdef ACC
    y[yo] += o;
#else
    y[yo] = o;
#endif
}
