// Store a batch's keys or values into the half-precision KV cache: row t of the f32 source
// goes to cache row pos0 + t, two values per u32 (pack2x16float).

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read_write> cache: array<u32>;

@compute @workgroup_size(64)
fn store_f16(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_n = p.n / 2u;
    let j = gid.x;
    let t = gid.y;
    if (j >= half_n || t >= step.n_tokens) {
        return;
    }
    let a = src[t * p.n + 2u * j];
    let b = src[t * p.n + 2u * j + 1u];
    cache[(step.pos0 + t) * half_n + j] = pack2x16float(vec2<f32>(a, b));
}
