//! The HTTPS server: axum routes over rustls, HTTP/1.1 and h2, with timeouts so that no client
//! can hold a connection or a request forever.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission::admit;
use crate::cluster::ClusterView;
use crate::metrics::{Metrics, Outcome};
use crate::policy::PolicyConfig;
use crate::review::{BadReview, MAX_REVIEW_BYTES, encode};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything a request handler needs.
pub struct AppState<C> {
    pub cluster: C,
    pub policy: PolicyConfig,
    pub metrics: Metrics,
}

/// The webhook's routes: `POST /mutate`, `/healthz`, `/readyz`, `/metrics`.
pub fn router<C: ClusterView>(state: Arc<AppState<C>>) -> Router {
    Router::new()
        .route("/mutate", post(mutate::<C>))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz::<C>))
        .route("/metrics", get(metrics::<C>))
        .with_state(state)
}

async fn mutate<C: ClusterView>(State(state): State<Arc<AppState<C>>>, body: Body) -> Response {
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
    if state.cluster.synced() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response()
    }
}

async fn metrics<C: ClusterView>(State(state): State<Arc<AppState<C>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves, then drains connections.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()>,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    // ALPN already says which protocol the client speaks, so each connection goes straight to
    // the matching builder instead of sniffing its first bytes (auto::Builder wraps the stream
    // for that, on every read).
    let mut http1 = http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2.timer(TokioTimer::new());
    let builders = Arc::new((http1, http2));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let builders = Arc::clone(&builders);
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let tls_stream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(error)) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
            let io = TokioIo::new(tls_stream);
            let (http1, http2) = &*builders;
            let served = if h2 {
                watcher.watch(http2.serve_connection(io, service)).await
            } else {
                watcher.watch(http1.serve_connection(io, service)).await
            };
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {DRAIN_TIMEOUT:?}; closing them");
    }
}
