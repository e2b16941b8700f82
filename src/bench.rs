//! Encoder throughput on fixed batch × length shapes, for `recall bench`
//! and the criterion benches. Inputs are synthetic token ids of exactly the
//! asked length, so every run does the same work whatever the tokenizer.

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use recall_engine::tokenize::Tokens;
use recall_engine::{Embedder, Outputs};

/// `batch` inputs of `tokens` tokens each (special tokens included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub batch: usize,
    pub tokens: usize,
}

/// The shapes the issue tracker and docs/benchmarks.md report: a search query, short
/// messages, long messages, one whole document.
pub const DEFAULT_SHAPES: [Shape; 4] = [
    Shape {
        batch: 1,
        tokens: 16,
    },
    Shape {
        batch: 8,
        tokens: 128,
    },
    Shape {
        batch: 4,
        tokens: 512,
    },
    Shape {
        batch: 1,
        tokens: 8192,
    },
];

impl FromStr for Shape {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let (b, t) = s
            .split_once(['x', 'X', '×'])
            .with_context(|| format!("shape `{s}` is not BATCHxTOKENS, e.g. 8x128"))?;
        let batch: usize = b
            .trim()
            .parse()
            .with_context(|| format!("shape `{s}`: bad batch size"))?;
        let tokens: usize = t
            .trim()
            .parse()
            .with_context(|| format!("shape `{s}`: bad token count"))?;
        if batch == 0 || tokens < 2 {
            bail!("shape `{s}`: needs at least 1 input of 2 tokens");
        }
        Ok(Shape { batch, tokens })
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.batch, self.tokens)
    }
}

#[derive(Debug, Clone)]
pub struct ShapeResult {
    pub shape: Shape,
    pub median: Duration,
    pub best: Duration,
    pub runs: usize,
    /// Peak resident memory of the process while this shape ran, if the OS tells.
    pub peak_rss: Option<u64>,
}

impl ShapeResult {
    pub fn tokens_per_s(&self) -> f64 {
        (self.shape.batch * self.shape.tokens) as f64 / self.median.as_secs_f64()
    }
    pub fn texts_per_s(&self) -> f64 {
        self.shape.batch as f64 / self.median.as_secs_f64()
    }
}

/// Inputs of exactly `shape`: `<s>`, deterministic ordinary token ids, `</s>`.
pub fn synthetic_inputs(embedder: &Embedder, shape: Shape) -> Result<Vec<Tokens>> {
    let vocab_size = embedder.info().vocab_size;
    let max = embedder.info().max_length;
    if shape.tokens > max {
        bail!(
            "shape {shape} needs inputs of {} tokens; the model takes at most {max}",
            shape.tokens
        );
    }
    let wrapper = embedder.tokenizer().encode("")?.ids;
    let (open, close) = match wrapper.as_slice() {
        [open, close] => (*open, *close),
        other => bail!("the tokenizer wraps an empty text as {other:?}, not as two special tokens"),
    };
    let mut state = 0x2545_f491_u64;
    let mut next_id = || loop {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let id = ((state >> 33) % vocab_size as u64) as u32;
        if !embedder.tokenizer().is_special(id) && id != open && id != close {
            return id;
        }
    };
    Ok((0..shape.batch)
        .map(|_| {
            let mut ids = Vec::with_capacity(shape.tokens);
            ids.push(open);
            ids.extend((0..shape.tokens - 2).map(|_| next_id()));
            ids.push(close);
            Tokens {
                ids,
                truncated: false,
            }
        })
        .collect())
}

/// Times `runs` passes of each shape after one warm-up pass.
pub fn run(
    embedder: &Embedder,
    shapes: &[Shape],
    runs: usize,
    outputs: Outputs,
    mut progress: impl FnMut(&ShapeResult),
) -> Result<Vec<ShapeResult>> {
    let mut results = Vec::with_capacity(shapes.len());
    for &shape in shapes {
        let inputs = synthetic_inputs(embedder, shape)?;
        reset_peak_rss();
        embedder.embed_tokens(&inputs, outputs)?;
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            let out = embedder.embed_tokens(&inputs, outputs)?;
            times.push(started.elapsed());
            std::hint::black_box(out);
        }
        times.sort();
        let result = ShapeResult {
            shape,
            median: times[times.len() / 2],
            best: times[0],
            runs: times.len(),
            peak_rss: peak_rss(),
        };
        progress(&result);
        results.push(result);
    }
    Ok(results)
}

/// Resets the kernel's high-water mark of resident memory (Linux).
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Peak resident memory since the last reset, in bytes (Linux).
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse() {
        assert_eq!(
            "8x128".parse::<Shape>().unwrap(),
            Shape {
                batch: 8,
                tokens: 128
            }
        );
        assert_eq!(
            "1×16".parse::<Shape>().unwrap(),
            Shape {
                batch: 1,
                tokens: 16
            }
        );
        assert!("8".parse::<Shape>().is_err());
        assert!("0x5".parse::<Shape>().is_err());
    }
}

/// One index size of the vector-search benchmark.
#[derive(Debug, Clone, Serialize)]
pub struct SearchBenchRow {
    pub chunks: usize,
    pub dimension: usize,
    pub queries: usize,
    /// sqlite-vec's float scan of every vector (the stock way).
    pub exact_p50_ms: f64,
    pub exact_p99_ms: f64,
    /// recall's binary first pass + exact rescoring.
    pub binary_p50_ms: f64,
    pub binary_p99_ms: f64,
    /// Share of the exact top 10 that the binary path also returns.
    pub recall_at_10: f64,
    pub build_seconds: f64,
    pub index_bytes: u64,
}

/// Deterministic normal samples (Box–Muller over an LCG).
struct Gauss(u64);

impl Gauss {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    fn next(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
    fn unit_near(&mut self, centre: &[f32], spread: f32) -> Vec<f32> {
        let mut v: Vec<f32> = centre.iter().map(|c| c + spread * self.next()).collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
        v.iter_mut().for_each(|x| *x /= norm);
        v
    }
}

fn percentile(sorted_ms: &[f64], p: f64) -> f64 {
    sorted_ms[((sorted_ms.len() - 1) as f64 * p).round() as usize]
}

/// An index of `size` synthetic unit vectors at `path` (clustered, as
/// embeddings of conversations are; the binary path's tables too), and
/// `queries` query vectors near stored ones.
pub fn synthetic_vector_index(
    path: &Path,
    size: usize,
    dimension: usize,
    queries: usize,
) -> Result<(crate::index::store::Store, Vec<Vec<f32>>)> {
    use crate::index::store::{ChunkRow, MessageRow, Store};
    use crate::space::Identity;
    for suffix in ["", "-wal", "-shm", ".codes", ".codes.lock"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let mut store = Store::open(path)?;
    let identity = Identity {
        provider: "bench".into(),
        model: "synthetic".into(),
        family: String::new(),
        revision: "1".into(),
        weights_bytes: 0,
        dimension,
        normalized: true,
        sparse: false,
        chunk_tokens: 512,
        chunk_overlap: 64,
    };
    store.bind(&identity, true)?;
    let mut gauss = Gauss(42);
    let centres: Vec<Vec<f32>> = (0..1000)
        .map(|_| (0..dimension).map(|_| gauss.next()).collect())
        .collect();
    let mut samples = Vec::new();
    let namespace = identity.embedding_key();
    let mut id = 0usize;
    while id < size {
        // Stored as `recall index` stores messages: one chunk each, with text.
        let mut batch = Vec::new();
        for _ in 0..10_000.min(size - id) {
            let centre =
                &centres[(gauss.uniform() * centres.len() as f64) as usize % centres.len()];
            let v = gauss.unit_near(centre, 0.6);
            if samples.len() < queries && gauss.uniform() < 0.01 {
                samples.push(v.clone());
            }
            id += 1;
            batch.push(MessageRow {
                id: id as i64,
                session_id: format!("s{}", id / 50),
                role: "user".into(),
                timestamp: id as f64,
                fingerprint: String::new(),
                chunks: vec![ChunkRow {
                    text: format!("synthetic passage {id}"),
                    tokens: 4,
                    dense: v,
                    sparse: None,
                }],
                skipped_bytes: 0,
            });
        }
        store.put_messages("bench", &namespace, &batch)?;
    }
    let queries = samples.iter().map(|s| gauss.unit_near(s, 0.02)).collect();
    Ok((store, queries))
}

/// Builds a synthetic index of `size` vectors in `dir` and times `queries`
/// searches of the top 10 both ways.
pub fn search_bench(
    dir: &Path,
    size: usize,
    dimension: usize,
    queries: usize,
) -> Result<SearchBenchRow> {
    use crate::search::binary::CodeFile;
    use crate::search::vector::{Strategy, knn};
    let path = dir.join(format!("bench-{size}.db"));
    let started = Instant::now();
    let (store, queries) = synthetic_vector_index(&path, size, dimension, queries)?;
    anyhow::ensure!(
        !queries.is_empty(),
        "no queries: ask for at least 1, on an index of at least 1,000 chunks"
    );
    // The code file is written once after indexing, as `recall index` does.
    CodeFile::open(&store)?;
    let build_seconds = started.elapsed().as_secs_f64();
    let index_bytes = ["", "-wal", ".codes"]
        .iter()
        .filter_map(|s| std::fs::metadata(format!("{}{s}", path.display())).ok())
        .map(|m| m.len())
        .sum();
    let (mut exact_ms, mut binary_ms, mut found) = (Vec::new(), Vec::new(), 0usize);
    for q in &queries {
        let t = Instant::now();
        let truth = knn(&store, q, 10, Strategy::Exact)?;
        exact_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let fast = knn(&store, q, 10, Strategy::Binary)?;
        binary_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let truth: std::collections::HashSet<i64> = truth.iter().map(|h| h.0).collect();
        found += fast.iter().filter(|h| truth.contains(&h.0)).count();
    }
    exact_ms.sort_by(f64::total_cmp);
    binary_ms.sort_by(f64::total_cmp);
    drop(store);
    for suffix in ["", "-wal", "-shm", ".codes", ".codes.lock"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Ok(SearchBenchRow {
        chunks: size,
        dimension,
        queries: queries.len(),
        exact_p50_ms: percentile(&exact_ms, 0.5),
        exact_p99_ms: percentile(&exact_ms, 0.99),
        binary_p50_ms: percentile(&binary_ms, 0.5),
        binary_p99_ms: percentile(&binary_ms, 0.99),
        recall_at_10: found as f64 / (10 * queries.len()).max(1) as f64,
        build_seconds,
        index_bytes,
    })
}
