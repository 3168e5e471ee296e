//! Attention rates: median KV GB/s (9 timings each) at each `ROWSxKEYS` point given (default:
//! decode steps over 1,024 and 4,096 keys), with the default model's head shape. One row is a
//! decode step; more rows are a prefill batch ending at the last key, its rate counted over the
//! keys each row attends, as `calibrate` counts it. Shader work: set FLASHLM_SHADER_DIR to try
//! changed shaders/attention*.wgsl without rebuilding.
//!
//!     cargo run --release --example attn_probe -- 1x4096 64x512 64x2048 64x4096
fn main() {
    // Mesa's software rasterizers get twice the CPUs as worker threads, as `flashlm` gives them.
    // SAFETY: no other thread exists yet.
    unsafe { flashlm::gpu::softdriver::tune_threads() };
    let points: Vec<(u32, u32)> = std::env::args()
        .skip(1)
        .map(|a| {
            let parsed = a
                .split_once('x')
                .and_then(|(r, k)| Some((r.parse().ok()?, k.parse().ok()?)));
            match parsed {
                Some((r, k)) if r >= 1 && k >= r && k % 64 == 0 => (r, k),
                _ => {
                    eprintln!("{a:?}: expected ROWSxKEYS, keys a multiple of 64, at least ROWS");
                    std::process::exit(2);
                }
            }
        })
        .collect();
    let points = if points.is_empty() {
        vec![(1, 1024), (1, 4096)]
    } else {
        points
    };
    let path = flashlm::paths::default_model_path();
    let model = flashlm::model::load_model(&path).expect("the default model");
    let ctx =
        flashlm::gpu::GpuContext::new(&flashlm::gpu::GpuOptions::default()).expect("a GPU adapter");
    for (rows, keys) in points {
        let mut v: Vec<f64> = (0..9)
            .map(|_| {
                flashlm::bench::calibrate::attention_rate(&ctx, &model.cfg, rows, keys).unwrap()
            })
            .collect();
        let m = flashlm::bench::median(&mut v);
        println!("rows {rows:3} keys {keys:5}: {m:6.3} GB/s of KV");
    }
}
