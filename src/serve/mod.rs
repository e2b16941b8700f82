//! `recall serve`: the embedding model over HTTP, in the shapes that OpenAI,
//! Ollama and text-embeddings-inference clients already speak, plus recall's
//! session search.
//!
//! A thin layer: each API module (`openai`, `ollama`, `tei`, `recall_api`)
//! turns its request shape into inputs and its answer back into its own
//! shape, errors included; all of them embed through one `Batcher`, which
//! packs concurrent requests into shared forward passes. This module holds
//! the server: configuration, shared input checks, the error type, API-key
//! and concurrency middleware, metrics, and graceful shutdown.

mod batcher;
mod metrics;
mod ollama;
mod openai;
mod recall_api;
mod tei;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

pub use batcher::{BatchError, Batcher};
pub use metrics::Metrics;

use crate::embedder::{Embedder, Embedding, Outputs};
use crate::space::Identity;
use crate::tokenize::Tokens;

/// Requests of at most this many tokens in all go to the query lane.
pub const QUERY_TOKENS: usize = 64;

/// Default port: Ollama's 11434, plus one.
pub const DEFAULT_PORT: u16 = 11435;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub host: IpAddr,
    pub port: u16,
    /// Required to bind anything but a loopback address.
    pub api_key: Option<String>,
    /// The name the model answers to, besides `bge-m3` and `BAAI/bge-m3` for a BGE-M3 model.
    pub served_model_name: String,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Request bodies held at once across requests, bytes; more get 503.
    pub max_inflight_bytes: usize,
    /// Time a client may take to send a request's headers (then the connection is closed).
    pub header_timeout: Duration,
    /// Time a client may take to send a request's body (then 408).
    pub body_timeout: Duration,
    /// Inputs in one request.
    pub max_items: usize,
    /// Requests handled at once; more get 429.
    pub max_concurrent_requests: usize,
    /// Inputs waiting for a forward pass; more get 503 with Retry-After.
    pub max_queue: usize,
    /// Tokens packed into one forward pass.
    pub max_batch_tokens: usize,
    /// The index that `POST /search` searches (None: search is unavailable).
    pub index: Option<PathBuf>,
}

impl ServeConfig {
    /// Binding beyond this machine needs an API key.
    pub fn check(&self) -> Result<()> {
        if !self.host.is_loopback() && self.api_key.as_deref().is_none_or(str::is_empty) {
            bail!(
                "listening on {} would let anyone who can reach this machine use the model: \
                 set an API key with --api-key or RECALL_API_KEY (clients send it as \
                 `Authorization: Bearer KEY`), or listen on 127.0.0.1",
                self.host
            );
        }
        if self.max_items == 0
            || self.max_concurrent_requests == 0
            || self.max_queue == 0
            || self.max_body_bytes == 0
        {
            bail!(
                "--max-items, --max-concurrent-requests, --max-queue and --max-body-bytes must be at least 1"
            );
        }
        if self.max_inflight_bytes < self.max_body_bytes {
            bail!(
                "--max-inflight-bytes {} is less than --max-body-bytes {}: the largest body could never be taken",
                self.max_inflight_bytes,
                self.max_body_bytes
            );
        }
        Ok(())
    }
}

/// `recall serve --watch`: the Hermes profiles to follow into `ServeConfig::index`.
pub struct WatchJob {
    pub profiles: Vec<crate::source::hermes::Profile>,
    pub options: crate::index::IndexOptions,
    pub timing: crate::watch::WatchOptions,
}

/// What every handler shares.
pub struct AppState {
    pub embedder: Arc<Embedder>,
    /// Forward passes for bulk requests (documents, indexing).
    pub batcher: Batcher,
    /// Forward passes for short requests (queries): a bulk pass pauses at
    /// its next layer while they wait, so a query never waits for a whole
    /// bulk pass.
    pub queries: Batcher,
    pub metrics: Arc<Metrics>,
    pub config: ServeConfig,
    /// What the model is (name, revision, dimension), as an index would record it.
    pub identity: Identity,
    pub started: Instant,
    /// Wakes the watcher (`POST /index`), when the server runs one.
    pub nudge: Option<crate::watch::Nudge>,
    requests: Arc<Semaphore>,
    /// Request bodies in flight, in KiB.
    inflight_kib: Arc<Semaphore>,
}

type Shared = Arc<AppState>;

/// Which client's error shape a route answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Ollama,
    Tei,
    Recall,
}

impl Dialect {
    fn of_path(path: &str) -> Self {
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
    /// The names this model answers to.
    pub fn answers_to(&self, name: &str) -> bool {
        let name = name.strip_suffix(":latest").unwrap_or(name);
        name == self.config.served_model_name
            || (self.embedder.info().sparse && (name == "bge-m3" || name == "BAAI/bge-m3"))
    }

    /// Checks the requested model name (an absent one means this model).
    pub fn check_model(&self, name: Option<&str>) -> Result<(), ApiError> {
        match name {
            Some(n) if !n.is_empty() && !self.answers_to(n) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "model {n:?} not found: this server has {:?}",
                    self.config.served_model_name
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

/// The router with every route and middleware.
pub fn router(state: Shared) -> Router {
    let max_body = state.config.max_body_bytes;
    Router::new()
        .merge(openai::routes())
        .merge(ollama::routes())
        .merge(tei::routes())
        .merge(recall_api::routes())
        .layer(middleware::from_fn_with_state(state.clone(), admit))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

async fn authorize(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let Some(key) = state.config.api_key.as_deref().filter(|k| !k.is_empty()) else {
        return next.run(request).await;
    };
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    // The scheme is case-insensitive (RFC 9110, 11.1).
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map_or("", |(_, key)| key.trim());
    if bool::from(given.as_bytes().ct_eq(key.as_bytes())) {
        next.run(request).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: send `Authorization: Bearer KEY`",
        )
        .code("invalid_api_key")
        .render(Dialect::of_path(request.uri().path()))
    }
}

/// Admits a request and measures it: its body is read whole first, within
/// the bytes-in-flight budget and the body timeout, so that a slow or large
/// client holds no request slot while it sends; then a slot is taken.
/// `/health` takes neither: it always answers.
async fn admit(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = request.uri().path().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let response = match admitted(&state, request, next, &path).await {
        Ok(response) => response,
        Err(e) => e.render(Dialect::of_path(&path)),
    };
    state
        .metrics
        .request(&route, response.status().as_u16(), started.elapsed());
    response
}

async fn admitted(
    state: &AppState,
    request: Request,
    next: Next,
    path: &str,
) -> Result<Response, ApiError> {
    let max_body = state.config.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than this server's limit of {max_body} bytes (--max-body-bytes)"
            ),
        )
    };
    if path == "/health" {
        return Ok(next.run(request).await);
    }
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > max_body) {
        return Err(too_large());
    }
    // A body of unknown length (chunked) may be as large as allowed.
    let has_body = !matches!(
        *request.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let expected = declared.unwrap_or(if has_body { max_body } else { 0 });
    let kib = expected.div_ceil(1024).max(1) as u32;
    let _bytes = state
        .inflight_kib
        .clone()
        .try_acquire_many_owned(kib)
        .map_err(|_| {
            ApiError::retry(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "too many request bytes in flight (limit {} bytes, --max-inflight-bytes): retry shortly",
                    state.config.max_inflight_bytes
                ),
            )
        })?;
    let (parts, body) = request.into_parts();
    let timeout = state.config.body_timeout;
    let bytes = tokio::time::timeout(timeout, axum::body::to_bytes(body, max_body))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    timeout.as_secs()
                ),
            )
        })?
        .map_err(|e| {
            if std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>())
            {
                too_large()
            } else {
                ApiError::bad_request(format!("cannot read the request body: {e}"))
            }
        })?;
    let request = Request::from_parts(parts, axum::body::Body::from(bytes));
    let _slot = state.requests.clone().try_acquire_owned().map_err(|_| {
        ApiError::retry(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many requests at once (limit {}): retry shortly",
                state.config.max_concurrent_requests
            ),
        )
    })?;
    Ok(next.run(request).await)
}

/// Serves until SIGINT or SIGTERM, then finishes the requests in flight.
/// With `watch`, a thread also indexes Hermes's changes as they happen.
pub async fn serve(embedder: Embedder, config: ServeConfig, watch: Option<WatchJob>) -> Result<()> {
    config.check()?;
    let embedder = Arc::new(embedder);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (nudge, watcher) = match (watch, config.index.clone()) {
        (Some(job), Some(index)) => {
            if crate::watch::is_watched(&index) {
                bail!(
                    "--watch: another recall watch (or recall serve --watch) already follows {}",
                    index.display()
                );
            }
            let (nudge, nudges) = crate::watch::nudge_channel();
            let (embedder, stop) = (embedder.clone(), stop.clone());
            let thread = std::thread::Builder::new()
                .name("recall-watch".into())
                .spawn(move || {
                    let report = |event: crate::watch::Event| {
                        if let Some(line) = event.describe() {
                            eprintln!("recall serve: {line}");
                        }
                    };
                    // The server's own model indexes: the one it loaded.
                    let chain = crate::provider::Chain::new(vec![Arc::new(
                        crate::provider::local::Local::from_embedder("local", None, embedder),
                    )]);
                    crate::watch::watch(
                        &chain,
                        &index,
                        &job.profiles,
                        &job.options,
                        job.timing,
                        &nudges,
                        &stop,
                        &report,
                    )
                })?;
            (Some(nudge), Some(thread))
        }
        (Some(_), None) => bail!("--watch needs an index: pass --index PATH or --hermes-home DIR"),
        _ => (None, None),
    };
    let metrics = Arc::new(Metrics::default());
    let gate = Arc::new(batcher::Gate::default());
    let batcher = Batcher::start(
        embedder.clone(),
        config.max_batch_tokens,
        config.max_queue,
        metrics.clone(),
        batcher::Priority::Yielding(gate.clone()),
    );
    let queries = Batcher::start(
        embedder.clone(),
        config.max_batch_tokens,
        config.max_queue,
        metrics.clone(),
        batcher::Priority::Urgent(gate),
    );
    let identity = crate::index::identity(&embedder, crate::index::chunk::ChunkParams::default());
    let addr = SocketAddr::new(config.host, config.port);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    let state = Arc::new(AppState {
        requests: Arc::new(Semaphore::new(config.max_concurrent_requests)),
        inflight_kib: Arc::new(Semaphore::new(
            config
                .max_inflight_bytes
                .div_ceil(1024)
                .min(Semaphore::MAX_PERMITS),
        )),
        embedder,
        batcher,
        queries,
        metrics,
        config,
        identity,
        started: Instant::now(),
        nudge,
    });
    let info = state.embedder.info();
    eprintln!(
        "recall serve: {} ({} dims, up to {} tokens per input) as {:?} on http://{local}",
        info.dir.display(),
        info.dense_dim,
        info.max_length,
        state.config.served_model_name
    );
    // Tests and scripts read the address from this line.
    println!("listening on http://{local}");
    accept(listener, router(state.clone()), state.config.header_timeout).await;
    state.batcher.close();
    state.queries.close();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(thread) = watcher {
        let _ = thread.join();
    }
    eprintln!("recall serve: stopped");
    Ok(())
}

/// Serves each connection of `listener` with `app` (HTTP/1.1) until SIGINT
/// or SIGTERM, then waits for the requests in flight. A client that takes
/// longer than `header_timeout` to send a request's headers is disconnected.
async fn accept(listener: tokio::net::TcpListener, app: Router, header_timeout: Duration) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(shutdown_signal());
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors and the like: pass, and take the next.
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        // Replies go out at once: with Nagle's algorithm, a response written in two
        // parts waits for the client's delayed ACK (~40 ms on loopback).
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            |r: axum::http::Request<hyper::body::Incoming>| r.map(axum::body::Body::new),
        ));
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection: {e}");
            }
        });
    }
    graceful.shutdown().await;
}

async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {},
        _ = terminate => {},
    }
    eprintln!("recall serve: finishing the requests in flight");
}

/// Nanoseconds, as Ollama reports durations.
pub fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}
