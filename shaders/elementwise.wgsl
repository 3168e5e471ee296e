// Element-wise kernels over T rows of n values.
// add_bias: Y[t, i] += B[i] (rows may start at the batch's cache position when at_pos is set).

struct Params {
    n: u32,
    stride: u32,
    offset: u32,
    at_pos: u32,
    n_tokens: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn add_bias(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let i = gid.x;
    let t = gid.y;
    if (i >= p.n || t >= n_tok) {
        return;
    }
    var row = t;
    if (p.at_pos != 0u) {
        row += step.pos0;
    }
    let k = p.offset + row * p.stride + i;
    y[k] = y[k] + b[i];
}
