//! `--profile`: the per-kernel table adds up to its total, and that total accounts for the
//! measured time of the run it profiled: at least half of it and never more than it (plus 5%
//! for clock granularity) on the all-resident default model, where the kernels are the work.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::GgufFile;
use flashlm::sampling::{Sampler, SamplerParams};

/// The default model all resident with a 128-token context (`profile` on or off); None where
/// there is no adapter or no model.
fn default_engine(profile: bool) -> Option<Engine> {
    common::gpu()?;
    let path = common::model_path()?;
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let o = EngineOptions {
        profile,
        ctx: Some(128),
        ..Default::default()
    };
    Some(Engine::new(gguf, &o).unwrap())
}

#[test]
fn profile_table_sums_to_the_measured_time() {
    let Some(mut e) = default_engine(true) else {
        return;
    };
    let prompt: Vec<u32> = (0..24).map(|i| 100 + i * 37).collect();
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    let (ids, st) = e
        .generate(&prompt, 12, &mut s, |_| false, |_| true)
        .unwrap();
    assert_eq!(ids.len(), 12);
    let report = e.profile_report();
    let table = report.to_table();
    let sum: f64 = report.rows.iter().map(|r| r.total_ms).sum();
    assert!(
        (sum - report.total_ms).abs() <= 1e-6 * report.total_ms.max(1.0),
        "rows {sum} vs total {}\n{table}",
        report.total_ms
    );
    assert!(report.rows.iter().all(|r| r.calls > 0 && r.total_ms >= 0.0));
    let measured_ms = (st.prefill_s + st.decode_s) * 1e3;
    assert!(
        report.total_ms <= measured_ms * 1.05,
        "kernels {:.1} ms exceed the measured {measured_ms:.1} ms\n{table}",
        report.total_ms
    );
    assert!(
        report.total_ms >= measured_ms * 0.5,
        "kernels {:.1} ms explain less than half of the measured {measured_ms:.1} ms ({})\n{table}",
        report.total_ms,
        report.source
    );
    // Matrix kernels report the rate at which they read their weights.
    assert!(
        report.rows.iter().any(|r| r.gb_s.is_some_and(|g| g > 0.0)),
        "{table}"
    );
}

/// `bench resident`'s roofline kernel and device copies stream each resident weight buffer
/// once: the bytes they move are those the decode products read (a layer's matrices share one
/// buffer; streaming it once per matrix had counted it seven times).
#[test]
fn the_roofline_streams_the_bytes_the_products_read() {
    let Some(e) = default_engine(false) else {
        return;
    };
    let read = e.matvec_weight_bytes();
    let streamed = e.resident_weight_bytes();
    assert!(
        streamed >= read && streamed <= read + read / 100,
        "roofline streams {streamed} bytes, the products read {read}"
    );
}
