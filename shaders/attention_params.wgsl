// The parameters of the attention kernels (attention.wgsl, attention_tiled.wgsl).

struct Params {
    n_heads: u32,
    n_kv_heads: u32,
    head_dim: u32,
    q_stride: u32,
    kv_dim: u32,
    page_tokens: u32,
    page_elems: u32,
    table_base: u32,
    seq_stride: u32,
    round_splits: u32,
    o_stride: u32,
    scale: f32,
    softcap: f32,
    window: u32,
    _pad0: u32,
    _pad1: u32,
}
