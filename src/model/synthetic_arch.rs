//! Small synthetic models of each supported architecture, with the tensor names and metadata
//! llama.cpp's converter writes for it, and seeded random weights.
//!
//! Weights are drawn like [`super::synthetic`]'s: matrices ~ N(0, 1/cols), vectors stored as the
//! converter stores them (norm weights around 1: for Gemma that is the trained weight plus the 1
//! the converter adds), biases ~ N(0, 0.1²). The tokenizer metadata is the one
//! [`super::synthetic::synthetic_llama`] writes. Per architecture:
//!
//! - `Llama3`: `llama`, Llama 3 RoPE scaling as a `rope_freqs` tensor (factor 8, low/high
//!   frequency factors 1 and 4, from an original context of 64 so the factors reach the
//!   frequencies that turn within a few dozen positions);
//! - `Mistral`: `llama` (the converter's name for Mistral files), a head size set by
//!   `attention.key_length` other than `n_embd / n_head`;
//! - `Qwen2`: `qwen2`, q/k/v biases; `Qwen3`: `qwen3`, per-head q/k norms;
//! - `Phi3`: `phi3`, fused `attn_qkv` and gate/up in `ffn_up`, `rope.scaling.original_context_length`
//!   and `attention.sliding_window` (read, then ignored, as llama.cpp does); with `longrope`, the
//!   long/short factor tensors and `rope.scaling.attn_factor` of a 128k model;
//! - `Gemma2`: `gemma2`, post norms, soft-capping (small caps, so the tanh bends), a sliding
//!   window on even layers; `Gemma3`: `gemma3`, q/k norms, linear RoPE scaling 8 on global
//!   layers, five local layers in six.

use crate::gguf::quant::quantize;
use crate::gguf::writer::GgufWriter;
use crate::gguf::{GgmlType, GgufFile, MetaValue};
use crate::sampling::SplitMix64;

use super::config::{LayerNames, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use super::synthetic::{SyntheticSpec, synthetic_llama};

/// The architecture of a synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SynthArch {
    Llama3,
    Mistral,
    Qwen2,
    Qwen3,
    Phi3,
    Gemma2,
    Gemma3,
}

impl SynthArch {
    pub const ALL: [SynthArch; 7] = [
        SynthArch::Llama3,
        SynthArch::Mistral,
        SynthArch::Qwen2,
        SynthArch::Qwen3,
        SynthArch::Phi3,
        SynthArch::Gemma2,
        SynthArch::Gemma3,
    ];

    /// `general.architecture` as the converter writes it.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            SynthArch::Llama3 | SynthArch::Mistral => "llama",
            SynthArch::Qwen2 => "qwen2",
            SynthArch::Qwen3 => "qwen3",
            SynthArch::Phi3 => "phi3",
            SynthArch::Gemma2 => "gemma2",
            SynthArch::Gemma3 => "gemma3",
        }
    }
}

/// Shape of a synthetic model of one architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    pub arch: SynthArch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab: usize,
    /// `context_length`.
    pub ctx: usize,
    /// Type of every matrix; vectors are F32.
    pub weight_type: GgmlType,
    pub untied_output: bool,
    /// Sliding window (Gemma).
    pub window: u32,
    /// Phi-3: LongRoPE factor tensors, original context `ctx / 4`.
    pub longrope: bool,
    /// Odd layers store their V and down projections as Q8_0 (F16 when the weight type is
    /// Q8_0), as llama.cpp's mixed quantizations (Q4_K_M, ...) vary types from layer to layer.
    pub mixed_types: bool,
}

impl ArchSpec {
    /// A small model of `arch` with sizes that differ between architectures (head sizes that
    /// are and are not multiples of 4, grouped and plain attention, head sizes that differ from
    /// `n_embd / n_head`).
    pub fn small(arch: SynthArch) -> Self {
        let base = ArchSpec {
            arch,
            n_layers: 3,
            n_embd: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            n_ff: 160,
            vocab: 300,
            ctx: 512,
            weight_type: GgmlType::Q8_0,
            untied_output: false,
            window: 0,
            longrope: false,
            mixed_types: false,
        };
        match arch {
            SynthArch::Llama3 => ArchSpec {
                n_embd: 96,
                n_heads: 6,
                untied_output: true,
                ..base
            },
            SynthArch::Mistral => ArchSpec {
                n_kv_heads: 1,
                head_dim: 24,
                n_ff: 128,
                weight_type: GgmlType::Q4_0,
                ..base
            },
            SynthArch::Qwen2 => ArchSpec {
                n_embd: 96,
                n_heads: 3,
                n_kv_heads: 1,
                head_dim: 32,
                n_ff: 224,
                weight_type: GgmlType::F16,
                ..base
            },
            SynthArch::Qwen3 => ArchSpec {
                head_dim: 24,
                untied_output: true,
                ..base
            },
            SynthArch::Phi3 => ArchSpec {
                n_embd: 96,
                n_kv_heads: 4,
                head_dim: 24,
                n_ff: 128,
                untied_output: true,
                ..base
            },
            SynthArch::Gemma2 => ArchSpec {
                n_layers: 4,
                head_dim: 32,
                n_ff: 192,
                window: 10,
                ..base
            },
            SynthArch::Gemma3 => ArchSpec {
                n_layers: 7,
                n_heads: 2,
                n_kv_heads: 1,
                head_dim: 48,
                n_ff: 128,
                window: 12,
                weight_type: GgmlType::Q4_1,
                ..base
            },
        }
    }
}

/// Seeded normal draws (SplitMix64 and Box-Muller).
struct Normal(SplitMix64);

impl Normal {
    fn next(&mut self) -> f32 {
        let mut u = || ((self.0.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let (u1, u2) = (u(), u());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
    }
}

/// Build the GGUF file of `spec` with weights drawn from `seed`.
///
/// Panics on a spec that cannot form a valid model (zero sizes, heads that do not group, an odd
/// head size, row lengths that are not whole blocks of the weight type): specs come from tests.
pub fn synthetic_arch(spec: &ArchSpec, seed: u64) -> Vec<u8> {
    let s = spec;
    assert!(
        s.n_layers > 0
            && s.n_heads > 0
            && s.n_kv_heads > 0
            && s.n_heads.is_multiple_of(s.n_kv_heads),
        "synthetic arch spec: bad heads or layers: {s:?}"
    );
    assert!(
        s.head_dim.is_multiple_of(2),
        "synthetic arch spec: odd head size"
    );
    let (e, hd, ff) = (s.n_embd, s.head_dim, s.n_ff);
    let (q, kv) = (s.n_heads * hd, s.n_kv_heads * hd);
    let arch = s.arch.gguf_arch();
    let mut w = GgufWriter::new();
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let k = |key: &str| format!("{arch}.{key}");
    w.meta("general.architecture", MetaValue::String(arch.into()))
        .meta(
            "general.name",
            MetaValue::String(format!("flashlm synthetic {:?}", s.arch)),
        )
        .meta(&k("block_count"), u32v(s.n_layers))
        .meta(&k("context_length"), u32v(s.ctx))
        .meta(&k("embedding_length"), u32v(e))
        .meta(&k("feed_forward_length"), u32v(ff))
        .meta(&k("attention.head_count"), u32v(s.n_heads))
        .meta(&k("attention.head_count_kv"), u32v(s.n_kv_heads))
        .meta(
            &k("attention.layer_norm_rms_epsilon"),
            MetaValue::F32(if matches!(s.arch, SynthArch::Gemma2 | SynthArch::Gemma3) {
                1e-6
            } else {
                1e-5
            }),
        );
    if hd * s.n_heads != e
        || matches!(
            s.arch,
            SynthArch::Qwen3 | SynthArch::Gemma2 | SynthArch::Gemma3
        )
    {
        w.meta(&k("attention.key_length"), u32v(hd))
            .meta(&k("attention.value_length"), u32v(hd));
    }
    let rope_base = match s.arch {
        SynthArch::Llama3 => Some(500000.0),
        SynthArch::Qwen2 | SynthArch::Qwen3 | SynthArch::Gemma3 => Some(1_000_000.0),
        SynthArch::Mistral | SynthArch::Phi3 => Some(10000.0),
        SynthArch::Gemma2 => None,
    };
    if let Some(b) = rope_base {
        w.meta(&k("rope.freq_base"), MetaValue::F32(b));
    }
    if !matches!(s.arch, SynthArch::Gemma2 | SynthArch::Gemma3) {
        w.meta(&k("rope.dimension_count"), u32v(hd));
    }
    match s.arch {
        SynthArch::Phi3 => {
            let orig = if s.longrope { s.ctx / 4 } else { s.ctx };
            w.meta(&k("rope.scaling.original_context_length"), u32v(orig))
                .meta(&k("attention.sliding_window"), u32v(s.ctx / 2));
            if s.longrope {
                let scale = 4.0f64;
                let f = (1.0 + scale.ln() / (orig as f64).ln()).sqrt();
                w.meta(&k("rope.scaling.attn_factor"), MetaValue::F32(f as f32));
            }
        }
        SynthArch::Gemma2 => {
            w.meta(&k("attn_logit_softcapping"), MetaValue::F32(4.0))
                .meta(&k("final_logit_softcapping"), MetaValue::F32(3.0))
                .meta(&k("attention.sliding_window"), u32v(s.window as usize));
        }
        SynthArch::Gemma3 => {
            w.meta(&k("rope.scaling.type"), MetaValue::String("linear".into()))
                .meta(&k("rope.scaling.factor"), MetaValue::F32(8.0))
                .meta(&k("attention.sliding_window"), u32v(s.window as usize));
        }
        _ => {}
    }
    w.meta(&k("vocab_size"), u32v(s.vocab));
    copy_tokenizer(&mut w, s.vocab);

    let ty = s.weight_type;
    let other = if ty == GgmlType::Q8_0 {
        GgmlType::F16
    } else {
        GgmlType::Q8_0
    };
    let mut rng = Normal(SplitMix64(seed));
    let mut matrix = |w: &mut GgufWriter, name: &str, cols: usize, rows: usize| {
        let odd_layer = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|l| l % 2 == 1);
        let varies = name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight");
        let ty = if s.mixed_types && odd_layer && varies {
            other
        } else {
            ty
        };
        let std = 1.0 / (cols as f32).sqrt();
        let vals: Vec<f32> = (0..rows * cols).map(|_| rng.next() * std).collect();
        w.tensor(name, &[cols as u64, rows as u64], ty, quantize(ty, &vals));
    };
    let mut vrng = Normal(SplitMix64(seed ^ 0x5EED_0F4E_0F00_0002));
    let mut vector = |w: &mut GgufWriter, name: &str, n: usize, mean: f32, std: f32| {
        let vals: Vec<f32> = (0..n).map(|_| mean + std * vrng.next()).collect();
        w.tensor_f32(name, &[n as u64], GgmlType::F32, &vals);
    };
    matrix(&mut w, TOKEN_EMBD, e, s.vocab);
    if s.arch == SynthArch::Llama3 {
        let f = super::rope::llama3_factors(500000.0, hd, 8.0, 1.0, 4.0, 64);
        w.tensor_f32("rope_freqs.weight", &[f.len() as u64], GgmlType::F32, &f);
    }
    if s.arch == SynthArch::Phi3 && s.longrope {
        let half = hd / 2;
        let long: Vec<f32> = (0..half)
            .map(|i| 1.0 + 3.0 * i as f32 / half as f32)
            .collect();
        let short: Vec<f32> = (0..half).map(|i| 1.0 + 0.1 * i as f32).collect();
        w.tensor_f32(
            "rope_factors_long.weight",
            &[half as u64],
            GgmlType::F32,
            &long,
        );
        w.tensor_f32(
            "rope_factors_short.weight",
            &[half as u64],
            GgmlType::F32,
            &short,
        );
    }
    for l in 0..s.n_layers {
        let n = LayerNames::new(l);
        vector(&mut w, &n.attn_norm, e, 1.0, 0.1);
        match s.arch {
            SynthArch::Phi3 => matrix(&mut w, &n.attn_qkv, e, q + 2 * kv),
            _ => {
                matrix(&mut w, &n.attn_q, e, q);
                matrix(&mut w, &n.attn_k, e, kv);
                matrix(&mut w, &n.attn_v, e, kv);
            }
        }
        if s.arch == SynthArch::Qwen2 {
            vector(&mut w, &n.attn_q_bias, q, 0.0, 0.1);
            vector(&mut w, &n.attn_k_bias, kv, 0.0, 0.1);
            vector(&mut w, &n.attn_v_bias, kv, 0.0, 0.1);
        }
        if matches!(s.arch, SynthArch::Qwen3 | SynthArch::Gemma3) {
            vector(&mut w, &n.attn_q_norm, hd, 1.0, 0.1);
            vector(&mut w, &n.attn_k_norm, hd, 1.0, 0.1);
        }
        matrix(&mut w, &n.attn_output, q, e);
        let gemma = matches!(s.arch, SynthArch::Gemma2 | SynthArch::Gemma3);
        if gemma {
            vector(&mut w, &n.post_attention_norm, e, 1.0, 0.1);
        }
        vector(&mut w, &n.ffn_norm, e, 1.0, 0.1);
        if s.arch == SynthArch::Phi3 {
            matrix(&mut w, &n.ffn_up, e, 2 * ff);
        } else {
            matrix(&mut w, &n.ffn_gate, e, ff);
            matrix(&mut w, &n.ffn_up, e, ff);
        }
        matrix(&mut w, &n.ffn_down, ff, e);
        if gemma {
            vector(&mut w, &n.post_ffw_norm, e, 1.0, 0.1);
        }
    }
    vector(&mut w, OUTPUT_NORM, e, 1.0, 0.1);
    if s.untied_output {
        matrix(&mut w, OUTPUT, e, s.vocab);
    }
    w.to_bytes()
}

/// The tokenizer metadata of the synthetic llama (for a vocabulary of `vocab`), in its order.
fn copy_tokenizer(w: &mut GgufWriter, vocab: usize) {
    let donor = SyntheticSpec {
        n_layers: 1,
        n_embd: 32,
        n_heads: 1,
        n_kv_heads: 1,
        n_ff: 32,
        vocab,
        weight_type: GgmlType::F32,
        ctx: 16,
        untied_output: false,
    };
    let Ok(g) = GgufFile::from_bytes(synthetic_llama(&donor, 0)) else {
        return;
    };
    for key in &g.metadata_order {
        if key.starts_with("tokenizer.")
            && let Some(v) = g.metadata.get(key)
        {
            w.meta(key, v.clone());
        }
    }
}
