//! The model's hyper-parameters, read from GGUF metadata and checked against the tensor table.
//!
//! [`ModelConfig::from_gguf`] reads the `{arch}.*` metadata keys, refuses architectures and
//! features the engine does not implement (with an error that names them), and validates that
//! every tensor the forward pass needs exists with the expected dimensions (the per-architecture
//! tensor list is in [`super::tensors`], the per-architecture features in [`super::arch`]).
//! Everything later (the CPU reference, the GPU engine) can then index weights without further
//! checks.

use std::fmt;

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

pub use super::arch::{Family, FfnAct, SUPPORTED_ARCHS};
pub use super::rope::{RopeConfig, RopeFactors};
pub use super::tensors::{LayerNames, layer_names};

/// Name of the token embedding tensor (`[n_embd, vocab]`).
pub const TOKEN_EMBD: &str = "token_embd.weight";
/// Name of the final norm weight (`[n_embd]`).
pub const OUTPUT_NORM: &str = "output_norm.weight";
/// Name of the output head (`[n_embd, vocab]`); absent when tied to [`TOKEN_EMBD`].
pub const OUTPUT: &str = "output.weight";

/// Everything that can be wrong when building a model from a GGUF file.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("metadata key {key:?} is missing")]
    MissingMetadata { key: String },
    #[error("unsupported architecture {arch:?} (supported: {})", SUPPORTED_ARCHS.join(", "))]
    UnsupportedArch { arch: String },
    #[error(
        "{arch}: mixture-of-experts models ({expert_count} experts) are not supported (supported: dense {})",
        SUPPORTED_ARCHS.join(", ")
    )]
    UnsupportedMoe { arch: String, expert_count: u64 },
    #[error(
        "{arch}: rope scaling {kind:?} is not supported (supported: none, linear, llama3, longrope with its factor tensors)"
    )]
    UnsupportedRopeScaling { arch: String, kind: String },
    #[error("{arch}: {feature} is not supported")]
    UnsupportedFeature { arch: String, feature: String },
    #[error("tensor {name:?} is not used by the {arch} forward pass (unsupported feature)")]
    UnexpectedTensor { arch: String, name: String },
    #[error("tensor {name:?} is missing")]
    MissingTensor { name: String },
    #[error("tensor {name:?}: expected dims {expected:?}, found {found:?}")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("invalid config: {key} = {value}: {problem}")]
    BadConfig {
        key: String,
        value: String,
        problem: String,
    },
    #[error("token id {token} is out of range (vocab size {vocab})")]
    TokenOutOfRange { token: u32, vocab: usize },
    #[error(
        "the tokenizer has {tokens} tokens but {TOKEN_EMBD} has {embedding_rows} rows: \
         every token needs exactly one embedding row"
    )]
    VocabMismatch {
        tokens: usize,
        embedding_rows: usize,
    },
    #[error("position {pos} is invalid: {problem}")]
    BadPosition { pos: usize, problem: String },
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Rotate adjacent pairs `(2i, 2i+1)`. GGUF llama files store Q/K rows permuted for this.
    Normal,
    /// Rotate `(i, i + rope_dim/2)` (GPT-NeoX style; qwen2, qwen3, phi3, gemma).
    Neox,
}

impl fmt::Display for RopeStyle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RopeStyle::Normal => "normal",
            RopeStyle::Neox => "neox",
        })
    }
}

/// Hyper-parameters of a supported model, validated against its tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture` (one of [`SUPPORTED_ARCHS`]).
    pub arch: String,
    pub family: Family,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    /// RoPE base of global layers (`rope.base`).
    pub rope_base: f32,
    /// Leading dimensions of each head that rotate (even, at most `head_dim`).
    pub rope_dim: usize,
    pub rms_eps: f32,
    pub context_length: usize,
    pub vocab_size: usize,
    /// True when there is no `output.weight` and the head reuses `token_embd.weight`.
    pub tied_output: bool,
    pub rope_style: RopeStyle,
    /// True when each layer has `attn_q.bias`, `attn_k.bias` and `attn_v.bias`.
    pub has_qkv_bias: bool,
    /// Q, K and V in one `attn_qkv` matrix (rows: Q, then K, then V).
    pub fused_qkv: bool,
    /// Gate and up in one `ffn_up` matrix of `2 n_ff` rows (gate rows first).
    pub fused_gate_up: bool,
    /// Per-head RMSNorm of Q and K after the projection, before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention output and of the FFN output before each residual add.
    pub post_norms: bool,
    pub ffn_act: FfnAct,
    /// Embeddings are multiplied by this (Gemma: √n_embd).
    pub embd_scale: Option<f32>,
    /// Attention logits are `q·k × attn_scale`.
    pub attn_scale: f32,
    /// Attention logits become `cap · tanh(logit / cap)`.
    pub attn_softcap: Option<f32>,
    /// Output logits become `cap · tanh(logit / cap)`.
    pub final_softcap: Option<f32>,
    /// Local layers attend the last `swa_window` positions (the row's own included).
    pub swa_window: Option<u32>,
    /// Which layers are local (sliding-window); all false without a window.
    pub swa_layers: Vec<bool>,
    /// RoPE of global layers, and of local layers.
    pub rope: RopeConfig,
    pub rope_swa: RopeConfig,
}

/// Upper bound for any single dimension read from metadata; keeps products far from overflow.
const MAX_DIM: u64 = 1 << 24;
/// Upper bound for the layer count.
/// The most layers a model may declare.
pub const MAX_LAYERS: u64 = 4096;

pub(crate) fn bad(key: &str, value: impl fmt::Display, problem: impl Into<String>) -> ModelError {
    ModelError::BadConfig {
        key: key.to_string(),
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// A required integer key in `1..=max`.
fn req_dim(g: &GgufFile, key: &str, max: u64) -> Result<usize, ModelError> {
    match g.get_u64(key)? {
        None => Err(ModelError::MissingMetadata {
            key: key.to_string(),
        }),
        Some(v) => check_dim(key, v, max),
    }
}

/// An optional integer key in `1..=max`.
fn opt_dim(g: &GgufFile, key: &str, max: u64) -> Result<Option<usize>, ModelError> {
    g.get_u64(key)?.map(|v| check_dim(key, v, max)).transpose()
}

fn check_dim(key: &str, v: u64, max: u64) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(bad(key, v, "must be non-zero"));
    }
    if v > max {
        return Err(bad(
            key,
            v,
            format!("larger than the supported maximum {max}"),
        ));
    }
    usize::try_from(v).map_err(|_| bad(key, v, "does not fit in usize"))
}

fn checked_mul(key: &str, a: usize, b: usize) -> Result<usize, ModelError> {
    a.checked_mul(b)
        .ok_or_else(|| bad(key, format!("{a} * {b}"), "overflows"))
}

/// Dims with trailing 1s dropped (a `[n, 1]` tensor is the vector `[n]`).
fn squeeze(dims: &[u64]) -> Vec<u64> {
    let mut d = dims.to_vec();
    while d.len() > 1 && d.last() == Some(&1) {
        d.pop();
    }
    d
}

/// Check that tensor `name` exists with GGUF dims `expected`.
pub(crate) fn expect_tensor(
    g: &GgufFile,
    name: &str,
    expected: &[usize],
) -> Result<(), ModelError> {
    let t = g.tensor(name).ok_or_else(|| ModelError::MissingTensor {
        name: name.to_string(),
    })?;
    let expected: Vec<u64> = expected.iter().map(|&d| d as u64).collect();
    if squeeze(&t.dims) != squeeze(&expected) {
        return Err(ModelError::BadShape {
            name: name.to_string(),
            expected,
            found: t.dims.clone(),
        });
    }
    Ok(())
}

impl ModelConfig {
    /// Read and validate the config of a GGUF model.
    pub fn from_gguf(g: &GgufFile) -> Result<Self, ModelError> {
        let arch = g
            .get_str("general.architecture")?
            .ok_or_else(|| ModelError::MissingMetadata {
                key: "general.architecture".to_string(),
            })?
            .to_string();
        let Some(family) = Family::of(&arch) else {
            return Err(ModelError::UnsupportedArch { arch });
        };
        let k = |s: &str| format!("{arch}.{s}");

        if let Some(n) = g.get_u64(&k("expert_count"))?
            && n > 0
        {
            return Err(ModelError::UnsupportedMoe {
                arch,
                expert_count: n,
            });
        }

        let n_layers = req_dim(g, &k("block_count"), MAX_LAYERS)?;
        let n_embd = req_dim(g, &k("embedding_length"), MAX_DIM)?;
        let n_ff = req_dim(g, &k("feed_forward_length"), MAX_DIM)?;
        let n_heads = req_dim(g, &k("attention.head_count"), MAX_DIM)?;
        let n_kv_heads = opt_dim(g, &k("attention.head_count_kv"), MAX_DIM)?.unwrap_or(n_heads);
        if n_heads % n_kv_heads != 0 {
            return Err(bad(
                &k("attention.head_count_kv"),
                n_kv_heads,
                format!("must divide attention.head_count = {n_heads}"),
            ));
        }
        let head_dim = match opt_dim(g, &k("attention.key_length"), MAX_DIM)? {
            Some(d) => d,
            None => {
                if n_embd % n_heads != 0 {
                    return Err(bad(
                        &k("attention.head_count"),
                        n_heads,
                        format!(
                            "must divide embedding_length = {n_embd} (no attention.key_length)"
                        ),
                    ));
                }
                n_embd / n_heads
            }
        };
        if let Some(vl) = opt_dim(g, &k("attention.value_length"), MAX_DIM)?
            && vl != head_dim
        {
            return Err(bad(
                &k("attention.value_length"),
                vl,
                format!("must equal the key length {head_dim}"),
            ));
        }
        let rope_dim = opt_dim(g, &k("rope.dimension_count"), MAX_DIM)?.unwrap_or(head_dim);
        if rope_dim % 2 != 0 || rope_dim > head_dim {
            return Err(bad(
                &k("rope.dimension_count"),
                rope_dim,
                format!("must be even and at most the head size {head_dim}"),
            ));
        }
        let eps_key = k("attention.layer_norm_rms_epsilon");
        let rms_eps = g
            .get_f32(&eps_key)?
            .ok_or_else(|| ModelError::MissingMetadata {
                key: eps_key.clone(),
            })?;
        if !(rms_eps.is_finite() && rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(bad(&eps_key, rms_eps, "must be in (0, 1)"));
        }
        let context_length = req_dim(g, &k("context_length"), u32::MAX as u64)?;

        // Sizes derived from the metadata must not overflow anywhere downstream.
        let q_dim = checked_mul("n_heads * head_dim", n_heads, head_dim)?;
        let kv_dim = checked_mul("n_kv_heads * head_dim", n_kv_heads, head_dim)?;

        let embd = g
            .tensor(TOKEN_EMBD)
            .ok_or_else(|| ModelError::MissingTensor {
                name: TOKEN_EMBD.to_string(),
            })?;
        let embd_rows = if embd.dims.len() >= 2 {
            embd.n_rows()
        } else {
            0
        };
        let vocab_size = match opt_dim(g, &k("vocab_size"), u32::MAX as u64)? {
            Some(v) => v,
            None => check_dim("token_embd.weight rows", embd_rows, u32::MAX as u64)?,
        };
        checked_mul("vocab_size * n_embd", vocab_size, n_embd)?;
        checked_mul("2 * n_ff * n_embd", 2 * n_ff, n_embd)?;
        checked_mul("q_dim * n_embd", q_dim, n_embd)?;
        checked_mul("(q_dim + 2 kv_dim) * n_embd", q_dim + 2 * kv_dim, n_embd)?;
        checked_mul("kv_dim * context_length", kv_dim, context_length)?;

        let f = super::arch::read_features(
            g,
            &arch,
            family,
            &super::arch::Dims {
                n_layers,
                n_embd,
                n_heads,
                head_dim,
                rope_dim,
                context_length,
            },
        )?;
        let tied_output = g.tensor(OUTPUT).is_none();
        let has_qkv_bias = match family {
            Family::Qwen2 => true,
            Family::Llama => g.tensor("blk.0.attn_q.bias").is_some(),
            _ => false,
        };
        let cfg = ModelConfig {
            family,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads,
            head_dim,
            n_ff,
            rope_base: f.rope.base,
            rope_dim,
            rms_eps,
            context_length,
            vocab_size,
            tied_output,
            rope_style: family.rope_style(),
            has_qkv_bias,
            fused_qkv: family == Family::Phi3 && g.tensor("blk.0.attn_qkv.weight").is_some(),
            fused_gate_up: family == Family::Phi3,
            qk_norm: matches!(family, Family::Qwen3 | Family::Gemma3),
            post_norms: family.is_gemma(),
            ffn_act: f.ffn_act,
            embd_scale: f.embd_scale,
            attn_scale: f.attn_scale,
            attn_softcap: f.attn_softcap,
            final_softcap: f.final_softcap,
            swa_window: f.swa_window,
            swa_layers: f.swa_layers,
            rope: f.rope,
            rope_swa: f.rope_swa,
            arch,
        };
        super::tensors::validate(&cfg, g)?;
        // Token ids index the embedding rows (and the output head): a vocabulary of another
        // size would read past them or name rows no token can produce.
        if let Some(tokens) = g.get_array("tokenizer.ggml.tokens")?
            && tokens.len() != cfg.vocab_size
        {
            return Err(ModelError::VocabMismatch {
                tokens: tokens.len(),
                embedding_rows: cfg.vocab_size,
            });
        }
        Ok(cfg)
    }

    /// Width of the concatenated query heads (`n_heads * head_dim`).
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of one K or V cache row (`n_kv_heads * head_dim`).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Query heads per key/value head.
    pub fn gqa_group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Whether layer `l` is a local (sliding-window) layer.
    pub fn is_swa(&self, l: usize) -> bool {
        self.swa_window.is_some() && self.swa_layers.get(l).copied().unwrap_or(false)
    }

    /// The attention window of layer `l` (None: global).
    pub fn window_of(&self, l: usize) -> Option<u32> {
        if self.is_swa(l) {
            self.swa_window
        } else {
            None
        }
    }

    /// The RoPE of layer `l`.
    pub fn rope_of(&self, l: usize) -> &RopeConfig {
        if self.is_swa(l) {
            &self.rope_swa
        } else {
            &self.rope
        }
    }

    /// Whether local layers rotate differently from global ones (a second RoPE table).
    pub fn split_rope(&self) -> bool {
        self.swa_layers.iter().any(|&s| s) && self.rope_swa != self.rope
    }

    /// A multi-line human-readable summary (what `flashlm info` prints).
    pub fn summary(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for ModelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "architecture:   {}", self.arch)?;
        writeln!(f, "layers:         {}", self.n_layers)?;
        writeln!(f, "embedding:      {}", self.n_embd)?;
        writeln!(f, "feed-forward:   {}", self.n_ff)?;
        writeln!(
            f,
            "heads:          {} query, {} key/value (group {}), head size {}",
            self.n_heads,
            self.n_kv_heads,
            self.gqa_group(),
            self.head_dim
        )?;
        writeln!(
            f,
            "rope:           {} style, {} of {} dims, {}",
            self.rope_style,
            self.rope_dim,
            self.head_dim,
            self.rope.describe()
        )?;
        if let Some(w) = self.swa_window {
            let n = self.swa_layers.iter().filter(|&&s| s).count();
            writeln!(
                f,
                "sliding window: {w} positions on {n} of {} layers (rope {})",
                self.n_layers,
                self.rope_swa.describe()
            )?;
        }
        writeln!(f, "rms norm eps:   {:e}", self.rms_eps)?;
        writeln!(f, "context:        {}", self.context_length)?;
        writeln!(f, "vocabulary:     {}", self.vocab_size)?;
        writeln!(
            f,
            "output head:    {}",
            if self.tied_output {
                "tied to token_embd"
            } else {
                "output.weight"
            }
        )?;
        let mut extras = Vec::new();
        if self.has_qkv_bias {
            extras.push("q/k/v bias".to_string());
        }
        if self.fused_qkv {
            extras.push("fused qkv".into());
        }
        if self.fused_gate_up {
            extras.push("fused gate/up".into());
        }
        if self.qk_norm {
            extras.push("q/k norms".into());
        }
        if self.post_norms {
            extras.push("post norms".into());
        }
        if self.ffn_act == FfnAct::GeluTanh {
            extras.push("GeGLU".into());
        }
        if let Some(s) = self.embd_scale {
            extras.push(format!("embeddings x {s}"));
        }
        if let Some(c) = self.attn_softcap {
            extras.push(format!("attention soft-cap {c}"));
        }
        if let Some(c) = self.final_softcap {
            extras.push(format!("logit soft-cap {c}"));
        }
        write!(
            f,
            "features:       {}",
            if extras.is_empty() {
                "none".to_string()
            } else {
                extras.join(", ")
            }
        )
    }
}
