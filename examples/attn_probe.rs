//! Decode attention rates: median KV GB/s of a decode step over 1,024 and 4,096 keys (9 timings
//! each), with the default model's head shape. Shader work: set FLASHLM_SHADER_DIR to try
//! changed shaders/attention*.wgsl without rebuilding.
fn main() {
    let path = flashlm::paths::default_model_path();
    let model = flashlm::model::load_model(&path).expect("the default model");
    let ctx =
        flashlm::gpu::GpuContext::new(&flashlm::gpu::GpuOptions::default()).expect("a GPU adapter");
    for (rows, keys) in [(1u32, 1024u32), (1, 4096)] {
        let mut v: Vec<f64> = (0..9)
            .map(|_| {
                flashlm::bench::calibrate::attention_rate(&ctx, &model.cfg, rows, keys).unwrap()
            })
            .collect();
        let m = flashlm::bench::median(&mut v);
        println!("rows {rows:3} keys {keys:5}: {m:6.3} GB/s of KV");
    }
}
