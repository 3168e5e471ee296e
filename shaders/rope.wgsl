// Rotary position embedding, in place. The cos/sin table holds, for each token t of the batch,
// the pairs (cos, sin) of (pos0 + t) * base^(-2i / rope_dim), computed on the host.
// NORMAL rotates adjacent pairs (2i, 2i + 1) (GGUF llama layout); NEOX rotates (i, i + rope_dim/2).

struct Params {
    n_heads: u32,
    head_dim: u32,
    rope_dim: u32,
    stride: u32,
    offset: u32,
    at_pos: u32,
    neox: u32,
    n_tokens: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> cs: array<f32>;
@group(0) @binding(3) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n_tok = select(step.n_tokens, p.n_tokens, p.n_tokens != 0u);
    let half = p.rope_dim / 2u;
    let t = gid.y;
    if (gid.x >= p.n_heads * half || t >= n_tok) {
        return;
    }
    let h = gid.x / half;
    let i = gid.x % half;
    var row = t;
    if (p.at_pos != 0u) {
        row += step.pos0;
    }
    let base = p.offset + row * p.stride + h * p.head_dim;
    var a = base + 2u * i;
    var b = a + 1u;
    if (p.neox != 0u) {
        a = base + i;
        b = base + i + half;
    }
    let c = cs[(t * half + i) * 2u];
    let s = cs[(t * half + i) * 2u + 1u];
    let x0 = x[a];
    let x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}
