//! What vectors are: the space they live in (model family, width,
//! normalisation) and the identity of the engine that made them. Providers
//! report it, the index keeps it, search checks it: all call down to here.

use serde::{Deserialize, Serialize};

/// What a vector means. Two providers of one space give interchangeable vectors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Space {
    /// The model family: `bge-m3` for BAAI/bge-m3 and Ollama's `bge-m3:latest` alike.
    pub family: String,
    pub dimension: usize,
    pub normalized: bool,
}

impl std::fmt::Display for Space {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {} dims", self.family, self.dimension)?;
        if !self.normalized {
            write!(f, ", not normalised")?;
        }
        Ok(())
    }
}

/// The family a model name belongs to: `BAAI/bge-m3` and `bge-m3:latest` are both `bge-m3`.
pub fn family_of(model: &str) -> String {
    let name = model.trim().trim_end_matches('/');
    let name = name.rsplit('/').next().unwrap_or(name);
    let name = name.split(':').next().unwrap_or(name);
    name.to_ascii_lowercase()
}

/// `Identity::provider` of recall's own engine.
pub const LOCAL_PROVIDER: &str = "local";

/// What the vectors in an index are: never mix two of these.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The kind of provider that built the index (`local`, `ollama`, `openai`).
    pub provider: String,
    pub model: String,
    /// The model family (see `family_of`); older indexes lack it
    /// and take it from `model`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub family: String,
    pub revision: String,
    /// Size of the weights file: a changed file under the same name is another model.
    pub weights_bytes: u64,
    pub dimension: usize,
    pub normalized: bool,
    pub sparse: bool,
    pub chunk_tokens: usize,
    pub chunk_overlap: usize,
}

impl Identity {
    /// The vector space: what another provider must match to write into or search the index.
    pub fn space(&self) -> Space {
        Space {
            family: if self.family.is_empty() {
                family_of(&self.model)
            } else {
                self.family.clone()
            },
            dimension: self.dimension,
            normalized: self.normalized,
        }
    }

    /// `self` cut into chunks as `window`/`overlap` say (a provider's own
    /// identity knows nothing of chunking).
    pub fn chunked(mut self, window: usize, overlap: usize) -> Identity {
        self.chunk_tokens = window;
        self.chunk_overlap = overlap;
        self
    }

    /// Whether vectors made under `other` may join an index bound to `self`:
    /// the same space and chunking, and, from the same kind of provider, the
    /// very same local model (changed weights are another model, whatever their name).
    pub fn accepts(&self, other: &Identity) -> bool {
        let both_local = self.is_local() && other.is_local();
        // The very same local model is the same space whatever family an
        // older recall recorded for it (it once took the folder's name).
        let same_space = self.space() == other.space()
            || (both_local && self.embedding_key() == other.embedding_key());
        same_space
            && self.chunk_tokens == other.chunk_tokens
            && self.chunk_overlap == other.chunk_overlap
            && (!both_local || self.embedding_key() == other.embedding_key())
    }

    /// Whether recall's own engine made these vectors.
    pub fn is_local(&self) -> bool {
        self.provider == LOCAL_PROVIDER
    }

    /// The part that decides the vectors (not the chunking): the embedding cache's namespace.
    pub fn embedding_key(&self) -> String {
        format!(
            "{}|{}|{}|{}|{}",
            self.provider, self.model, self.revision, self.weights_bytes, self.dimension
        )
    }

    /// What differs from `other`, for the refusal message.
    pub fn differences(&self, other: &Identity) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |what: &str, a: String, b: String| {
            if a != b {
                out.push(format!("{what}: index has {a}, now {b}"));
            }
        };
        cmp("provider", self.provider.clone(), other.provider.clone());
        cmp("model", self.model.clone(), other.model.clone());
        cmp("model family", self.space().family, other.space().family);
        cmp("revision", self.revision.clone(), other.revision.clone());
        cmp(
            "weights size",
            self.weights_bytes.to_string(),
            other.weights_bytes.to_string(),
        );
        cmp(
            "dimension",
            self.dimension.to_string(),
            other.dimension.to_string(),
        );
        cmp(
            "normalised",
            self.normalized.to_string(),
            other.normalized.to_string(),
        );
        cmp(
            "sparse weights",
            self.sparse.to_string(),
            other.sparse.to_string(),
        );
        cmp(
            "chunk tokens",
            self.chunk_tokens.to_string(),
            other.chunk_tokens.to_string(),
        );
        cmp(
            "chunk overlap",
            self.chunk_overlap.to_string(),
            other.chunk_overlap.to_string(),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(model: &str, revision: &str) -> Identity {
        Identity {
            provider: "local".into(),
            model: model.into(),
            family: "bge-m3".into(),
            revision: revision.into(),
            weights_bytes: 2_271_064_456,
            dimension: 1024,
            normalized: true,
            sparse: true,
            chunk_tokens: 512,
            chunk_overlap: 64,
        }
    }

    #[test]
    fn families_ignore_owner_tag_and_case() {
        for name in ["BAAI/bge-m3", "bge-m3:latest", "BGE-M3", " bge-m3/ "] {
            assert_eq!(family_of(name), "bge-m3", "{name}");
        }
        assert_eq!(family_of("nomic-embed-text:v1.5"), "nomic-embed-text");
    }

    #[test]
    fn an_index_accepts_its_own_space_and_nothing_else() {
        let index = local("/models/bge-m3", "5617a9f");
        assert!(index.accepts(&index.clone()));
        // Another provider of the same space (Ollama's bge-m3) may join;
        // the same-vectors check then decides (index::Embedders).
        let ollama = Identity {
            provider: "ollama".into(),
            model: "bge-m3:latest".into(),
            family: String::new(),
            sparse: false,
            ..index.clone()
        };
        assert!(index.accepts(&ollama));
        // Two local engines must be the very same weights: q8 is not f32.
        assert!(!index.accepts(&local("/models/bge-m3", "5617a9f+q8")));
        assert!(!index.accepts(&Identity {
            weights_bytes: 1,
            ..index.clone()
        }));
        // Another width, other chunking: never.
        assert!(!index.accepts(&Identity {
            dimension: 768,
            ..ollama.clone()
        }));
        assert!(!index.accepts(&index.clone().chunked(256, 32)));
        let why = index.differences(&index.clone().chunked(256, 32));
        assert_eq!(
            why,
            [
                "chunk tokens: index has 512, now 256",
                "chunk overlap: index has 64, now 32"
            ]
        );
    }

    #[test]
    fn an_old_local_index_with_a_folder_family_accepts_the_same_model() {
        // Older recall recorded the folder's name as the family.
        let old = Identity {
            family: "my-m3-copy".into(),
            ..local("/models/my-m3-copy", "local")
        };
        assert!(old.accepts(&local("/models/my-m3-copy", "local")));
    }
}
