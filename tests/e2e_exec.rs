//! `kubectl exec` and `kubectl port-forward` into a burst pod on the real control plane,
//! through the apiserver with a real `kubectl` (1.32, which tries WebSockets first and falls
//! back to SPDY on the kubelet's 400), the controller's kubelet API and the simulator's real
//! sshd for the RunPod pod: output, stderr and exit codes, stdin, a terminal, a forwarded port,
//! attach refused, a caller without `nodes/proxy` refused, a SIGKILLed controller reusing its
//! key from the Secret, and `--exec-ssh=false`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::kubelet_client::{Identity, kubelet_get};
use support::pods::{gpu_pod, namespace, running};
use support::wait;
use support::webhook::WebhookProcess;

const NS: &str = "e2e-exec";
const POD: &str = "shell";
const WAIT: Duration = Duration::from_secs(120);

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_exec exec_and_port_forward_through_ssh",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

fn scenario() -> serde_json::Value {
    json!({"provisioning_ms": 300, "starting_ms": 300, "ports_ms": 300, "list_lag_ms": 300})
}

/// `kubectl ARGS` with the control plane's kubeconfig: (exit code, stdout, stderr).
fn kubectl(
    cp: &ControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<(i32, String, String)> {
    let mut child = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

async fn run(cp: &ControlPlane) -> anyhow::Result<()> {
    let client = cp.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let webhook = WebhookProcess::start(&cp.kubeconfig, &[]).await?;
    webhook.register(&client, &["kube-system"]).await?;
    let mut controller = ControllerProcess::start(&cp.kubeconfig, &cp.ca_file(), &simulator, &[])?;
    let outcome = scenarios(cp, &client, &simulator, &mut controller).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}

async fn scenarios(
    cp: &ControlPlane,
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    support::pods::node_ready_named(client, "virtual-runpod").await?;
    namespace(client, NS, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // A batch pod (the controller's wrapper starts the image's sshd), and a long-running one
    // whose command replaced the image's start script: no sshd in it.
    for (name, policy) in [(POD, "Never"), ("no-sshd", "Always")] {
        let mut pod = gpu_pod(name, "e2e/server:1", policy);
        pod.metadata.annotations =
            Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
        pods.create(&PostParams::default(), &pod).await?;
    }
    running(&pods, POD).await?;
    let pod = wait::until("the pod's endpoints", WAIT, || async {
        let pod = pods.get(POD).await?;
        let shown = support::pods::annotation(&pod, "runpod.io/endpoints").unwrap_or_default();
        Ok(shown.contains("8888/").then_some(pod))
    })
    .await?;
    let uid = pod.metadata.uid.clone().context("uid")?;
    let created = support::pods::event(client, NS, POD, "RunPodPodCreated").await?;
    ensure!(
        created.contains("22/tcp for kubectl exec"),
        "the create Event hides the SSH port: {created}"
    );
    let pod_id = support::pods::annotation(&pod, "runpod.io/pod-id")
        .context("pod id")?
        .to_owned();

    // The key: one Secret, its public half sent as PUBLIC_KEY with an internal 22/tcp that is
    // no endpoint of the pod.
    let secret = Api::<Secret>::namespaced(client.clone(), "default")
        .get("virtual-runpod-ssh")
        .await
        .context("the node's SSH key Secret")?;
    ensure!(
        secret.type_.as_deref() == Some("kubernetes.io/ssh-auth"),
        "type {:?}",
        secret.type_
    );
    let public = String::from_utf8(secret.data.unwrap_or_default()["ssh-publickey"].0.clone())?;
    let ledger = support::pods::ledger_for(simulator, &uid).await?;
    ensure!(ledger.len() == 1, "RunPod pods: {ledger:?}");
    ensure!(
        ledger[0]["env"]["PUBLIC_KEY"] == public.as_str(),
        "PUBLIC_KEY differs from the Secret's"
    );
    let endpoints = support::pods::annotation(&pod, "runpod.io/endpoints")
        .unwrap_or_default()
        .to_owned();
    ensure!(
        !endpoints.contains("22/tcp"),
        "the internal SSH port is shown: {endpoints}"
    );

    // Output, errors and the exit code.
    let (code, out, err) = kubectl(
        cp,
        &[
            "-n",
            NS,
            "exec",
            POD,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        None,
    )?;
    ensure!(
        code == 3,
        "exit code {code}; stdout {out:?}; stderr {err:?}"
    );
    ensure!(out == "out\n", "stdout {out:?}");
    ensure!(err.contains("err\n"), "stderr {err:?}");
    let (code, out, err) = kubectl(
        cp,
        &[
            "-n",
            NS,
            "exec",
            POD,
            "--",
            "sh",
            "-c",
            "pwd; echo $RUNPOD_KUBELET_POD_NAME",
        ],
        None,
    )?;
    ensure!(
        code == 0 && out.ends_with(&format!("{POD}\n")),
        "env of the pod: {code} {out:?} {err:?}"
    );

    // stdin, small and large (a megabyte each way: neither side may wait for the other).
    let (code, out, err) = kubectl(
        cp,
        &["-n", NS, "exec", "-i", POD, "--", "cat"],
        Some("data"),
    )?;
    ensure!(code == 0 && out == "data", "cat: {code} {out:?} {err:?}");
    let big: String = (0..1_000_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let (code, out, err) = kubectl(cp, &["-n", NS, "exec", "-i", POD, "--", "cat"], Some(&big))?;
    ensure!(
        code == 0 && out == big,
        "cat of 1 MB: {code}, {} bytes back; {err:?}",
        out.len()
    );

    // kubectl killed mid-command: the command is hung up, not left running.
    let pid_file = std::env::temp_dir()
        .join(format!("runpod-sim-{pod_id}"))
        .join("e2e-sleep.pid");
    let _ = std::fs::remove_file(&pid_file);
    let mut long = Command::new("kubectl")
        .args([
            "-n",
            NS,
            "exec",
            POD,
            "--",
            "sh",
            "-c",
            "echo $$ > e2e-sleep.pid; echo started; exec sleep 300",
        ])
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut started = String::new();
    BufReader::new(long.stdout.take().context("stdout")?).read_line(&mut started)?;
    ensure!(started == "started\n", "long command: {started:?}");
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_owned();
    ensure!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "sleep {pid} not running"
    );
    long.kill()?;
    let _ = long.wait();
    wait::until("the hung-up command to end", WAIT, || async {
        Ok((!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(()))
    })
    .await?;

    // An image without sshd: a clear error at once.
    let (code, _, err) = kubectl(cp, &["-n", NS, "exec", "no-sshd", "--", "true"], None)?;
    ensure!(
        code != 0 && err.contains("no SSH connection"),
        "no sshd: {code} {err:?}"
    );

    // A terminal (kubectl needs one itself: `script` gives it a pty).
    let line = format!("kubectl -n {NS} exec -it {POD} -- sh -c 'test -t 0 && echo is-a-tty; tty'");
    let output = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdin(Stdio::null())
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    ensure!(
        text.contains("is-a-tty") && text.contains("/dev/pts/"),
        "terminal session: {text:?}"
    );

    // Port-forward to a server listening "inside the pod" (the simulator's loopback).
    port_forward(cp)?;

    // attach is not served, and says what is.
    let (code, _, err) = kubectl(cp, &["-n", NS, "attach", POD], None)?;
    ensure!(
        code != 0 && err.contains("exec works"),
        "attach: {code} {err:?}"
    );

    // A caller the apiserver does not allow nodes/proxy gets 403 from the kubelet API.
    let certs = tempfile::tempdir()?;
    let alice = Identity::issue(&cp.pki_dir(), certs.path(), "alice", "/O=team-a/CN=alice")?;
    let (status, body) = kubelet_get(
        controller.kubelet_port,
        &format!("/exec/{NS}/{POD}/main?command=id&stdout=1"),
        Some(&alice),
    )?;
    ensure!(
        status == 403 && body.contains("alice"),
        "alice: {status} {body}"
    );

    // A preStop exec hook runs in the pod, over the node's SSH connection, before the stop
    // that ends it (issue 45).
    let marks = tempfile::tempdir()?;
    let mark = marks.path().join("pre-stop-ran");
    let mut stopper = gpu_pod("stopper", "e2e/server:1", "Never");
    stopper.metadata.annotations =
        Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
    stopper.spec.as_mut().context("spec")?.containers[0].lifecycle = Some(serde_json::from_value(
        serde_json::json!({"preStop": {"exec": {"command":
            ["sh", "-c", format!("echo bye > {}", mark.display())]}}}),
    )?);
    pods.create(&PostParams::default(), &stopper).await?;
    running(&pods, "stopper").await?;
    wait::until("exec into the preStop pod", WAIT, || async {
        let (code, out, _) = kubectl(cp, &["-n", NS, "exec", "stopper", "--", "echo", "up"], None)?;
        Ok((code == 0 && out == "up\n").then_some(()))
    })
    .await?;
    pods.delete("stopper", &Default::default()).await?;
    wait::until("the preStop pod is gone", WAIT, || async {
        Ok(pods.get_opt("stopper").await?.is_none().then_some(()))
    })
    .await?;
    let ran = std::fs::read_to_string(&mark).unwrap_or_default();
    ensure!(ran == "bye\n", "the preStop hook did not run: {ran:?}");
    let said = support::pods::events(client, NS, "stopper").await?;
    ensure!(
        !said.iter().any(|(reason, _)| reason == "FailedPreStopHook"),
        "{said:?}"
    );

    // Probes run in the pod over SSH (issue 45): readiness gates Ready, a failing liveness
    // probe restarts the container, with the kubelet's Events.
    probes(client, &pods).await.context("probes")?;
    post_start_hooks(client, &pods)
        .await
        .context("httpGet postStart hooks")?;

    // SIGKILL and restart: the next exec works with the same key (read from the Secret).
    controller.restart()?;
    wait::until("exec after a controller restart", WAIT, || async {
        let (code, out, _) = kubectl(cp, &["-n", NS, "exec", POD, "--", "echo", "again"], None)?;
        Ok((code == 0 && out == "again\n").then_some(()))
    })
    .await?;

    // --exec-ssh=false: 501, saying so.
    controller.push_args(&["--exec-ssh", "false"]);
    controller.restart()?;
    let message = wait::until("exec refused with exec-ssh off", WAIT, || async {
        let (code, _, err) = kubectl(cp, &["-n", NS, "exec", POD, "--", "true"], None)?;
        ensure!(code != 0, "exec still works");
        Ok(err.contains("--exec-ssh=false").then_some(err.clone())).and_then(|found| {
            found
                .map(Some)
                .ok_or_else(|| anyhow::anyhow!("kubectl said {err:?}"))
        })
    })
    .await?;
    ensure!(message.contains("turned off"), "{message}");
    Ok(())
}

fn port_forward(cp: &ControlPlane) -> anyhow::Result<()> {
    let pod_port = support::net::upper_echo()?;
    let local = support::webhook::free_port()?.port();
    let mut forward = Command::new("kubectl")
        .args(["-n", NS, "port-forward", "--address", "127.0.0.1"])
        .arg(format!("pod/{POD}"))
        .arg(format!("{local}:{pod_port}"))
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = (|| {
        let stdout = forward.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = lines.next().context("port-forward printed nothing")??;
        ensure!(first.contains("Forwarding from"), "port-forward: {first}");
        for round in 0..2 {
            let mut conn = TcpStream::connect(("127.0.0.1", local))?;
            conn.set_read_timeout(Some(Duration::from_secs(20)))?;
            conn.write_all(format!("ping {round}").as_bytes())?;
            let mut buf = [0u8; 64];
            let n = conn.read(&mut buf)?;
            ensure!(
                &buf[..n] == format!("PING {round}").as_bytes(),
                "forwarded: {:?}",
                String::from_utf8_lossy(&buf[..n])
            );
        }
        Ok(())
    })();
    let _ = forward.kill();
    let mut stderr = String::new();
    if let Some(mut pipe) = forward.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    result.with_context(|| format!("kubectl port-forward stderr: {stderr}"))
}

/// An HTTP server "inside the pod" (the simulator's loopback) whose answer per path the test
/// sets, counting the requests and keeping their User-Agent.
#[derive(Clone, Default)]
struct HealthServer {
    answers: Arc<Mutex<HashMap<String, u16>>>,
    hits: Arc<Mutex<HashMap<String, u32>>>,
    agents: Arc<Mutex<Vec<String>>>,
}

impl HealthServer {
    fn start(&self) -> anyhow::Result<u16> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let server = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || server.answer(stream));
            }
        });
        Ok(port)
    }

    /// The same server behind TLS (a self-signed certificate, as a container's HTTPS probe
    /// port often has).
    fn start_tls(&self) -> anyhow::Result<u16> {
        use tokio_rustls::rustls;
        let key = rcgen::generate_simple_self_signed(vec!["probed.local".to_owned()])?;
        let private = rustls::pki_types::PrivateKeyDer::Pkcs8(
            rustls::pki_types::PrivatePkcs8KeyDer::from(key.signing_key.serialize_der()),
        );
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![key.cert.der().clone()], private)?,
        );
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let server = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                let Ok(connection) = rustls::ServerConnection::new(config.clone()) else {
                    continue;
                };
                std::thread::spawn(move || {
                    server.answer(rustls::StreamOwned::new(connection, stream));
                });
            }
        });
        Ok(port)
    }

    fn answer(&self, stream: impl Read + Write) {
        let mut reader = BufReader::new(stream);
        let mut request = String::new();
        if reader.read_line(&mut request).is_err() {
            return;
        }
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
            if let Some(agent) = line.to_ascii_lowercase().strip_prefix("user-agent:") {
                self.agents.lock().unwrap().push(agent.trim().to_owned());
            }
            line.clear();
        }
        *self.hits.lock().unwrap().entry(path.clone()).or_default() += 1;
        let status = self
            .answers
            .lock()
            .unwrap()
            .get(&path)
            .copied()
            .unwrap_or(404);
        let writer = reader.get_mut();
        let _ = write!(
            writer,
            "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
        );
        let _ = writer.flush();
    }

    fn set(&self, path: &str, status: u16) {
        self.answers.lock().unwrap().insert(path.to_owned(), status);
    }

    fn hits(&self, path: &str) -> u32 {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn container_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|list| list.first())
        .is_some_and(|c| c.ready)
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|list| list.first())
        .map_or(0, |c| c.restart_count)
}

/// A long-running pod (its command replaced the image's start script) with HTTP readiness and
/// liveness probes and an HTTPS startup probe on a server "inside the pod": not Ready while
/// `/ready` fails, Ready once it answers, restarted once `/healthz` fails its threshold; its `httpGet` preStop hook is sent
/// once when it is deleted.
async fn probes(client: &kube::Client, pods: &Api<Pod>) -> anyhow::Result<()> {
    let health = HealthServer::default();
    let port = health.start()?;
    health.set("/ready", 503);
    health.set("/healthz", 200);
    let mut probed = gpu_pod("probed", "e2e/server:1", "Always");
    probed.metadata.annotations =
        Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
    let container = &mut probed.spec.as_mut().context("spec")?.containers[0];
    container.readiness_probe = Some(serde_json::from_value(json!({
        "httpGet": {"path": "/ready", "port": port}, "periodSeconds": 1, "failureThreshold": 1
    }))?);
    container.liveness_probe = Some(serde_json::from_value(json!({
        "httpGet": {"path": "/healthz", "port": port}, "periodSeconds": 1, "failureThreshold": 2
    }))?);
    container.lifecycle = Some(serde_json::from_value(json!({
        "preStop": {"httpGet": {"path": "/stop", "port": port}}
    }))?);
    // A startup probe over HTTPS, on the same server behind TLS: it passes at once.
    let tls_port = health.start_tls()?;
    health.set("/started", 200);
    container.startup_probe = Some(serde_json::from_value(json!({
        "httpGet": {"path": "/started", "port": tls_port, "scheme": "HTTPS"},
        "periodSeconds": 1
    }))?);
    health.set("/stop", 200);
    pods.create(&PostParams::default(), &probed).await?;
    // Running, its readiness probe asked again and again, and never Ready while it fails.
    wait::until("the readiness probe asked while Running", WAIT, || async {
        let pod = pods.get("probed").await?;
        let running = support::pods::phase(&pod) == Some("Running");
        Ok((running && health.hits("/ready") >= 3).then_some(()))
    })
    .await?;
    ensure!(
        health.hits("/started") >= 1,
        "the HTTPS startup probe never reached the server through TLS"
    );
    let pod = pods.get("probed").await?;
    ensure!(
        !container_ready(&pod) && !support::pods::ready(&pod),
        "Ready while its readiness probe fails: {:?}",
        pod.status
    );
    ensure!(
        health
            .agents
            .lock()
            .unwrap()
            .iter()
            .all(|a| a.starts_with("kube-probe/")),
        "probe User-Agent: {:?}",
        health.agents.lock().unwrap()
    );
    // The path answers: Ready.
    health.set("/ready", 200);
    wait::until("Ready once the readiness probe passes", WAIT, || async {
        let pod = pods.get("probed").await?;
        Ok((container_ready(&pod) && support::pods::ready(&pod)).then_some(()))
    })
    .await?;
    ensure!(
        restart_count(&pods.get("probed").await?) == 0,
        "restarted early"
    );
    // The liveness path fails: the container is restarted, and the Events say why.
    health.set("/healthz", 500);
    wait::until(
        "restarted after its liveness probe failed",
        WAIT,
        || async { Ok((restart_count(&pods.get("probed").await?) >= 1).then_some(())) },
    )
    .await?;
    health.set("/healthz", 200);
    // The restarted container is probed again (its sshd may present new host keys), and is
    // Ready once its readiness probe passes again.
    let hits = health.hits("/ready");
    wait::until("Ready again after the restart", WAIT, || async {
        let pod = pods.get("probed").await?;
        let again = health.hits("/ready") > hits && container_ready(&pod);
        Ok((again && restart_count(&pod) >= 1).then_some(()))
    })
    .await?;
    let said = support::pods::events(client, NS, "probed").await?;
    ensure!(
        !said
            .iter()
            .any(|(reason, message)| reason == "PodFieldsNotHonoured" && message.contains("Probe")),
        "probes that run are said not to: {said:?}"
    );
    let has = |reason: &str, text: &str| {
        said.iter()
            .any(|(r, message)| r == reason && message.contains(text))
    };
    ensure!(
        has(
            "Unhealthy",
            "Liveness probe failed: HTTP probe failed with statuscode: 500"
        ) && has("Killing", "failed liveness probe, will be restarted"),
        "Events: {said:?}"
    );
    // An httpGet preStop hook reaches the container's loopback before the stop.
    pods.delete("probed", &Default::default()).await?;
    support::pods::gone(pods, "probed").await?;
    ensure!(
        health.hits("/stop") == 1,
        "preStop /stop hits: {}",
        health.hits("/stop")
    );
    Ok(())
}

/// Issue 45: an `httpGet` `postStart` hook reaches the container's loopback once it runs;
/// one that fails kills the container as the kubelet does (`FailedPostStartHook`, then
/// `Killing` and a restart).
async fn post_start_hooks(client: &kube::Client, pods: &Api<Pod>) -> anyhow::Result<()> {
    let health = HealthServer::default();
    let port = health.start()?;
    health.set("/warm", 200);
    health.set("/cold", 500);
    for (name, path) in [("warmed", "/warm"), ("cold", "/cold")] {
        let mut pod = gpu_pod(name, "e2e/server:1", "Always");
        pod.metadata.annotations =
            Some([("runpod.io/burst-mode".to_owned(), "always".to_owned())].into());
        pod.spec.as_mut().context("spec")?.containers[0].lifecycle =
            Some(serde_json::from_value(json!({
                "postStart": {"httpGet": {"path": path, "port": port}}
            }))?);
        pods.create(&PostParams::default(), &pod).await?;
    }
    wait::until("the postStart hook sent", WAIT, || async {
        Ok((health.hits("/warm") >= 1).then_some(()))
    })
    .await?;
    wait::until(
        "the failing postStart hook restarted its container",
        WAIT,
        || async {
            let said = support::pods::events(client, NS, "cold").await?;
            let failed = said.iter().any(|(reason, message)| {
                reason == "FailedPostStartHook" && message.contains("500")
            });
            let killed = said.iter().any(|(reason, message)| {
                reason == "Killing" && message.contains("failed its postStart hook")
            });
            Ok((failed && killed).then_some(()))
        },
    )
    .await?;
    // The restarted container gets the hook again (and fails again).
    wait::until(
        "the postStart hook sent to the restarted container",
        WAIT,
        || async { Ok((health.hits("/cold") >= 2).then_some(())) },
    )
    .await?;
    let said = support::pods::events(client, NS, "warmed").await?;
    ensure!(
        !said.iter().any(|(reason, message)| {
            reason == "FailedPostStartHook"
                || (reason == "PodFieldsNotHonoured" && message.contains("postStart"))
        }),
        "a postStart hook that ran is said not to: {said:?}"
    );
    ensure!(
        health.hits("/warm") == 1,
        "the postStart hook ran {} times for one container start",
        health.hits("/warm")
    );
    for name in ["warmed", "cold"] {
        pods.delete(name, &Default::default()).await?;
    }
    for name in ["warmed", "cold"] {
        support::pods::gone(pods, name).await?;
    }
    Ok(())
}
