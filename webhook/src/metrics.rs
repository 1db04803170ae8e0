//! Prometheus metrics of the webhook: admissions by outcome, their latency, and when the served
//! certificate expires.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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
    const ALL: [Outcome; 5] = [
        Outcome::Mutated,
        Outcome::Unchanged,
        Outcome::Rejected,
        Outcome::Invalid,
        Outcome::Error,
    ];

    /// Its place in [`Outcome::ALL`] (a match, so a new outcome must be given one).
    const fn index(self) -> usize {
        match self {
            Outcome::Mutated => 0,
            Outcome::Unchanged => 1,
            Outcome::Rejected => 2,
            Outcome::Invalid => 3,
            Outcome::Error => 4,
        }
    }

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
    /// Each outcome's series of `admissions`, in [`Outcome::ALL`]'s order: a review counts
    /// without hashing its label into the family.
    by_outcome: [Counter; Outcome::ALL.len()],
    latency: Histogram,
    certificate_expiry: Gauge,
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
        // Every outcome from the start, at 0: an error ratio needs its series before the first
        // error, and a family without series is not exported at all.
        let by_outcome = Outcome::ALL.map(|outcome| {
            admissions
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.as_str(),
                })
                .clone()
        });
        let certificate_expiry = Gauge::default();
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "notAfter of the serving certificate in use (Unix seconds; 0 if unreadable)",
            certificate_expiry.clone(),
        );
        Self {
            registry,
            by_outcome,
            latency,
            certificate_expiry,
        }
    }
}

impl Metrics {
    pub fn record(&self, outcome: Outcome, elapsed: Duration) {
        if let Some(counter) = self.by_outcome.get(outcome.index()) {
            counter.inc();
        }
        self.latency.observe(elapsed.as_secs_f64());
    }

    /// Records the served certificate's notAfter (Unix seconds), `None` if unknown.
    pub fn set_certificate_expiry(&self, not_after: Option<i64>) {
        self.certificate_expiry.set(not_after.unwrap_or(0));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_has_its_place() {
        for (place, outcome) in Outcome::ALL.into_iter().enumerate() {
            assert_eq!(outcome.index(), place, "{outcome:?}");
        }
    }

    #[test]
    fn each_outcome_counts_in_its_own_series() {
        let metrics = Metrics::default();
        for (times, outcome) in Outcome::ALL.into_iter().enumerate() {
            for _ in 0..=times {
                metrics.record(outcome, Duration::from_micros(10));
            }
        }
        let text = metrics.render();
        for (times, outcome) in Outcome::ALL.into_iter().enumerate() {
            let series = format!(
                "runpod_kubelet_admissions_total{{outcome=\"{}\"}} {}",
                outcome.as_str(),
                times + 1
            );
            assert!(text.contains(&series), "{series} in\n{text}");
        }
    }
}
