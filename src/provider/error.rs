//! `Error`: why a provider gave no vectors, by what its caller does next.

/// Why a provider gave no vectors. Each variant keeps the error's whole
/// chain (`{:#}` prints it), API keys already blanked out.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The provider refused these inputs themselves (HTTP 400, 404, 413,
    /// 422: an input too long, a content filter). It works; these inputs
    /// never will: skip them, go on.
    #[error(transparent)]
    Rejected(anyhow::Error),
    /// The provider cannot embed now (unreachable, overloaded, its circuit
    /// open, a model that does not load, a wrong answer): try another, or
    /// pause and retry later.
    #[error(transparent)]
    Unavailable(anyhow::Error),
}

impl Error {
    /// Whether the provider refused the inputs themselves.
    pub fn is_rejected(&self) -> bool {
        matches!(self, Error::Rejected(_))
    }
}

/// An error from below (HTTP, the engine) is a refusal when the HTTP layer
/// marked it so (`http::Rejected`), else the provider is unavailable now.
impl From<anyhow::Error> for Error {
    fn from(e: anyhow::Error) -> Self {
        if e.downcast_ref::<super::http::Rejected>().is_some() {
            Error::Rejected(e)
        } else {
            Error::Unavailable(e)
        }
    }
}

impl From<recall_engine::Error> for Error {
    fn from(e: recall_engine::Error) -> Self {
        Error::Unavailable(e.into())
    }
}
