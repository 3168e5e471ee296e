//! Use flashlm as a library: load a GGUF model, stream it under a device-memory budget from the
//! file with direct I/O, and print a greedy completion with the run's figures.
//!
//! ```sh
//! cargo run --release --example generate -- "The capital of France is" 16MiB
//! ```

use std::sync::Arc;

use flashlm::engine::{Engine, EngineOptions};
use flashlm::flash::source::FlashSource;
use flashlm::flash::{FlashFile, ReaderOptions};
use flashlm::gguf::GgufFile;
use flashlm::gpu::GpuOptions;
use flashlm::model::tokenizer::Tokenizer;
use flashlm::sampling::{Sampler, SamplerParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Mesa's software rasterizers get twice the CPUs as worker threads, as `flashlm` gives them.
    // SAFETY: no other thread exists yet.
    unsafe { flashlm::gpu::softdriver::tune_threads() };
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".into());
    let budget = match args.next() {
        Some(s) => Some(flashlm::flash::parse_size(&s)?),
        None => None,
    };
    let path = flashlm::paths::default_model_path();
    if !path.is_file() {
        return Err(flashlm::paths::how_to_get_model().into());
    }
    let gguf = Arc::new(GgufFile::open(&path)?);
    let tokenizer = Tokenizer::from_gguf(&gguf)?;
    let source = FlashSource::new(FlashFile::open(&path, ReaderOptions::default())?, 0);
    let opts = EngineOptions {
        gpu: GpuOptions {
            budget,
            ..Default::default()
        },
        ctx: Some(256),
        ..Default::default()
    };
    let mut engine = Engine::with_source(gguf, std::sync::Arc::new(source), &opts)?;
    println!("{}", engine.placement);
    let ids = tokenizer.encode(&prompt, false);
    let mut sampler = Sampler::new(SamplerParams {
        temperature: 0.0,
        ..Default::default()
    });
    let (out, stats) = engine.generate(
        &ids,
        32,
        &mut sampler,
        |id| tokenizer.is_end_of_generation(id),
        |_| true,
    )?;
    println!("{prompt}{}", tokenizer.decode(&out, true)?);
    println!(
        "{:.1} ms/token, {:.0} flash bytes/token, peak device {} bytes",
        stats.ms_per_token, stats.flash_bytes_per_token, stats.peak_device_bytes
    );
    Ok(())
}
