//! `recall serve`: the embedding model over HTTP, in the shapes that OpenAI,
//! Ollama and text-embeddings-inference clients already speak, plus recall's
//! session search.
//!
//! A thin layer: each API module (`openai`, `ollama`, `tei`, `recall_api`)
//! turns its request shape into inputs and its answer back into its own
//! shape, errors included; all of them embed through one `Batcher`, which
//! packs concurrent requests into shared forward passes. This module holds
//! the server's configuration, shared state, router and accept loop with
//! graceful shutdown; `inputs` the shared input checks, `error` the error
//! type, `admission` the API-key and concurrency middleware.

mod admission;
mod batcher;
mod error;
mod inputs;
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
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use tokio::sync::Semaphore;

use admission::{admit, authorize, same_origin};
pub use batcher::{BatchError, Batcher};
pub use error::{ApiError, Dialect};
pub use inputs::{Inputs, parse_body};
pub use metrics::Metrics;

use crate::space::Identity;
use recall_engine::Embedder;

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
    /// Host names, besides loopback ones and `host`, that requests to a
    /// server without an API key may name (a local proxy's).
    pub allowed_hosts: Vec<String>,
    /// The name the model announces (`--served-model-name`, else its short name).
    pub served_model_name: String,
    /// Other names it answers to: its repository's id, and `bge-m3` and
    /// `BAAI/bge-m3` for a BGE-M3 model (`model_names`).
    pub model_aliases: Vec<String>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Request bodies held at once across requests, bytes; more get 503.
    pub max_inflight_bytes: usize,
    /// Connections open at once from one address; more are answered 503 and closed.
    pub max_connections_per_client: usize,
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
            || self.max_connections_per_client == 0
        {
            bail!(
                "--max-items, --max-concurrent-requests, --max-queue, --max-body-bytes and \
                 --max-connections-per-client must be at least 1"
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
    /// Wakes the watcher (`POST /index`), when the server runs one beside it.
    pub nudge: Option<Nudge>,
    requests: Arc<Semaphore>,
    /// Request bodies in flight, in KiB.
    inflight_kib: Arc<Semaphore>,
}

type Shared = Arc<AppState>;

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
        .layer(middleware::from_fn_with_state(state.clone(), same_origin))
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Wakes an indexer that runs beside the server (`POST /index`).
pub type Nudge = Box<dyn Fn() + Send + Sync>;

/// Serves until SIGINT or SIGTERM, then finishes the requests in flight.
/// `nudge` wakes the indexer that the caller runs beside it, if any.
pub async fn serve(
    embedder: Arc<Embedder>,
    config: ServeConfig,
    nudge: Option<Nudge>,
) -> Result<()> {
    config.check()?;
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
    let names = state.model_names();
    let also = match &names[1..] {
        [] => String::new(),
        rest => format!(" (also {})", rest.join(", ")),
    };
    eprintln!(
        "recall serve: {} ({} dims, up to {} tokens per input) as {:?}{also} on http://{local}",
        info.dir.display(),
        info.dense_dim,
        info.max_length,
        state.config.served_model_name
    );
    // Tests and scripts read the address from this line.
    println!("listening on http://{local}");
    accept(listener, router(state.clone()), &state.config).await;
    state.batcher.close();
    state.queries.close();
    Ok(())
}

/// Serves each connection of `listener` with `app` (HTTP/1.1) until SIGINT
/// or SIGTERM, then waits for the requests in flight. A client that takes
/// longer than `header_timeout` to send a request's headers is disconnected;
/// one address holds at most `max_connections_per_client` connections.
async fn accept(listener: tokio::net::TcpListener, app: Router, config: &ServeConfig) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(config.header_timeout);
    let clients = Clients::new(config.max_connections_per_client);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(shutdown_signal());
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors and the like: pass, and take the next.
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let Some(client) = clients.admit(peer.ip()) else {
            refuse_connection(&stream, peer.ip(), config.max_connections_per_client);
            continue;
        };
        // Replies go out at once: with Nagle's algorithm, a response written in two
        // parts waits for the client's delayed ACK (~40 ms on loopback).
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            |r: axum::http::Request<hyper::body::Incoming>| r.map(axum::body::Body::new),
        ));
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            let _client = client;
            if let Err(e) = connection.await {
                tracing::debug!("connection: {e}");
            }
        });
    }
    graceful.shutdown().await;
}

/// Connections open per client address.
#[derive(Clone)]
struct Clients {
    open: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One open connection of a client, counted until dropped.
struct Client {
    clients: Clients,
    ip: IpAddr,
}

impl Clients {
    fn new(max: usize) -> Self {
        Self {
            open: Default::default(),
            max,
        }
    }

    /// A connection from `ip`, unless it has `max` open already.
    fn admit(&self, ip: IpAddr) -> Option<Client> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Client {
            clients: self.clone(),
            ip,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Tells a client over its connection limit why, as far as the socket
/// takes it without waiting, and closes the connection.
fn refuse_connection(stream: &tokio::net::TcpStream, ip: IpAddr, max: usize) {
    let body = serde_json::json!({"error": format!(
        "too many connections from {ip} (limit {max}, --max-connections-per-client): retry shortly"
    )})
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(response.as_bytes());
    tracing::debug!("refused a connection from {ip}: {max} open");
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

/// The names a model directory answers to, short name first: a snapshot of
/// the Hugging Face cache (`models--owner--name/snapshots/<revision>`) or a
/// directory named `owner__name` answers to `name` and `owner/name`, any
/// other directory to its own name; a BGE-M3 model (`bge_m3`) also to
/// `bge-m3` and `BAAI/bge-m3`.
pub fn model_names(dir: &std::path::Path, bge_m3: bool) -> Vec<String> {
    let file_name =
        |p: &std::path::Path| p.file_name().and_then(|n| n.to_str()).map(str::to_string);
    let in_hub_cache = dir
        .parent()
        .filter(|p| file_name(p).as_deref() == Some("snapshots"))
        .and_then(|p| p.parent())
        .and_then(file_name)
        .and_then(|n| n.strip_prefix("models--").map(|r| r.replacen("--", "/", 1)));
    let repo = in_hub_cache.or_else(|| {
        file_name(dir)?
            .split_once("__")
            .map(|(owner, name)| format!("{owner}/{name}"))
    });
    let mut names: Vec<String> = Vec::new();
    if bge_m3 {
        names.extend(["bge-m3".to_string(), "BAAI/bge-m3".to_string()]);
    }
    match repo {
        Some(repo) => {
            names.push(repo.rsplit('/').next().unwrap_or(&repo).to_string());
            names.push(repo);
        }
        None => names.extend(file_name(dir)),
    }
    if names.is_empty() {
        names.push("recall".into());
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// Nanoseconds, as Ollama reports durations.
pub fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// A vector written as JSON numbers, each f32 widened to f64 first: the
/// digits of the f64 nearest the f32, which every client parses back to the
/// same f32 (and which the routes have always written).
pub struct Floats(pub Vec<f32>);

impl serde::Serialize for Floats {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for &x in &self.0 {
            seq.serialize_element(&f64::from(x))?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_model_is_named_by_its_repository_where_its_path_tells_it() {
        let hub = Path::new("/c/hub/models--sentence-transformers--all-MiniLM-L6-v2/snapshots/abc");
        assert_eq!(
            model_names(hub, false),
            ["all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"]
        );
        let flat = Path::new("/m/sentence-transformers__all-MiniLM-L6-v2");
        assert_eq!(model_names(flat, false), model_names(hub, false));
        assert_eq!(model_names(Path::new("/m/my-model"), false), ["my-model"]);
        let bge = Path::new("/c/hub/models--BAAI--bge-m3/snapshots/5617a9f");
        assert_eq!(model_names(bge, true), ["bge-m3", "BAAI/bge-m3"]);
        assert_eq!(
            model_names(Path::new("/m/bge-m3-random"), true),
            ["bge-m3", "BAAI/bge-m3", "bge-m3-random"]
        );
    }
}
