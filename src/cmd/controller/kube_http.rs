//! The Kubernetes client, built as kube builds it but with bounded HTTP/1.1 connections.
//!
//! kube's own client keeps every connection it ever opened to the apiserver (no idle limit)
//! and lets each one's read buffer grow to hyper's 400 KiB: with a hundred reconcile workers
//! that was 12 MiB of a 1,000-pod controller's 46 MiB heap (heap profile, issue 47). Here at
//! most [`MAX_IDLE`] idle connections are kept, and a read buffer stops at [`MAX_BUFFER`]
//! (a larger response is read in more pieces). The rest is kube's: its TLS, auth, headers,
//! timeouts and retries of 429s and 5xx; not its per-request debug spans.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt as _;
use tower::ServiceBuilder;

/// Idle connections kept to the apiserver; more are opened while more calls run at once.
const MAX_IDLE: usize = 16;
/// An idle connection is closed after this long.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest read buffer of one connection.
const MAX_BUFFER: usize = 64 * 1024;

/// The client for `config`; a kubeconfig's own `proxy-url` leaves it to kube's builder, which
/// knows how to reach the apiserver through it.
pub(crate) fn client(config: kube::Config) -> anyhow::Result<kube::Client> {
    if config.proxy_url.is_some() {
        return Ok(kube::Client::try_from(config)?);
    }
    let mut connector = TimeoutConnector::new(config.rustls_https_connector()?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .pool_max_idle_per_host(MAX_IDLE)
        .pool_idle_timeout(IDLE_TIMEOUT)
        // Without a timer the pool closes an idle connection only when it next looks at it.
        .pool_timer(TokioTimer::new())
        .http1_max_buf_size(MAX_BUFFER)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}
