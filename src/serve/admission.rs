//! The middleware in front of every route: the API key (compared in
//! constant time; `/health` open), then admission: the body read whole
//! within a bytes-in-flight budget and a timeout, then a request slot (429
//! when none is free). `/health` needs neither.

use axum::extract::{MatchedPath, Request, State};
use std::time::Instant;

use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::ConstantTimeEq;

use super::{ApiError, AppState, Dialect, Shared};

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
