//! Command-line arguments and dispatch. Each subcommand lives in its own module.

mod bench;
mod embed;

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
    /// Measure encoder throughput and memory on fixed batch × length shapes.
    Bench(bench::BenchArgs),
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
    #[arg(long, value_name = "N", default_value_t = 16_384)]
    batch_tokens: usize,
}

impl ModelArgs {
    pub fn load(&self) -> Result<Embedder> {
        let located = recall::model::locate::locate(self.model.as_deref())?;
        let options = LoadOptions {
            max_length: self.max_length,
            max_batch_tokens: self.batch_tokens,
            device: recall::default_device()?,
            cache_dir: None,
        };
        let embedder = Embedder::load(&located.dir, &options)?;
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

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Embed(args) => embed::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
