//! `recall bench`: encoder throughput, query latency and peak memory.

use anyhow::Result;
use clap::Args;
use recall::Outputs;
use recall::bench::{self, DEFAULT_SHAPES, Shape, ShapeResult};

use super::ModelArgs;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Shapes to run, BATCHxTOKENS (special tokens included). Default: 1x16,8x128,4x512,1x8192
    /// (shapes longer than the model's limit are skipped with a note).
    #[arg(long, value_delimiter = ',', value_name = "SHAPES")]
    shapes: Vec<Shape>,
    /// Timed runs per shape, after one warm-up run; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Compute all three BGE-M3 outputs (dense, sparse, ColBERT) instead of dense only.
    #[arg(long)]
    all_outputs: bool,
    /// Print one JSON object per shape instead of a table.
    #[arg(long)]
    json: bool,
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "-".into(),
        |b| format!("{:.0} MiB", b as f64 / (1 << 20) as f64),
    )
}

pub fn run(args: BenchArgs) -> Result<()> {
    let embedder = args.model.load()?;
    let info = embedder.info();
    let outputs = if args.all_outputs {
        Outputs::ALL
    } else {
        Outputs::DENSE
    };
    embedder.check_outputs(outputs)?;
    let explicit = !args.shapes.is_empty();
    let mut shapes: Vec<Shape> = if explicit {
        args.shapes.clone()
    } else {
        DEFAULT_SHAPES.to_vec()
    };
    if !explicit {
        shapes.retain(|s| {
            let fits = s.tokens <= info.max_length;
            if !fits {
                eprintln!(
                    "note: skipping {s}: the model takes at most {} tokens",
                    info.max_length
                );
            }
            fits
        });
    }
    let threads = candle_core::utils::get_num_threads();
    if !args.json {
        println!(
            "model {} ({}, {} dims, weights {}), loaded in {:.2}s, {threads} threads, peak RSS after load {}",
            info.dir.display(),
            info.model_type,
            info.dense_dim,
            info.weights.display(),
            info.load_time.as_secs_f64(),
            mib(bench::peak_rss()),
        );
        println!(
            "{:<8} {:>10} {:>10} {:>10} {:>9} {:>10}",
            "shape", "median", "best", "tokens/s", "texts/s", "peak RSS"
        );
    }
    let print = |r: &ShapeResult| {
        if args.json {
            let row = serde_json::json!({
                "shape": r.shape.to_string(), "batch": r.shape.batch, "tokens": r.shape.tokens,
                "median_ms": r.median.as_secs_f64() * 1e3, "best_ms": r.best.as_secs_f64() * 1e3,
                "tokens_per_s": r.tokens_per_s(), "texts_per_s": r.texts_per_s(),
                "peak_rss_bytes": r.peak_rss, "runs": r.runs, "threads": threads,
            });
            println!("{row}");
        } else {
            println!(
                "{:<8} {:>7.1} ms {:>7.1} ms {:>10.1} {:>9.2} {:>10}",
                r.shape.to_string(),
                r.median.as_secs_f64() * 1e3,
                r.best.as_secs_f64() * 1e3,
                r.tokens_per_s(),
                r.texts_per_s(),
                mib(r.peak_rss)
            );
        }
    };
    bench::run(&embedder, &shapes, args.runs, outputs, print)?;
    Ok(())
}
