//! Which providers may write into (and search) an index: those of its
//! vector space, and, where a provider is not the index's builder, only
//! once its vectors for a few stored passages are found to be the index's.

use std::collections::HashMap;

use anyhow::{Context, Result, bail};

use super::store::Store;
use crate::provider::{Chain, Input, Provider, SAME_SPACE_COSINE, Unavailable, Vector};
use crate::space::Identity;

/// The chain's providers that may write into an index bound to `bound`,
/// in order: those of its space (and, for recall's own engine, its very
/// model), each checked once against vectors already stored before its
/// first use. A group is embedded by the first that succeeds.
pub struct Embedders<'a> {
    chain: &'a Chain,
    bound: &'a Identity,
    /// Stored passages and their vectors, to check a provider other than the index's builder.
    sample: Vec<(String, Vec<f32>)>,
    /// Provider name → None (may write) or why it may not.
    checked: std::sync::Mutex<HashMap<String, Option<Refusal>>>,
}

/// Why a provider may not write into an index.
#[derive(Clone)]
struct Refusal {
    why: String,
    /// Another space or model: it never will (not a check that failed now).
    other_model: bool,
}

impl<'a> Embedders<'a> {
    pub fn new(chain: &'a Chain, bound: &'a Identity, store: &Store) -> Result<Self> {
        Ok(Self {
            chain,
            bound,
            sample: store.sample_vectors(3)?,
            checked: Default::default(),
        })
    }

    /// Whether the chain's local engine loads and may write into the index.
    pub(super) fn local_fits(&self) -> bool {
        self.chain
            .locals()
            .any(|p| self.may_write(p.as_ref()).is_ok() && p.model_dir().is_some())
    }

    /// Whether `p` may write into (and search) the index now; why not otherwise.
    pub fn may_write(&self, p: &dyn Provider) -> Result<(), String> {
        if let Some(verdict) = self.checked.lock().unwrap().get(p.name()) {
            return verdict.as_ref().map_or(Ok(()), |r| Err(r.why.clone()));
        }
        let identity = p
            .identity()
            .map_err(|e| format!("{e:#}"))?
            .chunked(self.bound.chunk_tokens, self.bound.chunk_overlap);
        let verdict = if !self.bound.accepts(&identity) {
            let what = if identity.space() == self.bound.space() {
                "another model of the same name".to_string()
            } else {
                format!(
                    "another vector space ({}; the index is {})",
                    identity.space(),
                    self.bound.space()
                )
            };
            Some(Refusal {
                why: format!(
                    "{what}, and vectors of two models are never mixed in one index:\n    {}",
                    self.bound.differences(&identity).join("\n    ")
                ),
                other_model: true,
            })
        } else if identity.embedding_key() != self.bound.embedding_key() {
            // Same name, same width, another provider: check that it really
            // gives the vectors the index holds. Failing to answer is not a verdict.
            match self.same_vectors(p) {
                Ok(()) => None,
                Err(NotSame::Unanswered(why)) => return Err(why),
                Err(NotSame::Different(why)) => Some(Refusal {
                    why,
                    other_model: false,
                }),
            }
        } else {
            None
        };
        // Unavailable providers are asked again next time; verdicts stay.
        self.checked
            .lock()
            .unwrap()
            .insert(p.name().to_string(), verdict.clone());
        verdict.map_or(Ok(()), |r| Err(r.why))
    }

    /// Whether `p` gives the vectors stored for the sample passages.
    fn same_vectors(&self, p: &dyn Provider) -> Result<(), NotSame> {
        if self.sample.is_empty() {
            return Ok(());
        }
        let inputs: Vec<Input> = self
            .sample
            .iter()
            .map(|(text, _)| Input { text, tokens: None })
            .collect();
        let vectors = p
            .embed(&inputs, false)
            .map_err(|e| NotSame::Unanswered(format!("{e:#}")))?;
        let mean = self
            .sample
            .iter()
            .zip(&vectors)
            .map(|((_, stored), v)| cosine(stored, &v.dense))
            .sum::<f32>()
            / self.sample.len() as f32;
        if mean.is_nan() || mean < SAME_SPACE_COSINE {
            return Err(NotSame::Different(format!(
                "its vectors are not the index's: mean cosine {mean:.3} over {} stored passages (at least {SAME_SPACE_COSINE} needed); \
                 another model behind the same name? Set its `space` in config.toml, or rebuild the index with it",
                self.sample.len()
            )));
        }
        tracing::info!(
            "{}: mean cosine {mean:.5} to the index's own vectors",
            p.name()
        );
        Ok(())
    }

    /// Embeds `inputs` with the first provider that may and can; the provider's name.
    pub fn embed(
        &self,
        inputs: &[Input],
        sparse: bool,
    ) -> Result<(Vec<Vector>, String), NotEmbedded> {
        let mut reasons = Vec::new();
        let mut rejected = false;
        for p in self.chain.providers() {
            if let Err(why) = self.may_write(p.as_ref()) {
                reasons.push((p.name().to_string(), why));
                continue;
            }
            match p.embed(inputs, sparse) {
                Ok(v)
                    if v.len() == inputs.len()
                        && v.iter().all(|v| v.dense.len() == self.bound.dimension) =>
                {
                    return Ok((v, p.name().to_string()));
                }
                Ok(_) => reasons.push((
                    p.name().into(),
                    "returned vectors of the wrong count or width".into(),
                )),
                Err(e) => {
                    tracing::warn!("{}: {e:#}", p.name());
                    rejected |= e.is_rejected();
                    reasons.push((p.name().to_string(), format!("{e:#}")));
                }
            }
        }
        let unavailable = Unavailable {
            space: Some(self.bound.space()),
            reasons,
        };
        Err(if rejected {
            NotEmbedded::Rejected(unavailable)
        } else {
            NotEmbedded::Unavailable(unavailable)
        })
    }

    /// The embedding cache namespace of provider `name`'s vectors.
    pub(super) fn namespace_of(&self, name: &str) -> String {
        self.chain
            .providers()
            .iter()
            .find(|p| p.name() == name)
            .and_then(|p| p.identity().ok())
            .map_or_else(|| self.bound.embedding_key(), |i| i.embedding_key())
    }

    /// Fails, naming each provider's difference, when no provider of the
    /// chain could ever write into this index (all of another space or model).
    pub fn refuse_if_none_fits(&self) -> Result<()> {
        // In order, stopping at the first that fits: fallbacks are asked only when needed.
        let mut reasons = Vec::new();
        for p in self.chain.providers() {
            match self.may_write(p.as_ref()) {
                Ok(()) => return Ok(()),
                Err(why) => reasons.push((p.name().to_string(), why)),
            }
        }
        if self.none_of_this_space() {
            bail!(
                "{}\nRun `recall index --rebuild` to re-embed everything with the current provider \
                 (the embedding cache keeps what was already computed for it).",
                Unavailable {
                    space: Some(self.bound.space()),
                    reasons,
                }
            );
        }
        Ok(())
    }

    /// Whether no provider of the chain could ever write into this index (all of another space).
    pub fn none_of_this_space(&self) -> bool {
        let checked = self.checked.lock().unwrap();
        self.chain.providers().iter().all(|p| {
            checked
                .get(p.name())
                .is_some_and(|v| v.as_ref().is_some_and(|r| r.other_model))
        })
    }
}

/// Why `Embedders::embed` gave nothing.
pub enum NotEmbedded {
    /// No provider could work now: pause.
    Unavailable(Unavailable),
    /// A provider refused these inputs themselves (one of them, likely):
    /// look for it, skip it, go on.
    Rejected(Unavailable),
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot = recall_engine::score::dense(a, b);
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}

/// Why a provider's vectors were not found to be the index's.
enum NotSame {
    /// It did not answer: asked again next time, no verdict.
    Unanswered(String),
    /// It answered with other vectors: a verdict that stays.
    Different(String),
}

/// Who embeds a search's query.
pub enum QueryEmbedder {
    /// The first provider of the chain that may search the index.
    Ready(std::sync::Arc<dyn Provider>),
    /// None can now (down, or not answering): search is keyword-only.
    Unavailable(Unavailable),
}

/// The first provider of `chain` that can embed queries for the index in
/// `store` (the same checks as for writing into it, see
/// `Embedders`), or why none can now. Providers that all give
/// another model's vectors are an error: a setup to fix, not an outage.
pub fn query_provider(chain: &crate::provider::Chain, store: &Store) -> Result<QueryEmbedder> {
    let identity = store
        .identity()?
        .context("the index is empty: run `recall index` first")?;
    let embedders = Embedders::new(chain, &identity, store)?;
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
    Ok(QueryEmbedder::Unavailable(Unavailable {
        space: Some(identity.space()),
        reasons,
    }))
}
