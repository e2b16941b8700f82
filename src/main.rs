//! The `recall` command line.

mod cli;

use std::process::ExitCode;

use clap::Parser;

// candle allocates a fresh buffer for every op's output; glibc serves large
// ones with new mmaps, whose pages the kernel must zero on first touch.
// mimalloc reuses freed memory instead.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("RECALL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("recall=info"));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .without_time()
        .init();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed pipe (`recall embed ... | head`) is not an error.
            if err
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            if let Some(paused) = err.downcast_ref::<cli::Paused>() {
                eprintln!("{paused}");
                return ExitCode::from(75);
            }
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
