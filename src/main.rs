use clap::Parser;

fn main() {
    // Before any thread starts and before the first GPU context: the worker threads of Mesa's
    // software rasterizers, unless the user chose (gpu::softdriver).
    // SAFETY: no other thread exists yet.
    unsafe { flashlm::gpu::softdriver::tune_threads() };
    // A chat template render in a child process with limits (model::chat::sandbox).
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(flashlm::model::chat::sandbox::CHILD_ARG) {
        std::process::exit(flashlm::model::chat::sandbox::child_main(&args[1..]));
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = flashlm::cli::Cli::parse();
    if let Err(e) = flashlm::cli::main_with(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
