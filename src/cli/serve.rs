//! `recall serve`.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use recall::Embedder;
use recall::index::IndexOptions;
use recall::provider::Chain;
use recall::provider::local::Local;
use recall::serve::{DEFAULT_PORT, ServeConfig, serve};
use recall::source::hermes::Profile;
use recall::watch::{Background, Event, WatchOptions};

use super::ModelArgs;
use super::index::ChunkArgs;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on. Anything but a loopback address needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health.
    #[arg(
        long,
        env = recall::env::API_KEY.name,
        hide_env_values = true,
        value_name = "KEY"
    )]
    api_key: Option<String>,
    /// Without an API key, requests must name this server as a loopback
    /// address, `localhost` or --host in their `Host` header, so that a web
    /// page cannot reach it by DNS rebinding; this accepts another name too
    /// (a local proxy's). Repeat it, or separate names with commas.
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    allow_host: Vec<String>,
    /// The model name clients use (a BGE-M3 model also answers to bge-m3 and BAAI/bge-m3).
    /// Default: bge-m3 for a BGE-M3 model, else the model directory's name.
    #[arg(long, value_name = "NAME")]
    served_model_name: Option<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024, value_name = "BYTES")]
    max_body_bytes: usize,
    /// Request bodies held at once, in bytes, across all requests; beyond it
    /// requests are answered 503 with Retry-After.
    #[arg(long, default_value_t = 64 * 1024 * 1024, value_name = "BYTES")]
    max_inflight_bytes: usize,
    /// Connections open at once from one address; more are answered 503 and
    /// closed (every local client shares 127.0.0.1).
    #[arg(long, default_value_t = 256, value_name = "N")]
    max_connections_per_client: usize,
    /// Seconds a client may take to send a request's headers before its connection is closed.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    header_timeout: u64,
    /// Seconds a client may take to send a request's body; slower ones are answered 408.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    body_timeout: u64,
    /// Inputs in one request.
    #[arg(long, default_value_t = 2048, value_name = "N")]
    max_items: usize,
    /// Requests handled at once; more are answered 429.
    #[arg(long, default_value_t = 512, value_name = "N")]
    max_concurrent_requests: usize,
    /// Inputs waiting for a forward pass; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 8192, value_name = "N")]
    max_queue: usize,
    /// The index that POST /search searches. Default: $HERMES_HOME/recall/index.db.
    #[arg(long, value_name = "PATH")]
    index: Option<PathBuf>,
    /// Hermes home, for the default index. Default: $HERMES_HOME, else ~/.hermes.
    #[arg(long, value_name = "DIR")]
    hermes_home: Option<PathBuf>,
    /// Also follow Hermes's database and index each change as it happens (as `recall watch`).
    #[arg(long)]
    watch: bool,
    /// With --watch: the Hermes profile to follow (default: the default profile).
    #[arg(
        long,
        value_name = "NAME",
        conflicts_with = "all_profiles",
        requires = "watch"
    )]
    profile: Option<String>,
    /// With --watch: follow every profile.
    #[arg(long, requires = "watch")]
    all_profiles: bool,
    #[command(flatten)]
    chunk: ChunkArgs,
}

/// Loads the model (the index's own unless one is named), starts the watcher
/// with --watch, and serves until stopped.
pub fn run(args: ServeArgs) -> Result<()> {
    let index = args.index_path();
    let remembered = match &index {
        Some(p) if p.is_file() => recall::index::store::Store::open(p)?.model_dir()?,
        _ => None,
    };
    let embedder = args.model.load_or(remembered)?;
    let watch = if args.watch {
        Some(args.watch_plan(&index, &embedder)?)
    } else {
        None
    };
    let config = args.config(&embedder, index);
    config.check()?;
    let embedder = Arc::new(embedder);
    let watcher = start_watcher(watch, &config.index, &embedder)?;
    let nudge = watcher.as_ref().map(|w| {
        let nudge = w.nudge();
        Box::new(move || nudge.nudge()) as recall::serve::Nudge
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // On an error (the port taken), dropping the watcher only tells it to
    // stop: waiting for a first run over a long history would hang the exit.
    runtime.block_on(serve(embedder, config, nudge))?;
    if let Some(watcher) = watcher {
        watcher.stop();
    }
    eprintln!("recall serve: stopped");
    Ok(())
}

/// What `--watch` follows (the Hermes profiles) and how it indexes them.
type WatchPlan = (Vec<Profile>, IndexOptions);

impl ServeArgs {
    /// The index POST /search searches: --index, else the Hermes home's.
    fn index_path(&self) -> Option<PathBuf> {
        self.index.clone().or_else(|| {
            self.hermes_home
                .clone()
                .or_else(recall::source::hermes::default_home)
                .map(|home| recall::index::default_index_path(&home))
        })
    }

    /// The profiles --watch follows, checked against `index`'s sources, and
    /// the options it indexes them with.
    fn watch_plan(&self, index: &Option<PathBuf>, embedder: &Embedder) -> Result<WatchPlan> {
        let home = self
            .hermes_home
            .clone()
            .or_else(recall::source::hermes::default_home)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--watch: cannot find Hermes: set HERMES_HOME or pass --hermes-home"
                )
            })?;
        let profiles =
            recall::source::hermes::profiles(&home, self.profile.as_deref(), self.all_profiles)?;
        if let Some(index) = index {
            recall::index::check_sources(index, &profiles)?;
        }
        let options = IndexOptions {
            selection: recall::source::hermes::Selection::default(),
            chunk: self.chunk.params(Some(embedder.info().max_length)),
            rebuild: false,
        };
        Ok((profiles, options))
    }

    /// The server's configuration, serving `embedder` and searching `index`.
    fn config(self, embedder: &Embedder, index: Option<PathBuf>) -> ServeConfig {
        let mut model_aliases =
            recall::serve::model_names(&embedder.info().dir, embedder.info().sparse);
        let served_model_name = match self.served_model_name.clone() {
            Some(name) => name,
            None => model_aliases.remove(0),
        };
        ServeConfig {
            host: self.host,
            port: self.port,
            api_key: self.api_key,
            allowed_hosts: self.allow_host,
            served_model_name,
            model_aliases,
            max_body_bytes: self.max_body_bytes,
            max_inflight_bytes: self.max_inflight_bytes,
            max_connections_per_client: self.max_connections_per_client,
            header_timeout: std::time::Duration::from_secs(self.header_timeout.max(1)),
            body_timeout: std::time::Duration::from_secs(self.body_timeout.max(1)),
            max_items: self.max_items,
            max_concurrent_requests: self.max_concurrent_requests,
            max_queue: self.max_queue,
            max_batch_tokens: self.model.batch_tokens(),
            index,
        }
    }
}

/// Starts the watcher `watch` plans, indexing into `index` with the
/// server's own model (the one it loaded); none without --watch.
fn start_watcher(
    watch: Option<WatchPlan>,
    index: &Option<PathBuf>,
    embedder: &Arc<Embedder>,
) -> Result<Option<Background>> {
    Ok(match (watch, index) {
        (Some((profiles, options)), Some(index)) => {
            let chain = Chain::new(vec![Arc::new(Local::from_embedder(
                "local",
                None,
                embedder.clone(),
            ))]);
            let report = |event: Event| {
                if let Some(line) = event.describe() {
                    eprintln!("recall serve: {line}");
                }
            };
            let started = Background::spawn(
                chain,
                index.clone(),
                profiles,
                options,
                WatchOptions::default(),
                report,
            );
            Some(started.context("--watch")?)
        }
        (Some(_), None) => bail!("--watch needs an index: pass --index PATH or --hermes-home DIR"),
        (None, _) => None,
    })
}
