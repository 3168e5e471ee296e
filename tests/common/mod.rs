//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use flashlm::gpu::MatmulLayout;

/// The CPU layout with one row a thread in decode and with four, reading words (the default
/// walks two rows, four in the one-dispatch Q/K/V, reading Q4_1 rows as vec4s of two 64-bit
/// words after touching them), and with one row a thread (two in Q/K/V) reading vec4s of
/// 32-bit words without touches, so the kernel tests cover every decode walk.
pub const CPU_ROW_WALKS: [MatmulLayout; 3] = [
    MatmulLayout {
        rows_per_lane: 1,
        load_words: 1,
        multi_rows_per_lane: 1,
        ..MatmulLayout::CPU
    },
    MatmulLayout {
        rows_per_lane: 4,
        load_words: 1,
        multi_rows_per_lane: 4,
        ..MatmulLayout::CPU
    },
    MatmulLayout {
        rows_per_lane: 1,
        load64: false,
        touch_bytes: 0,
        multi_rows_per_lane: 2,
        ..MatmulLayout::CPU
    },
];

/// True when running under CI (`CI=true`): missing prerequisites fail instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// The real default model, or `None` (with a note) when it is absent outside CI.
/// Under CI a missing model fails the test.
pub fn model_path() -> Option<PathBuf> {
    let p = flashlm::paths::default_model_path();
    if p.is_file() {
        return Some(p);
    }
    if in_ci() {
        panic!("CI=true but {}", flashlm::paths::how_to_get_model());
    }
    eprintln!("skipping: {}", flashlm::paths::how_to_get_model());
    None
}

/// A GPU context on the default adapter, or `None` (with a note) when there is none outside CI.
/// Under CI a missing adapter fails the test.
pub fn gpu() -> Option<flashlm::gpu::GpuContext> {
    match flashlm::gpu::GpuContext::new(&Default::default()) {
        Ok(ctx) => Some(ctx),
        Err(e) => {
            if in_ci() {
                panic!("CI=true but no GPU adapter: {e}");
            }
            eprintln!("skipping: no GPU adapter: {e}");
            None
        }
    }
}

/// A small deterministic generator for test data.
pub struct Rng(pub u64);

impl Rng {
    /// The sampler's SplitMix64 step; the tuple field is its state.
    pub fn next_u64(&mut self) -> u64 {
        let mut g = flashlm::sampling::SplitMix64(self.0);
        let v = g.next_u64();
        self.0 = g.0;
        v
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
}

/// The scratch directory `<name>-<pid>` under the test target's temporary directory, created
/// if absent (tests of one process may share it, so it is never emptied here).
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A `chat_template` fuzzer input kept in `tests/fixtures/chat/`: its first byte's low bit asks
/// for the generation prompt; the rest is the template, then NUL-separated message contents
/// (here all user messages).
pub struct ChatFixture {
    pub template: String,
    pub messages: Vec<flashlm::model::chat::ChatMessage>,
    pub generation_prompt: bool,
}

pub fn chat_fixture(name: &str) -> ChatFixture {
    let path = format!("{}/tests/fixtures/chat/{name}", env!("CARGO_MANIFEST_DIR"));
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (&flags, rest) = data.split_first().expect("an empty fixture");
    let text = String::from_utf8_lossy(rest).into_owned();
    let mut parts = text.split('\u{0}');
    let template = parts.next().unwrap_or("").to_string();
    ChatFixture {
        template,
        messages: parts.map(flashlm::model::chat::ChatMessage::user).collect(),
        generation_prompt: flags & 1 == 1,
    }
}

pub fn rate(mode: &str, piece: u64, threads: usize, gb_s: f64) -> flashlm::plan::perf::FlashRate {
    use flashlm::plan::perf::FlashRate;
    FlashRate {
        mode: mode.into(),
        piece,
        threads,
        gb_s,
    }
}

/// A calibration for tests: a machine where reads run at `direct_gb_s` and `mmap_gb_s` whatever their size, so the
/// choice of I/O mode is not always the same.
pub fn calibration(direct_gb_s: f64, mmap_gb_s: f64) -> flashlm::plan::perf::Calibration {
    flashlm::plan::perf::Calibration {
        adapter: "test".into(),
        flash: vec![
            rate("direct", 1 << 20, 4, direct_gb_s),
            rate("mmap", 1 << 20, 4, mmap_gb_s),
        ],
        upload_gb_s: 4.0,
        matvec_gb_s: [("Q8_0".to_string(), 1.0)].into(),
        prefill_gb_s: [("Q8_0".to_string(), 4.0)].into(),
        dispatch_s: 20e-6,
        attn_gb_s: 1.0,
        overlap_beta: 0.3,
        ..Default::default()
    }
}

/// The smallest device budget the engine accepts for the model `gguf` under the options `o`
/// (found by offering 1 KiB and reading the minimum from the placement error).
pub fn min_budget(
    gguf: &std::sync::Arc<flashlm::gguf::GgufFile>,
    o: &flashlm::engine::EngineOptions,
) -> u64 {
    use flashlm::engine::{Engine, EngineError, PlacementError};
    let mut t = o.clone();
    t.gpu.budget = Some(1024);
    match Engine::new(gguf.clone(), &t) {
        Err(EngineError::Placement(PlacementError::TooSmall { minimum, .. })) => minimum,
        Err(e) => panic!("expected a too-small budget error, got {e}"),
        Ok(_) => panic!("a 1 KiB budget was accepted"),
    }
}
