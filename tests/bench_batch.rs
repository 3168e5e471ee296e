//! `bench batch` on a tiny synthetic model with every layer streamed: the report has one row per
//! concurrency level, every batched sequence's ids equal the same prompt decoded alone, flash
//! bytes per decoded token fall with two sequences, per-request latencies are per sequence, and
//! lookup drafting's output equals plain decoding. A report with a difference says NOT EQUAL.
mod common;

use flashlm::bench::batch::{BatchBenchOptions, run};
use flashlm::engine::draft::DraftConfig;
use flashlm::engine::{EngineOptions, ResidentSpec};
use flashlm::flash::IoMode;
use flashlm::gguf::GgmlType;
use flashlm::model::load_model;
use flashlm::model::synthetic::{SyntheticSpec, write_synthetic_file};

#[test]
fn batch_bench_checks_outputs_and_bytes_fall_with_two_sequences() {
    if common::gpu().is_none() {
        return;
    }
    let dir = common::scratch("bench-batch");
    let path = dir.join("tiny.gguf");
    let spec = SyntheticSpec::tiny(GgmlType::Q8_0);
    write_synthetic_file(&spec, 11, 1, &path, &mut |_, _| {}).unwrap();
    let m = load_model(&path).unwrap();
    let base = EngineOptions {
        resident: ResidentSpec::parse("none", spec.n_layers).unwrap(),
        ..Default::default()
    };
    let n = 5;
    let opts = BatchBenchOptions {
        sequences: vec![1, 2],
        prompt_words: 6,
        draft_passages: 2,
        draft_words: 6,
        draft_tokens: 16,
        draft: DraftConfig { ngram: 3, max: 4 },
        ..BatchBenchOptions::s1(IoMode::Mmap, n, 1)
    };
    let report = run(&m, &base, &opts).unwrap();
    let md = report.to_markdown();
    eprintln!("{md}");

    let ks: Vec<usize> = report.rows.iter().map(|r| r.sequences).collect();
    assert_eq!(ks, vec![1, 2]);
    for r in &report.rows {
        assert_eq!(r.decoded_tokens, r.sequences * (n - 1));
        assert_eq!(r.decode_passes, n - 1);
        assert!(
            r.outputs_unchanged,
            "{} sequences: {:?}",
            r.sequences, r.differing
        );
        assert!(
            r.flash_bytes_per_token > 0.0,
            "nothing streamed: {}",
            r.placement
        );
        assert!(r.aggregate_tok_s > 0.0);
        assert!(r.first_token_ms_p50 > 0.0);
        assert!(r.first_token_ms_max <= r.latency_ms_max);
        assert!(r.latency_ms_p50 <= r.latency_ms_max);
    }
    let (r1, r2) = (&report.rows[0], &report.rows[1]);
    assert_eq!(r1.bytes_ratio, 1.0);
    assert!(
        r2.bytes_ratio < 1.0,
        "flash bytes per token with 2 sequences x{} of 1",
        r2.bytes_ratio
    );
    // The second sequence's first token waits for both prefills: latencies are per request.
    assert!(r2.first_token_ms_max > r2.first_token_ms_p50);

    assert_eq!(report.drafts.len(), 2);
    assert_eq!(report.draft_prompt_tokens.len(), 2);
    let (plain, lookup) = (&report.drafts[0], &report.drafts[1]);
    assert_eq!(
        (plain.mode.as_str(), lookup.mode.as_str()),
        ("plain", "lookup")
    );
    for d in &report.drafts {
        assert_eq!(d.ids.len(), 2, "{}", d.mode);
        assert!(
            d.ids
                .iter()
                .all(|i| !i.is_empty() && i.len() <= opts.draft_tokens)
        );
        assert_eq!(d.tokens, d.ids.iter().map(Vec::len).sum::<usize>());
    }
    assert_eq!(plain.decode_passes as usize, plain.tokens - 2);
    assert!(lookup.accepted <= lookup.drafted);
    assert!(lookup.draft_passes <= lookup.decode_passes);
    // Every decode pass yields one token besides its accepted drafts, except a pass whose
    // accepted drafts end a generation (at most one per prompt).
    let yielded = lookup.decode_passes + lookup.accepted;
    assert!(
        (plain.decode_passes..=plain.decode_passes + 2).contains(&yielded),
        "{yielded} against {} plain passes",
        plain.decode_passes
    );
    assert!(report.draft_outputs_unchanged);
    assert!(report.outputs_unchanged());
    assert!(!md.contains("NOT EQUAL"), "{md}");

    // Goal lines: without an 8-sequence row the batch goals are not measured (never "met").
    assert_eq!(report.goals.len(), 3);
    assert!(
        report.goals[..2]
            .iter()
            .all(|g| g.value.is_none() && !g.met)
    );
    assert_eq!(report.goals[2].value, Some(lookup.accepted_per_pass));
    assert!(md.contains("tokens per pass including that token"), "{md}");

    // A difference is reported loudly.
    let mut bad = report.clone();
    bad.rows[1].outputs_unchanged = false;
    bad.rows[1].differing = vec![1];
    assert!(!bad.outputs_unchanged());
    assert!(bad.to_markdown().contains("NOT EQUAL: with 2 sequences"));
    let _ = std::fs::remove_dir_all(&dir);
}
