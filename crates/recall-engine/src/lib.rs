//! recall's embedding engine: BAAI/bge-m3 (and other BERT-family
//! sentence-transformers models) on the CPU, with candle for the GPU.
//!
//! One forward pass gives BGE-M3's three outputs: the 1024-dimension dense
//! vector (L2-normalised), the sparse lexical weights (token id → weight)
//! and the ColBERT vectors (one per token). The engine reads a model
//! directory in Hugging Face layout from a path; finding or downloading one
//! is the caller's business (the `recall` application does it from the hub
//! cache). It needs no network, database or async runtime.
//!
//! ```no_run
//! use recall_engine::{Embedder, LoadOptions, Outputs};
//!
//! # fn main() -> anyhow::Result<()> {
//! let model = std::path::Path::new("/models/bge-m3");
//! let embedder = Embedder::load(model, &LoadOptions::default())?;
//! let texts = ["the server ran out of space", "disk cleanup"];
//! let out = embedder.embed(&texts, Outputs::ALL)?;
//! let (a, b) = (out[0].dense.as_ref().unwrap(), out[1].dense.as_ref().unwrap());
//! println!("cosine {}", recall_engine::score::dense(a, b));
//! println!("sparse weights of the first: {:?}", out[0].sparse);
//! # Ok(())
//! # }
//! ```
//!
//! The API: [`Embedder`] with its [`LoadOptions`], [`Dtype`], [`Outputs`]
//! and [`Embedding`]s, [`ModelInfo`], [`Error`]; [`tokenize`], [`score`],
//! [`model`] (a model directory's files), [`paths`] and [`env`](mod@env) (the
//! variables the engine reads). `kernels`, `calibrate` and `packcache` are
//! public for recall's own benchmarks and tests only, hidden from the docs,
//! and change without notice.
//!
//! Layout: [`Embedder`] (tokenise, batch, encode, heads) over
//! `encoder` (the transformer on candle tensors), `proj` (its linear
//! layers, each on the kernel its [`Dtype`] picks), `ops` (recall's kernels
//! as candle operations) and `kernels` (the CPU kernels and the one place
//! that decides which run). [`model`] opens a model directory; `packcache`
//! keeps packed weights on disk between starts; `calibrate` measures q8
//! against f32 on the model being loaded and decides how q8 runs it (its
//! outlier channels, and the layers that run in f32).

mod attention;
mod dtype;
mod embedder;
mod embeddings;
mod encoder;
pub mod env;
mod error;
mod heads;
pub mod model;
mod ops;
pub mod paths;
mod proj;
pub mod score;
pub mod tokenize;

// Public for recall's own benchmarks, examples and tests, and for `recall
// --version`; not part of the API: they change with the kernels.
#[doc(hidden)]
pub mod calibrate;
#[doc(hidden)]
pub mod kernels;
#[doc(hidden)]
pub mod packcache;

pub use dtype::Dtype;
pub use embedder::{Embedder, Embedding, LoadOptions, ModelInfo, Outputs, default_device};
pub use error::{Error, Result};
pub use kernels::KernelInfo;
pub use tokenize::{TextTokenizer, Tokens};
