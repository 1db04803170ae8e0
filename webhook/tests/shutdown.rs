//! Shutdown during a rollout: after the signal the webhook reports not ready but keeps
//! answering reviews for the drain period (endpoints still route to it), then closes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use runpod_webhook::serve::ServeOptions;
use serde_json::Value;
use support::*;

/// Generous: only a server that never gets there takes this long.
const BOUND: Duration = Duration::from_secs(30);

async fn readyz(server: &TestServer) -> http::StatusCode {
    request(
        server.addr,
        &server.ca_pem,
        "GET",
        "/readyz",
        Vec::new(),
        false,
    )
    .await
    .status
}

#[tokio::test]
async fn during_the_drain_readiness_fails_and_reviews_are_still_answered() {
    let options = ServeOptions {
        shutdown_drain: Duration::from_secs(120),
        ..ServeOptions::default()
    };
    let mut server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    assert_eq!(readyz(&server).await, 200);

    server.begin_shutdown();
    let not_ready = tokio::time::timeout(BOUND, async {
        while readyz(&server).await != 503 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(not_ready.is_ok(), "/readyz still 200 after the signal");

    for h2 in [false, true] {
        let reply = request(
            server.addr,
            &server.ca_pem,
            "POST",
            "/mutate",
            serde_json::to_vec(&review(gpu_pod())).unwrap(),
            h2,
        )
        .await;
        assert_eq!(reply.status, 200);
        let review: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(review["response"]["allowed"], true);
        assert_eq!(review["response"]["patchType"], "JSONPatch");
    }
    assert!(!server.finished_within(Duration::ZERO).await);
}

#[tokio::test]
async fn after_the_drain_the_server_closes_even_with_idle_connections() {
    let options = ServeOptions {
        shutdown_drain: Duration::from_millis(200),
        ..ServeOptions::default()
    };
    let mut server = start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await;
    // Connections that never send a request must not hold the shutdown.
    let _silent_h2 = tls_connect(server.addr, &server.ca_pem, &[b"h2"])
        .await
        .unwrap();
    let _silent_h1 = tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    server.begin_shutdown();
    assert!(
        server.finished_within(BOUND).await,
        "still serving {BOUND:?} after the signal"
    );
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "still accepting after the drain"
    );
}
