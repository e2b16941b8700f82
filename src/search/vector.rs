//! Nearest chunks by dense vector.
//!
//! Search uses sqlite-vec's exact float scan (`Strategy::Exact`). The binary
//! first pass (`Strategy::Binary`: 1-bit codes in a `vec0` `bit[D]` table,
//! hamming distance, then exact rescoring of `OVERSAMPLE × k` candidates from
//! one-row-per-vector storage) is measured beside it by `recall bench
//! --search`; it lives in the benchmark's own tables until it beats the exact
//! scan at every size. Measured here: sqlite-vec's bit KNN costs O(n·k), so a
//! candidate pool large enough for recall@10 ≥ 0.99 at 1M chunks is slower
//! than the exact scan (see the README's search benchmark).

use anyhow::Result;
use rusqlite::Connection;

use crate::index::store::{blob_f32, f32_blob};

/// Candidates rescored per wanted result on the binary path.
pub const OVERSAMPLE: usize = 10;
/// sqlite-vec's largest k.
const K_MAX: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Float scan of every vector in `chunks_vec`.
    Exact,
    /// Binary scan of `chunks_bits`, then exact rescoring from `chunk_vectors`.
    Binary,
}

/// The tables the binary path reads, for vectors of `dimension` (a multiple of 8).
pub fn create_binary_tables(conn: &Connection, dimension: usize) -> Result<()> {
    conn.execute_batch(&format!(
        "CREATE VIRTUAL TABLE IF NOT EXISTS chunks_bits USING vec0(chunk_id INTEGER PRIMARY KEY, bits bit[{dimension}]);
         CREATE TABLE IF NOT EXISTS chunk_vectors (chunk_id INTEGER PRIMARY KEY, embedding BLOB NOT NULL);"
    ))?;
    Ok(())
}

/// Adds one vector to the binary path's tables.
pub fn insert_binary(conn: &Connection, chunk_id: i64, vector: &[f32]) -> Result<()> {
    let blob = f32_blob(vector);
    conn.prepare_cached(
        "INSERT INTO chunks_bits (chunk_id, bits) VALUES (?1, vec_quantize_binary(?2))",
    )?
    .execute(rusqlite::params![chunk_id, blob])?;
    conn.prepare_cached("INSERT INTO chunk_vectors (chunk_id, embedding) VALUES (?, ?)")?
        .execute(rusqlite::params![chunk_id, blob])?;
    Ok(())
}

/// The `k` nearest chunks to `query`: (chunk id, L2 distance), nearest first.
pub fn knn(
    conn: &Connection,
    query: &[f32],
    k: usize,
    strategy: Strategy,
) -> Result<Vec<(i64, f32)>> {
    let k = k.clamp(1, K_MAX);
    let blob = f32_blob(query);
    match strategy {
        Strategy::Exact => {
            let mut stmt = conn.prepare_cached(
                "SELECT chunk_id, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ? ORDER BY distance",
            )?;
            let rows = stmt.query_map(rusqlite::params![blob, k as i64], |r| {
                Ok((r.get(0)?, r.get::<_, f64>(1)? as f32))
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        }
        Strategy::Binary => {
            let mut coarse = conn.prepare_cached(
                "SELECT chunk_id FROM chunks_bits WHERE bits MATCH vec_quantize_binary(?) AND k = ?",
            )?;
            let ids: Vec<i64> = coarse
                .query_map(
                    rusqlite::params![blob, (k * OVERSAMPLE).min(K_MAX) as i64],
                    |r| r.get(0),
                )?
                .collect::<rusqlite::Result<_>>()?;
            // vec0 keeps 1024 vectors per blob, and reading one walks the blob's
            // overflow chain; one row per vector is a single page read.
            let mut exact =
                conn.prepare_cached("SELECT embedding FROM chunk_vectors WHERE chunk_id = ?")?;
            let mut scored = Vec::with_capacity(ids.len());
            for id in ids {
                let stored: Vec<u8> = exact.query_row([id], |r| r.get(0))?;
                scored.push((id, l2(query, &blob_f32(&stored))));
            }
            scored.sort_by(|a, b| a.1.total_cmp(&b.1));
            scored.truncate(k);
            Ok(scored)
        }
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
