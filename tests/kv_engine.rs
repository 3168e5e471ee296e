//! The paged KV cache in the engine: exact paged attention equals the contiguous cache for every
//! page size, budget and I/O mode; page selection keeping every page equals exact; rewinds bring
//! back the device window from the page file; the plan's sizes are what gets allocated;
//! sessions resume to the same ids as an uninterrupted run and reject what does not match; long
//! prompts report their progress batch by batch.
mod common;

use std::path::PathBuf;
use std::sync::Arc;

use flashlm::engine::{Engine, EngineError, EngineOptions};
use flashlm::flash::source::FlashSource;
use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::kv::SessionError;
use flashlm::kv::session::{SaveFault, Session};
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::KvSelect;
use flashlm::sampling::{Sampler, SamplerParams};

fn scratch(name: &str) -> PathBuf {
    common::scratch(&format!("kv-engine-{name}"))
}

fn spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 3,
        n_embd: 64,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 96,
        vocab: 400,
        weight_type: GgmlType::Q8_0,
        ctx: 1024,
        untied_output: false,
    }
}

/// The synthetic model, in memory and in a file (for the flash reader).
fn model(dir: &std::path::Path) -> (Arc<GgufFile>, PathBuf) {
    let bytes = synthetic_llama(&spec(), 21);
    let path = dir.join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    (Arc::new(GgufFile::from_bytes(bytes).unwrap()), path)
}

fn opts(budget: Option<u64>, page: u32, dir: &std::path::Path) -> EngineOptions {
    EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(512),
        ubatch: 32,
        ring_slots: 3,
        ring_chunk: 8192,
        head_chunk: Some(16384),
        kv_page: Some(page),
        kv_dir: Some(dir.join("kv")),
        ..Default::default()
    }
}

fn engine(gguf: &Arc<GgufFile>, path: &std::path::Path, o: &EngineOptions, mode: IoMode) -> Engine {
    let f = FlashFile::open(
        path,
        ReaderOptions {
            mode,
            threads: 2,
            chunk: 64 * 1024,
        },
    )
    .unwrap();
    let e = Engine::with_source(gguf.clone(), Arc::new(FlashSource::new(f, 0)), o).unwrap();
    // The plan is the single source of sizes: exactly its bytes are allocated.
    assert_eq!(e.ctx.budget.in_use(), e.plan.total, "{}", e.placement);
    e
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|k| (k * 97 + seed * 13 + 5) % 400)
        .collect()
}

/// Prefill logits, then greedy ids with the logits of every step.
fn run(e: &mut Engine, p: &[u32], n: usize) -> (Vec<f32>, Vec<u32>, Vec<Vec<f32>>) {
    e.reset();
    let mut logits = e.forward(p).unwrap();
    let first = logits.clone();
    let mut ids = Vec::new();
    let mut steps = Vec::new();
    for _ in 0..n {
        let id = flashlm::model::reference::argmax(&logits);
        ids.push(id);
        logits = e.forward(&[id]).unwrap();
        steps.push(logits.clone());
    }
    (first, ids, steps)
}

#[test]
fn paged_exact_equals_contiguous_every_page_size_budget_and_io_mode() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("exact");
    let (gguf, path) = model(&dir);
    let p = prompt(210, 1);
    // One page for the whole context: the contiguous cache.
    let mut contiguous = engine(&gguf, &path, &opts(None, 512, &dir), IoMode::Mmap);
    assert!(!contiguous.plan.kv.streams && contiguous.plan.kv.max_pages == 1);
    let want = run(&mut contiguous, &p, 40);
    drop(contiguous);
    for page in [1u32, 16, 64] {
        let base = opts(None, page, &dir);
        let min = common::min_budget(&gguf, &base);
        for budget in [None, Some(min), Some(min + 150_000)] {
            for mode in [IoMode::Mmap, IoMode::Direct] {
                let o = EngineOptions {
                    gpu: GpuOptions {
                        budget,
                        ..Default::default()
                    },
                    ..base.clone()
                };
                let mut e = engine(&gguf, &path, &o, mode);
                if budget == Some(min) {
                    assert!(
                        e.plan.kv.streams,
                        "page {page}: the minimum must page to flash"
                    );
                    assert!(e.kv_file().is_some());
                }
                let got = run(&mut e, &p, 40);
                let what = format!("page {page}, budget {budget:?}, {mode}: {}", e.placement);
                assert!(got.0 == want.0, "{what}: prefill logits differ");
                assert_eq!(got.1, want.1, "{what}: ids differ");
                assert!(got.2 == want.2, "{what}: decode logits differ");
                assert!(e.ctx.budget.peak() <= budget.unwrap_or(u64::MAX));
                if e.plan.kv.streams {
                    let s = e.kv_stats;
                    assert!(s.fetch.pages > 0 && s.fetch.flash_pages > 0, "{what}");
                    let file = e.kv_file().unwrap().to_path_buf();
                    assert!(file.exists());
                    drop(e);
                    assert!(!file.exists(), "the page file is removed with the engine");
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_part_stream_pool_equals_contiguous() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("halves");
    let (gguf, path) = model(&dir);
    let p = prompt(700, 9);
    let mut o = opts(None, 1024, &dir);
    o.ctx = Some(1024);
    let want = run(&mut engine(&gguf, &path, &o, IoMode::Mmap), &p, 20);
    o.kv_page = Some(16);
    let min = common::min_budget(&gguf, &o);
    // With more room the stream pool grows for decode rounds longer than a prefill batch's
    // (the decode row's partials take the batch's room): same bits either way.
    // The smallest budget (in steps of 25 kB) at which they do, found from the plans.
    let longer = (4..40)
        .map(|k| min + k * 25_000)
        .find(|&b| {
            let mut t = o.clone();
            t.gpu.budget = Some(b);
            let kv = engine(&gguf, &path, &t, IoMode::Direct).plan.kv.clone();
            kv.streams && kv.decode_round_splits > kv.round_splits
        })
        .expect("a budget with longer decode rounds");
    for budget in [min + 100_000, longer] {
        o.gpu.budget = Some(budget);
        let mut e = engine(&gguf, &path, &o, IoMode::Direct);
        let kv = &e.plan.kv;
        assert!(kv.streams && kv.halves == 2, "{kv:?}");
        assert_eq!(
            kv.decode_round_splits > kv.round_splits,
            budget == longer,
            "{kv:?}"
        );
        let got = run(&mut e, &p, 20);
        assert!(
            got.0 == want.0 && got.1 == want.1 && got.2 == want.2,
            "budget {budget}"
        );
        assert!(e.kv_stats.fetch.flash_pages > 0);
    }
    // Every page at home, decode rounds longer than the prefill's (the first budget with all
    // pages home leaves the partials room for one prefill split only): same bits.
    let home = (4..60)
        .map(|k| min + k * 25_000)
        .find(|&b| {
            let mut t = o.clone();
            t.gpu.budget = Some(b);
            !engine(&gguf, &path, &t, IoMode::Direct).plan.kv.streams
        })
        .expect("a budget with every page at home");
    o.gpu.budget = Some(home);
    let mut e = engine(&gguf, &path, &o, IoMode::Direct);
    let kv = &e.plan.kv;
    assert!(kv.decode_round_splits > kv.round_splits, "{kv:?}");
    assert!(run(&mut e, &p, 20) == want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn kv_pages_written_once_per_full_page() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("wear");
    let (gguf, path) = model(&dir);
    let base = opts(None, 16, &dir);
    let min = common::min_budget(&gguf, &base);
    let o = EngineOptions {
        gpu: GpuOptions {
            budget: Some(min),
            ..Default::default()
        },
        ..base
    };
    let mut e = engine(&gguf, &path, &o, IoMode::Mmap);
    let mut s = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    let (_, st) = e
        .generate(&prompt(100, 2), 60, &mut s, |_| false, |_| true)
        .unwrap();
    // 100 + 59 positions cached: 9 full 16-token pages per layer, 3 of them during decode.
    assert_eq!(st.kv_pages_written, (9 - 6) * 3);
    assert_eq!(
        st.kv_bytes_written,
        st.kv_pages_written * e.plan.kv.page_bytes
    );
    assert!(st.kv_bytes_written_per_token <= e.plan.kv.page_bytes as f64 * 3.0 / 16.0 * 1.2);
}

#[test]
fn page_selection_keeping_every_page_equals_exact() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("quest");
    let (gguf, path) = model(&dir);
    let p = prompt(120, 3);
    for budget_min in [false, true] {
        let mut base = opts(None, 16, &dir);
        // The budget of the largest configuration (page summaries take device memory).
        base.kv_select = Some(KvSelect::parse("quest-lag:1", 0).unwrap());
        let budget = budget_min.then(|| common::min_budget(&gguf, &base));
        let mk = |sel: Option<&str>| {
            let mut o = base.clone();
            o.gpu.budget = budget;
            o.kv_select = sel.map(|s| KvSelect::parse(s, 0).unwrap());
            engine(&gguf, &path, &o, IoMode::Mmap)
        };
        let want = run(&mut mk(None), &p, 24);
        for sel in ["quest:100%", "quest:1000", "quest-lag:100%"] {
            let mut e = mk(Some(sel));
            let got = run(&mut e, &p, 24);
            assert_eq!(got.1, want.1, "{sel}, budget {budget:?}");
            assert!(
                got.2 == want.2,
                "{sel}, budget {budget:?}: decode logits differ"
            );
        }
        // Keeping one page attends less: the run still works and selects.
        let mut e = mk(Some("quest:1"));
        let got = run(&mut e, &p, 24);
        assert_eq!(got.1.len(), 24);
        assert!(e.kv_stats.selections > 0);
        assert!(e.kv_stats.selected_pages < e.kv_stats.candidate_pages);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn rewind_brings_the_window_back_from_flash() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("rewind");
    let (gguf, path) = model(&dir);
    let base = opts(None, 16, &dir);
    let o = EngineOptions {
        gpu: GpuOptions {
            budget: Some(common::min_budget(&gguf, &base)),
            ..Default::default()
        },
        ..base
    };
    let p = prompt(180, 4);
    let tail = prompt(30, 5);
    let mut e = engine(&gguf, &path, &o, IoMode::Direct);
    assert!(e.plan.kv.streams);
    e.forward(&p).unwrap();
    for cut in [75usize, 64, 130] {
        e.try_truncate(cut).unwrap();
        assert_eq!(e.n_past(), cut);
        let got = e.forward(&tail).unwrap();
        let mut fresh = engine(&gguf, &path, &o, IoMode::Mmap);
        let mut all = p[..cut].to_vec();
        all.extend_from_slice(&tail);
        // The same batches as the rewound engine ran: the prefix, then the tail.
        fresh.forward(&p[..cut]).unwrap();
        let want = fresh.forward(&tail).unwrap();
        assert!(got == want, "rewind to {cut}: logits differ");
        // Back to the full prompt for the next cut.
        e.truncate(cut);
        e.forward(&p[cut..]).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn session_resumes_to_the_uninterrupted_ids_and_rejects_mismatches() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("session");
    let (gguf, path) = model(&dir);
    let sp = dir.join("chat.session");
    let greedy = || {
        Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        })
    };
    let first = prompt(90, 6);
    let mut second = first.clone();
    second.extend(prompt(25, 7));
    for streams in [false, true] {
        let base = opts(None, 16, &dir);
        let o = EngineOptions {
            gpu: GpuOptions {
                budget: streams.then(|| common::min_budget(&gguf, &base)),
                ..Default::default()
            },
            ..base.clone()
        };
        // Uninterrupted: the second prompt from scratch.
        let mut u = engine(&gguf, &path, &o, IoMode::Mmap);
        let (want, _) = u
            .generate(&second, 12, &mut greedy(), |_| false, |_| true)
            .unwrap();
        drop(u);
        // A first run saves its session; a new engine resumes from it.
        let mut a = engine(&gguf, &path, &o, IoMode::Mmap);
        assert_eq!(a.plan.kv.streams, streams);
        a.generate(&first, 5, &mut greedy(), |_| false, |_| true)
            .unwrap();
        a.save_session(&sp).unwrap();
        let saved = std::fs::read(&sp).unwrap();
        // A save that dies half way leaves the previous session intact.
        for n in [0u64, 100, saved.len() as u64 / 2] {
            assert!(
                a.save_session_with(&sp, Some(SaveFault::CrashAfterBytes(n)))
                    .is_err()
            );
            assert_eq!(std::fs::read(&sp).unwrap(), saved);
        }
        drop(a);
        let s = Session::open(&sp).unwrap();
        assert_eq!(s.tokens().len(), 90 + 4);
        let mut b = engine(&gguf, &path, &o, IoMode::Direct);
        let k = b.resume(&s, &second).unwrap();
        assert_eq!(k, 90, "the first prompt is the shared prefix");
        let (got, _) = b
            .generate(&second[k..], 12, &mut greedy(), |_| false, |_| true)
            .unwrap();
        assert_eq!(got, want, "streams={streams}: resumed ids differ");
        // Another page size is another layout: refused, naming it.
        let mut other = opts(None, 32, &dir);
        other.gpu.budget = streams.then(|| common::min_budget(&gguf, &other));
        let mut c = engine(&gguf, &path, &other, IoMode::Mmap);
        let err = c.resume(&s, &second).unwrap_err();
        assert!(
            matches!(err, EngineError::Session(SessionError::Mismatch { .. })),
            "{err}"
        );
        assert!(err.to_string().contains("page"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn quest_resumed_from_an_exact_session_decodes_as_if_it_had_prefilled() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("quest-session");
    let (gguf, path) = model(&dir);
    let sp = dir.join("exact.session");
    let greedy = || {
        Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        })
    };
    let p = prompt(150, 9);
    let n = p.len();
    for streams in [false, true] {
        let mut base = opts(None, 16, &dir);
        base.kv_select = Some(KvSelect::parse("quest:2", 0).unwrap());
        let budget = streams.then(|| common::min_budget(&gguf, &base));
        let mk = |sel: Option<&str>| {
            let mut o = base.clone();
            o.gpu.budget = budget;
            o.kv_select = sel.map(|s| KvSelect::parse(s, 0).unwrap());
            engine(&gguf, &path, &o, IoMode::Direct)
        };
        // Prefill attends exactly in every mode: an exact engine's session of the prompt is the
        // state a selecting engine builds itself.
        let mut a = mk(None);
        a.forward(&p[..n - 1]).unwrap();
        a.save_session(&sp).unwrap();
        drop(a);
        // The same schedule cold: the prompt but its last token, then a decode from it.
        let mut c = mk(Some("quest:2"));
        c.forward(&p[..n - 1]).unwrap();
        let (want, _) = c
            .generate(&p[n - 1..], 16, &mut greedy(), |_| false, |_| true)
            .unwrap();
        assert!(c.kv_stats.selected_pages < c.kv_stats.candidate_pages);
        drop(c);
        let s = Session::open(&sp).unwrap();
        let mut b = mk(Some("quest:2"));
        let k = b.resume(&s, &p).unwrap();
        assert_eq!(k, n - 1);
        let (got, _) = b
            .generate(&p[k..], 16, &mut greedy(), |_| false, |_| true)
            .unwrap();
        assert_eq!(got, want, "streams={streams}: resumed quest ids differ");
        assert!(b.kv_stats.selections > 0);
        assert!(b.kv_stats.selected_pages < b.kv_stats.candidate_pages);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lagged selection: the first step after the prompt waits for its scores like plain quest;
/// the next step (no page filled in between) ranks by exactly those scores, read back at the
/// end of the step for every layer, so it keeps the same pages and waits for nothing; later
/// steps cross page boundaries without waits. Streaming the pages from flash gives the same
/// ids and logits as holding them on the device.
#[test]
fn lagged_selection_reads_ahead_the_pages_the_previous_scores_chose() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("lagged");
    let (gguf, path) = model(&dir);
    // 120 tokens in pages of 16: the first two steps (positions 120 and 121) share a top page.
    let p = prompt(120, 5);
    let mut base = opts(None, 16, &dir);
    base.kv_select = Some(KvSelect::parse("quest-lag:2", 1).unwrap());
    let min = common::min_budget(&gguf, &base);
    let mut runs = Vec::new();
    for budget in [None, Some(min)] {
        let mut o = base.clone();
        o.gpu.budget = budget;
        let mut e = engine(&gguf, &path, &o, IoMode::Direct);
        assert_eq!(e.plan.kv.streams, budget.is_some());
        let selecting = (0..e.cfg.n_layers)
            .filter(|&l| e.plan.kv.selects_layer(l))
            .count() as u64;
        assert!(selecting > 0);
        let mut logits = e.forward(&p).unwrap();
        let mut ids = Vec::new();
        let mut steps = Vec::new();
        for step in 0..40 {
            let id = flashlm::model::reference::argmax(&logits);
            ids.push(id);
            logits = e.forward(&[id]).unwrap();
            steps.push(logits.clone());
            let k = &e.kv_stats;
            assert_eq!(
                k.score_waits, selecting,
                "step {step}: only the first step waits"
            );
            assert_eq!(k.selections, selecting * (step as u64 + 1));
            if step == 1 {
                assert!(k.reuse_total > 0);
                assert_eq!(
                    k.reuse_hits, k.reuse_total,
                    "the second step keeps the pages the first step's scores chose"
                );
            }
        }
        assert!(e.kv_stats.selected_pages < e.kv_stats.candidate_pages);
        runs.push((ids, steps));
    }
    assert_eq!(runs[0].0, runs[1].0, "ids differ when the pages stream");
    assert!(
        runs[0].1 == runs[1].1,
        "logits differ when the pages stream"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plain page selection with streamed weights: a selecting layer's device waits for the pages
/// it chose, so those are read before the weights of the next streamed layer, which are held
/// back until the choice is queued (read earlier, they would be the I/O job in flight when the
/// scores come back). Checked on the order of the I/O thread's jobs in the trace of decode steps.
#[test]
fn chosen_pages_are_read_before_the_next_layers_weights() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("chosen-first");
    let sp = SyntheticSpec {
        n_layers: 6,
        ..spec()
    };
    let bytes = synthetic_llama(&sp, 23);
    let path = dir.join("model.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let gguf = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let mut o = opts(None, 16, &dir);
    o.kv_select = Some(KvSelect::parse("quest:2", 1).unwrap());
    o.trace = true;
    o.gpu.budget = Some(common::min_budget(&gguf, &o));
    let mut e = engine(&gguf, &path, &o, IoMode::Direct);
    assert!(
        e.placement.streaming && e.plan.kv.streams,
        "{}",
        e.placement
    );
    let mut logits = e.forward(&prompt(120, 9)).unwrap();
    e.tracer.clear();
    for _ in 0..8 {
        let id = flashlm::model::reference::argmax(&logits);
        logits = e.forward(&[id]).unwrap();
    }
    let trace = dir.join("trace.json");
    e.write_trace(&trace).unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    // The I/O thread's jobs in the order they ran.
    let mut io: Vec<(f64, String)> = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|ev| ev["ph"] == "X" && ev["tid"] == 1)
        .map(|ev| {
            (
                ev["ts"].as_f64().unwrap(),
                ev["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    io.sort_by(|a, b| a.0.total_cmp(&b.0));
    let streamed = |l: usize| !e.placement.resident_layers[l];
    let mut checked = 0;
    for (i, (_, name)) in io.iter().enumerate() {
        let Some(l) = name
            .strip_prefix("read+upload KV layer ")
            .and_then(|r| r.strip_suffix(" round 0"))
            .and_then(|l| l.parse::<usize>().ok())
        else {
            continue;
        };
        if l + 1 >= sp.n_layers || !e.plan.kv.selects_layer(l) || !streamed(l + 1) {
            continue;
        }
        // The nearest read of the next layer's weights, on either side.
        let want = format!("read+upload layer {}", l + 1);
        let dist = |j: usize| (i as i64 - j as i64).abs();
        let nearest = io
            .iter()
            .enumerate()
            .filter(|(_, (_, n))| *n == want)
            .min_by_key(|(j, _)| dist(*j))
            .map(|(j, _)| j);
        if let Some(j) = nearest {
            assert!(
                j > i,
                "layer {l}'s chosen pages were read after layer {}'s weights: {:?}",
                l + 1,
                &io[j.min(i)..=j.max(i)]
            );
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} selecting layers read pages");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn plan_sizes_are_allocated_exactly() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("plan");
    let (gguf, path) = model(&dir);
    for page in [1u32, 8, 64, 512] {
        for sel in [None, Some("quest:4"), Some("quest-lag:4")] {
            let mut base = opts(None, page, &dir);
            base.kv_select = sel.map(|s| KvSelect::parse(s, 1).unwrap());
            base.logit_rows = 4;
            let min = common::min_budget(&gguf, &base);
            for budget in [Some(min), Some(min + 100_000), Some(min + 2_000_000), None] {
                let mut o = base.clone();
                o.gpu.budget = budget;
                let mut e = engine(&gguf, &path, &o, IoMode::Mmap);
                e.forward(&prompt(40, 8)).unwrap();
                assert!(e.ctx.budget.peak() <= budget.unwrap_or(u64::MAX));
                assert_eq!(e.ctx.budget.peak(), e.plan.total, "nothing beyond the plan");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn long_prompts_report_prefill_progress_per_batch_without_changing_logits() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("progress");
    let (gguf, path) = model(&dir);
    let o = opts(None, 16, &dir);
    let mut e = engine(&gguf, &path, &o, IoMode::Mmap);
    let p = prompt(100, 4);
    let plain = run(&mut e, &p, 2);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    e.set_prefill_progress(Some(Box::new(move |d, t| s.lock().unwrap().push((d, t)))));
    // 100 tokens in batches of 32: before the first, then after each (the last is 4 tokens).
    let reported = run(&mut e, &p, 2);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![(0, 100), (32, 100), (64, 100), (96, 100), (100, 100)]
    );
    assert_eq!(reported, plain, "progress reports changed the pass");
    // A prompt of one batch or less, and decode steps, report nothing.
    seen.lock().unwrap().clear();
    run(&mut e, &p[..32], 3);
    assert!(seen.lock().unwrap().is_empty());
    // Cleared: nothing more is reported.
    e.set_prefill_progress(None);
    run(&mut e, &p, 1);
    assert!(seen.lock().unwrap().is_empty());
}
