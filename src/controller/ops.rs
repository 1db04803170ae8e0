//! `/healthz`, `/readyz` (pod cache synced and the cloud's API answering) and `/metrics`, over
//! plain HTTP on `--metrics-listen`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use super::context::Shared;
use super::node::ApiHealth;

struct OpsState<P> {
    registry: Arc<Registry>,
    pods: Store<Pod>,
    shared: Arc<Shared<P>>,
}

pub async fn serve<P: Send + Sync + 'static>(
    listener: TcpListener,
    registry: Arc<Registry>,
    pods: Store<Pod>,
    shared: Arc<Shared<P>>,
) {
    let state = Arc::new(OpsState {
        registry,
        pods,
        shared,
    });
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready::<P>))
        .route("/metrics", get(metrics::<P>))
        .with_state(state);
    if let Err(error) = axum::serve(listener, app).await {
        tracing::error!(%error, "the metrics server stopped");
    }
}

async fn ready<P>(State(state): State<Arc<OpsState<P>>>) -> Response {
    let synced = futures_util::FutureExt::now_or_never(state.pods.wait_until_ready())
        .is_some_and(|ready| ready.is_ok());
    let listed = state.shared.latest().is_some();
    let reachable = matches!(*state.shared.health.borrow(), ApiHealth::Available);
    if synced && listed && reachable {
        (StatusCode::OK, "ok").into_response()
    } else {
        let reason = format!(
            "pod cache synced: {synced}, RunPod listed: {listed}, RunPod reachable: {reachable}"
        );
        (StatusCode::SERVICE_UNAVAILABLE, reason).into_response()
    }
}

async fn metrics<P>(State(state): State<Arc<OpsState<P>>>) -> Response {
    let mut text = String::new();
    match prometheus_client::encoding::text::encode(&mut text, &state.registry) {
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
