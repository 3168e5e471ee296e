//! `synth`: write a llama GGUF of any shape with seeded random weights, streamed to disk with
//! a progress line on stderr.

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;

use super::CliResult;
use super::progress::{Progress, Unit};
use crate::flash::format_size;
use crate::gguf::{GgmlType, ggml_type_name};
use crate::model::synthetic::{
    MAX_SYNTHETIC_VOCAB, SYNTHETIC_MIN_VOCAB, SyntheticSpec, synthetic_layout, write_synthetic_file,
};

/// Arguments of `flashlm synth`.
#[derive(Args, Debug)]
pub struct SynthArgs {
    /// Architecture (only llama).
    #[arg(long, default_value = "llama", value_parser = ["llama"])]
    pub arch: String,
    /// Transformer blocks.
    #[arg(long, value_parser = |s: &str| bounded(s, "--layers", 1, 4096))]
    pub layers: usize,
    /// Embedding size (a multiple of --heads and of the type's block length).
    #[arg(long, value_parser = |s: &str| bounded(s, "--dim", 2, 1 << 20))]
    pub dim: usize,
    /// Feed-forward size (a multiple of the type's block length).
    #[arg(long, value_parser = |s: &str| bounded(s, "--ffn", 1, 1 << 22))]
    pub ffn: usize,
    /// Attention heads.
    #[arg(long, value_parser = |s: &str| bounded(s, "--heads", 1, 1 << 16))]
    pub heads: usize,
    /// Key/value heads (dividing --heads; default: --heads).
    #[arg(long, value_parser = |s: &str| bounded(s, "--kv-heads", 1, 1 << 16))]
    pub kv_heads: Option<usize>,
    /// Vocabulary size (byte-level BPE, filled with generated merged tokens).
    #[arg(long, default_value = "32000", value_parser = parse_vocab)]
    pub vocab: usize,
    /// Weight type of every matrix (norms are F32): any type the quantizer supports, e.g.
    /// F32, F16, BF16, Q8_0, Q4_0, Q4_1.
    #[arg(long = "type", default_value = "Q4_0", value_parser = parse_type)]
    pub weight_type: GgmlType,
    /// Output file (written as FILE.part, renamed when complete).
    #[arg(long, short = 'o')]
    pub output: PathBuf,
    /// Seed of the weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Context length stored in the file.
    #[arg(long, default_value = "4096", value_parser = |s: &str| bounded(s, "--ctx", 1, 1 << 24))]
    pub ctx: usize,
    /// Write a separate output head instead of tying it to the token embedding.
    #[arg(long)]
    pub untied_output: bool,
    /// Threads drawing and quantizing weights (default: the CPU count, at most 8).
    #[arg(long, value_parser = |s: &str| bounded(s, "--threads", 1, 256))]
    pub threads: Option<usize>,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
    /// Print the file's size and tensor count without writing it.
    #[arg(long)]
    pub dry_run: bool,
}

fn bounded(s: &str, what: &str, lo: usize, hi: usize) -> Result<usize, String> {
    let v: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("{what} must be a whole number from {lo} to {hi}, got {s:?}"))?;
    if !(lo..=hi).contains(&v) {
        return Err(format!("{what} must be from {lo} to {hi}, got {v}"));
    }
    Ok(v)
}

fn parse_vocab(s: &str) -> Result<usize, String> {
    bounded(s, "--vocab", SYNTHETIC_MIN_VOCAB, MAX_SYNTHETIC_VOCAB)
}

/// A ggml type by name (any case); a known type this build cannot read or write is an error
/// that says so.
pub fn parse_type(s: &str) -> Result<GgmlType, String> {
    let name = s.trim();
    let supported = || {
        GgmlType::ALL
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let id =
        (0..64u32).find(|&id| ggml_type_name(id).is_some_and(|n| n.eq_ignore_ascii_case(name)));
    match id.map(GgmlType::from_id) {
        Some(Ok(ty)) => Ok(ty),
        Some(Err(known)) => Err(format!(
            "type {} is not supported by this build (supported: {})",
            known.unwrap_or(name),
            supported()
        )),
        None => Err(format!(
            "unknown type {name:?} (supported: {})",
            supported()
        )),
    }
}

impl SynthArgs {
    pub fn spec(&self) -> SyntheticSpec {
        SyntheticSpec {
            n_layers: self.layers,
            n_embd: self.dim,
            n_heads: self.heads,
            n_kv_heads: self.kv_heads.unwrap_or(self.heads),
            n_ff: self.ffn,
            vocab: self.vocab,
            weight_type: self.weight_type,
            ctx: self.ctx,
            untied_output: self.untied_output,
        }
    }
}

fn peak_rss() -> Option<u64> {
    crate::flash::peak_rss_bytes()
}

fn check_output(path: &Path, force: bool) -> CliResult<()> {
    if path.is_dir() {
        return Err(format!("{} is a directory", path.display()).into());
    }
    if path.exists() && !force {
        return Err(format!("{} exists (pass --force to replace it)", path.display()).into());
    }
    Ok(())
}

pub fn synth(a: &SynthArgs) -> CliResult<()> {
    let spec = a.spec();
    let layout = synthetic_layout(&spec)?;
    let n_weights: u64 = layout
        .tensors
        .iter()
        .map(|t| t.entry.dims.iter().product::<u64>())
        .sum();
    let what = format!(
        "{} ({} bytes), {} tensors, {:.3} B weights in {}",
        format_size(layout.file_size),
        layout.file_size,
        layout.tensors.len(),
        n_weights as f64 / 1e9,
        spec.weight_type
    );
    if a.dry_run {
        println!("{}: {what}", a.output.display());
        return Ok(());
    }
    check_output(&a.output, a.force)?;
    let threads = a.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get().min(8))
            .unwrap_or(1)
    });
    eprintln!("writing {}: {what}", a.output.display());
    let start = Instant::now();
    let mut progress = Progress::new(Unit::Bytes);
    let size = write_synthetic_file(&spec, a.seed, threads, &a.output, &mut |done, total| {
        progress.update(done, total)
    })?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wrote {}: {} in {secs:.1} s ({}/s){}",
        a.output.display(),
        format_size(size),
        format_size((size as f64 / secs.max(1e-9)) as u64),
        peak_rss()
            .map(|b| format!(", peak memory {}", format_size(b)))
            .unwrap_or_default()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_parse_by_name() {
        assert_eq!(parse_type("q8_0"), Ok(GgmlType::Q8_0));
        assert_eq!(parse_type("F16"), Ok(GgmlType::F16));
        for ty in GgmlType::ALL {
            assert_eq!(parse_type(ty.name()), Ok(ty));
        }
        let err = parse_type("nope").unwrap_err();
        assert!(
            err.contains("unknown type") && err.contains("Q4_1"),
            "{err}"
        );
        // A known type without a reader is named as such (when this build lacks it).
        if let Err(Some(name)) = GgmlType::from_id(39) {
            let err = parse_type("mxfp4").unwrap_err();
            assert!(
                err.contains(&format!("type {name} is not supported")),
                "{err}"
            );
        }
    }

    #[test]
    fn peak_rss_is_read() {
        assert!(peak_rss().is_some_and(|b| b > 0));
    }
}
