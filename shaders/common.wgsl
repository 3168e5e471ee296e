// Prepended to every shader: the per-forward values every kernel reads (binding 1).

struct Step {
    n_tokens: u32,
    pos0: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(1) var<uniform> step: Step;
