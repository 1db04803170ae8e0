//! Prometheus metrics of the webhook: admissions by outcome, and their latency.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// How an admission ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted with a patch.
    Mutated,
    /// Admitted unchanged.
    Unchanged,
    /// Refused by policy or validation.
    Rejected,
    /// The body was not a valid review (HTTP 400).
    Invalid,
    /// Refused because the cluster could not be read (retryable).
    Error,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Mutated => "mutated",
            Outcome::Unchanged => "unchanged",
            Outcome::Rejected => "rejected",
            Outcome::Invalid => "invalid",
            Outcome::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// The webhook's registry and the handles to record into it.
pub struct Metrics {
    registry: Registry,
    admissions: Family<OutcomeLabel, Counter>,
    latency: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("runpod_kubelet");
        let admissions = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "admissions",
            "Admission reviews answered, by outcome",
            admissions.clone(),
        );
        // 50 µs .. ~3.3 s
        let latency = Histogram::new(exponential_buckets(0.000_05, 3.0, 11));
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission review, from body read to response encoded",
            latency.clone(),
        );
        Self {
            registry,
            admissions,
            latency,
        }
    }
}

impl Metrics {
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        self.admissions
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str(),
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(error) = encode(&mut text, &self.registry) {
            tracing::error!(%error, "metrics encoding failed");
        }
        text
    }
}
