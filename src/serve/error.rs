//! `ApiError`: an HTTP status and a message, rendered in the error shape of
//! the client's API (`Dialect`: OpenAI, Ollama, TEI, recall).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::BatchError;

/// Which client's error shape a route answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Ollama,
    Tei,
    Recall,
}

impl Dialect {
    pub(super) fn of_path(path: &str) -> Self {
        if path.starts_with("/api/") {
            Dialect::Ollama
        } else if path.starts_with("/v1/") || path == "/embeddings" {
            Dialect::OpenAi
        } else if path.starts_with("/embed") {
            Dialect::Tei
        } else {
            Dialect::Recall
        }
    }
}

/// An error a client caused (or a refusal under load), rendered in the
/// client's own shape.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault (OpenAI's `param`).
    pub param: Option<&'static str>,
    /// OpenAI's `code`.
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A refusal under load, with `Retry-After: 1`.
    pub fn retry(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(status, message)
        }
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn render(self, dialect: Dialect) -> Response {
        let body = match dialect {
            Dialect::OpenAi => json!({"error": {
                "message": self.message,
                "type": match self.status.as_u16() {
                    401 => "authentication_error",
                    429 | 503 => "rate_limit_error",
                    500.. => "server_error",
                    _ => "invalid_request_error",
                },
                "param": self.param,
                "code": self.code,
            }}),
            Dialect::Tei => json!({
                "error": self.message,
                "error_type": match self.status.as_u16() {
                    429 | 503 => "overloaded",
                    500.. => "backend",
                    401 => "unauthorized",
                    _ => "validation",
                },
            }),
            Dialect::Ollama | Dialect::Recall => json!({"error": self.message}),
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> Self {
        let status = match e {
            BatchError::QueueFull { .. } | BatchError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            BatchError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            ApiError::retry(status, e.to_string())
        } else {
            ApiError::new(status, e.to_string())
        }
    }
}
