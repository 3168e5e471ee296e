// The paged KV cache's small kernels.
//
// store: row t of the batch's keys and values (f32, T x kv_dim) goes into the layer's home
//   pool at the element the row table gives (rows[t].z: page slot * page elements + row in page *
//   kv_dim), values P * kv_dim elements after the keys. KV_F16 packs pairs with pack2x16float.
// page_meta (page selection): for each page that filled up in this pass (jobs: page, home slot,
//   rows), the per-channel minimum and maximum of its keys.
// score (page selection): for each page p below the count in the table header and each query
//   head h, an upper bound of q . k over the page's keys: sum over channels of
//   max(q * min, q * max), with q the last row's query.

struct Params {
    kv_dim: u32,
    page_tokens: u32,
    page_elems: u32,
    n_heads: u32,
    head_dim: u32,
    n_kv_heads: u32,
    table_base: u32,
    max_jobs: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

#ifdef STORE
@group(0) @binding(2) var<storage, read> rows: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> ks: array<f32>;
@group(0) @binding(4) var<storage, read> vs: array<f32>;
#ifdef KV_F16
@group(0) @binding(5) var<storage, read_write> pool: array<u32>;
#else
@group(0) @binding(5) var<storage, read_write> pool: array<f32>;
#endif

@compute @workgroup_size(64)
fn store(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.y;
    let vofs = p.page_tokens * p.kv_dim;
#ifdef KV_F16
    let j = gid.x;
    if (j >= p.kv_dim / 2u || t >= step.n_tokens) {
        return;
    }
    let e = rows[t].z / 2u + j;
    let s = t * p.kv_dim + 2u * j;
    pool[e] = pack2x16float(vec2<f32>(ks[s], ks[s + 1u]));
    pool[e + vofs / 2u] = pack2x16float(vec2<f32>(vs[s], vs[s + 1u]));
#else
    let j = gid.x;
    if (j >= p.kv_dim || t >= step.n_tokens) {
        return;
    }
    let e = rows[t].z + j;
    pool[e] = ks[t * p.kv_dim + j];
    pool[e + vofs] = vs[t * p.kv_dim + j];
#endif
}
#endif

#ifdef META
// jobs: [count, 0, 0, 0, then (page, slot, rows, 0) per job].
@group(0) @binding(2) var<storage, read> jobs: array<u32>;
#ifdef KV_F16
@group(0) @binding(3) var<storage, read> pool: array<u32>;
#else
@group(0) @binding(3) var<storage, read> pool: array<f32>;
#endif
@group(0) @binding(4) var<storage, read_write> pmeta: array<f32>;

fn key_at(i: u32) -> f32 {
#ifdef KV_F16
    return unpack2x16float(pool[i >> 1u])[i & 1u];
#else
    return pool[i];
#endif
}

@compute @workgroup_size(64)
fn page_meta(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let job = wid.x;
    if (job >= jobs[0] || step.n_tokens == 0u) {
        return;
    }
    let page = jobs[4u + 4u * job];
    let slot = jobs[5u + 4u * job];
    let n = jobs[6u + 4u * job];
    for (var c = lid; c < p.kv_dim; c += 64u) {
        var lo = 3.0e38;
        var hi = -3.0e38;
        for (var r = 0u; r < n; r++) {
            let k = key_at(slot * p.page_elems + r * p.kv_dim + c);
            lo = min(lo, k);
            hi = max(hi, k);
        }
        pmeta[(2u * page) * p.kv_dim + c] = lo;
        pmeta[(2u * page + 1u) * p.kv_dim + c] = hi;
    }
}
#endif

#ifdef SCORE
// VEC4 (head_dim a multiple of 4): q and the summaries read four channels a load; a CPU
// rasterizer gathers each lane's loads one by one, so this takes a quarter of the loads.
@group(0) @binding(2) var<storage, read> table: array<u32>;
#ifdef VEC4
@group(0) @binding(3) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> pmeta: array<vec4<f32>>;
#else
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> pmeta: array<f32>;
#endif
@group(0) @binding(5) var<storage, read_write> scores: array<f32>;

@compute @workgroup_size(64)
fn score(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n_pages = table[p.table_base + 3u];
    let page = gid.x / p.n_heads;
    let h = gid.x % p.n_heads;
    if (page >= n_pages || step.n_tokens == 0u) {
        return;
    }
    let hd = p.head_dim;
    let kvh = h / (p.n_heads / p.n_kv_heads);
#ifdef VEC4
    let qb = h * hd / 4u;
    let lo = ((2u * page) * p.kv_dim + kvh * hd) / 4u;
    let hi = lo + p.kv_dim / 4u;
    var s4 = vec4<f32>(0.0);
    for (var d = 0u; d < hd / 4u; d++) {
        let qd = q[qb + d];
        s4 += max(qd * pmeta[lo + d], qd * pmeta[hi + d]);
    }
    let s = (s4.x + s4.y) + (s4.z + s4.w);
#else
    let qb = h * hd;
    let lo = (2u * page) * p.kv_dim + kvh * hd;
    let hi = (2u * page + 1u) * p.kv_dim + kvh * hd;
    var s = 0.0;
    for (var d = 0u; d < hd; d++) {
        let qd = q[qb + d];
        s += max(qd * pmeta[lo + d], qd * pmeta[hi + d]);
    }
#endif
    scores[page * p.n_heads + h] = s;
}
#endif
