//! `/healthz`, `/readyz` and (unless `--metrics-plain=false`) `/metrics`, over plain HTTP on
//! `--metrics-listen`, on every replica. `/readyz` on the leader: our node exists, pod cache synced and the cloud's API
//! answering (a deleted node answers 503 until it is registered again). A standby is ready
//! (200, body `standby`), as Kubernetes controllers report their standbys: it is healthy and
//! waiting, and nothing routes requests to it (the apiserver reaches the kubelet API through
//! the node's address, which is the leader's).

use crate::controller::cached::PodStore;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::controller::context::Shared;
use crate::controller::node::health::ApiHealth;
use crate::controller::node::presence::NodeUid;

/// Readiness of the leader's work; `None` while this replica is a standby.
pub(crate) type LeaderReadiness = Option<Arc<dyn Fn() -> Result<(), String> + Send + Sync>>;

struct OpsState {
    /// `None`: `/metrics` is served only by the kubelet API (TLS, authorized).
    registry: Option<Arc<Registry>>,
    readiness: watch::Receiver<LeaderReadiness>,
}

pub(crate) async fn serve(
    listener: TcpListener,
    registry: Option<Arc<Registry>>,
    readiness: watch::Receiver<LeaderReadiness>,
) {
    let app = app(registry, readiness);
    if let Err(error) = axum::serve(listener, app).await {
        tracing::error!(%error, "the metrics server stopped");
    }
}

fn app(registry: Option<Arc<Registry>>, readiness: watch::Receiver<LeaderReadiness>) -> Router {
    let state = Arc::new(OpsState {
        registry,
        readiness,
    });
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// The leader's readiness: our node exists, pod cache synced, RunPod listed and reachable.
pub(crate) fn leader_ready<P: crate::provider::Provider>(
    pods: PodStore,
    shared: Arc<Shared<P>>,
    node_uid: NodeUid,
) -> Arc<dyn Fn() -> Result<(), String> + Send + Sync> {
    Arc::new(move || {
        let node = node_uid.borrow().is_some();
        let synced = futures_util::FutureExt::now_or_never(pods.wait_until_ready())
            .is_some_and(|ready| ready.is_ok());
        let listed = shared.latest().is_some();
        let reachable = matches!(*shared.health.borrow(), ApiHealth::Available);
        if node && synced && listed && reachable {
            Ok(())
        } else {
            Err(format!(
                "virtual node exists: {node}, pod cache synced: {synced}, {cloud} listed: {listed}, {cloud} reachable: {reachable}",
                cloud = shared.provider.cloud().title
            ))
        }
    })
}

async fn ready(State(state): State<Arc<OpsState>>) -> Response {
    let check = state.readiness.borrow().clone();
    match check {
        None => (StatusCode::OK, "standby").into_response(),
        Some(check) => match check() {
            Ok(()) => (StatusCode::OK, "ok").into_response(),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, reason).into_response(),
        },
    }
}

async fn metrics(State(state): State<Arc<OpsState>>) -> Response {
    match &state.registry {
        Some(registry) => encoded(registry),
        None => (
            StatusCode::NOT_FOUND,
            "runpod-kubelet: /metrics is served over TLS on the kubelet port (authorized as \
             get nodes/metrics), not here (--metrics-plain=false)\n",
        )
            .into_response(),
    }
}

/// The registry in the OpenMetrics text format.
pub(crate) fn encoded(registry: &Registry) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, registry) {
        Ok(()) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt as _;

    use super::*;

    async fn get(app: Router, path: &str) -> (StatusCode, String) {
        let response = app
            .oneshot(
                axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// `--metrics-plain=false`: the plain listener keeps the probes and serves no metrics,
    /// saying where they are.
    #[tokio::test]
    async fn plain_metrics_can_be_turned_off_while_the_probes_stay() {
        let mut registry = Registry::with_prefix("runpod_kubelet");
        let gauge = prometheus_client::metrics::gauge::Gauge::<i64>::default();
        registry.register("probe", "a test gauge", gauge);
        let registry = Arc::new(registry);
        let (_tx, readiness) = watch::channel(None);
        let on = app(Some(registry), readiness.clone());
        let (status, body) = get(on, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("runpod_kubelet_probe"), "{body}");
        let off = app(None, readiness);
        let (status, body) = get(off.clone(), "/metrics").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("kubelet port"), "{body}");
        assert_eq!(get(off.clone(), "/healthz").await.0, StatusCode::OK);
        assert_eq!(
            get(off, "/readyz").await,
            (StatusCode::OK, "standby".to_owned())
        );
    }
}
