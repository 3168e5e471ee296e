//! Streaming under a device-memory budget: identical tokens and logits to the all-resident run
//! for every budget from the minimum to everything resident; the budget is never exceeded.
mod common;

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions, ResidentSpec};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::sampling::{Sampler, SamplerParams};

fn opts(budget: Option<u64>, ctx: usize) -> EngineOptions {
    EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(ctx),
        // Small staging so the streaming minimum of small models stays below all-resident.
        ring_slots: 3,
        ring_chunk: 8192,
        head_chunk: Some(16384),
        ..Default::default()
    }
}

/// Greedy ids and the first-step logits.
fn run(engine: &mut Engine, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    engine.reset();
    let first = engine.forward(prompt).unwrap();
    engine.reset();
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    let (ids, _) = engine
        .generate(prompt, n, &mut s, |_| false, |_| true)
        .unwrap();
    (ids, first)
}

/// A synthetic model, and the greedy ids of `n` steps after `prompt` with everything resident.
fn model_and_resident_ids(
    spec: &SyntheticSpec,
    seed: u64,
    prompt: &[u32],
    n: usize,
    ctx: usize,
) -> (Arc<GgufFile>, Vec<u32>) {
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(spec, seed)).unwrap());
    let mut resident = Engine::new(gguf.clone(), &opts(None, ctx)).unwrap();
    let (ids, _) = run(&mut resident, prompt, n);
    (gguf, ids)
}

fn check_budgets(gguf: Arc<GgufFile>, prompt: &[u32], n: usize, ctx: usize, extra_budgets: &[u64]) {
    let mut resident = Engine::new(gguf.clone(), &opts(None, ctx)).unwrap();
    assert!(!resident.placement.streaming);
    let (want_ids, want_logits) = run(&mut resident, prompt, n);
    let all = resident.placement.total;
    drop(resident);

    let min = common::min_budget(&gguf, &opts(None, ctx));
    assert!(
        min < all,
        "streaming minimum {min} should be below all-resident {all}"
    );
    let mut budgets = vec![min, min + (all - min) / 3, (min + all) / 2, all];
    budgets.extend_from_slice(extra_budgets);
    for budget in budgets {
        let mut e = Engine::new(gguf.clone(), &opts(Some(budget), ctx)).unwrap();
        let (ids, logits) = run(&mut e, prompt, n);
        let peak = e.ctx.budget.peak();
        assert!(peak <= budget, "peak {peak} exceeds budget {budget}");
        assert_eq!(ids, want_ids, "budget {budget}: {}", e.placement);
        assert!(
            logits == want_logits,
            "budget {budget}: logits differ from the resident run ({})",
            e.placement
        );
        if budget < all {
            assert!(
                e.placement.streaming,
                "budget {budget} below all-resident must stream"
            );
        }
    }
}

/// A streamed pass submits each layer on its own; the page table of a decode step whose pages
/// are all known at its start reaches the device in one write with the first submission (each
/// write is a staging allocation), and the tokens stay those of the resident run.
#[test]
fn streamed_decode_writes_the_page_table_once_a_pass() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 6,
        n_embd: 96,
        n_heads: 3,
        n_kv_heads: 1,
        n_ff: 160,
        vocab: 3000,
        weight_type: GgmlType::Q4_1,
        ctx: 64,
        untied_output: false,
    };
    let prompt: Vec<u32> = (0..9).map(|k| (k * 211 + 5) % 3000).collect();
    let (gguf, want) = model_and_resident_ids(&spec, 9, &prompt, 6, 32);
    let min = common::min_budget(&gguf, &opts(None, 32));
    let mut e = Engine::new(gguf.clone(), &opts(Some(min), 32)).unwrap();
    assert!(e.placement.streaming, "{}", e.placement);
    assert!(
        !e.plan.kv.streams,
        "the KV cache should fit the device here"
    );
    e.reset();
    let mut logits = e.forward(&prompt).unwrap();
    let mut s = Sampler::new(SamplerParams::greedy());
    let mut ids = Vec::new();
    for step in 0..6 {
        let id = s.sample(&logits, &ids);
        ids.push(id);
        let before = e.table_writes();
        logits = e.forward(&[id]).unwrap();
        let writes = e.table_writes() - before;
        assert_eq!(writes, 1, "decode step {step}: {writes} page-table writes");
    }
    assert_eq!(ids, want);
}

#[test]
fn synthetic_streamed_equals_resident_every_budget() {
    if common::gpu().is_none() {
        return;
    }
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        let spec = SyntheticSpec {
            n_layers: 6,
            n_embd: 96,
            n_heads: 3,
            n_kv_heads: 1,
            n_ff: 160,
            vocab: 3000,
            weight_type: ty,
            ctx: 64,
            untied_output: false,
        };
        let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 5)).unwrap());
        let prompt: Vec<u32> = (0..11).map(|k| (k * 131 + 7) % 3000).collect();
        check_budgets(gguf, &prompt, 6, 32, &[]);
    }
}

#[test]
fn real_model_streamed_equals_resident() {
    let Some(path) = common::model_path() else {
        return;
    };
    if common::gpu().is_none() {
        return;
    }
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    // "The capital of France is"
    check_budgets(gguf, &[504, 3575, 282, 4649, 314], 4, 32, &[16 << 20]);
}

#[test]
fn budget_below_minimum_states_the_minimum() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec::tiny(GgmlType::Q8_0);
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 1)).unwrap());
    let min = common::min_budget(&gguf, &opts(None, 16));
    let err = Engine::new(gguf.clone(), &opts(Some(min - 1), 16))
        .err()
        .expect("a budget one byte under the minimum must fail")
        .to_string();
    assert!(err.contains(&min.to_string()), "{err}");
    assert!(err.contains("KV cache"), "{err}");
    Engine::new(gguf, &opts(Some(min), 16)).unwrap();
}

#[test]
fn resident_override_is_honoured() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec::tiny(GgmlType::Q4_0);
    let gguf = Arc::new(GgufFile::from_bytes(synthetic_llama(&spec, 2)).unwrap());
    let mut o = opts(None, 16);
    o.resident = ResidentSpec::parse("none", spec.n_layers).unwrap();
    let mut e = Engine::new(gguf.clone(), &o).unwrap();
    assert!(e.placement.streaming);
    assert!(e.placement.resident_layers.iter().all(|&r| !r));
    assert!(!e.placement.head_resident);
    let streamed = e.forward(&[1, 2, 3]).unwrap();
    let mut r = Engine::new(gguf, &opts(None, 16)).unwrap();
    assert!(r.forward(&[1, 2, 3]).unwrap() == streamed);
}

mod flash_modes {
    use super::*;
    use flashlm::flash::source::FlashSource;
    use flashlm::flash::{FlashFile, IoMode, ReaderOptions};

    fn source(path: &std::path::Path, mode: IoMode) -> Option<std::sync::Arc<FlashSource>> {
        match FlashFile::open(
            path,
            ReaderOptions {
                mode,
                threads: 3,
                chunk: 64 * 1024,
            },
        ) {
            Ok(f) => Some(std::sync::Arc::new(FlashSource::new(f, 0))),
            Err(e) if mode == IoMode::Direct && !common::in_ci() => {
                eprintln!("skipping direct I/O: {e}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn real_model_both_io_modes_match_resident_at_minimum_budget() {
        let Some(path) = common::model_path() else {
            return;
        };
        if common::gpu().is_none() {
            return;
        }
        let gguf = Arc::new(GgufFile::open(&path).unwrap());
        let prompt = [504, 3575, 282, 4649, 314];
        let mut resident = Engine::new(gguf.clone(), &opts(None, 16)).unwrap();
        let (want_ids, want_logits) = run(&mut resident, &prompt, 3);
        drop(resident);
        let min = common::min_budget(&gguf, &opts(None, 16));
        for mode in [IoMode::Direct, IoMode::Mmap] {
            let Some(src) = source(&path, mode) else {
                continue;
            };
            let mut e = Engine::with_source(gguf.clone(), src, &opts(Some(min), 16)).unwrap();
            assert!(e.placement.streaming);
            let (ids, logits) = run(&mut e, &prompt, 3);
            assert_eq!(ids, want_ids, "{mode}");
            assert!(logits == want_logits, "{mode}: logits differ");
            assert!(e.ctx.budget.peak() <= min);
            // Every streamed weight byte came from the file.
            assert!(e.flash_bytes() >= e.matvec_weight_bytes(), "{mode}");
        }
    }

    #[test]
    fn head_streams_through_the_layer_slots() {
        // With no --head-chunk, a streaming head goes through the layer slots (bigger chunks
        // than slots of its own, no memory of its own): tokens and logits are the resident
        // run's through the staging ring and in place, and direct reads into the mapped slots
        // land where the weights are bound, with no bounce copy.
        use flashlm::engine::UploadMode;
        let Some(path) = common::model_path() else {
            return;
        };
        let Some(ctx) = common::gpu() else { return };
        let mappable = ctx.mappable;
        drop(ctx);
        let gguf = Arc::new(GgufFile::open(&path).unwrap());
        let prompt = [504, 3575, 282, 4649, 314];
        let mut o = opts(None, 32);
        o.head_chunk = None;
        let mut resident = Engine::new(gguf.clone(), &o).unwrap();
        let (want_ids, want_logits) = run(&mut resident, &prompt, 4);
        drop(resident);
        let budget = 16u64 << 20;
        o.gpu.budget = Some(budget);
        let own = flashlm::plan::slots::HeadChunks::of(
            flashlm::plan::slots::DEFAULT_HEAD_CHUNK,
            612,
            49152,
            false,
        );
        for (upload, mode) in [
            (UploadMode::Staging, IoMode::Direct),
            (UploadMode::InPlace, IoMode::Direct),
            (UploadMode::InPlace, IoMode::Mmap),
        ] {
            if upload == UploadMode::InPlace && !mappable {
                continue;
            }
            let Some(src) = source(&path, mode) else {
                continue;
            };
            o.upload = upload;
            let mut e = Engine::with_source(gguf.clone(), src.clone(), &o).unwrap();
            let hp = &e.plan.head;
            assert!(
                hp.in_slots && !e.placement.head_resident,
                "{:?} {mode}: {}",
                upload,
                e.placement
            );
            assert!(hp.n_chunks * 4 < own.n_chunks, "{} chunks", hp.n_chunks);
            let (ids, logits) = run(&mut e, &prompt, 4);
            assert_eq!(ids, want_ids, "{upload:?} {mode}");
            assert!(logits == want_logits, "{upload:?} {mode}: logits differ");
            assert!(e.ctx.budget.peak() <= budget);
            assert_eq!(e.ctx.budget.peak(), e.plan.total, "{upload:?} {mode}");
            if upload == UploadMode::InPlace && mode == IoMode::Direct {
                // Only the ends of ranges that start or stop inside a page go through a bounce
                // buffer: a page or two per part, not the part.
                let read = src.file().bytes_read();
                let bounced = src.file().bounced_bytes();
                assert!(read > 50 << 20, "read {read}");
                assert!(bounced * 20 < read, "bounced {bounced} of {read} bytes");
            }
        }
    }

    #[test]
    fn model_file_that_shrinks_or_vanishes_fails_clearly() {
        if common::gpu().is_none() {
            return;
        }
        let spec = SyntheticSpec::tiny(GgmlType::Q8_0);
        let bytes = synthetic_llama(&spec, 9);
        let dir = std::env::temp_dir().join(format!("flashlm-shrink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (i, mode) in [IoMode::Mmap, IoMode::Direct].into_iter().enumerate() {
            let path = dir.join(format!("m{i}.gguf"));
            std::fs::write(&path, &bytes).unwrap();
            let gguf = Arc::new(GgufFile::from_bytes(bytes.clone()).unwrap());
            let Some(src) = source(&path, mode) else {
                continue;
            };
            let mut o = opts(None, 16);
            o.resident = ResidentSpec::parse("none", spec.n_layers).unwrap();
            let mut e = Engine::with_source(gguf, src, &o).unwrap();
            e.forward(&[1, 2]).unwrap();
            // Shrink the file under the engine, between passes: once the next pass's reads,
            // queued before `forward` returned, have run.
            e.settle();
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.set_len(bytes.len() as u64 / 2).unwrap();
            let err = e.forward(&[3]).unwrap_err().to_string();
            assert!(err.contains("model file"), "{mode}: {err}");
            // Restore it, then remove it.
            f.set_len(0).unwrap();
            drop(f);
            std::fs::write(&path, &bytes).unwrap();
            std::fs::remove_file(&path).unwrap();
            let err = e.forward(&[3]).unwrap_err().to_string();
            assert!(err.contains("model file"), "{mode}: {err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn synthetic_every_budget_both_io_modes() {
    use flashlm::flash::source::FlashSource;
    use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 5,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 224,
        vocab: 4000,
        weight_type: GgmlType::Q4_1,
        ctx: 64,
        untied_output: true,
    };
    let bytes = synthetic_llama(&spec, 21);
    let path = std::env::temp_dir().join(format!("flashlm-modes-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let prompt: Vec<u32> = (0..9).map(|k| (k * 401 + 3) % 4000).collect();
    let mut resident = Engine::new(gguf.clone(), &opts(None, 24)).unwrap();
    let (want_ids, want_logits) = run(&mut resident, &prompt, 5);
    let all = resident.placement.total;
    drop(resident);
    let min = common::min_budget(&gguf, &opts(None, 24));
    for mode in [IoMode::Direct, IoMode::Mmap] {
        for budget in [min, (min + all) / 2, all] {
            let file = match FlashFile::open(
                &path,
                ReaderOptions {
                    mode,
                    threads: 2,
                    chunk: 16 * 1024,
                },
            ) {
                Ok(f) => f,
                Err(e) if !common::in_ci() => {
                    eprintln!("skipping {mode}: {e}");
                    break;
                }
                Err(e) => panic!("{e}"),
            };
            let src = std::sync::Arc::new(FlashSource::new(file, 0));
            let mut e = Engine::with_source(gguf.clone(), src, &opts(Some(budget), 24)).unwrap();
            let (ids, logits) = run(&mut e, &prompt, 5);
            assert!(
                e.ctx.budget.peak() <= budget,
                "{mode} {budget}: peak over budget"
            );
            assert_eq!(ids, want_ids, "{mode} {budget}");
            assert!(logits == want_logits, "{mode} {budget}: logits differ");
        }
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn in_place_and_staging_uploads_give_identical_tokens() {
    use flashlm::engine::UploadMode;
    let Some(ctx) = common::gpu() else { return };
    if !ctx.mappable {
        eprintln!("skipping: the adapter has no mappable storage buffers");
        return;
    }
    drop(ctx);
    use flashlm::flash::source::FlashSource;
    use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
    let spec = SyntheticSpec::tiny(GgmlType::Q4_1);
    let bytes = synthetic_llama(&spec, 8);
    let path = std::env::temp_dir().join(format!("flashlm-inplace-{}.gguf", std::process::id()));
    std::fs::write(&path, &bytes).unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let prompt = [5, 9, 44, 17, 3, 99, 120];
    let mut got = Vec::new();
    // From memory (one reader), then in place from the file with four reader threads: a
    // layer's tensors are read side by side into their mapped slots.
    for (mode, threads) in [
        (UploadMode::Staging, 0),
        (UploadMode::InPlace, 0),
        (UploadMode::InPlace, 4),
    ] {
        let mut o = opts(None, 32);
        o.upload = mode;
        o.resident = ResidentSpec::parse("none", spec.n_layers).unwrap();
        let mut e = if threads == 0 {
            Engine::new(gguf.clone(), &o).unwrap()
        } else {
            let file = FlashFile::open(
                &path,
                ReaderOptions {
                    mode: IoMode::Mmap,
                    threads,
                    chunk: 4096,
                },
            )
            .unwrap();
            Engine::with_source(gguf.clone(), Arc::new(FlashSource::new(file, 0)), &o).unwrap()
        };
        assert!(e.placement.streaming);
        assert_eq!(e.in_place, mode == UploadMode::InPlace);
        let r = run(&mut e, &prompt, 8);
        assert_eq!(e.ctx.budget.peak(), e.plan.total);
        got.push(r);
    }
    let _ = std::fs::remove_file(&path);
    for (i, g) in got.iter().enumerate().skip(1) {
        assert_eq!(got[0].0, g.0, "case {i}");
        assert!(got[0].1 == g.1, "case {i}: first-step logits differ");
    }
}

/// Direct reads straight into mapped slots, widened to whole pages of the file: in a model
/// whose every matrix is large enough for a page of room in its slot region (so its data sits
/// in the slot as in the file, and a read of whole pages lands in room no other matrix uses),
/// the tokens and logits are those of the staging path, and no streamed weight byte goes
/// through a bounce buffer (only the embedding rows, a page or two a token).
#[test]
fn direct_in_place_reads_of_whole_pages_give_identical_tokens() {
    use flashlm::engine::UploadMode;
    use flashlm::flash::source::FlashSource;
    use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
    let Some(ctx) = common::gpu() else { return };
    if !ctx.mappable {
        eprintln!("skipping: the adapter has no mappable storage buffers");
        return;
    }
    drop(ctx);
    let spec = SyntheticSpec {
        n_layers: 3,
        n_embd: 512,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 1408,
        vocab: 1000,
        weight_type: GgmlType::Q4_1,
        ctx: 64,
        untied_output: true,
    };
    let bytes = synthetic_llama(&spec, 21);
    // Not in the temporary directory: it may be a tmpfs, which refuses direct I/O.
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "flashlm-direct-inplace-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, &bytes).unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let prompt = [5, 9, 44, 17, 3, 99, 120];
    let steps = 6;
    let mut got = Vec::new();
    let mut bounced = Vec::new();
    // In place, each layer's matrices lie in their slot as in the file and a layer is one read;
    // with bindings of 256 KiB the FFN matrices come in two parts, and each part is a read of
    // its own into a region of its own.
    for (mode, threads, binding) in [
        (UploadMode::Staging, 1, None),
        (UploadMode::InPlace, 1, None),
        (UploadMode::InPlace, 3, None),
        (UploadMode::InPlace, 3, Some(256 << 10)),
    ] {
        let file = match FlashFile::open(
            &path,
            ReaderOptions {
                mode: IoMode::Direct,
                threads,
                chunk: 64 * 1024,
            },
        ) {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                assert!(
                    std::env::var_os("CI").is_none(),
                    "direct I/O refused under CI: {e}"
                );
                eprintln!("skipping: direct I/O refused here: {e}");
                return;
            }
        };
        let source = Arc::new(FlashSource::new(file, 0));
        let mut o = opts(None, 32);
        o.upload = mode;
        // The output head in chunks through the layer slots, as under a tight budget.
        o.head_chunk = None;
        o.resident = ResidentSpec::parse("none", spec.n_layers).unwrap();
        o.max_binding = binding;
        let mut e = Engine::with_source(gguf.clone(), source.clone(), &o).unwrap();
        assert!(e.placement.streaming);
        assert_eq!(e.in_place, mode == UploadMode::InPlace);
        assert_eq!(
            e.plan.slot.span,
            e.in_place && binding.is_none(),
            "{mode:?} {threads} {binding:?}"
        );
        source.file().reset_counters();
        got.push(run(&mut e, &prompt, steps));
        bounced.push(source.file().bounced_bytes());
    }
    let _ = std::fs::remove_file(&path);
    for (i, g) in got.iter().enumerate().skip(1) {
        assert_eq!(got[0].0, g.0, "case {i}");
        assert!(got[0].1 == g.1, "case {i}: first-step logits differ");
    }
    let tokens = (prompt.len() + steps) as u64;
    let rows = 2 * 4096 * tokens;
    assert!(bounced[0] > rows, "staging: {} bytes bounced", bounced[0]);
    // (With bindings of 256 KiB the parts' buffers are too small for room around them all.)
    for (i, &b) in bounced.iter().enumerate().skip(1).take(2) {
        assert!(b <= rows, "case {i}: {b} bytes bounced in place");
    }
}

#[test]
fn automatic_ring_shrinks_to_fit_a_tight_budget() {
    if common::gpu().is_none() {
        return;
    }
    let spec = SyntheticSpec {
        n_layers: 4,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 320,
        vocab: 1000,
        weight_type: GgmlType::Q8_0,
        ctx: 64,
        untied_output: false,
    };
    let prompt: Vec<u32> = (0..9).map(|k| (k * 37 + 5) % 1000).collect();
    let (gguf, want) = model_and_resident_ids(&spec, 9, &prompt, 5, 32);
    // The three-slot minimum: an automatic ring (a whole layer of slots) does not fit it.
    let min = common::min_budget(&gguf, &opts(None, 32));
    let mut auto = opts(Some(min), 32);
    auto.ring_slots = 0;
    let mut e = Engine::new(gguf.clone(), &auto).unwrap();
    assert!(e.placement.streaming);
    assert_eq!(e.plan.ring_slots, 3, "{}", e.placement);
    let (ids, _) = run(&mut e, &prompt, 5);
    assert_eq!(ids, want);
    assert!(e.ctx.budget.peak() <= min);
    // With room for it, the automatic ring holds more than three slots.
    let mut roomy = opts(Some(min + (1 << 20)), 32);
    roomy.ring_slots = 0;
    let e = Engine::new(gguf, &roomy).unwrap();
    assert!(e.plan.ring_slots > 3, "{}", e.plan.ring_slots);
}
