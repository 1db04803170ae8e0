//! One client connection, from the TLS handshake to its close. A connection with no request in
//! flight for the idle timeout is closed (h2 included: its keep-alive pings alone do not keep it,
//! and a client that never sends the HTTP/2 preface is dropped too), and a closing connection
//! gets a bounded time to finish what it has in flight.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use super::activity::{Activity, InFlight};
use super::coalesce::Coalesced;
use super::header_deadline::HeaderDeadline;
use crate::cluster::ClusterView;
use crate::server::{AppState, MUTATE_PATH, mutate};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a closing connection may take to finish its requests (reviews are bounded well
/// below this by the body read and lookup timeouts).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(15);
/// A closing connection with nothing in flight for this long is dropped, so a peer that ignores
/// GOAWAY (or never sent a preface) cannot hold it.
const CLOSE_LINGER: Duration = Duration::from_secs(1);

/// The two protocol builders, configured once for every connection.
pub(super) struct Builders {
    pub http1: http1::Builder,
    pub http2: http2::Builder<TokioExecutor>,
}

/// What a connection task needs besides its socket.
pub(super) struct Connection<C> {
    pub acceptor: TlsAcceptor,
    pub builders: Arc<Builders>,
    pub router: Router,
    /// For `POST /mutate`, which skips the router (see [`Tracked`]).
    pub state: Arc<AppState<C>>,
    /// Becomes true when the server closes its connections.
    pub closing: watch::Receiver<bool>,
    pub idle_timeout: Duration,
    /// HTTP/1.1: longest time from a request's first bytes to its complete headers.
    pub header_read_timeout: Duration,
}

// By hand: a derive would ask `C: Clone`, and only the `Arc` is cloned.
impl<C> Clone for Connection<C> {
    fn clone(&self) -> Self {
        Self {
            acceptor: self.acceptor.clone(),
            builders: Arc::clone(&self.builders),
            router: self.router.clone(),
            state: Arc::clone(&self.state),
            closing: self.closing.clone(),
            idle_timeout: self.idle_timeout,
            header_read_timeout: self.header_read_timeout,
        }
    }
}

impl<C: ClusterView> Connection<C> {
    pub(super) async fn serve(self, tcp: TcpStream, peer: SocketAddr) {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
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
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
        let activity = Arc::new(Activity::new());
        let service = Tracked {
            inner: TowerToHyperService::new(self.router.clone()),
            state: Arc::clone(&self.state),
            activity: Arc::clone(&activity),
        };
        let builders = Arc::clone(&self.builders);
        let result = if h2 {
            let io = Coalesced::new(tls, Arc::clone(&activity));
            let connection = builders.http2.serve_connection(TokioIo::new(io), service);
            self.drive(
                connection,
                http2::Connection::graceful_shutdown,
                &activity,
                peer,
            )
            .await
        } else {
            let io = HeaderDeadline::new(tls, Arc::clone(&activity), self.header_read_timeout);
            let io = Coalesced::new(io, Arc::clone(&activity));
            let connection = builders.http1.serve_connection(TokioIo::new(io), service);
            self.drive(
                connection,
                http1::Connection::graceful_shutdown,
                &activity,
                peer,
            )
            .await
        };
        if let Err(error) = result {
            tracing::debug!(%peer, %error, "connection ended with an error");
        }
    }

    /// Runs `connection` until it ends, closing it gracefully when idle or when the server
    /// closes, and dropping it when closing takes too long.
    async fn drive<F>(
        mut self,
        connection: F,
        graceful_shutdown: impl Fn(Pin<&mut F>),
        activity: &Activity,
        peer: SocketAddr,
    ) -> hyper::Result<()>
    where
        F: Future<Output = hyper::Result<()>>,
    {
        tokio::pin!(connection);
        let mut closing_since: Option<Instant> = None;
        loop {
            let wake = match closing_since {
                None => activity.idle_deadline(self.idle_timeout),
                Some(since) => (since + CLOSE_TIMEOUT).min(Instant::now() + CLOSE_LINGER),
            };
            tokio::select! {
                result = connection.as_mut() => return result,
                _ = self.closing.wait_for(|closing| *closing), if closing_since.is_none() => {
                    graceful_shutdown(connection.as_mut());
                    closing_since = Some(Instant::now());
                }
                () = tokio::time::sleep_until(wake) => match closing_since {
                    None => {
                        if activity.idle_for() >= self.idle_timeout {
                            tracing::debug!(%peer, "closing idle connection");
                            graceful_shutdown(connection.as_mut());
                            closing_since = Some(Instant::now());
                        }
                    }
                    Some(since) => {
                        if activity.idle_for() >= CLOSE_LINGER || since.elapsed() >= CLOSE_TIMEOUT {
                            tracing::debug!(%peer, "connection did not close by itself; dropping it");
                            return Ok(());
                        }
                    }
                },
            }
        }
    }
}

/// The router as a hyper service, counting requests in flight. A review (`POST /mutate`, the
/// one route under load) goes straight to its handler: the router's matching, its boxed
/// services and their futures cost about a microsecond per request.
struct Tracked<C> {
    inner: TowerToHyperService<Router>,
    state: Arc<AppState<C>>,
    activity: Arc<Activity>,
}

impl<C: ClusterView> hyper::service::Service<http::Request<Incoming>> for Tracked<C> {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: http::Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(Arc::clone(&self.activity));
        super::threads::request_started();
        if request.method() == http::Method::POST && request.uri().path() == MUTATE_PATH {
            let state = Arc::clone(&self.state);
            let body = Body::new(request.into_body());
            return Box::pin(async move {
                let _in_flight = in_flight;
                Ok(mutate(state, body).await)
            });
        }
        let handled = self.inner.call(request);
        Box::pin(async move {
            let _in_flight = in_flight;
            handled.await
        })
    }
}
