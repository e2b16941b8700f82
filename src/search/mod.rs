//! Hybrid session search over recall's index: candidate passages from dense
//! similarity (sqlite-vec KNN), keyword match (FTS5 trigram BM25, so CJK
//! text is found) and BGE-M3's sparse lexical score, gathered into sessions
//! by lineage with Hermes's rules applied, and ranked as sessions
//! (`rank.rs`): by reciprocal rank (or weighted as openClaw does), each
//! result marked weak or not.

pub mod binary;
pub mod rank;
pub mod vector;

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::embedder::{Embedder, Outputs};
use crate::index::store::Store;
use crate::provider::Provider;
use crate::score;
use crate::space::Identity;

/// Hermes caps FTS queries at this many characters.
const MAX_KEYWORD_QUERY_CHARS: usize = 2048;
/// Longest snippet, in characters.
const SNIPPET_CHARS: usize = 240;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fusion {
    /// Reciprocal rank fusion of the three signals.
    Rrf,
    /// 0.7 × dense cosine + 0.3 × keyword score, as openClaw's memorySearch.
    Weighted,
}

/// Which signals to use: all three, or one alone (for comparisons).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Signals {
    Hybrid,
    Dense,
    Keyword,
}

#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub roles: Vec<String>,
    pub sources: Vec<String>,
    /// Unix seconds.
    pub since: Option<f64>,
    pub until: Option<f64>,
    /// A session id: hits in it or in its lineage.
    pub session: Option<String>,
    /// Profiles to search; empty: all in the index.
    pub profiles: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct SearchOptions {
    pub limit: usize,
    pub fusion: Fusion,
    pub signals: Signals,
    /// Passages of a lower dense cosine, and no exact keyword match, are
    /// left out. Off by default: where that cosine lies depends on the model,
    /// and weak results are marked instead (`SessionHit::weak`).
    pub min_score: Option<f32>,
    pub filters: Filters,
    /// Re-rank the top candidates by BGE-M3's ColBERT score.
    pub rerank: bool,
    /// MMR diversity: 1.0 is pure relevance.
    pub mmr: Option<f32>,
    /// Halve a result's score every this many days of age.
    pub half_life_days: Option<f64>,
    /// How the nearest vectors are found.
    pub scan: vector::Strategy,
    /// How sessions are scored (defaults chosen on the evaluation's dev half).
    pub ranking: rank::Ranking,
}

impl Default for SearchOptions {
    fn default() -> Self {
        Self {
            limit: 5,
            fusion: Fusion::Rrf,
            signals: Signals::Hybrid,
            min_score: None,
            filters: Filters::default(),
            rerank: false,
            mmr: None,
            half_life_days: None,
            scan: vector::Strategy::Auto,
            ranking: rank::Ranking::default(),
        }
    }
}

impl SearchOptions {
    /// Refuses what cannot be meant, naming the option.
    pub fn check(&self) -> Result<()> {
        if self.limit == 0 {
            bail!("--limit must be at least 1");
        }
        if let Some(min) = self.min_score
            && !min.is_finite()
        {
            bail!("--min-score must be a number, not {min}");
        }
        if let Some(days) = self.half_life_days
            && !(days.is_finite() && days > 0.0)
        {
            bail!("--half-life must be a positive number of days, not {days}");
        }
        if let Some(lambda) = self.mmr
            && !(0.0..=1.0).contains(&lambda)
        {
            bail!("--mmr takes a λ between 0 and 1, not {lambda}");
        }
        Ok(())
    }
}

/// One session found, in the shape of Hermes's own `session_search` results.
#[derive(Debug, Clone, Serialize)]
pub struct SessionHit {
    pub session_id: String,
    /// `@session:<profile>/<id>`, which Hermes's tools open.
    pub link: String,
    pub profile: String,
    /// When the matching message was written (RFC 3339, UTC).
    pub when: String,
    pub source: String,
    pub model: Option<String>,
    pub title: Option<String>,
    pub role: String,
    pub match_message_id: i64,
    pub snippet: String,
    /// Further matching passages of the same conversation.
    pub snippets: Vec<String>,
    pub score: f32,
    /// Cosine of the query and the best passage.
    pub similarity: f32,
    /// Nothing of the query is in it word for word, and its similarity does
    /// not stand out from the rest of the index: perhaps not what was meant.
    pub weak: bool,
    pub lineage_root: String,
}

/// How a search ran: by meaning and words, or by words alone when no
/// embedding was possible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Hybrid,
    Keyword,
}

/// How the search ran.
#[derive(Debug, Clone, Serialize)]
pub struct SearchInfo {
    /// Whether the query was embedded.
    pub mode: Mode,
    pub candidates: usize,
    /// Why the query was not embedded, when a provider failed (keyword-only then).
    pub note: Option<String>,
}

type Chunk = crate::index::reads::StoredChunk;

/// Searches `store` for `query`. `provider` must give vectors of the
/// index's space (see `query_provider`); without one, the search is
/// keyword-only and says so.
pub fn search(
    store: &Store,
    provider: Option<&dyn Provider>,
    query: &str,
    options: &SearchOptions,
) -> Result<(Vec<SessionHit>, SearchInfo)> {
    let query = query.trim();
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
    let pool = (options.limit * 40).clamp(100, 1000);

    let mut note = None;
    let embedded = match provider.filter(|_| options.signals != Signals::Keyword) {
        Some(p) => {
            check_model(p, &identity)?;
            // Everything the query needs, in one pass: dense, sparse, and ColBERT for --rerank.
            let local = p.local();
            let outputs = Outputs {
                dense: true,
                sparse: identity.sparse && local.as_ref().is_some_and(|e| e.info().sparse),
                colbert: options.rerank,
            };
            match embed_query(p, query, outputs) {
                Ok(e) => Some(e),
                // Exact words still find something: better than nothing, and said.
                Err(e) if options.signals == Signals::Hybrid && !options.rerank => {
                    note = Some(format!("{}: {e:#}", p.name()));
                    None
                }
                Err(e) => return Err(e),
            }
        }
        None => None,
    };
    let dense_query = embedded.as_ref().and_then(|e| e.dense.as_ref());

    // Candidate passages from each signal.
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
        .as_ref()
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

    // Sessions, not fragments: the candidates of each lineage together.
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
            chunk,
        });
    }
    for s in &mut sessions {
        s.passages.sort_by(|a, b| {
            b.similarity
                .total_cmp(&a.similarity)
                .then(a.chunk.id.cmp(&b.chunk.id))
        });
    }
    let titles = match dense_query {
        Some(dense) => title_similarity(store, dense, &sessions)?,
        None => vec![None; sessions.len()],
    };
    let title_match = title_matches(query, &sessions);
    let evidence: Vec<rank::Evidence> = sessions
        .iter()
        .zip(&titles)
        .zip(&title_match)
        .map(|((s, title), title_match)| rank::Evidence {
            passages: match dense_query {
                Some(_) => s.passages.iter().map(|p| p.similarity).collect(),
                None => Vec::new(),
            },
            title: *title,
            keyword_rank: s.passages.iter().filter_map(|p| p.keyword_rank).min(),
            keyword_score: s
                .passages
                .iter()
                .filter_map(|p| keyword.score.get(&p.chunk.id).copied())
                .reduce(f32::max),
            sparse_rank: s.passages.iter().filter_map(|p| p.sparse_rank).min(),
            keyword_match: *title_match || s.passages.iter().any(|p| p.exact),
            cron: s.passages[0].chunk.source == "cron",
        })
        .collect();
    let spread = match dense_query {
        Some(dense) => {
            let sample = vector::sample_similarities(store, dense, identity.normalized)?;
            let ids: Vec<Vec<i64>> = sessions
                .iter()
                .map(|s| s.passages.iter().map(|p| p.chunk.id).collect())
                .collect();
            rank::Spread::of(&sample, &evidence, &ids, floor, &options.ranking)
        }
        None => None,
    };
    let standings = rank::standings(&evidence, floor, spread, options.fusion, &options.ranking);

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
    if options.rerank {
        let embedder = provider
            .and_then(|p| p.local())
            .context("--rerank needs recall's own model (ColBERT vectors)")?;
        let q = embedded
            .as_ref()
            .and_then(|e| e.colbert.as_ref())
            .context("--rerank needs the model's ColBERT vectors")?;
        rerank(embedder, q, &mut ranked, options.limit * 4)?;
    }
    let mut results: Vec<SessionHit> = ranked
        .into_iter()
        .map(|(s, standing)| s.into_hit(standing, query))
        .collect();
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

/// A passage of a candidate session, with what each signal said of it.
struct Passage {
    chunk: Chunk,
    /// Cosine with the query (NaN without a query vector).
    similarity: f32,
    keyword_rank: Option<usize>,
    sparse_rank: Option<usize>,
    /// The query is in it word for word (as a phrase, or all its words).
    exact: bool,
}

/// The candidate passages of one lineage, best first.
#[derive(Default)]
struct Candidate {
    passages: Vec<Passage>,
}

impl Candidate {
    /// The result: the passage the query matched word for word, else the
    /// most similar, with up to two more as further snippets.
    fn into_hit(mut self, standing: rank::Standing, query: &str) -> SessionHit {
        let matched = self
            .passages
            .iter()
            .position(|p| p.exact)
            .or_else(|| {
                self.passages
                    .iter()
                    .position(|p| p.similarity.is_nan() && p.keyword_rank.is_some())
            })
            .unwrap_or(0);
        let best = self.passages.remove(matched);
        let snippets = self
            .passages
            .iter()
            .take(2)
            .map(|p| snippet(&p.chunk.text, query))
            .collect();
        let chunk = best.chunk;
        SessionHit {
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
            similarity: if best.similarity.is_nan() {
                0.0
            } else {
                best.similarity
            },
            weak: standing.weak,
            lineage_root: chunk.lineage_root,
        }
    }
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

/// Who embeds a search's query.
pub enum QueryEmbedder {
    /// The first provider of the chain that may search the index.
    Ready(std::sync::Arc<dyn Provider>),
    /// None can now (down, or not answering): search is keyword-only.
    Unavailable(crate::provider::Unavailable),
}

/// The first provider of `chain` that can embed queries for the index in
/// `store` (the same checks as for writing into it, see
/// `index::Embedders`), or why none can now. Providers that all give
/// another model's vectors are an error: a setup to fix, not an outage.
pub fn query_provider(chain: &crate::provider::Chain, store: &Store) -> Result<QueryEmbedder> {
    let identity = store
        .identity()?
        .context("the index is empty: run `recall index` first")?;
    let embedders = crate::index::Embedders::new(chain, &identity, store)?;
    let mut reasons = Vec::new();
    for p in chain.providers() {
        match embedders.may_write(p.as_ref()) {
            Ok(()) => return Ok(QueryEmbedder::Ready(p.clone())),
            Err(why) => reasons.push((p.name().to_string(), why)),
        }
    }
    // Every provider answered, with another model: a setup to fix, not an outage.
    if embedders.none_of_this_space() {
        bail!(
            "the index was built with another model, so its vectors cannot be compared with this query's:\n  {}\n\
             Search with that model (--model, --provider), or run `recall index --rebuild` with this one.",
            reasons
                .iter()
                .map(|(name, why)| format!("{name}: {why}"))
                .collect::<Vec<_>>()
                .join("\n  ")
        );
    }
    Ok(QueryEmbedder::Unavailable(crate::provider::Unavailable {
        space: Some(identity.space()),
        reasons,
    }))
}

fn dense_candidates(
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
fn l2_to_similarity(distance: f32, normalized: bool) -> f32 {
    if normalized {
        1.0 - distance * distance / 2.0
    } else {
        -distance
    }
}

/// The cosine of passages that the vector search did not return.
fn exact_similarity(
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
struct Keyword {
    ranked: Vec<i64>,
    rank: HashMap<i64, usize>,
    /// BM25 mapped to (0, 1), for weighted fusion.
    score: HashMap<i64, f32>,
    /// Holds the whole query as a phrase.
    exact: HashSet<i64>,
    /// Holds every word of the query.
    all_words: HashSet<i64>,
}

/// Keyword hits: the whole query as an exact phrase first (identifiers such
/// as `nginx -t`), then all its words. Words are quoted, so FTS5 syntax in
/// the query (`"`, `*`, `NEAR`, `:`) is only text. The trigram tokenizer
/// needs three characters; shorter queries use a substring scan.
fn keyword_candidates(store: &Store, query: &str, k: usize) -> Result<Keyword> {
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
fn title_candidates(store: &Store, query: &str, k: usize) -> Result<Vec<i64>> {
    store.title_matches(query, k)
}

fn sparse_candidates(store: &Store, query: &BTreeMap<u32, f32>, k: usize) -> Result<Vec<i64>> {
    store.sparse_matches(query, k)
}

fn load_chunks(store: &Store, ids: &[i64]) -> Result<HashMap<i64, Chunk>> {
    let mut out = HashMap::with_capacity(ids.len());
    for &id in ids {
        // A passage deleted by an indexer running beside us is skipped.
        if let Some(c) = store.stored_chunk(id)? {
            out.insert(id, c);
        }
    }
    Ok(out)
}

fn passes(c: &Chunk, f: &Filters) -> bool {
    (f.roles.is_empty() || f.roles.contains(&c.role))
        && (f.sources.is_empty() || f.sources.contains(&c.source))
        && f.since.is_none_or(|t| c.timestamp >= t)
        && f.until.is_none_or(|t| c.timestamp <= t)
        && f.session
            .as_ref()
            .is_none_or(|s| *s == c.session_id || *s == c.lineage_root)
        && (f.profiles.is_empty() || f.profiles.contains(&c.profile))
}

/// The top `n` sessions reordered by BGE-M3's ColBERT late-interaction
/// score of their best passage, which replaces their fused score.
fn rerank(
    embedder: &Embedder,
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
    let vectors = embedder.embed(&texts, colbert)?;
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
) -> Result<crate::embedder::Embedding> {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    static CACHE: Mutex<VecDeque<(QueryKey, crate::embedder::Embedding)>> =
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

/// Unix seconds as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: f64) -> String {
    let t = jiff::Timestamp::from_second(t.max(0.0) as i64).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// A time as people type it, to Unix seconds: `YYYY-MM-DD` (midnight UTC),
/// `YYYY-MM-DDTHH:MM[:SS]` or with a space (UTC), an RFC 3339 time with an
/// offset (`2026-03-01T10:15:00+02:00`, `…Z`), Unix seconds, or a time ago:
/// `7d`, `12h`, `2 weeks`, `3 days ago`, `yesterday`, `today`, `now` (days
/// from midnight UTC). Impossible dates (`2026-02-31`, hour 25) are refused.
pub fn parse_time(s: &str) -> Result<f64> {
    use jiff::{Span, Timestamp, civil, tz::TimeZone};
    let text = s.trim();
    let now = Timestamp::now().to_zoned(TimeZone::UTC);
    let midnight = |days_back: i64| -> Result<f64> {
        let day = now.date().checked_sub(Span::new().days(days_back))?;
        Ok(day.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64)
    };
    let lower = text.to_ascii_lowercase();
    match lower.as_str() {
        "now" => return Ok(now.timestamp().as_second() as f64),
        "today" => return midnight(0),
        "yesterday" => return midnight(1),
        _ => {}
    }
    if let Ok(t) = text.parse::<f64>()
        && t.is_finite()
    {
        return Ok(t);
    }
    if let Ok(t) = text.parse::<Timestamp>() {
        return Ok(t.as_second() as f64);
    }
    if let Ok(t) = text.parse::<civil::DateTime>() {
        return Ok(t.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64);
    }
    if let Ok(d) = text.parse::<civil::Date>() {
        return Ok(d.to_zoned(TimeZone::UTC)?.timestamp().as_second() as f64);
    }
    let ago = lower.strip_suffix("ago").unwrap_or(&lower).trim();
    if let Ok(span) = ago.parse::<Span>()
        && !span.is_negative()
    {
        return Ok(now.checked_sub(span)?.timestamp().as_second() as f64);
    }
    // A date of the right shape that is not in the calendar: say so.
    if let Err(e) = text
        .get(..10)
        .filter(|d| d.len() == 10 && d.as_bytes()[4] == b'-')
        .map_or(Ok(civil::Date::MIN), str::parse::<civil::Date>)
    {
        bail!("{s:?} is not a date: {e}");
    }
    bail!(
        "{s:?} is not a time: use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] (UTC), an RFC 3339 time with \
         an offset (2026-03-01T10:15:00+02:00), Unix seconds, or a time ago (7d, 12h, 2 weeks, \
         yesterday, today)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_round_trip() {
        let t = parse_time("2026-03-01T10:15:00").unwrap();
        assert_eq!(rfc3339(t), "2026-03-01T10:15:00Z");
        assert_eq!(parse_time("2026-03-01 10:15").unwrap(), t);
        assert_eq!(parse_time("2026-03-01T12:15:00+02:00").unwrap(), t);
        assert_eq!(parse_time("2026-03-01T10:15:00Z").unwrap(), t);
        assert_eq!(parse_time("1970-01-02").unwrap(), 86_400.0);
        assert_eq!(parse_time("1772360100").unwrap(), 1_772_360_100.0);
        for impossible in [
            "2026-02-31",
            "2026-13-01",
            "2026-03-01T99:00",
            "2026-03-01T10:61",
        ] {
            let err = parse_time(impossible).unwrap_err().to_string();
            assert!(err.contains(impossible), "{impossible}: {err}");
        }
        for nonsense in ["soon", "", "7 parsecs", "-3d"] {
            assert!(parse_time(nonsense).is_err(), "{nonsense:?}");
        }
    }

    #[test]
    fn times_ago_count_back_from_now() {
        let now = crate::index::unix_now();
        let close = |s: &str, seconds_ago: f64| {
            let t = parse_time(s).unwrap();
            assert!(
                (now - seconds_ago - t).abs() < 5.0,
                "{s}: {t} vs {}",
                now - seconds_ago
            );
        };
        close("now", 0.0);
        close("7d", 7.0 * 86_400.0);
        close("12h", 12.0 * 3600.0);
        close("3 days ago", 3.0 * 86_400.0);
        close("2 weeks", 14.0 * 86_400.0);
        let today = parse_time("today").unwrap();
        assert!(now - today < 86_400.0 && today % 86_400.0 == 0.0);
        assert_eq!(parse_time("yesterday").unwrap(), today - 86_400.0);
    }

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

    #[test]
    fn bm25_scores_are_monotone() {
        assert!(bm25_to_score(-5.0) > bm25_to_score(-1.0));
        assert!(bm25_to_score(-1.0) > 0.0 && bm25_to_score(-1.0) < 1.0);
    }
}
