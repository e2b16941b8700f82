//! recall's own routes: `POST /search` (session search, the `recall search
//! --json` schema, for the Hermes plugin), `GET /health`, `GET /info`,
//! `GET /metrics`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, Dialect, Shared, parse_body};
use crate::index::store::Store;
use crate::search::{self, Filters, Fusion, SearchOptions, Signals};

pub fn routes() -> Router<Shared> {
    Router::new()
        .route("/search", post(search_sessions))
        .route("/index", post(index_now))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/info", get(info))
        .route("/metrics", get(metrics))
}

/// One list of strings, sent as an array or as a comma-separated string.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum List {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl List {
    fn into_vec(self) -> Vec<String> {
        match self {
            List::None => Vec::new(),
            List::One(s) => s
                .split(',')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty())
                .collect(),
            List::Many(v) => v,
        }
    }
}

/// The body of `POST /search`: the options of `recall search`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchRequest {
    query: String,
    limit: Option<usize>,
    #[serde(default, alias = "role_filter")]
    roles: List,
    #[serde(default, alias = "sources")]
    source: List,
    since: Option<String>,
    until: Option<String>,
    session: Option<String>,
    profile: Option<String>,
    #[serde(default)]
    all_profiles: bool,
    fusion: Option<Fusion>,
    signals: Option<Signals>,
    min_score: Option<f32>,
    #[serde(default)]
    rerank: bool,
    mmr: Option<f32>,
    half_life: Option<f64>,
}

async fn search_sessions(State(state): State<Shared>, body: Bytes) -> Response {
    let result = async {
        let request: SearchRequest = parse_body(&body)?;
        let time = |t: Option<String>, field: &'static str| {
            t.as_deref()
                .map(search::parse_time)
                .transpose()
                .map_err(|e| ApiError::bad_request(format!("`{field}`: {e:#}")))
        };
        let defaults = SearchOptions::default();
        let options = SearchOptions {
            limit: request.limit.unwrap_or(defaults.limit),
            fusion: request.fusion.unwrap_or(defaults.fusion),
            signals: request.signals.unwrap_or(defaults.signals),
            min_score: request.min_score,
            rerank: request.rerank,
            mmr: request.mmr,
            half_life_days: request.half_life,
            scan: defaults.scan,
            ranking: defaults.ranking,
            filters: Filters {
                roles: request.roles.into_vec(),
                sources: request.source.into_vec(),
                since: time(request.since, "since")?,
                until: time(request.until, "until")?,
                session: request.session,
                profiles: match (request.profile, request.all_profiles) {
                    (Some(p), _) => vec![p],
                    (None, true) => Vec::new(),
                    (None, false) => vec!["default".into()],
                },
            },
        };
        let path = state.config.index.clone().ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "this server has no index: start it with --index PATH or --hermes-home DIR",
            )
        })?;
        if !path.is_file() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no index at {}: run `recall index` first", path.display()),
            ));
        }
        let provider =
            crate::provider::local::Local::from_embedder("local", None, state.embedder.clone());
        let query = request.query;
        // SQLite and the query's embedding are blocking work.
        let (hits, info) = tokio::task::spawn_blocking(move || {
            let store = Store::open_existing(&path)?;
            search::search(&store, Some(&provider), &query, &options)
        })
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| {
            let message = format!("{e:#}");
            let status = if message.contains("another model") {
                StatusCode::CONFLICT
            } else {
                StatusCode::BAD_REQUEST
            };
            ApiError::new(status, message)
        })?;
        Ok(json!({
            "success": true,
            "mode": info.mode,
            "count": hits.len(),
            "results": hits,
        }))
    }
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.render(Dialect::Recall),
    }
}

/// The Hermes plugin's nudge after each turn: index now rather than at the next poll.
async fn index_now(State(state): State<Shared>) -> Response {
    match &state.nudge {
        Some(nudge) => {
            nudge();
            (StatusCode::ACCEPTED, Json(json!({"status": "queued"}))).into_response()
        }
        None => ApiError::new(
            StatusCode::CONFLICT,
            "this server does not follow Hermes: start it with `recall serve --watch`",
        )
        .render(Dialect::Recall),
    }
}

async fn info(State(state): State<Shared>) -> Json<Value> {
    let info = state.embedder.info();
    let identity = &state.identity;
    Json(json!({
        "model_id": identity.model,
        "model_dir": info.dir,
        "revision": identity.revision,
        "served_model_name": state.config.served_model_name,
        "model_type": info.model_type,
        "dimension": info.dense_dim,
        "outputs": {"dense": true, "sparse": info.sparse, "colbert": info.colbert_dim.is_some()},
        "colbert_dimension": info.colbert_dim,
        "normalized": info.normalize,
        "device": match state.embedder.device() {
            d if d.is_cuda() => "cuda",
            d if d.is_metal() => "metal",
            _ => "cpu",
        },
        "max_input_length": info.max_length,
        "max_batch_tokens": state.config.max_batch_tokens,
        "max_client_batch_size": state.config.max_items,
        "max_concurrent_requests": state.config.max_concurrent_requests,
        "index": state.config.index,
        "watching": state.nudge.is_some(),
        "uptime_seconds": state.started.elapsed().as_secs_f64(),
        "version": env!("CARGO_PKG_VERSION"),
    }))
}

async fn metrics(State(state): State<Shared>) -> Response {
    state.metrics.queued.set(state.queued() as i64);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
