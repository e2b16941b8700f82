//! Candidate passages, one signal each: nearest vectors, keyword hits
//! (FTS5 trigram BM25), session titles and BGE-M3's sparse weights; and the
//! filters a passage must pass.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;

use super::options::Filters;
use super::{Chunk, vector};
use crate::index::store::Store;

/// Hermes caps FTS queries at this many characters.
const MAX_KEYWORD_QUERY_CHARS: usize = 2048;

pub(super) fn dense_candidates(
    store: &Store,
    query: &[f32],
    k: usize,
    normalized: bool,
    scan: vector::Strategy,
) -> Result<Vec<(i64, f32)>> {
    let hits = vector::knn(store, query, k, scan)?;
    Ok(hits
        .into_iter()
        .map(|(id, d)| (id, l2_to_similarity(d, normalized)))
        .collect())
}

/// For unit vectors, cos = 1 − d²/2; otherwise only the order matters.
pub(super) fn l2_to_similarity(distance: f32, normalized: bool) -> f32 {
    if normalized {
        1.0 - distance * distance / 2.0
    } else {
        -distance
    }
}

/// The cosine of passages that the vector search did not return.
pub(super) fn exact_similarity(
    store: &Store,
    query: &[f32],
    chunks: &[&Chunk],
    normalized: bool,
) -> Result<Vec<(i64, f32)>> {
    let vectors = vector::StoredVectors::new(store)?;
    let mut out = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        if let Some(v) = vectors.get_by_text(chunk.id, &chunk.text)? {
            out.push((
                chunk.id,
                l2_to_similarity(vector::l2(query, &v), normalized),
            ));
        }
    }
    Ok(out)
}

/// FTS5 BM25 ranks are negative, lower is better: map to (0, 1).
fn bm25_to_score(rank: f64) -> f32 {
    (if rank < 0.0 {
        -rank / (1.0 - rank)
    } else {
        1.0 / (1.0 + rank)
    }) as f32
}

/// What keyword search found: passages in order (whole-query phrase hits,
/// then passages holding every word of it), each one's position and score.
#[derive(Default)]
pub(super) struct Keyword {
    pub(super) ranked: Vec<i64>,
    pub(super) rank: HashMap<i64, usize>,
    /// BM25 mapped to (0, 1), for weighted fusion.
    pub(super) score: HashMap<i64, f32>,
    /// Holds the whole query as a phrase.
    pub(super) exact: HashSet<i64>,
    /// Holds every word of the query.
    pub(super) all_words: HashSet<i64>,
}

/// Keyword hits: the whole query as an exact phrase first (identifiers such
/// as `nginx -t`), then all its words. Words are quoted, so FTS5 syntax in
/// the query (`"`, `*`, `NEAR`, `:`) is only text. The trigram tokenizer
/// needs three characters; shorter queries use a substring scan.
pub(super) fn keyword_candidates(store: &Store, query: &str, k: usize) -> Result<Keyword> {
    // Control characters (a NUL ends a string for FTS5's parser) are only spaces here.
    let query: String = query
        .chars()
        .take(MAX_KEYWORD_QUERY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let query = query.trim();
    let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let run = |fts: &str| store.keyword_matches(fts, k);
    if query.is_empty() {
        return Ok(Keyword::default());
    }
    let (phrase, all_words) = if query.chars().count() < 3 {
        let hits = store.substring_matches(query, k)?;
        (hits.into_iter().map(|id| (id, -1.0)).collect(), Vec::new())
    } else {
        let words: Vec<String> = query
            .split_whitespace()
            .filter(|w| w.chars().count() >= 3)
            .map(quote)
            .collect();
        let all_words = if words.len() > 1 {
            run(&words.join(" AND "))?
        } else {
            Vec::new()
        };
        (run(&quote(query))?, all_words)
    };
    let mut out = Keyword {
        exact: phrase.iter().map(|h| h.0).collect(),
        all_words: all_words.iter().map(|h| h.0).collect(),
        ..Default::default()
    };
    for (id, bm25) in phrase.into_iter().chain(all_words) {
        if let std::collections::hash_map::Entry::Vacant(slot) = out.rank.entry(id) {
            slot.insert(out.ranked.len());
            out.score.insert(id, bm25_to_score(bm25));
            out.ranked.push(id);
        }
    }
    Ok(out)
}

/// Passages of the sessions whose title holds the whole query (any case):
/// Hermes's own search looks at titles first. The first passage of each.
pub(super) fn title_candidates(store: &Store, query: &str, k: usize) -> Result<Vec<i64>> {
    store.title_matches(query, k)
}

pub(super) fn sparse_candidates(
    store: &Store,
    query: &BTreeMap<u32, f32>,
    k: usize,
) -> Result<Vec<i64>> {
    store.sparse_matches(query, k)
}

pub(super) fn load_chunks(store: &Store, ids: &[i64]) -> Result<HashMap<i64, Chunk>> {
    let mut out = HashMap::with_capacity(ids.len());
    for &id in ids {
        // A passage deleted by an indexer running beside us is skipped.
        if let Some(c) = store.stored_chunk(id)? {
            out.insert(id, c);
        }
    }
    Ok(out)
}

pub(super) fn passes(c: &Chunk, f: &Filters) -> bool {
    (f.roles.is_empty() || f.roles.contains(&c.role))
        && (f.sources.is_empty() || f.sources.contains(&c.source))
        && f.since.is_none_or(|t| c.timestamp >= t)
        && f.until.is_none_or(|t| c.timestamp <= t)
        && f.session
            .as_ref()
            .is_none_or(|s| *s == c.session_id || *s == c.lineage_root)
        && (f.profiles.is_empty() || f.profiles.contains(&c.profile))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bm25_scores_are_monotone() {
        assert!(bm25_to_score(-5.0) > bm25_to_score(-1.0));
        assert!(bm25_to_score(-1.0) > 0.0 && bm25_to_score(-1.0) < 1.0);
    }
}
