//! Criterion benches of the encoder on the shapes `recall bench` reports.
//!
//! The model is `$RECALL_BENCH_MODEL` (e.g. the full-size random BGE-M3 from
//! `scripts/make_full_bge_m3.py`), else the tiny fixture model. Shapes longer
//! than the model's limit are left out.
//!
//!     RECALL_BENCH_MODEL=models/bge-m3-random cargo bench --bench encoder

use std::path::PathBuf;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use recall::bench::{DEFAULT_SHAPES, synthetic_inputs};
use recall_engine::{Embedder, LoadOptions, Outputs};

fn encoder(c: &mut Criterion) {
    let dir = std::env::var_os("RECALL_BENCH_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/tiny-bge-m3"));
    let embedder =
        Embedder::load(&dir, &LoadOptions::default()).expect("cannot load the bench model");
    let mut group = c.benchmark_group("encoder");
    group.sample_size(10);
    for shape in DEFAULT_SHAPES
        .into_iter()
        .filter(|s| s.tokens <= embedder.info().max_length)
    {
        let inputs = synthetic_inputs(&embedder, shape).unwrap();
        group.throughput(Throughput::Elements((shape.batch * shape.tokens) as u64));
        group.bench_with_input(BenchmarkId::from_parameter(shape), &inputs, |b, inputs| {
            b.iter(|| embedder.embed_tokens(inputs, Outputs::DENSE).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, encoder);
criterion_main!(benches);
