//! The remotecommand protocol of `kubectl exec` over a SPDY session: which version to speak,
//! which streams to wait for, how resize messages read, and how the command's end is reported
//! (v4: a `metav1.Status` on the error stream, `NonZeroExitCode` with an `ExitCode` cause that
//! kubectl turns into its own exit code). The command itself runs behind [`ExecBackend`].

use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;

use crate::controller::kubelet_api::spdy::frame::header;
use crate::controller::kubelet_api::spdy::session::{Incoming, Session, StreamWriter};

/// What this side speaks, best first (as a 1.20 kubelet does).
pub(crate) const PROTOCOLS: [&str; 4] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// kubectl's WebSocket-era version, answered as v4 when it is all a client offers.
const V5: &str = "v5.channel.k8s.io";
/// How long the client has to open the streams it asked for.
pub(crate) const STREAM_WAIT: Duration = Duration::from_secs(15);

/// Picks the version: the first offered one this side speaks; an offer of v5 alone is v4.
pub(crate) fn negotiate(offered: &[String]) -> Option<&'static str> {
    let offered: Vec<&str> = offered
        .iter()
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|value| !value.is_empty())
        .collect();
    offered
        .iter()
        .find_map(|offer| PROTOCOLS.iter().find(|p| **p == *offer).copied())
        .or_else(|| offered.contains(&V5).then_some(PROTOCOLS[0]))
}

/// What `kubectl exec` asked for (the query of `/exec/...`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecOptions {
    /// `command=sh&command=-c&command=...&stdin=1&stdout=1&tty=1` (`1` or `true`).
    pub fn from_query(query: &str) -> Result<ExecOptions, String> {
        let mut options = ExecOptions::default();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let on = matches!(value.as_ref(), "1" | "true" | "True");
            match key.as_ref() {
                "command" => options.command.push(value.into_owned()),
                "input" | "stdin" => options.stdin = on,
                "output" | "stdout" => options.stdout = on,
                "error" | "stderr" => options.stderr = on,
                "tty" => options.tty = on,
                _ => {}
            }
        }
        if options.command.is_empty() {
            return Err("no command given".to_owned());
        }
        // A terminal merges stderr into stdout, as the kubelet does.
        if options.tty {
            options.stderr = false;
        }
        if !(options.stdin || options.stdout || options.stderr) {
            return Err("at least one of stdin, stdout and stderr must be requested".to_owned());
        }
        Ok(options)
    }
}

/// A terminal size from the resize stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct TerminalSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// The streams handed to a backend.
pub struct ExecIo {
    pub stdin: Option<mpsc::Receiver<Bytes>>,
    pub stdout: Option<StreamWriter>,
    pub stderr: Option<StreamWriter>,
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
    /// Turns true when kubectl is gone: the command must be stopped, not waited for.
    pub gone: tokio::sync::watch::Receiver<bool>,
}

/// How a command ended, or why it could not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEnd {
    Exited(i32),
    Failed(String),
}

/// Runs a command somewhere (the pod's SSH, a test double).
pub(crate) trait ExecBackend: Send {
    fn exec(
        self,
        options: ExecOptions,
        io: ExecIo,
    ) -> impl std::future::Future<Output = ExecEnd> + Send;
}

/// The v4 error stream's final message.
pub(crate) fn status(end: &ExecEnd, command: &[String]) -> serde_json::Value {
    match end {
        ExecEnd::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        ExecEnd::Exited(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        }),
        ExecEnd::Failed(message) => json!({
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": "InternalError",
        }),
    }
}

/// Reads `{"Width":..,"Height":..}` objects, however the stream splits them.
fn resize_reader(mut incoming: Incoming) -> mpsc::Receiver<TerminalSize> {
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = incoming.recv().await {
            pending.extend_from_slice(&chunk);
            // A size message is a few dozen bytes; anything longer is garbage.
            if pending.len() > 4096 {
                pending.clear();
                continue;
            }
            let mut stream =
                serde_json::Deserializer::from_slice(&pending).into_iter::<TerminalSize>();
            let mut consumed = 0;
            loop {
                match stream.next() {
                    Some(Ok(size)) => {
                        consumed = stream.byte_offset();
                        if tx.send(size).await.is_err() {
                            return;
                        }
                    }
                    Some(Err(error)) if error.is_eof() => break,
                    // Garbage: drop what was read; the terminal keeps its size.
                    Some(Err(_)) => {
                        consumed = pending.len();
                        break;
                    }
                    None => {
                        consumed = pending.len();
                        break;
                    }
                }
            }
            pending.drain(..consumed);
        }
    });
    rx
}

/// Waits for the streams `options` need, runs the command, reports its end and closes.
pub(crate) async fn serve<B: ExecBackend>(
    mut session: Session,
    protocol: &str,
    options: ExecOptions,
    backend: B,
) {
    let mut error = None;
    let mut stdin = None;
    let mut stdout = None;
    let mut stderr = None;
    let mut resize = None;
    let wants_resize =
        options.tty && protocol != "channel.k8s.io" && protocol != "v2.channel.k8s.io";
    // As a kubelet counts them: a terminal (v3 and later) comes with a resize stream.
    let complete = |error: &Option<StreamWriter>,
                    stdin: &Option<mpsc::Receiver<Bytes>>,
                    stdout: &Option<StreamWriter>,
                    stderr: &Option<StreamWriter>,
                    resize: &Option<mpsc::Receiver<TerminalSize>>| {
        error.is_some()
            && (stdin.is_some() || !options.stdin)
            && (stdout.is_some() || !options.stdout)
            && (stderr.is_some() || !options.stderr)
            && (resize.is_some() || !wants_resize)
    };
    let deadline = tokio::time::Instant::now() + STREAM_WAIT;
    while !complete(&error, &stdin, &stdout, &stderr, &resize) {
        let stream = match tokio::time::timeout_at(deadline, session.accept()).await {
            Ok(Some(stream)) => stream,
            Ok(None) => return,
            Err(_) => {
                tracing::debug!("exec: the client did not open its streams in time");
                session.close(Duration::from_secs(1)).await;
                return;
            }
        };
        match header(&stream.headers, "streamtype") {
            Some("error") => error = Some(stream.out),
            Some("stdin") => stdin = Some(stream.incoming.into_receiver()),
            Some("stdout") => stdout = Some(stream.out),
            Some("stderr") => stderr = Some(stream.out),
            Some("resize") if wants_resize => resize = Some(resize_reader(stream.incoming)),
            other => {
                tracing::debug!(stream = stream.id, kind = ?other, "exec: a stream not asked for, ignored")
            }
        }
    }
    let io = ExecIo {
        stdin,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
        resize,
        gone: session.gone(),
    };
    let command = options.command.clone();
    let end = backend.exec(options, io).await;
    for stream in [&stdout, &stderr].into_iter().flatten() {
        let _ = stream.finish().await;
    }
    if let Some(error) = error {
        let message = if protocol == PROTOCOLS[0] {
            Some(status(&end, &command).to_string())
        } else {
            // v1-v3 carry a plain message, and only on failure.
            match &end {
                ExecEnd::Exited(0) => None,
                ExecEnd::Exited(code) => Some(format!(
                    "command terminated with non-zero exit code: exit code {code}"
                )),
                ExecEnd::Failed(message) => Some(message.clone()),
            }
        };
        if let Some(message) = message {
            let _ = error.write(message.as_bytes()).await;
        }
        let _ = error.finish().await;
    }
    drop((stdout, stderr));
    session.close(Duration::from_secs(5)).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::kubelet_api::spdy::session::tests::Peer;

    #[test]
    fn versions_are_negotiated_like_a_kubelet() {
        let offer = |values: &[&str]| values.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            negotiate(&offer(&["v4.channel.k8s.io", "v3.channel.k8s.io"])),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&offer(&["v5.channel.k8s.io", "v4.channel.k8s.io"])),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&offer(&["v5.channel.k8s.io"])),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(&offer(&["channel.k8s.io"])),
            Some("channel.k8s.io")
        );
        assert_eq!(
            negotiate(&offer(&["v2.channel.k8s.io, channel.k8s.io"])),
            Some("v2.channel.k8s.io")
        );
        assert_eq!(negotiate(&offer(&["v9.example"])), None);
        assert_eq!(negotiate(&[]), None);
    }

    #[test]
    fn exec_options_read_the_query() {
        let options = ExecOptions::from_query(
            "command=sh&command=-c&command=echo%20hi&stdin=1&stdout=1&stderr=1&tty=1",
        )
        .unwrap();
        assert_eq!(options.command, ["sh", "-c", "echo hi"]);
        assert!(options.stdin && options.stdout && options.tty);
        assert!(!options.stderr, "a terminal has no separate stderr");
        assert!(ExecOptions::from_query("stdout=1").is_err());
        assert!(ExecOptions::from_query("command=ls").is_err());
    }

    #[test]
    fn the_v4_status_carries_the_exit_code() {
        let command = vec!["false".to_owned()];
        assert_eq!(status(&ExecEnd::Exited(0), &command)["status"], "Success");
        let failed = status(&ExecEnd::Exited(3), &command);
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(failed["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(failed["details"]["causes"][0]["message"], "3");
        let error = status(&ExecEnd::Failed("no sshd".to_owned()), &command);
        assert_eq!(error["status"], "Failure");
        assert_eq!(error["message"], "no sshd");
    }

    /// Echoes stdin to stdout, writes `err` to stderr, reports each resize on stdout, exits 3.
    struct Fake;

    impl ExecBackend for Fake {
        async fn exec(self, _options: ExecOptions, mut io: ExecIo) -> ExecEnd {
            if let Some(stderr) = &io.stderr {
                stderr.write(b"err").await.unwrap();
            }
            if let (Some(resize), Some(stdout)) = (io.resize.as_mut(), &io.stdout) {
                let size = resize.recv().await.unwrap();
                stdout
                    .write(format!("{}x{};", size.width, size.height).as_bytes())
                    .await
                    .unwrap();
                let size = resize.recv().await.unwrap();
                stdout
                    .write(format!("{}x{};", size.width, size.height).as_bytes())
                    .await
                    .unwrap();
            }
            if let (Some(stdin), Some(stdout)) = (io.stdin.as_mut(), &io.stdout) {
                while let Some(data) = stdin.recv().await {
                    stdout.write(&data).await.unwrap();
                }
            }
            ExecEnd::Exited(3)
        }
    }

    #[tokio::test]
    async fn an_exec_session_runs_and_reports_its_exit_code() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let session = Session::start(server);
        let options = ExecOptions::from_query("command=cat&stdin=1&stdout=1&stderr=1").unwrap();
        let served = tokio::spawn(serve(session, "v4.channel.k8s.io", options, Fake));
        let mut peer = Peer::new(client);
        peer.open(1, &[("streamtype", "error")]).await;
        peer.open(3, &[("streamtype", "stdin")]).await;
        peer.open(5, &[("streamtype", "stdout")]).await;
        peer.open(7, &[("streamtype", "stderr")]).await;
        peer.data(3, b"da", false).await;
        peer.data(3, b"ta", true).await;
        let streams = peer.drain().await;
        served.await.unwrap();
        assert_eq!(streams[&5], (b"data".to_vec(), true));
        assert_eq!(streams[&7], (b"err".to_vec(), true));
        let status: serde_json::Value = serde_json::from_slice(&streams[&1].0).unwrap();
        assert_eq!(status["details"]["causes"][0]["message"], "3");
        assert!(streams[&1].1, "the error stream is finished");
    }

    /// A terminal session: resize messages split across frames and two in one frame are read.
    #[tokio::test]
    async fn resize_messages_reach_the_backend() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let session = Session::start(server);
        let options = ExecOptions::from_query("command=sh&stdin=1&stdout=1&tty=1").unwrap();
        let served = tokio::spawn(serve(session, "v4.channel.k8s.io", options, Fake));
        let mut peer = Peer::new(client);
        peer.open(1, &[("streamtype", "error")]).await;
        peer.open(3, &[("streamtype", "stdin")]).await;
        peer.open(5, &[("streamtype", "stdout")]).await;
        peer.open(7, &[("streamtype", "resize")]).await;
        peer.data(7, br#"{"Width":80,"Hei"#, false).await;
        peer.data(7, br#"ght":24}{"Width":120,"Height":40}"#, false)
            .await;
        peer.data(3, b"", true).await;
        let streams = peer.drain().await;
        served.await.unwrap();
        assert_eq!(streams[&5].0, b"80x24;120x40;".to_vec());
    }

    /// v1 (`channel.k8s.io`) reports a failure as plain text.
    #[tokio::test]
    async fn older_versions_get_a_plain_message() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let session = Session::start(server);
        let options = ExecOptions::from_query("command=x&stdout=1").unwrap();
        let served = tokio::spawn(serve(session, "channel.k8s.io", options, Fake));
        let mut peer = Peer::new(client);
        peer.open(1, &[("streamtype", "error")]).await;
        peer.open(3, &[("streamtype", "stdout")]).await;
        let streams = peer.drain().await;
        served.await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&streams[&1].0),
            "command terminated with non-zero exit code: exit code 3"
        );
    }
}
