//! End-to-end tests of what a company cluster needs at install time, on the real control plane
//! with the controller and the cloud simulator as processes: the cloud reached only through a
//! corporate forward proxy (Debian's tinyproxy) over TLS signed by a private CA; the create
//! Event naming the pod's public endpoints, and `runpod.io/ports: none` exposing none; a wrong
//! API key reported on the node at once, a drain that stops at once on it, and a `helm install`
//! that fails at once on it (the chart's check-key hook, run by the stand-in kubelet of
//! tests/support/pod_runner.rs); moving from the Go kubelet (its manifests opting in by their
//! toleration, its RunPod pods taken over by `runpod-kubelet adopt`); `kubectl logs` through an
//! apiserver that verifies kubelet certificates, with one the cluster issued.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::chart::{helm, host_ip};
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pod_runner::PodRunner;
use support::pods::{
    NODE, WAIT, annotation, bound_gpu_pod, event, gone, ledger_live, namespace, node_condition,
    node_ready, running,
};
use support::webhook::free_port;

fn main() -> std::process::ExitCode {
    // The apiserver verifies kubelet certificates against the cluster CA, as hardened clusters do.
    let flags = ExtraFlags {
        apiserver: vec!["--kubelet-certificate-authority={pki}/ca.crt".to_owned()],
        ..ExtraFlags::default()
    };
    support::harness::main("e2e_install", &flags, |cp| Box::pin(run(cp)))
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    cloud_through_a_proxy(control_plane, &client)
        .await
        .context("cloud through a proxy")?;
    a_wrong_key_fails_fast(control_plane, &client)
        .await
        .context("a wrong key")?;
    helm_install_with_a_wrong_key_fails_at_once(control_plane, &client)
        .await
        .context("helm install with a wrong key")?;
    moving_from_the_go_kubelet(control_plane, &client)
        .await
        .context("moving from the Go kubelet")?;
    logs_through_an_apiserver_that_verifies_kubelets(control_plane, &client)
        .await
        .context("kubelet certificate")?;
    a_kept_certificate_needs_nobody_after_a_restart(control_plane, &client)
        .await
        .context("kept kubelet certificate")?;
    Ok(())
}

/// A simulator whose `e2e/server` pods log `serving on 8888`.
fn log_server_simulator() -> anyhow::Result<SimulatorProcess> {
    SimulatorProcess::start(&json!({
        "provisioning_ms": 300, "starting_ms": 100,
        "images": [{"match": "server", "logs": ["serving on 8888"]}]
    }))
}

/// Waits until `kubectl logs` of the pod, through the apiserver that verifies kubelet
/// certificates, shows the server's line.
async fn kubectl_logs_show(
    control_plane: &ControlPlane,
    ns: &str,
    pod: &str,
) -> anyhow::Result<()> {
    support::wait::until(
        "kubectl logs through the verifying apiserver",
        WAIT,
        || async {
            let out = Command::new("kubectl")
                .args(["logs", pod, "-n", ns, "--kubeconfig"])
                .arg(&control_plane.kubeconfig)
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            Ok((out.status.success() && text.contains("serving on 8888")).then_some(()))
        },
    )
    .await
}

/// `--kubelet-tls-approve --kubelet-tls-secret`: the controller approves its own node's request
/// (nobody runs `kubectl certificate approve`), keeps what the cluster issued in a Secret, and
/// after a restart serves it at once: `kubectl logs` through the verifying apiserver works, and
/// no new request is made.
async fn a_kept_certificate_needs_nobody_after_a_restart(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    let simulator = log_server_simulator()?;
    let ns = "install-kept";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let flags = [
        "--cluster-id",
        "e2e-kept",
        "--kubelet-tls-csr",
        "--kubelet-tls-approve",
        "--kubelet-tls-secret",
        "default/virtual-runpod-kubelet-serving",
    ];
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let logs_work = || kubectl_logs_show(control_plane, ns, "kept");
    let first = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &flags,
    )?;
    let outcome = async {
        pods.create(
            &PostParams::default(),
            &bound_gpu_pod("kept", "e2e/server:1", "Always"),
        )
        .await?;
        running(&pods, "kept").await?;
        logs_work().await?;
        let request = csrs.get("virtual-runpod-serving-runpod-kubelet").await?;
        let approved = request
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| {
                c.type_ == "Approved" && c.reason.as_deref() == Some("RunPodKubeletSelfApproved")
            });
        ensure!(
            approved,
            "the request was not approved by the controller: {request:?}"
        );
        let kept = secrets.get("virtual-runpod-kubelet-serving").await?;
        ensure!(
            kept.type_.as_deref() == Some("kubernetes.io/tls"),
            "kept as {:?}",
            kept.type_
        );
        anyhow::Ok(request.metadata.uid)
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", first.log_tail(60));
    }
    let request_uid = outcome?;
    drop(first);

    let second = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &flags,
    )?;
    let outcome = async {
        logs_work().await?;
        let request = csrs.get("virtual-runpod-serving-runpod-kubelet").await?;
        ensure!(
            request.metadata.uid == request_uid,
            "a new certificate was requested after the restart"
        );
        ensure!(
            second
                .log_tail(400)
                .contains("serves the certificate kept from before"),
            "the kept certificate was not served"
        );
        pods.delete("kept", &DeleteParams::default()).await?;
        gone(&pods, "kept").await?;
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", second.log_tail(60));
    }
    outcome
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
        // A hardened pod: what the cloud does not apply is said in an Event, not dropped.
        if let Some(spec) = closed.spec.as_mut() {
            spec.security_context = Some(serde_json::from_value(
                json!({"runAsUser": 1000, "runAsNonRoot": true}),
            )?);
        }
        pods.create(&PostParams::default(), &closed).await?;
        running(&pods, "closed").await?;
        let created = event(client, ns, "closed", "RunPodPodCreated").await?;
        ensure!(created.ends_with("; no port exposed"), "Event {created:?}");
        let unapplied = event(client, ns, "closed", "SecurityContextNotApplied").await?;
        ensure!(
            unapplied.contains("securityContext.runAsNonRoot, securityContext.runAsUser"),
            "Event {unapplied:?}"
        );
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

/// A controller started with a key the cloud refuses (a pod of an earlier run still billing):
/// the node says `RunPodAPIAvailable=False`, reason `KeyRefused`, with an Event naming the
/// Secret the key comes from, and the log has an error line. `controller drain` with that key
/// stops at once (not after its 10-minute timeout), exits non-zero naming the refusal and the
/// instance that may still bill, and terminates nothing.
async fn a_wrong_key_fails_fast(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let simulator = SimulatorProcess::start(&json!({"provisioning_ms": 300, "starting_ms": 100}))?;
    let ns = "install-key";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let id = {
        let _good = ControllerProcess::start(
            &control_plane.kubeconfig,
            &control_plane.ca_file(),
            &simulator,
            &["--cluster-id", "e2e-install"],
        )?;
        pods.create(
            &PostParams::default(),
            &bound_gpu_pod("billing", "e2e/server:1", "Always"),
        )
        .await?;
        let pod = running(&pods, "billing").await?;
        annotation(&pod, "runpod.io/pod-id")
            .unwrap_or_default()
            .to_owned()
    };
    let secret = "runpod-system/runpod-kubelet-runpod (key RUNPOD_API_KEY)";
    let wrong = ControllerProcess::start_with_env(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator.url,
        &["--cluster-id", "e2e-install", "--api-key-secret", secret],
        &[("RUNPOD_API_KEY", "wrong-key-0123456789")],
    )?;
    let outcome = async {
        let nodes: Api<Node> = Api::all(client.clone());
        support::wait::until("node KeyRefused", WAIT, || async {
            let node = nodes.get(NODE).await?;
            Ok(node_condition(&node, "RunPodAPIAvailable")
                .filter(|(status, reason)| status == "False" && reason == "KeyRefused"))
        })
        .await?;
        let message = event(client, "default", NODE, "KeyRefused").await?;
        ensure!(
            message.contains(&format!("the key comes from Secret {secret}")),
            "node Event {message:?}"
        );
        ensure!(
            !message.contains("wrong-key") && !wrong.log().contains("wrong-key"),
            "the key leaked"
        );
        ensure!(
            wrong.log().contains("refuses this node's API key"),
            "no error line:\n{}",
            wrong.log_tail(20)
        );

        let mut drain = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .args([
                "controller",
                "drain",
                "--cluster-id",
                "e2e-install",
                "--timeout",
                "10m",
            ])
            .args(["--runpod-api-url", &simulator.url])
            .env("KUBECONFIG", &control_plane.kubeconfig)
            .env("RUNPOD_API_KEY", "wrong-key-0123456789")
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        // Retrying would last the whole 10 minutes; it must have given up long before.
        let deadline = std::time::Instant::now() + WAIT;
        let status = loop {
            if let Some(status) = drain.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = drain.kill();
                anyhow::bail!("drain kept retrying the refused key");
            }
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut drain.stderr.take().context("stderr")?, &mut stderr)?;
        ensure!(
            !status.success(),
            "drain succeeded with a refused key: {stderr}"
        );
        ensure!(
            stderr.contains("refused the key")
                && stderr.contains(&format!("May still bill: {id} (pod {ns}/billing)")),
            "drain said: {stderr}"
        );
        ensure!(
            ledger_live(&simulator, &id).await?,
            "drain terminated something"
        );
        // Refused before it touched the node: not cordoned, not marked draining.
        let node = nodes.get(NODE).await?;
        ensure!(
            node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
                && !annotation_of(&node, "runpod.io/draining"),
            "the refused drain left the node cordoned or marked"
        );
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", wrong.log_tail(60));
        let log = wrong.log();
        for line in log
            .lines()
            .filter(|l| l.contains("ERROR") || l.contains("Event"))
        {
            eprintln!("{line}");
        }
    }
    drop(wrong);
    // Clean up with the right key: nothing is left billing.
    let _good = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", "e2e-install"],
    )?;
    pods.delete("billing", &DeleteParams::default()).await?;
    gone(&pods, "billing").await?;
    ensure!(
        !ledger_live(&simulator, &id).await?,
        "the pod's instance still bills"
    );
    outcome
}

/// `helm install --wait` with a key the cloud refuses fails at once on the pre-install hook
/// `NODE-check-key` (not after Helm's 5-minute wait), before anything is installed; the hook's
/// log names the Secret and never the key. `helm uninstall --no-hooks` removes the failed
/// release (nothing was created to bill).
async fn helm_install_with_a_wrong_key_fails_at_once(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let simulator = SimulatorProcess::start(&json!({}))?;
    let runner = PodRunner::start(
        client.clone(),
        control_plane.server_url()?,
        std::fs::read_to_string(control_plane.ca_file())?,
        host_ip()?,
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let values = dir.path().join("values.json");
    std::fs::write(
        &values,
        serde_json::to_vec(&json!({
            "runpod": {"apiKey": "wrong-key-0123456789", "apiUrl": simulator.url},
            "log": {"format": "text", "level": "info"},
            "webhook": {"replicas": 1, "port": free_port()?.port()},
            "controller": {"kubeletPort": free_port()?.port(), "metricsPort": free_port()?.port(),
                           "clusterId": "e2e-bad-key"}
        }))?,
    )?;
    let kubeconfig = control_plane.kubeconfig.as_path();
    let installed = helm(
        kubeconfig,
        &[
            "install",
            "bad",
            "charts/runpod-kubelet",
            "--namespace",
            "install-bad",
            "--create-namespace",
            "-f",
            values.to_str().unwrap_or_default(),
            "--wait",
            "--timeout",
            "4m",
        ],
    );
    let error = match installed {
        Ok(out) => anyhow::bail!("helm install with a refused key succeeded: {out}"),
        Err(error) => format!("{error:#}"),
    };
    ensure!(
        error.contains("bad-runpod-kubelet-controller-check-key"),
        "helm's error does not name the check: {error}"
    );
    ensure!(
        !error.contains("timed out") && !error.contains("context deadline"),
        "{error}"
    );
    let log = runner.logs("bad-runpod-kubelet-controller-check-key");
    ensure!(
        log.contains("refused the API key from Secret install-bad/bad-runpod-kubelet-runpod (key RUNPOD_API_KEY)"),
        "check-key log: {log}"
    );
    ensure!(!log.contains("wrong-key"), "the key leaked into the log");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "install-bad");
    ensure!(
        deployments
            .list(&Default::default())
            .await?
            .items
            .is_empty(),
        "something was installed"
    );
    helm(
        kubeconfig,
        &[
            "uninstall",
            "bad",
            "--namespace",
            "install-bad",
            "--no-hooks",
        ],
    )?;
    Ok(())
}

/// Moving from the Go kubelet: its RunPod pod (no tags of ours) still runs for a Kubernetes pod
/// that opts in only by tolerating the RunPod taint (`--accept-seed-tolerations`) and names it
/// in `runpod.io/pod-id`. The controller makes no second instance and says to run `adopt`;
/// `adopt --dry-run` lists it linked (and a stranger's RunPod pod unlinked) and changes
/// nothing; `adopt` takes it over without a restart: the pod runs on the same instance, and
/// deleting the pod terminates it, while the stranger's is never touched.
async fn moving_from_the_go_kubelet(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let simulator = SimulatorProcess::start(&json!({"provisioning_ms": 300, "starting_ms": 100}))?;
    // The Go kubelet placed its pods under its own rules: here in a data centre this controller
    // does not allow (`--datacenter-ids EU-RO-1`), which must not get them replaced.
    let body = |name: &str| {
        json!({"name": name, "image": "e2e/server:1", "dataCenterIds": ["EU-SE-1"],
               "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}, "env": {"FOO": "bar"}})
    };
    // Not labelled: the pod opts in by its toleration alone, as the Go kubelet's manifests did;
    // the Go kubelet then made its RunPod pod and wrote the id onto it.
    let ns = "install-seed";
    namespace(client, ns, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod = bound_gpu_pod("legacy-train", "e2e/server:1", "Always");
    pod.metadata.labels = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.tolerations = Some(vec![serde_json::from_value(json!({
            "key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "runpod",
            "effect": "NoSchedule"}))?]);
        // The env the Go kubelet copied into its RunPod pods (`body`).
        spec.containers[0].env = Some(vec![serde_json::from_value(
            json!({"name": "FOO", "value": "bar"}),
        )?]);
    }
    let mut second = pod.clone();
    second.metadata.name = Some("legacy-serve".to_owned());
    let pod = pods.create(&PostParams::default(), &pod).await?;
    let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
    pods.create(&PostParams::default(), &second).await?;
    let legacy = simulator.create_pod(&body("legacy-train")).await?;
    let serve = simulator.create_pod(&body("legacy-serve")).await?;
    let stranger = simulator.create_pod(&body("stranger")).await?;
    let id = |pod: &serde_json::Value| pod["id"].as_str().unwrap_or_default().to_owned();
    let (legacy_id, stranger_id, serve_id) = (id(&legacy), id(&stranger), id(&serve));
    for (name, id) in [("legacy-serve", &serve_id), ("legacy-train", &legacy_id)] {
        let annotation = json!({"metadata": {"annotations": {"runpod.io/pod-id": id}}});
        pods.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(annotation),
        )
        .await?;
    }

    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &[
            "--cluster-id",
            "e2e-seed",
            "--accept-seed-tolerations",
            "--datacenter-ids",
            "EU-RO-1",
        ],
    )?;
    let outcome = async {
        let message = event(client, ns, "legacy-train", "AdoptionNeeded").await?;
        ensure!(
            message.contains("runpod-kubelet adopt") && message.contains(&legacy_id),
            "{message}"
        );
        ensure!(
            support::pods::ledger_for(&simulator, &pod_uid)
                .await?
                .is_empty(),
            "a second instance was created before adoption"
        );

        let adopt = |dry_run: bool| {
            let mut command = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"));
            command
                .args([
                    "adopt",
                    "--runpod-api-url",
                    &simulator.url,
                    "--adoption-namespace",
                    "default",
                ])
                .env("KUBECONFIG", &control_plane.kubeconfig)
                .env("RUNPOD_API_KEY", support::controller::API_KEY);
            if dry_run {
                command.arg("--dry-run");
            }
            command.output()
        };
        // RunPod's list may lag a fresh create (these two were made just now): ask until both
        // are listed.
        let expected = [
            format!("{legacy_id} legacy-train -> {ns}/legacy-train"),
            format!("{stranger_id} stranger -> none"),
            format!("{serve_id} legacy-serve -> {ns}/legacy-serve"),
        ];
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let listed = adopt(true)?;
            ensure!(
                listed.status.success(),
                "adopt --dry-run: {}",
                String::from_utf8_lossy(&listed.stderr)
            );
            let last = String::from_utf8_lossy(&listed.stdout).into_owned();
            if expected.iter().all(|line| last.contains(line.as_str())) {
                break;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "adopt --dry-run printed: {last}"
            );
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(client.clone(), "default");
        ensure!(
            maps.get_opt("runpod-kubelet-adopted-virtual-runpod")
                .await?
                .is_none(),
            "--dry-run recorded something"
        );

        let adopted = adopt(false)?;
        ensure!(
            adopted.status.success(),
            "adopt: {}",
            String::from_utf8_lossy(&adopted.stderr)
        );
        let running_pod = running(&pods, "legacy-train").await?;
        ensure!(
            annotation(&running_pod, "runpod.io/pod-id") == Some(legacy_id.as_str()),
            "the pod moved to another instance"
        );
        ensure!(
            support::pods::ledger_for(&simulator, &pod_uid)
                .await?
                .is_empty(),
            "an instance was created for the adopted pod"
        );
        ensure!(
            ledger_live(&simulator, &legacy_id).await?,
            "the adopted instance was stopped"
        );
        // Tracked as it is for many reconciles (1 s each here), not replaced a little later.
        let lists = simulator.successful_lists().await?;
        while simulator.successful_lists().await? < lists + 8 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        let still = pods.get("legacy-train").await?;
        ensure!(
            annotation(&still, "runpod.io/pod-id") == Some(legacy_id.as_str()),
            "the adopted pod's instance was replaced"
        );
        ensure!(
            support::pods::ledger_for(&simulator, &pod_uid)
                .await?
                .is_empty()
                && ledger_live(&simulator, &legacy_id).await?,
            "the adopted instance was replaced or stopped after a few reconciles"
        );
        ensure!(
            still.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
            "the adopted pod is no longer running"
        );

        pods.delete("legacy-train", &DeleteParams::default())
            .await?;
        gone(&pods, "legacy-train").await?;
        ensure!(
            !ledger_live(&simulator, &legacy_id).await?,
            "the adopted instance still bills"
        );
        ensure!(
            ledger_live(&simulator, &stranger_id).await?,
            "the stranger's RunPod pod was touched"
        );
        // Uninstalling drains adopted instances like ours, and leaves the stranger's alone.
        let drained = Command::new(env!("CARGO_BIN_EXE_runpod-kubelet"))
            .args([
                "controller",
                "drain",
                "--cluster-id",
                "e2e-seed",
                "--timeout",
                "2m",
            ])
            .args([
                "--runpod-api-url",
                &simulator.url,
                "--adoption-namespace",
                "default",
            ])
            .env("KUBECONFIG", &control_plane.kubeconfig)
            .env("RUNPOD_API_KEY", support::controller::API_KEY)
            .output()?;
        ensure!(
            drained.status.success(),
            "drain: {}",
            String::from_utf8_lossy(&drained.stderr)
        );
        ensure!(
            !ledger_live(&simulator, &serve_id).await?,
            "drain left the adopted instance billing"
        );
        ensure!(
            ledger_live(&simulator, &stranger_id).await?,
            "drain touched the stranger's RunPod pod"
        );
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}

/// An apiserver that verifies kubelet certificates (`--kubelet-certificate-authority`, the
/// cluster CA): with the self-signed default `kubectl logs` of a burst pod fails with an x509
/// error; with `--kubelet-tls-csr` the controller asks the cluster for a
/// `kubernetes.io/kubelet-serving` certificate, the cluster admin approves it, and `kubectl
/// logs` works.
async fn logs_through_an_apiserver_that_verifies_kubelets(
    control_plane: &ControlPlane,
    client: &kube::Client,
) -> anyhow::Result<()> {
    let simulator = log_server_simulator()?;
    let ns = "install-tls";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let flags = ["--cluster-id", "e2e-tls"];
    let self_signed = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &flags,
    )?;
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("verified", "e2e/server:1", "Always"),
    )
    .await?;
    running(&pods, "verified").await?;
    let refused = pods
        .logs("verified", &Default::default())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    ensure!(
        refused.contains("x509") || refused.contains("certificate"),
        "a self-signed kubelet certificate was accepted: {refused:?}"
    );
    drop(self_signed);

    let csr_flags = ["--cluster-id", "e2e-tls", "--kubelet-tls-csr"];
    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &csr_flags,
    )?;
    let outcome = async {
        let csrs: Api<k8s_openapi::api::certificates::v1::CertificateSigningRequest> =
            Api::all(client.clone());
        let name = support::wait::until("the kubelet-serving request", WAIT, || async {
            Ok(csrs
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find(|csr| {
                    csr.spec.signer_name == "kubernetes.io/kubelet-serving"
                        && csr.status.as_ref().is_none_or(|s| s.certificate.is_none())
                        && csr
                            .metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("virtual-runpod-serving-"))
                })
                .and_then(|csr| csr.metadata.name))
        })
        .await?;
        // The cluster admin's approval.
        let approved = Command::new("kubectl")
            .args(["certificate", "approve", &name, "--kubeconfig"])
            .arg(&control_plane.kubeconfig)
            .output()?;
        ensure!(
            approved.status.success(),
            "kubectl certificate approve: {}",
            String::from_utf8_lossy(&approved.stderr)
        );
        kubectl_logs_show(control_plane, ns, "verified").await?;
        pods.delete("verified", &DeleteParams::default()).await?;
        gone(&pods, "verified").await?;
        anyhow::Ok(())
    }
    .await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(60));
    }
    outcome
}

fn annotation_of(node: &Node, key: &str) -> bool {
    node.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(key))
}
