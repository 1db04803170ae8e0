//! Following logs when the service closes the stream cleanly without sending a line: the
//! client keeps following, but backs off (growing, capped) instead of reconnecting several
//! times a second, and reconnects promptly again once lines arrive. Runs on paused time
//! against a tiny local server, so ten minutes of following take no real time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use runpod_kubelet::http::ApiKey;
use runpod_kubelet::runpod::client::RunPodClient;
use runpod_kubelet::runpod::config::ClientConfig;
use runpod_kubelet::runpod::logs::LogRequest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// What the server has seen and what it sends next.
#[derive(Default)]
struct Server {
    /// When each log request arrived (paused clock).
    opened: Vec<Instant>,
    /// Lines to send on the next stream (then close); empty: close at once, cleanly.
    next_lines: Vec<String>,
}

/// Answers every request with a complete SSE body: the queued lines, or nothing.
async fn serve(listener: TcpListener, server: Arc<Mutex<Server>>) {
    let mut next_id = 0u64;
    while let Ok((mut socket, _)) = listener.accept().await {
        let mut request = Vec::new();
        let mut buf = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => request.extend_from_slice(&buf[..n]),
            }
        }
        let lines = {
            let mut server = server.lock().unwrap();
            server.opened.push(Instant::now());
            std::mem::take(&mut server.next_lines)
        };
        let body: String = lines
            .iter()
            .map(|line| {
                next_id += 1;
                format!("id: {next_id}\ndata: {{\"line\":\"{line}\"}}\n\n")
            })
            .collect();
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(response.as_bytes()).await;
        let _ = socket.shutdown().await;
    }
}

fn opened(server: &Mutex<Server>) -> Vec<Instant> {
    server.lock().unwrap().opened.clone()
}

#[tokio::test(start_paused = true)]
async fn clean_closes_without_lines_back_off_and_lines_reset_the_backoff() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = Arc::new(Mutex::new(Server::default()));
    tokio::spawn(serve(listener, Arc::clone(&server)));
    let client = RunPodClient::new(
        ClientConfig {
            api_url: url,
            // The limiter must not be what slows reconnects down.
            requests_per_minute: 100_000,
            ..ClientConfig::default()
        },
        ApiKey::new("rpa_TESTKEY".to_owned()).unwrap(),
    )
    .unwrap();
    let mut follow = client.logs(
        "pod00000000001",
        LogRequest {
            follow: true,
            ..LogRequest::default()
        },
    );

    // Ten minutes of a stream that closes cleanly with nothing in it: still followed.
    let quiet = tokio::time::timeout(Duration::from_secs(600), follow.next()).await;
    assert!(quiet.is_err(), "no line, no end: {quiet:?}");
    let quiet_opens = opened(&server);
    assert!(quiet_opens.len() >= 5, "it keeps reconnecting");
    // Backing off to a capped delay: about one reconnect per 15-30 s, not several a second.
    assert!(
        quiet_opens.len() <= 50,
        "{} reconnects in ten minutes",
        quiet_opens.len()
    );
    let gaps: Vec<Duration> = quiet_opens.windows(2).map(|w| w[1] - w[0]).collect();
    let last = *gaps.last().unwrap();
    assert!(last >= Duration::from_secs(10), "the delay grew: {gaps:?}");
    assert!(
        last <= Duration::from_secs(31),
        "the delay is capped: {gaps:?}"
    );

    // A line arrives: it is delivered, and the backoff starts over.
    server.lock().unwrap().next_lines = vec!["hello".to_owned()];
    let line = tokio::time::timeout(Duration::from_secs(60), follow.next())
        .await
        .expect("the line within the capped delay")
        .expect("still following")
        .expect("no error");
    assert_eq!(line.line, "hello");
    let delivered_at = *opened(&server).last().unwrap();
    let after = tokio::time::timeout(Duration::from_secs(5), follow.next()).await;
    assert!(after.is_err(), "{after:?}");
    // The stream with the line closed, then an empty one: both reopened after short waits
    // (about 0.5 s and 1 s), not after the capped delay reached before the line.
    let reopened: Vec<Duration> = opened(&server)
        .into_iter()
        .filter(|at| *at > delivered_at)
        .map(|at| at - delivered_at)
        .collect();
    assert!(
        reopened.len() >= 2 && reopened[1] <= Duration::from_secs(3),
        "the backoff starts over after a line: reopened after {reopened:?}"
    );
}
