//! The HTTPS listener: rustls, HTTP/1.1 and h2 chosen by ALPN, with bounds so that no client can
//! hold a connection, a request or the server's memory forever: handshake, header and body
//! timeouts, an idle timeout, h2 keep-alive, and limits on connections and h2 streams. Each
//! connection is served on one thread of a runtime per core ([`threads`]).

mod activity;
mod coalesce;
mod connection;
mod header_deadline;
mod threads;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::cluster::ClusterView;
use crate::server::{AppState, router};
use connection::{Builders, Connection};
use threads::ServingThreads;

/// h2 PING interval while a connection is open; a peer that does not answer within
/// [`KEEP_ALIVE_TIMEOUT`] is dropped.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for open connections to finish once the listener has closed (each connection
/// also bounds its own close).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(15);

/// How the listener treats connections; [`Default`] is what the webhook flags default to.
#[derive(Debug, Clone, PartialEq)]
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
    /// HTTP/1.1: a request whose headers take longer than this from its first byte closes the
    /// connection (slowloris); waiting between requests is the idle timeout's business.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            shutdown_drain: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 256,
            max_concurrent_streams: 32,
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves the webhook's routes over TLS on `listener` until `shutdown` resolves; then keeps
/// serving for the drain period with `/readyz` failing, and closes its connections.
pub async fn serve_tls<C: ClusterView>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<AppState<C>>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) {
    let (closing, closing_rx) = watch::channel(false);
    let mut server = Server {
        listener,
        slots: Arc::new(Semaphore::new(options.max_connections.max(1))),
        connections: JoinSet::new(),
        threads: ServingThreads::start(),
        template: Connection {
            acceptor: TlsAcceptor::from(tls),
            builders: Arc::new(builders(&options)),
            router: router(Arc::clone(&state)),
            state: Arc::clone(&state),
            closing: closing_rx,
            idle_timeout: options.idle_timeout,
            header_read_timeout: options.header_read_timeout,
        },
    };
    server.accept_until(shutdown).await;
    // Endpoints keep routing reviews here until they see the failing readiness probe; refusing
    // those connections would refuse pods during every rollout.
    state.begin_drain();
    tracing::info!(drain = ?options.shutdown_drain, "shutting down: not ready, still serving");
    server
        .accept_until(tokio::time::sleep(options.shutdown_drain))
        .await;
    tracing::info!("closing connections");
    server.close(&closing).await;
}

// ALPN already says which protocol the client speaks, so each connection goes straight to the
// matching builder instead of sniffing its first bytes (auto::Builder wraps the stream for that,
// on every read).
fn builders(options: &ServeOptions) -> Builders {
    // No timer for HTTP/1.1: hyper's header timeout would cost one per request; the connection
    // applies its own (`header_deadline`).
    let mut http1 = http1::Builder::new();
    http1.header_read_timeout(None);
    let mut http2 = http2::Builder::new(TokioExecutor::new());
    http2
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .max_concurrent_streams(options.max_concurrent_streams.max(1));
    Builders { http1, http2 }
}

struct Server<C> {
    listener: TcpListener,
    /// One permit per open connection.
    slots: Arc<Semaphore>,
    connections: JoinSet<()>,
    /// Where connections are served (see [`threads`]).
    threads: ServingThreads,
    template: Connection<C>,
}

impl<C: ClusterView> Server<C> {
    /// Accepts and serves connections until `until` resolves.
    async fn accept_until(&mut self, until: impl Future<Output = ()>) {
        tokio::pin!(until);
        loop {
            tokio::select! {
                () = &mut until => return,
                Some(ended) = self.connections.join_next(), if !self.connections.is_empty() => {
                    if let Err(error) = ended {
                        tracing::error!(%error, "connection task failed");
                    }
                }
                accepted = accept(&self.listener, &self.slots) => {
                    if let Some((tcp, peer, slot)) = accepted {
                        self.spawn(tcp, peer, slot);
                    }
                }
            }
        }
    }

    /// Serves a connection on its serving thread, or here when there is none.
    fn spawn(&mut self, tcp: TcpStream, peer: std::net::SocketAddr, slot: OwnedSemaphorePermit) {
        let connection = self.template.clone();
        let Some(placed) = self.threads.next() else {
            self.connections.spawn(async move {
                connection.serve(tcp, peer).await;
                drop(slot);
            });
            return;
        };
        match tcp.into_std() {
            Ok(tcp) => {
                let counted = placed.counted;
                let serve = async move {
                    threads::on_this_thread(tcp, |tcp| connection.serve(tcp, peer)).await;
                    drop((slot, counted));
                };
                self.connections.spawn_on(serve, &placed.runtime);
            }
            Err(error) => tracing::warn!(%error, %peer, "could not hand a connection over"),
        }
    }

    /// Stops accepting, asks every connection to close, and waits (bounded) until they have.
    async fn close(mut self, closing: &watch::Sender<bool>) {
        drop(self.listener);
        let _ = closing.send(true);
        let all_closed = async {
            while let Some(ended) = self.connections.join_next().await {
                if let Err(error) = ended {
                    tracing::error!(%error, "connection task failed");
                }
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, all_closed)
            .await
            .is_err()
        {
            tracing::warn!(
                open = self.connections.len(),
                "connections still open after {DRAIN_TIMEOUT:?}; dropping them"
            );
            self.connections.shutdown().await;
        }
        self.threads.stop().await;
    }
}

/// The next connection, once a slot is free; `None` after a failed accept.
async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> Option<(TcpStream, std::net::SocketAddr, OwnedSemaphorePermit)> {
    // Fails only once the semaphore is closed, which this server never does.
    let slot = Arc::clone(slots).acquire_owned().await.ok()?;
    match listener.accept().await {
        Ok((tcp, peer)) => {
            let _ = tcp.set_nodelay(true);
            Some((tcp, peer, slot))
        }
        Err(error) => {
            // Out of file descriptors and the like: wait instead of spinning.
            tracing::warn!(%error, "accept failed");
            tokio::time::sleep(Duration::from_millis(50)).await;
            None
        }
    }
}
