//! recall: local semantic memory for AI agents.
//!
//! The embedding runtime is [`Embedder`]: it loads a BGE-M3 (or other
//! BERT-family sentence-transformers) model directory and gives dense,
//! sparse and ColBERT embeddings. See ARCHITECTURE.md for the map.

pub mod attention;
pub mod bench;
pub mod bf16;
pub mod calibrate;
pub mod embedder;
pub mod encoder;
mod fused;
pub mod heads;
pub mod hermes_plugin;
pub mod index;
#[doc(hidden)]
pub mod matmul;
pub mod model;
pub mod packcache;
pub mod paths;
pub mod provider;
pub mod quant;
pub mod score;
pub mod search;
pub mod serve;
pub mod source;
pub mod space;
mod sqlite;
pub mod tokenize;
pub mod watch;

pub use embedder::{Embedder, Embedding, LoadOptions, ModelInfo, Outputs, default_device};
pub use encoder::Dtype;
