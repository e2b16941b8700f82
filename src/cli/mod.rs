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
pub mod style;
mod watch;

use std::path::PathBuf;

use anyhow::Result;
use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use recall::{Embedder, LoadOptions};

/// `recall --help`'s end: examples, every environment variable
/// (`recall::env`), the exit status.
fn long_help_footer() -> String {
    format!(
        "Examples:\n  recall hermes install --service\n  recall search \"the server ran out of space\"\n  recall embed \"some text\" --sparse\n\n\
         {}\n\
         Exit status: 0 success; 1 an error (said on standard error; with --json, as a JSON object \
         with an `error` field); 2 a usage error; 75 indexing paused because no embedding provider \
         could work (what was done is kept: try again later).",
        recall::env::help()
    )
}

#[derive(Parser)]
#[command(
    name = "recall",
    version,
    about = "Local semantic memory for AI agents: BGE-M3 embeddings in one binary",
    long_about = "Local semantic memory for AI agents.\n\n\
        recall runs BAAI/bge-m3 itself (no cloud, no Ollama) and gives its dense vector, \
        sparse lexical weights and ColBERT vectors; it indexes Hermes Agent's history and \
        searches it by meaning and by exact words.\n\n\
        The model is found in this order: --model DIR, the RECALL_MODEL variable, then \
        BAAI/bge-m3 in the Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub).",
    after_help = "Examples:\n  recall hermes install --service\n  recall search \"the server ran out of space\"\n  recall embed \"some text\" --sparse\n\nMore: recall help <command>; the environment: recall --help.",
    after_long_help = long_help_footer()
)]
pub struct Cli {
    /// Colour in recall's output: auto (on a terminal, unless NO_COLOR is set or TERM=dumb), always, never.
    #[arg(long, global = true, help_heading = "Global options", value_enum, default_value_t = style::ColorWhen::Auto, value_name = "WHEN")]
    pub color: style::ColorWhen,
    /// Say less on standard error: errors only (RECALL_LOG overrides).
    #[arg(
        short,
        long,
        global = true,
        help_heading = "Global options",
        conflicts_with = "verbose"
    )]
    pub quiet: bool,
    /// Say more on standard error: -v for debug, -vv for trace (RECALL_LOG overrides).
    #[arg(short, long, global = true, help_heading = "Global options", action = ArgAction::Count)]
    pub verbose: u8,
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// A server or a watcher: runs until stopped, its output a log.
    pub fn long_running(&self) -> bool {
        matches!(self.command, Command::Serve(_) | Command::Watch(_))
    }

    /// The log filter that -q/-v ask for (RECALL_LOG, when set, wins).
    pub fn log_filter(&self) -> &'static str {
        match (self.quiet, self.verbose) {
            (true, _) => "recall=error",
            (_, 0) => "recall=info",
            (_, 1) => "recall=debug",
            _ => "recall=trace",
        }
    }
}

/// `recall --version`'s long form: the commit, the GPU features built in,
/// and the CPU kernels this machine would run.
fn long_version() -> String {
    let mut features = Vec::new();
    if cfg!(feature = "cuda") {
        features.push("cuda");
    }
    if cfg!(feature = "metal") {
        features.push("metal");
    }
    if cfg!(feature = "mkl") {
        features.push("mkl");
    }
    format!(
        "{} (commit {})\nfeatures: {}\nCPU kernels here: {}",
        env!("CARGO_PKG_VERSION"),
        env!("RECALL_GIT_COMMIT"),
        if features.is_empty() {
            "cpu only".to_string()
        } else {
            features.join(", ")
        },
        recall_engine::KernelInfo::here(),
    )
}

/// The command line's definition, with the long version filled in.
pub fn command() -> clap::Command {
    Cli::command().long_version(long_version())
}

/// Parses the arguments; usage errors (exit 2) are JSON with `--json`.
pub fn parse() -> Cli {
    let json = std::env::args_os().any(|a| a == "--json");
    let matches = match command().try_get_matches() {
        Ok(m) => m,
        Err(e) if json && e.use_stderr() => {
            let message = e.render().to_string();
            eprintln!(
                "{}",
                serde_json::json!({"error": message.trim(), "kind": "usage", "exit_code": 2})
            );
            std::process::exit(2);
        }
        Err(e) => e.exit(),
    };
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Whether the command asked for JSON output (its errors are JSON too).
pub fn wants_json() -> bool {
    std::env::args_os().any(|a| a == "--json")
}

#[derive(Subcommand)]
enum Command {
    /// Embed texts: from arguments, or one per line on standard input. Writes JSON lines.
    #[command(
        after_help = "Examples:\n  recall embed \"the server ran out of space\"\n  recall embed --sparse --colbert \"disk cleanup\" \"磁盘清理\"\n  cat texts.txt | recall embed --dtype q8 > vectors.jsonl"
    )]
    Embed(embed::EmbedArgs),
    /// Measure encoder throughput and memory on fixed shapes; --search: vector search; --serve: recall serve under load.
    #[command(
        after_help = "Examples:\n  recall bench\n  recall bench --shapes 1x16,8x128 --dtype q8 --json\n  recall bench --search --sizes 10000,100000"
    )]
    Bench(bench::BenchArgs),
    /// Index Hermes sessions (incremental: only what is new or changed is embedded).
    #[command(
        after_help = "Examples:\n  recall index\n  recall index --all-profiles --roles user,assistant,tool\n  recall index --rebuild --dtype q8"
    )]
    Index(index::IndexArgs),
    /// What the index holds, its model, and how far it lags behind Hermes.
    #[command(after_help = "Examples:\n  recall stats\n  recall stats --profile work --json")]
    Stats(index::StatsArgs),
    /// Search your Hermes sessions by meaning and by exact words (hybrid).
    #[command(
        after_help = "Examples:\n  recall search \"the server ran out of space\"\n  recall search \"nginx 502\" --since 7d --role user -n 10\n  recall search \"ERR_CONNECTION_RESET\" --signals keyword --json"
    )]
    Search(search::SearchArgs),
    /// Print a session's messages, or a window around one message.
    #[command(
        after_help = "Examples:\n  recall show 20260212_093015_ab12cd\n  recall show 20260212_093015_ab12cd --around 4711 --window 3\n  recall show @session:default/20260212_093015_ab12cd --json"
    )]
    Show(search::ShowArgs),
    /// Get, move and check models: fetch, export, import, verify, list, info.
    Model(model::ModelCommand),
    /// Follow Hermes's database and index each change as it happens.
    #[command(
        after_help = "Examples:\n  recall watch\n  recall watch --all-profiles --provider local,ollama"
    )]
    Watch(watch::WatchArgs),
    /// Put recall into Hermes as a plugin (the semantic_session_search tool), take it out, or check it.
    #[command(subcommand)]
    Hermes(hermes::HermesCommand),
    /// Serve the model over HTTP to OpenAI, Ollama and TEI clients, plus session search.
    #[command(
        after_help = "Examples:\n  recall serve\n  recall serve --watch --dtype q8\n  recall serve --host 0.0.0.0 --api-key \"$KEY\"\n  curl -s localhost:11435/v1/embeddings -d '{\"input\": \"hello\", \"model\": \"bge-m3\"}'"
    )]
    Serve(serve::ServeArgs),
    /// The embedding providers configured (local, Ollama, OpenAI-compatible): reachable? which space? which one the index uses.
    #[command(
        after_help = "Examples:\n  recall providers\n  recall providers --provider ollama,local --json"
    )]
    Providers(providers::ProvidersArgs),
    /// Check this machine's setup (Hermes, index, model, providers, plugin) and say what to do about each problem.
    #[command(after_help = "Examples:\n  recall doctor\n  recall doctor --json")]
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script: bash, zsh, fish, powershell or elvish.
    #[command(
        after_help = "Examples:\n  recall completions bash > ~/.local/share/bash-completion/completions/recall\n  recall completions zsh > ~/.zfunc/_recall\n  recall completions fish > ~/.config/fish/completions/recall.fish"
    )]
    Completions { shell: clap_complete::Shell },
    /// Print recall's man page (roff).
    #[command(
        after_help = "Example:\n  recall man > ~/.local/share/man/man1/recall.1 && man recall"
    )]
    Man,
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
#[command(next_help_heading = "Embedding providers")]
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
    /// The configuration file named by --config.
    pub fn config_file(&self) -> Option<PathBuf> {
        self.config
            .as_ref()
            .map(|c| c.canonicalize().unwrap_or_else(|_| c.clone()))
    }

    /// The chain named by --provider.
    pub fn named(&self) -> &[String] {
        &self.providers
    }

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

/// A count of tokens: the engine refuses zero, and the flag should say so
/// before a model is loaded.
fn at_least_one(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// Options shared by every command that loads a model.
#[derive(Args, Clone)]
#[command(next_help_heading = "Model")]
pub struct ModelArgs {
    /// Model directory (Hugging Face layout). Default: $RECALL_MODEL, then BAAI/bge-m3 in the HF cache.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Cut inputs at this many tokens, special tokens included. Default: the model's limit (8192 for bge-m3).
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    max_length: Option<usize>,
    /// Tokens packed into one forward pass.
    #[arg(
        long,
        visible_alias = "max-batch-tokens",
        value_name = "N",
        value_parser = at_least_one,
        default_value_t = 16_384
    )]
    batch_tokens: usize,
    /// Never download: without a model on disk, say how to bring one. Also HF_HUB_OFFLINE=1.
    #[arg(long)]
    offline: bool,
    /// Weights of the encoder's linear layers: f32 (as the checkpoint); bf16 (rounded at
    /// load: half the memory, faster on CPUs with AVX512_BF16, vectors within 0.9995 cosine
    /// of f32, in the same index as f32); or q8 (int8, quantised at load: several times
    /// faster on CPUs with AVX-512 VNNI, vectors within 0.995 cosine of f32 on recall's
    /// check texts, where the layers int8 cannot hold run in f32; an index keeps to one of
    /// them). CPU only. Speeds: docs/benchmarks.md.
    #[arg(
        long,
        value_name = "DTYPE",
        env = recall::env::DTYPE.name,
        default_value = "f32"
    )]
    dtype: recall::Dtype,
}

impl ModelArgs {
    pub fn batch_tokens(&self) -> usize {
        self.batch_tokens
    }

    pub fn dtype(&self) -> recall::Dtype {
        self.dtype
    }

    pub fn load(&self) -> Result<Embedder> {
        self.load_or(None)
    }

    /// The directory named by --model or RECALL_MODEL, made absolute.
    pub fn named_dir(&self) -> Option<PathBuf> {
        let dir = self
            .model
            .clone()
            .or_else(|| recall::env::MODEL.get().map(PathBuf::from))?;
        Some(dir.canonicalize().unwrap_or(dir))
    }

    /// A model was named by --model or RECALL_MODEL.
    pub fn is_named(&self) -> bool {
        self.model.is_some() || recall::env::MODEL.get().is_some()
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
                recall::Dtype::Q8 | recall::Dtype::Bf16 => candle_core::Device::Cpu,
            },
            dtype: self.dtype,
            ..LoadOptions::default()
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
    // Said before any command starts: where the engine first loads, a failed
    // load reads as an unavailable provider (a pause, a keyword-only search).
    recall_engine::kernels::check_overrides().map_err(anyhow::Error::msg)?;
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
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut command(), "recall", &mut std::io::stdout());
            Ok(())
        }
        Command::Man => {
            clap_mangen::Man::new(command()).render(&mut std::io::stdout())?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_definition_is_consistent() {
        command().debug_assert();
    }

    /// Every command a user runs shows the invocations people type.
    #[test]
    fn every_command_has_examples() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", cmd.get_name());
            let leaf = !cmd.has_subcommands();
            let examples = cmd
                .get_after_help()
                .is_some_and(|h| h.to_string().contains("Example"));
            if leaf && !examples && cmd.get_name() != "help" {
                missing.push(path.clone());
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&command(), "", &mut missing);
        assert!(missing.is_empty(), "no examples in --help of: {missing:?}");
    }
}
