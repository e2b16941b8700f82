//! HTTP for the remote providers: timeouts, retries with jittered
//! exponential backoff on 429, 5xx, connection errors and bad answers,
//! `Retry-After` honoured, and a circuit breaker so that a dead provider is
//! not hammered (after `breaker_failures` failed attempts in a row it is
//! skipped for `breaker_cooldown`, then tried once again).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use serde_json::Value;

/// How hard to try; every field has a default and a `config.toml` key.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policy {
    /// Seconds for one request, connection to last byte.
    pub timeout_secs: f64,
    pub connect_timeout_secs: f64,
    /// Further attempts after a failed one.
    pub retries: u32,
    /// The first backoff; each next one doubles, with full jitter.
    pub backoff_ms: u64,
    pub max_backoff_secs: f64,
    pub breaker_failures: u32,
    pub breaker_cooldown_secs: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            timeout_secs: 120.0,
            connect_timeout_secs: 5.0,
            retries: 4,
            backoff_ms: 500,
            max_backoff_secs: 30.0,
            breaker_failures: 5,
            breaker_cooldown_secs: 30.0,
        }
    }
}

/// A failed attempt: whether trying again may help.
pub enum Failure {
    Retry {
        error: anyhow::Error,
        after: Option<Duration>,
    },
    Fatal(anyhow::Error),
}

struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
    last_error: String,
}

pub struct Client {
    name: String,
    agent: ureq::Agent,
    policy: Policy,
    breaker: Mutex<Breaker>,
}

impl Client {
    pub fn new(name: &str, policy: Policy) -> Self {
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(policy.timeout_secs)))
            .timeout_connect(Some(Duration::from_secs_f64(policy.connect_timeout_secs)))
            .http_status_as_error(false)
            .user_agent(concat!("recall/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Self {
            name: name.to_string(),
            agent,
            policy,
            breaker: Mutex::new(Breaker {
                failures: 0,
                open_until: None,
                last_error: String::new(),
            }),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// GETs `url` once (no retries): for health checks.
    pub fn get_json(&self, url: &str, headers: &[(&str, String)]) -> Result<Value> {
        self.check_breaker()?;
        let mut request = self.agent.get(url);
        for (k, v) in headers {
            request = request.header(*k, v);
        }
        let outcome = match request.call() {
            Ok(response) => read(response),
            Err(e) => Err(transport(e)),
        }
        .map_err(|f| match f {
            Failure::Retry { error, .. } | Failure::Fatal(error) => error,
        });
        self.record(outcome.as_ref().err());
        outcome
    }

    /// POSTs `body` to `url` and hands the JSON answer to `accept`, which
    /// checks it; retries as the policy says. Nothing `accept` refused is
    /// returned. On `first_contact`, a refused connection is final: nothing
    /// listens there, and the next provider should be tried at once.
    pub fn post_json<T>(
        &self,
        url: &str,
        headers: &[(&str, String)],
        body: &Value,
        first_contact: bool,
        accept: impl Fn(Value) -> Result<T>,
    ) -> Result<T> {
        let retries = self.policy.retries;
        let body = body.to_string();
        let mut attempt = 0;
        loop {
            self.check_breaker()?;
            let mut request = self
                .agent
                .post(url)
                .header("Content-Type", "application/json");
            for (k, v) in headers {
                request = request.header(*k, v);
            }
            let outcome = match request.send(&body) {
                Ok(response) => read(response).and_then(|json| {
                    accept(json).map_err(|error| Failure::Retry {
                        error: error.context("a wrong answer, not stored"),
                        after: None,
                    })
                }),
                Err(ureq::Error::Io(e))
                    if first_contact && e.kind() == std::io::ErrorKind::ConnectionRefused =>
                {
                    Err(Failure::Fatal(anyhow!("{e}")))
                }
                Err(e) => Err(transport(e)),
            };
            self.record(outcome.as_ref().err().map(|f| match f {
                Failure::Retry { error, .. } | Failure::Fatal(error) => error,
            }));
            let (error, after) = match outcome {
                Ok(value) => return Ok(value),
                Err(Failure::Fatal(error)) => return Err(error),
                Err(Failure::Retry { error, after }) => (error, after),
            };
            if attempt >= retries {
                return Err(error.context(format!("failed {} times in a row", attempt + 1)));
            }
            let wait = after.unwrap_or_else(|| self.backoff(attempt));
            let wait = wait.min(Duration::from_secs_f64(self.policy.max_backoff_secs));
            tracing::warn!(
                "{}: {error:#}; retrying in {:.1}s (attempt {} of {})",
                self.name,
                wait.as_secs_f64(),
                attempt + 2,
                retries + 1
            );
            std::thread::sleep(wait);
            attempt += 1;
        }
    }

    /// Full jitter: a random wait up to base × 2^attempt.
    fn backoff(&self, attempt: u32) -> Duration {
        let cap = self.policy.backoff_ms as f64 * 2f64.powi(attempt.min(20) as i32);
        Duration::from_secs_f64(fastrand::f64() * cap / 1000.0)
    }

    fn check_breaker(&self) -> Result<()> {
        let mut b = self.breaker.lock().unwrap();
        if let Some(until) = b.open_until {
            let now = Instant::now();
            if now < until {
                bail!(
                    "skipped for {:.0} s more: it failed {} times in a row (circuit open); last: {}",
                    (until - now).as_secs_f64().ceil(),
                    b.failures,
                    b.last_error
                );
            }
            // Half open: this attempt decides.
            b.open_until = None;
            b.failures = self.policy.breaker_failures.saturating_sub(1);
        }
        Ok(())
    }

    fn record(&self, error: Option<&anyhow::Error>) {
        let mut b = self.breaker.lock().unwrap();
        if let Some(error) = error {
            b.last_error = format!("{error:#}");
            b.failures += 1;
            if b.failures >= self.policy.breaker_failures {
                b.open_until = Some(
                    Instant::now() + Duration::from_secs_f64(self.policy.breaker_cooldown_secs),
                );
            }
        } else {
            b.failures = 0;
            b.open_until = None;
        }
    }
}

/// The JSON of a response, or why not.
fn read(mut response: ureq::http::Response<ureq::Body>) -> Result<Value, Failure> {
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    let text = response
        .body_mut()
        .with_config()
        .limit(512 << 20)
        .read_to_string()
        .map_err(|e| Failure::Retry {
            error: anyhow!("the answer was cut off: {e}"),
            after: None,
        })?;
    if (200..300).contains(&status) {
        return serde_json::from_str(&text).map_err(|e| Failure::Retry {
            error: anyhow!("the answer is not JSON ({e}): {}", clip(&text)),
            after: None,
        });
    }
    let message = error_message(&text);
    let error = anyhow!("HTTP {status}: {message}");
    match status {
        408 | 425 | 429 | 500..=599 => Err(Failure::Retry {
            error,
            after: retry_after,
        }),
        401 | 403 => Err(Failure::Fatal(error.context(
            "the API key was refused (set it in config.toml's api_key_env variable, never printed)",
        ))),
        _ => Err(Failure::Fatal(error)),
    }
}

fn transport(e: ureq::Error) -> Failure {
    Failure::Retry {
        error: anyhow!("{e}"),
        after: None,
    }
}

/// OpenAI's `{"error": {"message": ...}}`, Ollama's `{"error": "..."}`, or the text.
fn error_message(text: &str) -> String {
    let json: Option<Value> = serde_json::from_str(text).ok();
    json.as_ref()
        .and_then(|j| {
            j["error"]["message"]
                .as_str()
                .or(j["error"].as_str())
                .or(j["message"].as_str())
        })
        .map(str::to_string)
        .unwrap_or_else(|| clip(text))
}

fn clip(text: &str) -> String {
    let t = text.trim();
    match t.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &t[..i]),
        None => t.to_string(),
    }
}

/// `Retry-After` in seconds, or as an HTTP date.
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_in_seconds_and_as_a_date() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.5"), Some(Duration::from_millis(500)));
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("soon"), None);
        let past = parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(past, Some(Duration::ZERO));
        let later = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(90));
        let d = parse_retry_after(&later).unwrap();
        assert!(
            d > Duration::from_secs(80) && d <= Duration::from_secs(90),
            "{d:?}"
        );
    }

    #[test]
    fn error_messages_of_each_api() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key"}}"#),
            "bad key"
        );
        assert_eq!(
            error_message(r#"{"error":"model not found"}"#),
            "model not found"
        );
        assert_eq!(error_message("plain"), "plain");
    }
}
