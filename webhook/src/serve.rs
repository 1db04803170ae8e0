//! The HTTPS listener: rustls, HTTP/1.1 and h2 chosen by ALPN, with timeouts so that no client
//! can hold a connection or a request forever.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::cluster::ClusterView;
use crate::server::{AppState, router};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How the listener treats connections; [`Default`] is what the webhook flags default to.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// After the shutdown signal, how long to keep serving (with `/readyz` answering 503) so
    /// that endpoints stop routing reviews here before the listener closes.
    pub shutdown_drain: Duration,
    /// A connection with no request in flight for this long is closed (h2: GOAWAY).
    pub idle_timeout: Duration,
    /// At most this many connections at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// At most this many concurrent h2 streams (reviews in flight) per connection.
    pub max_concurrent_streams: u32,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            shutdown_drain: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_concurrent_streams: 32,
        }
    }
}

/// Serves the webhook's routes over TLS on `listener` until `shutdown` resolves, then drains
/// connections.
pub async fn serve_tls<C: ClusterView>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<AppState<C>>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let _ = options;
    let router = router(state);
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
