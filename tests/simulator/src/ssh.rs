//! A real SSH server per running pod that asked for `22/tcp` with a `PUBLIC_KEY`, as RunPod's
//! images start sshd: it listens on a loopback port that the pod's `ssh.direct` and
//! `portMappings` report, accepts only that key, runs exec requests as local processes
//! (`sh -c`, the pod's env, a working directory of the pod's own; a PTY when asked, resized on
//! window changes) and opens `direct-tcpip` channels to loopback ports. It stops when the pod
//! stops running; a restart gets a new port and a new host key, as a new container would.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use russh::keys::ssh_key::private::Ed25519Keypair;
use russh::keys::{PrivateKey, PublicKey};
use russh::server::{Auth, Handle, Msg, Session};
use russh::{Channel, ChannelId, CryptoVec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// Servers by pod id.
fn servers() -> &'static Mutex<HashMap<String, tokio::task::AbortHandle>> {
    static SERVERS: OnceLock<Mutex<HashMap<String, tokio::task::AbortHandle>>> = OnceLock::new();
    SERVERS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A started sshd: its loopback port, and the line its starter printed in the container log
/// with the host key's fingerprint (none where nothing listens).
pub(crate) struct Started {
    pub port: u32,
    pub log_line: Option<String>,
}

/// Starts the pod's sshd if it asked for one, or `None` (no key, no runtime to run it on). As
/// on RunPod, sshd runs only where something starts it: the image's own start script, which
/// runs when the pod gives no `args` (its CMD is kept) and prints `ssh-keygen -lf` of each host
/// key, or the controller's completion wrapper, which prints `runpod-kubelet:
/// ssh-host-key=SHA256:…`; a pod whose command replaced the CMD has none, and its port 22
/// refuses connections.
pub(crate) fn start(
    pod_id: &str,
    env: &BTreeMap<String, String>,
    args: &str,
    mounts: &serde_json::Value,
) -> Option<Started> {
    let keys = env.get("PUBLIC_KEY")?;
    // One key per line; the last is the controller's (a pod's own comes first).
    let authorized: Vec<PublicKey> = keys
        .lines()
        .filter_map(|line| PublicKey::from_openssh(line.trim()).ok())
        .collect();
    if authorized.is_empty() {
        return None;
    }
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
    let wrapped = args.contains("runpod_kubelet_sshd");
    if !(args.trim().is_empty() || wrapped) {
        // Nothing listens: the port is published, connections are refused.
        let port = listener.local_addr().ok()?.port();
        drop(listener);
        return Some(Started {
            port: u32::from(port),
            log_line: None,
        });
    }
    listener.set_nonblocking(true).ok()?;
    let port = listener.local_addr().ok()?.port();
    let mut seed = [0u8; 32];
    for byte in &mut seed {
        *byte = fastrand::u8(..);
    }
    let host_key = PrivateKey::from(Ed25519Keypair::from_seed(&seed));
    let fingerprint = host_key
        .public_key()
        .fingerprint(russh::keys::HashAlg::Sha256)
        .to_string();
    let log_line = if wrapped {
        format!("runpod-kubelet: ssh-host-key={fingerprint}")
    } else {
        format!("256 {fingerprint} root@{pod_id} (ED25519)")
    };
    let workdir = std::env::temp_dir().join(format!("runpod-sim-{pod_id}"));
    let _ = std::fs::create_dir_all(&workdir);
    // The container's own files: a session that writes `/etc/hosts` (the controller's network
    // bridge does) writes the pod's copy, never this machine's.
    let root = workdir.join("root");
    let _ = std::fs::create_dir_all(root.join("etc"));
    let _ = std::fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n");
    mount_volume(&root, mounts);
    let mut env = env.clone();
    env.entry("RUNPOD_KUBELET_SSH_ROOT".to_owned())
        .or_insert_with(|| root.to_string_lossy().into_owned());
    let config = Arc::new(russh::server::Config {
        keys: vec![host_key],
        auth_rejection_time: std::time::Duration::from_millis(10),
        auth_rejection_time_initial: Some(std::time::Duration::ZERO),
        inactivity_timeout: Some(std::time::Duration::from_secs(600)),
        ..Default::default()
    });
    let pod = PodShell {
        authorized: Arc::new(authorized),
        env: Arc::new(env),
        workdir: Arc::new(workdir),
    };
    let task = runtime.spawn(async move {
        let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
            return;
        };
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                continue;
            };
            let handler = Connection {
                pod: pod.clone(),
                channels: HashMap::new(),
                forwards: HashMap::new(),
            };
            let config = config.clone();
            tokio::spawn(async move {
                if let Ok(session) = russh::server::run_stream(config, socket, handler).await {
                    let _ = session.await;
                }
            });
        }
    });
    if let Ok(mut all) = servers().lock()
        && let Some(old) = all.insert(pod_id.to_owned(), task.abort_handle())
    {
        old.abort();
    }
    Some(Started {
        port: u32::from(port),
        log_line: Some(log_line),
    })
}

/// The pod's network volume at its mount path under the container's root: a link to the
/// volume's directory, shared by every pod that mounts it.
fn mount_volume(root: &std::path::Path, mounts: &serde_json::Value) {
    let Some((id, path)) = crate::volumes::mount_of(mounts) else {
        return;
    };
    if path.split('/').any(|part| part == "..") {
        return;
    }
    let volume = crate::volumes::directory(&id);
    let at = root.join(path.trim_start_matches('/'));
    if std::fs::create_dir_all(&volume).is_err() {
        return;
    }
    if let Some(parent) = at.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = std::fs::remove_file(&at);
    let _ = std::os::unix::fs::symlink(&volume, &at);
}

/// Stops the pod's sshd (the pod stopped, restarted or was terminated).
pub(crate) fn stop(pod_id: &str) {
    if let Ok(mut all) = servers().lock()
        && let Some(task) = all.remove(pod_id)
    {
        task.abort();
    }
}

#[derive(Clone)]
struct PodShell {
    authorized: Arc<Vec<PublicKey>>,
    env: Arc<BTreeMap<String, String>>,
    workdir: Arc<PathBuf>,
}

impl PodShell {
    /// Only the keys the pod's `PUBLIC_KEY` lists log in.
    fn admits(&self, key: &PublicKey) -> Auth {
        if self
            .authorized
            .iter()
            .any(|k| k.key_data() == key.key_data())
        {
            Auth::Accept
        } else {
            Auth::reject()
        }
    }
}

/// What a session channel has asked for so far. Dropping it (the channel closed, or the
/// connection ended) drops `hangup`, which kills its command, as sshd hangs up a session.
#[derive(Default)]
struct ChannelState {
    pty: Option<(u16, u16)>,
    stdin: Option<mpsc::UnboundedSender<Option<Vec<u8>>>>,
    resize: Option<mpsc::UnboundedSender<(u16, u16)>>,
    hangup: Option<tokio::sync::oneshot::Sender<()>>,
}

struct Connection {
    pod: PodShell,
    channels: HashMap<ChannelId, ChannelState>,
    /// Remote forwards (`ssh -R`) by listening address, ended with the connection.
    forwards: HashMap<(String, u32), tokio::task::AbortHandle>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        for (_, listener) in self.forwards.drain() {
            listener.abort();
        }
    }
}

impl russh::server::Handler for Connection {
    type Error = russh::Error;

    async fn auth_publickey_offered(
        &mut self,
        _user: &str,
        key: &PublicKey,
    ) -> Result<Auth, Self::Error> {
        Ok(self.pod.admits(key))
    }

    async fn auth_publickey(&mut self, _user: &str, key: &PublicKey) -> Result<Auth, Self::Error> {
        Ok(self.pod.admits(key))
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        self.channels.insert(channel.id(), ChannelState::default());
        Ok(true)
    }

    async fn pty_request(
        &mut self,
        channel: ChannelId,
        _term: &str,
        cols: u32,
        rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let state = self.channels.entry(channel).or_default();
        state.pty = Some((clamp(cols), clamp(rows)));
        session.channel_success(channel)?;
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        channel: ChannelId,
        cols: u32,
        rows: u32,
        _pix_width: u32,
        _pix_height: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(resize) = self.channels.get(&channel).and_then(|s| s.resize.as_ref()) {
            let _ = resize.send((clamp(cols), clamp(rows)));
        }
        Ok(())
    }

    async fn exec_request(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = String::from_utf8_lossy(data).into_owned();
        let handle = session.handle();
        let state = self.channels.entry(channel).or_default();
        let (stdin_tx, stdin_rx) = mpsc::unbounded_channel();
        state.stdin = Some(stdin_tx);
        let (hangup_tx, hangup_rx) = tokio::sync::oneshot::channel();
        state.hangup = Some(hangup_tx);
        match state.pty {
            Some(size) => {
                let (resize_tx, resize_rx) = mpsc::unbounded_channel();
                state.resize = Some(resize_tx);
                let pod = self.pod.clone();
                std::thread::spawn(move || {
                    run_pty(
                        pod, command, size, handle, channel, stdin_rx, resize_rx, hangup_rx,
                    )
                });
            }
            None => {
                tokio::spawn(run_piped(
                    self.pod.clone(),
                    command,
                    handle,
                    channel,
                    stdin_rx,
                    hangup_rx,
                ));
            }
        }
        session.channel_success(channel)?;
        Ok(())
    }

    async fn data(
        &mut self,
        channel: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(stdin) = self.channels.get(&channel).and_then(|s| s.stdin.as_ref()) {
            let _ = stdin.send(Some(data.to_vec()));
        }
        Ok(())
    }

    async fn channel_close(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.channels.remove(&channel);
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        channel: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(stdin) = self.channels.get(&channel).and_then(|s| s.stdin.as_ref()) {
            let _ = stdin.send(None);
        }
        Ok(())
    }

    /// A remote forward, as an sshd with `GatewayPorts clientspecified` grants it: a listener in
    /// the pod (on this machine, loopback addresses only) whose connections come back to the
    /// client as `forwarded-tcpip` channels.
    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Ok(ip) = address.parse::<std::net::Ipv4Addr>() else {
            return Ok(false);
        };
        if !ip.is_loopback() {
            return Ok(false);
        }
        let Ok(wanted) = u16::try_from(*port) else {
            return Ok(false);
        };
        let Ok(listener) = tokio::net::TcpListener::bind((ip, wanted)).await else {
            return Ok(false);
        };
        let bound = listener.local_addr().map(|a| a.port()).unwrap_or(wanted);
        *port = u32::from(bound);
        let task = crate::ssh_forward::serve(listener, address.to_owned(), bound, session.handle());
        if let Some(old) = self
            .forwards
            .insert((address.to_owned(), u32::from(bound)), task.abort_handle())
        {
            old.abort();
        }
        Ok(true)
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        match self.forwards.remove(&(address.to_owned(), port)) {
            Some(listener) => {
                listener.abort();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator_address: &str,
        _originator_port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // Only the pod's own loopback, as a container's sshd would reach it.
        if !matches!(host, "127.0.0.1" | "localhost" | "::1") {
            return Ok(false);
        }
        let Ok(port) = u16::try_from(port) else {
            return Ok(false);
        };
        let Ok(mut tcp) =
            tokio::net::TcpStream::connect(SocketAddr::from(([127, 0, 0, 1], port))).await
        else {
            return Ok(false);
        };
        tokio::spawn(async move {
            let mut stream = channel.into_stream();
            let _ = tokio::io::copy_bidirectional(&mut stream, &mut tcp).await;
            let _ = stream.shutdown().await;
        });
        Ok(true)
    }
}

fn clamp(value: u32) -> u16 {
    u16::try_from(value).unwrap_or(u16::MAX).max(1)
}

/// Without a terminal: stdout, stderr (extended data 1) and the exit status, separately.
async fn run_piped(
    pod: PodShell,
    command: String,
    handle: Handle,
    channel: ChannelId,
    mut stdin: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    hangup: tokio::sync::oneshot::Receiver<()>,
) {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&command)
        .env_clear()
        .envs(pod.env.iter())
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", pod.workdir.as_os_str())
        .current_dir(pod.workdir.as_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // Its own process group, so a hang-up reaches what it started too.
        .process_group(0)
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(error) => {
            let _ = handle
                .extended_data(channel, 1, CryptoVec::from(format!("sh: {error}\n")))
                .await;
            let _ = handle.exit_status_request(channel, 127).await;
            let _ = handle.close(channel).await;
            return;
        }
    };
    let (Some(mut child_in), Some(mut out), Some(mut err)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return;
    };
    tokio::spawn(async move {
        while let Some(Some(data)) = stdin.recv().await {
            if child_in.write_all(&data).await.is_err() {
                break;
            }
        }
    });
    let out_handle = handle.clone();
    let stdout = tokio::spawn(async move {
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = out.read(&mut buf).await {
            if n == 0
                || out_handle
                    .data(channel, CryptoVec::from_slice(&buf[..n]))
                    .await
                    .is_err()
            {
                break;
            }
        }
    });
    let err_handle = handle.clone();
    let stderr = tokio::spawn(async move {
        let mut buf = vec![0u8; 8192];
        while let Ok(n) = err.read(&mut buf).await {
            if n == 0
                || err_handle
                    .extended_data(channel, 1, CryptoVec::from_slice(&buf[..n]))
                    .await
                    .is_err()
            {
                break;
            }
        }
    });
    let status = tokio::select! {
        status = child.wait() => status,
        // Hung up: the command goes with the session.
        _ = hangup => {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
            let _ = child.kill().await;
            stdout.abort();
            stderr.abort();
            return;
        }
    };
    let _ = stdout.await;
    let _ = stderr.await;
    let code = status.ok().and_then(|s| s.code()).unwrap_or(255);
    let _ = handle
        .exit_status_request(channel, u32::try_from(code).unwrap_or(255))
        .await;
    let _ = handle.eof(channel).await;
    let _ = handle.close(channel).await;
}

/// With a terminal: one PTY for the command, its output as channel data, resized on window
/// changes. Runs on a thread of its own (the PTY is blocking I/O).
#[allow(clippy::too_many_arguments)] // one call site; the channel's parts, spelled out
fn run_pty(
    pod: PodShell,
    command: String,
    (cols, rows): (u16, u16),
    handle: Handle,
    channel: ChannelId,
    mut stdin: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    mut resize: mpsc::UnboundedReceiver<(u16, u16)>,
    mut hangup: tokio::sync::oneshot::Receiver<()>,
) {
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let Ok(runtime) = tokio::runtime::Runtime::new() else {
        return;
    };
    let size = |cols: u16, rows: u16| PtySize {
        rows,
        cols,
        pixel_width: 0,
        pixel_height: 0,
    };
    let fail = |message: String| {
        runtime.block_on(async {
            let _ = handle.data(channel, CryptoVec::from(message)).await;
            let _ = handle.exit_status_request(channel, 127).await;
            let _ = handle.close(channel).await;
        });
    };
    let pair = match native_pty_system().openpty(size(cols, rows)) {
        Ok(pair) => pair,
        Err(error) => return fail(format!("no pty: {error}\r\n")),
    };
    let mut builder = CommandBuilder::new("sh");
    builder.arg("-c");
    builder.arg(&command);
    builder.env_clear();
    for (key, value) in pod.env.iter() {
        builder.env(key, value);
    }
    builder.env("PATH", std::env::var("PATH").unwrap_or_default());
    builder.env("HOME", pod.workdir.as_os_str());
    builder.env("TERM", "xterm");
    builder.cwd(pod.workdir.as_os_str());
    let mut child = match pair.slave.spawn_command(builder) {
        Ok(child) => child,
        Err(error) => return fail(format!("sh: {error}\r\n")),
    };
    drop(pair.slave);
    let master = pair.master;
    let (Ok(mut reader), Ok(mut writer)) = (master.try_clone_reader(), master.take_writer()) else {
        return fail("pty: no reader or writer\r\n".to_owned());
    };
    let out_handle = handle.clone();
    let output = std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Runtime::new() else {
            return;
        };
        let mut buf = vec![0u8; 8192];
        loop {
            match reader.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if runtime
                        .block_on(out_handle.data(channel, CryptoVec::from_slice(&buf[..n])))
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
    });
    // Input and resizes until the command ends.
    let mut stdin_open = true;
    let code = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status.exit_code();
        }
        if !matches!(
            hangup.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty)
        ) {
            let _ = child.kill();
            let _ = child.wait();
            drop(writer);
            drop(master);
            let _ = output.join();
            return;
        }
        let wait = std::time::Duration::from_millis(20);
        runtime.block_on(async {
            tokio::select! {
                data = stdin.recv(), if stdin_open => match data {
                    Some(Some(data)) => { let _ = writer.write_all(&data); let _ = writer.flush(); }
                    // EOF on a terminal: ^D, as a terminal would send it.
                    Some(None) => { let _ = writer.write_all(&[4]); let _ = writer.flush(); }
                    None => stdin_open = false,
                },
                Some((cols, rows)) = resize.recv() => { let _ = master.resize(size(cols, rows)); },
                _ = tokio::time::sleep(wait) => {}
            }
        });
    };
    drop(writer);
    drop(master);
    let _ = output.join();
    runtime.block_on(async {
        let _ = handle.exit_status_request(channel, code).await;
        let _ = handle.eof(channel).await;
        let _ = handle.close(channel).await;
    });
}
