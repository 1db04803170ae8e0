//! A SPDY/3.1 session over an upgraded connection, server side: the peer (kubectl through the
//! apiserver) opens the streams, this side accepts each with a SYN_REPLY, reads what arrives on
//! it and writes back. One task reads frames, one writes them; every channel between them and
//! the streams is bounded, so a peer that stops reading slows the writers down instead of
//! filling memory. What the peer may hold is bounded too: at most [`MAX_OPEN_STREAMS`] open
//! streams per session (streams nobody reads any more are forgotten first, then new ones are
//! refused), and the data received and not yet read is bounded in bytes per session
//! ([`SESSION_BUFFER`]) and per node ([`NODE_BUFFER`]): beyond them the reader waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, SemaphorePermit, mpsc, watch};
use tokio::task::JoinHandle;

use super::frame::{Codec, FLAG_FIN, Frame, Headers, RST_CANCEL, RST_REFUSED_STREAM};

/// Data frames this side writes carry at most this much (kubectl writes 32 KiB too).
const CHUNK: usize = 32 * 1024;
/// Frames queued for the socket; a writer beyond that waits.
const QUEUED_FRAMES: usize = 16;
/// Data frames received on one stream and not yet read (each at most `frame::MAX_FRAME`).
const QUEUED_DATA: usize = 16;
/// Streams one session may hold open (exec opens at most five, port-forward two per
/// connection, at most 64 connections, and a few pairs being set up).
pub(crate) const MAX_OPEN_STREAMS: usize = 160;
/// Bytes received on one session and not yet read by its streams' consumers.
pub(crate) const SESSION_BUFFER: usize = 2 * 1024 * 1024;
/// Bytes received on all of a node's sessions and not yet read.
pub(crate) const NODE_BUFFER: usize = 64 * 1024 * 1024;

/// The node's share of received bytes, across its sessions.
static NODE_BUDGET: Semaphore = Semaphore::const_new(NODE_BUFFER);

/// What one session holds, for its bounds and their tests.
#[derive(Debug, Default)]
pub(crate) struct SessionStats {
    /// Streams the peer opened that are still open.
    pub open_streams: AtomicUsize,
    /// The most that were open at once.
    pub open_peak: AtomicUsize,
    /// Bytes received and not yet read.
    pub buffered: AtomicUsize,
    /// The most bytes that were ever buffered at once.
    pub buffered_peak: AtomicUsize,
}

/// Received bytes counted against the session's and the node's budgets until read.
struct Held {
    len: usize,
    stats: Arc<SessionStats>,
    _session: OwnedSemaphorePermit,
    _node: SemaphorePermit<'static>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.stats.buffered.fetch_sub(self.len, Ordering::Relaxed);
    }
}

/// What the peer sends on one stream; ends when it finishes or resets the stream.
pub(crate) struct Incoming(mpsc::Receiver<(Bytes, Held)>);

impl Incoming {
    /// The next data the peer sent (its bytes leave the session's budget).
    pub(crate) async fn recv(&mut self) -> Option<Bytes> {
        self.0.recv().await.map(|(data, _held)| data)
    }

    /// As a plain channel that holds at most one frame outside the budgets.
    pub(crate) fn into_receiver(mut self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(1);
        tokio::spawn(async move {
            while let Some(data) = self.recv().await {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        });
        rx
    }
}

/// A stream the peer opened.
pub(crate) struct Stream {
    pub id: u32,
    pub headers: Headers,
    /// What the peer sends; ends when it finishes or resets the stream.
    pub incoming: Incoming,
    pub out: StreamWriter,
}

/// Writes to one stream.
#[derive(Clone)]
pub struct StreamWriter {
    id: u32,
    frames: mpsc::Sender<Frame>,
}

/// The connection is gone.
#[derive(Debug, thiserror::Error)]
#[error("the SPDY connection is closed")]
pub struct Closed;

impl StreamWriter {
    pub async fn write(&self, data: &[u8]) -> Result<(), Closed> {
        for chunk in data.chunks(CHUNK) {
            self.frames
                .send(Frame::Data {
                    stream_id: self.id,
                    flags: 0,
                    data: Bytes::copy_from_slice(chunk),
                })
                .await
                .map_err(|_| Closed)?;
        }
        Ok(())
    }

    /// Ends this side of the stream.
    pub async fn finish(&self) -> Result<(), Closed> {
        self.frames
            .send(Frame::Data {
                stream_id: self.id,
                flags: FLAG_FIN,
                data: Bytes::new(),
            })
            .await
            .map_err(|_| Closed)
    }
}

pub(crate) struct Session {
    streams: mpsc::Receiver<Stream>,
    frames: mpsc::Sender<Frame>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
    /// Turns true once the peer is gone (its connection ended or broke).
    gone: watch::Receiver<bool>,
    /// What the session holds, observed by the tests that bound it.
    #[cfg(test)]
    stats: Arc<SessionStats>,
}

impl Session {
    pub(crate) fn start<T>(io: T) -> Session
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read_half, write_half) = tokio::io::split(io);
        let (frames_tx, frames_rx) = mpsc::channel(QUEUED_FRAMES);
        let (streams_tx, streams_rx) = mpsc::channel(16);
        let (gone_tx, gone) = watch::channel(false);
        let stats = Arc::new(SessionStats::default());
        let writer = tokio::spawn(write_frames(write_half, frames_rx));
        let reader_frames = frames_tx.clone();
        let reader_stats = stats.clone();
        let reader = tokio::spawn(async move {
            read_frames(read_half, reader_frames, streams_tx, reader_stats).await;
            let _ = gone_tx.send(true);
        });
        Session {
            streams: streams_rx,
            frames: frames_tx,
            reader,
            writer,
            gone,
            #[cfg(test)]
            stats,
        }
    }

    /// What the session holds now.
    #[cfg(test)]
    pub(crate) fn stats(&self) -> Arc<SessionStats> {
        self.stats.clone()
    }

    /// Resolves once the peer is gone, for work that must stop with it (a remote command).
    pub(crate) fn gone(&self) -> watch::Receiver<bool> {
        self.gone.clone()
    }

    /// The next stream the peer opens; `None` once the connection ended.
    pub(crate) async fn accept(&mut self) -> Option<Stream> {
        self.streams.recv().await
    }

    /// Flushes what the streams wrote (at most `grace`), then closes the connection.
    pub(crate) async fn close(self, grace: Duration) {
        drop(self.frames);
        drop(self.streams);
        let Session { reader, writer, .. } = self;
        // Nothing more is read; the reader's handle on the queue (for replies) goes with it.
        reader.abort();
        let _ = reader.await;
        // The writer ends once every stream writer is dropped and the queue is written.
        let abort = writer.abort_handle();
        if tokio::time::timeout(grace, writer).await.is_err() {
            tracing::debug!("SPDY writer did not drain in time");
            abort.abort();
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut io: W, mut frames: mpsc::Receiver<Frame>) {
    let mut codec = Codec::new();
    let mut buf = BytesMut::new();
    while let Some(frame) = frames.recv().await {
        if let Err(error) = codec.encode(&frame, &mut buf) {
            tracing::debug!(%error, "SPDY frame not encodable");
            buf.clear();
            continue;
        }
        // Write what is queued together.
        while let Ok(next) = frames.try_recv() {
            if codec.encode(&next, &mut buf).is_err() {
                break;
            }
            if buf.len() > 4 * 32 * 1024 {
                break;
            }
        }
        if io.write_all(&buf).await.is_err() || io.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = io.shutdown().await;
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut io: R,
    frames: mpsc::Sender<Frame>,
    streams: mpsc::Sender<Stream>,
    stats: Arc<SessionStats>,
) {
    let mut codec = Codec::new();
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut open: Open = HashMap::new();
    let budget = Arc::new(Semaphore::new(SESSION_BUFFER));
    loop {
        stats.open_streams.store(open.len(), Ordering::Relaxed);
        stats.open_peak.fetch_max(open.len(), Ordering::Relaxed);
        let frame = match codec.decode(&mut buf) {
            Ok(Some(frame)) => frame,
            Ok(None) => match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            Err(error) => {
                tracing::debug!(%error, "SPDY protocol error; closing");
                return;
            }
        };
        match frame {
            Frame::SynStream {
                stream_id,
                flags,
                headers,
            } => {
                if !open_stream(&frames, &streams, &mut open, stream_id, flags, headers).await {
                    return;
                }
            }
            Frame::Data {
                stream_id,
                flags,
                data,
            } => {
                let budget = (&budget, &stats);
                if !receive(&frames, &mut open, budget, stream_id, flags, data).await {
                    return;
                }
            }
            Frame::RstStream { stream_id, .. } => {
                open.remove(&stream_id);
            }
            Frame::Ping { id } => {
                if frames.send(Frame::Ping { id }).await.is_err() {
                    return;
                }
            }
            Frame::GoAway { .. } => return,
            Frame::SynReply { .. }
            | Frame::Settings
            | Frame::Headers { .. }
            | Frame::WindowUpdate { .. }
            | Frame::Ignored => {}
        }
    }
}

/// The streams open for reading: each one's queue of received data.
type Open = HashMap<u32, mpsc::Sender<(Bytes, Held)>>;

/// A stream the client opened: replied to and handed to the session's consumer, or refused
/// (too many open, or a consumer that cannot take it). `false` when the session is over.
async fn open_stream(
    frames: &mpsc::Sender<Frame>,
    streams: &mpsc::Sender<Stream>,
    open: &mut Open,
    stream_id: u32,
    flags: u8,
    headers: Vec<(String, String)>,
) -> bool {
    if open.len() >= MAX_OPEN_STREAMS {
        // Streams their consumer dropped (never paired, of no known type) go first.
        open.retain(|_, tx| !tx.is_closed());
    }
    if open.len() >= MAX_OPEN_STREAMS {
        tracing::debug!(open = open.len(), "SPDY: too many open streams; refusing");
        if frames
            .send(Frame::RstStream {
                stream_id,
                status: RST_REFUSED_STREAM,
            })
            .await
            .is_err()
        {
            return false;
        }
        return true;
    }
    let (tx, rx) = mpsc::channel(QUEUED_DATA);
    let stream = Stream {
        id: stream_id,
        headers,
        incoming: Incoming(rx),
        out: StreamWriter {
            id: stream_id,
            frames: frames.clone(),
        },
    };
    let reply = Frame::SynReply {
        stream_id,
        flags: 0,
        headers: Vec::new(),
    };
    if frames.send(reply).await.is_err() {
        return false;
    }
    if streams.try_send(stream).is_err() {
        let _ = frames
            .send(Frame::RstStream {
                stream_id,
                status: RST_REFUSED_STREAM,
            })
            .await;
        return true;
    }
    if flags & FLAG_FIN == 0 {
        open.insert(stream_id, tx);
    }
    true
}

/// Data for a stream: delivered to its reader within the session's buffer budget; a reader
/// that went away or stalled loses its stream. `false` when the session is over.
async fn receive(
    frames: &mpsc::Sender<Frame>,
    open: &mut Open,
    (budget, stats): (&Arc<Semaphore>, &Arc<SessionStats>),
    stream_id: u32,
    flags: u8,
    data: Bytes,
) -> bool {
    if let Some(tx) = open.get(&stream_id)
        && !data.is_empty()
    {
        match deliver(tx, data, budget, stats).await {
            Delivered::Yes => {}
            // A reader that went away just drops what comes.
            Delivered::ReaderGone => {
                open.remove(&stream_id);
            }
            // A consumer that stopped reading (a forwarded port that never reads)
            // must not stall the session, nor the node's other sessions: its
            // stream is reset and the session reads on.
            Delivered::Stalled => {
                tracing::debug!(stream_id, "SPDY: a stream's reader stalled; resetting it");
                open.remove(&stream_id);
                if frames
                    .send(Frame::RstStream {
                        stream_id,
                        status: RST_CANCEL,
                    })
                    .await
                    .is_err()
                {
                    return false;
                }
            }
        }
    }
    if flags & FLAG_FIN != 0 {
        open.remove(&stream_id);
    }
    true
}

/// How long received data may wait for its stream's reader to make room (the session's budget,
/// the stream's queue) before the stream is reset.
const STALL_LIMIT: Duration = Duration::from_secs(30);

/// What became of received data.
enum Delivered {
    Yes,
    ReaderGone,
    Stalled,
}

/// Hands `data` to its stream's reader, counted against the session's budget (waiting at most
/// [`STALL_LIMIT`] for room) and the node's (never waiting: a node out of room resets the
/// stream rather than let one session stall the others).
async fn deliver(
    tx: &mpsc::Sender<(Bytes, Held)>,
    data: Bytes,
    budget: &Arc<Semaphore>,
    stats: &Arc<SessionStats>,
) -> Delivered {
    let len = data.len();
    let admitted = async {
        let session = budget.clone().acquire_many_owned(permits(len)).await.ok()?;
        let node = NODE_BUDGET.try_acquire_many(permits(len)).ok()?;
        let now = stats.buffered.fetch_add(len, Ordering::Relaxed) + len;
        stats.buffered_peak.fetch_max(now, Ordering::Relaxed);
        let held = Held {
            len,
            stats: stats.clone(),
            _session: session,
            _node: node,
        };
        Some(tx.send((data, held)).await.is_ok())
    };
    match tokio::time::timeout(STALL_LIMIT, admitted).await {
        Ok(Some(true)) => Delivered::Yes,
        Ok(Some(false)) => Delivered::ReaderGone,
        Ok(None) | Err(_) => Delivered::Stalled,
    }
}

/// Semaphore permits for `len` bytes (a frame is far below `u32::MAX`).
fn permits(len: usize) -> u32 {
    u32::try_from(len).unwrap_or(u32::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
