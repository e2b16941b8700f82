//! OpenAI's `POST /v1/embeddings` (also `/embeddings`) and `GET /v1/models`
//! (also `/models`).

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ApiError, Dialect, Floats, Inputs, Shared, parse_body};
use recall_engine::Outputs;

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/v1/embeddings", post(embeddings))
        .route("/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/models", get(models))
}

/// OpenAI's list of models.
#[derive(Serialize)]
struct ModelList {
    object: &'static str,
    data: Vec<ModelEntry>,
}

#[derive(Serialize)]
struct ModelEntry {
    id: String,
    object: &'static str,
    /// When the server started, in Unix seconds.
    created: u64,
    owned_by: &'static str,
}

/// Every name the model answers to, as OpenAI lists models.
async fn models(State(state): State<Shared>) -> Json<ModelList> {
    let created =
        (crate::index::unix_now() as u64).saturating_sub(state.started.elapsed().as_secs());
    let data = state
        .model_names()
        .into_iter()
        .map(|id| ModelEntry {
            id,
            object: "model",
            created,
            owned_by: "recall",
        })
        .collect();
    Json(ModelList {
        object: "list",
        data,
    })
}

#[derive(Deserialize)]
struct Request {
    input: Value,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<usize>,
    #[allow(dead_code)]
    user: Option<String>,
}

/// How the vectors are written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EncodingFormat {
    /// JSON numbers.
    Float,
    /// Each vector's little-endian f32 bytes, in base64.
    Base64,
}

impl EncodingFormat {
    /// The request's `encoding_format`; none means `float`, as OpenAI's.
    fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value {
            None | Some("float") => Ok(Self::Float),
            Some("base64") => Ok(Self::Base64),
            Some(other) => Err(ApiError::bad_request(format!(
                "`encoding_format` {other:?} is not supported: use \"float\" or \"base64\""
            ))
            .param("encoding_format")),
        }
    }
}

/// OpenAI's embeddings response.
#[derive(Serialize)]
struct EmbeddingList {
    object: &'static str,
    data: Vec<EmbeddingEntry>,
    model: String,
    usage: Usage,
}

#[derive(Serialize)]
struct EmbeddingEntry {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

/// A vector as `encoding_format` asked.
#[derive(Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Floats),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

async fn embeddings(State(state): State<Shared>, body: Bytes) -> Response {
    match answer(&state, &body).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.render(Dialect::OpenAi),
    }
}

async fn answer(state: &Shared, body: &[u8]) -> Result<EmbeddingList, ApiError> {
    let request: Request = parse_body(body)?;
    state.check_model(request.model.as_deref())?;
    state.check_dimensions(request.dimensions)?;
    let format = EncodingFormat::parse(request.encoding_format.as_deref())?;
    let inputs = inputs(request.input)?;
    // OpenAI refuses an input over the model's context rather than cutting it.
    let tokens = state.tokens(inputs, false).await?;
    let embeddings = state.embed(tokens, Outputs::DENSE).await?;
    let used: usize = embeddings.iter().map(|e| e.tokens).sum();
    let data = embeddings
        .into_iter()
        .enumerate()
        .map(|(index, e)| {
            let v = e.dense.unwrap_or_default();
            let embedding = match format {
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                EncodingFormat::Float => Vector::Float(Floats(v)),
            };
            EmbeddingEntry {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    Ok(EmbeddingList {
        object: "list",
        data,
        model: request
            .model
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| state.config.served_model_name.clone()),
        usage: Usage {
            prompt_tokens: used,
            total_tokens: used,
        },
    })
}

/// `input`: a string, strings, token ids, or arrays of token ids.
fn inputs(input: Value) -> Result<Inputs, ApiError> {
    let bad = |why: &str| {
        ApiError::bad_request(format!(
            "`input` {why}: send a string, an array of strings, an array of token ids, \
             or an array of arrays of token ids"
        ))
        .param("input")
    };
    let token = |v: &Value| v.as_u64().and_then(|t| u32::try_from(t).ok());
    match input {
        Value::String(s) => Ok(Inputs::Texts(vec![s])),
        Value::Array(items) if items.is_empty() => Err(bad("is an empty array")),
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(bad("mixes strings with other values")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Inputs::Texts),
            Value::Number(_) => items
                .iter()
                .map(|v| {
                    token(v)
                        .ok_or_else(|| bad("has a token id that is not a 32-bit unsigned integer"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|ids| Inputs::Ids(vec![ids])),
            Value::Array(_) => items
                .iter()
                .map(|item| {
                    item.as_array()
                        .ok_or_else(|| bad("mixes arrays of token ids with other values"))?
                        .iter()
                        .map(|v| {
                            token(v).ok_or_else(|| {
                                bad("has a token id that is not a 32-bit unsigned integer")
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Inputs::Ids),
            _ => Err(bad("holds neither strings nor token ids")),
        },
        Value::Null => Err(bad("is missing")),
        _ => Err(bad("has the wrong type")),
    }
}
