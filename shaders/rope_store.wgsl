// RoPE of the batch's queries (in place) and keys, and the store of the rotated keys and the
// values into the layer's home pool, in one dispatch.
//
// Thread g of token t: g < q_pairs rotates one pair of Q in place (as rope.wgsl); otherwise
// w = g - q_pairs is one unit of a KV row (KV_F16: a packed pair of elements, else one
// element): it rotates that part of row t of K (read from `ks`, which is left as it is) and
// writes it, and the same part of V, into the pool at the element the row table gives
// (rows[t].z), values P * kv_dim elements after the keys (as kv.wgsl's store). The cos/sin
// table holds, for each token t, the pairs (cos, sin) of its position times each frequency.
// NEOX rotates (i, i + rope_dim/2) of each head, else adjacent pairs (2i, 2i + 1); dims past
// rope_dim stay as they are.

struct Params {
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    neox: u32,
    kv_dim: u32,
    page_tokens: u32,
    q_pairs: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read_write> q: array<f32>;
@group(0) @binding(4) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> ks: array<f32>;
@group(0) @binding(6) var<storage, read> vs: array<f32>;
#ifdef KV_F16
@group(0) @binding(7) var<storage, read_write> pool: array<u32>;
#else
@group(0) @binding(7) var<storage, read_write> pool: array<f32>;
#endif

// Element e of row t of K (row base `base`), rotated.
fn rotated_k(t: u32, base: u32, e: u32) -> f32 {
    let i = e % p.head_dim;
    if (i >= p.rope_dim) {
        return ks[base + e];
    }
    let half = p.rope_dim / 2u;
    var j: u32;
    var first: bool;
    var partner: u32;
    if (p.neox != 0u) {
        first = i < half;
        j = select(i - half, i, first);
        partner = select(e - half, e + half, first);
    } else {
        first = (i & 1u) == 0u;
        j = i / 2u;
        partner = select(e - 1u, e + 1u, first);
    }
    let c = cs[(t * half + j) * 2u];
    let s = cs[(t * half + j) * 2u + 1u];
    if (first) {
        return ks[base + e] * c - ks[base + partner] * s;
    }
    return ks[base + partner] * s + ks[base + e] * c;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let g = gid.x;
    if (t >= step.n_tokens) {
        return;
    }
    let half = p.rope_dim / 2u;
    if (g < p.q_pairs) {
        let h = g / half;
        let i = g % half;
        let qb = t * p.n_heads * p.head_dim + h * p.head_dim;
        var a = qb + 2u * i;
        var b = a + 1u;
        if (p.neox != 0u) {
            a = qb + i;
            b = qb + i + half;
        }
        let c = cs[(t * half + i) * 2u];
        let s = cs[(t * half + i) * 2u + 1u];
        let x0 = q[a];
        let x1 = q[b];
        q[a] = x0 * c - x1 * s;
        q[b] = x0 * s + x1 * c;
        return;
    }
    let w = g - p.q_pairs;
    let base = t * p.kv_dim;
    let vofs = p.page_tokens * p.kv_dim;
#ifdef KV_F16
    if (w >= p.kv_dim / 2u) {
        return;
    }
    let e = rows[t].z / 2u + w;
    let k = vec2<f32>(rotated_k(t, base, 2u * w), rotated_k(t, base, 2u * w + 1u));
    pool[e] = pack2x16float(k);
    pool[e + vofs / 2u] = pack2x16float(vec2<f32>(vs[base + 2u * w], vs[base + 2u * w + 1u]));
#else
    if (w >= p.kv_dim) {
        return;
    }
    let e = rows[t].z + w;
    pool[e] = rotated_k(t, base, w);
    pool[e + vofs] = vs[base + w];
#endif
}
