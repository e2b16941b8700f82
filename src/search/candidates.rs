//! Candidate passages, one signal each: nearest vectors, keyword hits
//! (FTS5 trigram phrases, then BM25 over the query's words), session titles
//! and BGE-M3's sparse weights; and the filters a passage must pass.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::Result;

use super::options::Filters;
use super::{Chunk, vector, words};
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
            let distance = vector::l2(query, &v);
            if distance.is_finite() {
                out.push((chunk.id, l2_to_similarity(distance, normalized)));
            }
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
/// then passages holding every word of it), each one's position and score,
/// and what the query's words say of each passage.
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
    /// Passages holding any of the query's words (`words::query_words`),
    /// by BM25 over those words: higher is better.
    pub(super) words: HashMap<i64, f32>,
    /// Each passage's share of the query's word weight: the IDF of the
    /// words it holds over the IDF of all of them, in [0, 1]. A word the
    /// history never uses weighs the most, so a question about something
    /// never discussed is covered by little.
    pub(super) coverage: HashMap<i64, f32>,
    /// Sessions by BM25 over the query's words, a session taken as one
    /// document of its passages: higher is better. A question's words are
    /// often spread over several turns of the conversation that answers it.
    pub(super) sessions: HashMap<(String, String), f32>,
    /// Each session's share of the query's word weight, a session taken as
    /// one document (the words its passages hold together).
    pub(super) session_coverage: HashMap<(String, String), f32>,
}

/// Keyword hits: the whole query as an exact phrase first (identifiers such
/// as `nginx -t`), then all its words. Words are quoted, so FTS5 syntax in
/// the query (`"`, `*`, `NEAR`, `:`) is only text. The trigram tokenizer
/// needs three characters; shorter queries use a substring scan. Then the
/// passages holding any of its words, by BM25 over the word index: a
/// question's words are rarely all in one message.
pub(super) fn keyword_candidates(store: &Store, query: &str, k: usize) -> Result<Keyword> {
    // Control characters (a NUL ends a string for FTS5's parser) are only spaces here.
    let query: String = query
        .chars()
        .take(MAX_KEYWORD_QUERY_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let query = query.trim();
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
    let words = words::query_words(query);
    if !words.is_empty() {
        let fts = words
            .iter()
            .map(|w| quote(w))
            .collect::<Vec<_>>()
            .join(" OR ");
        for (id, bm25) in store.word_matches(&fts, k)? {
            out.words.insert(id, -bm25 as f32);
            out.score.entry(id).or_insert(bm25_to_score(bm25));
        }
        let weights = word_weights(store, &words, out.words.keys().copied())?;
        out.coverage = weights.coverage;
        out.sessions = weights.sessions;
        out.session_coverage = weights.session_coverage;
    }
    Ok(out)
}

/// FTS5 string syntax: the text is matched as it is, never parsed as an expression.
fn quote(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// BM25's term saturation and length normalisation (FTS5's own values).
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;

/// BM25's IDF of a word found in `df` of `n` documents: a word in every
/// document weighs almost nothing, a word in none the most.
fn idf(n: f64, df: f64) -> f64 {
    ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
}

/// What the query's words weigh in passages and sessions (`word_weights`).
struct WordWeights {
    /// Each passage's share of the IDF weight of the words.
    coverage: HashMap<i64, f32>,
    /// Each session's BM25 over the words.
    sessions: HashMap<(String, String), f32>,
    /// Each session's share of the IDF weight of the words.
    session_coverage: HashMap<(String, String), f32>,
}

/// Each of `ids`' share of the IDF weight of `words`, each session's
/// share, and each session's BM25 over `words` with a session as one
/// document: a word's frequency there is the number of its passages
/// holding it, its length its number of passages.
fn word_weights(
    store: &Store,
    words: &[String],
    ids: impl Iterator<Item = i64>,
) -> Result<WordWeights> {
    let (passages, sessions) = store.passage_and_session_counts()?;
    let (passages, sessions) = (passages as f64, sessions.max(1) as f64);
    let mean_length = passages / sessions;
    let mut held: HashMap<i64, f64> = ids.map(|id| (id, 0.0)).collect();
    let mut total = 0.0;
    let mut lengths: HashMap<(String, String), f64> = HashMap::new();
    let mut by_session: HashMap<(String, String), f64> = HashMap::new();
    let mut session_held: HashMap<(String, String), f64> = HashMap::new();
    for word in words {
        let postings = store.word_postings(&quote(word))?;
        let weight = idf(passages, postings.len() as f64);
        total += weight;
        let mut frequency: HashMap<(String, String), f64> = HashMap::new();
        for (id, profile, session) in postings {
            if let Some(w) = held.get_mut(&id) {
                *w += weight;
            }
            *frequency.entry((profile, session)).or_default() += 1.0;
        }
        for key in frequency.keys() {
            *session_held.entry(key.clone()).or_default() += weight;
        }
        let weight = idf(sessions, frequency.len() as f64);
        for (key, tf) in frequency {
            let length = match lengths.get(&key) {
                Some(l) => *l,
                None => {
                    let l = store.session_passages(&key.0, &key.1)? as f64;
                    lengths.insert(key.clone(), l);
                    l
                }
            };
            let norm = 1.0 - BM25_B + BM25_B * length / mean_length.max(f64::MIN_POSITIVE);
            *by_session.entry(key).or_default() +=
                weight * tf * (BM25_K1 + 1.0) / (tf + BM25_K1 * norm);
        }
    }
    let share = |w: f64| if total > 0.0 { (w / total) as f32 } else { 0.0 };
    Ok(WordWeights {
        coverage: held.into_iter().map(|(id, w)| (id, share(w))).collect(),
        sessions: by_session.into_iter().map(|(k, v)| (k, v as f32)).collect(),
        session_coverage: session_held
            .into_iter()
            .map(|(k, w)| (k, share(w)))
            .collect(),
    })
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
