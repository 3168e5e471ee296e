//! Page selection's kernels in one selecting layer of a decode step (page summaries and
//! scores): median µs at 16, 64 and 256 pages (9 timings each), with the default model's head
//! shape. Shader work: set FLASHLM_SHADER_DIR to try a changed shaders/kv.wgsl without
//! rebuilding.
fn main() {
    // Mesa's software rasterizers get twice the CPUs as worker threads, as `flashlm` gives them.
    // SAFETY: no other thread exists yet.
    unsafe { flashlm::gpu::softdriver::tune_threads() };
    let path = flashlm::paths::default_model_path();
    let model = flashlm::model::load_model(&path).expect("the default model");
    let ctx =
        flashlm::gpu::GpuContext::new(&flashlm::gpu::GpuOptions::default()).expect("a GPU adapter");
    for pages in [16u32, 64, 256] {
        let mut v: Vec<f64> = (0..9)
            .map(|_| flashlm::bench::calibrate::select_layer_s(&ctx, &model.cfg, pages).unwrap())
            .collect();
        let m = flashlm::bench::median(&mut v);
        println!(
            "pages {pages:4}: {:8.1} µs a layer, {:6.2} µs a page",
            m * 1e6,
            m * 1e6 / pages as f64
        );
    }
}
