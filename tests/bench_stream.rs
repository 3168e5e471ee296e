//! `bench stream` on a tiny synthetic model: the runs go in rounds over the scenarios, every
//! scenario gets a row with as many runs as rounds, the all-resident row is the reference of
//! "vs resident", and the streamed scenario really streams.
mod common;

use flashlm::bench::{Scenario, stream};
use flashlm::engine::EngineOptions;
use flashlm::flash::IoMode;
use flashlm::gguf::GgmlType;
use flashlm::model::load_model;
use flashlm::model::synthetic::{SyntheticSpec, write_synthetic_file};

#[test]
fn stream_bench_runs_every_scenario_in_each_round() {
    if common::gpu().is_none() {
        return;
    }
    let dir = common::scratch("bench-stream");
    let path = dir.join("tiny.gguf");
    // Four layers of about 4 MB: a 12 MiB budget holds some of them, not all.
    let spec = SyntheticSpec {
        n_layers: 4,
        n_embd: 512,
        n_ff: 2048,
        ..SyntheticSpec::tiny(GgmlType::Q8_0)
    };
    write_synthetic_file(&spec, 5, 1, &path, &mut |_, _| {}).unwrap();
    let m = load_model(&path).unwrap();
    let scenarios = vec![
        Scenario {
            name: "all resident".into(),
            budget: None,
            io: IoMode::Mmap,
            upload: None,
        },
        Scenario {
            name: "small".into(),
            budget: Some(12 << 20),
            io: IoMode::Mmap,
            upload: None,
        },
    ];
    let report = stream(&m, &EngineOptions::default(), &scenarios, 8, 4, 2).unwrap();
    let md = report.to_markdown();
    eprintln!("{md}");
    assert_eq!(report.rounds, 2);
    assert!(
        md.contains("2 rounds, each running every scenario once in turn"),
        "{md}"
    );
    let names: Vec<&str> = report.rows.iter().map(|r| r.scenario.as_str()).collect();
    assert_eq!(names, ["all resident", "small"]);
    assert_eq!(report.rows[0].ms_per_token_vs_resident, 1.0);
    assert_eq!(report.rows[0].ms_per_token_vs_resident_paired, 1.0);
    assert!(report.rows[1].ms_per_token_vs_resident_paired > 0.0);
    assert!(md.contains("vs resident, same round (median)"), "{md}");
    let small = &report.rows[1];
    assert!(small.flash_bytes_per_token > 0.0, "{}", small.placement);
    assert!(
        small.peak_device_bytes <= 12 << 20,
        "{}",
        small.peak_device_bytes
    );
    for r in &report.rows {
        assert_eq!(r.generated_tokens, 4);
        assert!(r.ms_per_token > 0.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
