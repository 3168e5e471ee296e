//! Per-layer counts the plan sizes from: the row-wise dispatches of a layer's list, whether its
//! decode attention applies RoPE itself, the bytes of its vectors.

use super::{PlanOptions, round16};
use crate::kernels;
use crate::model::config::ModelConfig;

/// Whether a layer's decode attention applies RoPE and stores the new key and value itself: on
/// a device that can, for head dims its kernel takes, in layers that do not select pages (their
/// page summaries read the stored keys before attention).
pub(super) fn fuses_rope(o: &PlanOptions, cfg: &ModelConfig, selects: bool) -> bool {
    o.fuse_rope && kernels::attention_tiles(cfg.head_dim as u32) && !selects
}

/// Row-wise dispatches (RMSNorm, bias, per-head norms) of one layer's forward list.
pub fn row_dispatches(cfg: &ModelConfig) -> u64 {
    // Two RMSNorms; biases, per-head norms and post norms where the architecture has them.
    2 + if cfg.has_qkv_bias { 3 } else { 0 }
        + if cfg.qk_norm { 2 } else { 0 }
        + if cfg.post_norms { 2 } else { 0 }
}

/// Device bytes of one layer's vectors: norms, biases, q/k norms.
pub fn layer_vector_bytes(cfg: &ModelConfig) -> u64 {
    let f = |n: usize| round16((n * 4) as u64);
    2 * f(cfg.n_embd)
        + if cfg.has_qkv_bias {
            f(cfg.q_dim()) + 2 * f(cfg.kv_dim())
        } else {
            0
        }
        + if cfg.qk_norm { 2 * f(cfg.head_dim) } else { 0 }
        + if cfg.post_norms { 2 * f(cfg.n_embd) } else { 0 }
}
