//! What a search is asked (`SearchOptions`, `Filters`, the signals and the
//! fusion) and what it answers (`SessionHit`, `SearchInfo`).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::{rank, vector};

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

/// The most results one search returns: more sessions than a reader or an
/// agent looks at, and a bound on the candidate pool it sizes.
pub const MAX_LIMIT: usize = 1000;

impl SearchOptions {
    /// Refuses what cannot be meant, naming the option.
    pub fn check(&self) -> Result<()> {
        if !(1..=MAX_LIMIT).contains(&self.limit) {
            bail!("--limit must be from 1 to {MAX_LIMIT}, not {}", self.limit);
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
    /// The message that matched: the passage holding most of the query's
    /// words (or the most relevant), or the next turn where that passage
    /// asks a question.
    pub match_message_id: i64,
    pub snippet: String,
    /// Further matching passages of the same conversation.
    pub snippets: Vec<String>,
    pub score: f32,
    /// Cosine of the query and the best passage.
    pub similarity: f32,
    /// Nothing of the query is in it word for word, none of its passages
    /// holds most of the weight of the query's words, and its similarity
    /// does not stand out from the rest of the index: perhaps not what was
    /// meant.
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
