//! Running one probe or hook inside the pod, over the node's SSH connection to it: a command,
//! an HTTP(S) GET or a TCP connection to the pod's loopback (the path `kubectl port-forward`
//! takes). The answer is success, the failure as the kubelet words it, or that the pod could
//! not be reached (which says nothing of the container).

use std::time::Duration;

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

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
pub(crate) enum Failure {
    /// The container answered wrong, or not in time: the kubelet's message.
    Failed(String),
    /// The pod could not be reached (the SSH connection is down or silent): no result.
    Unreached(String),
}

impl Failure {
    pub(crate) fn message(&self) -> &str {
        match self {
            Failure::Failed(message) | Failure::Unreached(message) => message,
        }
    }
}

/// Runs `check`, the container's part within `timeout`.
pub(crate) async fn check(
    session: &Session,
    check: &Check,
    timeout: Duration,
) -> Result<(), Failure> {
    match check {
        Check::Exec(command) => exec(session, command, timeout).await,
        Check::Tcp { port } => open(session, *port).await.map(drop),
        Check::Http {
            https,
            server_name,
            port,
            path,
            host,
            headers,
        } => {
            let stream = open(session, *port).await?;
            let tls = https.then_some(server_name.as_deref());
            let get = http(stream, tls, *port, path, host.as_deref(), headers);
            match tokio::time::timeout(timeout, get).await {
                Ok(outcome) => outcome.map_err(Failure::Failed),
                Err(_) => Err(Failure::Failed(format!(
                    "Get \"{}\": context deadline exceeded",
                    url(*https, *port, path)
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

fn url(https: bool, port: u16, path: &str) -> String {
    let scheme = if https { "https" } else { "http" };
    format!("{scheme}://127.0.0.1:{port}{path}")
}

/// The GET over `stream` (through TLS when `tls` is set, saying its server name if any), as
/// the kubelet's HTTP probe sends it.
async fn http<S>(
    stream: S,
    tls: Option<Option<&str>>,
    port: u16,
    path: &str,
    host: Option<&str>,
    headers: &[(String, String)],
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let url = url(tls.is_some(), port, path);
    if let Some(server_name) = tls {
        let config = super::tls::probe_config()?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(super::tls::server_name(server_name), stream)
            .await
            .map_err(|error| format!("Get \"{url}\": {error}"))?;
        get(stream, &url, port, path, host, headers).await
    } else {
        get(stream, &url, port, path, host, headers).await
    }
}

async fn get<S>(
    stream: S,
    url: &str,
    port: u16,
    path: &str,
    host: Option<&str>,
    headers: &[(String, String)],
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A self-signed HTTPS server answering every request with `status`; returns its port and
    /// the requests it read.
    async fn https_server(status: u16) -> (u16, Arc<std::sync::Mutex<Vec<String>>>) {
        let key = rcgen::generate_simple_self_signed(vec!["pod.local".to_owned()]).unwrap();
        let certs = vec![key.cert.der().clone()];
        let private =
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.signing_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, private)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let requests = seen.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    continue;
                };
                let mut buf = vec![0u8; 4096];
                let n = tls.read(&mut buf).await.unwrap_or(0);
                requests
                    .lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let answer = format!(
                    "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn an_https_probe_speaks_tls_and_takes_any_certificate() {
        let (port, seen) = https_server(204).await;
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let headers = [("X-Probe".to_owned(), "1".to_owned())];
        http(
            stream,
            Some(Some("pod.local")),
            port,
            "/healthz",
            Some("example"),
            &headers,
        )
        .await
        .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests[0].starts_with("GET /healthz HTTP/1.1"),
            "{requests:?}"
        );
        assert!(
            requests[0].contains("user-agent: kube-probe/1.20"),
            "{requests:?}"
        );
        assert!(requests[0].contains("x-probe: 1"), "{requests:?}");
        assert!(requests[0].contains("host: example"), "{requests:?}");
    }

    #[tokio::test]
    async fn an_https_probe_fails_on_an_error_status_and_on_plain_http() {
        let (port, _) = https_server(503).await;
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let error = http(stream, Some(None), port, "/", None, &[])
            .await
            .unwrap_err();
        assert_eq!(error, "HTTP probe failed with statuscode: 503");
        // A plain-HTTP GET to a TLS port is no success.
        let stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        assert!(http(stream, None, port, "/", None, &[]).await.is_err());
    }

    #[test]
    fn the_server_name_is_the_host_when_it_is_a_dns_name() {
        use rustls::pki_types::ServerName;
        assert_eq!(
            super::super::tls::server_name(Some("pod.local:8443")),
            ServerName::try_from("pod.local").unwrap()
        );
        assert!(matches!(
            super::super::tls::server_name(None),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            super::super::tls::server_name(Some("10.0.0.1")),
            ServerName::IpAddress(_)
        ));
    }
}
