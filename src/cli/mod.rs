//! Command-line arguments and dispatch. Each subcommand lives in its own module.

mod bench;
mod doctor;
mod embed;
mod hermes;
mod index;
mod model;
mod providers;
mod search;
mod serve;
mod watch;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use recall::{Embedder, LoadOptions};

#[derive(Parser)]
#[command(
    name = "recall",
    version,
    about = "Local semantic memory for AI agents: BGE-M3 embeddings in one binary",
    long_about = "Local semantic memory for AI agents.\n\n\
        recall runs BAAI/bge-m3 itself (no cloud, no Ollama) and gives its dense vector, \
        sparse lexical weights and ColBERT vectors.\n\n\
        The model is found in this order: --model DIR, the RECALL_MODEL variable, then \
        BAAI/bge-m3 in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub).\n\
        Set RECALL_LOG=debug for more detail on standard error."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Embed texts: from arguments, or one per line on standard input. Writes JSON lines.
    Embed(embed::EmbedArgs),
    /// Measure encoder throughput and memory on fixed shapes; --search: vector search; --serve: recall serve under load.
    Bench(bench::BenchArgs),
    /// Index Hermes sessions (incremental: only what is new or changed is embedded).
    Index(index::IndexArgs),
    /// What the index holds, its model, and how far it lags behind Hermes.
    Stats(index::StatsArgs),
    /// Search your Hermes sessions by meaning and by exact words (hybrid).
    Search(search::SearchArgs),
    /// Print a session's messages, or a window around one message.
    Show(search::ShowArgs),
    /// Get, move and check models: fetch, export, import, verify, list, info.
    Model(model::ModelCommand),
    /// Follow Hermes's database and index each change as it happens.
    Watch(watch::WatchArgs),
    /// Put recall into Hermes as a plugin (the semantic_session_search tool), take it out, or check it.
    #[command(subcommand)]
    Hermes(hermes::HermesCommand),
    /// Serve the model over HTTP to OpenAI, Ollama and TEI clients, plus session search.
    Serve(serve::ServeArgs),
    /// The embedding providers configured (local, Ollama, OpenAI-compatible): reachable? which space? which one the index uses.
    Providers(providers::ProvidersArgs),
    /// Check this machine's setup (Hermes, index, model, providers, plugin) and say what to do about each problem.
    Doctor(doctor::DoctorArgs),
}

/// A run that stopped because no embedding provider could work: what was
/// done is kept. Exit status 75 (EX_TEMPFAIL): try again later.
#[derive(Debug)]
pub struct Paused(pub String);

impl std::fmt::Display for Paused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Paused {}

/// Where embeddings come from: options shared by the commands that embed.
#[derive(Args, Clone)]
pub struct ProviderArgs {
    /// Configuration file. Default: $RECALL_CONFIG, then ~/.config/recall/config.toml if it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Embedding providers to try, in order (comma-separated; built in: local, ollama, ark, openai;
    /// others from config.toml). Default: RECALL_PROVIDERS, then config.toml's `chain`, then local.
    #[arg(long = "provider", value_name = "NAME", value_delimiter = ',')]
    providers: Vec<String>,
}

impl ProviderArgs {
    pub fn config(&self) -> Result<recall::provider::Config> {
        recall::provider::Config::load(self.config.as_deref(), &self.providers)
    }

    /// The chain of providers; a local one loads `model` (or the index's
    /// `remembered` model) when first needed.
    pub fn chain(
        &self,
        model: &ModelArgs,
        remembered: Option<PathBuf>,
    ) -> Result<recall::provider::Chain> {
        self.chain_with(model, remembered, true, false)
    }

    /// `chain`; a missing model is fetched on first use only when `may_fetch`
    /// and the chain has no other provider to fall back to (2.3 GB);
    /// `interactive` gives remote providers short timeouts (someone is waiting).
    pub fn chain_with(
        &self,
        model: &ModelArgs,
        remembered: Option<PathBuf>,
        may_fetch: bool,
        interactive: bool,
    ) -> Result<recall::provider::Chain> {
        let mut config = self.config()?;
        config.interactive = interactive;
        let fetch = may_fetch && config.chain.len() == 1;
        config.build(&|name, settings| {
            let (model, remembered, configured) = (
                model.clone(),
                remembered.clone(),
                settings.model.clone().map(PathBuf::from),
            );
            std::sync::Arc::new(recall::provider::local::Local::new(
                name,
                settings.space.clone(),
                Box::new(move || model.load_from(remembered.clone(), configured.clone(), fetch)),
            ))
        })
    }
}

/// Options shared by every command that loads a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model directory (Hugging Face layout). Default: $RECALL_MODEL, then BAAI/bge-m3 in the HF cache.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Cut inputs at this many tokens, special tokens included. Default: the model's limit (8192 for bge-m3).
    #[arg(long, value_name = "N")]
    max_length: Option<usize>,
    /// Tokens packed into one forward pass.
    #[arg(
        long,
        visible_alias = "max-batch-tokens",
        value_name = "N",
        default_value_t = 16_384
    )]
    batch_tokens: usize,
    /// Never download: without a model on disk, say how to bring one. Also HF_HUB_OFFLINE=1.
    #[arg(long)]
    offline: bool,
    /// Weights of the encoder's linear layers: f32 (as the checkpoint), or q8 (int8,
    /// quantised at load: several times faster on CPUs with AVX-512 VNNI, vectors within
    /// about 0.99 cosine of f32; an index keeps to one of them). CPU only.
    #[arg(
        long,
        value_name = "DTYPE",
        env = "RECALL_DTYPE",
        default_value = "f32"
    )]
    dtype: recall::Dtype,
}

impl ModelArgs {
    pub fn batch_tokens(&self) -> usize {
        self.batch_tokens
    }

    pub fn load(&self) -> Result<Embedder> {
        self.load_or(None)
    }

    /// The directory named by --model or RECALL_MODEL, made absolute.
    pub fn named_dir(&self) -> Option<PathBuf> {
        let dir = self.model.clone().or_else(|| {
            std::env::var_os("RECALL_MODEL")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })?;
        Some(dir.canonicalize().unwrap_or(dir))
    }

    /// A model was named by --model or RECALL_MODEL.
    pub fn is_named(&self) -> bool {
        self.model.is_some() || std::env::var_os("RECALL_MODEL").is_some_and(|v| !v.is_empty())
    }

    /// Loads the named model, else `remembered` (the model an index was
    /// built with, if its directory still exists), else the default.
    pub fn load_or(&self, remembered: Option<PathBuf>) -> Result<Embedder> {
        self.load_from(remembered, None, true)
    }

    /// Loads the named model, else `configured` (config.toml's), else
    /// `remembered`, else the default, fetched on first use when `fetch`.
    pub fn load_from(
        &self,
        remembered: Option<PathBuf>,
        configured: Option<PathBuf>,
        fetch: bool,
    ) -> Result<Embedder> {
        let dir = match configured
            .or(remembered.filter(|d| d.join("config.json").is_file()))
            .filter(|_| !self.is_named())
        {
            Some(dir) => dir,
            None => self.model_dir(fetch)?,
        };
        let options = LoadOptions {
            max_length: self.max_length,
            max_batch_tokens: self.batch_tokens,
            device: match self.dtype {
                recall::Dtype::F32 => recall::default_device()?,
                recall::Dtype::Q8 => candle_core::Device::Cpu,
            },
            dtype: self.dtype,
            cache_dir: None,
        };
        let embedder = Embedder::load(&dir, &options)?;
        let info = embedder.info();
        tracing::debug!(
            "loaded {} ({}, {} dims) from {} in {:.2}s",
            info.dir.display(),
            info.model_type,
            info.dense_dim,
            info.weights.display(),
            info.load_time.as_secs_f64()
        );
        Ok(embedder)
    }
}

impl ModelArgs {
    /// The model directory; with none on disk and none named, BAAI/bge-m3 is
    /// fetched now (first use), unless offline.
    fn model_dir(&self, fetch: bool) -> Result<PathBuf> {
        use recall::model::{hub, locate};
        match locate::locate(self.model.as_deref()) {
            Ok(located) => Ok(located.dir),
            Err(err) if self.is_named() => Err(err),
            Err(_) if !fetch => anyhow::bail!(
                "no model on disk (fetch it with `recall model fetch`, or see `recall model import`)"
            ),
            Err(_) if self.offline || hub::offline_from_env() => {
                let cache = locate::hub_cache_dir().unwrap_or_default();
                anyhow::bail!(hub::offline_message(&cache))
            }
            Err(_) => {
                eprintln!(
                    "no model on disk: fetching {} (about 2.3 GB, once) into the Hugging Face cache",
                    locate::DEFAULT_REPO
                );
                model::fetch_default(locate::DEFAULT_REVISION, 3)
            }
        }
    }
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Embed(args) => embed::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Index(args) => index::run_index(args),
        Command::Stats(args) => index::run_stats(args),
        Command::Search(args) => search::run_search(args),
        Command::Show(args) => search::run_show(args),
        Command::Model(cmd) => model::run(cmd),
        Command::Serve(args) => serve::run(args),
        Command::Watch(args) => watch::run(args),
        Command::Hermes(cmd) => hermes::run(cmd),
        Command::Providers(args) => providers::run(args),
        Command::Doctor(args) => doctor::run(args),
    }
}
