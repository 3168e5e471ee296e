// Prefill attention over the paged KV cache (see attention.wgsl for the page pools, the page
// table and the partial format), with the rows of a batch tiled: one workgroup of TILE lanes
// per (head, tile of TILE consecutive rows, split of this round); lane i takes row
// tile * TILE + i.
//
// The rows belong to one sequence in position order (the host uses this kernel only for
// batches of one sequence), so the tile's keys are those its last row scans. They are read in
// order at addresses every lane shares, a K or V row in HD8 loads of 8 values (a CPU rasterizer
// turns a lane's load into scalar loads, so fewer and wider loads are what counts; a GPU
// broadcasts shared addresses from cache). Each lane scores the keys against its own query,
// masks those past its own position (or outside its window) and keeps its own online softmax,
// rescaled once per chunk of CH keys. Chunks are aligned to the split start, never to pages,
// so the sums are the same for any page size and any mix of home and streamed pages. A row's
// keys and partials are those of attention.wgsl's `main`: split z covers
// [split * SPLIT, min(split * SPLIT + SPLIT, scan)) of the row's own scan, and the results
// differ from `main`'s only by rounding.
//
// With GROUP (`main_group`, decode on CPU rasterizers, which run a subgroup of 8 lanes as one
// SIMD row) the lanes split the head dim instead: one subgroup per (KV head and block of GB of
// its G query heads, row, split); lane i takes dims [8b, 8b + 8) for the blocks b = i, i + 8,
// ... (NB of them), so a K or V row is read once, in one load per lane, for all the block's
// heads. Each head's score is the subgroup sum of the lanes' partial dot products; chunks,
// masking and rescaling are those of `main_tiled`.
//
// With LANES (CPU rasterizers with 8-wide subgroups; TILE = 8, one subgroup) the tile's lanes
// load each K and V row between them, lane i blocks i, i + 8, ... of 8 values (NB of them),
// and subgroup broadcasts hand every block to every lane: the driver turns each lane's load
// into scalar loads even where all lanes read the same address, so a shared row read by every
// lane cost a load per block per lane (prefill attention spent most of its time in them).
//
// ROPE (with GROUP; a batch of one row, at decode): the kernel also does what rope_store.wgsl
// does before it, so that dispatch is left out. Q is read unrotated and rotated as it is
// loaded; the row's own key and value are taken from the new rows `ks` and `vs` (K rotated,
// both rounded as the pool stores them), wherever the key loop meets the home element the row
// table gives for them (rows[t].z), so no subgroup reads them from the pool; and the first
// round's first split of each KV head (first block of its query heads) writes them there.
// Every read of that element is served from `ks` / `vs`, so the write races with none. The
// arithmetic is rope_store's, and the results are the same bits. ROPE_DIM: the rotated dims of
// a head; NEOX: rotate (i, i + ROPE_DIM / 2), else (2i, 2i + 1).
//
// Defines: HD8 = head_dim / 8; TILE (without GROUP); GROUP with G (query heads per KV head), GB and NB =
// ceil(HD8 / 8); LANES with NB (without GROUP); KV_F16 (pools of f16 pairs packed in u32 words,
// else f32); SOFTCAP; SWA.

#include "attention_params"

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> table: array<u32>;
@group(0) @binding(4) var<storage, read> q4: array<vec4<f32>>;
// ROPE writes the row's own key and value into the home pool.
#ifdef KV_F16
#ifdef ROPE
@group(0) @binding(5) var<storage, read_write> home: array<vec4<u32>>;
#else
@group(0) @binding(5) var<storage, read> home: array<vec4<u32>>;
#endif
@group(0) @binding(6) var<storage, read> strm: array<vec4<u32>>;
#else
#ifdef ROPE
@group(0) @binding(5) var<storage, read_write> home: array<vec4<f32>>;
#else
@group(0) @binding(5) var<storage, read> home: array<vec4<f32>>;
#endif
@group(0) @binding(6) var<storage, read> strm: array<vec4<f32>>;
#endif
#ifdef ROPE
@group(0) @binding(9) var<storage, read> cs: array<f32>;
@group(0) @binding(10) var<storage, read> ks: array<f32>;
@group(0) @binding(11) var<storage, read> vs: array<f32>;
#endif
@group(0) @binding(7) var<storage, read_write> part: array<f32>;
@group(0) @binding(8) var<storage, read_write> o: array<f32>;

const SPLIT: u32 = 512u;
const STREAM: u32 = 0x80000000u;
const CH: u32 = 8u;

// tanh that cannot overflow.
fn tanh_s(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - e) / (1.0 + e);
}

// The 8 values at element `e` (a multiple of 8; bit 31 selects the stream pool) as two vec4s.
fn kv8_at(e: u32) -> array<vec4<f32>, 2> {
    let i = e & ~STREAM;
#ifdef KV_F16
    var w: vec4<u32>;
    if ((e & STREAM) != 0u) {
        w = strm[i >> 3u];
    } else {
        w = home[i >> 3u];
    }
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
#else
    let a = i >> 2u;
    if ((e & STREAM) != 0u) {
        return array<vec4<f32>, 2>(strm[a], strm[a + 1u]);
    }
    return array<vec4<f32>, 2>(home[a], home[a + 1u]);
#endif
}

#ifdef LANES
// The stored words of the 8 values at element `e` (a multiple of 8; bit 31 selects the pool).
#ifdef KV_F16
alias Raw8 = vec4<u32>;
#else
alias Raw8 = array<vec4<f32>, 2>;
#endif

fn raw8_at(e: u32) -> Raw8 {
    let i = e & ~STREAM;
#ifdef KV_F16
    if ((e & STREAM) != 0u) {
        return strm[i >> 3u];
    }
    return home[i >> 3u];
#else
    return kv8_at(e);
#endif
}

fn unpack8(w: Raw8) -> array<vec4<f32>, 2> {
#ifdef KV_F16
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
#else
    return w;
#endif
}


// Blocks [8n, 8n + 8) of 8 values of the K or V row at element `e`: each lane of the subgroup
// loads one block and the lanes hand them round. A CPU rasterizer turns each lane's load into
// scalar loads even where every lane reads the same address, so a row costs one load a lane
// instead of one a block a lane.
fn row_blocks(e: u32, n: u32, lane: u32) -> array<Raw8, 8> {
    let w = raw8_at(e + 8u * min(8u * n + lane, HD8 - 1u));
#ifdef KV_F16
    return array<Raw8, 8>(
        subgroupBroadcast(w, 0u), subgroupBroadcast(w, 1u), subgroupBroadcast(w, 2u),
        subgroupBroadcast(w, 3u), subgroupBroadcast(w, 4u), subgroupBroadcast(w, 5u),
        subgroupBroadcast(w, 6u), subgroupBroadcast(w, 7u)
    );
#else
    var out: array<Raw8, 8>;
    out[0] = Raw8(subgroupBroadcast(w[0], 0u), subgroupBroadcast(w[1], 0u));
    out[1] = Raw8(subgroupBroadcast(w[0], 1u), subgroupBroadcast(w[1], 1u));
    out[2] = Raw8(subgroupBroadcast(w[0], 2u), subgroupBroadcast(w[1], 2u));
    out[3] = Raw8(subgroupBroadcast(w[0], 3u), subgroupBroadcast(w[1], 3u));
    out[4] = Raw8(subgroupBroadcast(w[0], 4u), subgroupBroadcast(w[1], 4u));
    out[5] = Raw8(subgroupBroadcast(w[0], 5u), subgroupBroadcast(w[1], 5u));
    out[6] = Raw8(subgroupBroadcast(w[0], 6u), subgroupBroadcast(w[1], 6u));
    out[7] = Raw8(subgroupBroadcast(w[0], 7u), subgroupBroadcast(w[1], 7u));
    return out;
#endif
}
#endif

// The K base (element index with the pool bit) of KV head `kvh` in the page of list entry `e`.
fn page_base(e: u32, kvh: u32) -> u32 {
    let slot = table[e + 1u];
    return ((slot & ~STREAM) * p.page_elems + kvh * p.head_dim) | (slot & STREAM);
}

// A key cursor over a page list: the word of its list entry, its row in that page, the page's
// K base for one KV head and the page's first position.
struct Cursor {
    e: u32,
    r: u32,
    base: u32,
    pos: u32,
}

// The cursor at list key `key` of the list whose sequence record starts at word `sb`.
fn cursor_at(sb: u32, key: u32, kvh: u32) -> Cursor {
    let pe = key / p.page_tokens;
    let e = sb + 4u + 2u * pe;
    return Cursor(e, key - pe * p.page_tokens, page_base(e, kvh), table[e] * p.page_tokens);
}

// Steps to the next key; the next page's entry is read only when `more` keys follow.
fn cursor_next(c: ptr<function, Cursor>, kvh: u32, more: bool) {
    (*c).r += 1u;
    if ((*c).r == p.page_tokens && more) {
        (*c).r = 0u;
        (*c).e += 2u;
        (*c).base = page_base((*c).e, kvh);
        (*c).pos = table[(*c).e] * p.page_tokens;
    }
}

// Dims [d, d + 4) of a partial at word `pb` and, when `only` (the only split of the only
// round), of the output at word `ob`: acc / l.
fn put4(pb: u32, ob: u32, d: u32, a: vec4<f32>, l: f32, only: bool) {
    part[pb + d] = a.x;
    part[pb + d + 1u] = a.y;
    part[pb + d + 2u] = a.z;
    part[pb + d + 3u] = a.w;
    if (only) {
        o[ob + d] = a.x / l;
        o[ob + d + 1u] = a.y / l;
        o[ob + d + 2u] = a.z / l;
        o[ob + d + 3u] = a.w / l;
    }
}

#ifdef ROPE
// Element i of the unrotated rows: 0 the queries, 1 the new keys, 2 the new values.
fn src_at(which: u32, i: u32) -> f32 {
    if (which == 0u) {
        return q4[i >> 2u][i & 3u];
    }
    if (which == 1u) {
        return ks[i];
    }
    return vs[i];
}

// Dims [d0, d0 + 8) of the head at element `hb` of rows `which`, rotated for batch row t (as
// rope_store.wgsl rotates them; `which` 2, the values, are not rotated).
fn rope8(which: u32, hb: u32, d0: u32, t: u32) -> array<vec4<f32>, 2> {
    let half = ROPE_DIM / 2u;
    var r: array<f32, 8>;
    for (var e = 0u; e < 8u; e++) {
        let i = d0 + e;
        let x = src_at(which, hb + i);
        if (which == 2u || i >= ROPE_DIM) {
            r[e] = x;
            continue;
        }
#ifdef NEOX
        let first = i < half;
        let j = select(i - half, i, first);
        let partner = select(i - half, i + half, first);
#else
        let first = (i & 1u) == 0u;
        let j = i / 2u;
        let partner = select(i - 1u, i + 1u, first);
#endif
        let xp = src_at(which, hb + partner);
        let c = cs[(t * half + j) * 2u];
        let sn = cs[(t * half + j) * 2u + 1u];
        if (first) {
            r[e] = x * c - xp * sn;
        } else {
            r[e] = xp * sn + x * c;
        }
    }
    return array<vec4<f32>, 2>(vec4<f32>(r[0], r[1], r[2], r[3]), vec4<f32>(r[4], r[5], r[6], r[7]));
}

// Eight values as the pool holds them, and back (KV_F16: rounded to f16).
#ifdef KV_F16
fn packed8(v: array<vec4<f32>, 2>) -> vec4<u32> {
    return vec4<u32>(
        pack2x16float(v[0].xy), pack2x16float(v[0].zw), pack2x16float(v[1].xy), pack2x16float(v[1].zw)
    );
}

fn as_stored(v: array<vec4<f32>, 2>) -> array<vec4<f32>, 2> {
    let w = packed8(v);
    return array<vec4<f32>, 2>(
        vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)),
        vec4<f32>(unpack2x16float(w.z), unpack2x16float(w.w)),
    );
}

// Store 8 values at home element e (a multiple of 8).
fn put8(e: u32, v: array<vec4<f32>, 2>) {
    home[e >> 3u] = packed8(v);
}
#else
fn as_stored(v: array<vec4<f32>, 2>) -> array<vec4<f32>, 2> {
    return v;
}

fn put8(e: u32, v: array<vec4<f32>, 2>) {
    home[e >> 2u] = v[0];
    home[(e >> 2u) + 1u] = v[1];
}
#endif
#endif

#ifdef GROUP
@compute @workgroup_size(8)
fn main_group(@builtin(subgroup_invocation_id) lane: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let t = wid.y;
    let z = wid.z;
    if (t >= step.n_tokens || z >= table[p.table_base + 2u]) {
        return;
    }
    let blocks = (G + GB - 1u) / GB;
    let kvh = wid.x / blocks;
    let g0 = (wid.x % blocks) * GB;
    let hd = p.head_dim;
    let row = rows[t];
    let sb = p.table_base + 4u + row.x * p.seq_stride;
    let kbase = table[sb + 2u];
    let scan = min(table[sb + 1u], select(0u, row.y + 1u - kbase, row.y + 1u > kbase));
    let lo = min((table[p.table_base] + z) * SPLIT, scan);
    let hi = min(lo + SPLIT, scan);
    // This lane's query slices: 8 dims (two vec4s) of each of its blocks, for each head.
    var qv: array<array<vec4<f32>, 2 * NB>, GB>;
    for (var gi = 0u; gi < GB; gi++) {
        let h = kvh * G + min(g0 + gi, G - 1u);
        let qb4 = (t * p.q_stride + h * hd) >> 2u;
        for (var k = 0u; k < NB; k++) {
            let b = lane + 8u * k;
            if (b < HD8) {
#ifdef ROPE
                let r = rope8(0u, t * p.q_stride + h * hd, 8u * b, t);
                qv[gi][2u * k] = r[0];
                qv[gi][2u * k + 1u] = r[1];
#else
                qv[gi][2u * k] = q4[qb4 + 2u * b];
                qv[gi][2u * k + 1u] = q4[qb4 + 2u * b + 1u];
#endif
            }
        }
    }
#ifdef ROPE
    // The row's own key and value: this lane's blocks, as the pool will hold them; stored by
    // one subgroup per KV head.
    let own = row.z + kvh * hd;
    let nb = t * p.kv_dim + kvh * hd;
    var nk: array<array<vec4<f32>, 2>, NB>;
    var nv: array<array<vec4<f32>, 2>, NB>;
    let store = (table[p.table_base + 1u] & 1u) != 0u && z == 0u && g0 == 0u;
    for (var k = 0u; k < NB; k++) {
        let b = lane + 8u * k;
        if (b < HD8) {
            nk[k] = as_stored(rope8(1u, nb, 8u * b, t));
            nv[k] = as_stored(rope8(2u, nb, 8u * b, t));
            if (store) {
                put8(own + 8u * b, nk[k]);
                put8(own + p.page_tokens * p.kv_dim + 8u * b, nv[k]);
            }
        }
    }
#endif
    var m: array<f32, GB>;
    var l: array<f32, GB>;
    for (var gi = 0u; gi < GB; gi++) {
        m[gi] = -1.0e30;
    }
    var acc: array<array<vec4<f32>, 2 * NB>, GB>;
    let vofs = p.page_tokens * p.kv_dim;
    var cur = cursor_at(sb, lo, kvh);
    for (var c0 = lo; c0 < hi; c0 += CH) {
        let cn = min(CH, hi - c0);
        var sv: array<array<f32, GB>, CH>;
        var kbs: array<u32, CH>;
        var valid = 0u;
        var cmax = m;
        for (var i = 0u; i < CH; i++) {
            if (i < cn) {
                let jj = c0 + i;
                let kb = cur.base + cur.r * p.kv_dim;
                kbs[i] = kb;
                var part_dot: array<f32, GB>;
                for (var k = 0u; k < NB; k++) {
                    let b = lane + 8u * k;
                    if (b < HD8) {
#ifdef ROPE
                        var kk = kv8_at(kb + 8u * b);
                        if (kb == own) {
                            kk = nk[k];
                        }
#else
                        let kk = kv8_at(kb + 8u * b);
#endif
                        for (var gi = 0u; gi < GB; gi++) {
                            part_dot[gi] += dot(qv[gi][2u * k], kk[0])
                                + dot(qv[gi][2u * k + 1u], kk[1]);
                        }
                    }
                }
                var ok = true;
#ifdef SWA
                let kpos = cur.pos + cur.r;
                ok = row.y < kpos || row.y - kpos < p.window;
#endif
                if (ok) {
                    valid |= 1u << i;
                }
                for (var gi = 0u; gi < GB; gi++) {
                    var s = subgroupAdd(part_dot[gi]) * p.scale;
#ifdef SOFTCAP
                    s = p.softcap * tanh_s(s / p.softcap);
#endif
                    sv[i][gi] = s;
                    if (ok) {
                        cmax[gi] = max(cmax[gi], s);
                    }
                }
                cursor_next(&cur, kvh, jj + 1u < hi);
            }
        }
        for (var gi = 0u; gi < GB; gi++) {
            let alpha = exp(m[gi] - cmax[gi]);
            l[gi] *= alpha;
            for (var d4 = 0u; d4 < 2u * NB; d4++) {
                acc[gi][d4] *= alpha;
            }
        }
        for (var i = 0u; i < CH; i++) {
            if (i < cn) {
                let ok = (valid & (1u << i)) != 0u;
                var pj: array<f32, GB>;
                for (var gi = 0u; gi < GB; gi++) {
                    pj[gi] = select(0.0, exp(sv[i][gi] - cmax[gi]), ok);
                    l[gi] += pj[gi];
                }
                let vb = kbs[i] + vofs;
                for (var k = 0u; k < NB; k++) {
                    let b = lane + 8u * k;
                    if (b < HD8) {
#ifdef ROPE
                        var v = kv8_at(vb + 8u * b);
                        if (kbs[i] == own) {
                            v = nv[k];
                        }
#else
                        let v = kv8_at(vb + 8u * b);
#endif
                        for (var gi = 0u; gi < GB; gi++) {
                            acc[gi][2u * k] += pj[gi] * v[0];
                            acc[gi][2u * k + 1u] += pj[gi] * v[1];
                        }
                    }
                }
            }
        }
        m = cmax;
    }
    let only = table[p.table_base + 1u] == 3u && table[p.table_base + 2u] == 1u;
    for (var gi = 0u; gi < GB; gi++) {
        if (g0 + gi >= G) {
            break;
        }
        let h = kvh * G + g0 + gi;
        let pb = ((z * step.n_tokens + t) * p.n_heads + h) * (hd + 2u);
        for (var k = 0u; k < NB; k++) {
            let b = lane + 8u * k;
            if (b < HD8) {
                let ob = t * p.o_stride + h * hd;
                put4(pb, ob, 8u * b, acc[gi][2u * k], l[gi], only);
                put4(pb, ob, 8u * b + 4u, acc[gi][2u * k + 1u], l[gi], only);
            }
        }
        if (lane == 0u) {
            part[pb + hd] = m[gi];
            part[pb + hd + 1u] = l[gi];
        }
    }
}
#else
@compute @workgroup_size(TILE)
fn main_tiled(
    @builtin(local_invocation_index) lane: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
#ifdef LANES
    @builtin(subgroup_invocation_id) sl: u32,
#endif
) {
    let n = step.n_tokens;
    let t0 = wid.y * TILE;
    let z = wid.z;
    if (t0 >= n || z >= table[p.table_base + 2u]) {
        return;
    }
    let h = wid.x;
    let hd = p.head_dim;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let sb = p.table_base + 4u + rows[t0].x * p.seq_stride;
    let list_keys = table[sb + 1u];
    let kbase = table[sb + 2u];
    let lo = (table[p.table_base] + z) * SPLIT;
    let last = rows[min(t0 + TILE, n) - 1u];
    let hi = min(lo + SPLIT, min(list_keys, select(0u, last.y + 1u - kbase, last.y + 1u > kbase)));
    let live = t0 + lane < n;
    let t = min(t0 + lane, n - 1u);
    let row = rows[t];
    let scan = min(list_keys, select(0u, row.y + 1u - kbase, row.y + 1u > kbase));
    let k1 = min(lo + SPLIT, scan);
    let qb4 = (t * p.q_stride + h * hd) >> 2u;
    var qv: array<vec4<f32>, 2 * HD8>;
    for (var d4 = 0u; d4 < 2u * HD8; d4++) {
        qv[d4] = q4[qb4 + d4];
    }
    var m = -1.0e30;
    var l = 0.0;
    var acc: array<vec4<f32>, 2 * HD8>;
    let vofs = p.page_tokens * p.kv_dim;
    var cur = cursor_at(sb, lo, kvh);
    for (var c0 = lo; c0 < hi; c0 += CH) {
        let cn = min(CH, hi - c0);
        var sv: array<f32, CH>;
        var kbs: array<u32, CH>;
        var valid = 0u;
        var cmax = m;
        for (var i = 0u; i < CH; i++) {
            if (i < cn) {
                let jj = c0 + i;
                let kb = cur.base + cur.r * p.kv_dim;
                kbs[i] = kb;
                var dotv = 0.0;
#ifdef LANES
                for (var n = 0u; n < NB; n++) {
                    let blk = row_blocks(kb, n, sl);
                    for (var j = 0u; j < 8u; j++) {
                        let d8 = 8u * n + j;
                        if (d8 < HD8) {
                            let k = unpack8(blk[j]);
                            dotv += dot(qv[2u * d8], k[0]) + dot(qv[2u * d8 + 1u], k[1]);
                        }
                    }
                }
#else
                for (var d8 = 0u; d8 < HD8; d8++) {
                    let k = kv8_at(kb + 8u * d8);
                    dotv += dot(qv[2u * d8], k[0]) + dot(qv[2u * d8 + 1u], k[1]);
                }
#endif
                var s = dotv * p.scale;
#ifdef SOFTCAP
                s = p.softcap * tanh_s(s / p.softcap);
#endif
                var ok = jj < k1;
#ifdef SWA
                let kpos = cur.pos + cur.r;
                ok = ok && (row.y < kpos || row.y - kpos < p.window);
#endif
                sv[i] = s;
                if (ok) {
                    valid |= 1u << i;
                    cmax = max(cmax, s);
                }
                cursor_next(&cur, kvh, jj + 1u < hi);
            }
        }
        let alpha = exp(m - cmax);
        l *= alpha;
        for (var d4 = 0u; d4 < 2u * HD8; d4++) {
            acc[d4] *= alpha;
        }
        for (var i = 0u; i < CH; i++) {
            if (i < cn) {
                let ok = (valid & (1u << i)) != 0u;
                let pj = select(0.0, exp(sv[i] - cmax), ok);
                l += pj;
                let vb = kbs[i] + vofs;
#ifdef LANES
                for (var n = 0u; n < NB; n++) {
                    let blk = row_blocks(vb, n, sl);
                    for (var j = 0u; j < 8u; j++) {
                        let d8 = 8u * n + j;
                        if (d8 < HD8) {
                            let v = unpack8(blk[j]);
                            acc[2u * d8] += select(vec4<f32>(0.0), pj * v[0], ok);
                            acc[2u * d8 + 1u] += select(vec4<f32>(0.0), pj * v[1], ok);
                        }
                    }
                }
#else
                for (var d8 = 0u; d8 < HD8; d8++) {
                    let v = kv8_at(vb + 8u * d8);
                    acc[2u * d8] += select(vec4<f32>(0.0), pj * v[0], ok);
                    acc[2u * d8 + 1u] += select(vec4<f32>(0.0), pj * v[1], ok);
                }
#endif
            }
        }
        m = cmax;
    }
    if (!live) {
        return;
    }
    let pb = ((z * step.n_tokens + t) * p.n_heads + h) * (hd + 2u);
    let only = table[p.table_base + 1u] == 3u && table[p.table_base + 2u] == 1u;
    for (var d4 = 0u; d4 < 2u * HD8; d4++) {
        put4(pb, t * p.o_stride + h * hd, 4u * d4, acc[d4], l, only);
    }
    part[pb + hd] = m;
    part[pb + hd + 1u] = l;
}
#endif
