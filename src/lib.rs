//! recall: local semantic memory for AI agents.
//!
//! The application over the embedding engine (`recall-engine`, re-exported
//! as [`engine`]): model management, the Hermes source, the index, hybrid
//! search, the embedding providers, the HTTP server and the watcher. A
//! program that only embeds should depend on `recall-engine` alone. See
//! ARCHITECTURE.md for the map.

pub mod bench;
pub mod env;
pub mod hermes_plugin;
pub mod index;
pub mod model;
pub mod paths;
pub mod provider;
pub mod search;
pub mod serve;
pub mod service;
pub mod source;
pub mod space;
mod sqlite;
pub mod watch;

/// The embedding engine (its own crate, `recall-engine`).
pub use recall_engine as engine;
pub use recall_engine::{
    Dtype, Embedder, Embedding, LoadOptions, ModelInfo, Outputs, default_device,
};
