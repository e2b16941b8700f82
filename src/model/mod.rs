//! Where a model comes from and how it is kept: the hub cache and
//! downloads (`hub`, `manifest`), `--model`/`RECALL_MODEL` (`locate`), and
//! air-gapped archives (`archive`). Opening a model directory is the
//! engine's (`recall_engine::model`), re-exported here.

pub mod archive;
pub mod hub;
pub mod locate;
pub mod manifest;

pub use recall_engine::model::{
    Architecture, COLBERT_HEAD, EncoderConfig, ModelFiles, Pooling, SPARSE_HEAD, SentenceConfig,
    Weights, config, converted_path, file_key, weights,
};
