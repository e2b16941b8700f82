//! Hybrid session search over recall's index: candidate passages from dense
//! similarity (sqlite-vec KNN), keyword match (FTS5: phrases by trigram, so
//! CJK text is found; the query's words by BM25 over stemmed words) and
//! BGE-M3's sparse lexical score, gathered into sessions
//! by lineage with Hermes's rules applied, and ranked as sessions
//! (`rank.rs`): by reciprocal rank (or weighted as openClaw does), each
//! result marked weak or not.

pub mod binary;
mod candidates;
mod options;
pub mod rank;
mod time;
pub mod vector;
mod words;

use candidates::{
    Keyword, dense_candidates, exact_similarity, keyword_candidates, load_chunks, passes,
    sparse_candidates, title_candidates,
};
pub use options::{Filters, Fusion, Mode, SearchInfo, SearchOptions, SessionHit, Signals};
pub use time::{parse_time, rfc3339};

use std::collections::{HashMap, HashSet};

use anyhow::{Context, Result, bail};

use crate::index::store::Store;
use crate::provider::Provider;
use crate::space::Identity;
use recall_engine::Outputs;
use recall_engine::score;

/// Longest snippet, in characters.
const SNIPPET_CHARS: usize = 240;

type Chunk = crate::index::reads::StoredChunk;

/// Searches `store` for `query`. `provider` must give vectors of the
/// index's space (see `index::query_provider`); without one, the search is
/// keyword-only and says so.
pub fn search(
    store: &Store,
    provider: Option<&dyn Provider>,
    query: &str,
    options: &SearchOptions,
) -> Result<(Vec<SessionHit>, SearchInfo)> {
    let query = query.trim();
    let identity = searchable(store, query, options)?;
    let (embedded, note) = embed_for_search(provider, query, &identity, options)?;
    let dense_query = embedded.as_ref().and_then(|e| e.dense.as_deref());
    let found = gather(store, query, embedded.as_ref(), &identity, options)?;
    let candidates = found.candidates;
    let sessions = sessions_of(found.chunks, &found.signals, options);
    let mut ranked = rank_sessions(
        store,
        query,
        dense_query,
        &identity,
        sessions,
        &found.signals,
        options,
    )?;
    if options.rerank {
        let embedder = provider
            .filter(|p| p.capabilities().colbert)
            .context("--rerank needs recall's own model (ColBERT vectors)")?;
        let q = embedded
            .as_ref()
            .and_then(|e| e.colbert.as_ref())
            .context("--rerank needs the model's ColBERT vectors")?;
        rerank(embedder, q, &mut ranked, options.limit.saturating_mul(4))?;
    }
    if options.mmr.is_none() {
        // Only the results shown need their answers looked up.
        ranked.truncate(options.limit);
    }
    let mut results: Vec<SessionHit> = ranked
        .into_iter()
        .map(|(s, standing)| s.into_hit(standing, query, store, &options.filters))
        .collect::<Result<_>>()?;
    if let Some(lambda) = options.mmr {
        results = mmr(results, lambda, options.limit)?;
    }
    results.truncate(options.limit);
    let mode = if embedded.is_some() {
        Mode::Hybrid
    } else {
        Mode::Keyword
    };
    Ok((
        results,
        SearchInfo {
            mode,
            candidates,
            note,
        },
    ))
}

/// The index's identity, once the query, the options and the index can be
/// searched.
fn searchable(store: &Store, query: &str, options: &SearchOptions) -> Result<Identity> {
    if query.is_empty() {
        bail!("the query is empty");
    }
    options.check()?;
    let identity = store
        .identity()?
        .context("the index is empty: run `recall index` first")?;
    if store.is_empty()? {
        bail!(
            "the index {} is empty (no passages yet): run `recall index`, or Hermes's history has no messages to index",
            store.path().display()
        );
    }
    Ok(identity)
}

/// The query's embedding, everything the search needs in one pass (dense,
/// sparse, and ColBERT for `--rerank`), and a note when it failed and a
/// hybrid search goes on with exact words.
fn embed_for_search(
    provider: Option<&dyn Provider>,
    query: &str,
    identity: &Identity,
    options: &SearchOptions,
) -> Result<(Option<recall_engine::Embedding>, Option<String>)> {
    let Some(p) = provider.filter(|_| options.signals != Signals::Keyword) else {
        return Ok((None, None));
    };
    check_model(p, identity)?;
    let outputs = Outputs {
        dense: true,
        sparse: identity.sparse && p.capabilities().sparse,
        colbert: options.rerank,
    };
    match embed_query(p, query, outputs) {
        Ok(e) => Ok((Some(e), None)),
        // Exact words still find something: better than nothing, and said.
        Err(e) if options.signals == Signals::Hybrid && !options.rerank => {
            Ok((None, Some(format!("{}: {e:#}", p.name()))))
        }
        Err(e) => Err(e),
    }
}

/// What each signal said of the candidate passages.
struct PassageSignals {
    /// Every candidate's cosine to the query, when it has a dense vector.
    dense_sim: HashMap<i64, f32>,
    /// The cosine of the last dense candidate: a passage below it was not
    /// among the nearest.
    floor: f32,
    keyword: Keyword,
    sparse_rank: HashMap<i64, usize>,
}

/// The candidate passages of every signal, read from the store.
struct Gathered {
    chunks: HashMap<i64, Chunk>,
    /// How many distinct passages the signals proposed.
    candidates: usize,
    signals: PassageSignals,
}

/// Candidate passages from each signal, with the cosine of those only
/// keyword or sparse search found.
fn gather(
    store: &Store,
    query: &str,
    embedded: Option<&recall_engine::Embedding>,
    identity: &Identity,
    options: &SearchOptions,
) -> Result<Gathered> {
    let pool = options.limit.saturating_mul(40).clamp(100, 1000);
    let dense_query = embedded.and_then(|e| e.dense.as_ref());
    let mut dense_sim: HashMap<i64, f32> = HashMap::new();
    let mut floor = f32::MIN;
    if let Some(dense) = dense_query {
        let hits = dense_candidates(store, dense, pool, identity.normalized, options.scan)?;
        floor = hits.last().map_or(f32::MIN, |h| h.1);
        dense_sim.extend(hits);
    }
    let keyword = match options.signals {
        Signals::Dense => Keyword::default(),
        _ => keyword_candidates(store, query, pool)?,
    };
    let sparse_list = match embedded
        .and_then(|e| e.sparse.as_ref())
        .filter(|_| options.signals == Signals::Hybrid)
    {
        Some(sparse) => sparse_candidates(store, sparse, pool)?,
        None => Vec::new(),
    };
    let sparse_rank: HashMap<i64, usize> = first_positions(&sparse_list);
    let titled = match options.signals {
        Signals::Dense => Vec::new(),
        _ => title_candidates(store, query, pool)?,
    };
    let mut ids: Vec<i64> = dense_sim.keys().copied().collect();
    ids.extend(keyword.ranked.iter().chain(&sparse_list).chain(&titled));
    ids.extend(keyword.words.keys());
    ids.sort_unstable();
    ids.dedup();
    let candidates = ids.len();
    let chunks = load_chunks(store, &ids)?;
    // Passages only keyword or sparse search found still need their cosine.
    if let Some(dense) = dense_query {
        let missing: Vec<&Chunk> = chunks
            .values()
            .filter(|c| !dense_sim.contains_key(&c.id))
            .collect();
        dense_sim.extend(exact_similarity(
            store,
            dense,
            &missing,
            identity.normalized,
        )?);
    }
    Ok(Gathered {
        chunks,
        candidates,
        signals: PassageSignals {
            dense_sim,
            floor,
            keyword,
            sparse_rank,
        },
    })
}

/// Sessions, not fragments: the candidates of each lineage together, past
/// Hermes's hiding and the filters, each session's passages best first.
fn sessions_of(
    chunks: HashMap<i64, Chunk>,
    signals: &PassageSignals,
    options: &SearchOptions,
) -> Vec<Candidate> {
    let PassageSignals {
        dense_sim,
        keyword,
        sparse_rank,
        ..
    } = signals;
    // BM25 has no fixed scale: each passage's is a share of this query's best.
    let best_words = keyword.words.values().copied().fold(0.0, f32::max);
    let mut sessions: Vec<Candidate> = Vec::new();
    let mut of_lineage: HashMap<(String, String), usize> = HashMap::new();
    for chunk in chunks.into_values() {
        if chunk.hidden || !passes(&chunk, &options.filters) {
            continue;
        }
        let similarity = dense_sim.get(&chunk.id).copied();
        if let (Some(min), Some(similarity)) = (options.min_score, similarity)
            && similarity < min
            && !keyword.exact.contains(&chunk.id)
        {
            continue;
        }
        let key = (chunk.profile.clone(), chunk.lineage_root.clone());
        let at = *of_lineage.entry(key).or_insert_with(|| {
            sessions.push(Candidate::default());
            sessions.len() - 1
        });
        sessions[at].passages.push(Passage {
            similarity: similarity.unwrap_or(f32::NAN),
            keyword_rank: keyword.rank.get(&chunk.id).copied(),
            sparse_rank: sparse_rank.get(&chunk.id).copied(),
            exact: keyword.exact.contains(&chunk.id) || keyword.all_words.contains(&chunk.id),
            words: keyword
                .words
                .get(&chunk.id)
                .map_or(0.0, |w| w / best_words.max(f32::MIN_POSITIVE)),
            coverage: keyword.coverage.get(&chunk.id).copied().unwrap_or(0.0),
            chunk,
        });
    }
    let ranking = &options.ranking;
    for s in &mut sessions {
        s.passages.sort_by(|a, b| {
            b.relevance(ranking)
                .total_cmp(&a.relevance(ranking))
                .then(a.chunk.id.cmp(&b.chunk.id))
        });
    }
    sessions
}

/// What `rank.rs` weighs of each session.
fn evidence_of(
    sessions: &[Candidate],
    titles: &[Option<f32>],
    title_match: &[bool],
    keyword: &Keyword,
    dense: bool,
) -> Vec<rank::Evidence> {
    // Like the passages', each session's BM25 is a share of the best.
    let best_session_words = keyword.sessions.values().copied().fold(0.0, f32::max);
    sessions
        .iter()
        .zip(titles)
        .zip(title_match)
        .map(|((s, title), title_match)| rank::Evidence {
            passages: if dense {
                let mut cosines: Vec<f32> = s
                    .passages
                    .iter()
                    .map(|p| p.similarity)
                    .filter(|c| c.is_finite())
                    .collect();
                cosines.sort_by(|a, b| b.total_cmp(a));
                cosines
            } else {
                Vec::new()
            },
            matches: s.passages.iter().map(|p| (p.cosine(), p.words)).collect(),
            coverage: s.passages.iter().map(|p| p.coverage).fold(0.0, f32::max),
            covered_cosines: s
                .passages
                .iter()
                .filter(|p| p.coverage > 0.0 && p.similarity.is_finite())
                .map(|p| (p.coverage, p.similarity))
                .collect(),
            session_words: s.best_of_sessions(&keyword.sessions)
                / best_session_words.max(f32::MIN_POSITIVE),
            session_coverage: s.best_of_sessions(&keyword.session_coverage),
            title: *title,
            keyword_rank: s.passages.iter().filter_map(|p| p.keyword_rank).min(),
            keyword_score: s
                .passages
                .iter()
                .filter_map(|p| keyword.score.get(&p.chunk.id).copied())
                .reduce(f32::max),
            sparse_rank: s.passages.iter().filter_map(|p| p.sparse_rank).min(),
            keyword_match: *title_match || s.passages.iter().any(|p| p.exact),
            cron: s.passages[0].chunk.source == crate::source::hermes::CRON_SOURCE,
        })
        .collect()
}

/// The sessions ranked best first (`rank::standings`, then the age decay of
/// `--half-life`).
fn rank_sessions(
    store: &Store,
    query: &str,
    dense_query: Option<&[f32]>,
    identity: &Identity,
    sessions: Vec<Candidate>,
    signals: &PassageSignals,
    options: &SearchOptions,
) -> Result<Vec<(Candidate, rank::Standing)>> {
    let titles = match dense_query {
        Some(dense) => title_similarity(store, dense, &sessions)?,
        None => vec![None; sessions.len()],
    };
    let title_match = title_matches(query, &sessions);
    let evidence = evidence_of(
        &sessions,
        &titles,
        &title_match,
        &signals.keyword,
        dense_query.is_some(),
    );
    let spread = match dense_query {
        Some(dense) => {
            let sample = vector::sample_similarities(store, dense, identity.normalized)?;
            let ids: Vec<Vec<i64>> = sessions
                .iter()
                .map(|s| s.passages.iter().map(|p| p.chunk.id).collect())
                .collect();
            rank::Spread::of(&sample, &evidence, &ids, signals.floor, &options.ranking)
        }
        None => None,
    };
    let standings = rank::standings(
        &evidence,
        signals.floor,
        spread,
        options.fusion,
        &options.ranking,
    );
    let now = crate::index::unix_now();
    let mut ranked: Vec<(Candidate, rank::Standing)> =
        sessions.into_iter().zip(standings).collect();
    if let Some(half_life) = options.half_life_days {
        for (s, standing) in &mut ranked {
            let age_days = ((now - s.passages[0].chunk.timestamp) / 86_400.0).max(0.0);
            standing.fused *= (-(std::f64::consts::LN_2) * age_days / half_life).exp() as f32;
        }
    }
    ranked.sort_by(|a, b| {
        b.1.fused
            .total_cmp(&a.1.fused)
            .then(a.0.passages[0].chunk.id.cmp(&b.0.passages[0].chunk.id))
    });
    Ok(ranked)
}

/// A passage of a candidate session, with what each signal said of it.
struct Passage {
    chunk: Chunk,
    /// Cosine with the query (NaN without a query vector).
    similarity: f32,
    keyword_rank: Option<usize>,
    sparse_rank: Option<usize>,
    /// The query is in it word for word (as a phrase, or all its words).
    exact: bool,
    /// Its BM25 over the query's words, as a share of the query's best.
    words: f32,
    /// The share of the query's word weight it holds.
    coverage: f32,
}

impl Passage {
    /// Its cosine with the query, 0 where there is none.
    fn cosine(&self) -> f32 {
        if self.similarity.is_nan() {
            0.0
        } else {
            self.similarity
        }
    }

    /// What ranks it: its cosine and its words (`rank::Ranking::words`).
    fn relevance(&self, r: &rank::Ranking) -> f32 {
        self.cosine() + r.words * self.words
    }
}

/// The candidate passages of one lineage, best first.
#[derive(Default)]
struct Candidate {
    passages: Vec<Passage>,
}

impl Candidate {
    /// The largest of `by_session`'s values for the Hermes sessions its
    /// passages come from (a lineage may span several); 0 for none.
    fn best_of_sessions(&self, by_session: &HashMap<(String, String), f32>) -> f32 {
        self.passages
            .iter()
            .filter_map(|p| {
                let key = (p.chunk.profile.clone(), p.chunk.session_id.clone());
                by_session.get(&key).copied()
            })
            .fold(0.0, f32::max)
    }

    /// The result: the passage the query matched word for word, else the
    /// one holding most of the query's word weight (a question's answer
    /// shares its rare words), else the most relevant; with up to two more
    /// as further snippets. Where that passage asks a question and the next
    /// message answers it (the other side of the conversation), the result
    /// points at the answer, the question being its first further snippet.
    fn into_hit(
        mut self,
        standing: rank::Standing,
        query: &str,
        store: &Store,
        filters: &Filters,
    ) -> Result<SessionHit> {
        let matched = self
            .passages
            .iter()
            .position(|p| p.exact)
            .or_else(|| {
                // The first of the highest: the passages are in relevance order.
                let most = self.passages.iter().map(|p| p.coverage).fold(0.0, f32::max);
                (most > 0.0)
                    .then(|| self.passages.iter().position(|p| p.coverage == most))
                    .flatten()
            })
            .unwrap_or(0);
        let best = self.passages.remove(matched);
        let answer = match asks(&best.chunk.text) {
            true => store
                .answer_to(&best.chunk)?
                .filter(|a| !a.hidden && passes(a, filters)),
            false => None,
        };
        let mut snippets: Vec<String> = Vec::with_capacity(2);
        if answer.is_some() {
            snippets.push(snippet(&best.chunk.text, query));
        }
        snippets.extend(
            self.passages
                .iter()
                .take(2 - snippets.len())
                .map(|p| snippet(&p.chunk.text, query)),
        );
        let similarity = best.cosine();
        let chunk = answer.unwrap_or(best.chunk);
        Ok(SessionHit {
            link: format!("@session:{}/{}", chunk.profile, chunk.session_id),
            snippet: snippet(&chunk.text, query),
            session_id: chunk.session_id,
            profile: chunk.profile,
            when: rfc3339(chunk.timestamp),
            source: chunk.source,
            model: chunk.model,
            title: chunk.title,
            role: chunk.role,
            match_message_id: chunk.message_id,
            snippets,
            score: standing.fused,
            similarity,
            weak: standing.weak,
            lineage_root: chunk.lineage_root,
        })
    }
}

/// Whether a passage ends by asking something: its answer is then the
/// next message.
fn asks(text: &str) -> bool {
    text.trim_end().ends_with(['?', '？'])
}

/// Each id's first position in `list`.
fn first_positions(list: &[i64]) -> HashMap<i64, usize> {
    let mut out = HashMap::with_capacity(list.len());
    for (i, id) in list.iter().enumerate() {
        out.entry(*id).or_insert(i);
    }
    out
}

/// The cosine of each candidate lineage's best-matching title (of the
/// sessions its passages come from), where titles were embedded.
fn title_similarity(
    store: &Store,
    query: &[f32],
    sessions: &[Candidate],
) -> Result<Vec<Option<f32>>> {
    let wanted: Vec<(String, String)> = sessions
        .iter()
        .flat_map(|s| {
            s.passages
                .iter()
                .map(|p| (p.chunk.profile.clone(), p.chunk.session_id.clone()))
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let vectors = store.title_vectors(&wanted)?;
    Ok(sessions
        .iter()
        .map(|s| {
            s.passages
                .iter()
                .filter_map(|p| vectors.get(&(p.chunk.profile.clone(), p.chunk.session_id.clone())))
                .map(|v| score::dense(query, v))
                .reduce(f32::max)
        })
        .collect())
}

/// Whether each candidate's title contains the whole query (any case).
fn title_matches(query: &str, sessions: &[Candidate]) -> Vec<bool> {
    let needle = query.to_lowercase();
    sessions
        .iter()
        .map(|s| {
            s.passages.iter().any(|p| {
                p.chunk
                    .title
                    .as_ref()
                    .is_some_and(|t| t.to_lowercase().contains(&needle))
            })
        })
        .collect()
}

/// The query's vector must be of the space the index's vectors are in.
fn check_model(provider: &dyn Provider, identity: &Identity) -> Result<()> {
    let now = provider
        .identity()?
        .chunked(identity.chunk_tokens, identity.chunk_overlap);
    if !identity.accepts(&now) {
        bail!(
            "the index was built with another model, so its vectors cannot be compared with this query's:\n  {}\n\
             Search with that model (--model, --provider), or run `recall index --rebuild` with this one.",
            identity.differences(&now).join("\n  ")
        );
    }
    Ok(())
}

/// The top `n` sessions reordered by BGE-M3's ColBERT late-interaction
/// score of their best passage, which replaces their fused score.
fn rerank(
    embedder: &dyn Provider,
    query: &[Vec<f32>],
    ranked: &mut [(Candidate, rank::Standing)],
    n: usize,
) -> Result<()> {
    let n = n.min(ranked.len());
    let colbert = Outputs {
        dense: false,
        sparse: false,
        colbert: true,
    };
    let texts: Vec<&str> = ranked[..n]
        .iter()
        .map(|(s, _)| s.passages[0].chunk.text.as_str())
        .collect();
    let vectors = embedder.embed_outputs(&texts, colbert)?;
    for ((_, standing), v) in ranked[..n].iter_mut().zip(&vectors) {
        standing.fused = score::colbert(query, v.colbert.as_ref().context("no ColBERT vectors")?);
    }
    ranked[..n].sort_by(|a, b| b.1.fused.total_cmp(&a.1.fused));
    Ok(())
}

/// Recent query embeddings: an agent often asks the same thing again.
const QUERY_CACHE_SIZE: usize = 64;

type QueryKey = (String, String, Outputs);

fn embed_query(
    provider: &dyn Provider,
    query: &str,
    outputs: Outputs,
) -> Result<recall_engine::Embedding> {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    static CACHE: Mutex<VecDeque<(QueryKey, recall_engine::Embedding)>> =
        Mutex::new(VecDeque::new());
    let key: QueryKey = (
        provider.identity()?.embedding_key(),
        query.to_string(),
        outputs,
    );
    if let Some((_, hit)) = CACHE.lock().unwrap().iter().find(|(k, _)| *k == key) {
        return Ok(hit.clone());
    }
    let e = provider.embed_query(query, outputs)?;
    let mut cache = CACHE.lock().unwrap();
    if cache.len() == QUERY_CACHE_SIZE {
        cache.pop_front();
    }
    cache.push_back((key, e.clone()));
    Ok(e)
}

/// Maximal marginal relevance over results, by their best passages' words.
fn mmr(results: Vec<SessionHit>, lambda: f32, limit: usize) -> Result<Vec<SessionHit>> {
    let words = |h: &SessionHit| -> HashSet<String> {
        h.snippet
            .to_lowercase()
            .split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(String::from)
            .collect()
    };
    let sets: Vec<HashSet<String>> = results.iter().map(words).collect();
    let (lo, hi) = results.iter().fold((f32::MAX, f32::MIN), |(lo, hi), r| {
        (lo.min(r.score), hi.max(r.score))
    });
    let norm = |s: f32| if hi > lo { (s - lo) / (hi - lo) } else { 1.0 };
    let mut picked: Vec<usize> = Vec::new();
    let mut left: Vec<usize> = (0..results.len()).collect();
    while picked.len() < limit && !left.is_empty() {
        let value = |i: usize| {
            let overlap = picked
                .iter()
                .map(|&j| {
                    let inter = sets[i].intersection(&sets[j]).count() as f32;
                    let union = sets[i].union(&sets[j]).count().max(1) as f32;
                    inter / union
                })
                .fold(0.0, f32::max);
            lambda * norm(results[i].score) - (1.0 - lambda) * overlap
        };
        let (pos, _) = left
            .iter()
            .enumerate()
            .max_by(|a, b| value(*a.1).total_cmp(&value(*b.1)))
            .unwrap();
        picked.push(left.remove(pos));
    }
    let mut results: Vec<Option<SessionHit>> = results.into_iter().map(Some).collect();
    Ok(picked
        .into_iter()
        .filter_map(|i| results[i].take())
        .collect())
}

/// The passage around the first query word it contains, at most `SNIPPET_CHARS` characters.
fn snippet(text: &str, query: &str) -> String {
    let lower = text.to_lowercase();
    let at = query
        .split_whitespace()
        .filter_map(|w| lower.find(&w.to_lowercase()))
        .min()
        .filter(|_| lower.len() == text.len())
        .unwrap_or(0);
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let center = chars.iter().position(|(i, _)| *i >= at).unwrap_or(0);
    let start = center.saturating_sub(SNIPPET_CHARS / 3);
    let end = (start + SNIPPET_CHARS).min(chars.len());
    let mut out: String = chars[start..end].iter().map(|(_, c)| c).collect();
    out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    if start > 0 {
        out.insert(0, '…');
    }
    if end < chars.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_centres_on_the_match() {
        let text = format!("{} the disk is full {}", "a ".repeat(300), "b ".repeat(300));
        let s = snippet(&text, "disk");
        assert!(
            s.contains("disk is full") && s.starts_with('…') && s.ends_with('…'),
            "{s}"
        );
        assert_eq!(snippet("服务器磁盘空间不足", "磁盘"), "服务器磁盘空间不足");
    }
}
