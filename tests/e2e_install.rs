//! End-to-end tests of what a company cluster needs at install time, on the real control plane
//! with the controller and the cloud simulator as processes: the cloud reached only through a
//! corporate forward proxy (Debian's tinyproxy) over TLS signed by a private CA.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{annotation, bound_gpu_pod, event, gone, namespace, node_ready, running};

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_install", &ExtraFlags::default(), |cp| {
        Box::pin(run(cp))
    })
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    cloud_through_a_proxy(control_plane, &client)
        .await
        .context("cloud through a proxy")?;
    Ok(())
}

/// A forward proxy that logs every CONNECT (tinyproxy, as installed by
/// scripts/prerequisites.sh), on a free loopback port.
struct Tinyproxy {
    child: Child,
    url: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Tinyproxy {
    fn start() -> anyhow::Result<Tinyproxy> {
        let dir = tempfile::tempdir()?;
        let port = support::webhook::free_port()?.port();
        let log = dir.path().join("tinyproxy.log");
        let config = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 120\nLogFile \"{}\"\nLogLevel Connect\n\
                 MaxClients 100\nAllow 127.0.0.1\nDisableViaHeader Yes\n",
                log.display()
            ),
        )?;
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tinyproxy (scripts/prerequisites.sh installs it)")?;
        let url = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(
                std::time::Instant::now() < deadline,
                "tinyproxy did not listen"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(Tinyproxy {
            child,
            url,
            log,
            _dir: dir,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `runpod-kubelet certs` for 127.0.0.2: a private CA and a serving pair signed by it.
fn private_ca(dir: &Path) -> anyhow::Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
        .args(["certs", "--out-dir"])
        .arg(dir)
        .args([
            "--ip-addresses",
            "127.0.0.2",
            "--dns-names",
            "cloud.internal",
        ])
        .output()?;
    ensure!(
        out.status.success(),
        "certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The cloud answers only over TLS signed by a private CA (a TLS-inspecting gateway's), on an
/// address the controller reaches through the proxy alone: `HTTPS_PROXY` names tinyproxy,
/// `NO_PROXY` the apiserver, `--cloud-ca-file` the CA. A pod runs and is deleted (its instance
/// terminated), every cloud call a CONNECT in the proxy's log, while the Kubernetes client
/// talks to the apiserver directly.
async fn cloud_through_a_proxy(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let certs = tempfile::tempdir()?;
    private_ca(certs.path())?;
    let tls_cert = certs.path().join("tls.crt");
    let tls_key = certs.path().join("tls.key");
    let simulator = SimulatorProcess::start_with(
        "runpod",
        &json!({"provisioning_ms": 500, "starting_ms": 200, "ports_ms": 100}),
        &[
            "--listen",
            "127.0.0.2:0",
            "--tls-cert",
            tls_cert.to_str().unwrap(),
            "--tls-key",
            tls_key.to_str().unwrap(),
        ],
    )?;
    ensure!(
        simulator.url.starts_with("https://127.0.0.2:"),
        "{}",
        simulator.url
    );
    let proxy = Tinyproxy::start()?;
    let ca = certs.path().join("ca.crt");
    let controller = ControllerProcess::start_with_env(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator.url,
        &["--cloud-ca-file", ca.to_str().unwrap()],
        &[
            ("HTTPS_PROXY", proxy.url.as_str()),
            ("NO_PROXY", "127.0.0.1,localhost"),
        ],
    )?;
    let outcome = async {
        node_ready(client).await?;
        let ns = "install-proxy";
        namespace(client, ns, true).await?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.create(
            &PostParams::default(),
            &bound_gpu_pod("through-proxy", "e2e/server:1", "Always"),
        )
        .await?;
        let pod = running(&pods, "through-proxy").await?;
        // Its declared port 8888 is public, and the Event says so.
        let id = annotation(&pod, "runpod.io/pod-id")
            .unwrap_or_default()
            .to_owned();
        let created = event(client, ns, "through-proxy", "RunPodPodCreated").await?;
        ensure!(
            created.contains(&format!(
                "PUBLIC endpoints on the internet: https://{id}-8888.proxy.runpod.net"
            )),
            "Event {created:?}"
        );
        let mut closed = bound_gpu_pod("closed", "e2e/server:1", "Always");
        closed.metadata.annotations =
            Some([("runpod.io/ports".to_owned(), "none".to_owned())].into());
        pods.create(&PostParams::default(), &closed).await?;
        running(&pods, "closed").await?;
        let created = event(client, ns, "closed", "RunPodPodCreated").await?;
        ensure!(created.ends_with("; no port exposed"), "Event {created:?}");
        for name in ["through-proxy", "closed"] {
            pods.delete(name, &DeleteParams::default()).await?;
            gone(&pods, name).await?;
        }
        let port = simulator.url.rsplit(':').next().unwrap_or_default();
        let log = proxy.log();
        let connects = log
            .lines()
            .filter(|l| l.contains(&format!("CONNECT 127.0.0.2:{port} ")))
            .count();
        ensure!(
            connects >= 1,
            "no CONNECT to the cloud in the proxy's log:\n{log}"
        );
        // The apiserver was never asked of the proxy.
        ensure!(
            !log.lines()
                .any(|l| l.contains("Request") && l.contains("127.0.0.1:")),
            "the Kubernetes client went through the proxy:\n{log}"
        );
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}
