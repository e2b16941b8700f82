//! Prometheus metrics for `GET /metrics`: requests, inputs and tokens,
//! forward passes (inputs and tokens per pass), queue time and latency.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: String,
}

pub struct Metrics {
    registry: Registry,
    requests: Family<RouteLabels, Counter>,
    latency: Family<Route, Histogram>,
    inputs: Counter,
    tokens: Counter,
    pass_inputs: Histogram,
    pass_tokens: Histogram,
    pass_seconds: Histogram,
    queue_seconds: Histogram,
    pub queued: Gauge,
}

fn seconds_histogram() -> Histogram {
    // 1 ms … ~65 s
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("recall");
        let requests = Family::<RouteLabels, Counter>::default();
        registry.register(
            "requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        let latency = Family::<Route, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        registry.register(
            "request_duration_seconds",
            "Time from request to response, by route",
            latency.clone(),
        );
        let inputs = Counter::default();
        registry.register("inputs", "Inputs embedded", inputs.clone());
        let tokens = Counter::default();
        registry.register(
            "tokens",
            "Tokens embedded, special tokens included",
            tokens.clone(),
        );
        let pass_inputs = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "batch_inputs",
            "Inputs per forward pass",
            pass_inputs.clone(),
        );
        let pass_tokens = Histogram::new(exponential_buckets(8.0, 2.0, 14));
        registry.register(
            "batch_tokens",
            "Tokens per forward pass",
            pass_tokens.clone(),
        );
        let pass_seconds = seconds_histogram();
        registry.register(
            "batch_duration_seconds",
            "Time of one forward pass",
            pass_seconds.clone(),
        );
        let queue_seconds = seconds_histogram();
        registry.register(
            "queue_duration_seconds",
            "Time an input waited for its forward pass",
            queue_seconds.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "queue_inputs",
            "Inputs waiting for a forward pass",
            queued.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            inputs,
            tokens,
            pass_inputs,
            pass_tokens,
            pass_seconds,
            queue_seconds,
            queued,
        }
    }
}

impl Metrics {
    pub fn request(&self, route: &str, status: u16, took: Duration) {
        self.requests
            .get_or_create(&RouteLabels {
                route: route.to_string(),
                status,
            })
            .inc();
        self.latency
            .get_or_create(&Route {
                route: route.to_string(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn pass(&self, inputs: usize, tokens: usize, took: Duration) {
        self.inputs.inc_by(inputs as u64);
        self.tokens.inc_by(tokens as u64);
        self.pass_inputs.observe(inputs as f64);
        self.pass_tokens.observe(tokens as f64);
        self.pass_seconds.observe(took.as_secs_f64());
    }

    pub fn queue_seconds(&self, waited: Duration) {
        self.queue_seconds.observe(waited.as_secs_f64());
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
