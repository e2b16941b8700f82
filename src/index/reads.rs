//! What search and the commands read from the index, by what it is: nearest
//! vectors, keyword and lexical matches, passages with their sessions,
//! codes, counts. With `store.rs`, the only place that speaks the index's
//! SQL, so a change of its layout stays here.

use std::collections::BTreeMap;

use anyhow::Result;
use rusqlite::types::Value as SqlValue;
use rusqlite::{OptionalExtension, params, params_from_iter};
use serde::Serialize;

use super::store::{Store, f32_blob};

/// A passage with the fields of its session that search filters and shows.
#[derive(Debug, Clone)]
pub struct StoredChunk {
    pub id: i64,
    pub profile: String,
    pub session_id: String,
    pub message_id: i64,
    pub role: String,
    pub timestamp: f64,
    pub text: String,
    pub source: String,
    pub title: Option<String>,
    pub model: Option<String>,
    /// The session this one continues (compression, branching), or itself.
    pub lineage_root: String,
    pub hidden: bool,
}

/// What the index holds, as `recall stats` reports it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Counts {
    pub sessions: i64,
    pub messages: i64,
    pub chunks: i64,
    pub vectors: i64,
    pub tokens_embedded: i64,
    pub cached_embeddings: i64,
    /// Messages indexed only up to `chunk::MAX_CHUNKS_PER_MESSAGE` chunks.
    pub capped_messages: i64,
    /// The bytes of those messages left out.
    pub skipped_bytes: i64,
}

impl Store {
    /// The `k` stored vectors nearest to `query` by sqlite-vec's exact scan:
    /// (chunk id, L2 distance), nearest first.
    pub fn nearest_vectors(&self, query: &[f32], k: usize) -> Result<Vec<(i64, f32)>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT chunk_id, distance FROM chunks_vec WHERE embedding MATCH ? AND k = ? ORDER BY distance",
        )?;
        // A row whose distance is not a number (a vector with NaN values,
        // stored by an older recall) is skipped, not an error for every search.
        let rows = stmt.query_map(params![f32_blob(query), k as i64], |r| {
            Ok((r.get(0)?, r.get::<_, Option<f64>>(1)?))
        })?;
        let mut out = Vec::with_capacity(k);
        for row in rows {
            if let (id, Some(distance)) = row?
                && distance.is_finite()
            {
                out.push((id, distance as f32));
            }
        }
        Ok(out)
    }

    /// A passage's text (None: deleted).
    pub fn chunk_text(&self, chunk_id: i64) -> Result<Option<String>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT text FROM chunks WHERE id = ?")?
            .query_row([chunk_id], |r| r.get(0))
            .optional()?)
    }

    /// The embedding cache's dense vector under `key` (`store::cache_key`), as stored.
    pub fn cached_dense(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT dense FROM embed_cache WHERE key = ?")?
            .query_row([key], |r| r.get(0))
            .optional()?)
    }

    /// A passage's vector as sqlite-vec stores it.
    pub fn stored_vector(&self, chunk_id: i64) -> Result<Option<Vec<u8>>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT embedding FROM chunks_vec WHERE chunk_id = ?")?
            .query_row([chunk_id], |r| r.get(0))
            .optional()?)
    }

    /// The largest passage id (0 when there is none).
    pub fn last_chunk_id(&self) -> Result<i64> {
        Ok(self
            .conn()
            .query_row("SELECT COALESCE(MAX(id), 0) FROM chunks", [], |r| r.get(0))?)
    }

    /// The first passage at or after id `at`: (id, text).
    pub fn chunk_at_or_after(&self, at: i64) -> Result<Option<(i64, String)>> {
        Ok(self
            .conn()
            .prepare_cached("SELECT id, text FROM chunks WHERE id >= ? ORDER BY id LIMIT 1")?
            .query_row([at], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?)
    }

    /// Passages matching an FTS5 expression, best first: (id, BM25, lower is better).
    pub fn keyword_matches(&self, fts: &str, k: usize) -> Result<Vec<(i64, f64)>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT rowid, bm25(chunks_fts) FROM chunks_fts WHERE chunks_fts MATCH ? ORDER BY bm25(chunks_fts) LIMIT ?",
        )?;
        let rows = stmt.query_map(params![fts, k as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Passages matching an FTS5 expression over the word index (stemmed
    /// words), best first: (id, BM25, lower is better).
    pub fn word_matches(&self, fts: &str, k: usize) -> Result<Vec<(i64, f64)>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT rowid, bm25(chunks_words) FROM chunks_words WHERE chunks_words MATCH ? ORDER BY bm25(chunks_words) LIMIT ?",
        )?;
        let rows = stmt.query_map(params![fts, k as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every passage holding `word` (an FTS5 string, stemmed as the word
    /// index stems), with its session: (passage id, profile, session id).
    pub fn word_postings(&self, word: &str) -> Result<Vec<(i64, String, String)>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT c.id, c.profile, c.session_id FROM chunks_words w JOIN chunks c ON c.id = w.rowid
             WHERE chunks_words MATCH ?",
        )?;
        let rows = stmt.query_map([word], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// How many passages and how many sessions the index holds.
    pub fn passage_and_session_counts(&self) -> Result<(i64, i64)> {
        Ok(self
            .conn()
            .prepare_cached(
                "SELECT (SELECT COUNT(*) FROM chunks), (SELECT COUNT(*) FROM sessions)",
            )?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?)
    }

    /// How many passages one session has.
    pub fn session_passages(&self, profile: &str, session_id: &str) -> Result<i64> {
        Ok(self
            .conn()
            .prepare_cached("SELECT COUNT(*) FROM chunks WHERE profile = ? AND session_id = ?")?
            .query_row([profile, session_id], |r| r.get(0))?)
    }

    /// Passages holding `text` anywhere (for queries too short for the trigram index).
    pub fn substring_matches(&self, text: &str, k: usize) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn()
            .prepare_cached("SELECT id FROM chunks WHERE instr(text, ?) > 0 LIMIT ?")?;
        let rows = stmt.query_map(params![text, k as i64], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// The first passage of each visible session whose title holds `query` (any case).
    pub fn title_matches(&self, query: &str, k: usize) -> Result<Vec<i64>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT MIN(c.id) FROM sessions s JOIN chunks c ON c.profile = s.profile AND c.session_id = s.id
             WHERE s.hidden = 0 AND instr(lower(s.title), lower(?)) > 0 GROUP BY s.profile, s.id LIMIT ?",
        )?;
        let rows = stmt.query_map(params![query, k as i64], |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Passages by their lexical score against `query` (token id → weight), best first.
    pub fn sparse_matches(&self, query: &BTreeMap<u32, f32>, k: usize) -> Result<Vec<i64>> {
        if query.is_empty() {
            return Ok(Vec::new());
        }
        let values = vec!["(?, ?)"; query.len()].join(", ");
        let sql = format!(
            "WITH q(token_id, weight) AS (VALUES {values}) \
             SELECT s.chunk_id, SUM(s.weight * q.weight) AS score FROM chunk_sparse s JOIN q USING (token_id) \
             GROUP BY s.chunk_id ORDER BY score DESC LIMIT ?"
        );
        let mut params: Vec<SqlValue> = Vec::with_capacity(query.len() * 2 + 1);
        for (id, w) in query {
            params.push(SqlValue::Integer(*id as i64));
            params.push(SqlValue::Real(*w as f64));
        }
        params.push(SqlValue::Integer(k as i64));
        let mut stmt = self.conn().prepare(&sql)?;
        let rows = stmt.query_map(params_from_iter(params), |r| r.get(0))?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// A passage with its session's fields (None: deleted, say by an
    /// indexer running beside the search).
    pub fn stored_chunk(&self, id: i64) -> Result<Option<StoredChunk>> {
        let mut stmt = self.conn().prepare_cached(
            "SELECT c.id, c.profile, c.session_id, c.message_id, c.role, c.timestamp, c.text,
                    COALESCE(s.source, ''), s.title, s.model, COALESCE(s.lineage_root, c.session_id), COALESCE(s.hidden, 0)
             FROM chunks c LEFT JOIN sessions s ON s.profile = c.profile AND s.id = c.session_id WHERE c.id = ?",
        )?;
        Ok(stmt
            .query_row([id], |r| {
                Ok(StoredChunk {
                    id: r.get(0)?,
                    profile: r.get(1)?,
                    session_id: r.get(2)?,
                    message_id: r.get(3)?,
                    role: r.get(4)?,
                    timestamp: r.get::<_, Option<f64>>(5)?.unwrap_or(0.0),
                    text: r.get(6)?,
                    source: r.get(7)?,
                    title: r.get(8)?,
                    model: r.get(9)?,
                    lineage_root: r.get(10)?,
                    hidden: r.get(11)?,
                })
            })
            .optional()?)
    }

    /// The first passage of the message after `chunk`'s in its session, when
    /// that message is the other side's turn (`user` after `assistant`, or
    /// the reverse): what answers a question `chunk` asked.
    pub fn answer_to(&self, chunk: &StoredChunk) -> Result<Option<StoredChunk>> {
        let next: Option<i64> = self
            .conn()
            .prepare_cached(
                "SELECT id FROM chunks WHERE profile = ? AND session_id = ? AND message_id > ?
                 ORDER BY message_id, seq LIMIT 1",
            )?
            .query_row(
                params![chunk.profile, chunk.session_id, chunk.message_id],
                |r| r.get(0),
            )
            .optional()?;
        let Some(next) = next else {
            return Ok(None);
        };
        let turn = |role: &str| matches!(role, "user" | "assistant");
        Ok(self
            .stored_chunk(next)?
            .filter(|a| turn(&a.role) && turn(&chunk.role) && a.role != chunk.role))
    }

    /// The largest id with a binary code (0 when there is none).
    pub fn last_code_id(&self) -> Result<i64> {
        Ok(self.conn().query_row(
            "SELECT coalesce(max(chunk_id), 0) FROM chunk_codes",
            [],
            |r| r.get(0),
        )?)
    }

    /// Calls `each(chunk id, code)` for the codes of ids above `after`, in id order.
    pub fn codes_after(
        &self,
        after: i64,
        mut each: impl FnMut(i64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        let mut stmt = self.conn().prepare(
            "SELECT chunk_id, code FROM chunk_codes WHERE chunk_id > ? ORDER BY chunk_id",
        )?;
        let mut rows = stmt.query([after])?;
        while let Some(row) = rows.next()? {
            each(row.get(0)?, row.get_ref(1)?.as_blob()?)?;
        }
        Ok(())
    }

    /// A read snapshot: what is read until it is dropped is of one state of
    /// the index, without taking the write lock that indexing takes.
    pub fn read_snapshot(&self) -> Result<rusqlite::Transaction<'_>> {
        Ok(rusqlite::Transaction::new_unchecked(
            self.conn(),
            rusqlite::TransactionBehavior::Deferred,
        )?)
    }

    /// The newest message id of `profile` in the index (0 for none).
    pub fn last_message_id(&self, profile: &str) -> Result<i64> {
        Ok(self.conn().query_row(
            "SELECT COALESCE(MAX(id), 0) FROM messages WHERE profile = ?",
            [profile],
            |r| r.get(0),
        )?)
    }

    pub fn counts(&self) -> Result<Counts> {
        let count =
            |sql: &str| -> Result<i64> { Ok(self.conn().query_row(sql, [], |r| r.get(0))?) };
        Ok(Counts {
            sessions: count("SELECT COUNT(*) FROM sessions")?,
            messages: count("SELECT COUNT(*) FROM messages")?,
            chunks: count("SELECT COUNT(*) FROM chunks")?,
            // The vector table exists once the index has a model.
            vectors: match self.identity()? {
                Some(_) => count("SELECT COUNT(*) FROM chunks_vec")?,
                None => 0,
            },
            tokens_embedded: count("SELECT COALESCE(SUM(tokens), 0) FROM chunks")?,
            cached_embeddings: count("SELECT COUNT(*) FROM embed_cache")?,
            capped_messages: count("SELECT COUNT(*) FROM capped_messages")?,
            skipped_bytes: count("SELECT COALESCE(SUM(skipped_bytes), 0) FROM capped_messages")?,
        })
    }
}
