//! Where vectors come from: recall's own engine (`local`), an Ollama server
//! (`ollama`) or any OpenAI-compatible `/embeddings` endpoint (`openai`:
//! Volcano Ark, OpenAI, another recall), behind one trait.
//!
//! The rule that keeps an index sound: every provider says which vector
//! space its vectors live in ([`Space`]: model family, dimension,
//! normalisation), an index is bound to one space, and a [`Chain`] only ever
//! falls back to providers of that space.

pub mod config;
mod error;
pub mod http;
pub mod local;
pub mod ollama;
pub mod openai;
pub mod remote;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Result, anyhow};
use serde::{Deserialize, Serialize};

use crate::space::Identity;
use recall_engine::tokenize::{TextTokenizer, Tokens};
use recall_engine::{Embedding, Outputs};

pub use config::{Config, ProviderConfig};
pub use error::Error;

pub use crate::space::{Space, family_of};

/// The mean cosine that a sample of an index's stored vectors must reach
/// when re-embedded by another provider before it may write into the index.
/// Same-model providers agree far above it (recall serve: 1.0; f16 weights,
/// as Ollama runs them: above 0.999); another model of the same width falls
/// far below.
pub const SAME_SPACE_COSINE: f32 = 0.99;

/// The kind of a provider, as written in the configuration (`type = ...`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Local,
    Ollama,
    Openai,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Local => crate::space::LOCAL_PROVIDER,
            Kind::Ollama => "ollama",
            Kind::Openai => "openai",
        }
    }
}

/// One input of a batch: its text, and its token ids when recall's own
/// tokenizer cut the chunk (the local engine then skips tokenising again).
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    pub text: &'a str,
    pub tokens: Option<&'a Tokens>,
}

/// One embedded input.
#[derive(Debug, Clone)]
pub struct Vector {
    pub dense: Vec<f32>,
    /// BGE-M3's lexical weights (local engine only).
    pub sparse: Option<BTreeMap<u32, f32>>,
    /// Tokens the provider saw, when it says (else recall's estimate).
    pub tokens: usize,
}

/// A source of embeddings.
pub trait Provider: Send + Sync {
    /// The name in the configuration (`local`, `ollama`, `ark`, ...).
    fn name(&self) -> &str;
    fn kind(&self) -> Kind;
    /// What `recall providers` shows: the model, and where it runs.
    fn describe(&self) -> String;
    /// The identity of this provider's vectors, for binding an index and the
    /// embedding cache. Loads the model or contacts the server when needed:
    /// an error means the provider is unavailable now.
    fn identity(&self) -> Result<Identity, Error>;
    /// Embeds `inputs` (dense, plus sparse weights when `sparse` and the
    /// provider has them). Exactly one vector per input, or an error.
    fn embed(&self, inputs: &[Input], sparse: bool) -> Result<Vec<Vector>, Error>;
    /// What it gives beyond dense vectors. The local engine loads its model
    /// to say; unavailable now, a provider gives nothing more.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// The tokenizer its model reads with (the local engine's): chunks are
    /// then cut by the model's own tokens, else by an estimate.
    fn tokenizer(&self) -> Option<&TextTokenizer> {
        None
    }
    /// The model directory it runs from, when it runs one here (an index
    /// records it, so later runs without `--model` use the same).
    fn model_dir(&self) -> Option<&Path> {
        None
    }

    /// `texts` embedded with `outputs`: sparse weights and ColBERT vectors
    /// where `capabilities` has them (a query, passages to rerank). A
    /// provider of dense vectors only leaves the others `None`.
    fn embed_outputs(&self, texts: &[&str], outputs: Outputs) -> Result<Vec<Embedding>, Error> {
        let inputs: Vec<Input> = texts
            .iter()
            .map(|&text| Input { text, tokens: None })
            .collect();
        let vectors = self.embed(&inputs, false)?;
        if vectors.len() != texts.len() {
            return Err(anyhow!(
                "{} returned {} embeddings for {} inputs",
                self.name(),
                vectors.len(),
                texts.len()
            )
            .into());
        }
        Ok(vectors
            .into_iter()
            .map(|v| Embedding {
                dense: outputs.dense.then_some(v.dense),
                sparse: None,
                colbert: None,
                tokens: v.tokens,
                truncated: false,
            })
            .collect())
    }

    /// The query's embedding with `outputs` (`embed_outputs` of one text).
    fn embed_query(&self, query: &str, outputs: Outputs) -> Result<Embedding, Error> {
        self.embed_outputs(&[query], outputs)?
            .pop()
            .ok_or_else(|| anyhow!("{} returned no embedding for the query", self.name()).into())
    }
}

/// What a provider gives beyond dense vectors: BGE-M3's sparse lexical
/// weights and ColBERT vectors (recall's own engine on a BGE-M3 model).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    pub sparse: bool,
    pub colbert: bool,
}

/// Checks a provider's answer before anything is stored: one finite vector
/// of the expected dimension per input. Vectors are L2-normalised (cosine is
/// what every provider's vectors are compared by).
pub fn check_vectors(
    provider: &str,
    inputs: usize,
    dimension: Option<usize>,
    vectors: Vec<Vec<f32>>,
) -> Result<Vec<Vec<f32>>> {
    if vectors.len() != inputs {
        return Err(anyhow!(
            "{provider} returned {} vectors for {inputs} inputs",
            vectors.len()
        ));
    }
    // Without an expected width, all must agree with the widest (a vector cut short shows).
    let width = dimension.unwrap_or_else(|| vectors.iter().map(Vec::len).max().unwrap_or(0));
    vectors
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            if v.len() != width || width == 0 {
                return Err(anyhow!(
                    "{provider} returned a vector of {} dimensions for input {i}, expected {width}",
                    v.len()
                ));
            }
            if let Some(bad) = v.iter().find(|x| !x.is_finite()) {
                return Err(anyhow!(
                    "{provider} returned a non-finite value ({bad}) in the vector of input {i}"
                ));
            }
            // In f64: squares of huge finite f32 values overflow f32.
            let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
            if !(norm.is_finite() && norm > 0.0) {
                return Err(anyhow!(
                    "{provider} returned a vector of norm {norm} for input {i}"
                ));
            }
            v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            Ok(v)
        })
        .collect()
}

/// Providers in the order they are tried.
pub struct Chain {
    providers: Vec<Arc<dyn Provider>>,
}

/// Why the chain could not embed: each provider's reason.
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub space: Option<Space>,
    pub reasons: Vec<(String, String)>,
}

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.space {
            Some(space) => write!(
                f,
                "no embedding provider of the index's space ({space}) is available"
            )?,
            None => write!(f, "no embedding provider is available")?,
        }
        for (name, reason) in &self.reasons {
            write!(f, "\n  {name}: {reason}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unavailable {}

impl Chain {
    pub fn new(providers: Vec<Arc<dyn Provider>>) -> Self {
        Self { providers }
    }

    pub fn providers(&self) -> &[Arc<dyn Provider>] {
        &self.providers
    }

    /// The tokenizer of the first local engine in the chain that loads: it
    /// cuts chunks, whichever provider embeds them.
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.locals().find_map(|p| p.tokenizer())
    }

    /// The model directory of the first local engine in the chain that loads.
    pub fn model_dir(&self) -> Option<&Path> {
        self.locals().find_map(|p| p.model_dir())
    }

    /// The chain's local engines, in order.
    pub fn locals(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.providers.iter().filter(|p| p.kind() == Kind::Local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_checked_before_anything_is_kept() {
        let ok = check_vectors("p", 2, Some(2), vec![vec![3.0, 4.0], vec![1e30, 1e30]]).unwrap();
        assert_eq!(ok[0], vec![0.6, 0.8]);
        assert!((ok[1][0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        for (vectors, expected, what) in [
            (vec![vec![1.0, 0.0]], Some(2), "1 vectors for 2"),
            (vec![vec![1.0, 0.0], vec![1.0]], None, "1 dimensions"),
            (
                vec![vec![1.0, f32::NAN], vec![1.0, 0.0]],
                Some(2),
                "non-finite",
            ),
            (vec![vec![0.0, 0.0], vec![1.0, 0.0]], Some(2), "norm 0"),
            (
                vec![vec![1.0, 0.0, 0.0], vec![1.0, 0.0, 0.0]],
                Some(2),
                "3 dimensions",
            ),
        ] {
            let n = if what.starts_with('1') && what.contains("vectors") {
                2
            } else {
                vectors.len()
            };
            let err = check_vectors("p", n, expected, vectors)
                .unwrap_err()
                .to_string();
            assert!(err.contains(what), "{err}");
        }
    }

    #[test]
    fn families_of_model_names() {
        assert_eq!(family_of("BAAI/bge-m3"), "bge-m3");
        assert_eq!(family_of("bge-m3:latest"), "bge-m3");
        assert_eq!(
            family_of("doubao-embedding-vision"),
            "doubao-embedding-vision"
        );
    }
}
