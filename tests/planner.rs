//! The planner's choices for a matrix of budgets: each plans within its budget, runs without
//! exceeding it, and gives the tokens of the all-resident run.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineError, EngineOptions, PlacementError};
use flashlm::flash::source::FlashSource;
use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::config::ModelConfig;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::choose::choose;
use flashlm::plan::perf::{Calibration, FlashRate, RunIo};
use flashlm::sampling::{Sampler, SamplerParams};

/// A machine where reads are slow next to compute for direct I/O and fast for mmap, so the
/// choice is not always the same.
fn calibration(direct_gb_s: f64, mmap_gb_s: f64) -> Calibration {
    Calibration {
        adapter: "test".into(),
        flash: vec![
            FlashRate {
                mode: "direct".into(),
                piece: 1 << 20,
                threads: 4,
                gb_s: direct_gb_s,
            },
            FlashRate {
                mode: "mmap".into(),
                piece: 1 << 20,
                threads: 4,
                gb_s: mmap_gb_s,
            },
        ],
        upload_gb_s: 4.0,
        matvec_gb_s: [("Q8_0".to_string(), 1.0)].into(),
        prefill_gb_s: [("Q8_0".to_string(), 4.0)].into(),
        dispatch_s: 20e-6,
        attn_gb_s: 1.0,
        overlap_beta: 0.3,
    }
}

fn greedy(e: &mut Engine, prompt: &[u32]) -> Vec<u32> {
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    e.generate(prompt, 6, &mut s, |_| false, |_| true)
        .unwrap()
        .0
}

#[test]
fn planner_choices_fit_and_run_for_every_budget() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 6,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 256,
        vocab: 2000,
        weight_type: GgmlType::Q8_0,
        ctx: 128,
        untied_output: true,
    };
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("planner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.gguf");
    std::fs::write(&path, synthetic_llama(&spec, 3)).unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let base = EngineOptions {
        ctx: Some(64),
        ring_chunk: 8192,
        head_chunk: 16384,
        ..Default::default()
    };
    let prompt: Vec<u32> = (0..9).map(|i| (i * 211 + 5) % 2000).collect();
    let mut resident = Engine::new(gguf.clone(), &base).unwrap();
    let want = greedy(&mut resident, &prompt);
    let all = resident.placement.total;
    drop(resident);
    let mut tiny = base.clone();
    tiny.gpu.budget = Some(1024);
    let min = match Engine::new(gguf.clone(), &tiny) {
        Err(EngineError::Placement(PlacementError::TooSmall { minimum, .. })) => minimum,
        other => panic!("expected the minimum, got {:?}", other.err()),
    };
    assert!(min < all);
    let io = RunIo {
        mode: String::new(),
        piece: 1 << 20,
        threads: 4,
        dram: 0,
        in_place: false,
    };
    let mut seen = std::collections::HashSet::new();
    for cal in [calibration(0.05, 2.0), calibration(5.0, 0.01)] {
        for k in 0..=4u64 {
            let budget = min + (all - min) * k / 4;
            let mut o = base.clone();
            o.gpu = GpuOptions {
                budget: Some(budget),
                ..Default::default()
            };
            let c = choose(
                &gguf,
                &cfg,
                &o.plan_options(),
                128 << 20,
                &cal,
                prompt.len(),
                &[1, 2, 3],
                &[IoMode::Direct, IoMode::Mmap],
                &io,
            )
            .unwrap_or_else(|| panic!("no plan for budget {budget}"));
            assert!(c.ms_per_token.is_finite() && c.ms_per_token > 0.0);
            seen.insert((c.prefetch, c.io.to_string()));
            o.prefetch = c.prefetch;
            let file = FlashFile::open(
                &path,
                ReaderOptions {
                    mode: c.io,
                    ..Default::default()
                },
            )
            .unwrap();
            let mut e =
                Engine::with_source(gguf.clone(), Arc::new(FlashSource::new(file, 0)), &o).unwrap();
            assert_eq!(greedy(&mut e, &prompt), want, "budget {budget}: {c:?}");
            let peak = e.ctx.budget.peak();
            assert!(peak <= budget, "budget {budget}: peak {peak} ({c:?})");
        }
    }
    // The two machines lead to different I/O choices.
    let modes: std::collections::HashSet<&str> = seen.iter().map(|(_, m)| m.as_str()).collect();
    assert_eq!(modes.len(), 2, "{seen:?}");
}
