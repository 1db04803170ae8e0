//! The webhook's routes and handlers; [`crate::serve`] runs them over TLS.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use runpod_certs::ReloadingCertResolver;

use crate::admission::admit;
use crate::cluster::ClusterView;
use crate::metrics::{Metrics, Outcome};
use crate::policy::PolicyConfig;
use crate::review::{BadReview, MAX_REVIEW_BYTES, encode};

const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a request handler needs.
pub struct AppState<C> {
    pub cluster: C,
    pub policy: PolicyConfig,
    pub metrics: Metrics,
    /// The serving certificate, for its expiry metric.
    pub certificate: Arc<ReloadingCertResolver>,
    /// Set once shutdown began: `/readyz` fails so endpoints stop routing here, while reviews
    /// that still arrive are answered.
    draining: AtomicBool,
}

impl<C: ClusterView> AppState<C> {
    pub fn new(cluster: C, policy: PolicyConfig, certificate: Arc<ReloadingCertResolver>) -> Self {
        Self {
            cluster,
            policy,
            metrics: Metrics::default(),
            certificate,
            draining: AtomicBool::new(false),
        }
    }

    /// From now on `/readyz` answers 503.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
    }
}

/// Where reviews are posted.
pub(crate) const MUTATE_PATH: &str = "/mutate";

/// The webhook's routes: `POST /mutate`, `/healthz`, `/readyz`, `/metrics`. The listener sends
/// `POST /mutate` to [`mutate`] itself; the route stays for other callers of the router.
pub fn router<C: ClusterView>(state: Arc<AppState<C>>) -> Router {
    Router::new()
        .route(
            MUTATE_PATH,
            post(|State(state), body| mutate::<C>(state, body)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<C>))
        .route("/metrics", get(metrics::<C>))
        .with_state(state)
}

/// Answers one review.
pub(crate) async fn mutate<C: ClusterView>(state: Arc<AppState<C>>, body: Body) -> Response {
    let started = Instant::now();
    let bytes = match tokio::time::timeout(
        BODY_READ_TIMEOUT,
        axum::body::to_bytes(body, MAX_REVIEW_BYTES),
    )
    .await
    {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(error)) => Err(body_error(&error)),
        Err(_) => Err(BadReview::Unreadable(format!(
            "the body did not arrive within {BODY_READ_TIMEOUT:?}"
        ))),
    };
    let result = match bytes {
        Ok(bytes) => admit(&bytes, &state.cluster, &state.policy).await,
        Err(error) => Err(error),
    };
    let (response, outcome) = match result {
        Ok((response, outcome)) => {
            let body = encode(&response);
            (json_response(StatusCode::OK, body), outcome)
        }
        Err(error) => {
            tracing::info!(%error, "bad admission request");
            let body = json!({ "error": error.to_string() })
                .to_string()
                .into_bytes();
            (
                json_response(StatusCode::BAD_REQUEST, body),
                Outcome::Invalid,
            )
        }
    };
    state.metrics.record(outcome, started.elapsed());
    response
}

fn body_error(error: &axum::Error) -> BadReview {
    let too_large = std::error::Error::source(error)
        .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
    if too_large {
        BadReview::TooLarge
    } else {
        BadReview::Unreadable(error.to_string())
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn readyz<C: ClusterView>(State(state): State<Arc<AppState<C>>>) -> Response {
    if state.draining.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    } else if state.cluster.synced() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response()
    }
}

async fn metrics<C: ClusterView>(State(state): State<Arc<AppState<C>>>) -> Response {
    // Read at scrape time, so the value follows every reload.
    state
        .metrics
        .set_certificate_expiry(state.certificate.not_after());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}
