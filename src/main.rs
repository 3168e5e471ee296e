use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = flashlm::cli::Cli::parse();
    if let Err(e) = flashlm::cli::main_with(cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
