// Causal grouped-query attention over the KV cache. One workgroup per (head, token): the query
// token t sits at position pos0 + t and sees keys [0, pos0 + t]. Keys are walked in chunks of WG
// with an online softmax (running max and sum), so no score buffer is needed.
// Defines: DPT = ceil(head_dim / WG) output dims per thread; VEC4 (head_dim and the strides
// multiples of 4): Q and K are read as vec4s and the chunk's scores sit four to a vector, which
// cuts the memory instructions of the score and max loops by four; KV_F16: the cache holds f16
// pairs packed in u32 words.

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    kv_stride: u32,
    o_stride: u32,
    scale: f32,
    n_tokens: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#ifdef VEC4
@group(0) @binding(2) var<storage, read> q4: array<vec4<f32>>;
#else
@group(0) @binding(2) var<storage, read> q: array<f32>;
#endif
#ifdef KV_F16
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;

// Element i of the cache (f16 pairs).
fn k_at(i: u32) -> f32 {
    return unpack2x16float(kc[i >> 1u])[i & 1u];
}
fn v_at(i: u32) -> f32 {
    return unpack2x16float(vc[i >> 1u])[i & 1u];
}
// Elements [4 i4, 4 i4 + 4).
fn k4_at(i4: u32) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(kc[2u * i4]), unpack2x16float(kc[2u * i4 + 1u]));
}
#else
#ifdef VEC4
@group(0) @binding(3) var<storage, read> kc4: array<vec4<f32>>;

fn k4_at(i4: u32) -> vec4<f32> {
    return kc4[i4];
}
#else
@group(0) @binding(3) var<storage, read> kc: array<f32>;

fn k_at(i: u32) -> f32 {
    return kc[i];
}
#endif
@group(0) @binding(4) var<storage, read> vc: array<f32>;

fn v_at(i: u32) -> f32 {
    return vc[i];
}
#endif
@group(0) @binding(5) var<storage, read_write> o: array<f32>;

const WG: u32 = 64u;
#ifdef VEC4
var<workgroup> qs4: array<vec4<f32>, DPT * WG / 4u>;
var<workgroup> sc4: array<vec4<f32>, WG / 4u>;
#else
var<workgroup> qs: array<f32, DPT * WG>;
var<workgroup> sc: array<f32, WG>;
#endif

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let h = wid.x;
    let t = wid.y;
    if (t >= n_tok) {
        return;
    }
    let hd = p.head_dim;
    let kvh = h / (p.n_heads / p.n_kv_heads);
    let n_keys = step.pos0 + t + 1u;
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
    let kvb = kvh * hd;
    for (var c0 = 0u; c0 < n_keys; c0 += WG) {
        let j = c0 + lid;
        var s = -1.0e30;
        if (j < n_keys) {
            var dotv = 0.0;
            let kb = j * p.kv_stride + kvb;
#ifdef VEC4
            for (var d4 = 0u; d4 < hd / 4u; d4++) {
                dotv += dot(qs4[d4], k4_at((kb >> 2u) + d4));
            }
#else
            for (var d = 0u; d < hd; d++) {
                dotv += qs[d] * k_at(kb + d);
            }
#endif
            s = dotv * p.scale;
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
        if (j < n_keys) {
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
        let cnt = min(WG, n_keys - c0);
        for (var jj = 0u; jj < cnt; jj++) {
#ifdef VEC4
            let pv = sc4[jj >> 2u][jj & 3u];
#else
            let pv = sc[jj];
#endif
            l += pv;
            let vb = (c0 + jj) * p.kv_stride + kvb;
            for (var k = 0u; k < DPT; k++) {
                let d = lid + k * WG;
                if (d < hd) {
                    acc[k] += pv * v_at(vb + d);
                }
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    for (var k = 0u; k < DPT; k++) {
        let d = lid + k * WG;
        if (d < hd) {
            o[t * p.o_stride + h * hd + d] = acc[k] / l;
        }
    }
}
