//! `bench kv` end to end on a small synthetic model: every section of the report is there, with
//! finite figures that agree with what was asked (rows per mode and host cache, one context
//! per sweep point, the page rule, the goal lines); `bench ppl` likewise; and the host cache
//! holds only what streams.
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use flashlm::bench::kv::{KvBenchOptions, MODES, run};
use flashlm::engine::{Engine, EngineOptions};
use flashlm::flash::source::FlashSource;
use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
use flashlm::gguf::GgmlType;
use flashlm::model::load_model;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::KvSelect;

fn scratch(name: &str) -> PathBuf {
    common::scratch(&format!("bench-kv-{name}"))
}

fn spec() -> SyntheticSpec {
    SyntheticSpec {
        // Weights well above the streaming minimum (layer slots, staging ring, head chunks),
        // so that the smallest budget streams them and the KV cache.
        n_layers: 4,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 256,
        vocab: 400,
        weight_type: GgmlType::Q8_0,
        ctx: 1024,
        untied_output: false,
    }
}

fn base(dir: &std::path::Path) -> EngineOptions {
    EngineOptions {
        ubatch: 32,
        ring_slots: 3,
        ring_chunk: 8192,
        head_chunk: Some(16384),
        kv_page: Some(16),
        kv_dir: Some(dir.join("kv")),
        ..Default::default()
    }
}

/// Words in a fixed pseudo-random order: enough text for the prompt, and for two perplexity
/// chunks of its length.
fn text() -> String {
    let words = [
        "the", "morning", "was", "fine", "and", "she", "walked", "along", "shore", "with", "her",
        "sister", "who", "spoke", "of", "letters", "ships", "rain", "captain", "house",
    ];
    let mut s = String::new();
    let mut x = 7u32;
    for i in 0..600 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        s.push_str(words[(x >> 16) as usize % words.len()]);
        s.push(if i % 11 == 10 { '.' } else { ' ' });
    }
    s
}

#[test]
fn bench_kv_reports_every_section_with_finite_figures() {
    if common::gpu().is_none() {
        return;
    }
    let t0 = std::time::Instant::now();
    let dir = scratch("smoke");
    let model_path = dir.join("model.gguf");
    std::fs::write(&model_path, synthetic_llama(&spec(), 5)).unwrap();
    let text_path = dir.join("text.txt");
    std::fs::write(&text_path, text()).unwrap();
    let m = load_model(&model_path).unwrap();
    let base = base(&dir);
    let prompt_tokens = 96;
    // S2's context (prompt + n) is also the model sweep's largest (prompt + 4 + 24): at the
    // smallest budget that takes every mode there, the KV cache streams.
    let n_gen = 28;
    let budget = MODES
        .iter()
        .map(|mode| {
            let mut o = base.clone();
            o.kv_select = (*mode != "exact").then(|| KvSelect::parse(mode, 2).unwrap());
            common::min_budget(
                &m.gguf,
                &EngineOptions {
                    ctx: Some(prompt_tokens + n_gen),
                    ..o.clone()
                },
            )
        })
        .max()
        .unwrap();
    let o = KvBenchOptions {
        model: &m,
        base,
        io: IoMode::Mmap,
        budget,
        text: Some(text_path),
        prompt_tokens,
        n_gen,
        runs: 1,
        cache_share: 0.5,
        page_sweep: vec![16],
        page_sweep_tokens: Some(prompt_tokens - 8),
        cold_runs: Some(1),
    };
    let r = run(&o).unwrap();
    let md = r.to_markdown();
    eprintln!("{md}");

    // S2: each mode without and with a host cache, in order.
    assert_eq!(r.rows.len(), 2 * MODES.len());
    for (i, row) in r.rows.iter().enumerate() {
        assert_eq!(row.mode, MODES[i / 2]);
        assert_eq!(row.runs, 1);
        let f = [
            row.ms_per_token,
            row.kv_flash_bytes_per_token,
            row.weight_bytes_per_token,
            row.kv_bytes_written_per_token,
            row.hit_rate,
            row.hit_rate_predicted,
            row.kv_flash_predicted,
            row.overlap_efficiency,
        ];
        assert!(f.iter().all(|v| v.is_finite() && *v >= 0.0), "{row:?}");
        assert!(row.ms_per_token > 0.0, "{row:?}");
        // One cold run (the exact row without a host cache); every other run resumed the
        // prompt from its session, and has no cold TTFT.
        if i == 0 {
            assert_eq!(row.cold_runs, 1, "{row:?}");
            assert!(row.ttft_ms > 0.0 && row.ttft_ms.is_finite(), "{row:?}");
        } else {
            assert_eq!(row.cold_runs, 0, "{row:?}");
            assert!(row.ttft_ms.is_nan(), "{row:?}");
        }
        assert!((0.0..=1.0).contains(&row.hit_rate), "{row:?}");
        if i % 2 == 0 {
            assert_eq!(row.dram_budget, 0, "{row:?}");
            assert_eq!(row.hit_rate, 0.0, "no host cache, no hits: {row:?}");
            assert_eq!(row.hit_rate_predicted, 0.0, "{row:?}");
        } else {
            // The streamed weights plus half of the streamed KV.
            assert!(row.streamed_kv_bytes > 0, "the KV cache streams: {row:?}");
            assert_eq!(
                row.dram_budget,
                row.streamed_weight_bytes + (row.streamed_kv_bytes as f64 * 0.5).round() as u64
            );
            assert_eq!(row.kv_cache_share, 0.5);
        }
    }
    let (exact, cached) = (&r.rows[0], &r.rows[1]);
    assert!(exact.kv_flash_bytes_per_token > 0.0, "{exact:?}");
    assert!(exact.kv_bytes_written_per_token > 0.0, "{exact:?}");
    // With the host cache, exact attention hits it and reads fewer KV bytes from flash; the
    // weights stream from DRAM.
    assert!(cached.hit_rate > 0.0, "{cached:?}");
    assert!(cached.hit_rate_predicted > 0.0, "{cached:?}");
    assert!(
        cached.kv_flash_bytes_per_token < exact.kv_flash_bytes_per_token,
        "{cached:?}"
    );
    assert!(cached.weight_bytes_per_token < exact.weight_bytes_per_token);

    // S1, TTFT.
    assert!(r.s1_ms_per_token > 0.0 && r.s1_ms_per_token.is_finite());
    assert!(r.raw_cold_read_gb_s > 0.0 && r.raw_cold_read_gb_s.is_finite());
    assert!(r.exact_over_s1_plus_kv.is_finite() && r.exact_over_s1_plus_kv > 0.0);
    assert!(r.ttft_cold_ms > 0.0 && r.ttft_resumed_ms > 0.0 && r.ttft_speedup.is_finite());

    // The model sweep: the prompt's context only (1024 and 2048 are above it), once each.
    assert_eq!(r.model.len(), 4 + 2);
    for p in &r.model {
        assert_eq!(p.ctx, prompt_tokens, "{p:?}");
        assert_eq!(p.runs, 1);
        let f = [
            p.hit_predicted,
            p.hit_measured,
            p.kv_flash_predicted,
            p.kv_flash_measured,
            p.bytes_error,
        ];
        assert!(f.iter().all(|v| v.is_finite() && *v >= 0.0), "{p:?}");
    }
    let full = r
        .model
        .iter()
        .find(|p| p.mode == "exact" && p.kv_cache_share == 1.0)
        .unwrap();
    assert!(
        full.hit_measured > 0.5,
        "the whole streamed KV fits: {full:?}"
    );

    // Page sizes and the rule's pick.
    assert_eq!(r.pages.len(), 1);
    assert_eq!(r.pages[0].prompt_tokens, prompt_tokens - 8);
    assert_eq!(r.pages[0].runs, 1);
    assert!(r.pages[0].ms_per_token > 0.0 && r.pages[0].kv_flash_bytes_per_token > 0.0);
    assert_eq!(r.recommended_page_tokens, Some(16));

    // Goal lines, each with its verdict.
    assert_eq!(r.goals.len(), 2);
    assert!(r.goals.iter().all(|g| g.met.is_some()), "{:?}", r.goals);
    for needle in [
        "| exact | none |",
        "| cold | ",
        "| resumed | - |",
        "| quest:50% |",
        "every size once a round",
        "Page hit-rate model",
        "Recommended: **16 tokens per page**",
        "Goals, from the figures above",
        "resumed TTFT >= 10x",
    ] {
        assert!(md.contains(needle), "{needle:?} missing from\n{md}");
    }
    serde_json::to_string(&r).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("bench kv smoke: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Bytes read once at load and embedding rows bypass the host cache: with everything
/// resident, nothing streams and the cache stays empty however large it is.
#[test]
fn host_cache_holds_only_what_streams() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("cache");
    let path = dir.join("model.gguf");
    std::fs::write(&path, synthetic_llama(&spec(), 5)).unwrap();
    let m = load_model(&path).unwrap();
    let f = FlashFile::open(
        &path,
        ReaderOptions {
            mode: IoMode::Mmap,
            threads: 2,
            chunk: 64 * 1024,
        },
    )
    .unwrap();
    let src = Arc::new(FlashSource::new(f, 64 << 20));
    let mut o = base(&dir);
    o.ctx = Some(128);
    let mut e = Engine::with_source(m.gguf.clone(), src.clone(), &o).unwrap();
    assert!(e.plan.streamed_layers().is_empty(), "{}", e.placement);
    e.forward(&[1, 2, 3, 4]).unwrap();
    assert_eq!(src.dram_stats().0, 0, "{}", e.placement);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_ppl_scores_every_mode_against_exact() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("ppl");
    let model_path = dir.join("model.gguf");
    std::fs::write(&model_path, synthetic_llama(&spec(), 5)).unwrap();
    let text_path = dir.join("text.txt");
    std::fs::write(&text_path, text()).unwrap();
    let m = load_model(&model_path).unwrap();
    let o = flashlm::bench::ppl::PplOptions {
        model: &m,
        base: base(&dir),
        text: Some(text_path),
        ctx: 96,
        chunks: 2,
    };
    let r = flashlm::bench::ppl::run(&o).unwrap();
    let md = r.to_markdown();
    eprintln!("{md}");
    // Every mode over the two chunks, exact first with a loss of 0; the goal reads quest:25%.
    assert_eq!(r.rows.len(), MODES.len());
    for (p, mode) in r.rows.iter().zip(MODES) {
        assert_eq!(p.mode, mode);
        assert_eq!(p.chunks, 2, "{p:?}");
        assert!(
            p.ppl.is_finite() && p.ppl > 1.0 && p.stderr.is_finite(),
            "{p:?}"
        );
        assert!(p.loss_pct.is_finite() && p.paired_loss_stderr_pct.is_some());
    }
    assert_eq!(r.rows[0].loss_pct, 0.0);
    assert!(r.goal.met.is_some());
    assert_eq!(md.matches("\n| quest").count(), 4, "{md}");
    // No chunk: a clear error, not an empty table.
    let none = flashlm::bench::ppl::PplOptions { chunks: 0, ..o };
    assert!(flashlm::bench::ppl::run(&none).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
