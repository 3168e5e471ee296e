//! `cargo bench --bench resident`: the all-resident benchmark on the default model
//! (the same as `flashlm bench resident`).

fn main() {
    // Mesa's software rasterizers get twice the CPUs as worker threads, as `flashlm` gives them.
    // SAFETY: no other thread exists yet.
    unsafe { flashlm::gpu::softdriver::tune_threads() };
    let path = flashlm::paths::default_model_path();
    if !path.is_file() {
        eprintln!("{}", flashlm::paths::how_to_get_model());
        std::process::exit(1);
    }
    let code = match flashlm::cli::main_with(<flashlm::cli::Cli as clap::Parser>::parse_from([
        "flashlm", "bench", "resident", "--runs", "5",
    ])) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            1
        }
    };
    std::process::exit(code);
}
