//! The speed probe: a few seconds that say how fast this machine runs now against the moment
//! `flashlm calibrate` measured it. A shared VM's memory and disk speeds move by a factor of
//! two or more within hours, so a bench takes a probe before each run and predicts that run
//! from the calibration carried to the probe's speed ([`Calibration::rescaled`]), beside the
//! prediction from the calibration as saved.
//!
//! The probe is a resident decode of the calibrated model (the pass that fits the in-pass
//! compute factor, [`PROBE_RUNS`] runs of [`PROBE_TOKENS`] tokens, median) and cold direct
//! reads of [`PROBE_READ_BYTES`] of its file at each of two piece sizes (median of
//! [`PROBE_READS`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::io::direct_read_gb_s;
use super::median;
use crate::engine::{Engine, EngineOptions};
use crate::flash::source::FlashSource;
use crate::flash::{FlashFile, ReaderOptions};
use crate::gpu::GpuOptions;
use crate::plan::perf::{Calibration, PROBE_LARGE_PIECE, PROBE_SMALL_PIECE, Probe};
use crate::sampling::{Sampler, SamplerParams};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Counted resident runs per probe, and tokens each.
pub const PROBE_RUNS: usize = 3;
pub const PROBE_TOKENS: usize = 8;
/// Bytes of each probe read (the calibration's sweep reads as many), and reads per size.
pub const PROBE_READ_BYTES: u64 = 32 << 20;
pub const PROBE_READS: usize = 3;

/// A resident engine of the calibrated model, kept for the probes of a bench.
pub struct Prober {
    engine: Engine,
    path: PathBuf,
    prompt: Vec<u32>,
}

impl Prober {
    /// A resident engine of the model at `path`, warmed up (its first steps build the
    /// pipelines).
    pub fn new(path: &Path, gpu: &GpuOptions) -> BenchResult<Self> {
        let model = crate::model::load_model(path)?;
        let o = EngineOptions {
            gpu: GpuOptions {
                budget: None,
                ..gpu.clone()
            },
            ctx: Some(64),
            ..Default::default()
        };
        let file = FlashFile::open(path, ReaderOptions::default())?;
        let engine =
            Engine::with_source(model.gguf.clone(), Arc::new(FlashSource::new(file, 0)), &o)?;
        let vocab = model.cfg.vocab_size.max(1) as u32;
        let prompt = (0..16u32).map(|i| (i * 7 + 1) % vocab).collect();
        let mut p = Prober {
            engine,
            path: path.to_path_buf(),
            prompt,
        };
        p.decode_ms()?;
        Ok(p)
    }

    /// The prober for `cal`'s model, None (saying why) when `cal` has no probe or its model
    /// cannot be loaded: the bench then predicts from the calibration as saved.
    pub fn for_calibration(cal: Option<&Calibration>, gpu: &GpuOptions) -> Option<Self> {
        let probe = cal?.probe.as_ref()?;
        let path = PathBuf::from(&probe.model);
        match Prober::new(&path, gpu) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!(
                    "speed probe unavailable ({}: {e}); predicting from the calibration as saved",
                    path.display()
                );
                None
            }
        }
    }

    fn decode_ms(&mut self) -> BenchResult<f64> {
        let mut sm = Sampler::new(SamplerParams {
            temperature: 0.0,
            ..Default::default()
        });
        self.engine.reset();
        let (_, st) =
            self.engine
                .generate(&self.prompt, PROBE_TOKENS, &mut sm, |_| false, |_| true)?;
        Ok(st.ms_per_token)
    }

    /// Measure the machine's speed now.
    pub fn take(&mut self) -> BenchResult<Probe> {
        let mut ms = Vec::with_capacity(PROBE_RUNS);
        for _ in 0..PROBE_RUNS {
            ms.push(self.decode_ms()?);
        }
        let small = direct_read_gb_s(&self.path, PROBE_SMALL_PIECE, PROBE_READ_BYTES, PROBE_READS)?;
        let large = direct_read_gb_s(&self.path, PROBE_LARGE_PIECE, PROBE_READ_BYTES, PROBE_READS)?;
        Ok(Probe {
            model: self.path.display().to_string(),
            resident_ms: median(&mut ms),
            flash_small_gb_s: small,
            flash_large_gb_s: large,
        })
    }
}

/// `cal` carried to the speed of a probe `p` takes now, and that probe's line for the log.
pub fn probed(cal: &Calibration, p: &mut Prober) -> BenchResult<(Calibration, String)> {
    let now = p.take()?;
    let line = match &cal.probe {
        Some(then) => format!(
            "probe: resident {:.1} ms/token ({:.2}x the calibration's), reads {:.2} / {:.2} GB/s ({:.2}x / {:.2}x)",
            now.resident_ms,
            now.resident_ms / then.resident_ms.max(1e-9),
            now.flash_small_gb_s,
            now.flash_large_gb_s,
            now.flash_small_gb_s / then.flash_small_gb_s.max(1e-12),
            now.flash_large_gb_s / then.flash_large_gb_s.max(1e-12),
        ),
        None => String::new(),
    };
    Ok((cal.rescaled(&now), line))
}
