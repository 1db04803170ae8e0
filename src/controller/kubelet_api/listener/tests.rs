use std::time::Instant;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::*;

/// A listener with a self-signed certificate for `localhost`, and a connector that trusts it.
async fn started(limits: Limits) -> (std::net::SocketAddr, TlsConnector) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = certified.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.signing_key.serialize_der().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let app = Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
    tokio::spawn(serve(listener, Arc::new(config), app, limits));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    (address, TlsConnector::from(Arc::new(client)))
}

async fn connect(address: std::net::SocketAddr, connector: &TlsConnector) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// Whether the server closed `stream` (EOF or a reset) within `within`.
async fn closed(stream: &mut TlsStream<TcpStream>, within: Duration) -> bool {
    let mut buffer = [0u8; 256];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            // A 408 or similar before the close: keep reading.
            Ok(Ok(_)) => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_closed_at_the_header_deadline_while_real_ones_answer() {
    const HALF_OPEN: usize = 2000;
    // Generous, for 2,000 handshakes on a busy 2-core machine: what is asserted is that every
    // half-sent request is closed, not how fast.
    let header_timeout = Duration::from_secs(15);
    let (address, connector) = started(Limits {
        header_timeout,
        handshake_timeout: Duration::from_secs(120),
        ..Limits::default()
    })
    .await;

    // 2,000 clients each send half a request and then nothing.
    let started_at = Instant::now();
    let mut opening = JoinSet::new();
    for _ in 0..HALF_OPEN {
        let connector = connector.clone();
        opening.spawn(async move {
            // A connection the server already closed (its deadline passed while the others
            // were still being opened, even mid-handshake) is no held connection.
            let tcp = TcpStream::connect(address).await.ok()?;
            let name = rustls::pki_types::ServerName::try_from("localhost").ok()?;
            let mut stream = connector.connect(name, tcp).await.ok()?;
            let sent = stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .await;
            (sent.is_ok() && stream.flush().await.is_ok()).then_some(stream)
        });
    }
    let mut half_open = Vec::with_capacity(HALF_OPEN);
    while let Some(stream) = opening.join_next().await {
        half_open.extend(stream.unwrap());
    }
    // Most were still held when the last was opened, or the test would prove nothing.
    assert!(
        half_open.len() >= HALF_OPEN / 10,
        "only {} half-sent requests were held",
        half_open.len()
    );

    // Meanwhile a real request is answered.
    let mut real = connect(address, &connector).await;
    real.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(30), real.read_to_string(&mut answer))
        .await
        .expect("the real request waited behind the half-sent ones")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // Every half-sent request's connection is closed by the deadline (plus slack for 2,000
    // handshakes on a small machine); none is still open.
    let slack = Duration::from_secs(60);
    let mut still_open = 0;
    for mut stream in half_open {
        let left = (header_timeout + slack).saturating_sub(started_at.elapsed());
        if !closed(&mut stream, left.max(Duration::from_millis(100))).await {
            still_open += 1;
        }
    }
    assert_eq!(still_open, 0, "connections held past the header deadline");
}

/// A client that completes TLS and sends nothing at all (or only an HTTP/2 preface) is closed
/// at the header deadline too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_are_closed_at_the_header_deadline() {
    let header_timeout = Duration::from_secs(2);
    let (address, connector) = started(Limits {
        header_timeout,
        ..Limits::default()
    })
    .await;
    let mut silent = connect(address, &connector).await;
    let mut preface = connect(address, &connector).await;
    preface
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    preface.flush().await.unwrap();
    let bound = header_timeout + Duration::from_secs(5);
    assert!(
        closed(&mut silent, bound).await,
        "a silent client stayed open"
    );
    assert!(
        closed(&mut preface, bound).await,
        "an HTTP/2 preface stayed open"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let (address, connector) = started(Limits {
        max_connections: 2,
        header_timeout: Duration::from_secs(60),
        ..Limits::default()
    })
    .await;
    let first = connect(address, &connector).await;
    let _second = connect(address, &connector).await;
    // The third TCP connection is queued, not accepted: its handshake does not finish.
    let tcp = TcpStream::connect(address).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let third = tokio::spawn({
        let connector = connector.clone();
        async move { connector.connect(name, tcp).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap"
    );
    drop(first);
    let third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("the freed slot was not reused")
        .unwrap();
    assert!(third.is_ok());
}
