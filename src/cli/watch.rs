//! `recall watch`.

use std::sync::atomic::AtomicBool;

use anyhow::Result;
use clap::Args;
use recall::index::IndexOptions;
use recall::index::store::Store;
use recall::watch::{self, Event, WatchOptions};
use serde_json::json;

use super::index::{ChunkArgs, HermesArgs, RoleArgs};
use super::{ModelArgs, ProviderArgs};

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    hermes: HermesArgs,
    #[command(flatten)]
    roles: RoleArgs,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    providers: ProviderArgs,
    #[command(flatten)]
    chunk: ChunkArgs,
    /// How often to check Hermes's files when no file notification comes, in milliseconds.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    poll_ms: u64,
    /// How long Hermes's files must stay unchanged before indexing, in milliseconds.
    #[arg(long, default_value_t = 150, value_name = "MS")]
    debounce_ms: u64,
    /// When indexing paused (no embedding provider could work), try again after this many seconds.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    retry_secs: u64,
    /// One JSON object per indexing run instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: WatchArgs) -> Result<()> {
    let profiles = args.hermes.profiles_even_missing()?;
    let index_path = args.hermes.index_path()?;
    recall::index::check_sources(&index_path, &profiles)?;
    let store = Store::open(&index_path)?;
    let chain = args.providers.chain(&args.model, store.model_dir()?)?;
    let options = IndexOptions {
        selection: args.roles.selection()?,
        chunk: args.chunk.params_for(&chain, store.identity()?.as_ref()),
        rebuild: false,
    };
    drop(store);
    let timing = WatchOptions {
        poll: std::time::Duration::from_millis(args.poll_ms.max(10)),
        debounce: std::time::Duration::from_millis(args.debounce_ms),
        retry: std::time::Duration::from_secs(args.retry_secs.max(1)),
    };
    eprintln!(
        "recall watch: following {} into {} (Ctrl-C to stop)",
        profiles
            .iter()
            .map(|p| p.state_db().display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        index_path.display()
    );
    let json = args.json;
    let (_nudge, nudges) = watch::nudge_channel();
    let what = watch::Watch {
        chain: &chain,
        index_path: &index_path,
        profiles: &profiles,
        options: &options,
        timing,
    };
    let control = watch::Control {
        nudges: &nudges,
        stop: &AtomicBool::new(false),
        on_event: &move |event| print_event(&event, json),
    };
    watch::watch(&what, &control)
}

/// One line per run that changed something, and every problem.
pub fn print_event(event: &Event, json: bool) {
    let now = recall::search::rfc3339(recall::index::unix_now());
    if json {
        let value = match event {
            Event::Indexed(r) if r.paused.is_some() => {
                json!({"when": now, "event": "paused", "report": r})
            }
            Event::Indexed(r) => json!({"when": now, "event": "indexed", "report": r}),
            Event::Failed(message) => json!({"when": now, "event": "failed", "error": message}),
            Event::Waiting(paths) => json!({"when": now, "event": "waiting", "paths": paths}),
        };
        println!("{value}");
    } else if let Some(line) = event.describe() {
        // Progress on standard output, problems on standard error.
        match event {
            Event::Indexed(r) if r.paused.is_none() => println!("{now} {line}"),
            _ => eprintln!("{now} {line}"),
        }
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
}
