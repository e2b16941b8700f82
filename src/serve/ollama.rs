//! Ollama's API: `POST /api/embed`, the older `POST /api/embeddings`, and
//! `GET /api/tags` / `GET /api/version` so that installers that look for
//! `bge-m3` find it.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ApiError, Dialect, Floats, Inputs, Shared, nanos, parse_body};
use recall_engine::Outputs;

/// The Ollama API version this server speaks (`/api/embed` arrived in 0.3.0).
const OLLAMA_VERSION: &str = "0.12.0";

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/api/embed", post(embed))
        .route("/api/embeddings", post(embeddings))
        .route("/api/tags", get(tags))
        .route("/api/version", get(version))
        .route("/", get(|| async { "Ollama is running (recall)" }))
}

#[derive(Deserialize)]
struct EmbedRequest {
    model: Option<String>,
    input: Option<Value>,
    truncate: Option<bool>,
    dimensions: Option<usize>,
    // Accepted and ignored: the model stays loaded for the server's lifetime.
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    #[allow(dead_code)]
    options: Option<Value>,
}

#[derive(Deserialize)]
struct EmbeddingsRequest {
    model: Option<String>,
    prompt: Option<String>,
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    #[allow(dead_code)]
    options: Option<Value>,
}

fn reply<T: Serialize>(result: Result<T, ApiError>) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.render(Dialect::Ollama),
    }
}

/// Ollama's `/api/embed` answer.
#[derive(Serialize)]
struct EmbedResponse {
    model: String,
    embeddings: Vec<Floats>,
    total_duration: u64,
    load_duration: u64,
    prompt_eval_count: usize,
}

/// Ollama's older `/api/embeddings` answer.
#[derive(Serialize)]
struct EmbeddingsResponse {
    embedding: Floats,
}

async fn embed(State(state): State<Shared>, body: Bytes) -> Response {
    reply(
        async {
            let started = Instant::now();
            let request: EmbedRequest = parse_body(&body)?;
            state.check_model(request.model.as_deref())?;
            state.check_dimensions(request.dimensions)?;
            let texts = match request.input {
                Some(Value::String(s)) => vec![s],
                Some(Value::Array(items)) => items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        _ => Err(ApiError::bad_request(
                            "`input` must be a string or an array of strings",
                        )),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => {
                    return Err(ApiError::bad_request(
                        "`input` must be a string or an array of strings",
                    ));
                }
                None => return Err(ApiError::bad_request("`input` is missing")),
            };
            let tokens = state
                .tokens(Inputs::Texts(texts), request.truncate.unwrap_or(true))
                .await?;
            let embeddings = state.embed(tokens, Outputs::DENSE).await?;
            let count: usize = embeddings.iter().map(|e| e.tokens).sum();
            Ok(EmbedResponse {
                model: request
                    .model
                    .unwrap_or_else(|| state.config.served_model_name.clone()),
                embeddings: embeddings
                    .into_iter()
                    .map(|e| Floats(e.dense.unwrap_or_default()))
                    .collect(),
                total_duration: nanos(started.elapsed()),
                // The model was loaded when the server started.
                load_duration: 0,
                prompt_eval_count: count,
            })
        }
        .await,
    )
}

async fn embeddings(State(state): State<Shared>, body: Bytes) -> Response {
    reply(
        async {
            let request: EmbeddingsRequest = parse_body(&body)?;
            state.check_model(request.model.as_deref())?;
            let prompt = request
                .prompt
                .ok_or_else(|| ApiError::bad_request("`prompt` is missing"))?;
            let tokens = state.tokens(Inputs::Texts(vec![prompt]), true).await?;
            let mut embeddings = state.embed(tokens, Outputs::DENSE).await?;
            Ok(EmbeddingsResponse {
                embedding: Floats(embeddings.remove(0).dense.unwrap_or_default()),
            })
        }
        .await,
    )
}

async fn tags(State(state): State<Shared>) -> Json<Value> {
    let info = state.embedder.info();
    let identity = &state.identity;
    let names = state.model_names();
    let modified = std::fs::metadata(&info.weights)
        .and_then(|m| m.modified())
        .ok()
        .map(|t| {
            let secs = t
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            crate::search::rfc3339(secs)
        });
    let models: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let tagged = format!("{name}:latest");
            json!({
                "name": tagged,
                "model": tagged,
                "modified_at": modified,
                "size": identity.weights_bytes,
                "digest": identity.revision,
                "details": {
                    "format": "safetensors",
                    "family": info.model_type,
                    "families": [info.model_type],
                    "parameter_size": "",
                    "quantization_level": "F32",
                },
            })
        })
        .collect();
    Json(json!({"models": models}))
}

async fn version() -> Json<Value> {
    Json(json!({"version": OLLAMA_VERSION, "recall": env!("CARGO_PKG_VERSION")}))
}
