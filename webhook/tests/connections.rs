//! Connection limits over real TLS: idle connections are closed (h2 included, which is what the
//! apiserver speaks), concurrent connections and h2 streams are bounded, and a review in flight
//! is never cut as idle.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use runpod_webhook::serve::ServeOptions;
use support::*;
use tokio::io::AsyncReadExt;

/// Generous: only a server that never closes takes this long.
const BOUND: Duration = Duration::from_secs(10);

/// An h2 client on a fresh TLS connection; its connection task runs in the background.
async fn h2_client(server: &TestServer) -> h2::client::SendRequest<Bytes> {
    let tls = tls_connect(server.addr, &server.ca_pem, &[b"h2"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(b"h2".as_slice()));
    let (client, connection) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn a_silent_h2_connection_is_closed() {
    let options = ServeOptions {
        idle_timeout: Duration::from_millis(300),
        ..ServeOptions::default()
    };
    let server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    // TLS with ALPN h2, then nothing: not even the HTTP/2 preface.
    let mut tls = tls_connect(server.addr, &server.ca_pem, &[b"h2"])
        .await
        .unwrap();
    let closed = tokio::time::timeout(BOUND, async {
        let mut buffer = [0u8; 1024];
        while let Ok(read) = tls.read(&mut buffer).await {
            if read == 0 {
                break;
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "a client that sends nothing still holds its connection after {BOUND:?}"
    );
}

#[tokio::test]
async fn a_review_in_flight_is_not_cut_as_idle() {
    let options = ServeOptions {
        idle_timeout: Duration::from_millis(300),
        ..ServeOptions::default()
    };
    let server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    let mut client = h2_client(&server).await.ready().await.unwrap();
    let request = http::Request::post("https://localhost/mutate")
        .header("content-type", "application/json")
        .body(())
        .unwrap();
    let (response, mut body) = client.send_request(request, false).unwrap();
    // The body arrives well after the idle timeout (and the linger a closing connection gets):
    // the review is in flight all along.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    body.send_data(
        Bytes::from(serde_json::to_vec(&review(gpu_pod())).unwrap()),
        true,
    )
    .unwrap();
    let response = tokio::time::timeout(BOUND, response)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn h2_streams_per_connection_are_bounded() {
    let options = ServeOptions {
        max_concurrent_streams: 4,
        ..ServeOptions::default()
    };
    let server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    let mut client = h2_client(&server).await.ready().await.unwrap();
    let request = http::Request::get("https://localhost/healthz")
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    // By the time a response arrives, the server's SETTINGS have been applied.
    assert_eq!(response.await.unwrap().status(), 200);
    assert_eq!(client.current_max_send_streams(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_bound_wait_for_a_free_slot() {
    let options = ServeOptions {
        max_connections: 2,
        ..ServeOptions::default()
    };
    let server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    let first = tls_connect(server.addr, &server.ca_pem, &[b"h2"])
        .await
        .unwrap();
    let _second = tls_connect(server.addr, &server.ca_pem, &[b"h2"])
        .await
        .unwrap();
    let (addr, ca_pem) = (server.addr, server.ca_pem.clone());
    let third = tokio::spawn(async move { tls_connect(addr, &ca_pem, &[b"h2"]).await });
    // Time for a server without a bound to finish the handshake; with the bound, no amount of
    // time is enough while both slots are taken.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served while two were open"
    );
    drop(first);
    let third = tokio::time::timeout(BOUND, third)
        .await
        .expect("the third connection still waits after a slot was freed")
        .unwrap();
    assert!(third.is_ok(), "{:?}", third.err());
}
