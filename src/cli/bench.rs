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
    /// Benchmark vector search instead of the encoder: synthetic indexes of --sizes chunks,
    /// sqlite-vec's float scan beside recall's binary first pass + rescoring.
    #[arg(long)]
    search: bool,
    /// Index sizes for --search.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    sizes: Vec<usize>,
    /// Queries per size for --search.
    #[arg(long, default_value_t = 20)]
    queries: usize,
    /// Vector dimension for --search (BGE-M3's is 1024).
    #[arg(long, default_value_t = 1024)]
    dim: usize,
    /// Where --search writes its temporary indexes (about 4.2 KB per chunk at 1024 dims).
    #[arg(long, value_name = "DIR")]
    dir: Option<std::path::PathBuf>,
}

fn run_search(args: &BenchArgs) -> Result<()> {
    if args.dim == 0 || !args.dim.is_multiple_of(8) {
        anyhow::bail!("--dim must be a positive multiple of 8 (binary codes are whole bytes)");
    }
    // With a model named, a search also pays for embedding the query: measure that once.
    let embed_ms = if args.model.is_named() {
        let embedder = args.model.load()?;
        let r = bench::run(
            &embedder,
            &[Shape {
                batch: 1,
                tokens: 16,
            }],
            args.runs,
            Outputs::DENSE,
            |_| {},
        )?;
        Some(r[0].median.as_secs_f64() * 1e3)
    } else {
        None
    };
    let tmp = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    if !args.json {
        println!(
            "{:>9} {:>13} {:>13} {:>14} {:>14} {:>10} {:>10}{}",
            "chunks",
            "exact p50",
            "exact p99",
            "binary p50",
            "binary p99",
            "recall@10",
            "build",
            if embed_ms.is_some() {
                "  binary p50 + query embedding"
            } else {
                ""
            }
        );
    }
    for &size in &args.sizes {
        let r = bench::search_bench(tmp.path(), size, args.dim, args.queries)?;
        if args.json {
            let mut v = serde_json::to_value(&r)?;
            v["query_embedding_ms"] = serde_json::json!(embed_ms);
            println!("{v}");
        } else {
            println!(
                "{:>9} {:>10.1} ms {:>10.1} ms {:>11.1} ms {:>11.1} ms {:>10.3} {:>8.0} s{}",
                r.chunks,
                r.exact_p50_ms,
                r.exact_p99_ms,
                r.binary_p50_ms,
                r.binary_p99_ms,
                r.recall_at_10,
                r.build_seconds,
                embed_ms
                    .map(|e| format!("  {:.1} ms", r.binary_p50_ms + e))
                    .unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "-".into(),
        |b| format!("{:.0} MiB", b as f64 / (1 << 20) as f64),
    )
}

pub fn run(args: BenchArgs) -> Result<()> {
    if args.search {
        return run_search(&args);
    }
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
