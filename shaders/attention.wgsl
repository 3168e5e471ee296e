// Causal grouped-query attention over a paged KV cache, split along the keys.
//
// The KV cache lives in pages of P tokens. A page holds P rows of K, then P rows of V (each row
// n_kv_heads * head_dim values) and sits in a slot of one of two pools: the layer's "home" pool
// (pages kept on the device) or the shared "stream" pool (pages brought in from flash for this
// layer). The page table lists, per sequence, the pages to attend in order as (page, slot)
// pairs; bit 31 of a slot selects the stream pool. Key k of the list is row k % P of list entry
// k / P; list entries are all full pages except possibly the last, so list keys are contiguous.
//
// A row t (sequence seq, position pos) scans list keys [0, min(list_keys, pos + 1 - key_base))
// (key_base: the position of list key 0 when the list starts past position 0). The keys
// are cut into splits of SPLIT keys; one workgroup per (head, row, split of this round) walks its
// split in chunks of WG keys with an online softmax and writes the unnormalized partial result
// (acc[head_dim], running max m, sum l). `merge` folds a round's partials, in split order, into
// the row's running state and, after the last round, writes acc / l. Split boundaries depend only
// on the row's scan length, so the arithmetic is the same wherever the pages live.
//
// Table header per layer (at word `table_base`): [first split of this round, flags (1: first
// round, 2: last round), splits in this round, pages to score]; then per sequence (stride
// `seq_stride` words): [list entries, list keys, key_base, 0, (page, slot) x max_pages].
//
// The grid's z covers this round's splits. Partials are laid out split-major, (split of the
// round, row, head), so the partial buffer holds any round of rows x splits up to its size: a
// decode row's rounds can cover many more splits than a prefill batch's. A round that is both
// the first and the last and has one split also writes acc / l to `o` (its merge is then left
// out).
//
// Scores are q.k * scale. Defines: DPT = ceil(head_dim / WG) output dims per thread; VEC4
// (head_dim a multiple of 4): Q and K are read as vec4s; KV_F16: the pools hold f16 pairs
// packed in u32 words; SOFTCAP: scores become softcap * tanh(score / softcap); SWA (sliding
// window): a key at position kp (from its page number) counts for a row at pos only when
// pos - kp < window. Masked keys weigh exactly 0, whatever split they fall in.

#include "attention_params"

@group(0) @binding(0) var<uniform> p: Params;
#ifdef MERGE
@group(0) @binding(2) var<storage, read> table: array<u32>;
@group(0) @binding(3) var<storage, read> part: array<f32>;
@group(0) @binding(4) var<storage, read_write> run: array<f32>;
@group(0) @binding(5) var<storage, read_write> o: array<f32>;
#else
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> table: array<u32>;
#ifdef VEC4
@group(0) @binding(4) var<storage, read> q4: array<vec4<f32>>;
#else
@group(0) @binding(4) var<storage, read> q: array<f32>;
#endif
#ifdef KV_F16
@group(0) @binding(5) var<storage, read> home: array<u32>;
@group(0) @binding(6) var<storage, read> strm: array<u32>;
#else
@group(0) @binding(5) var<storage, read> home: array<f32>;
@group(0) @binding(6) var<storage, read> strm: array<f32>;
#endif
@group(0) @binding(7) var<storage, read_write> part: array<f32>;
@group(0) @binding(8) var<storage, read_write> o: array<f32>;
#endif

const WG: u32 = 64u;
const SPLIT: u32 = 512u;
const STREAM: u32 = 0x80000000u;

#ifndef MERGE
// tanh that cannot overflow.
fn tanh_s(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// Element i of a pool (bit 31 of `i` selects the stream pool).
fn kv_at(i: u32) -> f32 {
    let e = i & ~STREAM;
#ifdef KV_F16
    if ((i & STREAM) != 0u) {
        return unpack2x16float(strm[e >> 1u])[e & 1u];
    }
    return unpack2x16float(home[e >> 1u])[e & 1u];
#else
    if ((i & STREAM) != 0u) {
        return strm[e];
    }
    return home[e];
#endif
}

// Elements [i, i + 4) of a pool, i a multiple of 4.
fn kv4_at(i: u32) -> vec4<f32> {
    let e = i & ~STREAM;
#ifdef KV_F16
    let w = e >> 1u;
    if ((i & STREAM) != 0u) {
        return vec4<f32>(unpack2x16float(strm[w]), unpack2x16float(strm[w + 1u]));
    }
    return vec4<f32>(unpack2x16float(home[w]), unpack2x16float(home[w + 1u]));
#else
    if ((i & STREAM) != 0u) {
        return vec4<f32>(strm[e], strm[e + 1u], strm[e + 2u], strm[e + 3u]);
    }
    return vec4<f32>(home[e], home[e + 1u], home[e + 2u], home[e + 3u]);
#endif
}

#ifdef VEC4
var<workgroup> qs4: array<vec4<f32>, DPT * WG / 4u>;
var<workgroup> sc4: array<vec4<f32>, WG / 4u>;
#else
var<workgroup> qs: array<f32, DPT * WG>;
var<workgroup> sc: array<f32, WG>;
#endif
// Element index of each chunk key's K row start (bit 31: stream pool).
var<workgroup> kbase: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let z = wid.z;
    if (t >= step.n_tokens || z >= table[p.table_base + 2u]) {
        return;
    }
    let hd = p.head_dim;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let row = rows[t];
    let sb = p.table_base + 4u + row.x * p.seq_stride;
    let key_base = table[sb + 2u];
    let scan = min(table[sb + 1u], select(0u, row.y + 1u - key_base, row.y + 1u > key_base));
    let split = table[p.table_base] + z;
    let k0 = min(split * SPLIT, scan);
    let k1 = min(k0 + SPLIT, scan);
    let pb = ((z * step.n_tokens + t) * p.n_heads + h) * (hd + 2u);
#ifdef VEC4
    let qb4 = (t * p.q_stride + h * hd) >> 2u;
    for (var d4 = lid; d4 < hd / 4u; d4 += WG) {
        qs4[d4] = q4[qb4 + d4];
    }
#else
    for (var d = lid; d < hd; d += WG) {
        qs[d] = q[t * p.q_stride + h * hd + d];
    }
#endif
    workgroupBarrier();
    var m = -1.0e30;
    var l = 0.0;
    var acc: array<f32, DPT>;
    let vofs = p.page_tokens * p.kv_dim;
    for (var c0 = k0; c0 < k1; c0 += WG) {
        let j = c0 + lid;
        var s = -1.0e30;
        var valid = false;
        if (j < k1) {
            let e = sb + 4u + 2u * (j / p.page_tokens);
            let slot = table[e + 1u];
            let kb = (((slot & ~STREAM) * p.page_elems + (j % p.page_tokens) * p.kv_dim
                + kvh * hd)) | (slot & STREAM);
            kbase[lid] = kb;
            valid = true;
#ifdef SWA
            let kpos = table[e] * p.page_tokens + j % p.page_tokens;
            valid = row.y < kpos || row.y - kpos < p.window;
#endif
            if (valid) {
                var dotv = 0.0;
#ifdef VEC4
                for (var d4 = 0u; d4 < hd / 4u; d4++) {
                    dotv += dot(qs4[d4], kv4_at(kb + 4u * d4));
                }
#else
                for (var d = 0u; d < hd; d++) {
                    dotv += qs[d] * kv_at(kb + d);
                }
#endif
                s = dotv * p.scale;
#ifdef SOFTCAP
                s = p.softcap * tanh_s(s / p.softcap);
#endif
            }
        }
#ifdef VEC4
        sc4[lid >> 2u][lid & 3u] = s;
        workgroupBarrier();
        var cmax = -1.0e30;
        for (var j4 = 0u; j4 < WG / 4u; j4++) {
            let v = sc4[j4];
            cmax = max(cmax, max(max(v.x, v.y), max(v.z, v.w)));
        }
#else
        sc[lid] = s;
        workgroupBarrier();
        var cmax = -1.0e30;
        for (var jj = 0u; jj < WG; jj++) {
            cmax = max(cmax, sc[jj]);
        }
#endif
        workgroupBarrier();
        let m_new = max(m, cmax);
        let alpha = exp(m - m_new);
        var pj = 0.0;
        if (valid) {
            pj = exp(s - m_new);
        }
#ifdef VEC4
        sc4[lid >> 2u][lid & 3u] = pj;
#else
        sc[lid] = pj;
#endif
        workgroupBarrier();
        l *= alpha;
        for (var k = 0u; k < DPT; k++) {
            acc[k] *= alpha;
        }
        let cnt = min(WG, k1 - c0);
        for (var jj = 0u; jj < cnt; jj++) {
#ifdef VEC4
            let pv = sc4[jj >> 2u][jj & 3u];
#else
            let pv = sc[jj];
#endif
            l += pv;
            let vb = kbase[jj] + vofs;
            for (var k = 0u; k < DPT; k++) {
                let d = lid + k * WG;
                if (d < hd) {
                    acc[k] += pv * kv_at(vb + d);
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    // The only split of the only round: this is the row's output (what `merge` would write).
    let only = table[p.table_base + 1u] == 3u && table[p.table_base + 2u] == 1u;
    for (var k = 0u; k < DPT; k++) {
        let d = lid + k * WG;
        if (d < hd) {
            part[pb + d] = acc[k];
            if (only) {
                o[t * p.o_stride + h * hd + d] = acc[k] / l;
            }
        }
    }
    if (lid == 0u) {
        part[pb + hd] = m;
        part[pb + hd + 1u] = l;
    }
}
#endif

#ifdef LANES
// Where the head dim is not a multiple of 8 (else attention_tiled.wgsl's `main_group` runs):
// one subgroup of 8 lanes per (head, row, split), no workgroup memory or barriers (CPU
// rasterizers run a subgroup as one SIMD row, and barriers cost them more than the work): lane
// i takes keys k0 + i, k0 + i + 8, ... with its own online softmax over its keys and its own
// accumulator; the lanes' states are folded with subgroup operations at the end and written in
// the partial format `merge` reads. HD4 = head_dim / 4 (VEC4 only).
@compute @workgroup_size(8)
fn main_lanes(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    let z = wid.z;
    if (t >= step.n_tokens || z >= table[p.table_base + 2u]) {
        return;
    }
    let hd = p.head_dim;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let row = rows[t];
    let sb = p.table_base + 4u + row.x * p.seq_stride;
    let key_base = table[sb + 2u];
    let scan = min(table[sb + 1u], select(0u, row.y + 1u - key_base, row.y + 1u > key_base));
    let split = table[p.table_base] + z;
    let k0 = min(split * SPLIT, scan);
    let k1 = min(k0 + SPLIT, scan);
    let pb = ((z * step.n_tokens + t) * p.n_heads + h) * (hd + 2u);
    let qb4 = (t * p.q_stride + h * hd) >> 2u;
    var qv: array<vec4<f32>, HD4>;
    for (var d4 = 0u; d4 < HD4; d4++) {
        qv[d4] = q4[qb4 + d4];
    }
    var m = -1.0e30;
    var l = 0.0;
    var acc: array<vec4<f32>, HD4>;
    let vofs = p.page_tokens * p.kv_dim;
    for (var j = k0 + lane; j < k1; j += 8u) {
        let e = sb + 4u + 2u * (j / p.page_tokens);
        let slot = table[e + 1u];
        let kb = (((slot & ~STREAM) * p.page_elems + (j % p.page_tokens) * p.kv_dim
            + kvh * hd)) | (slot & STREAM);
        var valid = true;
#ifdef SWA
        let kpos = table[e] * p.page_tokens + j % p.page_tokens;
        valid = row.y < kpos || row.y - kpos < p.window;
#endif
        if (valid) {
            var dotv = 0.0;
            for (var d4 = 0u; d4 < HD4; d4++) {
                dotv += dot(qv[d4], kv4_at(kb + 4u * d4));
            }
            var s = dotv * p.scale;
#ifdef SOFTCAP
            s = p.softcap * tanh_s(s / p.softcap);
#endif
            let m_new = max(m, s);
            let alpha = exp(m - m_new);
            let pj = exp(s - m_new);
            l = l * alpha + pj;
            let vb = kb + vofs;
            for (var d4 = 0u; d4 < HD4; d4++) {
                acc[d4] = acc[d4] * alpha + pj * kv4_at(vb + 4u * d4);
            }
            m = m_new;
        }
    }
    // Fold the lanes: rescale each to the common maximum, then sum.
    let mx = subgroupMax(m);
    let sc = select(0.0, exp(m - mx), l > 0.0);
    let lsum = subgroupAdd(l * sc);
    let only = table[p.table_base + 1u] == 3u && table[p.table_base + 2u] == 1u;
    for (var d4 = 0u; d4 < HD4; d4++) {
        let a = subgroupAdd(acc[d4] * sc);
        if (lane == 0u) {
            let d = 4u * d4;
            part[pb + d] = a.x;
            part[pb + d + 1u] = a.y;
            part[pb + d + 2u] = a.z;
            part[pb + d + 3u] = a.w;
            if (only) {
                let ob = t * p.o_stride + h * hd + d;
                o[ob] = a.x / lsum;
                o[ob + 1u] = a.y / lsum;
                o[ob + 2u] = a.z / lsum;
                o[ob + 3u] = a.w / lsum;
            }
        }
    }
    if (lane == 0u) {
        part[pb + hd] = mx;
        part[pb + hd + 1u] = lsum;
    }
}
#endif

#ifdef MERGE
// Fold this round's partials of (head, row) into the running state, in split order; after the
// last round write acc / l.
@compute @workgroup_size(WG)
fn merge(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let h = wid.x;
    let t = wid.y;
    if (t >= step.n_tokens) {
        return;
    }
    let hd = p.head_dim;
    let flags = table[p.table_base + 1u];
    let n = table[p.table_base + 2u];
    let rb = (t * p.n_heads + h) * (hd + 2u);
    var m = -1.0e30;
    var l = 0.0;
    var acc: array<f32, DPT>;
    if ((flags & 1u) == 0u) {
        m = run[rb + hd];
        l = run[rb + hd + 1u];
        for (var k = 0u; k < DPT; k++) {
            let d = lid + k * WG;
            if (d < hd) {
                acc[k] = run[rb + d];
            }
        }
    }
    for (var z = 0u; z < n; z++) {
        let pb = ((z * step.n_tokens + t) * p.n_heads + h) * (hd + 2u);
        let pl = part[pb + hd + 1u];
        if (pl == 0.0) {
            continue;
        }
        let pm = part[pb + hd];
        if (l == 0.0) {
            m = pm;
            l = pl;
            for (var k = 0u; k < DPT; k++) {
                let d = lid + k * WG;
                if (d < hd) {
                    acc[k] = part[pb + d];
                }
            }
            continue;
        }
        let m_new = max(m, pm);
        let a = exp(m - m_new);
        let b = exp(pm - m_new);
        l = l * a + pl * b;
        for (var k = 0u; k < DPT; k++) {
            let d = lid + k * WG;
            if (d < hd) {
                acc[k] = acc[k] * a + part[pb + d] * b;
            }
        }
        m = m_new;
    }
    // Every thread has read the running state before any is overwritten.
    workgroupBarrier();
    if ((flags & 2u) != 0u) {
        for (var k = 0u; k < DPT; k++) {
            let d = lid + k * WG;
            if (d < hd) {
                o[t * p.o_stride + h * hd + d] = acc[k] / l;
            }
        }
        return;
    }
    for (var k = 0u; k < DPT; k++) {
        let d = lid + k * WG;
        if (d < hd) {
            run[rb + d] = acc[k];
        }
    }
    if (lid == 0u) {
        run[rb + hd] = m;
        run[rb + hd + 1u] = l;
    }
}
#endif
