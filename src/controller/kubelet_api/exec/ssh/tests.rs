use super::*;
use russh::keys::PrivateKey;

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
fn only_a_recorded_host_key_is_accepted() {
    let expected = Expected {
        instance: "pod-1".into(),
        fingerprints: vec!["SHA256:one".into(), "SHA256:two".into()],
    };
    assert!(expected.check("SHA256:two").is_ok());
    let refused = expected.check("SHA256:other").unwrap_err();
    assert!(matches!(refused, SshError::HostKeyMismatch { .. }));
    assert!(refused.to_string().contains("pod-1"), "{refused}");
    let keys = HostKeys::default();
    keys.insert("pod-1", vec!["SHA256:one".into()]);
    keys.insert("pod-2", vec!["SHA256:two".into()]);
    keys.retain(|instance| instance == "pod-2");
    assert_eq!(keys.get("pod-1"), None, "a gone instance is forgotten");
    assert_eq!(keys.get("pod-2"), Some(vec!["SHA256:two".to_owned()]));
}

#[test]
fn commands_are_quoted_for_the_remote_shell() {
    let command = ["sh", "-c", "echo out; exit 3"].map(String::from);
    assert_eq!(command_line(&command), "sh -c 'echo out; exit 3'");
}

/// An SSH server in-process: any client key logs in; an exec prints a line and exits 0, or,
/// with `flood`, is answered and then met with channel-opens from the server, as many as the
/// client confirms (up to 100,000).
mod server {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use russh::keys::ssh_key::private::Ed25519Keypair;
    use russh::server::{Auth, Msg, Session};
    use russh::{Channel, ChannelId, CryptoVec};

    use super::*;

    pub(super) struct Server {
        pub port: u16,
        pub fingerprint: String,
        /// Channels the client confirmed.
        pub opened: Arc<AtomicUsize>,
    }

    struct Handler {
        flood: bool,
        opened: Arc<AtomicUsize>,
    }

    impl russh::server::Handler for Handler {
        type Error = russh::Error;

        async fn auth_publickey(&mut self, _: &str, _: &PublicKey) -> Result<Auth, Self::Error> {
            Ok(Auth::Accept)
        }

        async fn channel_open_session(
            &mut self,
            _: Channel<Msg>,
            _: &mut Session,
        ) -> Result<bool, Self::Error> {
            Ok(true)
        }

        async fn exec_request(
            &mut self,
            channel: ChannelId,
            _: &[u8],
            session: &mut Session,
        ) -> Result<(), Self::Error> {
            session.channel_success(channel)?;
            if !self.flood {
                session.data(channel, CryptoVec::from_slice(b"hi\n"))?;
                session.exit_status_request(channel, 0)?;
                session.close(channel)?;
                return Ok(());
            }
            let handle = session.handle();
            let opened = self.opened.clone();
            tokio::spawn(async move {
                let mut kept = Vec::new();
                for _ in 0..100_000 {
                    match handle
                        .channel_open_forwarded_tcpip("127.0.0.1", 1, "203.0.113.1", 2)
                        .await
                    {
                        Ok(channel) => {
                            opened.fetch_add(1, Ordering::SeqCst);
                            kept.push(channel);
                        }
                        Err(_) => break,
                    }
                }
            });
            Ok(())
        }
    }

    pub(super) async fn start(flood: bool) -> Server {
        let host_key = PrivateKey::from(Ed25519Keypair::from_seed(&[7; 32]));
        let fingerprint = host_key
            .public_key()
            .fingerprint(HashAlg::Sha256)
            .to_string();
        let config = Arc::new(russh::server::Config {
            keys: vec![host_key],
            ..Default::default()
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let opened = Arc::new(AtomicUsize::new(0));
        let counter = opened.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let handler = Handler {
                    flood,
                    opened: counter.clone(),
                };
                let config = config.clone();
                tokio::spawn(async move {
                    if let Ok(session) = russh::server::run_stream(config, socket, handler).await {
                        let _ = session.await;
                    }
                });
            }
        });
        Server {
            port,
            fingerprint,
            opened,
        }
    }
}

fn target(port: u16) -> Target {
    Target {
        host: "127.0.0.1".into(),
        port,
        user: "root".into(),
    }
}

fn expecting(fingerprints: &[&str]) -> Expected {
    Expected {
        instance: "inst-1".into(),
        fingerprints: fingerprints.iter().map(|f| (*f).to_owned()).collect(),
    }
}

async fn run(session: Session) -> ExecEnd {
    let (_gone_tx, gone) = tokio::sync::watch::channel(false);
    let io = ExecIo {
        stdin: None,
        stdout: None,
        stderr: None,
        resize: None,
        gone,
    };
    let options = ExecOptions {
        command: vec!["true".into()],
        stdin: false,
        stdout: false,
        stderr: false,
        tty: false,
    };
    tokio::time::timeout(Duration::from_secs(20), session.exec(&options, io))
        .await
        .expect("the exec never ended")
}

/// Issue 41, item 5: the key recorded for the instance is accepted; a server presenting any
/// other is refused, however the connection is made (a restarted controller reads the record
/// from the pod, not from what it sees first).
#[tokio::test]
async fn a_server_without_the_recorded_host_key_is_refused() {
    let server = server::start(false).await;
    let key = NodeKey::generate().unwrap();
    let session = connect(
        &target(server.port),
        "uid",
        &key,
        &expecting(&[&server.fingerprint]),
    )
    .await
    .unwrap();
    assert_eq!(run(session).await, ExecEnd::Exited(0));
    let refused = connect(
        &target(server.port),
        "uid",
        &key,
        &expecting(&["SHA256:theOneTheInstancePrinted"]),
    )
    .await
    .err()
    .expect("an unrecorded host key was accepted");
    assert!(
        matches!(refused, SshError::HostKeyMismatch { .. }),
        "{refused}"
    );
}

/// Issue 41, item 2: a pod's sshd that opens channel after channel towards the controller
/// gets the connection closed at the first; the exec ends with an error instead of the
/// controller keeping 100,000 channels.
#[tokio::test]
async fn a_server_that_floods_channel_opens_is_disconnected() {
    let server = server::start(true).await;
    let key = NodeKey::generate().unwrap();
    let session = connect(
        &target(server.port),
        "uid",
        &key,
        &expecting(&[&server.fingerprint]),
    )
    .await
    .unwrap();
    match run(session).await {
        ExecEnd::Failed(message) => assert!(message.contains("opened a"), "{message}"),
        other => panic!("the exec should fail: {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let opened = server.opened.load(std::sync::atomic::Ordering::SeqCst);
    assert!(opened <= 1, "{opened} server-opened channels were kept");
}
