//! The kubelet API's TLS listener, bounded so that no client can hold the controller's file
//! descriptors: any pod can complete a handshake (client certificates are optional, for a
//! clear 401), so connections are capped, the handshake is timed, and a request whose head is
//! not complete within the header deadline closes its connection (hyper arms that timer
//! whenever it waits for a head, so a keep-alive connection with no request is closed by it
//! too). Upgraded exec and port-forward streams leave hyper and are bounded by their sessions.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use super::authz::{Caller, User};

/// How the listener bounds its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Limits {
    /// Connections open at once; further clients wait in the accept queue.
    pub max_connections: usize,
    /// Longest TLS handshake.
    pub handshake_timeout: Duration,
    /// Longest wait for a complete request head (and between requests on one connection).
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Far above what an apiserver opens (it reuses its connections), far below a
            // pod's descriptor limit.
            max_connections: 4096,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
        }
    }
}

/// Serves `app` over TLS on `listener` until the task is dropped.
pub(super) async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    limits: Limits,
) {
    let acceptor = TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    loop {
        // Never closed, so acquiring cannot fail.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "kubelet API accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let tls =
                match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => tls,
                    _ => {
                        tracing::debug!(%peer, "kubelet API handshake failed");
                        return;
                    }
                };
            // rustls verified the chain; the leaf names the user.
            let user = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(|leaf| User::from_certificate(leaf))
                .map(Arc::new);
            let service = hyper_util::service::TowerToHyperService::new(
                app.layer(axum::Extension(Caller(user))),
            );
            // HTTP/1.1 only (what ALPN offers and the apiserver speaks to kubelets): hyper's
            // HTTP/1 server arms the header timer as soon as it waits for a head, the first
            // one included, so a client that completes TLS and then says nothing is closed
            // too (a protocol-sniffing builder would wait for its first byte untimed).
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                // Head and body in one write: an apiserver proxying an upgrade request passes
                // on only what its first read of a refused upgrade returns, so a body written
                // apart from the head would never reach kubectl.
                .writev(false);
            // Exec and port-forward upgrade the connection to SPDY.
            if let Err(error) = builder
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades()
                .await
            {
                tracing::debug!(%peer, %error, "kubelet API connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests;
