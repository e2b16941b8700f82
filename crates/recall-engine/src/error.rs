//! The engine's errors at its boundary ([`Embedder`](crate::Embedder)), by
//! what a caller does about them. Inside, the engine keeps `anyhow`'s
//! context chains; each variant carries one, so messages read as before
//! (`{:#}` prints the whole chain).

/// Why the engine could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model cannot be loaded: its directory, files, weights or
    /// tokenizer, or a load option it cannot take. Fix the model or the
    /// options; retrying does not help.
    #[error(transparent)]
    Load(anyhow::Error),
    /// The request asks for what this model cannot give: sparse or ColBERT
    /// outputs of a model without BGE-M3's heads, or no output at all. A
    /// client's mistake (an HTTP server answers 400).
    #[error("{0}")]
    Unsupported(String),
    /// Tokenising or running the model failed on these inputs (one too
    /// long for the model, a token outside its vocabulary, a tensor error).
    #[error(transparent)]
    Run(anyhow::Error),
}

/// `Result` with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
