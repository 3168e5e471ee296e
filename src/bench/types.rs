//! `bench types`: resident prefill and decode speed per weight type on the default model's shape
//! (SmolLM2-135M: 30 layers, d 576, FFN 1536, 9/3 heads, vocab 49152, tied head), with synthetic
//! weights. Rows that are not whole 256-weight super-blocks (the 576-wide ones) fall back as
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
    pub rows: Vec<TypeRow>,
}

fn spec(ty: GgmlType) -> SyntheticSpec {
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

pub fn run(base: &EngineOptions, types: &[GgmlType], runs: usize) -> BenchResult<TypesReport> {
    let dir = crate::paths::cache_dir().join("bench-types");
    std::fs::create_dir_all(&dir)?;
    let mut rows = Vec::new();
    let mut adapter = String::new();
    for &ty in types {
        let s = spec(ty);
        let path = dir.join(format!("smollm2-shape-{ty}.gguf"));
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
            stored_as: format!("{} / {}", row_type(ty, 576), row_type(ty, 1536)),
            file_bytes: size,
            prefill_tok_s: r.prefill_tok_s,
            decode_tok_s: r.decode_tok_s,
            matvec_gb_s: r.matvec_gb_s,
        });
    }
    Ok(TypesReport {
        adapter,
        runs,
        rows,
    })
}

impl TypesReport {
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "adapter {}; the default model's shape with synthetic weights, everything resident; 64-token prompt, 64 tokens decoded, median of {} runs\n\n\
             | type | rows of 576 / 1536 stored as | file bytes | prefill tok/s | decode tok/s | matvec GB/s |\n\
             |---|---|---|---|---|---|\n",
            self.adapter, self.runs
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
