//! The `recall` command line.

mod cli;

use std::process::ExitCode;

// candle allocates a fresh buffer for every op's output; glibc serves large
// ones with new mmaps, whose pages the kernel must zero on first touch.
// mimalloc reuses freed memory instead.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::parse();
    // Output into a closed pipe (`recall search … | head -1`) ends the
    // process quietly, as it ends grep: Rust ignores SIGPIPE, which makes
    // every print after the reader has gone panic. A server or a watcher
    // keeps ignoring it: its output is a log, not what a reader waits for,
    // and its sockets never raise it (Rust sends with MSG_NOSIGNAL).
    #[cfg(unix)]
    if !args.long_running() {
        // SAFETY: at start-up, before any other thread exists, setting a
        // signal's disposition back to its default.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    cli::style::init(args.color);
    let filter = recall::env::LOG
        .text()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(args.log_filter()));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_ansi(cli::style::stderr())
        .without_time()
        .init();
    let json = cli::wants_json();
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
            let paused = err.downcast_ref::<cli::Paused>().is_some();
            let code: u8 = if paused { 75 } else { 1 };
            if json {
                // One object on standard error, with a stable `error` field.
                eprintln!(
                    "{}",
                    serde_json::json!({
                        "error": format!("{err:#}"),
                        "paused": paused,
                        "exit_code": code,
                    })
                );
            } else if paused {
                eprintln!("{err}");
            } else {
                eprintln!("error: {err:#}");
            }
            ExitCode::from(code)
        }
    }
}
