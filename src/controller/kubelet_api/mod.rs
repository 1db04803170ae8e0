//! The kubelet API the apiserver calls for `kubectl logs`: container logs streamed from the
//! cloud; `kubectl exec` and `port-forward` over the pod's SSH (`exec`; attach is 501); and for
//! metrics-server `/stats/summary`
//! and `/metrics/resource`, the usage the cloud reports (`stats`). Callers are authenticated
//! and authorized like a kubelet in webhook mode, because logs often carry secrets: a client
//! certificate from the cluster CA (or `--kubelet-client-ca`), or a bearer token the apiserver
//! vouches for (`authn`); anonymous requests get 401. Then a SubjectAccessReview for
//! `nodes/proxy` (or `log`, `stats`, `metrics`) on this node; denied requests get 403
//! (`authz`). Nothing here shows env values or keys.

pub(crate) mod authn;
pub(crate) mod authz;
pub mod exec;
mod listener;
mod logs;
pub mod serving;
pub(crate) mod spdy;
pub(crate) mod stats;

use crate::controller::cached::PodStore;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;

use crate::controller::context::Shared;
use crate::provider::Provider;
use authn::Authenticator;
use authz::Authorizer;

struct ApiState<P> {
    shared: Arc<Shared<P>>,
    pods: PodStore,
    /// The controller's own metrics, as on the plain listener.
    registry: Arc<prometheus_client::registry::Registry>,
}

/// TLS settings: the serving certificate (swappable: `serving`) and the CA that client
/// certificates must chain to.
pub fn server_config(
    serving: Arc<serving::ServingCert>,
    client_ca: RootCertStore,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    // Unauthenticated handshakes are let through so that they get a clear 401, not a TLS error.
    let verifier = WebPkiClientVerifier::builder(Arc::new(client_ca))
        .allow_unauthenticated()
        .build()?;
    let mut config = rustls::ServerConfig::builder_with_protocol_versions(&[
        &rustls::version::TLS13,
        &rustls::version::TLS12,
    ])
    .with_client_cert_verifier(verifier)
    .with_cert_resolver(serving);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

fn router<P: Provider>(
    state: Arc<ApiState<P>>,
    authenticator: Arc<Authenticator<kube::Client>>,
    authorizer: Arc<Authorizer<kube::Client>>,
) -> Router {
    Router::new()
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::container_logs::<P>),
        )
        .route("/stats/summary", get(stats_summary::<P>))
        .route("/metrics/resource", get(resource_metrics::<P>))
        // The controller's metrics, for scrapers that must authenticate (as kube-rbac-proxy
        // guards them): authorized as `get nodes/metrics`, like a kubelet's `/metrics`.
        .route("/metrics", get(controller_metrics::<P>))
        // POST only, as the apiserver sends them (authz refuses other methods first).
        .route("/exec/{namespace}/{pod}/{container}", post(exec::exec::<P>))
        .route(
            "/portForward/{namespace}/{pod}",
            post(exec::port_forward::<P>),
        )
        .route("/attach/{*rest}", post(exec::attach))
        .route("/run/{*rest}", post(not_implemented::<P>))
        .with_state(state)
        // Every path, unknown ones included, is authenticated and authorized first.
        .layer(middleware::from_fn_with_state(
            authorizer,
            authz::authorize::<kube::Client>,
        ))
        // Before that, a bearer token (metrics-server's) names the user of a request without a
        // client certificate.
        .layer(middleware::from_fn_with_state(
            authenticator,
            authn::authenticate::<kube::Client>,
        ))
}

/// `GET /stats/summary`: the Summary API document of the pods with a live report.
async fn stats_summary<P: Provider>(State(state): State<Arc<ApiState<P>>>) -> Response {
    let summary = {
        let ledger = state.shared.usage_ledger();
        stats::summary(
            &state.shared.settings.node_name,
            ledger.node(),
            &ledger.live(),
        )
    };
    axum::Json(summary).into_response()
}

/// `GET /metrics/resource`: the Prometheus text metrics-server scrapes.
async fn resource_metrics<P: Provider>(State(state): State<Arc<ApiState<P>>>) -> Response {
    let text = {
        let ledger = state.shared.usage_ledger();
        stats::resource_metrics(ledger.node(), &ledger.live())
    };
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, stats::PROMETHEUS_TEXT)],
        text,
    )
        .into_response()
}

async fn controller_metrics<P: Provider>(State(state): State<Arc<ApiState<P>>>) -> Response {
    crate::controller::ops::encoded(&state.registry)
}

async fn not_implemented<P: Provider>(State(state): State<Arc<ApiState<P>>>) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "runpod-kubelet: this path is not served: the container runs on {}; exec is /exec/NAMESPACE/POD/CONTAINER and port-forward /portForward/NAMESPACE/POD\n",
            state.shared.provider.cloud().title
        ),
    )
        .into_response()
}

/// Serves the kubelet API until the task is dropped.
pub(crate) async fn serve<P: Provider>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    shared: Arc<Shared<P>>,
    pods: PodStore,
    registry: Arc<prometheus_client::registry::Registry>,
) {
    let authorizer = Arc::new(Authorizer::new(
        shared.client.clone(),
        shared.settings.node_name.clone(),
    ));
    let authenticator = Arc::new(Authenticator::new(shared.client.clone()));
    let app = router(
        Arc::new(ApiState {
            shared,
            pods,
            registry,
        }),
        authenticator,
        authorizer,
    );
    listener::serve(listener, tls, app, listener::Limits::default()).await;
}
