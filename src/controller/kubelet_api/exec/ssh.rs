//! SSH into a burst pod for `kubectl exec` and `kubectl port-forward`: the node's ed25519 key,
//! one connection per request to the address the cloud reports (RunPod's `ssh.direct`), bounded
//! connect and handshake times, the pod's host key pinned at its first connection, an exec
//! channel (with a PTY and window changes for a terminal) or a `direct-tcpip` channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use russh::client::{self, Handle};
use russh::keys::ssh_key::LineEnding;
use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{HashAlg, PrivateKey, PrivateKeyWithHashAlg, PublicKey};

use super::portforward::Connection;
use super::remotecommand::{ExecEnd, ExecIo, ExecOptions};

/// Connecting and authenticating together may take this long; then the user gets an error.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("the key is not an OpenSSH private key: {0}")]
    Key(String),
    #[error("no SSH connection to {address} within {CONNECT_TIMEOUT:?}: {reason}")]
    Connect { address: String, reason: String },
    #[error(
        "the pod's SSH server refused the node's key (was the pod created before exec was turned on, or is its image without the key's sshd?)"
    )]
    Refused,
    #[error(
        "the pod's SSH host key changed since the first connection ({seen}, pinned {pinned}): refusing to connect"
    )]
    HostKeyChanged { seen: String, pinned: String },
    #[error("SSH: {0}")]
    Protocol(String),
}

/// The node's key pair.
#[derive(Clone)]
pub struct NodeKey {
    private: Arc<PrivateKey>,
}

impl std::fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeKey")
            .field("public", &self.public_openssh())
            .finish()
    }
}

impl NodeKey {
    /// A new ed25519 key from the operating system's randomness.
    pub fn generate() -> Result<NodeKey, SshError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| SshError::Key("no randomness".to_owned()))?;
        Ok(NodeKey {
            private: Arc::new(PrivateKey::from(Ed25519Keypair::from_seed(&seed))),
        })
    }

    pub fn from_openssh(pem: &str) -> Result<NodeKey, SshError> {
        PrivateKey::from_openssh(pem)
            .map(|key| NodeKey {
                private: Arc::new(key),
            })
            .map_err(|e| SshError::Key(e.to_string()))
    }

    /// The private key in OpenSSH's format (for the node's Secret only).
    pub fn private_openssh(&self) -> Result<String, SshError> {
        self.private
            .to_openssh(LineEnding::LF)
            .map(|pem| pem.to_string())
            .map_err(|e| SshError::Key(e.to_string()))
    }

    /// `ssh-ed25519 AAAA...`: what a pod's `PUBLIC_KEY` carries.
    pub fn public_openssh(&self) -> String {
        self.private.public_key().to_openssh().unwrap_or_default()
    }
}

/// Host keys seen per pod (by UID), pinned for the pod's life in this process.
#[derive(Clone, Debug, Default)]
pub struct HostKeys(Arc<Mutex<HashMap<String, String>>>);

impl HostKeys {
    /// `Ok` when `fingerprint` is the pod's pinned key or the first one seen.
    fn check(&self, pod: &str, fingerprint: &str) -> Result<(), SshError> {
        let mut pinned = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match pinned.get(pod) {
            Some(known) if known != fingerprint => Err(SshError::HostKeyChanged {
                seen: fingerprint.to_owned(),
                pinned: known.clone(),
            }),
            Some(_) => Ok(()),
            None => {
                pinned.insert(pod.to_owned(), fingerprint.to_owned());
                Ok(())
            }
        }
    }

    /// Forgets pods that are gone.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|pod, _| live(pod));
    }
}

/// Where a pod's sshd listens.
pub type Target = crate::provider::SshAddress;

struct Checker {
    pod: String,
    host_keys: HostKeys,
    refusal: Arc<Mutex<Option<SshError>>>,
}

impl client::Handler for Checker {
    type Error = russh::Error;

    async fn check_server_key(&mut self, key: &PublicKey) -> Result<bool, Self::Error> {
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        match self.host_keys.check(&self.pod, &fingerprint) {
            Ok(()) => Ok(true),
            Err(error) => {
                *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                Ok(false)
            }
        }
    }
}

/// An authenticated connection to one pod.
pub struct Session {
    handle: Handle<Checker>,
}

/// Connects to `target` as the pod `pod_uid` (its host key pinned), authenticated with `key`.
pub async fn connect(
    target: &Target,
    pod_uid: &str,
    key: &NodeKey,
    host_keys: &HostKeys,
) -> Result<Session, SshError> {
    let address = format!("{}:{}", target.host, target.port);
    let refusal = Arc::new(Mutex::new(None));
    let checker = Checker {
        pod: pod_uid.to_owned(),
        host_keys: host_keys.clone(),
        refusal: refusal.clone(),
    };
    let config = Arc::new(client::Config {
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        ..Default::default()
    });
    let connecting = async {
        let mut handle = client::connect(config, (target.host.as_str(), target.port), checker)
            .await
            .map_err(|e| e.to_string())?;
        let hash = handle
            .best_supported_rsa_hash()
            .await
            .map_err(|e| e.to_string())?
            .flatten();
        let auth = handle
            .authenticate_publickey(
                target.user.clone(),
                PrivateKeyWithHashAlg::new(key.private.clone(), hash),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((handle, auth.success()))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok((handle, true))) => Ok(Session { handle }),
        Ok(Ok((_, false))) => Err(SshError::Refused),
        Ok(Err(reason)) => Err(refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or(SshError::Connect { address, reason })),
        Err(_) => Err(SshError::Connect {
            address,
            reason: "timed out".to_owned(),
        }),
    }
}

/// A Kubernetes command as one shell line (the SSH protocol carries a string).
pub fn command_line(command: &[String]) -> String {
    shlex::try_join(command.iter().map(String::as_str)).unwrap_or_else(|_| command.join(" "))
}

impl Session {
    /// Runs the command; its exit status is the exit code (a signal: 128 + its number when
    /// known, else 137).
    pub async fn exec(self, options: &ExecOptions, mut io: ExecIo) -> ExecEnd {
        let result = async {
            let mut channel = self.handle.channel_open_session().await?;
            if options.tty {
                // The first resize comes with the session; start from a common size.
                let (cols, rows) = match io.resize.as_mut().map(|r| r.try_recv()) {
                    Some(Ok(size)) => (u32::from(size.width), u32::from(size.height)),
                    _ => (80, 24),
                };
                channel
                    .request_pty(true, "xterm", cols, rows, 0, 0, &[])
                    .await?;
            }
            channel.exec(true, command_line(&options.command)).await?;
            let mut stdin_open = io.stdin.is_some();
            let mut resize_open = io.resize.is_some();
            let mut code = None;
            loop {
                tokio::select! {
                    data = async { io.stdin.as_mut()?.recv().await }, if stdin_open => match data {
                        Some(data) => channel.data(&data[..]).await?,
                        None => {
                            stdin_open = false;
                            channel.eof().await?;
                        }
                    },
                    size = async { io.resize.as_mut()?.recv().await }, if resize_open => match size {
                        Some(size) => {
                            channel
                                .window_change(u32::from(size.width), u32::from(size.height), 0, 0)
                                .await?;
                        }
                        None => resize_open = false,
                    },
                    message = channel.wait() => match message {
                        Some(ChannelMsg::Data { data }) => {
                            if let Some(out) = &io.stdout {
                                let _ = out.write(&data).await;
                            }
                        }
                        Some(ChannelMsg::ExtendedData { data, ext: 1 }) => {
                            if let Some(err) = io.stderr.as_ref().or(io.stdout.as_ref()) {
                                let _ = err.write(&data).await;
                            }
                        }
                        Some(ChannelMsg::ExitStatus { exit_status }) => {
                            code = Some(i32::try_from(exit_status).unwrap_or(255));
                        }
                        Some(ChannelMsg::ExitSignal { .. }) => {
                            code = code.or(Some(137));
                        }
                        Some(_) => {}
                        None => break,
                    },
                }
            }
            Ok::<_, russh::Error>(code)
        }
        .await;
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
        match result {
            Ok(Some(code)) => ExecEnd::Exited(code),
            Ok(None) => ExecEnd::Failed(
                "the pod's SSH server closed the session without an exit status".to_owned(),
            ),
            Err(error) => ExecEnd::Failed(format!("SSH: {error}")),
        }
    }

    /// A byte stream to `127.0.0.1:port` inside the pod. The connection stays open as long as
    /// the stream does.
    pub async fn forward(self, port: u16) -> Result<Box<dyn Connection>, SshError> {
        let channel = self
            .handle
            .channel_open_direct_tcpip("127.0.0.1", u32::from(port), "127.0.0.1", 0)
            .await
            .map_err(|e| SshError::Protocol(format!("opening port {port}: {e}")))?;
        Ok(Box::new(Forwarded {
            stream: channel.into_stream(),
            _handle: self.handle,
        }))
    }
}

/// A forwarded stream that owns its connection.
struct Forwarded<S> {
    stream: S,
    _handle: Handle<Checker>,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Forwarded<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Forwarded<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_round_trips_through_openssh_text() {
        let key = NodeKey::generate().unwrap();
        let pem = key.private_openssh().unwrap();
        assert!(pem.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"));
        let again = NodeKey::from_openssh(&pem).unwrap();
        assert_eq!(again.public_openssh(), key.public_openssh());
        assert!(key.public_openssh().starts_with("ssh-ed25519 "));
        assert!(!format!("{key:?}").contains("PRIVATE"));
        assert!(NodeKey::from_openssh("not a key").is_err());
    }

    #[test]
    fn host_keys_are_pinned_per_pod() {
        let keys = HostKeys::default();
        assert!(keys.check("pod-a", "SHA256:one").is_ok());
        assert!(keys.check("pod-a", "SHA256:one").is_ok());
        assert!(matches!(
            keys.check("pod-a", "SHA256:two"),
            Err(SshError::HostKeyChanged { .. })
        ));
        assert!(keys.check("pod-b", "SHA256:two").is_ok());
        keys.retain(|pod| pod == "pod-b");
        assert!(
            keys.check("pod-a", "SHA256:two").is_ok(),
            "a gone pod is forgotten"
        );
    }

    #[test]
    fn commands_are_quoted_for_the_remote_shell() {
        let command = ["sh", "-c", "echo out; exit 3"].map(String::from);
        assert_eq!(command_line(&command), "sh -c 'echo out; exit 3'");
    }
}
