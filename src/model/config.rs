//! The model's hyper-parameters, read from GGUF metadata and checked against the tensor table.
//!
//! [`ModelConfig::from_gguf`] reads the `{arch}.*` metadata keys, refuses architectures and
//! features the engine does not implement (with an error that names them), and validates that
//! every tensor the forward pass needs exists with the expected dimensions. Everything later
//! (the CPU reference, the GPU engine) can then index weights without further checks.

use std::fmt;

use thiserror::Error;

use crate::gguf::{GgufError, GgufFile};

/// Architectures the engine runs.
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "mistral", "qwen2"];

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
    #[error("{arch}: rope scaling {kind:?} is not supported (supported: none)")]
    UnsupportedRopeScaling { arch: String, kind: String },
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
    /// Rotate `(i, i + rope_dim/2)` (GPT-NeoX style; qwen2).
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
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    /// Key/value heads (grouped-query attention when smaller than `n_heads`).
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_ff: usize,
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
}

/// The tensor names of one transformer layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerNames {
    pub attn_norm: String,
    pub attn_q: String,
    pub attn_k: String,
    pub attn_v: String,
    pub attn_q_bias: String,
    pub attn_k_bias: String,
    pub attn_v_bias: String,
    pub attn_output: String,
    pub ffn_norm: String,
    pub ffn_gate: String,
    pub ffn_up: String,
    pub ffn_down: String,
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
            attn_q_bias: n("attn_q.bias"),
            attn_k_bias: n("attn_k.bias"),
            attn_v_bias: n("attn_v.bias"),
            attn_output: n("attn_output.weight"),
            ffn_norm: n("ffn_norm.weight"),
            ffn_gate: n("ffn_gate.weight"),
            ffn_up: n("ffn_up.weight"),
            ffn_down: n("ffn_down.weight"),
        }
    }
}

/// The tensor names of layer `layer`.
pub fn layer_names(layer: usize) -> LayerNames {
    LayerNames::new(layer)
}

/// Upper bound for any single dimension read from metadata; keeps products far from overflow.
const MAX_DIM: u64 = 1 << 24;
/// Upper bound for the layer count.
const MAX_LAYERS: u64 = 4096;

fn bad(key: &str, value: impl fmt::Display, problem: impl Into<String>) -> ModelError {
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
        let rope_style = match arch.as_str() {
            "llama" | "mistral" => RopeStyle::Normal,
            "qwen2" => RopeStyle::Neox,
            _ => return Err(ModelError::UnsupportedArch { arch }),
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
        check_rope_scaling(g, &arch)?;

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
        let rope_base = g.get_f32(&k("rope.freq_base"))?.unwrap_or(10000.0);
        if !(rope_base.is_finite() && rope_base > 1.0) {
            return Err(bad(
                &k("rope.freq_base"),
                rope_base,
                "must be finite and > 1",
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
        checked_mul("n_ff * n_embd", n_ff, n_embd)?;
        checked_mul("q_dim * n_embd", q_dim, n_embd)?;
        checked_mul("kv_dim * context_length", kv_dim, context_length)?;

        let tied_output = g.tensor(OUTPUT).is_none();
        let has_qkv_bias = arch == "qwen2" || g.tensor("blk.0.attn_q.bias").is_some();

        let cfg = ModelConfig {
            arch,
            n_layers,
            n_embd,
            n_heads,
            n_kv_heads,
            head_dim,
            n_ff,
            rope_base,
            rope_dim,
            rms_eps,
            context_length,
            vocab_size,
            tied_output,
            rope_style,
            has_qkv_bias,
        };
        cfg.validate_tensors(g)?;
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

    /// Check every tensor the forward pass reads, and that there are no others.
    fn validate_tensors(&self, g: &GgufFile) -> Result<(), ModelError> {
        let (e, q, kv, ff) = (self.n_embd, self.q_dim(), self.kv_dim(), self.n_ff);
        let mut known: Vec<String> = vec![TOKEN_EMBD.into(), OUTPUT_NORM.into()];
        expect_tensor(g, TOKEN_EMBD, &[e, self.vocab_size])?;
        expect_tensor(g, OUTPUT_NORM, &[e])?;
        if !self.tied_output {
            expect_tensor(g, OUTPUT, &[e, self.vocab_size])?;
            known.push(OUTPUT.into());
        }
        for l in 0..self.n_layers {
            let n = LayerNames::new(l);
            expect_tensor(g, &n.attn_norm, &[e])?;
            expect_tensor(g, &n.attn_q, &[e, q])?;
            expect_tensor(g, &n.attn_k, &[e, kv])?;
            expect_tensor(g, &n.attn_v, &[e, kv])?;
            expect_tensor(g, &n.attn_output, &[q, e])?;
            expect_tensor(g, &n.ffn_norm, &[e])?;
            expect_tensor(g, &n.ffn_gate, &[e, ff])?;
            expect_tensor(g, &n.ffn_up, &[e, ff])?;
            expect_tensor(g, &n.ffn_down, &[ff, e])?;
            if self.has_qkv_bias {
                expect_tensor(g, &n.attn_q_bias, &[q])?;
                expect_tensor(g, &n.attn_k_bias, &[kv])?;
                expect_tensor(g, &n.attn_v_bias, &[kv])?;
            }
            let LayerNames {
                attn_norm,
                attn_q,
                attn_k,
                attn_v,
                attn_q_bias,
                attn_k_bias,
                attn_v_bias,
                attn_output,
                ffn_norm,
                ffn_gate,
                ffn_up,
                ffn_down,
            } = n;
            known.extend([
                attn_norm,
                attn_q,
                attn_k,
                attn_v,
                attn_output,
                ffn_norm,
                ffn_gate,
                ffn_up,
                ffn_down,
            ]);
            if self.has_qkv_bias {
                known.extend([attn_q_bias, attn_k_bias, attn_v_bias]);
            }
        }
        // A tensor the forward pass would ignore (extra biases, rope_freqs, experts, ...) means a
        // feature the engine does not implement: refuse rather than compute something else.
        if g.tensors.len() != known.len() {
            let known: std::collections::HashSet<&str> = known.iter().map(|s| s.as_str()).collect();
            if let Some(t) = g.tensors.iter().find(|t| !known.contains(t.name.as_str())) {
                return Err(ModelError::UnexpectedTensor {
                    arch: self.arch.clone(),
                    name: t.name.clone(),
                });
            }
        }
        Ok(())
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

    /// A multi-line human-readable summary (what `flashlm info` prints).
    pub fn summary(&self) -> String {
        self.to_string()
    }
}

/// Refuse any rope scaling other than none.
fn check_rope_scaling(g: &GgufFile, arch: &str) -> Result<(), ModelError> {
    let unsupported = |kind: &str| ModelError::UnsupportedRopeScaling {
        arch: arch.to_string(),
        kind: kind.to_string(),
    };
    let ty_key = format!("{arch}.rope.scaling.type");
    match g.get_str(&ty_key)? {
        Some("none") => return Ok(()),
        Some(other) => return Err(unsupported(other)),
        None => {}
    }
    // Without a type, a scale factor other than 1 (or 0, meaning unset) implies linear scaling.
    for key in [
        format!("{arch}.rope.scaling.factor"),
        format!("{arch}.rope.scale_linear"),
    ] {
        if let Some(f) = g.get_f32(&key)?
            && f != 0.0
            && f != 1.0
        {
            return Err(unsupported(&format!("linear (factor {f})")));
        }
    }
    Ok(())
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
            "rope:           {} style, base {}, {} of {} dims",
            self.rope_style, self.rope_base, self.rope_dim, self.head_dim
        )?;
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
        write!(
            f,
            "q/k/v bias:     {}",
            if self.has_qkv_bias { "yes" } else { "no" }
        )
    }
}
