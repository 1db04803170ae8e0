//! `kubectl port-forward` over a SPDY session (`portforward.k8s.io`): for every connection
//! kubectl accepts locally it opens an error stream and a data stream with the same
//! `requestID` and the pod's `port`; this side connects to that port through [`Forwarder`] and
//! copies both ways, or writes why it could not on the error stream.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::controller::kubelet_api::spdy::frame::header;
use crate::controller::kubelet_api::spdy::session::{Session, StreamWriter};

pub const PROTOCOL: &str = "portforward.k8s.io";

/// A byte stream to the pod's port.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}

/// Opens connections to the pod's ports (the pod's SSH, a test double).
pub trait Forwarder: Clone + Send + Sync + 'static {
    fn connect(
        &self,
        port: u16,
    ) -> impl std::future::Future<Output = Result<Box<dyn Connection>, String>> + Send;
}

#[derive(Default)]
struct Pair {
    port: Option<u16>,
    error: Option<StreamWriter>,
    data: Option<(mpsc::Receiver<Bytes>, StreamWriter)>,
}

/// Half-open pairs kept at once; kubectl opens both streams of a pair together.
const MAX_PENDING_PAIRS: usize = 64;

/// Serves the session's stream pairs until the client closes it; the forwarded connections
/// end with it.
pub async fn serve<F: Forwarder>(mut session: Session, forwarder: F) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut connections = tokio::task::JoinSet::new();
    while let Some(stream) = session.accept().await {
        // Reap what ended, so the set holds only live connections.
        while connections.try_join_next().is_some() {}
        let Some(port) = header(&stream.headers, "port").and_then(|p| p.parse::<u16>().ok()) else {
            continue;
        };
        // Clients without request ids pair streams by port, one connection at a time.
        let id = header(&stream.headers, "requestid")
            .map(str::to_owned)
            .unwrap_or_else(|| format!("port-{port}"));
        if !pairs.contains_key(&id) && pairs.len() >= MAX_PENDING_PAIRS {
            tracing::debug!("port-forward: too many half-open stream pairs; dropping the oldest");
            pairs.clear();
        }
        let pair = pairs.entry(id.clone()).or_default();
        pair.port = Some(port);
        match header(&stream.headers, "streamtype") {
            Some("error") => pair.error = Some(stream.out),
            Some("data") => pair.data = Some((stream.incoming, stream.out)),
            _ => continue,
        }
        if pair.error.is_some()
            && pair.data.is_some()
            && let Some(Pair {
                port: Some(port),
                error: Some(error),
                data: Some(data),
            }) = pairs.remove(&id)
        {
            connections.spawn(forward(forwarder.clone(), port, error, data));
        }
    }
    // kubectl is gone: so are the connections it forwarded (and their SSH channels).
    connections.abort_all();
    session.close(Duration::from_secs(1)).await;
}

async fn forward<F: Forwarder>(
    forwarder: F,
    port: u16,
    error: StreamWriter,
    (mut incoming, out): (mpsc::Receiver<Bytes>, StreamWriter),
) {
    let connection = match forwarder.connect(port).await {
        Ok(connection) => connection,
        Err(message) => {
            let _ = error
                .write(format!("error forwarding port {port} to pod: {message}").as_bytes())
                .await;
            let _ = error.finish().await;
            let _ = out.finish().await;
            return;
        }
    };
    let (mut read, mut write) = tokio::io::split(connection);
    let upstream = async {
        while let Some(data) = incoming.recv().await {
            if write.write_all(&data).await.is_err() {
                break;
            }
        }
        let _ = write.shutdown().await;
    };
    let downstream = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if out.write(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = out.finish().await;
    };
    tokio::join!(upstream, downstream);
    let _ = error.finish().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::kubelet_api::spdy::frame::Frame;
    use crate::controller::kubelet_api::spdy::session::tests::Peer;

    /// Port 1 refuses; any other port is an echo server that upper-cases.
    #[derive(Clone)]
    struct Echo;

    impl Forwarder for Echo {
        async fn connect(&self, port: u16) -> Result<Box<dyn Connection>, String> {
            if port == 1 {
                return Err("connection refused".to_owned());
            }
            let (near, mut far) = tokio::io::duplex(4096);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1024];
                while let Ok(n) = far.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    let upper = buf[..n].to_ascii_uppercase();
                    if far.write_all(&upper).await.is_err() {
                        break;
                    }
                }
            });
            Ok(Box::new(near))
        }
    }

    #[tokio::test]
    async fn pairs_are_forwarded_and_refusals_reported() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(serve(Session::start(server), Echo));
        let mut peer = Peer::new(client);
        // Two connections to 8080 (request ids 0 and 1), one to a refusing port.
        for (id, request, port) in [(1, "0", "8080"), (5, "1", "8080"), (9, "2", "1")] {
            peer.open(
                id,
                &[
                    ("streamtype", "error"),
                    ("port", port),
                    ("requestID", request),
                ],
            )
            .await;
            peer.open(
                id + 2,
                &[
                    ("streamtype", "data"),
                    ("port", port),
                    ("requestID", request),
                ],
            )
            .await;
        }
        peer.data(3, b"hello", true).await;
        peer.data(7, b"world", true).await;
        // Read until both echoes and the refusal are back, then hang up.
        let mut streams: HashMap<u32, Vec<u8>> = HashMap::new();
        while !(streams.get(&3).is_some_and(|d| d.len() == 5)
            && streams.get(&7).is_some_and(|d| d.len() == 5)
            && streams.get(&9).is_some_and(|d| !d.is_empty()))
        {
            match peer.next().await {
                Some(Frame::Data {
                    stream_id, data, ..
                }) => streams
                    .entry(stream_id)
                    .or_default()
                    .extend_from_slice(&data),
                Some(_) => {}
                None => break,
            }
        }
        peer.send(Frame::GoAway { last_good: 11 }).await;
        let _ = peer.drain().await;
        served.await.unwrap();
        let streams: HashMap<u32, (Vec<u8>, bool)> =
            streams.into_iter().map(|(k, v)| (k, (v, true))).collect();
        assert_eq!(streams[&3].0, b"HELLO".to_vec());
        assert_eq!(streams[&7].0, b"WORLD".to_vec());
        assert!(
            String::from_utf8_lossy(&streams[&9].0).contains("connection refused"),
            "{:?}",
            streams.get(&9)
        );
    }
}
