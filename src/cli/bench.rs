//! `recall bench`: encoder throughput, query latency and peak memory.

use std::io::BufRead;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use recall::bench::{self, DEFAULT_SHAPES, Shape, ShapeResult};
use recall::{Embedder, ModelInfo, Outputs};
use recall_engine::tokenize::Tokens;

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
    /// Benchmark `recall serve`: throughput under concurrent load beside the same model
    /// in-process, and a 16-token query's latency idle and under that load.
    #[arg(long, conflicts_with = "search")]
    serve: bool,
    /// Concurrent clients for --serve, each sending one input per request.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Tokens per input for --serve's load.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Seconds of load for --serve.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

/// p50 of `ms`, sorted in place.
fn median(ms: &mut [f64]) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms.get(ms.len() / 2).copied().unwrap_or(f64::NAN)
}

/// `recall bench --serve`: the model in-process, then the same model behind
/// a `recall serve` child process under load, and one report of both.
fn run_serve(args: &BenchArgs) -> Result<()> {
    let embedder = args.model.load()?;
    let info = embedder.info().clone();
    let inputs = ServeInputs::new(&embedder, args)?;
    let in_process = InProcess::measure(&embedder, args, &inputs)?;
    drop(embedder);

    let (mut child, line) = start_server(args, &info)?;
    let result = Client::for_server(&line)
        .and_then(|client| Served::measure(&client, args, &inputs))
        .map(|served| print_serve_report(args, &info, in_process, served));
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// The inputs `--serve` sends: `load`, 4 per client of `--tokens` tokens
/// each, and `query`, one 16-token input.
struct ServeInputs {
    load: Vec<Tokens>,
    query: Vec<Tokens>,
}

impl ServeInputs {
    fn new(embedder: &Embedder, args: &BenchArgs) -> Result<Self> {
        let load = bench::synthetic_inputs(
            embedder,
            Shape {
                batch: args.clients * 4,
                tokens: args.tokens,
            },
        )?;
        let query = bench::synthetic_inputs(
            embedder,
            Shape {
                batch: 1,
                tokens: 16,
            },
        )?;
        Ok(Self { load, query })
    }
}

/// The model's figures in this process: the yardstick for the served ones.
struct InProcess {
    tokens_per_s: f64,
    /// Latencies of the 16-token query, in ms.
    query_ms: Vec<f64>,
}

impl InProcess {
    /// Runs the passes the server can form at best, one input from each
    /// client, for about half the time; then the query alone, 7 times.
    fn measure(embedder: &Embedder, args: &BenchArgs, inputs: &ServeInputs) -> Result<Self> {
        let passes: Vec<&[Tokens]> = inputs.load.chunks(args.clients.max(1)).collect();
        embedder.embed_tokens(passes[0], Outputs::DENSE)?;
        let (started, mut tokens) = (Instant::now(), 0usize);
        for pass in passes.iter().cycle() {
            if started.elapsed()
                >= Duration::from_secs(args.seconds / 2).max(Duration::from_secs(1))
            {
                break;
            }
            embedder.embed_tokens(pass, Outputs::DENSE)?;
            tokens += pass.len() * args.tokens;
        }
        let tokens_per_s = tokens as f64 / started.elapsed().as_secs_f64();
        let query_ms: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                embedder
                    .embed_tokens(&inputs.query, Outputs::DENSE)
                    .map(|_| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            tokens_per_s,
            query_ms,
        })
    }
}

/// Starts `recall serve` on any free port with the benchmarked model; gives
/// the child and the first line it printed (the address it listens on).
fn start_server(args: &BenchArgs, info: &ModelInfo) -> Result<(std::process::Child, String)> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["serve", "--port", "0", "--model"])
        .arg(&info.dir)
        .args(["--max-batch-tokens", &args.model.batch_tokens().to_string()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line)?;
    Ok((child, line))
}

/// Posts to the server's /v1/embeddings.
struct Client {
    agent: ureq::Agent,
    url: String,
}

impl Client {
    /// The client of the server that printed `line` (`listening on URL`) on start.
    fn for_server(line: &str) -> Result<Self> {
        let base = line
            .trim()
            .strip_prefix("listening on ")
            .ok_or_else(|| anyhow::anyhow!("recall serve did not start: {line:?}"))?
            .to_string();
        Ok(Self {
            agent: ureq::Agent::new_with_defaults(),
            url: format!("{base}/v1/embeddings"),
        })
    }

    /// Embeds one input of token `ids`; gives the round trip in ms.
    fn post(&self, ids: &[u32]) -> Result<f64> {
        let t = Instant::now();
        // A sized body: ureq streams `send_json` chunked, which costs a round trip.
        let body = serde_json::json!({"input": [ids]}).to_string();
        let mut r = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json")
            .send(&body)?;
        r.body_mut().read_to_string()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// The model's figures behind the server.
struct Served {
    tokens_per_s: f64,
    /// Latencies of the 16-token query with no other load, in ms.
    idle_ms: Vec<f64>,
    /// Latencies of the 16-token query under the clients' load, in ms.
    under_load_ms: Vec<f64>,
}

impl Served {
    /// The query idle (after one warm-up), throughput under load alone, then
    /// a query every 250 ms under the same load.
    fn measure(client: &Client, args: &BenchArgs, inputs: &ServeInputs) -> Result<Self> {
        let query = &inputs.query[0].ids;
        client.post(query)?;
        let idle_ms: Vec<f64> = (0..7).map(|_| client.post(query)).collect::<Result<_>>()?;
        let (tokens_per_s, _) =
            under_load(client, args, &inputs.load, args.seconds, || Ok(Vec::new()))?;
        let (_, under_load_ms) = under_load(client, args, &inputs.load, args.seconds, || {
            queries_under_load(client, query, args.seconds)
        })?;
        Ok(Self {
            tokens_per_s,
            idle_ms,
            under_load_ms,
        })
    }
}

/// Saturating load of `load` from `args.clients` threads for `seconds`;
/// meanwhile `probe` runs (and returns its own measurements). Gives the
/// tokens/s served and the probe's measurements.
fn under_load(
    client: &Client,
    args: &BenchArgs,
    load: &[Tokens],
    seconds: u64,
    probe: impl FnOnce() -> Result<Vec<f64>>,
) -> Result<(f64, Vec<f64>)> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|s| -> Result<(f64, Vec<f64>)> {
        let workers: Vec<_> = (0..args.clients)
            .map(|c| {
                s.spawn(move || -> Result<usize> {
                    let mut sent = 0;
                    for i in (c..).step_by(args.clients.max(1)) {
                        if Instant::now() >= deadline {
                            break;
                        }
                        client.post(&load[i % load.len()].ids)?;
                        sent += args.tokens;
                    }
                    Ok(sent)
                })
            })
            .collect();
        let probed = probe()?;
        let mut tokens = 0;
        for w in workers {
            tokens += w
                .join()
                .map_err(|_| anyhow::anyhow!("a client thread panicked"))??;
        }
        Ok((tokens as f64 / seconds as f64, probed))
    })
}

/// Posts the query `ids` every 250 ms for `seconds`, from 500 ms in (once
/// the load is under way); gives its latencies in ms.
fn queries_under_load(client: &Client, ids: &[u32], seconds: u64) -> Result<Vec<f64>> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::sleep(Duration::from_millis(500));
    let mut ms = Vec::new();
    while Instant::now() + Duration::from_millis(250) < deadline {
        ms.push(client.post(ids)?);
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(ms)
}

/// Prints `--serve`'s figures: one JSON object with --json, else three lines.
fn print_serve_report(args: &BenchArgs, info: &ModelInfo, in_process: InProcess, served: Served) {
    let InProcess {
        tokens_per_s: in_process,
        query_ms: mut idle_in_process,
    } = in_process;
    let Served {
        tokens_per_s: served,
        idle_ms: mut idle,
        under_load_ms: mut loaded,
    } = served;
    let (idle, loaded_p50) = (median(&mut idle), median(&mut loaded));
    let row = serde_json::json!({
        "model": info.dir, "clients": args.clients, "tokens_per_input": args.tokens,
        "in_process_tokens_per_s": in_process, "served_tokens_per_s": served,
        "throughput_ratio": served / in_process,
        "query_p50_in_process_ms": median(&mut idle_in_process),
        "query_p50_idle_ms": idle, "query_p50_under_load_ms": loaded_p50,
        "latency_ratio": loaded_p50 / idle, "queries_under_load": loaded.len(),
    });
    if args.json {
        println!("{row}");
    } else {
        println!(
            "model {}, {} clients × 1 input of {} tokens, {} s of load",
            info.dir.display(),
            args.clients,
            args.tokens,
            args.seconds
        );
        println!(
            "throughput: in-process {in_process:.0} tokens/s, served {served:.0} tokens/s \
             (served/in-process {:.2})",
            served / in_process
        );
        println!(
            "16-token query p50: in-process {:.1} ms, served idle {idle:.1} ms, \
             served under load {loaded_p50:.1} ms ({} queries; under load/idle {:.2})",
            row["query_p50_in_process_ms"].as_f64().unwrap_or(f64::NAN),
            loaded.len(),
            loaded_p50 / idle
        );
    }
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
    if args.serve {
        return run_serve(&args);
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
            "model {} ({}, {} dims, weights {}, {}), loaded in {:.2}s, {threads} threads, peak RSS after load {}",
            info.dir.display(),
            info.model_type,
            info.dense_dim,
            info.weights.display(),
            recall_engine::KernelInfo::here().describe(info.dtype),
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
