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

impl Policy {
    /// Every duration finite, non-negative and at most a day; names the key that is not.
    pub fn check(&self) -> Result<()> {
        let day = 86_400.0;
        for (key, value) in [
            ("timeout_secs", self.timeout_secs),
            ("connect_timeout_secs", self.connect_timeout_secs),
            ("max_backoff_secs", self.max_backoff_secs),
            ("breaker_cooldown_secs", self.breaker_cooldown_secs),
            ("backoff_ms", self.backoff_ms as f64 / 1000.0),
        ] {
            if !(value.is_finite() && (0.0..=day).contains(&value)) {
                bail!("{key} = {value} is not a number of seconds between 0 and one day");
            }
        }
        if self.timeout_secs == 0.0 || self.connect_timeout_secs == 0.0 {
            bail!("timeout_secs and connect_timeout_secs must be more than 0");
        }
        if self.retries > 100 {
            bail!("retries = {} is more than 100", self.retries);
        }
        Ok(())
    }
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

/// Marks an error where the provider refused the request itself (400, 404,
/// 413, 422: an input too long, a content filter): the provider works, this
/// input will never pass. `provider::Error::Rejected` carries it.
#[derive(Debug)]
pub struct Rejected;

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the provider refused the request")
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
    /// Half open: one trial request is in flight; the others wait for its outcome.
    probing: bool,
    last_error: String,
}

/// The longest `Retry-After` honoured: a server asking for more is treated as down.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

pub struct Client {
    name: String,
    agent: ureq::Agent,
    policy: Policy,
    breaker: Mutex<Breaker>,
    /// Never to appear in a message: the API key, as sent.
    secret: Option<String>,
}

impl Client {
    pub fn new(name: &str, policy: Policy, secret: Option<String>) -> Self {
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
                probing: false,
                last_error: String::new(),
            }),
            secret: secret.filter(|s| !s.is_empty()),
        }
    }

    /// `error` with the secret blanked out (a gateway may echo the request).
    fn redact(&self, error: anyhow::Error) -> anyhow::Error {
        match &self.secret {
            Some(secret) => {
                let text = format!("{error:#}");
                if text.contains(secret.as_str()) {
                    let redacted = anyhow!(text.replace(secret.as_str(), "***"));
                    if error.downcast_ref::<Rejected>().is_some() {
                        redacted.context(Rejected)
                    } else {
                        redacted
                    }
                } else {
                    error
                }
            }
            None => error,
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
            Failure::Retry { error, .. } | Failure::Fatal(error) => self.redact(error),
        });
        self.record(outcome.as_ref().err(), false);
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
            let (error, after) = match outcome {
                Ok(value) => {
                    self.record(None, false);
                    return Ok(value);
                }
                Err(Failure::Fatal(error)) => {
                    // The request was wrong, not the provider: the breaker is not moved.
                    let error = self.redact(error);
                    self.record(None, false);
                    return Err(error);
                }
                Err(Failure::Retry { error, after }) => (self.redact(error), after),
            };
            // A 429 is the provider working as it should: it says when, it is not down.
            self.record(Some(&error), after.is_some());
            if attempt >= retries {
                return Err(error.context(format!("failed {} times in a row", attempt + 1)));
            }
            let wait = match after {
                Some(asked) => asked.min(MAX_RETRY_AFTER),
                None => self
                    .backoff(attempt)
                    .min(Duration::from_secs_f64(self.policy.max_backoff_secs)),
            };
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
        if b.probing {
            bail!(
                "skipped: it failed {} times in a row and a trial request is deciding (circuit half open); last: {}",
                b.failures,
                b.last_error
            );
        }
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
            // Half open: this attempt alone decides.
            b.open_until = None;
            b.probing = true;
        }
        Ok(())
    }

    /// Records an attempt's outcome; `throttled` attempts (429 with
    /// `Retry-After`) neither count as failures nor as successes.
    fn record(&self, error: Option<&anyhow::Error>, throttled: bool) {
        let mut b = self.breaker.lock().unwrap();
        b.probing = false;
        if throttled {
            return;
        }
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
            "the API key was refused: check the variable named by api_key_env (or api_key) in config.toml",
        ))),
        400 | 404 | 413 | 422 => Err(Failure::Fatal(error.context(Rejected))),
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
        // Anything past the cap is the cap (and `1e20` must not overflow a Duration).
        return (seconds.is_finite() && seconds >= 0.0)
            .then(|| Duration::from_secs_f64(seconds.min(MAX_RETRY_AFTER.as_secs_f64())));
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
        assert_eq!(parse_retry_after("1e20"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("inf"), None);
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
