//! Session-level ranking: what each candidate session's passages, title and
//! keyword hits say, turned into one order and a weak/strong verdict.
//!
//! A passage's relevance is its cosine with the query plus the BM25 of the
//! query's words in it (as a share of this query's best BM25): a question
//! shares its distinctive words (names, places, things) with the turn that
//! answers it, and a paraphrase shares its meaning. A session is scored as a
//! whole, not by one fragment: its best passage, its second best, and its
//! title each count. That order and the orders of exact keyword hits
//! (phrases, identifiers) and BGE-M3's sparse weights are then fused by
//! reciprocal rank, which needs no common scale between them.
//!
//! A result is not weak when the query matched it word for word, when one of
//! its passages holds most of the weight of the query's words (IDF: the rare
//! words count), when one shares some of the query's words and is far more
//! similar to it than the index's typical passage is, when the session
//! holds most of the words over its turns and comes nearer than typical, or when its
//! similarity stands out from this query's own spread of similarities over
//! the index. Similarity is always judged against the index's own, never
//! against an absolute cosine: models differ in where unrelated texts sit
//! (MiniLM near 0, BGE-M3 near 0.4).
//!
//! Every constant of `Ranking::default()` was chosen on the dev halves of the
//! evaluations (the technical histories of `tests/hermes/eval/` and the
//! LoCoMo conversations of `scripts/eval_locomo.py`) and only scored on
//! their test halves (docs/search.md, "Search quality").

use super::Fusion;

/// How sessions are scored.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ranking {
    /// Weight of a session's second-best passage beside its best (1).
    pub second_passage: f32,
    /// Weight of a passage's BM25 over the query's words, as a share of the
    /// query's best, beside its cosine (1).
    pub words: f32,
    /// Weight of a session's BM25 over the query's words (the session as
    /// one document), as a share of the query's best.
    pub session_words: f32,
    /// The words weigh fully while the query's best session by meaning
    /// stands fewer than this many standard deviations above the crowd (as
    /// `weak_below` measures it): meaning alone does not single out a
    /// session, as in months of everyday talk about one life...
    pub words_full_below: f32,
    /// ...and not at all from this many on, linearly between: meaning has
    /// found it, and words shared with unrelated sessions only add noise.
    pub words_none_above: f32,
    /// A result is not weak when one of its passages holds at least this
    /// share of the IDF weight of the query's words.
    pub covered: f32,
    /// Nor when one of its passages holds at least this share of it (a
    /// word the question shares with its answer)...
    pub shares_words: f32,
    /// ...and its similarity has covered at least this share of the way from
    /// the index's typical similarity to the query (the median) to 1: the
    /// turn that answers a question rarely repeats most of its words, but it
    /// shares one and means much the same.
    pub similar: f32,
    /// Nor when the session as a whole holds at least this share of the
    /// query's word weight (a question's words spread over the turns of the
    /// conversation it asks about)...
    pub session_covered: f32,
    /// ...and its best passage has come at least this share of the way from
    /// the typical similarity to 1.
    pub session_similar: f32,
    /// Weight of the similarity of the session's title.
    pub title: f32,
    /// Reciprocal rank fusion's constant, over session ranks.
    pub rrf_k: f32,
    /// Weight of the keyword order (the dense order weighs 1).
    pub keyword: f32,
    /// Weight of BGE-M3's sparse order.
    pub sparse: f32,
    /// A scheduled-job (`cron`) session's fused score is multiplied by this:
    /// below an interactive one of the same evidence, never out of reach.
    pub cron: f32,
    /// A result without a keyword match is weak when its dense score stands
    /// fewer than this many standard deviations above the crowd (the
    /// sessions ranked 6 to 15): the deviation of the query's similarity to
    /// the index's passages, those of its three best sessions left out.
    pub weak_below: f32,
}

impl Default for Ranking {
    fn default() -> Self {
        Self {
            second_passage: 0.3,
            words: 0.5,
            session_words: 1.0,
            words_full_below: 1.5,
            words_none_above: 3.5,
            covered: 0.55,
            shares_words: 0.05,
            similar: 0.4,
            session_covered: 0.5,
            session_similar: 0.2,
            title: 0.3,
            rrf_k: 10.0,
            keyword: 1.0,
            sparse: 0.5,
            cron: 0.95,
            weak_below: 6.5,
        }
    }
}

/// What the search found for one candidate session (a lineage).
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// Dense cosines of its candidate passages, best first; empty without a query vector.
    pub passages: Vec<f32>,
    /// Each candidate passage's cosine (0 without a query vector) and its
    /// BM25 over the query's words as a share of the query's best (0
    /// without them), in any order.
    pub matches: Vec<(f32, f32)>,
    /// The largest share of the query's word weight one of its passages holds.
    pub coverage: f32,
    /// Each candidate passage's share of the query's word weight and its
    /// cosine (both known), in any order.
    pub covered_cosines: Vec<(f32, f32)>,
    /// Its BM25 over the query's words as one document, as a share of the
    /// query's best session (0 without them).
    pub session_words: f32,
    /// Its share of the query's word weight as one document.
    pub session_coverage: f32,
    /// Cosine of its title (the best of its lineage's), when embedded.
    pub title: Option<f32>,
    /// Position of its best passage in the keyword list (exact phrase hits first).
    pub keyword_rank: Option<usize>,
    /// Its best passage's BM25 score mapped to (0, 1).
    pub keyword_score: Option<f32>,
    /// Position of its best passage in the sparse list.
    pub sparse_rank: Option<usize>,
    /// The query matched it word for word: as a phrase, every one of its words, or its title.
    pub keyword_match: bool,
    pub cron: bool,
}

/// One session's standing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    pub fused: f32,
    /// The session's dense score (best passage, second, title), when the query was embedded.
    pub dense: Option<f32>,
    pub weak: bool,
}

/// How the query's similarities spread over the rest of the index.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub std: f32,
    /// The median: how similar a passage of the index typically is.
    pub typical: f32,
}

/// Sessions whose passages are left out of the spread: they may be about
/// the query, and in a small history they would widen it.
const LEADERS: usize = 3;
/// Fewest passages a spread is measured on.
const MIN_SAMPLE: usize = 8;

impl Spread {
    /// The standard deviation of `sample` (chunk id, similarity) without
    /// the passages of the `LEADERS` best sessions by dense score
    /// (`passage_ids` per session, as `evidence`), as many of them as leave
    /// `MIN_SAMPLE` passages; None for a smaller sample.
    pub fn of(
        sample: &[(i64, f32)],
        evidence: &[Evidence],
        passage_ids: &[Vec<i64>],
        floor: f32,
        r: &Ranking,
    ) -> Option<Spread> {
        let dense = dense_scores(evidence, floor, r);
        let mut order: Vec<usize> = (0..evidence.len())
            .filter(|i| dense[*i].is_some())
            .collect();
        order.sort_by(|a, b| dense[*b].unwrap().total_cmp(&dense[*a].unwrap()));
        // Leaders are left out one by one while 8 passages remain.
        let mut rest: Vec<(i64, f32)> = sample.to_vec();
        for i in order.iter().take(LEADERS) {
            let ids: std::collections::HashSet<i64> = passage_ids[*i].iter().copied().collect();
            let fewer: Vec<(i64, f32)> = rest
                .iter()
                .copied()
                .filter(|(id, _)| !ids.contains(id))
                .collect();
            if fewer.len() < MIN_SAMPLE {
                break;
            }
            rest = fewer;
        }
        if rest.len() < MIN_SAMPLE {
            return None;
        }
        let mut rest: Vec<f32> = rest.into_iter().map(|(_, s)| s).collect();
        let mean = rest.iter().sum::<f32>() / rest.len() as f32;
        let var = rest.iter().map(|s| (s - mean) * (s - mean)).sum::<f32>() / rest.len() as f32;
        rest.sort_by(f32::total_cmp);
        Some(Spread {
            std: var.sqrt(),
            typical: rest[rest.len() / 2],
        })
    }
}

/// Each session's dense score: best passage, second best (at most `floor`
/// when outside the candidate pool), title (the best passage's when none).
fn dense_scores(evidence: &[Evidence], floor: f32, r: &Ranking) -> Vec<Option<f32>> {
    evidence
        .iter()
        .map(|e| session_score(&e.passages, e.title, floor, r))
        .collect()
}

/// Each session's relevance: the dense score's shape over its passages'
/// relevance (cosine and, weighted by `words`, their words), plus its words
/// as one document; None for a session with neither.
fn relevance_scores(
    evidence: &[Evidence],
    floor: f32,
    words: f32,
    r: &Ranking,
) -> Vec<Option<f32>> {
    evidence
        .iter()
        .map(|e| {
            if e.passages.is_empty() && e.matches.iter().all(|m| m.1 == 0.0) {
                return None;
            }
            // Without words' matches, the cosines alone.
            let mut relevance: Vec<f32> = if e.matches.is_empty() {
                e.passages.clone()
            } else {
                e.matches
                    .iter()
                    .map(|(cosine, w)| cosine + words * r.words * w)
                    .collect()
            };
            relevance.sort_by(|a, b| b.total_cmp(a));
            let passages = session_score(&relevance, e.title, floor, r)?;
            Some(passages + words * r.session_words * e.session_words)
        })
        .collect()
}

/// How much the query's words count, from 1 (meaning singles out nothing)
/// to 0 (meaning has found the session): `Ranking::words_full_below`. In
/// full where there is no spread to judge by.
fn words_weight(
    dense: &[Option<f32>],
    crowd: Option<f32>,
    spread: Option<Spread>,
    r: &Ranking,
) -> f32 {
    let best = dense.iter().flatten().copied().reduce(f32::max);
    match (best, crowd, spread) {
        (Some(best), Some(crowd), Some(spread)) => {
            let standout = (best - crowd) / spread.std.max(f32::MIN_POSITIVE);
            let span = (r.words_none_above - r.words_full_below).max(f32::MIN_POSITIVE);
            ((r.words_none_above - standout) / span).clamp(0.0, 1.0)
        }
        _ => 1.0,
    }
}

/// Best passage, second best (at most `floor` when outside the candidate
/// pool), title (the best passage's when none).
fn session_score(best_first: &[f32], title: Option<f32>, floor: f32, r: &Ranking) -> Option<f32> {
    let best = *best_first.first()?;
    let second = best_first.get(1).copied().unwrap_or(best.min(floor));
    Some(best + r.second_passage * second + r.title * title.unwrap_or(best))
}

/// Sessions ranked this far down (0-based, end excluded) make the crowd a
/// strong result must stand out from.
const CROWD: std::ops::Range<usize> = 5..15;

/// Scores each session of `evidence`. `floor` is the lowest cosine the
/// dense candidate pool admitted: a passage outside it scores at most that.
pub fn standings(
    evidence: &[Evidence],
    floor: f32,
    spread: Option<Spread>,
    fusion: Fusion,
    r: &Ranking,
) -> Vec<Standing> {
    let dense = dense_scores(evidence, floor, r);
    let crowd = crowd(&dense);
    let words = words_weight(&dense, crowd, spread, r);
    let relevance = relevance_scores(evidence, floor, words, r);
    let dense_rank = ranks(&relevance, |a, b| b.total_cmp(a));
    let keyword_rank = ranks(
        &evidence.iter().map(|e| e.keyword_rank).collect::<Vec<_>>(),
        |a, b| a.cmp(b),
    );
    let sparse_rank = ranks(
        &evidence.iter().map(|e| e.sparse_rank).collect::<Vec<_>>(),
        |a, b| a.cmp(b),
    );
    evidence
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let rrf = |rank: Option<usize>, weight: f32| {
                rank.map_or(0.0, |rank| weight / (r.rrf_k + rank as f32 + 1.0))
            };
            let mut fused = match fusion {
                Fusion::Rrf => {
                    rrf(dense_rank[i], 1.0)
                        + rrf(keyword_rank[i], r.keyword)
                        + rrf(sparse_rank[i], r.sparse)
                }
                // openClaw's memorySearch: 0.7 × vector similarity + 0.3 × text score.
                Fusion::Weighted => {
                    0.7 * e.passages.first().copied().unwrap_or(0.0)
                        + 0.3 * e.keyword_score.unwrap_or(0.0)
                }
            };
            if e.cron {
                fused *= r.cron;
            }
            let answers = spread.is_some_and(|s| {
                // How far `cosine` has come from the typical similarity to 1.
                let towards_one =
                    |cosine: f32| (cosine - s.typical) / (1.0 - s.typical).max(f32::MIN_POSITIVE);
                e.covered_cosines.iter().any(|&(coverage, cosine)| {
                    coverage >= r.shares_words && towards_one(cosine) >= r.similar
                }) || (e.session_coverage >= r.session_covered
                    && e.passages
                        .first()
                        .is_some_and(|&best| towards_one(best) >= r.session_similar))
            });
            let weak = match (dense[i], crowd, spread) {
                _ if e.keyword_match => false,
                _ if e.coverage >= r.covered => false,
                _ if answers => false,
                (Some(d), Some(crowd), Some(spread)) => {
                    (d - crowd) / spread.std.max(f32::MIN_POSITIVE) < r.weak_below
                }
                _ => false,
            };
            Standing {
                fused,
                dense: dense[i],
                weak,
            }
        })
        .collect()
}

/// Each item's position among the `Some` values ordered by `order`; equal
/// values share the first one's position.
fn ranks<T: Copy>(
    values: &[Option<T>],
    order: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Vec<Option<usize>> {
    let mut present: Vec<(usize, T)> = values
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, v)))
        .collect();
    present.sort_by(|a, b| order(&a.1, &b.1).then(a.0.cmp(&b.0)));
    let mut out = vec![None; values.len()];
    let mut shared = 0;
    for (rank, (i, v)) in present.iter().enumerate() {
        if rank > 0 && order(&present[rank - 1].1, v).is_ne() {
            shared = rank;
        }
        out[*i] = Some(shared);
    }
    out
}

/// The mean dense score of the sessions ranked in `CROWD`, or the lowest
/// one's when there are fewer (a result must then stand out from all the others).
fn crowd(dense: &[Option<f32>]) -> Option<f32> {
    let mut scores: Vec<f32> = dense.iter().flatten().copied().collect();
    scores.sort_by(|a, b| b.total_cmp(a));
    if scores.len() <= CROWD.start {
        return scores.last().copied();
    }
    let crowd = &scores[CROWD.start..CROWD.end.min(scores.len())];
    Some(crowd.iter().sum::<f32>() / crowd.len() as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense_only(best: f32) -> Evidence {
        Evidence {
            passages: vec![best],
            ..Default::default()
        }
    }

    /// `standings` with the defaults, by reciprocal rank.
    fn rrf(evidence: &[Evidence], floor: f32, std: Option<f32>) -> Vec<Standing> {
        let spread = std.map(|std| Spread { std, typical: 0.0 });
        standings(evidence, floor, spread, Fusion::Rrf, &Ranking::default())
    }

    #[test]
    fn a_second_passage_and_the_title_lift_a_session() {
        let mut lone = dense_only(0.60);
        lone.title = Some(0.1);
        let mut whole = dense_only(0.58);
        whole.passages.push(0.55);
        whole.title = Some(0.5);
        let s = rrf(&[lone, whole], 0.2, None);
        assert!(s[1].fused > s[0].fused, "{s:?}");
    }

    #[test]
    fn keyword_hits_reach_the_top_and_are_never_weak() {
        let mut evidence: Vec<Evidence> =
            (0..20).map(|i| dense_only(0.5 - i as f32 * 0.01)).collect();
        evidence[19].keyword_rank = Some(0);
        evidence[19].keyword_match = true;
        let s = rrf(&evidence, 0.1, Some(0.05));
        let best = (0..20)
            .max_by(|a, b| s[*a].fused.total_cmp(&s[*b].fused))
            .unwrap();
        assert_eq!(best, 19);
        assert!(!s[19].weak);
    }

    #[test]
    fn weak_is_relative_to_the_query_spread_not_to_a_cosine() {
        // The same shape of scores at two cosine levels (MiniLM-like, BGE-M3-like).
        for base in [0.05, 0.45] {
            let mut flat: Vec<Evidence> = (0..20)
                .map(|i| dense_only(base + 0.2 - i as f32 * 0.002))
                .collect();
            let s = rrf(&flat, base, Some(0.04));
            assert!(
                s.iter().all(|s| s.weak),
                "nothing stands out at {base}: {s:?}"
            );
            flat[0].passages = vec![base + 0.5];
            let s = rrf(&flat, base, Some(0.04));
            assert!(!s[0].weak && s[1].weak, "one stands out at {base}: {s:?}");
        }
    }

    #[test]
    fn with_few_sessions_the_crowd_is_the_last() {
        for n in 1..8 {
            let evidence: Vec<Evidence> =
                (0..n).map(|i| dense_only(0.3 - i as f32 * 0.001)).collect();
            let s = rrf(&evidence, 0.0, Some(0.05));
            assert!(
                s.iter().all(|s| s.weak),
                "{n} sessions of the same score: {s:?}"
            );
        }
    }

    #[test]
    fn the_spread_leaves_the_best_sessions_out_while_it_can() {
        let evidence: Vec<Evidence> = [0.9, 0.5, 0.4, 0.1]
            .iter()
            .map(|s| dense_only(*s))
            .collect();
        let ids: Vec<Vec<i64>> = (0..4).map(|i| vec![i]).collect();
        // Eight unrelated passages (ids 10..) and the four sessions' own.
        let mut sample: Vec<(i64, f32)> = (10..18)
            .map(|i| (i, if i % 2 == 0 { 0.0 } else { 0.2 }))
            .collect();
        sample.extend([(0, 0.9), (1, 0.5), (2, 0.4), (3, 0.1)]);
        let spread = Spread::of(&sample, &evidence, &ids, 0.0, &Ranking::default()).unwrap();
        // Without sessions 0-2: the eight and session 3's passage.
        let rest = [0.0, 0.2, 0.0, 0.2, 0.0, 0.2, 0.0, 0.2, 0.1];
        let mean = rest.iter().sum::<f32>() / 9.0;
        let std = (rest.iter().map(|s| (s - mean) * (s - mean)).sum::<f32>() / 9.0).sqrt();
        assert!((spread.std - std).abs() < 1e-6, "{spread:?} vs {std}");
        // With only eight passages in all, nobody is left out.
        let small = &sample[4..];
        assert!(Spread::of(small, &evidence, &ids, 0.0, &Ranking::default()).is_some());
        assert!(Spread::of(&sample[5..], &evidence, &ids, 0.0, &Ranking::default()).is_none());
    }

    #[test]
    fn cron_is_demoted_softly() {
        let mut job = dense_only(0.7);
        job.cron = true;
        let chat = dense_only(0.3);
        let s = rrf(&[job.clone(), chat], 0.1, None);
        assert!(
            s[0].fused > s[1].fused,
            "a clearly better cron session still wins"
        );
        let s = rrf(&[job, dense_only(0.7)], 0.1, None);
        assert!(
            s[1].fused >= s[0].fused,
            "a tie goes to the interactive session"
        );
    }

    #[test]
    fn words_decide_only_where_meaning_does_not_stand_out() {
        // Twenty sessions close to the query by meaning; the last holds its words.
        let mut evidence: Vec<Evidence> = (0..20)
            .map(|i| {
                let mut e = dense_only(0.30 - i as f32 * 0.001);
                e.matches = vec![(e.passages[0], 0.0)];
                e
            })
            .collect();
        evidence[19].matches = vec![(evidence[19].passages[0], 1.0)];
        evidence[19].session_words = 1.0;
        let best = |s: &[Standing]| {
            (0..s.len())
                .max_by(|a, b| s[*a].fused.total_cmp(&s[*b].fused))
                .unwrap()
        };
        let flat = rrf(&evidence, 0.2, Some(0.05));
        assert_eq!(best(&flat), 19, "{flat:?}");
        // The first stands far out by meaning: the words no longer move it.
        evidence[0].passages = vec![0.9];
        evidence[0].matches = vec![(0.9, 0.0)];
        let clear = rrf(&evidence, 0.2, Some(0.05));
        assert_eq!(best(&clear), 0, "{clear:?}");
    }

    #[test]
    fn most_of_the_query_words_make_a_result_strong() {
        let mut evidence: Vec<Evidence> = (0..20)
            .map(|i| dense_only(0.3 - i as f32 * 0.001))
            .collect();
        evidence[7].coverage = Ranking::default().covered;
        let s = rrf(&evidence, 0.2, Some(0.05));
        assert!(!s[7].weak && s[6].weak && s[8].weak, "{s:?}");
    }

    #[test]
    fn a_shared_word_and_a_similarity_far_above_the_typical_make_a_result_strong() {
        let r = Ranking::default();
        // Passages typically sit at 0.2; 0.2 + 0.8 × similar is the cut.
        let spread = Some(Spread {
            std: 0.05,
            typical: 0.2,
        });
        let cut = 0.2 + 0.8 * r.similar;
        let mut evidence: Vec<Evidence> = (0..20)
            .map(|i| dense_only(0.3 - i as f32 * 0.001))
            .collect();
        // Shares a word, well above the typical similarity: strong.
        evidence[3].covered_cosines = vec![(r.shares_words, cut + 0.01)];
        // As similar, but no word shared: weak.
        evidence[4].covered_cosines = vec![(0.0, cut + 0.01)];
        // A word shared, but hardly more similar than usual: weak.
        evidence[5].covered_cosines = vec![(0.5, cut - 0.01)];
        let s = standings(&evidence, 0.2, spread, Fusion::Rrf, &r);
        assert!(!s[3].weak && s[4].weak && s[5].weak, "{s:?}");
        // Judged against the index's own typical similarity, not a cosine.
        let higher = Some(Spread {
            std: 0.05,
            typical: 0.5,
        });
        let s = standings(&evidence, 0.2, higher, Fusion::Rrf, &r);
        assert!(s[3].weak, "{s:?}");
    }

    #[test]
    fn a_session_holding_the_question_words_and_near_it_is_strong() {
        let r = Ranking::default();
        let spread = Some(Spread {
            std: 0.05,
            typical: 0.2,
        });
        let near = 0.2 + 0.8 * r.session_similar + 0.01;
        let mut evidence: Vec<Evidence> = (0..20)
            .map(|i| dense_only(0.15 - i as f32 * 0.001))
            .collect();
        // Most of the question's words over its turns, its best passage near: strong.
        evidence[2].passages = vec![near];
        evidence[2].session_coverage = r.session_covered;
        // As near, but fewer of the words: weak.
        evidence[3].passages = vec![near];
        evidence[3].session_coverage = r.session_covered - 0.01;
        // The words, but nothing near the question: weak.
        evidence[4].passages = vec![near - 0.02];
        evidence[4].session_coverage = 0.9;
        let s = standings(&evidence, 0.1, spread, Fusion::Rrf, &r);
        assert!(!s[2].weak && s[3].weak && s[4].weak, "{s:?}");
    }
}
