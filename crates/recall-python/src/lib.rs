//! recall's embedding engine as a Python extension (`recall_embed._native`):
//! a model loaded once, then BGE-M3's dense, sparse and ColBERT outputs as
//! numpy arrays and dicts in FlagEmbedding's shapes. The engine runs with
//! the GIL released, so Python threads that embed run in parallel; Ctrl-C
//! is honoured between batches. The Python side (`python/recall_embed`)
//! adds the scores and the framework adapters.

use std::path::PathBuf;

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use recall_engine::{Dtype, Embedder, Embedding, LoadOptions, Outputs, Tokens};

// As in the binary (src/main.rs): candle allocates a fresh buffer for every
// op's output; glibc serves large ones with new mmaps, whose pages the kernel
// must zero on first touch. mimalloc reuses freed memory instead. Python's
// own objects keep Python's allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A model loaded for embedding: BGE-M3 (dense, sparse, ColBERT) or a
/// BERT-family sentence-transformers model (dense).
#[pyclass(module = "recall_embed._native", frozen)]
struct Model {
    embedder: Embedder,
    /// The threads the engine runs on; `None`: one per core.
    pool: Option<rayon::ThreadPool>,
    /// What the model was made from, for pickling.
    settings: Settings,
}

#[derive(Clone)]
struct Settings {
    path: PathBuf,
    dtype: Dtype,
    threads: Option<usize>,
    max_length: Option<usize>,
}

/// The engine's message, whole, as the exception Python code expects for it.
fn error(e: recall_engine::Error) -> PyErr {
    match e {
        recall_engine::Error::Unsupported(m) => PyValueError::new_err(m),
        other => PyRuntimeError::new_err(format!("{other:#}")),
    }
}

#[pymethods]
impl Model {
    #[new]
    #[pyo3(signature = (path, dtype = "f32", threads = None, max_length = None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        dtype: &str,
        threads: Option<usize>,
        max_length: Option<usize>,
    ) -> PyResult<Self> {
        let dtype: Dtype = dtype
            .parse()
            .map_err(|e: anyhow::Error| PyValueError::new_err(e.to_string()))?;
        if threads == Some(0) {
            return Err(PyValueError::new_err(
                "threads must be at least 1 (None: one per core)",
            ));
        }
        let settings = Settings {
            path,
            dtype,
            threads,
            max_length,
        };
        let pool = match threads {
            Some(n) => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .build()
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
            ),
            None => None,
        };
        let options = LoadOptions {
            dtype,
            max_length,
            ..LoadOptions::default()
        };
        let embedder = py
            .detach(|| in_pool(&pool, || Embedder::load(&settings.path, &options)))
            .map_err(error)?;
        Ok(Self {
            embedder,
            pool,
            settings,
        })
    }

    /// Embeds `texts` in batches of `batch_size`, the GIL released while
    /// each runs; `outputs`: (dense, sparse, ColBERT). A dict of FlagEmbedding's
    /// keys, each holding its output or None.
    /// `progress`, when given, is called with the number of texts done
    /// after each batch.
    #[pyo3(signature = (texts, batch_size, max_length, outputs, progress = None))]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        batch_size: usize,
        max_length: Option<usize>,
        outputs: (bool, bool, bool),
        progress: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let (dense, sparse, colbert) = outputs;
        if batch_size == 0 {
            return Err(PyValueError::new_err("batch_size must be at least 1"));
        }
        let outputs = Outputs {
            dense,
            sparse,
            colbert,
        };
        self.embedder.check_outputs(outputs).map_err(error)?;
        let added = self.embedder.tokenizer().added_tokens();
        if let Some(m) = max_length
            && m <= added
        {
            return Err(PyValueError::new_err(format!(
                "max_length {m} leaves no room for text: the model adds {added} special tokens"
            )));
        }
        let mut embedded: Vec<Embedding> = Vec::with_capacity(texts.len());
        for batch in texts.chunks(batch_size) {
            let out = py.detach(|| {
                in_pool(&self.pool, || {
                    let mut tokens = self.embedder.tokenize(batch)?;
                    if let Some(m) = max_length {
                        for t in &mut tokens {
                            cut(t, m, added);
                        }
                    }
                    self.embedder.embed_tokens(&tokens, outputs)
                })
            });
            embedded.extend(out.map_err(error)?);
            if let Some(progress) = &progress {
                progress.call1((embedded.len(),))?;
            }
            // Ctrl-C lands here, between batches.
            py.check_signals()?;
        }
        // FlagEmbedding's keys, each None where its output was not asked for.
        let result = PyDict::new(py);
        for key in ["dense_vecs", "lexical_weights", "colbert_vecs"] {
            result.set_item(key, py.None())?;
        }
        if dense {
            let dim = self.embedder.info().dense_dim;
            let mut flat = Vec::with_capacity(embedded.len() * dim);
            for e in &mut embedded {
                flat.extend(e.dense.take().unwrap_or_default());
            }
            let array = PyArray1::from_vec(py, flat).reshape([embedded.len(), dim])?;
            result.set_item("dense_vecs", array)?;
        }
        if sparse {
            let list = PyList::empty(py);
            for e in &embedded {
                let weights = PyDict::new(py);
                for (token, weight) in e.sparse.iter().flatten() {
                    weights.set_item(token.to_string(), *weight)?;
                }
                list.append(weights)?;
            }
            result.set_item("lexical_weights", list)?;
        }
        if colbert {
            let list = PyList::empty(py);
            for e in &mut embedded {
                let vectors = e.colbert.take().unwrap_or_default();
                let (rows, dim) = (vectors.len(), vectors.first().map_or(0, Vec::len));
                let flat: Vec<f32> = vectors.into_iter().flatten().collect();
                list.append(PyArray1::from_vec(py, flat).reshape([rows, dim])?)?;
            }
            result.set_item("colbert_vecs", list)?;
        }
        Ok(result)
    }

    /// What was loaded: a dict of the model's facts.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let info = self.embedder.info();
        let out = PyDict::new(py);
        out.set_item("path", &info.dir)?;
        out.set_item("model_type", &info.model_type)?;
        out.set_item("dense_dim", info.dense_dim)?;
        out.set_item("colbert_dim", info.colbert_dim)?;
        out.set_item("sparse", info.sparse)?;
        out.set_item("max_length", info.max_length)?;
        out.set_item("normalize", info.normalize)?;
        out.set_item("dtype", info.dtype.as_str())?;
        Ok(out)
    }

    /// The arguments that make this model again (pickling by path and
    /// settings: each process loads its own).
    fn settings<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let s = &self.settings;
        (s.path.clone(), s.dtype.as_str(), s.threads, s.max_length).into_pyobject(py)
    }
}

/// Runs `f` on the model's own threads, or rayon's global ones.
fn in_pool<T: Send>(pool: &Option<rayon::ThreadPool>, f: impl FnOnce() -> T + Send) -> T {
    match pool {
        Some(pool) => pool.install(f),
        None => f(),
    }
}

/// Cuts an input to `max_length` tokens as the tokenizer's own truncation
/// does: text tokens go, the closing special token stays.
fn cut(tokens: &mut Tokens, max_length: usize, added: usize) {
    if tokens.ids.len() <= max_length {
        return;
    }
    let last = tokens.ids[tokens.ids.len() - 1];
    tokens.ids.truncate(max_length);
    if added > 0 {
        tokens.ids[max_length - 1] = last;
    }
    tokens.truncated = true;
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Model>()?;
    Ok(())
}
