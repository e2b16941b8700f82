//! The middleware in front of every route: what a web page could abuse
//! (the `Host` a server without an API key answers to, JSON bodies only),
//! the API key (compared in constant time; `/health` open), then admission: the body read whole
//! within a bytes-in-flight budget and a timeout, then a request slot (429
//! when none is free). `/health` needs neither.

use axum::extract::{MatchedPath, Request, State};
use std::time::Instant;

use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;
use tokio::sync::OwnedSemaphorePermit;

use super::{ApiError, AppState, Dialect, Shared};

/// Keeps web pages out. A page the user visits can send requests to
/// localhost, and by DNS rebinding read the answers under its own name: a
/// server without an API key answers only requests that name it as a
/// loopback address, `localhost`, its `--host` or an `--allow-host` name.
/// And a page can send a POST without asking first only as a form or plain
/// text: every POST must be `application/json`, which it cannot send
/// without a CORS preflight, which this server never grants.
pub(super) async fn same_origin(
    State(state): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
    let dialect = Dialect::of_path(request.uri().path());
    let keyless = state.config.api_key.as_deref().is_none_or(str::is_empty);
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}").to_string())
        .or_else(|| request.uri().authority().map(|a| a.to_string()));
    if let Some(host) = host.filter(|h| keyless && !host_allowed(h, &state.config)) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "this server answers requests for localhost only, not for Host {host:?} \
                 (a web page could reach it under another name); set --allow-host NAME to accept a name"
            ),
        )
        .code("host_not_allowed")
        .render(dialect);
    }
    if request.method() == axum::http::Method::POST {
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the body as JSON with `Content-Type: application/json`",
            )
            .code("unsupported_media_type")
            .render(dialect);
        }
    }
    next.run(request).await
}

/// Whether `host` (a `Host` header: a name or address, perhaps with a port)
/// names this server as a keyless server may be named.
fn host_allowed(host: &str, config: &super::ServeConfig) -> bool {
    let host = host.trim();
    // `[::1]:11435`, `127.0.0.1:11435`, `localhost`.
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                host
            }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = name.parse::<std::net::IpAddr>() {
        return ip.is_loopback() || ip == config.host;
    }
    config
        .allowed_hosts
        .iter()
        .any(|allowed| allowed.trim_end_matches('.').eq_ignore_ascii_case(&name))
}

pub(super) async fn authorize(
    State(state): State<Shared>,
    request: Request,
    next: Next,
) -> Response {
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
pub(super) async fn admit(State(state): State<Shared>, request: Request, next: Next) -> Response {
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
    let headers = request.headers();
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let has_body =
        declared.is_some_and(|n| n > 0) || headers.contains_key(header::TRANSFER_ENCODING);
    // Every route that takes a body is a POST: any other request with one
    // is refused unread (its connection is then closed).
    if has_body && request.method() != axum::http::Method::POST {
        return Err(ApiError::bad_request(format!(
            "{} {path}: only POST requests take a body here, and this one has one",
            request.method()
        ))
        .code("body_not_allowed"));
    }
    if path == "/health" {
        return Ok(next.run(request).await);
    }
    if declared.is_some_and(|n| n > max_body) {
        return Err(too_large(max_body));
    }
    // A body that could not be held beside those in flight now is told to
    // come back, before it is sent.
    if declared.is_some_and(|n| kib(n) as usize > state.inflight_kib.available_permits()) {
        return Err(no_budget(state));
    }
    let (parts, body) = request.into_parts();
    let timeout = state.config.body_timeout;
    let (bytes, _budget) = tokio::time::timeout(timeout, read_body(state, body))
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    timeout.as_secs()
                ),
            )
        })??;
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

/// KiB, rounded up, as the bytes-in-flight budget counts.
fn kib(bytes: usize) -> u32 {
    bytes.div_ceil(1024).min(u32::MAX as usize) as u32
}

/// Reads `body` whole, taking from the bytes-in-flight budget what has
/// arrived as it arrives: a client that declares a large body, or sends
/// chunked headers and then nothing, holds nothing it has not sent. The
/// budget taken is returned with the bytes, held until the answer is made.
async fn read_body(
    state: &AppState,
    mut body: axum::body::Body,
) -> Result<(axum::body::Bytes, Option<OwnedSemaphorePermit>), ApiError> {
    use http_body_util::BodyExt;
    let max_body = state.config.max_body_bytes;
    let mut read: Vec<u8> = Vec::new();
    let mut budget: Option<OwnedSemaphorePermit> = None;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if read.len() + data.len() > max_body {
            return Err(too_large(max_body));
        }
        read.extend_from_slice(&data);
        let held = budget.as_ref().map_or(0, |b| b.num_permits() as u32);
        let more = kib(read.len()).saturating_sub(held);
        if more > 0 {
            let taken = state
                .inflight_kib
                .clone()
                .try_acquire_many_owned(more)
                .map_err(|_| no_budget(state))?;
            match &mut budget {
                Some(held) => held.merge(taken),
                None => budget = Some(taken),
            }
        }
    }
    Ok((read.into(), budget))
}

fn too_large(max_body: usize) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the request body is larger than this server's limit of {max_body} bytes (--max-body-bytes)"
        ),
    )
}

fn no_budget(state: &AppState) -> ApiError {
    ApiError::retry(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "too many request bytes in flight (limit {} bytes, --max-inflight-bytes): retry shortly",
            state.config.max_inflight_bytes
        ),
    )
}
