// RMSNorm: Y[t, i] = X[t, i] / sqrt(mean_i(X[t, i]^2) + eps) * W[i]. One workgroup per token and
// head: workgroup (t, h) normalizes the n values at X[x_offset + t * x_stride + h * n] (one head
// of a row when the grid's y is the head count, the whole row when it is 1).
//
// Defines: INPLACE (no X binding: normalize Y in place); ACC (add into Y: a residual add);
// LANES (CPU rasterizers with 8-wide subgroups): a workgroup is one subgroup of 8 lanes that
// sums with a subgroup operation instead of workgroup memory and barriers.

struct Params {
    n: u32,
    x_stride: u32,
    y_stride: u32,
    eps: f32,
    x_offset: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
#ifndef INPLACE
@group(0) @binding(2) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(3) var<storage, read> wt: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

#ifdef LANES
const WG: u32 = 8u;
#else
const WG: u32 = 64u;
var<workgroup> red: array<f32, WG>;
#endif

fn xv(i: u32) -> f32 {
#ifdef INPLACE
    return y[i];
#else
    return x[i];
#endif
}

@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let t = wid.x;
    if (t >= n_tok) {
        return;
    }
    let h = wid.y;
    let xb = p.x_offset + t * p.x_stride + h * p.n;
    var s = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = xv(xb + i);
        s += v * v;
    }
#ifdef LANES
    let total = subgroupAdd(s);
#else
    red[lid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let total = red[0];
#endif
    let inv = 1.0 / sqrt(total / f32(p.n) + p.eps);
    let yb = t * p.y_stride + h * p.n;
    for (var i = lid; i < p.n; i += WG) {
        let v = xv(xb + i) * inv * wt[i];
#ifdef ACC
        y[yb + i] += v;
#else
        y[yb + i] = v;
#endif
    }
}
