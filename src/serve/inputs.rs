//! The checks every API shares before a forward pass: item count, token
//! ids in the vocabulary, the length limit, tokenising on the blocking pool
//! (a long text only as far as the model's limit can matter), and embedding
//! through the lane a request's size picks.

use anyhow::Result;
use axum::http::StatusCode;

use super::{ApiError, AppState, QUERY_TOKENS};
use recall_engine::tokenize::Tokens;
use recall_engine::{Embedder, Embedding, Outputs};

/// The inputs of a request: texts, or token ids of the model's own vocabulary.
pub enum Inputs {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

impl Inputs {
    pub fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Ids(i) => i.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl AppState {
    /// The names this model answers to, the one it announces first.
    pub fn model_names(&self) -> Vec<String> {
        let mut names = vec![self.config.served_model_name.clone()];
        for alias in &self.config.model_aliases {
            if !names.contains(alias) {
                names.push(alias.clone());
            }
        }
        names
    }

    /// Whether `name` (Ollama's `:latest` tag allowed) is one of `model_names`.
    pub fn answers_to(&self, name: &str) -> bool {
        let name = name.strip_suffix(":latest").unwrap_or(name);
        self.model_names().iter().any(|n| n == name)
    }

    /// Checks the requested model name (an absent one means this model).
    pub fn check_model(&self, name: Option<&str>) -> Result<(), ApiError> {
        match name {
            Some(n) if !n.is_empty() && !self.answers_to(n) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "model {n:?} not found: this server has {:?}, which answers to {}",
                    self.config.served_model_name,
                    self.model_names().join(", ")
                ),
            )
            .param("model")
            .code("model_not_found")),
            _ => Ok(()),
        }
    }

    /// Checks a requested output dimension: the model's own is the only one.
    pub fn check_dimensions(&self, dimensions: Option<usize>) -> Result<(), ApiError> {
        let dim = self.embedder.info().dense_dim;
        match dimensions {
            Some(d) if d != dim => Err(ApiError::bad_request(format!(
                "`dimensions` {d} is not supported: this model gives {dim}-dimensional vectors \
                 (leave `dimensions` out, or ask for {dim})"
            ))
            .param("dimensions")),
            _ => Ok(()),
        }
    }

    /// Tokenises (on the blocking pool) and checks `inputs`. Without
    /// `truncate`, an input over the length limit is an error.
    pub async fn tokens(&self, inputs: Inputs, truncate: bool) -> Result<Vec<Tokens>, ApiError> {
        if inputs.is_empty() {
            return Err(ApiError::bad_request("`input` is empty: send at least one").param("input"));
        }
        if inputs.len() > self.config.max_items {
            return Err(ApiError::bad_request(format!(
                "{} inputs in one request: the limit is {}; split the request",
                inputs.len(),
                self.config.max_items
            ))
            .param("input"));
        }
        let info = self.embedder.info();
        let max = info.max_length;
        match inputs {
            Inputs::Ids(ids) => ids
                .into_iter()
                .enumerate()
                .map(|(i, ids)| {
                    if ids.is_empty() {
                        return Err(ApiError::bad_request(format!("input {i} has no tokens")));
                    }
                    if let Some(bad) = ids.iter().find(|&&t| t as usize >= info.vocab_size) {
                        return Err(ApiError::bad_request(format!(
                            "input {i} has token id {bad}, outside this model's vocabulary of {}",
                            info.vocab_size
                        )));
                    }
                    if ids.len() > max && !truncate {
                        return Err(too_long(i, ids.len(), max));
                    }
                    let truncated = ids.len() > max;
                    let mut ids = ids;
                    ids.truncate(max);
                    Ok(Tokens { ids, truncated })
                })
                .collect::<Result<_, _>>()
                .map_err(|e| e.param("input")),
            Inputs::Texts(texts) => {
                // One rule on every route, as OpenAI's API and TEI have it.
                if let Some(i) = texts.iter().position(|t| t.is_empty()) {
                    return Err(ApiError::bad_request(format!(
                        "input {i} is an empty string, which has no embedding"
                    ))
                    .param("input"));
                }
                let embedder = self.embedder.clone();
                let tokens =
                    tokio::task::spawn_blocking(move || tokenize_within(&embedder, &texts, max))
                        .await
                        .map_err(|e| {
                            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                        })?
                        .map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
                if !truncate && let Some(i) = tokens.iter().position(|t| t.truncated) {
                    return Err(ApiError::bad_request(format!(
                        "input {i} has more tokens than this server's limit of {max} \
                         (ask for truncation, or split the text)"
                    ))
                    .param("input"));
                }
                Ok(tokens)
            }
        }
    }

    /// Inputs queued in both lanes.
    pub fn queued(&self) -> usize {
        self.batcher.queued() + self.queries.queued()
    }

    /// Embeds checked inputs through the batcher of their lane.
    pub async fn embed(
        &self,
        tokens: Vec<Tokens>,
        outputs: Outputs,
    ) -> Result<Vec<Embedding>, ApiError> {
        self.embedder
            .check_outputs(outputs)
            .map_err(|e| ApiError::bad_request(format!("{e:#}")))?;
        self.metrics.queued.set(self.queued() as i64);
        let total: usize = tokens.iter().map(|t| t.ids.len()).sum();
        let lane = if total <= QUERY_TOKENS {
            &self.queries
        } else {
            &self.batcher
        };
        Ok(lane.embed(tokens, outputs).await?)
    }
}

/// Bytes per token beyond which a text cannot fit `max` tokens whole: no
/// tokenizer recall loads makes a token of more (a word longer than that is
/// one unknown token in WordPiece, and pieces in SentencePiece are shorter).
const MAX_BYTES_PER_TOKEN: usize = 64;

/// `texts` tokenised and cut at `max` tokens, without tokenising more of a
/// long text than can matter: a text longer than `max` ×
/// `MAX_BYTES_PER_TOKEN` bytes is tokenised from its start up to a word
/// boundary there, and only when that start does not fill `max` tokens (text
/// of unusually long tokens) from end to end. A 15 MB body costs what its
/// first tokens cost.
fn tokenize_within(embedder: &Embedder, texts: &[String], max: usize) -> Result<Vec<Tokens>> {
    let bound = max.saturating_mul(MAX_BYTES_PER_TOKEN);
    let heads: Vec<&str> = texts.iter().map(|t| head(t, bound)).collect();
    let mut tokens = embedder.tokenize(&heads)?;
    for (i, (text, head)) in texts.iter().zip(&heads).enumerate() {
        if head.len() < text.len() {
            if tokens[i].truncated {
                continue;
            }
            tokens[i] = embedder.tokenize(std::slice::from_ref(text))?.remove(0);
        }
    }
    Ok(tokens)
}

/// The start of `text` up to about `bound` bytes, cut after whitespace when
/// there is some in its last kilobyte, else at a character boundary.
fn head(text: &str, bound: usize) -> &str {
    if text.len() <= bound {
        return text;
    }
    let mut end = bound;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let window = end.saturating_sub(1024);
    match text[window..end].rfind(char::is_whitespace) {
        Some(at) => &text[..window + at],
        None => &text[..end],
    }
}

fn too_long(i: usize, n: usize, max: usize) -> ApiError {
    ApiError::bad_request(format!(
        "input {i} has {n} tokens, more than this server's limit of {max} \
         (ask for truncation, or split the text)"
    ))
}

/// Parses a JSON body, naming what is wrong in the client's shape.
pub fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}
