//! The `bench` subcommand's arguments: one variant per benchmark.

use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::ModelArgs;
use super::args::{parse_kv_page, parse_ppl_chunks, parse_runs, parse_size_arg, parse_tokens};

/// One entry of `--page-sweep`: a page size, or nothing (an empty list skips the sweep).
fn parse_sweep_page(s: &str) -> Result<Option<u32>, String> {
    if s.trim().is_empty() {
        Ok(None)
    } else {
        parse_kv_page(s).map(Some)
    }
}

/// A share in percent, `25` or `25%`, as a fraction (0 to 1).
fn parse_cache_share(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let v: f64 = t
        .strip_suffix('%')
        .unwrap_or(t)
        .trim()
        .parse()
        .map_err(|_| format!("--cache-share must be a percentage from 0 to 100, got {s:?}"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("--cache-share must be from 0 to 100%, got {s:?}"));
    }
    Ok(v / 100.0)
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchKind,
}

#[derive(Subcommand, Debug)]
pub enum BenchKind {
    /// Streaming under budgets (scenario S1: 16 MiB, direct I/O, cold cache; a half-model
    /// budget; all resident): ms/token, flash bytes/token, overlap, ring vs raw cold read.
    Stream {
        #[command(flatten)]
        model: ModelArgs,
        /// Budgets to run besides all-resident (default: 16MiB and one holding half the model).
        #[arg(long, value_delimiter = ',', value_parser = parse_size_arg)]
        budgets: Vec<u64>,
        /// Prompt tokens.
        #[arg(long, default_value = "64", value_parser = parse_tokens)]
        prompt_tokens: usize,
        /// Decoded tokens.
        #[arg(short = 'n', long, default_value = "128", value_parser = parse_tokens)]
        n: usize,
        /// Repetitions (medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        runs: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The KV cache on flash (scenario S2: a long prompt of natural prose under 16 MiB, exact
    /// attention and page selection, without and with a host cache), session resume, the page
    /// hit-rate model's error, page sizes side by side, and the goals checked against
    /// the figures. The host cache of each run is set by the bench (--dram-budget is not used).
    Kv {
        #[command(flatten)]
        model: ModelArgs,
        /// Text to take the prompt from (default: data/ in the repo).
        #[arg(long)]
        text: Option<PathBuf>,
        /// Prompt tokens.
        #[arg(long, default_value = "4096", value_parser = parse_tokens)]
        prompt_tokens: usize,
        /// Decoded tokens.
        #[arg(short = 'n', long, default_value = "128", value_parser = parse_tokens)]
        n: usize,
        /// Repetitions (medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        runs: usize,
        /// Runs of the exact S2 row (no host cache) that prefill the prompt cold, from 1 to
        /// --runs (default: every run of every row). The first of them saves a session; every
        /// other S2 run resumes the prompt from it and prefills only its last token, so a long
        /// prompt is prefilled cold this many times instead of once per run. The decode is
        /// the same either way (prefill attends exactly in every mode); the table says which
        /// runs were cold.
        #[arg(long, value_parser = parse_runs)]
        cold_runs: Option<usize>,
        /// Host cache of the second set of S2 rows: the weights that stream each token plus
        /// this share of the KV bytes that live on flash at the end of the run, e.g. 25%
        /// (0: only the rows without a host cache). The device budget is --gpu-budget, else
        /// 16MiB.
        #[arg(long, default_value = "25%", value_parser = parse_cache_share)]
        cache_share: f64,
        /// Page sizes to compare at the S2 setting (comma list; empty: skip); the report
        /// names the one its rule picks.
        #[arg(long, value_delimiter = ',', default_value = "16,32,64,128,256", value_parser = parse_sweep_page)]
        page_sweep: Vec<Option<u32>>,
        /// Prompt tokens of the page sweep (each size prefills cold; default: --prompt-tokens).
        #[arg(long, value_parser = parse_tokens)]
        page_sweep_tokens: Option<usize>,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Perplexity of a text at a long context under exact attention and each page selection
    /// mode of `bench kv`, all resident, with each mode's loss against exact paired chunk by
    /// chunk (times nothing, so it can run apart from the timed benchmarks).
    Ppl {
        #[command(flatten)]
        model: ModelArgs,
        /// Text to score (default: `bench kv`'s text, data/ in the repo).
        #[arg(long)]
        text: Option<PathBuf>,
        /// Tokens of context of each chunk (as `bench kv`'s prompt).
        #[arg(long, default_value = "4096", value_parser = parse_tokens)]
        prompt_tokens: usize,
        /// Chunks per mode, at most what the text holds. The loss against exact is paired
        /// chunk by chunk, so its standard error needs 2 or more.
        #[arg(long, default_value = "4", value_parser = parse_ppl_chunks)]
        chunks: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Scenario S3: a 7B-shaped Q4_K model (written once to the cache directory) under a
    /// 512 MiB device budget and a 1 GiB host cache, each run its own process: ms/token against
    /// the I/O bound, peak device bytes and peak resident memory against the budgets.
    S3 {
        /// The model file (default: synth-7b-q4k.gguf in the cache directory, written if absent).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Repetitions (medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        runs: usize,
        /// Tokens generated per run.
        #[arg(short = 'n', long, default_value = "8", value_parser = parse_tokens)]
        n: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Several tokens per streamed layer: 1, 2, 4 and 8 sequences decoded together under the S1
    /// budget (flash bytes per token, aggregate tok/s, per-request latency, each sequence's ids
    /// checked against decoding it alone), prompt-lookup drafts against plain decoding on a
    /// prompt that repeats its input, and the goal lines. Exits non-zero when outputs differ.
    Batch {
        #[command(flatten)]
        model: ModelArgs,
        /// Tokens generated per sequence (at least 2: the first comes from the prefill).
        #[arg(short = 'n', long, default_value = "24", value_parser = parse_tokens)]
        n: usize,
        /// Repetitions (medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        runs: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Resident prefill and decode tok/s per weight type on the default model's shape
    /// (synthetic weights, written once to the cache directory).
    Types {
        /// A model whose shape (layers, widths, heads, vocabulary) the synthetic models take
        /// (default: the default model's shape; its file is not needed).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Types to compare (default: every supported quantized type and F16).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// Repetitions (medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        runs: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Everything resident on the GPU: prefill and decode tok/s, matvec GB/s against a copy.
    Resident {
        #[command(flatten)]
        model: ModelArgs,
        /// Repetitions (the median is reported).
        #[arg(long, default_value = "5", value_parser = parse_runs)]
        runs: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The matrix kernels' thread-to-row layouts for this adapter's class, side by side in one
    /// process: GB/s of every kind of decode product per layout, the default marked.
    Layouts {
        #[command(flatten)]
        model: ModelArgs,
        /// Rounds (each times every layout once in turn; medians are reported).
        #[arg(long, default_value = "9", value_parser = parse_runs)]
        rounds: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// The worker threads of Mesa's software rasterizer (LP_NUM_THREADS) side by side: decode
    /// and prefill of child runs, all resident and under a budget, in rounds.
    Threads {
        /// GGUF model file (default: $FLASHLM_MODEL, else the cached SmolLM2-135M-Instruct).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Thread counts besides the driver's own (one per CPU), e.g. 4,6 (default: twice and
        /// three times the CPUs).
        #[arg(long, value_delimiter = ',')]
        threads: Vec<usize>,
        /// Device budget of the streamed scenario (0: only all resident).
        #[arg(long, default_value = "16MiB", value_parser = parse_size_arg)]
        budget: u64,
        /// Decoded tokens per run.
        #[arg(short = 'n', long, default_value = "64", value_parser = parse_tokens)]
        n: usize,
        /// Rounds (each runs every count and scenario once in turn; medians are reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        rounds: usize,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// One table of the performance model's predicted ms/token (and TTFT) against the measured
    /// figures for every scenario (resident, S1, half-model, S2, S3), from the JSON files the
    /// other bench commands wrote; a missing file or field reads "not measured".
    Summary {
        /// Folder of resident.json, stream.json, kv.json and s3.json.
        #[arg(long, default_value = "bench-out")]
        dir: PathBuf,
        /// Write the table as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Flash read throughput from a cold page cache: raw read, direct and mmap over piece size
    /// × threads, and the staging ring into device buffers.
    Io {
        /// GGUF model file (default: $FLASHLM_MODEL, else the cached SmolLM2-135M-Instruct).
        #[arg(long, short = 'm')]
        model: Option<PathBuf>,
        /// Bytes of tensor data to read per measurement (e.g. 64MiB, 16M, 1e8).
        #[arg(long, default_value = "64MiB", value_parser = crate::flash::parse_size)]
        bytes: u64,
        /// Repetitions of each cheap measurement (the median is reported).
        #[arg(long, default_value = "3", value_parser = parse_runs)]
        repeats: usize,
        /// Skip the staging-ring path (no GPU needed).
        #[arg(long)]
        no_gpu: bool,
        /// Write the figures as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write an SVG plot of GB/s against piece size.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
}

impl BenchKind {
    /// The files the bench writes when it ends (`--json`, and `--plot` for `io`).
    pub fn outputs(&self) -> Vec<(&'static str, &Option<PathBuf>)> {
        match self {
            Self::Io { json, plot, .. } => vec![("--json", json), ("--plot", plot)],
            Self::Stream { json, .. }
            | Self::Kv { json, .. }
            | Self::Ppl { json, .. }
            | Self::S3 { json, .. }
            | Self::Batch { json, .. }
            | Self::Types { json, .. }
            | Self::Resident { json, .. }
            | Self::Layouts { json, .. }
            | Self::Threads { json, .. }
            | Self::Summary { json, .. } => vec![("--json", json)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_cache_share, parse_sweep_page};

    #[test]
    fn cache_share_is_a_percentage() {
        assert_eq!(parse_cache_share("25%"), Ok(0.25));
        assert_eq!(parse_cache_share(" 50 "), Ok(0.5));
        assert_eq!(parse_cache_share("0"), Ok(0.0));
        assert_eq!(parse_cache_share("100%"), Ok(1.0));
        for bad in ["101%", "-1", "lots", "", "nan"] {
            assert!(parse_cache_share(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_page_sweep_is_no_sweep() {
        assert_eq!(parse_sweep_page(""), Ok(None));
        assert_eq!(parse_sweep_page("64"), Ok(Some(64)));
        for bad in ["0", "2048", "x"] {
            assert!(parse_sweep_page(bad).is_err(), "{bad:?}");
        }
    }

    /// clap's own checks of every subcommand (unique names, valid defaults): in release builds
    /// clap skips them, so a clash such as a second `--ctx` would pass silently.
    #[test]
    fn the_command_line_definition_is_consistent() {
        use clap::CommandFactory;
        crate::cli::Cli::command().debug_assert();
    }
}
