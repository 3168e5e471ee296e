// Memory roofline: read every word of a buffer with as little arithmetic as possible (one XOR
// per load), so the time is the time to stream the bytes. One result per workgroup keeps the
// reads live. `empty`: a dispatch that does nothing (per-dispatch overhead).
//
// Defines: W64 (the device has 64-bit integers): each load is a vec4 of 64-bit words (32
// bytes) instead of 32-bit ones (16 bytes). On CPU rasterizers a load costs per lane and
// component whatever the component's width, so this streams faster there.

#ifdef W64
alias Unit = vec4<u64>;

fn fold(a: Unit) -> u32 {
    let b = a.x ^ a.y ^ a.z ^ a.w;
    return u32(b) ^ u32(b >> 32u);
}
#else
alias Unit = vec4<u32>;

fn fold(a: Unit) -> u32 {
    return a.x ^ a.y ^ a.z ^ a.w;
}
#endif

struct Params {
    // Loads (units) to stream.
    n4: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> src: array<Unit>;
@group(0) @binding(3) var<storage, read_write> dst: array<u32>;

const WG: u32 = 256u;
var<workgroup> red: array<u32, WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
) {
    var acc = Unit();
    let stride = nwg.x * WG;
    for (var i = wid.x * WG + lid; i < p.n4; i += stride) {
        acc ^= src[i];
    }
    red[lid] = fold(acc) ^ step.n_tokens;
    workgroupBarrier();
    if (lid == 0u) {
        var r = 0u;
        for (var k = 0u; k < WG; k++) {
            r ^= red[k];
        }
        dst[wid.x] = r;
    }
}

@compute @workgroup_size(1)
fn empty() {
    if (step.n_tokens == 0xffffffffu) {
        dst[0] = p.n4 + fold(src[0]);
    }
}
