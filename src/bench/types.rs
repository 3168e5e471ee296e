//! `bench types`: resident prefill and decode speed per weight type on one model's shape (by
//! default SmolLM2-135M's: 30 layers, d 576, FFN 1536, 9/3 heads, vocab 49152, tied head; `-m`
//! takes another model's), with synthetic weights. Rows that are not whole 256-weight super-blocks (the 576-wide ones) fall back as
//! llama.cpp's quantizer does ([`crate::model::synthetic::row_type`]).

use std::sync::Arc;

use serde::Serialize;

use super::resident;
use crate::engine::EngineOptions;
use crate::gguf::{GgmlType, GgufFile};
use crate::model::synthetic::{SyntheticSpec, row_type, write_synthetic_file};
use crate::model::tokenizer::Tokenizer;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The types compared.
pub const TYPES: [GgmlType; 13] = [
    GgmlType::F16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

#[derive(Debug, Clone, Serialize)]
pub struct TypeRow {
    pub ty: String,
    /// Types the 576-wide and 1536-wide rows are stored in.
    pub stored_as: String,
    pub file_bytes: u64,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    pub matvec_gb_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TypesReport {
    pub adapter: String,
    pub runs: usize,
    /// Rows of the embedding width / of the FFN width.
    pub widths: (u64, u64),
    pub rows: Vec<TypeRow>,
}

/// The default model's shape (SmolLM2-135M), in `ty`.
pub fn default_shape(ty: GgmlType) -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 30,
        n_embd: 576,
        n_heads: 9,
        n_kv_heads: 3,
        n_ff: 1536,
        vocab: 49152,
        weight_type: ty,
        ctx: 2048,
        untied_output: false,
    }
}

/// The shape of a model's config as a llama model (`bench types -m`).
pub fn shape_of(cfg: &crate::model::config::ModelConfig) -> SyntheticSpec {
    SyntheticSpec {
        n_layers: cfg.n_layers,
        n_embd: cfg.n_embd,
        n_heads: cfg.n_heads,
        n_kv_heads: cfg.n_kv_heads,
        n_ff: cfg.n_ff,
        vocab: cfg
            .vocab_size
            .max(crate::model::synthetic::SYNTHETIC_MIN_VOCAB),
        weight_type: GgmlType::F16,
        ctx: cfg.context_length.clamp(1, 2048),
        untied_output: false,
    }
}

/// Every type of `types` on `shape` (its weight type is replaced by each).
pub fn run(
    base: &EngineOptions,
    shape: &SyntheticSpec,
    types: &[GgmlType],
    runs: usize,
) -> BenchResult<TypesReport> {
    let dir = crate::paths::cache_dir().join("bench-types");
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    let mut adapter = String::new();
    let (d, ff) = (shape.n_embd as u64, shape.n_ff as u64);
    for &ty in types {
        let s = SyntheticSpec {
            weight_type: ty,
            ..shape.clone()
        };
        let path = dir.join(format!(
            "shape-{}x{}x{}-{}-{}-v{}-{ty}.gguf",
            s.n_layers, s.n_embd, s.n_ff, s.n_heads, s.n_kv_heads, s.vocab
        ));
        let size = crate::model::synthetic::synthetic_file_size(&s)?;
        if std::fs::metadata(&path).map(|m| m.len()).ok() != Some(size) {
            write_synthetic_file(&s, 11, 2, &path, &mut |_, _| {})?;
        }
        let gguf = Arc::new(GgufFile::open(&path)?);
        let tk = Tokenizer::from_gguf(&gguf)?;
        let r = resident(gguf, base, &tk, runs)?;
        eprintln!(
            "{ty}: prefill {:.1} tok/s, decode {:.2} tok/s",
            r.prefill_tok_s, r.decode_tok_s
        );
        adapter = r.adapter.clone();
        rows.push(TypeRow {
            ty: ty.to_string(),
            stored_as: format!("{} / {}", row_type(ty, d), row_type(ty, ff)),
            file_bytes: size,
            prefill_tok_s: r.prefill_tok_s,
            decode_tok_s: r.decode_tok_s,
            matvec_gb_s: r.matvec_gb_s,
        });
    }
    Ok(TypesReport {
        adapter,
        runs,
        widths: (d, ff),
        rows,
    })
}

impl TypesReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {}; synthetic weights, everything resident; 64-token prompt, 64 tokens decoded, median of {} runs\n\n\
             | type | rows of {} / {} stored as | file bytes | prefill tok/s | decode tok/s | matvec GB/s |\n\
             |---|---|---|---|---|---|\n",
            self.adapter, self.runs, self.widths.0, self.widths.1
        );
        for r in &self.rows {
            s.push_str(&format!(
                "| {} | {} | {} | {:.1} | {:.2} | {:.3} |\n",
                r.ty, r.stored_as, r.file_bytes, r.prefill_tok_s, r.decode_tok_s, r.matvec_gb_s
            ));
        }
        s
    }
}
