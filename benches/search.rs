//! Criterion benches of vector search on a synthetic index: sqlite-vec's
//! exact float scan (what `recall search` uses) and the binary first pass
//! with exact rescoring. `recall bench --search` reports the same as
//! p50/p99 with recall@10 at 10k, 100k and 1M chunks.
//!
//!     RECALL_BENCH_CHUNKS=100000 cargo bench --bench search

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use recall::bench::synthetic_vector_index;
use recall::search::vector::{Strategy, knn};

fn search(c: &mut Criterion) {
    let chunks: usize = std::env::var("RECALL_BENCH_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let dir = tempfile::tempdir().unwrap();
    let (store, queries) =
        synthetic_vector_index(&dir.path().join("bench.db"), chunks, 1024, 20).unwrap();
    let mut group = c.benchmark_group("vector_search");
    group.sample_size(10);
    for (name, strategy) in [("exact", Strategy::Exact), ("binary", Strategy::Binary)] {
        let mut next = queries.iter().cycle();
        group.bench_function(BenchmarkId::new(name, chunks), |b| {
            b.iter(|| knn(&store, next.next().unwrap(), 10, strategy).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, search);
criterion_main!(benches);
