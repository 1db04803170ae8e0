//! Running one probe or hook inside the pod, over the node's SSH connection to it: a command,
//! an HTTP GET or a TCP connection to the pod's loopback (the path `kubectl port-forward`
//! takes). The answer is success, the failure as the kubelet words it, or that the pod could
//! not be reached (which says nothing of the container).

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::spec::Check;
use crate::controller::kubelet_api::exec::portforward::Connection;
use crate::controller::kubelet_api::exec::ssh::Session;

/// The User-Agent the kubelet's HTTP probes send.
const USER_AGENT: &str = "kube-probe/1.20";

/// How long opening a channel to the container's port may take: the cloud's link, not the
/// container, is slow when it takes longer, and the probe's own timeout starts after it.
const OPEN_WITHIN: Duration = Duration::from_secs(5);

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The container answered wrong, or not in time: the kubelet's message.
    Failed(String),
    /// The pod could not be reached (the SSH connection is down or silent): no result.
    Unreached(String),
}

impl Failure {
    pub fn message(&self) -> &str {
        match self {
            Failure::Failed(message) | Failure::Unreached(message) => message,
        }
    }
}

/// Runs `check`, the container's part within `timeout`.
pub async fn check(session: &Session, check: &Check, timeout: Duration) -> Result<(), Failure> {
    match check {
        Check::Exec(command) => exec(session, command, timeout).await,
        Check::Tcp { port } => open(session, *port).await.map(drop),
        Check::Http {
            port,
            path,
            host,
            headers,
        } => {
            let stream = open(session, *port).await?;
            let get = http(stream, *port, path, host.as_deref(), headers);
            match tokio::time::timeout(timeout, get).await {
                Ok(outcome) => outcome.map_err(Failure::Failed),
                Err(_) => Err(Failure::Failed(format!(
                    "Get \"http://127.0.0.1:{port}{path}\": context deadline exceeded"
                ))),
            }
        }
    }
}

/// A stream to the container's `port`: refused is the container's failure; no answer, or a
/// connection that closed, is the link's.
async fn open(session: &Session, port: u16) -> Result<Box<dyn Connection>, Failure> {
    match tokio::time::timeout(OPEN_WITHIN, session.forward(port)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) if !session.is_closed() => Err(Failure::Failed(format!(
            "dial tcp 127.0.0.1:{port}: connect: connection refused ({error})"
        ))),
        Ok(Err(error)) => Err(Failure::Unreached(error.to_string())),
        Err(_) => Err(Failure::Unreached(format!(
            "opening port {port} took longer than {OPEN_WITHIN:?}"
        ))),
    }
}

async fn exec(session: &Session, command: &[String], timeout: Duration) -> Result<(), Failure> {
    let joined = shlex::try_join(command.iter().map(String::as_str))
        .map_err(|error| Failure::Failed(format!("the command cannot be quoted: {error}")))?;
    match session.output_within(&joined, timeout).await {
        Ok((0, _)) => Ok(()),
        Ok((code, output)) => {
            let output = String::from_utf8_lossy(&output);
            let tail: String = output.trim().chars().rev().take(300).collect();
            let tail: String = tail.chars().rev().collect();
            Err(Failure::Failed(if tail.is_empty() {
                format!("command {joined:?} exited with {code}")
            } else {
                tail
            }))
        }
        Err(error) if session.is_closed() => Err(Failure::Unreached(error.to_string())),
        Err(error) => Err(Failure::Failed(format!("command {joined:?}: {error}"))),
    }
}

async fn http(
    stream: Box<dyn Connection>,
    port: u16,
    path: &str,
    host: Option<&str>,
    headers: &[(String, String)],
) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|error| format!("Get \"{url}\": {error}"))?;
    let driver = tokio::spawn(connection);
    let host = host.map_or_else(|| format!("127.0.0.1:{port}"), str::to_owned);
    let mut request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, USER_AGENT)
        .header(hyper::header::ACCEPT, "*/*");
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let request = request
        .body(Empty::<Bytes>::new())
        .map_err(|error| format!("Get \"{url}\": {error}"))?;
    let answer = sender.send_request(request).await;
    driver.abort();
    let status = answer
        .map_err(|error| format!("Get \"{url}\": {error}"))?
        .status();
    if (200..400).contains(&status.as_u16()) {
        Ok(())
    } else {
        Err(format!(
            "HTTP probe failed with statuscode: {}",
            status.as_u16()
        ))
    }
}
