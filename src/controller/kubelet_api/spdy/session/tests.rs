use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::DuplexStream;

use super::*;

/// The client end of a session, for tests: writes frames, reads them back decoded.
pub(crate) struct Peer {
    io: DuplexStream,
    codec: Codec,
    buf: BytesMut,
}

impl Peer {
    pub(crate) fn new(io: DuplexStream) -> Self {
        Self {
            io,
            codec: Codec::new(),
            buf: BytesMut::new(),
        }
    }

    pub(crate) async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        self.codec.encode(&frame, &mut out).unwrap();
        self.io.write_all(&out).await.unwrap();
    }

    pub(crate) async fn open(&mut self, id: u32, headers: &[(&str, &str)]) {
        self.send(Frame::SynStream {
            stream_id: id,
            flags: 0,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        })
        .await;
    }

    pub(crate) async fn data(&mut self, id: u32, data: &[u8], fin: bool) {
        self.send(Frame::Data {
            stream_id: id,
            flags: if fin { FLAG_FIN } else { 0 },
            data: Bytes::copy_from_slice(data),
        })
        .await;
    }

    /// The next frame, `None` at the end of the connection.
    pub(crate) async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.codec.decode(&mut self.buf).unwrap() {
                return Some(frame);
            }
            if self.io.read_buf(&mut self.buf).await.unwrap_or(0) == 0 {
                return None;
            }
        }
    }

    /// Every frame until the connection ends: per stream its data and whether it finished.
    pub(crate) async fn drain(&mut self) -> HashMap<u32, (Vec<u8>, bool)> {
        let mut streams: HashMap<u32, (Vec<u8>, bool)> = HashMap::new();
        while let Some(frame) = self.next().await {
            if let Frame::Data {
                stream_id,
                flags,
                data,
            } = frame
            {
                let entry = streams.entry(stream_id).or_default();
                entry.0.extend_from_slice(&data);
                entry.1 |= flags & FLAG_FIN != 0;
            }
        }
        streams
    }
}

#[tokio::test]
async fn streams_are_accepted_replied_and_carry_data_both_ways() {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let mut session = Session::start(server);
    let mut peer = Peer::new(client);
    peer.open(1, &[("streamtype", "stdin")]).await;
    let mut stream = session.accept().await.unwrap();
    assert_eq!(stream.id, 1);
    assert_eq!(
        super::super::frame::header(&stream.headers, "streamtype"),
        Some("stdin")
    );
    assert!(matches!(
        peer.next().await,
        Some(Frame::SynReply { stream_id: 1, .. })
    ));
    peer.data(1, b"data", true).await;
    assert_eq!(
        stream.incoming.recv().await.unwrap(),
        Bytes::from_static(b"data")
    );
    assert!(
        stream.incoming.recv().await.is_none(),
        "FIN ends the stream"
    );
    peer.send(Frame::Ping { id: 9 }).await;
    assert_eq!(peer.next().await, Some(Frame::Ping { id: 9 }));
    stream.out.write(b"back").await.unwrap();
    stream.out.finish().await.unwrap();
    drop(stream);
    session.close(Duration::from_secs(5)).await;
    let streams = peer.drain().await;
    assert_eq!(streams[&1], (b"back".to_vec(), true));
}

/// A peer that stops reading: writers wait on the bounded queue instead of buffering
/// everything; once it reads again, everything arrives in order.
#[tokio::test]
async fn a_peer_that_stops_reading_holds_the_writers_back() {
    let (client, server) = tokio::io::duplex(1024);
    let mut session = Session::start(server);
    let mut peer = Peer::new(client);
    peer.open(1, &[("streamtype", "stdout")]).await;
    let stream = session.accept().await.unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let counter = written.clone();
    let producer = tokio::spawn(async move {
        for i in 0..200u32 {
            stream.out.write(&[i as u8; 1000]).await.unwrap();
            counter.fetch_add(1, Ordering::SeqCst);
        }
        stream.out.finish().await.unwrap();
    });
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = written.load(Ordering::SeqCst);
    assert!(
        before < 40,
        "{before} writes went through with nobody reading"
    );
    let reader = tokio::spawn(async move { peer.drain().await });
    producer.await.unwrap();
    session.close(Duration::from_secs(5)).await;
    let streams = reader.await.unwrap();
    let (data, fin) = &streams[&1];
    assert_eq!(data.len(), 200_000);
    assert!(fin);
    assert_eq!(data[199_999], 199);
}

/// A stream whose reader stopped reading is reset once its data has waited the stall
/// limit; the session goes on (it answers a ping) instead of stalling for good.
#[tokio::test(start_paused = true)]
async fn a_stalled_stream_is_reset_and_the_session_reads_on() {
    let (client, server) = tokio::io::duplex(256 * 1024);
    let mut session = Session::start(server);
    let mut peer = Peer::new(client);
    peer.open(1, &[("streamtype", "data")]).await;
    let _never_read = session.accept().await.unwrap();
    assert!(matches!(
        peer.next().await,
        Some(Frame::SynReply { stream_id: 1, .. })
    ));
    for _ in 0..(QUEUED_DATA + 2) {
        peer.data(1, &[7u8; 1024], false).await;
    }
    peer.send(Frame::Ping { id: 3 }).await;
    let mut reset = false;
    loop {
        match peer.next().await {
            Some(Frame::RstStream {
                stream_id: 1,
                status,
            }) => {
                assert_eq!(status, RST_CANCEL);
                reset = true;
            }
            Some(Frame::Ping { id: 3 }) => break,
            Some(_) => {}
            None => panic!("the session ended"),
        }
    }
    assert!(
        reset,
        "the stalled stream was not reset before the ping was answered"
    );
}

#[tokio::test]
async fn garbage_ends_the_session_without_a_panic() {
    let (mut client, server) = tokio::io::duplex(1024);
    let mut session = Session::start(server);
    client
        .write_all(&[0x80, 9, 0, 1, 0, 0, 0, 0])
        .await
        .unwrap();
    assert!(session.accept().await.is_none());
}
