//! The planner's choices for a matrix of budgets — placement, prefetch depth, staging-ring size
//! and I/O mode: each plans within its budget, runs without exceeding it, and gives the tokens
//! of the all-resident run; `flashlm plan` prints the choice `run` makes; the performance model
//! on a real plan of a synthetic model matches numbers worked out by hand.
mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flashlm::engine::{Engine, EngineError, EngineOptions, PlacementError};
use flashlm::flash::source::FlashSource;
use flashlm::flash::{FlashFile, IoMode, ReaderOptions};
use flashlm::gguf::{GgmlType, GgufFile};
use flashlm::gpu::GpuOptions;
use flashlm::model::config::ModelConfig;
use flashlm::model::synthetic::{SyntheticSpec, synthetic_llama};
use flashlm::plan::choose::{Space, choose, placement_summary};
use flashlm::plan::perf::{Calibration, FlashRate, RunIo, SelectCost, predict_token, token_work};
use flashlm::plan::{ExecPlan, KvSelect, PlanOptions, ResidentSpec, SelectSpec};
use flashlm::sampling::{Sampler, SamplerParams};

use common::{calibration, rate};

/// A machine where small reads are slow (larger ring slots read faster) and dispatches are
/// dear (an output head streamed in many chunks costs more than one resident).
fn piecewise_calibration() -> Calibration {
    Calibration {
        flash: vec![
            rate("direct", 4096, 1, 0.01),
            rate("direct", 32768, 1, 0.2),
            rate("mmap", 1 << 20, 4, 0.001),
        ],
        dispatch_s: 1e-3,
        sync_s: 0.0,
        ..calibration(1.0, 1.0)
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

fn scratch(name: &str) -> PathBuf {
    let dir = common::scratch(&format!("planner-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn small_spec() -> SyntheticSpec {
    SyntheticSpec {
        n_layers: 6,
        n_embd: 128,
        n_heads: 4,
        n_kv_heads: 2,
        n_ff: 256,
        vocab: 2000,
        weight_type: GgmlType::Q8_0,
        ctx: 128,
        untied_output: true,
    }
}

#[test]
fn planner_choices_fit_and_run_for_every_budget() {
    if common::gpu().is_none() {
        return;
    }
    let path = scratch("matrix").join("m.gguf");
    std::fs::write(&path, synthetic_llama(&small_spec(), 3)).unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let base = EngineOptions {
        ctx: Some(64),
        ring_chunk: 8192,
        head_chunk: Some(16384),
        upload: flashlm::engine::UploadMode::Staging,
        ..Default::default()
    };
    let prompt: Vec<u32> = (0..9).map(|i| (i * 211 + 5) % 2000).collect();
    let gpu = common::gpu().unwrap();
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
    // Every knob open; ring slots sized for this small model.
    let space = Space {
        prefetches: vec![1, 2, 3],
        modes: vec![IoMode::Direct, IoMode::Mmap],
        ring_chunks: vec![4096, 8192, 32768],
        placements: true,
    };
    let mut seen = HashSet::new();
    let mut ran = HashSet::new();
    for cal in [
        calibration(0.05, 2.0),
        calibration(5.0, 0.01),
        piecewise_calibration(),
    ] {
        // From the least that runs to more than everything resident needs.
        for k in 0..=5u64 {
            let budget = min + (all - min) * k / 4;
            let mut o = base.clone();
            o.gpu = GpuOptions {
                budget: Some(budget),
                ..Default::default()
            };
            // Planned as the engine will plan on this device (its norms, its upload path).
            let po = Engine::device_plan_options(&o, &gpu).unwrap();
            let c = choose(&gguf, &cfg, &po, 128 << 20, &cal, prompt.len(), &space, &io)
                .unwrap_or_else(|| panic!("no plan for budget {budget}"));
            assert!(c.ms_per_token.is_finite() && c.ms_per_token > 0.0);
            assert!(c.total <= budget, "budget {budget}: {c:?}");
            if k == 5 {
                assert_eq!(c.placement, "all 6 layers and the head resident", "{c:?}");
                assert_eq!(c.ring_slots, 0, "{c:?}");
            }
            // No candidate the planner could have taken predicts faster: the fixed rules'
            // choice for the same prefetch, mode and ring is never better.
            let mut fixed = po.clone();
            fixed.prefetch = c.prefetch;
            fixed.ring_chunk = c.ring_chunk;
            let f = choose(
                &gguf,
                &cfg,
                &fixed,
                128 << 20,
                &cal,
                prompt.len(),
                &Space::fixed(&fixed, c.io),
                &io,
            );
            if let Some(f) = f {
                assert!(c.ms_per_token <= f.ms_per_token + 1e-12, "{c:?} vs {f:?}");
            }
            let head_first = matches!(c.resident, ResidentSpec::List { head: true, .. });
            // The ring size counts where there is a ring.
            let ring = (c.ring_slots > 0).then_some(c.ring_chunk);
            seen.insert((c.io.to_string(), ring, head_first, c.prefetch));
            // The engine built from the choice: its placement, within the budget, the tokens
            // of the all-resident run.
            if !ran.insert((budget, format!("{c:?}"))) {
                continue;
            }
            o.prefetch = c.prefetch;
            o.ring_chunk = c.ring_chunk;
            o.resident = c.resident.clone();
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
            assert_eq!(placement_summary(&e.placement), c.placement, "{c:?}");
            assert_eq!(e.plan.total, c.total, "{c:?}");
            assert_eq!(greedy(&mut e, &prompt), want, "budget {budget}: {c:?}");
            let peak = e.ctx.budget.peak();
            assert!(peak <= budget, "budget {budget}: peak {peak} ({c:?})");
        }
    }
    // The machines lead to different choices of I/O mode, ring size and placement.
    let modes: HashSet<&str> = seen.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(modes.len(), 2, "{seen:?}");
    eprintln!("choices (I/O, ring chunk, head first, prefetch): {seen:?}");
    let rings: HashSet<u64> = seen.iter().filter_map(|s| s.1).collect();
    assert!(rings.len() >= 2, "{seen:?}");
    assert!(
        seen.iter().any(|s| s.2),
        "no head-first placement: {seen:?}"
    );
    assert!(seen.iter().any(|s| !s.2), "{seen:?}");
}

/// A small Q8_0 model: d 64, 2 heads of 32 (one KV head: KV width 32), FFN 128, an untied
/// head of 2000 x 64, `n_layers` layers.
fn small_q8_model(name: &str, n_layers: usize, ctx: usize, seed: u64) -> (GgufFile, ModelConfig) {
    let spec = SyntheticSpec {
        n_layers,
        n_embd: 64,
        n_heads: 2,
        n_kv_heads: 1,
        n_ff: 128,
        vocab: 2000,
        weight_type: GgmlType::Q8_0,
        ctx,
        untied_output: true,
    };
    let path = scratch(name).join("m.gguf");
    std::fs::write(&path, synthetic_llama(&spec, seed)).unwrap();
    let gguf = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    (gguf, cfg)
}

/// Direct reads of 1 MiB pieces over 4 threads, no host cache, through the staging ring.
fn direct_io() -> RunIo {
    RunIo {
        mode: "direct".into(),
        piece: 1 << 20,
        threads: 4,
        dram: 0,
        in_place: false,
    }
}

/// [`calibration`]'s constants with other flash rates and host round trips.
fn hand_calibration(flash: Vec<FlashRate>, sync_s: f64) -> Calibration {
    Calibration {
        flash,
        sync_s,
        ..calibration(1.0, 1.0)
    }
}

#[test]
fn token_work_of_a_real_plan_matches_hand_numbers() {
    // Two Q8_0 layers (34 bytes per 32 weights), d 64, 2 heads of 32 (one KV head: KV width
    // 32), FFN 128, an untied head of 2000 x 64; every weight streams.
    let (gguf, cfg) = small_q8_model("hand", 2, 64, 5);
    let po = PlanOptions {
        ctx: Some(64),
        ring_chunk: 8192,
        resident: ResidentSpec::parse("none", 2).unwrap(),
        ..Default::default()
    };
    let plan = ExecPlan::new(&gguf, &cfg, 128 << 20, &po).unwrap();
    let io = direct_io();
    let w = token_work(&plan, 40, &io, 0.5);
    // A layer: Q 64x64 (4352 bytes), K and V 32x64 (2176 each), O 64x64 (4352), gate, up and
    // down 128x64 (8704 each): 39168 bytes. The head: 2000 x 64 = 136000 bytes.
    let layer = 39_168u64;
    let head = 136_000u64;
    assert_eq!(w.matrix_bytes("Q8_0"), 2 * layer + head);
    assert_eq!(w.weight_flash_bytes, 2 * layer + head);
    assert_eq!(w.weight_upload_bytes, 2 * layer + head);
    // Per layer: two RMSNorms, RoPE with the KV store, Q, K and V in one dispatch, O, gate
    // with up, down, and one attention round (40 keys: one split, no merge) = 8; then the
    // final norm and the head in one chunk (512 KiB chunks hold its 136000 bytes): 16 + 2.
    assert_eq!(w.dispatches, 18);
    // Attention reads 40 keys x (K and V) x 32 x 2 bytes (f16) in each of 2 layers.
    assert_eq!(w.attn_bytes, 40 * 2 * 32 * 2 * 2);
    // Every page stays on the device: no KV I/O.
    assert_eq!((w.kv_flash_bytes, w.kv_upload_bytes), (0.0, 0.0));
    // Through 8 KiB ring slots a read is one 8 KiB piece on one thread.
    assert_eq!((w.piece, w.threads), (8192, 1));
    assert_eq!(w.slots, 2);
    // Five ring slots of 8 KiB hold a whole layer: reads never wait on the ring.
    assert_eq!((plan.ring_slots, w.ring_share), (5, None));
    let cal = hand_calibration(
        vec![
            rate("direct", 8192, 1, 0.5),
            rate("direct", 1 << 20, 4, 3.0),
        ],
        0.0,
    );
    let p = predict_token(&cal, &w);
    // In µs: compute = 214336 bytes at 1 GB/s (214.336) + 18 dispatches (360) + 10240 KV
    // bytes at 1 GB/s (10.24) = 584.576; weight I/O = 214336 bytes at 0.5 GB/s (428.672)
    // + uploaded at 4 GB/s (53.584) = 482.256.
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert!(close(p.compute_ms * 1e3, 584.576), "{p:?}");
    assert!(close(p.weight_io_ms * 1e3, 482.256), "{p:?}");
    assert!(close(p.kv_io_ms, 0.0));
    // The pipeline, µs: a layer reads r = 78.336, copies u = 9.792 and computes c = 39.168 +
    // (360 + 10.24) / 2 = 224.288; the head reads 272, copies 34, computes 136.
    // Layer 0: read [0, r], copy to r + u, compute to r + u + c = 312.416. Layer 1's read
    // waits for that copy: [r + u, 2r + u]; its copy runs after layer 0 computed: to 322.208,
    // compute to 546.496 (the last copy ended at 322.208). The head's read waits for it:
    // [322.208, 594.208], copy to 628.208, compute to 764.208: the first pass of a run.
    // In a run of passes the next one's layer 0 is read once the reader is free and the
    // head's copy ran: [628.208, 706.544], copied after the head computed (764.208) to 774.0,
    // computed to 998.288; layer 1 read [774.0, 852.336], copied to 1008.08, computed to
    // 1232.368; the head read [1008.08, 1280.08], copied to 1314.08, computed to 1450.08:
    // 685.872 a pass, and the same again in the pass after.
    // Serial: 2 (r + u + c) + 272 + 34 + 136 = 1066.832; hidden 380.96; with beta 0.3:
    // 685.872 + 114.288 = 800.16.
    assert!(close(p.pipelined_ms * 1e3, 685.872), "{p:?}");
    assert!(close(p.overlapped_ms * 1e3, 380.96), "{p:?}");
    assert!(close(p.ms_per_token * 1e3, 800.16), "{p:?}");
    // Read in place, a read is the reader's own: 1 MiB pieces over 4 threads, and no copies.
    let w = token_work(
        &plan,
        40,
        &RunIo {
            in_place: true,
            ..io.clone()
        },
        0.5,
    );
    assert_eq!((w.piece, w.threads, w.weight_upload_bytes), (1 << 20, 4, 0));
    // A host cache of a layer and a half pins the first bytes a pass reads: all of layer 0
    // and half of layer 1 come from DRAM, the rest of layer 1 and the head from flash; every
    // byte is still copied to the device.
    let w = token_work(
        &plan,
        40,
        &RunIo {
            dram: layer + layer / 2,
            ..io.clone()
        },
        0.5,
    );
    let flash: Vec<f64> = w.stages.iter().map(|s| s.flash_bytes).collect();
    assert_eq!(flash, vec![0.0, (layer / 2) as f64, head as f64]);
    assert_eq!(w.weight_flash_bytes, layer / 2 + head);
    let up: Vec<f64> = w.stages.iter().map(|s| s.upload_bytes).collect();
    assert_eq!(up, vec![layer as f64, layer as f64, head as f64]);
    // Priced: layer 0 reads nothing, layer 1 reads 19584 bytes (39.168 µs at 0.5 GB/s) and
    // the head 272 µs; copies and compute as above. Layer 0: copy [0, u], compute to
    // u + c = 234.08; layer 1's read [u, u + 39.168] (after layer 0's copy), its copy after
    // layer 0's compute: to 243.872, compute to 468.16; the head's read [243.872, 515.872],
    // copy to 549.872, compute to 685.872. The next pass is the same (layer 0 reads
    // nothing): copy after the head [685.872, 695.664], ..., the head computed at 1371.744.
    let p = predict_token(&cal, &w);
    assert!(close(p.pipelined_ms * 1e3, 685.872), "{p:?}");
    // The bytes the cache serves are copied by the I/O thread into the staging ring: layer 0
    // and half of layer 1.
    let copies: Vec<f64> = w.stages.iter().map(|s| s.copy_bytes).collect();
    assert_eq!(copies, vec![layer as f64, (layer / 2) as f64, 0.0]);
    assert_eq!(w.weight_copy_bytes, (layer + layer / 2) as f64);
    assert_eq!(w.kv_copy_bytes, 0.0);
    // Priced at 1 GB/s, µs: weight I/O gains 58.752 (155584 flash bytes at 0.5 GB/s = 311.168,
    // 214336 uploaded at 4 GB/s = 53.584: 423.504). In the pipeline layer 0 now reads (copies)
    // [0, 39.168], copies to the device to 48.96, computes to 273.248; layer 1 reads 39.168 +
    // 19.584 from 48.96 to 107.712, copies after layer 0's compute to 283.04, computes to
    // 507.328; the head reads [283.04, 555.04], copies to 589.04, computes to 725.04: the
    // first pass. The next pass's layer 0 reads once the head's copy ran: [589.04, 628.208],
    // copies after the head computed, to 734.832, computes to 959.12; layer 1 reads
    // [734.832, 793.584], copies to 968.912, computes to 1193.2; the head reads [968.912,
    // 1240.912], copies to 1274.912, computes to 1410.912: 685.872 a pass (so is the next).
    let copying = Calibration {
        host_copy_gb_s: 1.0,
        ..cal.clone()
    };
    let p = predict_token(&copying, &w);
    assert!(close(p.weight_io_ms * 1e3, 423.504), "{p:?}");
    assert!(close(p.pipelined_ms * 1e3, 685.872), "{p:?}");
}

#[test]
fn kv_pages_are_copied_once_from_flash_and_twice_from_the_host_cache() {
    // Four layers, 16-token pages, a budget that keeps the KV cache on flash: each page a
    // layer attends that is away from the device is read into the job's buffer (from flash:
    // no copy) or copied into it (host cache), then copied into the staging ring.
    let (gguf, cfg) = small_q8_model("kvcopy", 4, 1024, 7);
    let po = PlanOptions {
        ctx: Some(1024),
        kv_page: Some(16),
        ..Default::default()
    };
    let plan = (1u64..4096)
        .map(|kib| ExecPlan::new(&gguf, &cfg, kib << 10, &po))
        .find_map(Result::ok)
        .unwrap();
    assert!(
        plan.kv.streams,
        "the smallest plan keeps the KV cache on the device"
    );
    let none = token_work(&plan, 1000, &direct_io(), 0.5);
    assert!(none.kv_flash_bytes > 0.0);
    assert_eq!(none.kv_flash_bytes, none.kv_upload_bytes);
    assert_eq!(none.kv_copy_bytes, none.kv_upload_bytes);
    // A host cache holding every weight and every page: nothing from flash, two copies each.
    let all = token_work(
        &plan,
        1000,
        &RunIo {
            dram: 1 << 30,
            ..direct_io()
        },
        0.5,
    );
    assert_eq!(all.kv_flash_bytes, 0.0);
    assert_eq!(all.kv_upload_bytes, none.kv_upload_bytes);
    assert_eq!(all.kv_copy_bytes, 2.0 * all.kv_upload_bytes);
    // Page selection without a cache: the pages the previous token's selection prefetched are
    // copied twice more (out of the prefetch's buffer, into the job's).
    let qo = PlanOptions {
        kv_select: Some(KvSelect {
            spec: SelectSpec::Percent(25.0),
            dense_layers: 1,
            lagged: false,
        }),
        ..po.clone()
    };
    let quest_plan = (1u64..4096)
        .map(|kib| ExecPlan::new(&gguf, &cfg, kib << 10, &qo))
        .find_map(Result::ok)
        .unwrap();
    assert!(quest_plan.kv.streams);
    let quest = token_work(&quest_plan, 1000, &direct_io(), 0.5);
    let kv = flashlm::plan::perf::kv_prediction(&quest_plan, 1000, 0, 0.5);
    assert!(kv.prefetched_bytes_per_token > 0.0);
    let expected = quest.kv_upload_bytes + 2.0 * kv.prefetched_bytes_per_token;
    assert!(
        (quest.kv_copy_bytes - expected).abs() < 1e-6,
        "{} {expected}",
        quest.kv_copy_bytes
    );
    // Priced: the copies add to the KV I/O at the host copy rate.
    let cal = hand_calibration(vec![rate("direct", 1 << 20, 4, 1.0)], 0.0);
    let copying = Calibration {
        host_copy_gb_s: 2.0,
        ..cal.clone()
    };
    let (a, b) = (predict_token(&cal, &all), predict_token(&copying, &all));
    let added_ms = all.kv_copy_bytes / 2e9 * 1e3;
    assert!(
        (b.kv_io_ms - a.kv_io_ms - added_ms).abs() < 1e-9,
        "{a:?} {b:?}"
    );
}

#[test]
fn selecting_layers_wait_for_their_page_scores() {
    // Six layers, two of them dense; 16-token pages. Page selection keeping a quarter makes
    // each of the four selecting layers read its page scores back once a token, once there are
    // candidates to leave out; exact attention never does.
    let (gguf, cfg) = small_q8_model("syncs", 6, 1024, 6);
    let io = direct_io();
    let plan_with = |kv_select| {
        let po = PlanOptions {
            ctx: Some(1024),
            kv_page: Some(16),
            kv_select,
            ..Default::default()
        };
        ExecPlan::new(&gguf, &cfg, 128 << 20, &po).unwrap()
    };
    let quest = plan_with(Some(KvSelect {
        spec: SelectSpec::Percent(25.0),
        dense_layers: 2,
        lagged: false,
    }));
    assert_eq!(token_work(&quest, 1000, &io, 0.5).syncs, 4);
    // 40 tokens: three pages, page 0 and the recent window always attended, none to rank.
    assert_eq!(token_work(&quest, 40, &io, 0.5).syncs, 0);
    assert_eq!(token_work(&plan_with(None), 1000, &io, 0.5).syncs, 0);
    // A lagged selection reads every layer's scores back once, at the end of the token, and
    // reads its pages ahead: none is read only once chosen, none prefetched.
    let lagged = plan_with(Some(KvSelect {
        spec: SelectSpec::Percent(25.0),
        dense_layers: 2,
        lagged: true,
    }));
    let lw = token_work(&lagged, 1000, &io, 0.5);
    assert_eq!(lw.syncs, 1);
    let qw = token_work(&quest, 1000, &io, 0.5);
    assert!(lw.kv_serial_share <= qw.kv_serial_share);
    assert_eq!(lw.kv_upload_bytes, qw.kv_upload_bytes);
    // Each wait adds its time as compute (this pass is bound by it).
    let cal = |sync_s| hand_calibration(vec![rate("direct", 1 << 20, 4, 1.0)], sync_s);
    let w = token_work(&quest, 1000, &io, 0.5);
    let (a, b) = (predict_token(&cal(0.0), &w), predict_token(&cal(1e-3), &w));
    assert!(
        (b.ms_per_token - a.ms_per_token - 4.0).abs() < 1e-9,
        "{a:?} {b:?}"
    );
    let (a, b) = (
        predict_token(&cal(0.0), &lw),
        predict_token(&cal(1e-3), &lw),
    );
    assert!(
        (b.ms_per_token - a.ms_per_token - 1.0).abs() < 1e-9,
        "{a:?} {b:?}"
    );
    // The four selecting layers score the 62 full pages of 1000 tokens (exact attention
    // scores none); a measured cost of 10 µs a layer and 1 µs a page adds 4 × (10 + 62) µs
    // of compute.
    assert_eq!((qw.select_layers, qw.select_pages), (4, 4 * 62));
    let exact = token_work(&plan_with(None), 1000, &io, 0.5);
    assert_eq!((exact.select_layers, exact.select_pages), (0, 0));
    let priced = Calibration {
        select: Some(SelectCost {
            layer_s: 10e-6,
            page_s: 1e-6,
        }),
        ..cal(0.0)
    };
    let (a, b) = (predict_token(&cal(0.0), &qw), predict_token(&priced, &qw));
    assert!(
        (b.compute_ms - a.compute_ms - 0.288).abs() < 1e-9,
        "{a:?} {b:?}"
    );
}

/// The lines of `text` that start with `prefix`.
fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    text.lines().filter(|l| l.starts_with(prefix)).collect()
}

fn flashlm(home: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_flashlm"));
    c.env("FLASHLM_HOME", home);
    c
}

#[test]
fn plan_prints_the_choice_run_makes() {
    if common::gpu().is_none() {
        return;
    }
    let dir = scratch("cli");
    let spec = SyntheticSpec {
        n_layers: 4,
        n_embd: 512,
        n_heads: 8,
        n_kv_heads: 4,
        n_ff: 1536,
        vocab: 4000,
        weight_type: GgmlType::Q8_0,
        ctx: 256,
        untied_output: true,
    };
    let model = dir.join("m.gguf");
    std::fs::write(&model, synthetic_llama(&spec, 9)).unwrap();
    let gguf = GgufFile::open(&model).unwrap();
    let cfg = ModelConfig::from_gguf(&gguf).unwrap();
    let all = ExecPlan::new(&gguf, &cfg, 128 << 20, &PlanOptions::default())
        .unwrap()
        .total;
    // Two MiB short of everything resident: something streams.
    let budget = (all - (2 << 20)).to_string();
    let uncalibrated = dir.join("empty");
    std::fs::create_dir_all(&uncalibrated).unwrap();
    let home = dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The calibration records the device, as `flashlm calibrate` does, so plan plans as run.
    let cal = Calibration {
        device: Some(Engine::device_facts(&common::gpu().unwrap()).unwrap()),
        ..piecewise_calibration()
    };
    std::fs::write(
        home.join("calibration.json"),
        serde_json::to_string(&cal).unwrap(),
    )
    .unwrap();
    let stats = dir.join("stats.json");
    let common_args = ["--gpu-budget", &budget, "--upload", "staging", "-n", "4"];
    let run = |home: &Path| {
        let out = flashlm(home)
            .args(["run", "-p", "one two three four five", "--temp", "0", "-m"])
            .arg(&model)
            .args(common_args)
            .arg("--stats-json")
            .arg(&stats)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{err}");
        err
    };
    // Not calibrated: the fixed rules, said once.
    let err = run(&uncalibrated);
    assert_eq!(err.matches("`flashlm calibrate`").count(), 1, "{err}");
    assert!(lines(&err, "planner: placement").is_empty(), "{err}");
    // Calibrated: run and plan choose the same, and run's placement is the plan's.
    let err = run(&home);
    let chosen = lines(&err, "planner: placement");
    assert_eq!(chosen.len(), 1, "{err}");
    let j: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    let prompt = j["prompt_ids"].as_array().unwrap().len().to_string();
    let out = flashlm(&home)
        .args(["plan", "--prompt-tokens", &prompt, "-m"])
        .arg(&model)
        .args(common_args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lines(&text, "planner: placement"), chosen, "{text}");
    let placement = j["placement"].as_str().unwrap();
    assert!(text.lines().any(|l| l == placement), "{placement}\n{text}");
    assert!(text.contains("predicted (calibration of test)"), "{text}");
    // A flag fixes its knob, and the planner says so.
    let out = flashlm(&home)
        .args(["plan", "--io", "mmap", "--ring-chunk", "1MiB", "-m"])
        .arg(&model)
        .args(common_args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let line = lines(&text, "planner: placement");
    assert_eq!(line.len(), 1, "{text}");
    assert!(
        line[0].contains("I/O mmap") && line[0].contains("x 1024 KiB"),
        "{text}"
    );
    assert!(line[0].ends_with("fixed by --io, --ring-chunk"), "{text}");
}
