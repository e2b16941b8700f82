//! recall's own engine as a provider. The model is loaded on first use, so
//! a chain that never needs it never pays for it.

use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

use super::{Capabilities, Error, Input, Kind, Provider, Vector, family_of};
use crate::space::Identity;
use recall_engine::tokenize::TextTokenizer;
use recall_engine::{Embedder, Embedding, Outputs};

type Loader = Box<dyn Fn() -> Result<Embedder> + Send + Sync>;

pub struct Local {
    name: String,
    family: Option<String>,
    loader: Option<Loader>,
    loaded: OnceLock<Arc<Embedder>>,
    /// The last failed load: tried again after `RETRY_LOAD` (a model
    /// fetched meanwhile is picked up by a running watcher).
    failed: Mutex<Option<(Instant, String)>>,
}

const RETRY_LOAD: Duration = Duration::from_secs(30);

impl Local {
    /// A provider that loads its model with `loader` when first asked.
    pub fn new(name: &str, family: Option<String>, loader: Loader) -> Self {
        Self {
            name: name.to_string(),
            family,
            loader: Some(loader),
            loaded: OnceLock::new(),
            failed: Mutex::new(None),
        }
    }

    /// A provider over a model already loaded.
    pub fn from_embedder(name: &str, family: Option<String>, embedder: Arc<Embedder>) -> Self {
        let loaded = OnceLock::new();
        let _ = loaded.set(embedder);
        Self {
            name: name.to_string(),
            family,
            loader: None,
            loaded,
            failed: Mutex::new(None),
        }
    }

    pub fn embedder(&self) -> Result<&Embedder> {
        if let Some(e) = self.loaded.get() {
            return Ok(e);
        }
        // One load at a time; the lock also keeps the failure memo.
        let mut failed = self.failed.lock().unwrap();
        if let Some(e) = self.loaded.get() {
            return Ok(e);
        }
        if let Some((when, why)) = failed.as_ref()
            && when.elapsed() < RETRY_LOAD
        {
            return Err(anyhow!("{why}"));
        }
        let load = self.loader.as_ref().ok_or_else(|| anyhow!("no model"))?;
        match load() {
            Ok(e) => {
                *failed = None;
                Ok(self.loaded.get_or_init(|| Arc::new(e)))
            }
            Err(e) => {
                let why = format!("{e:#}");
                *failed = Some((Instant::now(), why.clone()));
                Err(anyhow!(why))
            }
        }
    }
}

/// The identity of `embedder`'s vectors (chunking left to the index).
pub fn identity_of(embedder: &Embedder, family: Option<&str>) -> Identity {
    let info = embedder.info();
    let dir_name = info
        .dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // A hub snapshot is named by its revision; its repository is two levels up.
    let (model, revision) = match info
        .dir
        .parent()
        .and_then(|p| p.parent())
        .and_then(|p| p.file_name())
    {
        Some(repo) if repo.to_string_lossy().starts_with("models--") => (
            repo.to_string_lossy()
                .trim_start_matches("models--")
                .replace("--", "/"),
            dir_name,
        ),
        _ => (dir_name, "local".to_string()),
    };
    // An index keeps to one vector space, and so does the embedding cache.
    let revision = info.vector_revision(&revision);
    // A model is known by what it is, not by its folder's name: one with
    // BGE-M3's heads is BGE-M3, as `recall serve` names it to its clients.
    let own_family = if info.sparse {
        "bge-m3".to_string()
    } else {
        family_of(&model)
    };
    Identity {
        provider: Kind::Local.as_str().into(),
        family: family.map_or(own_family, str::to_string),
        model,
        revision,
        weights_bytes: std::fs::metadata(&info.weights)
            .map(|m| m.len())
            .unwrap_or(0),
        dimension: info.dense_dim,
        normalized: info.normalize,
        sparse: info.sparse,
        chunk_tokens: 0,
        chunk_overlap: 0,
    }
}

impl Provider for Local {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> Kind {
        Kind::Local
    }

    fn describe(&self) -> String {
        match self.loaded.get() {
            Some(e) => e.describe(),
            None => "recall's engine".into(),
        }
    }

    fn identity(&self) -> Result<Identity, Error> {
        Ok(identity_of(self.embedder()?, self.family.as_deref()))
    }

    fn embed(&self, inputs: &[Input], sparse: bool) -> Result<Vec<Vector>, Error> {
        Provider::embed(self.embedder()?, inputs, sparse)
    }

    fn capabilities(&self) -> Capabilities {
        self.embedder()
            .map_or_else(|_| Capabilities::default(), |e| e.capabilities())
    }

    fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.embedder().ok().map(|e| e.tokenizer())
    }

    fn model_dir(&self) -> Option<&Path> {
        self.embedder().ok().map(|e| e.info().dir.as_path())
    }

    fn embed_outputs(&self, texts: &[&str], outputs: Outputs) -> Result<Vec<Embedding>, Error> {
        self.embedder()?.embed_outputs(texts, outputs)
    }
}

/// A loaded model is a provider too (named `local`, its family from its name).
impl Provider for Embedder {
    fn name(&self) -> &str {
        "local"
    }

    fn kind(&self) -> Kind {
        Kind::Local
    }

    fn describe(&self) -> String {
        let info = self.info();
        match info.dtype {
            crate::Dtype::F32 => format!("{} (recall's engine)", info.dir.display()),
            dtype => format!("{} (recall's engine, {dtype})", info.dir.display()),
        }
    }

    fn identity(&self) -> Result<Identity, Error> {
        Ok(identity_of(self, None))
    }

    fn embed(&self, inputs: &[Input], sparse: bool) -> Result<Vec<Vector>, Error> {
        let tokens = inputs
            .iter()
            .map(|i| match i.tokens {
                Some(t) => Ok(t.clone()),
                None => self.tokenizer().encode(i.text),
            })
            .collect::<Result<Vec<_>>>()?;
        let outputs = Outputs {
            dense: true,
            sparse: sparse && self.info().sparse,
            colbert: false,
        };
        let embedded = self.embed_tokens(&tokens, outputs)?;
        if embedded.len() != inputs.len() {
            return Err(anyhow!(
                "the model returned {} embeddings for {} inputs",
                embedded.len(),
                inputs.len()
            )
            .into());
        }
        Ok(embedded
            .into_iter()
            .map(|e| Vector {
                dense: e.dense.unwrap_or_default(),
                sparse: e.sparse,
                tokens: e.tokens,
            })
            .collect())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            sparse: self.info().sparse,
            colbert: self.info().colbert_dim.is_some(),
        }
    }

    fn tokenizer(&self) -> Option<&TextTokenizer> {
        Some(Embedder::tokenizer(self))
    }

    fn model_dir(&self) -> Option<&Path> {
        Some(&self.info().dir)
    }

    fn embed_outputs(&self, texts: &[&str], outputs: Outputs) -> Result<Vec<Embedding>, Error> {
        self.check_outputs(outputs)?;
        Ok(self.embed(texts, outputs)?)
    }
}
