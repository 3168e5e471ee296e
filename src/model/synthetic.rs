//! Llama models with seeded random weights, written as GGUF files of any shape.
//!
//! Small ones let tests run the whole pipeline (config, tokenizer, CPU reference, GPU kernels)
//! for any weight type and odd sizes without the real model; large ones (a 7B shape is about
//! 3.3 GB in a 4.5-bit type) exercise streaming from flash. Files are written front to back:
//! the header and every offset are computed first from the shape, then the weights are drawn,
//! quantized and written one block of rows at a time ([`write_synthetic`],
//! [`write_synthetic_file`]), so memory stays small whatever the model size.
//!
//! Weights are drawn so that activations stay in a sane range: matrices ~ N(0, 1/fan_in)
//! (unit-variance outputs for unit-variance inputs), norm weights ~ 1 + N(0, 0.1²), so logits
//! come out with a standard deviation around 1. Each row has its own generator, seeded from the
//! model seed, the tensor and the row, so a seed gives the same file whatever the thread count.
//!
//! The tokenizer is a byte-level BPE ("gpt2"): the 256 byte tokens, a few fixed merges, three
//! control tokens, then generated merged tokens (letter strings) up to the vocabulary size, so
//! every id decodes to text.

mod file;
mod vocab;
mod weights;

use std::io::Write;

use crate::gguf::writer::{GgufLayout, GgufStreamWriter, GgufWriteError, TensorEntry};
use crate::gguf::{GgmlType, MetaValue};

pub use file::{part_path, write_synthetic_file};
pub use vocab::{SYNTHETIC_MERGES, SYNTHETIC_MIN_VOCAB, SYNTHETIC_SPECIALS};

use super::config::{LayerNames, OUTPUT, OUTPUT_NORM, TOKEN_EMBD};
use weights::Init;

/// Largest vocabulary a synthetic model may have.
pub const MAX_SYNTHETIC_VOCAB: usize = 1 << 22;

/// Shape and weight type of a synthetic llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSpec {
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub n_ff: usize,
    /// At least [`SYNTHETIC_MIN_VOCAB`].
    pub vocab: usize,
    /// Type of every matrix (embedding and output head included); norms are always F32.
    pub weight_type: GgmlType,
    /// `llama.context_length`.
    pub ctx: usize,
    /// Write a separate `output.weight` instead of tying the head to `token_embd.weight`.
    pub untied_output: bool,
}

/// What can stop a synthetic model from being built or written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("invalid model shape: {0}")]
    InvalidSpec(String),
    #[error("cannot write {ty} weights: {reason}")]
    Quantize { ty: &'static str, reason: String },
    #[error("cannot lay out the file: {0}")]
    Layout(GgufWriteError),
    #[error("write failed: {0}")]
    Io(std::io::Error),
    #[error(
        "{}: not enough free space: the model needs {}, {} are free",
        path.display(), size(*needed), size(*available)
    )]
    NoSpace {
        path: std::path::PathBuf,
        needed: u64,
        available: u64,
    },
    #[error(
        "{}: the disk is full ({} of {} written); the partial file was removed",
        path.display(), size(*written), size(*total)
    )]
    DiskFull {
        path: std::path::PathBuf,
        written: u64,
        total: u64,
    },
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "writing {} failed ({} of {} written): {source}; the partial file was removed",
        path.display(), size(*written), size(*total)
    )]
    Write {
        path: std::path::PathBuf,
        written: u64,
        total: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot rename {} to {}: {source}", from.display(), to.display())]
    Rename {
        from: std::path::PathBuf,
        to: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A byte count for messages: `3.1 GiB (3337338880 bytes)`.
fn size(n: u64) -> String {
    if n < 1024 {
        format!("{n} bytes")
    } else {
        format!("{} ({n} bytes)", crate::flash::format_size(n))
    }
}

impl From<GgufWriteError> for SynthError {
    fn from(e: GgufWriteError) -> Self {
        match e {
            GgufWriteError::Io(e) => SynthError::Io(e),
            other => SynthError::Layout(other),
        }
    }
}

impl SyntheticSpec {
    /// A small model (2 layers, n_embd 64, 4 heads over 2 kv heads, n_ff 128, vocab 320).
    pub fn tiny(weight_type: GgmlType) -> Self {
        SyntheticSpec {
            n_layers: 2,
            n_embd: 64,
            n_heads: 4,
            n_kv_heads: 2,
            n_ff: 128,
            vocab: 320,
            weight_type,
            ctx: 256,
            untied_output: false,
        }
    }

    /// Check that the spec forms a valid model: non-zero sizes that fit the file's 32-bit
    /// fields, `n_heads` dividing `n_embd` and a multiple of `n_kv_heads`, an even head size,
    /// `n_embd` and `n_ff` multiples of the weight type's block length, a vocabulary from
    /// [`SYNTHETIC_MIN_VOCAB`] to [`MAX_SYNTHETIC_VOCAB`].
    pub fn check(&self) -> Result<(), SynthError> {
        let s = self;
        let bad = |m: String| Err(SynthError::InvalidSpec(m));
        for (what, v) in [
            ("layers", s.n_layers),
            ("embedding size", s.n_embd),
            ("heads", s.n_heads),
            ("kv heads", s.n_kv_heads),
            ("feed-forward size", s.n_ff),
            ("context length", s.ctx),
        ] {
            if v == 0 || u32::try_from(v).is_err() {
                return bad(format!("{what} must be from 1 to {}, got {v}", u32::MAX));
            }
        }
        if !s.n_embd.is_multiple_of(s.n_heads) {
            return bad(format!(
                "{} heads do not divide the embedding size {}",
                s.n_heads, s.n_embd
            ));
        }
        if !s.n_heads.is_multiple_of(s.n_kv_heads) {
            return bad(format!(
                "{} kv heads do not divide the {} heads",
                s.n_kv_heads, s.n_heads
            ));
        }
        let head_dim = s.n_embd / s.n_heads;
        if !head_dim.is_multiple_of(2) {
            return bad(format!("the head size {head_dim} must be even"));
        }
        for (what, v) in [("embedding size", s.n_embd), ("feed-forward size", s.n_ff)] {
            let ty = row_type(s.weight_type, v as u64);
            let block = ty.block_len();
            if !(v as u64).is_multiple_of(block) {
                return bad(format!(
                    "the {what} {v} is not a multiple of the {ty} block length {block}"
                ));
            }
        }
        if !(SYNTHETIC_MIN_VOCAB..=MAX_SYNTHETIC_VOCAB).contains(&s.vocab) {
            return bad(format!(
                "the vocabulary must be from {SYNTHETIC_MIN_VOCAB} to {MAX_SYNTHETIC_VOCAB} tokens, got {}",
                s.vocab
            ));
        }
        Ok(())
    }

    fn head_dim(&self) -> usize {
        self.n_embd / self.n_heads
    }
}

/// The type a matrix of rows `cols` long is stored in: `ty`, or, when the rows are not whole
/// 256-weight super-blocks, the type llama.cpp's quantizer falls back to (Q2_K, Q3_K, IQ4_XS:
/// IQ4_NL; Q4_K: Q5_0; Q5_K: Q5_1; Q6_K: Q8_0).
pub fn row_type(ty: GgmlType, cols: u64) -> GgmlType {
    if cols.is_multiple_of(ty.block_len()) {
        return ty;
    }
    match ty {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    }
}

/// The metadata of a synthetic model (call on a checked spec).
fn metadata(s: &SyntheticSpec) -> Vec<(String, MetaValue)> {
    let u32v = |v: usize| MetaValue::U32(v as u32);
    let mut m: Vec<(&str, MetaValue)> = vec![
        ("general.architecture", MetaValue::String("llama".into())),
        (
            "general.name",
            MetaValue::String("flashlm synthetic llama".into()),
        ),
        ("llama.block_count", u32v(s.n_layers)),
        ("llama.context_length", u32v(s.ctx)),
        ("llama.embedding_length", u32v(s.n_embd)),
        ("llama.feed_forward_length", u32v(s.n_ff)),
        ("llama.attention.head_count", u32v(s.n_heads)),
        ("llama.attention.head_count_kv", u32v(s.n_kv_heads)),
        ("llama.rope.freq_base", MetaValue::F32(10000.0)),
        ("llama.rope.dimension_count", u32v(s.head_dim())),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        ),
        ("llama.vocab_size", u32v(s.vocab)),
    ];
    m.extend(vocab::tokenizer_metadata(s.vocab));
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Every tensor in file order, with how its values are drawn (call on a checked spec).
fn plan(s: &SyntheticSpec) -> Vec<(TensorEntry, Init)> {
    let ty = s.weight_type;
    let (e, kv, ff) = (
        s.n_embd as u64,
        (s.n_kv_heads * s.head_dim()) as u64,
        s.n_ff as u64,
    );
    let matrix = |name: &str, cols: u64, rows: u64| {
        let entry = TensorEntry {
            name: name.to_string(),
            dims: vec![cols, rows],
            ty: row_type(ty, cols),
        };
        let std = 1.0 / (cols as f32).sqrt();
        (entry, Init::Normal { mean: 0.0, std })
    };
    let norm = |name: &str| {
        let entry = TensorEntry {
            name: name.to_string(),
            dims: vec![e],
            ty: GgmlType::F32,
        };
        (
            entry,
            Init::Normal {
                mean: 1.0,
                std: 0.1,
            },
        )
    };
    let mut out = vec![matrix(TOKEN_EMBD, e, s.vocab as u64)];
    for l in 0..s.n_layers {
        let n = LayerNames::new(l);
        out.extend([
            norm(&n.attn_norm),
            matrix(&n.attn_q, e, e),
            matrix(&n.attn_k, e, kv),
            matrix(&n.attn_v, e, kv),
            matrix(&n.attn_output, e, e),
            norm(&n.ffn_norm),
            matrix(&n.ffn_gate, e, ff),
            matrix(&n.ffn_up, e, ff),
            matrix(&n.ffn_down, ff, e),
        ]);
    }
    out.push(norm(OUTPUT_NORM));
    if s.untied_output {
        out.push(matrix(OUTPUT, e, s.vocab as u64));
    }
    out
}

/// The file's layout: header bytes, every tensor's offset and size, the total size.
pub fn synthetic_layout(spec: &SyntheticSpec) -> Result<GgufLayout, SynthError> {
    spec.check()?;
    let entries: Vec<TensorEntry> = plan(spec).into_iter().map(|(e, _)| e).collect();
    Ok(GgufLayout::new(&metadata(spec), &entries)?)
}

/// The exact size in bytes of the file [`write_synthetic`] would write, without writing it.
pub fn synthetic_file_size(spec: &SyntheticSpec) -> Result<u64, SynthError> {
    Ok(synthetic_layout(spec)?.file_size)
}

/// Stream the model for `spec` and `seed` to `out`, computing `threads` blocks of rows at a
/// time; `progress(done, total)` is called after each block with the bytes written so far.
/// Returns `out` (flushed).
pub fn write_synthetic<W: Write>(
    spec: &SyntheticSpec,
    seed: u64,
    threads: usize,
    out: W,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<W, SynthError> {
    let layout = synthetic_layout(spec)?;
    write_laid_out(spec, &layout, seed, threads, out, progress)
}

/// [`write_synthetic`] with the layout already computed.
fn write_laid_out<W: Write>(
    spec: &SyntheticSpec,
    layout: &GgufLayout,
    seed: u64,
    threads: usize,
    out: W,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<W, SynthError> {
    weights::check_quantizer(spec.weight_type)?;
    let inits: Vec<Init> = plan(spec).into_iter().map(|(_, i)| i).collect();
    let mut w = GgufStreamWriter::new(out, layout)?;
    let total = layout.file_size;
    progress(w.position(), total);
    weights::write_tensors(
        &layout.tensors,
        &inits,
        seed,
        threads,
        &mut w,
        &mut |done| progress(done, total),
    )?;
    Ok(w.finish()?)
}

/// Build the model for `spec` and `seed` in memory (for tests and tiny models).
///
/// # Panics
/// On a spec that [`SyntheticSpec::check`] rejects: specs come from test code.
pub fn synthetic_llama(spec: &SyntheticSpec, seed: u64) -> Vec<u8> {
    match write_synthetic(spec, seed, 1, Vec::new(), &mut |_, _| {}) {
        Ok(bytes) => bytes,
        Err(e) => panic!("synthetic model {spec:?}: {e}"),
    }
}
