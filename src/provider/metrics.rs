//! Cloud API metrics, one set for every cloud and labelled by `provider`: requests by operation
//! and outcome (429s are the outcome `rate_limited`), their latency, and the client-side
//! limiter's state (requests left in each quota window, and how long the last call waited).
//! Both clouds are measured alike, so the alerts and the dashboard cover each of them.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    provider: &'static str,
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    provider: &'static str,
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WindowLabels {
    provider: &'static str,
    window: String,
}

/// The families, registered once per process.
#[derive(Debug)]
pub struct CloudApiMetrics {
    calls: Family<CallLabels, Counter>,
    latency: Family<OperationLabels, Histogram>,
    quota_remaining: Family<WindowLabels, Gauge>,
    limiter_delay: Family<OperationLabels, Gauge<f64, AtomicU64>>,
}

impl CloudApiMetrics {
    /// Registers `cloud_api_requests`, `cloud_api_request_duration_seconds`,
    /// `cloud_api_quota_remaining` and `cloud_api_limiter_delay_seconds`.
    pub fn register(registry: &mut Registry) -> Arc<CloudApiMetrics> {
        let metrics = CloudApiMetrics {
            latency: Family::new_with_constructor(|| {
                // 5 ms .. ~80 s
                Histogram::new(exponential_buckets(0.005, 2.0, 15))
            }),
            calls: Family::default(),
            quota_remaining: Family::default(),
            limiter_delay: Family::default(),
        };
        registry.register(
            "cloud_api_requests",
            "Cloud API requests by provider, operation and outcome (ok, or the error kind: rate_limited is a 429)",
            metrics.calls.clone(),
        );
        registry.register(
            "cloud_api_request_duration_seconds",
            "Cloud API request latency by provider and operation, including the body",
            metrics.latency.clone(),
        );
        registry.register(
            "cloud_api_quota_remaining",
            "Requests the client-side limiter believes are left in each of the cloud's quota windows",
            metrics.quota_remaining.clone(),
        );
        registry.register(
            "cloud_api_limiter_delay_seconds",
            "How long the last call of each operation waited for the client-side limiter",
            metrics.limiter_delay.clone(),
        );
        Arc::new(metrics)
    }

    /// The handle one cloud's client records through.
    pub fn for_provider(self: &Arc<Self>, provider: &'static str) -> CloudApi {
        CloudApi {
            metrics: self.clone(),
            provider,
        }
    }
}

/// One cloud's view of [`CloudApiMetrics`].
#[derive(Debug, Clone)]
pub struct CloudApi {
    metrics: Arc<CloudApiMetrics>,
    provider: &'static str,
}

impl CloudApi {
    /// One finished call.
    pub fn record(&self, operation: &'static str, outcome: &'static str, elapsed: Duration) {
        let provider = self.provider;
        self.metrics
            .calls
            .get_or_create(&CallLabels {
                provider,
                operation,
                outcome,
            })
            .inc();
        self.metrics
            .latency
            .get_or_create(&OperationLabels {
                provider,
                operation,
            })
            .observe(elapsed.as_secs_f64());
    }

    /// Requests left in a quota window.
    pub fn quota(&self, window: &str, remaining: u32) {
        self.metrics
            .quota_remaining
            .get_or_create(&WindowLabels {
                provider: self.provider,
                window: window.to_owned(),
            })
            .set(i64::from(remaining));
    }

    /// How long a call waited for the limiter before it was sent.
    pub fn waited(&self, operation: &'static str, delay: Duration) {
        self.metrics
            .limiter_delay
            .get_or_create(&OperationLabels {
                provider: self.provider,
                operation,
            })
            .set(delay.as_secs_f64());
    }

    /// One example series in each family (for the generated metrics reference only).
    pub fn add_example_series(&self) {
        self.record("search", "ok", Duration::ZERO);
        self.quota("search/60s", 10);
        self.waited("search", Duration::ZERO);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cloud_is_recorded_under_its_own_provider_label() {
        let mut registry = Registry::with_prefix("runpod_kubelet");
        let metrics = CloudApiMetrics::register(&mut registry);
        metrics
            .for_provider("vastai")
            .record("search", "rate_limited", Duration::from_millis(20));
        metrics
            .for_provider("runpod")
            .record("listPods", "ok", Duration::from_millis(5));
        metrics.for_provider("vastai").quota("search/60s", 7);
        metrics
            .for_provider("vastai")
            .waited("create", Duration::from_millis(4600));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            r#"runpod_kubelet_cloud_api_requests_total{provider="vastai",operation="search",outcome="rate_limited"} 1"#,
            r#"runpod_kubelet_cloud_api_requests_total{provider="runpod",operation="listPods",outcome="ok"} 1"#,
            r#"runpod_kubelet_cloud_api_quota_remaining{provider="vastai",window="search/60s"} 7"#,
            r#"runpod_kubelet_cloud_api_limiter_delay_seconds{provider="vastai",operation="create"} 4.6"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(text.contains(
            r#"runpod_kubelet_cloud_api_request_duration_seconds_count{provider="vastai",operation="search"} 1"#
        ));
    }
}
