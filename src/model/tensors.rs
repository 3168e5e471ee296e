//! The tensors each architecture's forward pass reads, with their GGUF names and dimensions, and
//! the check that a file holds exactly those.

use super::config::Family;
use super::config::{ModelConfig, ModelError, OUTPUT, OUTPUT_NORM, TOKEN_EMBD, expect_tensor};

/// The tensor names of one transformer layer (not every architecture has every one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerNames {
    pub attn_norm: String,
    pub attn_q: String,
    pub attn_k: String,
    pub attn_v: String,
    /// Q, K and V in one matrix (Phi-3).
    pub attn_qkv: String,
    pub attn_q_bias: String,
    pub attn_k_bias: String,
    pub attn_v_bias: String,
    /// Per-head norms of Q and K (Qwen3, Gemma 3).
    pub attn_q_norm: String,
    pub attn_k_norm: String,
    pub attn_output: String,
    /// Norm of the attention output before the residual add (Gemma).
    pub post_attention_norm: String,
    pub ffn_norm: String,
    pub ffn_gate: String,
    pub ffn_up: String,
    pub ffn_down: String,
    /// Norm of the FFN output before the residual add (Gemma).
    pub post_ffw_norm: String,
}

impl LayerNames {
    /// Names for layer `layer` (`blk.{layer}.*`).
    pub fn new(layer: usize) -> Self {
        let n = |s: &str| format!("blk.{layer}.{s}");
        LayerNames {
            attn_norm: n("attn_norm.weight"),
            attn_q: n("attn_q.weight"),
            attn_k: n("attn_k.weight"),
            attn_v: n("attn_v.weight"),
            attn_qkv: n("attn_qkv.weight"),
            attn_q_bias: n("attn_q.bias"),
            attn_k_bias: n("attn_k.bias"),
            attn_v_bias: n("attn_v.bias"),
            attn_q_norm: n("attn_q_norm.weight"),
            attn_k_norm: n("attn_k_norm.weight"),
            attn_output: n("attn_output.weight"),
            post_attention_norm: n("post_attention_norm.weight"),
            ffn_norm: n("ffn_norm.weight"),
            ffn_gate: n("ffn_gate.weight"),
            ffn_up: n("ffn_up.weight"),
            ffn_down: n("ffn_down.weight"),
            post_ffw_norm: n("post_ffw_norm.weight"),
        }
    }
}

/// The tensor names of layer `layer`.
pub fn layer_names(layer: usize) -> LayerNames {
    LayerNames::new(layer)
}

/// What a weight matrix of a layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatrixRole {
    Q,
    K,
    V,
    /// Q, K and V rows in one matrix.
    Qkv,
    Output,
    Gate,
    Up,
    /// Gate rows then up rows in one matrix.
    GateUp,
    Down,
}

impl MatrixRole {
    /// The role's tensor name in layer `l`.
    pub fn name(self, n: &LayerNames) -> &str {
        match self {
            MatrixRole::Q => &n.attn_q,
            MatrixRole::K => &n.attn_k,
            MatrixRole::V => &n.attn_v,
            MatrixRole::Qkv => &n.attn_qkv,
            MatrixRole::Output => &n.attn_output,
            MatrixRole::Gate => &n.ffn_gate,
            MatrixRole::Up | MatrixRole::GateUp => &n.ffn_up,
            MatrixRole::Down => &n.ffn_down,
        }
    }
}

/// The weight matrices of every layer of `cfg`, in the order the plan and the engine keep them:
/// attention input projections, output projection, FFN input projections, down projection.
pub fn layer_matrices(cfg: &ModelConfig) -> Vec<MatrixRole> {
    use MatrixRole::*;
    let mut m = if cfg.fused_qkv {
        vec![Qkv]
    } else {
        vec![Q, K, V]
    };
    m.push(Output);
    if cfg.fused_gate_up {
        m.push(GateUp);
    } else {
        m.extend([Gate, Up]);
    }
    m.push(Down);
    m
}

/// GGUF dims (`[cols, rows]`) of a matrix role.
pub fn matrix_dims(cfg: &ModelConfig, role: MatrixRole) -> [usize; 2] {
    let (e, q, kv, ff) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.n_ff);
    match role {
        MatrixRole::Q => [e, q],
        MatrixRole::K | MatrixRole::V => [e, kv],
        MatrixRole::Qkv => [e, q + 2 * kv],
        MatrixRole::Output => [q, e],
        MatrixRole::Gate | MatrixRole::Up => [e, ff],
        MatrixRole::GateUp => [e, 2 * ff],
        MatrixRole::Down => [ff, e],
    }
}

/// Every tensor of layer `l` with its GGUF dims.
pub fn layer_tensors(cfg: &ModelConfig, l: usize) -> Vec<(String, Vec<usize>)> {
    let n = LayerNames::new(l);
    let (e, q, kv, hd) = (cfg.n_embd, cfg.q_dim(), cfg.kv_dim(), cfg.head_dim);
    let mut out: Vec<(String, Vec<usize>)> = vec![(n.attn_norm.clone(), vec![e])];
    for role in layer_matrices(cfg) {
        out.push((role.name(&n).to_string(), matrix_dims(cfg, role).to_vec()));
    }
    if cfg.has_qkv_bias {
        out.push((n.attn_q_bias.clone(), vec![q]));
        out.push((n.attn_k_bias.clone(), vec![kv]));
        out.push((n.attn_v_bias.clone(), vec![kv]));
    }
    if cfg.qk_norm {
        out.push((n.attn_q_norm.clone(), vec![hd]));
        out.push((n.attn_k_norm.clone(), vec![hd]));
    }
    out.push((n.ffn_norm.clone(), vec![e]));
    if cfg.post_norms {
        out.push((n.post_attention_norm.clone(), vec![e]));
        out.push((n.post_ffw_norm.clone(), vec![e]));
    }
    out
}

/// Check every tensor the forward pass reads, and that there are no others.
pub(crate) fn validate(cfg: &ModelConfig, g: &crate::gguf::GgufFile) -> Result<(), ModelError> {
    let e = cfg.n_embd;
    let mut known: Vec<String> = vec![TOKEN_EMBD.into(), OUTPUT_NORM.into()];
    expect_tensor(g, TOKEN_EMBD, &[e, cfg.vocab_size])?;
    expect_tensor(g, OUTPUT_NORM, &[e])?;
    if !cfg.tied_output {
        expect_tensor(g, OUTPUT, &[e, cfg.vocab_size])?;
        known.push(OUTPUT.into());
    }
    // Frequency factor tensors were read (and checked) with the RoPE config.
    let factor_names: &[&str] = match cfg.family {
        Family::Llama => &["rope_freqs.weight"],
        Family::Phi3 => &["rope_factors_long.weight", "rope_factors_short.weight"],
        _ => &[],
    };
    for name in factor_names {
        if g.tensor(name).is_some() {
            known.push(name.to_string());
        }
    }
    for l in 0..cfg.n_layers {
        for (name, dims) in layer_tensors(cfg, l) {
            expect_tensor(g, &name, &dims)?;
            known.push(name);
        }
    }
    // A tensor the forward pass would ignore (extra biases, experts, ...) means a feature the
    // engine does not implement: refuse rather than compute something else.
    if g.tensors.len() != known.len() {
        let known: std::collections::HashSet<&str> = known.iter().map(|s| s.as_str()).collect();
        if let Some(t) = g.tensors.iter().find(|t| !known.contains(t.name.as_str())) {
            return Err(ModelError::UnexpectedTensor {
                arch: cfg.arch.clone(),
                name: t.name.clone(),
            });
        }
    }
    Ok(())
}
