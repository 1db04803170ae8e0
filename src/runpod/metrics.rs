//! Prometheus metrics of RunPod API use: calls by operation and outcome (429s included),
//! their latency, and what the limiter believes is left of each quota window. Recorded in the
//! provider-labelled `cloud_api_*` families, and for one more release also in the older
//! `runpod_api_*` ones (RunPod only), so that existing dashboards keep working.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::provider::metrics::CloudApi;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WindowLabel {
    window: String,
}

/// Handles into the registry the metrics were registered in.
#[derive(Debug, Clone)]
pub struct RunPodMetrics {
    calls: Family<CallLabels, Counter>,
    latency: Family<OperationLabel, Histogram>,
    quota_remaining: Family<WindowLabel, Gauge>,
    api: CloudApi,
}

impl RunPodMetrics {
    /// Registers the deprecated `runpod_api_requests`, `runpod_api_request_duration_seconds`
    /// and `runpod_api_quota_remaining` (under the registry's prefix); every call is recorded
    /// in `api` as well.
    pub fn register(registry: &mut Registry, api: CloudApi) -> Arc<RunPodMetrics> {
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "runpod_api_requests",
            "Deprecated (removed in the next release; use cloud_api_requests with provider=\"runpod\"): RunPod API requests by operation (spec operationId) and outcome (ok or the error kind, e.g. rate_limited)",
            calls.clone(),
        );
        let latency = Family::<OperationLabel, Histogram>::new_with_constructor(|| {
            // 5 ms .. ~80 s
            Histogram::new(exponential_buckets(0.005, 2.0, 15))
        });
        registry.register(
            "runpod_api_request_duration_seconds",
            "Deprecated (use cloud_api_request_duration_seconds): RunPod API request latency by operation, including the body",
            latency.clone(),
        );
        let quota_remaining = Family::<WindowLabel, Gauge>::default();
        registry.register(
            "runpod_api_quota_remaining",
            "Deprecated (use cloud_api_quota_remaining): requests the rate limiter believes are left in each RunPod quota window",
            quota_remaining.clone(),
        );
        Arc::new(RunPodMetrics {
            calls,
            latency,
            quota_remaining,
            api,
        })
    }

    pub(crate) fn record(&self, operation: &'static str, outcome: &'static str, elapsed: Duration) {
        self.api.record(operation, outcome, elapsed);
        self.calls
            .get_or_create(&CallLabels { operation, outcome })
            .inc();
        self.latency
            .get_or_create(&OperationLabel { operation })
            .observe(elapsed.as_secs_f64());
    }

    /// One example series in each family, so that an exposition lists every family (an empty
    /// family is not exported): for the generated metrics reference only.
    pub fn add_example_series(&self) {
        self.record("listPods", "ok", Duration::ZERO);
        self.quota(&[("minute".to_string(), 60, 60)]);
    }

    /// How long a call waited for the limiter.
    pub(crate) fn waited(&self, operation: &'static str, delay: Duration) {
        self.api.waited(operation, delay);
    }

    pub(crate) fn quota(&self, windows: &[(String, u32, u32)]) {
        for (window, _, remaining) in windows {
            self.api.quota(window, *remaining);
            self.quota_remaining
                .get_or_create(&WindowLabel {
                    window: window.clone(),
                })
                .set(i64::from(*remaining));
        }
    }
}
