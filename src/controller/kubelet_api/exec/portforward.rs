//! `kubectl port-forward` over a SPDY session (`portforward.k8s.io`): for every connection
//! kubectl accepts locally it opens an error stream and a data stream with the same
//! `requestID` and the pod's `port`; this side connects to that port through [`Forwarder`] and
//! copies both ways, or writes why it could not on the error stream. Forwarded connections are
//! bounded per session ([`MAX_FORWARDS_PER_SESSION`]) and per node ([`MAX_FORWARDS_PER_NODE`]):
//! beyond them a pair gets an error instead of a connection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::controller::kubelet_api::spdy::frame::header;
use crate::controller::kubelet_api::spdy::session::{Incoming, Session, StreamWriter};

/// Forwarded connections one port-forward session may hold (a browser opens a few dozen).
pub(crate) const MAX_FORWARDS_PER_SESSION: usize = 64;
/// Forwarded connections all of a node's sessions may hold.
pub(crate) const MAX_FORWARDS_PER_NODE: usize = 1024;

static NODE_FORWARDS: Semaphore = Semaphore::const_new(MAX_FORWARDS_PER_NODE);

/// What a port-forward session holds, for its bounds and their tests.
#[derive(Debug, Default)]
pub(crate) struct ForwardStats {
    /// Forwarded connections open now.
    pub connections: AtomicUsize,
    /// The most that were open at once.
    pub peak: AtomicUsize,
    /// Half-open stream pairs kept now.
    pub pending_pairs: AtomicUsize,
    /// Pairs refused for a bound.
    pub refused: AtomicUsize,
}

pub(crate) const PROTOCOL: &str = "portforward.k8s.io";

/// A byte stream to the pod's port.
pub trait Connection: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Connection for T {}

/// Opens connections to the pod's ports (the pod's SSH, a test double).
pub(crate) trait Forwarder: Clone + Send + Sync + 'static {
    fn connect(
        &self,
        port: u16,
    ) -> impl std::future::Future<Output = Result<Box<dyn Connection>, String>> + Send;
}

#[derive(Default)]
struct Pair {
    port: Option<u16>,
    error: Option<StreamWriter>,
    data: Option<(Incoming, StreamWriter)>,
}

/// Half-open pairs kept at once; kubectl opens both streams of a pair together.
const MAX_PENDING_PAIRS: usize = 64;

/// Serves the session's stream pairs until the client closes it; the forwarded connections
/// end with it.
pub(crate) async fn serve<F: Forwarder>(session: Session, forwarder: F) {
    serve_counted(session, forwarder, Arc::default()).await;
}

/// [`serve`], counting what the session holds into `stats`.
pub(crate) async fn serve_counted<F: Forwarder>(
    mut session: Session,
    forwarder: F,
    stats: Arc<ForwardStats>,
) {
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut connections = tokio::task::JoinSet::new();
    while let Some(stream) = session.accept().await {
        // Reap what ended, so the set holds only live connections.
        while connections.try_join_next().is_some() {}
        stats
            .connections
            .store(connections.len(), Ordering::Relaxed);
        stats.pending_pairs.store(pairs.len(), Ordering::Relaxed);
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
            let slot = if connections.len() < MAX_FORWARDS_PER_SESSION {
                NODE_FORWARDS.try_acquire().ok()
            } else {
                None
            };
            let Some(slot) = slot else {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                let message = format!(
                    "error forwarding port {port} to pod: too many forwarded connections (at \
                     most {MAX_FORWARDS_PER_SESSION} per port-forward, \
                     {MAX_FORWARDS_PER_NODE} per node); close some and retry"
                );
                tokio::spawn(async move {
                    let _ = error.write(message.as_bytes()).await;
                    let _ = error.finish().await;
                    let _ = data.1.finish().await;
                });
                continue;
            };
            let forwarder = forwarder.clone();
            connections.spawn(async move {
                let _slot = slot;
                forward(forwarder, port, error, data).await;
            });
            stats
                .connections
                .store(connections.len(), Ordering::Relaxed);
            stats.peak.fetch_max(connections.len(), Ordering::Relaxed);
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
    (mut incoming, out): (Incoming, StreamWriter),
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

    /// The peer's side of a session, split: frames are written from the test while a task
    /// reads everything the session sends back (data per stream).
    struct SplitPeer {
        write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
        codec: crate::controller::kubelet_api::spdy::frame::Codec,
        out: bytes::BytesMut,
        received: Arc<std::sync::Mutex<HashMap<u32, Vec<u8>>>>,
    }

    impl SplitPeer {
        fn new(client: tokio::io::DuplexStream) -> Self {
            let (mut read, write) = tokio::io::split(client);
            let received: Arc<std::sync::Mutex<HashMap<u32, Vec<u8>>>> = Arc::default();
            let into = received.clone();
            tokio::spawn(async move {
                let mut codec = crate::controller::kubelet_api::spdy::frame::Codec::new();
                let mut buf = bytes::BytesMut::new();
                loop {
                    match codec.decode(&mut buf) {
                        Ok(Some(Frame::Data {
                            stream_id, data, ..
                        })) => into
                            .lock()
                            .unwrap()
                            .entry(stream_id)
                            .or_default()
                            .extend_from_slice(&data),
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            if read.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                                return;
                            }
                        }
                        Err(_) => return,
                    }
                }
            });
            Self {
                write,
                codec: crate::controller::kubelet_api::spdy::frame::Codec::new(),
                out: bytes::BytesMut::new(),
                received,
            }
        }

        async fn queue(&mut self, frame: Frame) {
            self.codec.encode(&frame, &mut self.out).unwrap();
            if self.out.len() > 64 * 1024 {
                self.flush().await;
            }
        }

        async fn flush(&mut self) {
            self.write.write_all(&self.out).await.unwrap();
            self.out.clear();
        }

        async fn open(&mut self, id: u32, headers: &[(&str, &str)]) {
            let headers = headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            self.queue(Frame::SynStream {
                stream_id: id,
                flags: 0,
                headers,
            })
            .await;
        }

        async fn data(&mut self, id: u32, data: &[u8]) {
            self.queue(Frame::Data {
                stream_id: id,
                flags: 0,
                data: bytes::Bytes::copy_from_slice(data),
            })
            .await;
        }

        /// What stream `id` received within `wait`, if anything.
        async fn answer_within(&self, id: u32, wait: Duration) -> Option<Vec<u8>> {
            tokio::time::timeout(wait, async {
                loop {
                    if let Some(data) = self.received.lock().unwrap().get(&id) {
                        return data.clone();
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .ok()
        }

        /// Opens pairs for `port` from stream `id` on, sending `data` on each, until one
        /// answers: a session still catching up with a flood resets the streams it cannot take
        /// in yet (as kubectl would see), so a later pair is tried. The answer.
        async fn pair_until_answered(&mut self, mut id: u32, port: &str, data: &[u8]) -> Vec<u8> {
            for attempt in 0..60 {
                self.pair(id, &format!("late-{attempt}"), port).await;
                self.data(id + 2, data).await;
                self.flush().await;
                for stream in [id, id + 2] {
                    if let Some(answer) = self.answer_within(stream, Duration::from_secs(5)).await {
                        return answer;
                    }
                }
                id += 4;
            }
            panic!("no pair was ever answered");
        }

        /// A pair for `port` with request id `request` (streams `id` and `id + 2`).
        async fn pair(&mut self, id: u32, request: &str, port: &str) {
            self.open(
                id,
                &[
                    ("streamtype", "error"),
                    ("port", port),
                    ("requestID", request),
                ],
            )
            .await;
            self.open(
                id + 2,
                &[
                    ("streamtype", "data"),
                    ("port", port),
                    ("requestID", request),
                ],
            )
            .await;
        }
    }

    /// Issue 41, item 3: 100,000 stream-opens without a port header do not pile up in the
    /// session; a real pair afterwards still works.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn streams_without_a_port_are_not_kept() {
        use crate::controller::kubelet_api::spdy::session::MAX_OPEN_STREAMS;
        let (client, server) = tokio::io::duplex(256 * 1024);
        let session = Session::start(server);
        let held = session.stats();
        tokio::spawn(serve(session, Echo));
        let mut peer = SplitPeer::new(client);
        let mut id = 1;
        for _ in 0..100_000 {
            peer.open(id, &[("streamtype", "data")]).await;
            id += 2;
        }
        let answer = peer.pair_until_answered(id, "8080", b"still here").await;
        assert_eq!(answer, b"STILL HERE".to_vec());
        let peak = held.open_peak.load(Ordering::Relaxed);
        assert!(peak <= MAX_OPEN_STREAMS, "{peak} streams held open");
    }

    /// Never reads what it is sent; its far ends are kept open.
    #[derive(Clone, Default)]
    struct Stuck(Arc<std::sync::Mutex<Vec<tokio::io::DuplexStream>>>);

    impl Forwarder for Stuck {
        async fn connect(&self, _: u16) -> Result<Box<dyn Connection>, String> {
            let (near, far) = tokio::io::duplex(4096);
            self.0.lock().unwrap().push(far);
            Ok(Box::new(near))
        }
    }

    /// Issue 41, item 3: 10,000 pairs to a port that never reads: at most the session's bound
    /// of connections is opened, the rest are told why, and the bytes held stay bounded.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pairs_to_a_port_that_never_reads_stay_bounded() {
        use crate::controller::kubelet_api::spdy::session::SESSION_BUFFER;
        let (client, server) = tokio::io::duplex(256 * 1024);
        let session = Session::start(server);
        let held = session.stats();
        let stats = Arc::new(ForwardStats::default());
        tokio::spawn(serve_counted(session, Stuck::default(), stats.clone()));
        let mut peer = SplitPeer::new(client);
        let mut id = 1;
        for request in 0..10_000 {
            peer.pair(id, &request.to_string(), "8080").await;
            peer.data(id + 2, &[b'x'; 1024]).await;
            id += 4;
        }
        peer.flush().await;
        let message = String::from_utf8(peer.pair_until_answered(id, "8080", b"z").await).unwrap();
        assert!(
            message.contains("too many forwarded connections"),
            "{message}"
        );
        let peak = stats.peak.load(Ordering::Relaxed);
        assert!(
            peak <= MAX_FORWARDS_PER_SESSION,
            "{peak} connections at once"
        );
        // (Pairs beyond what the session takes in at once are reset, as before: not counted.)
        let refused = stats.refused.load(Ordering::Relaxed);
        assert!(refused > 0 && refused + peak <= 10_000, "{refused} refused");
        let open = held.open_peak.load(Ordering::Relaxed);
        assert!(
            open <= crate::controller::kubelet_api::spdy::session::MAX_OPEN_STREAMS,
            "{open} streams held open"
        );
        let bytes = held.buffered_peak.load(Ordering::Relaxed);
        assert!(bytes <= SESSION_BUFFER, "{bytes} bytes held");

        // One connection that never reads, sent 16 MiB: the session holds at most its bound.
        let (client, server) = tokio::io::duplex(256 * 1024);
        let session = Session::start(server);
        let held = session.stats();
        tokio::spawn(serve(session, Stuck::default()));
        let mut peer = SplitPeer::new(client);
        peer.pair(1, "0", "8080").await;
        peer.flush().await;
        let sending = tokio::spawn(async move {
            for _ in 0..80 {
                peer.data(3, &[b'y'; 200 * 1024]).await;
                peer.flush().await;
            }
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        let bytes = held.buffered_peak.load(Ordering::Relaxed);
        assert!(bytes > 0, "nothing arrived");
        assert!(
            bytes <= SESSION_BUFFER,
            "{bytes} bytes held for one stuck stream"
        );
        assert!(
            !sending.is_finished(),
            "16 MiB were taken in by a port that never reads"
        );
        sending.abort();
    }
}
