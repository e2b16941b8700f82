//! Nearest chunks by dense vector.
//!
//! Two ways, one answer: sqlite-vec's exact float scan of every vector
//! (`Strategy::Exact`, what small indexes use), and for large ones a binary
//! first pass over the code file (`binary.rs`) whose candidates are rescored
//! exactly (`Strategy::Binary`). `Strategy::Auto` picks by index size.
//! `recall bench --search` measures both on the same data, with the share of
//! the exact top 10 that the binary path returns.

use anyhow::Result;

use super::binary::{self, CodeFile};
use crate::index::store::{Store, blob_f32, cache_key};

/// Indexes below this many vectors are scanned exactly: the scan is short at
/// this size (docs/benchmarks.md, "Choices"), and it has no recall to lose.
pub const EXACT_BELOW: i64 = 10_000;
/// Codes ranked by Hamming distance, then by the query's dot product with
/// them: this many per result wanted, and at least `SCAN_MIN`.
const SCAN_PER_RESULT: usize = 100;
const SCAN_MIN: usize = 10_000;
/// The best of the second ranking that are rescored exactly: per result
/// wanted, at least `RESCORE_MIN`, and one in `RESCORE_SHARE` of the index
/// (denser indexes have more near-ties that 1-bit codes cannot order).
/// Measured on clustered synthetic vectors (`recall bench --search`): at 1M,
/// 400 rescored give recall@10 0.95 and 1,000 give 1.00; at 100k, 100 give 1.00.
const RESCORE_PER_RESULT: usize = 4;
const RESCORE_MIN: usize = 100;
const RESCORE_SHARE: usize = 1000;
/// sqlite-vec's largest k.
const K_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Float scan of every vector in `chunks_vec`.
    Exact,
    /// Hamming scan of the code file, then exact rescoring of the candidates.
    Binary,
    /// Exact below `EXACT_BELOW` vectors, binary from there on.
    Auto,
}

/// Brings search's derived data up to date after indexing: a large index is
/// searched through its code file, so it is written now rather than in the
/// first search. Without it search is slower, not wrong, so a failure is a
/// warning. (Indexing leaves this to its callers: the index never reaches
/// into search's files.)
pub fn prepare(store: &Store) {
    let refresh = binary::approximate_len(store).and_then(|n| {
        if n >= EXACT_BELOW {
            CodeFile::open(store).map(drop)
        } else {
            Ok(())
        }
    });
    if let Err(e) = refresh {
        tracing::warn!("{e:#}");
    }
}

/// The `k` nearest chunks to `query`: (chunk id, L2 distance), nearest first.
pub fn knn(store: &Store, query: &[f32], k: usize, strategy: Strategy) -> Result<Vec<(i64, f32)>> {
    let k = k.clamp(1, K_MAX);
    let binary = match strategy {
        Strategy::Exact => false,
        Strategy::Binary => true,
        Strategy::Auto => binary::approximate_len(store)? >= EXACT_BELOW,
    };
    if binary {
        match CodeFile::open(store) {
            Ok(codes) => return rescored(store, &codes, query, k),
            // The code file is an accelerator: without it, search is slower, not wrong.
            Err(e) if strategy == Strategy::Auto => {
                tracing::warn!("exact vector scan instead of the binary one: {e:#}")
            }
            Err(e) => return Err(e),
        }
    }
    store.nearest_vectors(query, k)
}

fn rescored(store: &Store, codes: &CodeFile, query: &[f32], k: usize) -> Result<Vec<(i64, f32)>> {
    let rescore = (k * RESCORE_PER_RESULT)
        .max(RESCORE_MIN)
        .max(codes.len() / RESCORE_SHARE);
    let candidates = codes.candidates(query, (k * SCAN_PER_RESULT).max(SCAN_MIN), rescore);
    let vectors = StoredVectors::new(store)?;
    let mut scored = Vec::with_capacity(candidates.len());
    for id in candidates {
        // A chunk deleted since the code file was brought up to date has no
        // vector; one with NaN values (an older recall stored it) no distance.
        if let Some(v) = vectors.get(id)? {
            let distance = l2(query, &v);
            if distance.is_finite() {
                scored.push((id, distance));
            }
        }
    }
    scored.sort_by(|a, b| a.1.total_cmp(&b.1));
    scored.truncate(k);
    Ok(scored)
}

/// Stored vectors by chunk id, one B-tree lookup each: vec0 keeps 1024
/// vectors per 4 MB blob and a point lookup walks its overflow chain
/// (~0.6 ms), so the copy in the embedding cache (keyed by the chunk's text)
/// is read instead, and vec0 only when the cache lacks it.
pub struct StoredVectors<'a> {
    store: &'a Store,
    namespace: String,
}

impl<'a> StoredVectors<'a> {
    pub fn new(store: &'a Store) -> Result<Self> {
        let namespace = store
            .identity()?
            .map(|i| i.embedding_key())
            .unwrap_or_default();
        Ok(Self { store, namespace })
    }

    pub fn get(&self, chunk_id: i64) -> Result<Option<Vec<f32>>> {
        match self.store.chunk_text(chunk_id)? {
            Some(text) => self.get_by_text(chunk_id, &text),
            None => Ok(None),
        }
    }

    /// The vector of chunk `chunk_id`, whose text is `text`.
    pub fn get_by_text(&self, chunk_id: i64, text: &str) -> Result<Option<Vec<f32>>> {
        let blob = match self.store.cached_dense(&cache_key(&self.namespace, text))? {
            Some(b) => Some(b),
            None => self.store.stored_vector(chunk_id)?,
        };
        Ok(blob.map(|b| blob_f32(&b)))
    }
}

/// Euclidean distance.
pub fn l2(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y) * (x - y))
        .sum::<f32>()
        .sqrt()
}

/// Passages sampled to measure how a query's similarities spread over the index.
const SAMPLE: i64 = 256;

/// `query`'s similarity to up to `SAMPLE` passages of the index, evenly
/// spaced by chunk id (one B-tree seek each): (chunk id, similarity).
pub fn sample_similarities(
    store: &Store,
    query: &[f32],
    normalized: bool,
) -> Result<Vec<(i64, f32)>> {
    let last = store.last_chunk_id()?;
    let vectors = StoredVectors::new(store)?;
    let mut out: Vec<(i64, f32)> = Vec::with_capacity(SAMPLE as usize);
    for i in 0..SAMPLE {
        let at = 1 + i * last / SAMPLE;
        let Some((id, text)) = store.chunk_at_or_after(at)? else {
            continue;
        };
        if out.last().is_none_or(|(prev, _)| *prev != id)
            && let Some(v) = vectors.get_by_text(id, &text)?
        {
            out.push((
                id,
                super::candidates::l2_to_similarity(l2(query, &v), normalized),
            ));
        }
    }
    Ok(out)
}
