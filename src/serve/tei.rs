//! text-embeddings-inference's routes: `POST /embed` (dense), and the two
//! that give what no other local server does for BGE-M3:
//! `POST /embed_sparse` (lexical weights) and `POST /embed_all` (ColBERT
//! vectors, one per token after `<s>`).

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, Dialect, Floats, Inputs, Shared, parse_body};
use recall_engine::{Embedding, Outputs};

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/embed", post(embed))
        .route("/embed_sparse", post(embed_sparse))
        .route("/embed_all", post(embed_all))
}

#[derive(Deserialize)]
struct Request {
    inputs: Value,
    /// TEI's default: refuse over-long inputs.
    #[serde(default)]
    truncate: bool,
    normalize: Option<bool>,
    dimensions: Option<usize>,
}

async fn run(state: &Shared, body: &[u8], outputs: Outputs) -> Result<Vec<Embedding>, ApiError> {
    let request: Request = parse_body(body)?;
    if request.normalize == Some(false) {
        return Err(ApiError::bad_request(
            "`normalize: false` is not supported: this server gives the model's normalised vectors",
        ));
    }
    state.check_dimensions(request.dimensions)?;
    let bad = || ApiError::bad_request("`inputs` must be a string or an array of strings");
    let texts = match request.inputs {
        Value::String(s) => vec![s],
        Value::Array(items) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(bad()),
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(bad()),
    };
    let tokens = state.tokens(Inputs::Texts(texts), request.truncate).await?;
    state.embed(tokens, outputs).await
}

/// One token's weight in TEI's sparse answer (f64 as the other routes'
/// numbers, `Floats`).
#[derive(Serialize)]
struct SparseValue {
    index: u32,
    value: f64,
}

fn reply<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.render(Dialect::Tei),
    }
}

async fn embed(State(state): State<Shared>, body: Bytes) -> Response {
    reply(run(&state, &body, Outputs::DENSE).await.map(|es| {
        es.into_iter()
            .map(|e| Floats(e.dense.unwrap_or_default()))
            .collect::<Vec<_>>()
    }))
}

async fn embed_sparse(State(state): State<Shared>, body: Bytes) -> Response {
    let outputs = Outputs {
        dense: false,
        sparse: true,
        colbert: false,
    };
    reply(run(&state, &body, outputs).await.map(|es| {
        es.into_iter()
            .map(|e| {
                e.sparse
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(index, value)| SparseValue {
                        index,
                        value: f64::from(value),
                    })
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    }))
}

async fn embed_all(State(state): State<Shared>, body: Bytes) -> Response {
    let outputs = Outputs {
        dense: false,
        sparse: false,
        colbert: true,
    };
    reply(run(&state, &body, outputs).await.map(|es| {
        es.into_iter()
            .map(|e| {
                (e.colbert.unwrap_or_default().into_iter())
                    .map(Floats)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    }))
}
