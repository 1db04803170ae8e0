//! Connection limits over real TLS: idle connections are closed (h2 included, which is what the
//! apiserver speaks), concurrent connections and h2 streams are bounded, and a review in flight
//! is never cut as idle; HTTP/1.1 headers that take too long from their first byte (slowloris)
//! close the connection, while waiting between requests does not.

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

/// A raw HTTP/1.1 review request, as bytes a client may send in any pieces.
fn raw_review_request() -> Vec<u8> {
    let body = serde_json::to_vec(&review(gpu_pod())).unwrap();
    let mut request = format!(
        "POST /mutate HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    request
}

/// Reads one HTTP/1.1 response (headers and a content-length body); returns its status line.
async fn read_response<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let read = stream.read(&mut buffer).await.unwrap();
        assert!(read > 0, "the connection closed before a whole response");
        received.extend_from_slice(&buffer[..read]);
        let text = String::from_utf8_lossy(&received).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().unwrap())
                })
                .unwrap();
            if body.len() >= length {
                return head.lines().next().unwrap().to_owned();
            }
        }
    }
}

async fn server_with_header_timeout(header_read_timeout: Duration) -> TestServer {
    let options = ServeOptions {
        header_read_timeout,
        ..ServeOptions::default()
    };
    start_with(
        opted_in_cluster(),
        policy(),
        Duration::from_secs(60),
        options,
    )
    .await
}

#[tokio::test]
async fn a_client_sending_headers_one_byte_per_second_is_disconnected() {
    let header_read_timeout = Duration::from_secs(3);
    let server = server_with_header_timeout(header_read_timeout).await;
    let tls = tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    let (mut reader, mut writer) = tokio::io::split(tls);
    let request = raw_review_request();
    let started = std::time::Instant::now();
    let trickle = tokio::spawn(async move {
        let mut sent = 0;
        for byte in request {
            if tokio::io::AsyncWriteExt::write_all(&mut writer, &[byte])
                .await
                .is_err()
            {
                break;
            }
            sent += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        sent
    });
    // Well under the idle timeout (60 s) and the ~80 s the headers take at this pace.
    let closed = tokio::time::timeout(BOUND, async {
        let mut buffer = [0u8; 1024];
        while let Ok(read) = reader.read(&mut buffer).await {
            if read == 0 {
                break;
            }
        }
    })
    .await;
    let elapsed = started.elapsed();
    trickle.abort();
    assert!(
        closed.is_ok(),
        "a client sending its headers at one byte per second still holds its connection \
         after {BOUND:?}"
    );
    assert!(
        elapsed >= header_read_timeout - Duration::from_millis(500),
        "closed after {elapsed:?}, before the header timeout"
    );
}

#[tokio::test]
async fn headers_in_pieces_within_the_timeout_are_served_and_the_clock_restarts() {
    let server = server_with_header_timeout(Duration::from_secs(2)).await;
    let mut tls = tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    // Three requests on one connection, each in pieces 400 ms apart: 1.2 s per request, 3.6 s
    // in all. Each request's clock starts at its own first byte, so none is cut.
    for _ in 0..3 {
        let request = raw_review_request();
        for piece in request.chunks(request.len().div_ceil(3)) {
            tokio::io::AsyncWriteExt::write_all(&mut tls, piece)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let status = tokio::time::timeout(BOUND, read_response(&mut tls))
            .await
            .unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    }
}

#[tokio::test]
async fn an_idle_keep_alive_connection_outlives_the_header_timeout() {
    let header_read_timeout = Duration::from_millis(500);
    let server = server_with_header_timeout(header_read_timeout).await;
    let mut tls = tls_connect(server.addr, &server.ca_pem, &[b"http/1.1"])
        .await
        .unwrap();
    for _ in 0..2 {
        tokio::io::AsyncWriteExt::write_all(&mut tls, &raw_review_request())
            .await
            .unwrap();
        let status = tokio::time::timeout(BOUND, read_response(&mut tls))
            .await
            .unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        // Waiting for the next request is idle time (60 s here), not header time.
        tokio::time::sleep(header_read_timeout * 3).await;
    }
}

/// Answers wait for the worker's other ready tasks (`serve::coalesce`): under concurrent load
/// every review still gets its own answer, none is lost or held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_keep_alive_reviews_each_get_their_own_answer() {
    answered_concurrently(false, 24, 5).await;
}

/// The same over h2, several streams in flight on each connection (as the apiserver sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_h2_streams_each_get_their_own_answer() {
    answered_concurrently(true, 4, 24).await;
}

/// `connections` connections, each with `reviews` reviews: one after another on HTTP/1.1, all at
/// once on h2. Every answer must carry its review's uid and a patch.
async fn answered_concurrently(h2: bool, connections: usize, reviews: usize) {
    let server = start(opted_in_cluster(), policy(), Duration::from_secs(3600)).await;
    let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
    let mut clients = tokio::task::JoinSet::new();
    for connection in 0..connections {
        let tls = tls_connect(server.addr, &server.ca_pem, &[alpn])
            .await
            .unwrap();
        let io = hyper_util::rt::TokioIo::new(tls);
        let one_review = move |number: usize| {
            let uid = format!("review-{connection}-{number}");
            let mut body = review(gpu_pod());
            body["request"]["uid"] = uid.clone().into();
            let request = http::Request::post("https://localhost/mutate")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(Bytes::from(
                    serde_json::to_vec(&body).unwrap(),
                )))
                .unwrap();
            (uid, request)
        };
        if h2 {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            for number in 0..reviews {
                let mut sender = sender.clone();
                let (uid, request) = one_review(number);
                clients.spawn(async move {
                    let response = sender.send_request(request).await.unwrap();
                    check_answer(response, &uid).await;
                });
            }
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            clients.spawn(async move {
                for number in 0..reviews {
                    let (uid, request) = one_review(number);
                    let response = sender.send_request(request).await.unwrap();
                    check_answer(response, &uid).await;
                }
            });
        }
    }
    let expected = clients.len();
    let all = tokio::time::timeout(BOUND, async {
        let mut done = 0;
        while let Some(client) = clients.join_next().await {
            client.unwrap();
            done += 1;
        }
        done
    })
    .await
    .expect("every review is answered");
    assert_eq!(all, expected);
}

async fn check_answer(response: http::Response<hyper::body::Incoming>, uid: &str) {
    assert_eq!(response.status(), http::StatusCode::OK);
    let answer = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    assert_eq!(answer["response"]["uid"], uid);
    assert!(answer["response"]["patch"].is_string(), "{answer}");
}
