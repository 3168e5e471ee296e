mod common;
use std::sync::Arc;
use flashlm::engine::{Engine, EngineOptions};
use flashlm::gguf::GgufFile;
use flashlm::sampling::{Sampler, SamplerParams};
#[test]
fn scratch() {
    let path = common::model_path().unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let t = std::time::Instant::now();
    let mut engine = Engine::new(gguf.clone(), &EngineOptions::default()).unwrap();
    eprintln!("load {:?}", t.elapsed());
    let prompt = vec![504, 3575, 282, 4649, 314];
    let mut s = Sampler::new(SamplerParams { temperature: 0.0, ..Default::default() });
    let (ids, stats) = engine.generate(&prompt, 16, &mut s, |_| false, |_| true).unwrap();
    eprintln!("{ids:?} {stats:?}");
}
#[test]
fn scratch_bw() {
    let path = common::model_path().unwrap();
    let gguf = Arc::new(GgufFile::open(&path).unwrap());
    let mut engine = Engine::new(gguf.clone(), &EngineOptions::default()).unwrap();
    let b = engine.matvec_weight_bytes();
    engine.time_matvecs(1).unwrap();
    let t = engine.time_matvecs(4).unwrap();
    eprintln!("matvec {} bytes, {:.3} GB/s, {:.1} ms per pass", b, (4*b) as f64 / t / 1e9, t*1000.0/4.0);
    let t = engine.time_weight_copies(4).unwrap();
    eprintln!("copy {:.3} GB/s", (4*b) as f64 / t / 1e9);
    let t0 = std::time::Instant::now();
    for _ in 0..5 { engine.forward(&[42]).unwrap(); }
    eprintln!("forward {:?}", t0.elapsed() / 5);
}
