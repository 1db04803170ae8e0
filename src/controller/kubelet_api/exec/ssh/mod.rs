//! SSH into a burst pod for `kubectl exec` and `kubectl port-forward`: the node's ed25519 key,
//! one connection per request to the address the cloud reports (RunPod's `ssh.direct`), bounded
//! connect and handshake times, only a server holding one of the host keys recorded for the
//! pod's instance (`HostKeys`: what its container printed, read through the cloud's
//! authenticated log), an exec channel (with a PTY and window changes for a terminal) or a
//! `direct-tcpip` channel. Channels the server opens towards us end the connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use russh::ChannelMsg;
use russh::ChannelReadHalf;
use russh::client::{self, Handle};
use russh::keys::{HashAlg, PrivateKeyWithHashAlg, PublicKey};

use super::portforward::Connection;
use super::remotecommand::{ExecEnd, ExecIo, ExecOptions};
use crate::controller::kubelet_api::spdy::session::StreamWriter;
pub use crate::controller::node::exec_key::{HostKeys, NodeKey};

/// The ciphers offered, best first.
const CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::AES_128_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_192_CTR,
    russh::cipher::AES_128_CTR,
];

/// A bridge connection's SSH window, packet size and packets buffered per channel: at most
/// 8 x 32 KiB = 256 KiB unread per connection it carries.
pub const BRIDGE_WINDOW: u32 = 256 * 1024;
pub const BRIDGE_PACKET: u32 = 32 * 1024;
pub const BRIDGE_BUFFERED_PACKETS: usize = 8;

/// Connecting and authenticating together may take this long; then the user gets an error.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("no SSH connection to {address} within {CONNECT_TIMEOUT:?}: {reason}")]
    Connect { address: String, reason: String },
    #[error(
        "the pod's SSH server refused the node's key (was the pod created before exec was turned on, or is its image without the key's sshd?)"
    )]
    Refused,
    #[error(
        "the SSH server at the pod's address presented host key {seen}, not one its instance {instance} printed when it started ({recorded}): refusing to connect (the address may belong to another machine now)"
    )]
    HostKeyMismatch {
        seen: String,
        instance: String,
        recorded: String,
    },
    #[error("SSH: {0}")]
    Protocol(String),
}

/// The host keys a connection accepts: those recorded for one instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub instance: String,
    pub fingerprints: Vec<String>,
}

impl Expected {
    /// `Ok` when `fingerprint` is one of the instance's recorded keys.
    fn check(&self, fingerprint: &str) -> Result<(), SshError> {
        if self.fingerprints.iter().any(|known| known == fingerprint) {
            return Ok(());
        }
        Err(SshError::HostKeyMismatch {
            seen: fingerprint.to_owned(),
            instance: self.instance.clone(),
            recorded: self.fingerprints.join(", "),
        })
    }
}

/// Where a pod's sshd listens.
pub type Target = crate::provider::SshAddress;

struct Checker {
    pod: String,
    expected: Expected,
    refusal: Arc<Mutex<Option<SshError>>>,
    /// Where `forwarded-tcpip` channels go on a connection that asked for remote forwards
    /// (the network bridge); `None` refuses them like every other channel.
    forwarded: Option<Arc<dyn Forwarded>>,
}

/// Takes the connections the pod's sshd forwards back for the remote forwards a bridge asked
/// for. `accept` must not block: it hands the channel to a task (or drops it, which closes it).
pub trait Forwarded: Send + Sync + 'static {
    fn accept(&self, channel: russh::Channel<client::Msg>, address: &str, port: u32);
}

impl Checker {
    /// The pod's sshd opened a channel towards the controller. We never ask for forwarding,
    /// X11 or an agent, so it has no business doing so: an image that floods channel-opens
    /// would otherwise make the controller keep each one (russh confirms them) until it runs
    /// out of memory, and while it is down nothing stops deleted pods billing. The connection
    /// is ended at the first one.
    fn refuse_channel(&self, kind: &str) -> Result<(), russh::Error> {
        tracing::warn!(pod = %self.pod, kind, "the pod's SSH server opened a channel; disconnecting");
        *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(SshError::Protocol(format!(
                "the pod's SSH server opened a {kind} channel towards the controller, which never \
                 asks for one; the connection was closed"
            )));
        Err(russh::Error::Inconsistent)
    }
}

impl client::Handler for Checker {
    type Error = russh::Error;

    async fn server_channel_open_session(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("session")
    }

    async fn server_channel_open_direct_tcpip(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &str,
        _: u32,
        _: &str,
        _: u32,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("direct-tcpip")
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: russh::Channel<client::Msg>,
        connected_address: &str,
        connected_port: u32,
        _: &str,
        _: u32,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        match &self.forwarded {
            Some(forwarded) => {
                forwarded.accept(channel, connected_address, connected_port);
                Ok(())
            }
            None => self.refuse_channel("forwarded-tcpip"),
        }
    }

    async fn server_channel_open_direct_streamlocal(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &str,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("direct-streamlocal")
    }

    async fn server_channel_open_forwarded_streamlocal(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &str,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("forwarded-streamlocal")
    }

    async fn server_channel_open_agent_forward(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("agent")
    }

    async fn server_channel_open_x11(
        &mut self,
        _: russh::Channel<client::Msg>,
        _: &str,
        _: u32,
        _: &mut client::Session,
    ) -> Result<(), Self::Error> {
        self.refuse_channel("x11")
    }

    async fn check_server_key(&mut self, key: &PublicKey) -> Result<bool, Self::Error> {
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        match self.expected.check(&fingerprint) {
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
    /// Why the connection was ended from our side, if it was (a channel the server opened).
    refusal: Arc<Mutex<Option<SshError>>>,
}

/// Connects to `target` for the pod `pod_uid`, to a server holding one of the `expected` host
/// keys only, authenticated with `key`.
pub async fn connect(
    target: &Target,
    pod_uid: &str,
    key: &NodeKey,
    expected: &Expected,
) -> Result<Session, SshError> {
    open(target, pod_uid, key, expected, None).await
}

/// Connects as `connect` does, for a connection that will ask for remote forwards: the
/// `forwarded-tcpip` channels the server opens for them go to `forwarded`.
pub async fn connect_forwarding(
    target: &Target,
    pod_uid: &str,
    key: &NodeKey,
    expected: &Expected,
    forwarded: Arc<dyn Forwarded>,
) -> Result<Session, SshError> {
    open(target, pod_uid, key, expected, Some(forwarded)).await
}

async fn open(
    target: &Target,
    pod_uid: &str,
    key: &NodeKey,
    expected: &Expected,
    forwarded: Option<Arc<dyn Forwarded>>,
) -> Result<Session, SshError> {
    let address = format!("{}:{}", target.host, target.port);
    let refusal = Arc::new(Mutex::new(None));
    let bridge = forwarded.is_some();
    let checker = Checker {
        pod: pod_uid.to_owned(),
        expected: expected.clone(),
        refusal: refusal.clone(),
        forwarded,
    };
    let mut config = client::Config {
        inactivity_timeout: None,
        keepalive_interval: Some(Duration::from_secs(30)),
        // AES-GCM first: with the AES instructions every server CPU has, it carries bulk data
        // faster than ChaCha20 (russh's first choice); any sshd offers one of them.
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Borrowed(CIPHERS),
            ..Default::default()
        },
        ..Default::default()
    };
    if bridge {
        // A bridge carries many connections for a long time: what one channel may hold unread
        // in the controller is bounded (packets x packet size), not just its window.
        config.window_size = BRIDGE_WINDOW;
        config.maximum_packet_size = BRIDGE_PACKET;
        config.channel_buffer_size = BRIDGE_BUFFERED_PACKETS;
    }
    let config = Arc::new(config);
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
                PrivateKeyWithHashAlg::new(key.private(), hash),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((handle, auth.success()))
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok((handle, true))) => Ok(Session { handle, refusal }),
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

/// Whether anything accepts TCP connections at `target` (no SSH byte is sent): before the
/// host keys are read from the log, a pod without an SSH server gets that plain answer.
pub async fn reachable(target: &Target) -> Result<(), SshError> {
    let address = format!("{}:{}", target.host, target.port);
    match tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((target.host.as_str(), target.port)),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(SshError::Connect {
            address,
            reason: error.to_string(),
        }),
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

/// A signal as the exit code a shell reports for it (128 + its number; 137 when unknown).
fn signal_code(signal: &russh::Sig) -> i32 {
    use russh::Sig;
    128 + match signal {
        Sig::HUP => 1,
        Sig::INT => 2,
        Sig::QUIT => 3,
        Sig::ILL => 4,
        Sig::ABRT => 6,
        Sig::FPE => 8,
        Sig::KILL => 9,
        Sig::USR1 => 10,
        Sig::SEGV => 11,
        Sig::PIPE => 13,
        Sig::ALRM => 14,
        Sig::TERM => 15,
        _ => 9,
    }
}

/// Where the command's output goes, and how it ended so far.
struct Output<'a> {
    stdout: Option<&'a StreamWriter>,
    stderr: Option<&'a StreamWriter>,
    code: Option<i32>,
    /// kubectl stopped reading.
    lost: bool,
}

impl Output<'_> {
    /// Delivers one channel message; `Some(reply)` for a request's success or failure.
    async fn deliver(&mut self, message: ChannelMsg) -> Option<bool> {
        match message {
            ChannelMsg::Data { data } => {
                if let Some(out) = self.stdout
                    && out.write(&data).await.is_err()
                {
                    self.lost = true;
                }
            }
            ChannelMsg::ExtendedData { data, ext: 1 } => {
                if let Some(err) = self.stderr.or(self.stdout)
                    && err.write(&data).await.is_err()
                {
                    self.lost = true;
                }
            }
            ChannelMsg::ExitStatus { exit_status } => {
                self.code = Some(i32::try_from(exit_status).unwrap_or(255));
            }
            ChannelMsg::ExitSignal { signal_name, .. } => {
                self.code = self.code.or(Some(signal_code(&signal_name)));
            }
            ChannelMsg::Success => return Some(true),
            ChannelMsg::Failure => return Some(false),
            _ => {}
        }
        None
    }
}

/// Waits (bounded) for the answer to a request sent with `want_reply`.
async fn reply(
    read: &mut ChannelReadHalf,
    output: &mut Output<'_>,
    what: &str,
) -> Result<(), String> {
    let waiting = async {
        loop {
            match read.wait().await {
                Some(message) => {
                    if let Some(granted) = output.deliver(message).await {
                        return if granted {
                            Ok(())
                        } else {
                            Err(format!("the pod's SSH server refused the {what} request"))
                        };
                    }
                }
                None => {
                    return Err(format!(
                        "the pod's SSH server closed the channel at the {what} request"
                    ));
                }
            }
        }
    };
    tokio::time::timeout(CONNECT_TIMEOUT, waiting)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer to the {what} request within {CONNECT_TIMEOUT:?}"
            ))
        })
}

impl Session {
    /// Runs the command; its exit status is the exit code (a signal: 128 + its number). Stops
    /// the command (closing the channel: sshd hangs it up) when kubectl goes away.
    pub async fn exec(self, options: &ExecOptions, io: ExecIo) -> ExecEnd {
        let ExecIo {
            stdin,
            stdout,
            stderr,
            mut resize,
            mut gone,
        } = io;
        let mut output = Output {
            stdout: stdout.as_ref(),
            stderr: stderr.as_ref(),
            code: None,
            lost: false,
        };
        let result: Result<Option<i32>, String> = async {
            let channel = tokio::time::timeout(CONNECT_TIMEOUT, self.handle.channel_open_session())
                .await
                .map_err(|_| "no session channel within the connect bound".to_owned())?
                .map_err(|e| format!("SSH: {e}"))?;
            let (mut read, write) = channel.split();
            if options.tty {
                // The first size comes with the session; start from a common one.
                let (cols, rows) = match resize.as_mut().map(|r| r.try_recv()) {
                    Some(Ok(size)) => (u32::from(size.width), u32::from(size.height)),
                    _ => (80, 24),
                };
                write
                    .request_pty(true, "xterm", cols, rows, 0, 0, &[])
                    .await
                    .map_err(|e| format!("SSH: {e}"))?;
                reply(&mut read, &mut output, "terminal").await?;
            }
            write
                .exec(true, command_line(&options.command))
                .await
                .map_err(|e| format!("SSH: {e}"))?;
            reply(&mut read, &mut output, "exec").await?;
            // Input on its own task, so the output is always read: a peer that must wait
            // for window space while nobody reads would never get it.
            let input = tokio::spawn(pump_input(write, stdin, resize));
            loop {
                tokio::select! {
                    message = read.wait() => match message {
                        Some(message) => {
                            output.deliver(message).await;
                            if output.lost {
                                break;
                            }
                        }
                        None => break,
                    },
                    changed = gone.changed() => {
                        if changed.is_err() || *gone.borrow() {
                            output.lost = true;
                            break;
                        }
                    }
                }
            }
            input.abort();
            Ok(output.code)
        }
        .await;
        // Ends the remote command with its session when kubectl left (sshd hangs it up).
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
        let refused = self
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(refused) = refused {
            return ExecEnd::Failed(refused.to_string());
        }
        match result {
            Ok(_) if output.lost => {
                ExecEnd::Failed("kubectl went away; the command was stopped".to_owned())
            }
            Ok(Some(code)) => ExecEnd::Exited(code),
            Ok(None) => ExecEnd::Failed(
                "the pod's SSH server closed the session without an exit status".to_owned(),
            ),
            Err(message) => ExecEnd::Failed(message),
        }
    }

    /// A byte stream to `127.0.0.1:port` inside the pod, on this connection.
    pub async fn forward(&self, port: u16) -> Result<Box<dyn Connection>, SshError> {
        let channel = tokio::time::timeout(
            CONNECT_TIMEOUT,
            self.handle
                .channel_open_direct_tcpip("127.0.0.1", u32::from(port), "127.0.0.1", 0),
        )
        .await
        .map_err(|_| {
            SshError::Protocol(format!(
                "opening port {port}: no answer within {CONNECT_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| SshError::Protocol(format!("opening port {port}: {e}")))?;
        Ok(Box::new(channel.into_stream()))
    }

    /// Whether the connection is still up.
    pub fn is_closed(&self) -> bool {
        self.handle.is_closed()
    }
}

/// kubectl's input and terminal size changes, written to the command's channel until both end;
/// then held until the command ends, so the channel stays open for its output.
async fn pump_input(
    write: russh::ChannelWriteHalf<client::Msg>,
    mut stdin: Option<tokio::sync::mpsc::Receiver<bytes::Bytes>>,
    mut resize: Option<tokio::sync::mpsc::Receiver<super::remotecommand::TerminalSize>>,
) {
    let mut stdin_open = stdin.is_some();
    let mut resize_open = resize.is_some();
    while stdin_open || resize_open {
        tokio::select! {
            data = async { stdin.as_mut()?.recv().await }, if stdin_open => match data {
                Some(data) => {
                    if write.data(&data[..]).await.is_err() {
                        break;
                    }
                }
                None => {
                    stdin_open = false;
                    let _ = write.eof().await;
                }
            },
            size = async { resize.as_mut()?.recv().await }, if resize_open => match size {
                Some(size) => {
                    let _ = write
                        .window_change(u32::from(size.width), u32::from(size.height), 0, 0)
                        .await;
                }
                None => resize_open = false,
            },
        }
    }
    std::future::pending::<()>().await;
}

mod remote;
#[cfg(test)]
mod tests;
