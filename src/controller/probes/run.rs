//! Running one probe inside the pod, over the node's SSH connection to it: a command, an HTTP
//! GET or a TCP connection to the pod's loopback (the path `kubectl port-forward` takes).
//! The answer is success, or the failure as the kubelet words it.

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use super::spec::Check;
use crate::controller::kubelet_api::exec::ssh::Session;

/// The User-Agent the kubelet's HTTP probes send.
const USER_AGENT: &str = "kube-probe/1.20";

/// Runs `check` within `timeout`; `Err` is the failure's message.
pub async fn check(session: &Session, check: &Check, timeout: Duration) -> Result<(), String> {
    match check {
        Check::Exec(command) => exec(session, command, timeout).await,
        Check::Tcp { port } => match tokio::time::timeout(timeout, session.forward(*port)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("dial tcp 127.0.0.1:{port}: {error}")),
            Err(_) => Err(format!("dial tcp 127.0.0.1:{port}: i/o timeout")),
        },
        Check::Http {
            port,
            path,
            host,
            headers,
        } => {
            let get = http(session, *port, path, host.as_deref(), headers);
            match tokio::time::timeout(timeout, get).await {
                Ok(outcome) => outcome,
                Err(_) => Err(format!(
                    "Get \"http://127.0.0.1:{port}{path}\": context deadline exceeded"
                )),
            }
        }
    }
}

async fn exec(session: &Session, command: &[String], timeout: Duration) -> Result<(), String> {
    let joined = shlex::try_join(command.iter().map(String::as_str))
        .map_err(|error| format!("the command cannot be quoted: {error}"))?;
    match session.output_within(&joined, timeout).await {
        Ok((0, _)) => Ok(()),
        Ok((code, output)) => {
            let output = String::from_utf8_lossy(&output);
            let tail: String = output.trim().chars().rev().take(300).collect();
            let tail: String = tail.chars().rev().collect();
            Err(if tail.is_empty() {
                format!("command {joined:?} exited with {code}")
            } else {
                tail
            })
        }
        Err(error) => Err(format!("command {joined:?}: {error}")),
    }
}

async fn http(
    session: &Session,
    port: u16,
    path: &str,
    host: Option<&str>,
    headers: &[(String, String)],
) -> Result<(), String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let stream = session
        .forward(port)
        .await
        .map_err(|error| format!("Get \"{url}\": dial tcp 127.0.0.1:{port}: {error}"))?;
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
