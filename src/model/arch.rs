//! What each supported architecture computes beyond the llama layer, read from metadata the way
//! llama.cpp reads it (its converter decides what the file holds; see `convert_hf_to_gguf.py`).
//!
//! | family | files (`general.architecture`) | beyond llama |
//! |---|---|---|
//! | llama | `llama` (Llama 1-3.x, Mistral 7B/Nemo/Small, SmolLM), `mistral`, `mistral3` | `rope_freqs` (Llama 3.x), optional q/k/v biases |
//! | qwen2 | `qwen2` (Qwen2, Qwen2.5) | q/k/v biases, NEOX RoPE |
//! | qwen3 | `qwen3` | per-head q/k RMSNorm before RoPE, NEOX RoPE |
//! | phi3 | `phi3` | fused `attn_qkv`, fused gate/up in `ffn_up` (gate rows first), NEOX RoPE, LongRoPE factors |
//! | gemma2 | `gemma2` | GeGLU (tanh GELU), embeddings × √n_embd, post-attention and post-FFN norms, attention and final logit soft-capping, sliding window on every other layer (even layers local) |
//! | gemma3 | `gemma3` | as gemma2 without soft-capping, plus per-head q/k norms; five local layers in six, local layers with their own RoPE base (10000) and no linear scaling |
//!
//! Gemma norm weights are used as stored: the converter already added 1 to them. Phi-3 files
//! carry `attention.sliding_window`, which llama.cpp ignores (its Phi SWA is disabled); so does
//! this engine. Gemma's attention scale follows llama.cpp: `1/√head_dim`, except the 27B sizes
//! (46 layers for Gemma 2, 62 for Gemma 3), which use `1/√(n_embd / n_head)`.

use crate::gguf::{GgufFile, MetaValue};

use super::config::{ModelError, RopeStyle};
use super::rope::{RopeConfig, RopeFactors, llama3_factors};

/// `general.architecture` values the engine runs.
pub const SUPPORTED_ARCHS: &[&str] = &[
    "llama", "mistral", "mistral3", "qwen2", "qwen3", "phi3", "gemma2", "gemma3",
];

/// Families of architectures that compute the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    Qwen2,
    Qwen3,
    Phi3,
    Gemma2,
    Gemma3,
}

impl Family {
    /// The family of a `general.architecture` value, if supported.
    pub fn of(arch: &str) -> Option<Self> {
        Some(match arch {
            "llama" | "mistral" | "mistral3" => Family::Llama,
            "qwen2" => Family::Qwen2,
            "qwen3" => Family::Qwen3,
            "phi3" => Family::Phi3,
            "gemma2" => Family::Gemma2,
            "gemma3" => Family::Gemma3,
            _ => return None,
        })
    }

    /// How RoPE pairs dimensions (llama.cpp's `llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Family::Llama => RopeStyle::Normal,
            _ => RopeStyle::Neox,
        }
    }

    pub fn is_gemma(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }
}

/// The activation of the gated feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FfnAct {
    /// `silu(gate) * up` (SwiGLU).
    Silu,
    /// `gelu_tanh(gate) * up` (GeGLU, tanh approximation).
    GeluTanh,
}

/// Architecture features read from metadata.
#[derive(Debug, Clone)]
pub(crate) struct Features {
    pub ffn_act: FfnAct,
    pub embd_scale: Option<f32>,
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    pub swa_window: Option<u32>,
    pub swa_layers: Vec<bool>,
    pub rope: RopeConfig,
    pub rope_swa: RopeConfig,
}

/// Sizes the features depend on.
pub(crate) struct Dims {
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub head_dim: usize,
    pub rope_dim: usize,
    pub context_length: usize,
}

fn bad(key: &str, value: impl std::fmt::Display, problem: &str) -> ModelError {
    ModelError::BadConfig {
        key: key.to_string(),
        value: value.to_string(),
        problem: problem.to_string(),
    }
}

/// An optional positive, finite float.
fn pos_f32(g: &GgufFile, key: &str) -> Result<Option<f32>, ModelError> {
    match g.get_f32(key)? {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(bad(key, v, "must be finite and > 0")),
        v => Ok(v),
    }
}

/// Read the features of `arch` (of `family`).
pub(crate) fn read_features(
    g: &GgufFile,
    arch: &str,
    family: Family,
    d: &Dims,
) -> Result<Features, ModelError> {
    let k = |s: &str| format!("{arch}.{s}");
    let unsupported = |feature: String| ModelError::UnsupportedFeature {
        arch: arch.to_string(),
        feature,
    };
    if arch == "mistral3" {
        for key in [
            k("attention.temperature_scale"),
            k("rope.scaling.yarn_log_multiplier"),
        ] {
            if g.get_f32(&key)?.is_some_and(|v| v != 0.0) {
                return Err(unsupported(format!("{key} (attention temperature tuning)")));
            }
        }
    }
    let rope = read_rope(g, arch, family, d)?;

    let mut swa_window = None;
    let mut swa_layers = vec![false; d.n_layers];
    let window_key = k("attention.sliding_window");
    let window = g.get_u64(&window_key)?;
    let pattern_default = match family {
        Family::Gemma2 => Some((window.unwrap_or(4096), 2u64)),
        Family::Gemma3 => window.filter(|&w| w > 0).map(|w| (w, 6)),
        _ => None,
    };
    if let Some((w, default_period)) = pattern_default {
        if w == 0 || w > u32::MAX as u64 {
            return Err(bad(&window_key, w, "must be in 1..2^32"));
        }
        swa_window = Some(w as u32);
        let pattern_key = k("attention.sliding_window_pattern");
        match g.get(&pattern_key) {
            Some(MetaValue::Array(items)) => {
                if items.len() != d.n_layers {
                    return Err(bad(&pattern_key, items.len(), "needs one entry per layer"));
                }
                for (l, v) in items.iter().enumerate() {
                    swa_layers[l] = v
                        .as_bool()
                        .ok_or_else(|| bad(&pattern_key, v.type_name(), "must hold booleans"))?;
                }
            }
            Some(v) => {
                let n = v
                    .as_u64()
                    .filter(|&n| n > 0 && n <= d.n_layers.max(1) as u64)
                    .ok_or_else(|| bad(&pattern_key, format!("{v:?}"), "bad layer period"))?;
                set_pattern(&mut swa_layers, n);
            }
            None => set_pattern(&mut swa_layers, default_period),
        }
    }

    let rope_swa = if swa_window.is_some() && family == Family::Gemma3 {
        let base_key = k("rope.freq_base_swa");
        let base = pos_f32(g, &base_key)?.unwrap_or(10000.0);
        RopeConfig {
            base,
            freq_scale: 1.0,
            attn_factor: rope.attn_factor,
            factors: RopeFactors::None,
        }
    } else {
        let mut r = rope.clone();
        if let Some(b) = pos_f32(g, &k("rope.freq_base_swa"))?
            && swa_window.is_some()
        {
            r.base = b;
        }
        r
    };

    let (mut attn_softcap, mut final_softcap) = (None, None);
    if family == Family::Gemma2 {
        attn_softcap = Some(pos_f32(g, &k("attn_logit_softcapping"))?.unwrap_or(50.0));
        final_softcap = Some(pos_f32(g, &k("final_logit_softcapping"))?.unwrap_or(30.0));
    } else if family == Family::Gemma3 && swa_window.is_none() {
        final_softcap = pos_f32(g, &k("final_logit_softcapping"))?;
    }

    let big_gemma = matches!(
        (family, d.n_layers),
        (Family::Gemma2, 46) | (Family::Gemma3, 62)
    );
    let mut attn_scale = if big_gemma {
        1.0 / ((d.n_embd / d.n_heads) as f32).sqrt()
    } else {
        1.0 / (d.head_dim as f32).sqrt()
    };
    if arch == "mistral3"
        && let Some(s) = pos_f32(g, &k("attention.scale"))?
    {
        attn_scale = s;
    }
    Ok(Features {
        ffn_act: if family.is_gemma() {
            FfnAct::GeluTanh
        } else {
            FfnAct::Silu
        },
        embd_scale: family.is_gemma().then(|| (d.n_embd as f32).sqrt()),
        attn_scale,
        attn_softcap,
        final_softcap,
        swa_window,
        swa_layers,
        rope,
        rope_swa,
    })
}

/// llama.cpp's `set_swa_pattern`: of every `n` layers, the first `n - 1` are local.
fn set_pattern(layers: &mut [bool], n: u64) {
    for (l, s) in layers.iter_mut().enumerate() {
        *s = (l as u64) % n < n - 1;
    }
}

/// A factor tensor of `n` values (F32 or F16), each finite and > 0.
fn factor_tensor(g: &GgufFile, name: &str, n: usize) -> Result<Option<Vec<f32>>, ModelError> {
    let Some(t) = g.tensor(name) else {
        return Ok(None);
    };
    super::config::expect_tensor(g, name, &[n])?;
    if !matches!(
        t.ty,
        crate::gguf::GgmlType::F32 | crate::gguf::GgmlType::F16
    ) {
        return Err(bad(name, t.ty, "frequency factors must be F32 or F16"));
    }
    let v = g.dequantize_tensor(t)?;
    if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(bad(name, x, "frequency factors must be finite and > 0"));
    }
    Ok(Some(v))
}

/// The RoPE of global layers: base, scaling type and factor, magnitude, frequency factors.
fn read_rope(g: &GgufFile, arch: &str, family: Family, d: &Dims) -> Result<RopeConfig, ModelError> {
    let k = |s: &str| format!("{arch}.{s}");
    let base_key = k("rope.freq_base");
    let base = g.get_f32(&base_key)?.unwrap_or(10000.0);
    if !(base.is_finite() && base > 1.0) {
        return Err(bad(&base_key, base, "must be finite and > 1"));
    }
    let unsupported = |kind: &str| ModelError::UnsupportedRopeScaling {
        arch: arch.to_string(),
        kind: kind.to_string(),
    };
    // As llama.cpp: the factor (or the older key) sets a linear scale 1/factor; 0 means unset.
    let mut factor = None;
    for key in [k("rope.scaling.factor"), k("rope.scale_linear")] {
        if let Some(f) = g.get_f32(&key)? {
            if f == 0.0 {
                continue;
            }
            if !(f.is_finite() && f > 0.0) {
                return Err(bad(&key, f, "must be finite and > 0"));
            }
            factor = Some(f);
            break;
        }
    }
    let attn_factor = pos_f32(g, &k("rope.scaling.attn_factor"))?.unwrap_or(1.0);
    let orig_key = k("rope.scaling.original_context_length");
    let orig_ctx = g.get_u64(&orig_key)?;
    if orig_ctx == Some(0) {
        return Err(bad(&orig_key, 0, "must be non-zero"));
    }
    let linear = 1.0 / factor.unwrap_or(1.0);
    let half = d.rope_dim / 2;
    let ty = g.get_str(&k("rope.scaling.type"))?.unwrap_or("linear");
    let (freq_scale, mut factors) = match ty {
        "none" => (1.0, RopeFactors::None),
        "linear" | "longrope" => (linear, RopeFactors::None),
        "llama3" => {
            let low = pos_f32(g, &k("rope.scaling.low_freq_factor"))?.unwrap_or(1.0);
            let high = pos_f32(g, &k("rope.scaling.high_freq_factor"))?.unwrap_or(4.0);
            if high <= low {
                return Err(bad(
                    &k("rope.scaling.high_freq_factor"),
                    high,
                    "must exceed the low frequency factor",
                ));
            }
            let orig = orig_ctx.unwrap_or(8192).min(u32::MAX as u64) as usize;
            let f = factor.unwrap_or(8.0);
            (
                1.0,
                RopeFactors::Fixed(llama3_factors(base, d.rope_dim, f, low, high, orig)),
            )
        }
        other => return Err(unsupported(other)),
    };
    if family == Family::Llama
        && let Some(v) = factor_tensor(g, "rope_freqs.weight", half)?
    {
        factors = RopeFactors::Fixed(v);
    }
    if family == Family::Phi3 {
        let long = factor_tensor(g, "rope_factors_long.weight", half)?;
        let short = factor_tensor(g, "rope_factors_short.weight", half)?;
        match (long, short) {
            (Some(long), Some(short)) => {
                factors = RopeFactors::LongShort {
                    long,
                    short,
                    orig_ctx: orig_ctx
                        .unwrap_or(d.context_length as u64)
                        .min(u32::MAX as u64) as usize,
                };
            }
            (None, None) => {}
            _ => {
                return Err(ModelError::UnsupportedFeature {
                    arch: arch.to_string(),
                    feature: "only one of rope_factors_long / rope_factors_short".into(),
                });
            }
        }
    }
    if ty == "longrope" && !matches!(factors, RopeFactors::LongShort { .. }) {
        return Err(unsupported(
            "longrope without rope_factors_long/short tensors",
        ));
    }
    Ok(RopeConfig {
        base,
        freq_scale,
        attn_factor,
        factors,
    })
}
