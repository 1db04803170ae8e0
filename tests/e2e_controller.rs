//! End-to-end tests of the provider controller: the real control plane (apiserver, scheduler,
//! Job controller), the webhook and the controller as processes, and the RunPod simulator.
//! A plain GPU Job in a labelled namespace bursts to RunPod, runs and completes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{annotation, exit_code, ledger_for, phase};
use support::wait;
use support::webhook::WebhookProcess;

const NODE: &str = "virtual-runpod";
const WAIT: Duration = Duration::from_secs(120);

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 500, "ports_ms": 500, "list_lag_ms": 500,
        "images": [
            {"match": "trainer", "outcome": "EXITED", "after_ms": 3000,
             "logs": ["epoch 1", "epoch 2"], "exit_code": 0},
            {"match": "failing", "outcome": "EXITED", "after_ms": 2000,
             "logs": ["oops"], "exit_code": 3},
            {"match": "server", "logs": ["serving on 8888"]},
            {"match": "restarter", "outcome": "EXITED", "after_ms": 3000, "logs": ["working"]}
        ]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_controller controller_bursts_a_gpu_job",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let webhook = WebhookProcess::start(
        &control_plane.kubeconfig,
        &[
            "--datacenter-ids",
            "EU-RO-1,US-TX-3",
            "--max-gpu-price",
            "2",
        ],
    )
    .await?;
    webhook.register(&client, &["kube-system"]).await?;
    let metrics = support::webhook::free_port()?.to_string();
    let mut controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", "e2e-cluster", "--metrics-listen", &metrics],
    )?;
    let outcome = scenarios(&client, &simulator, &controller, &metrics).await;
    if outcome.is_err() {
        let log = controller.log();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!(
            "--- controller log tail (alive: {}) ---\n{}",
            controller.alive(),
            lines[lines.len().saturating_sub(60)..].join("\n")
        );
    }
    outcome
}

async fn scenarios(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &ControllerProcess,
    metrics: &str,
) -> anyhow::Result<()> {
    node_registers(client).await.context("node registration")?;
    let ns = "e2e-burst";
    namespace(client, ns).await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "hf"}, "stringData": {"token": "s3cr3t-value"}}),
            )?,
        )
        .await?;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "train-config"}, "data": {"app.yaml": "lr: 0.1\n"}}),
            )?,
        )
        .await?;

    // 1. A plain GPU Job with no RunPod fields bursts, runs and completes.
    let train = job(
        "train",
        "e2e/trainer:1",
        &["python", "train.py", "--epochs", "2"],
    );
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &train)
        .await?;
    wait::until("Job train complete", WAIT, || async {
        let job = Api::<Job>::namespaced(client.clone(), ns)
            .get("train")
            .await?;
        let done = job.status.and_then(|s| s.succeeded).unwrap_or(0) == 1;
        Ok(done.then_some(()))
    })
    .await?;
    let pod = pod_of_job(client, ns, "train").await?;
    let uid = pod.metadata.uid.clone().context("uid")?;
    ensure!(phase(&pod) == Some("Succeeded"), "phase {:?}", phase(&pod));
    ensure!(
        exit_code(&pod) == Some(0),
        "exit code {:?}",
        exit_code(&pod)
    );
    ensure!(
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE),
        "not on the virtual node"
    );
    let tolerations = serde_json::to_value(&pod.spec.as_ref().unwrap().tolerations)?;
    ensure!(
        tolerations.as_array().unwrap().iter().any(|t| t["key"] == "node.kubernetes.io/unreachable" && t["tolerationSeconds"] == 3600),
        "outage tolerations not lengthened: {tolerations}"
    );
    let entries = ledger_for(simulator, &uid).await?;
    ensure!(
        entries.len() == 1,
        "expected exactly one RunPod pod, got {}",
        entries.len()
    );
    let entry = &entries[0];
    ensure!(
        entry["image"] == "e2e/trainer:1",
        "image {}",
        entry["image"]
    );
    ensure!(
        entry["env"]["HF_TOKEN"] == "s3cr3t-value",
        "Secret env not resolved"
    );
    ensure!(
        entry["env"]["RUNPOD_KUBELET_CLUSTER"] == "e2e-cluster",
        "cluster tag missing"
    );
    ensure!(entry["gpu_id"].is_string(), "no GPU: {entry}");
    let dc = entry["data_center_id"].as_str().unwrap_or_default();
    ensure!(["EU-RO-1", "US-TX-3"].contains(&dc), "placed in {dc}");
    let args = entry["args"].as_str().unwrap_or_default();
    ensure!(
        args.contains("runpod-kubelet: exit-code=") && args.contains("train.py --epochs 2"),
        "args {args}"
    );
    // The configMap volume is written by the wrapper from env, before the command.
    ensure!(
        args.contains("/etc/train/app.yaml") && args.contains("base64 -d"),
        "configMap volume not materialised: {args}"
    );
    let mounted = entry["env"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(key, _)| key.starts_with("RUNPOD_KUBELET_FILE_"))
        .filter_map(|(_, value)| BASE64.decode(value.as_str()?).ok())
        .collect::<Vec<_>>();
    // The configMap file, and of the ServiceAccount mount only `ca.crt` and `namespace`: the
    // token (a JWT) never leaves the cluster.
    let texts: Vec<String> = mounted
        .iter()
        .map(|file| String::from_utf8_lossy(file).into_owned())
        .collect();
    ensure!(
        texts.iter().any(|text| text == "lr: 0.1\n")
            && texts.iter().any(|text| text == ns)
            && texts
                .iter()
                .any(|text| text.starts_with("-----BEGIN CERTIFICATE-----"))
            && texts.len() == 3
            && !texts.iter().any(|text| text.starts_with("eyJ")),
        "mounted file contents {texts:?}"
    );
    ensure!(
        entry["ports"] == json!(["8888/http", "22/tcp"]),
        "ports {}",
        entry["ports"]
    );
    ensure!(
        !entry["terminated_at"].is_null(),
        "the finished pod's RunPod pod still bills"
    );

    // The finished pod's RunPod pod is gone, yet `kubectl logs` still shows its output.
    let finished_logs = Api::<Pod>::namespaced(client.clone(), ns)
        .logs(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &LogParams::default(),
        )
        .await?;
    ensure!(
        // The wrapper's exit line is the controller's, not the user's (issue 45).
        finished_logs.contains("epoch 2") && !finished_logs.contains("runpod-kubelet: exit-code="),
        "logs of the finished pod: {finished_logs:?}"
    );

    // 2. A failing command fails the pod with its exit code.
    let failing = job("fail", "e2e/failing:1", &["sh", "-c", "exit 3"]);
    Api::<Job>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &failing)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let failed = wait::until("failing pod Failed", WAIT, || async {
        let pod = pod_of_job(client, ns, "fail").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    ensure!(
        exit_code(&failed) == Some(3),
        "exit code {:?}",
        exit_code(&failed)
    );
    let entries = ledger_for(
        simulator,
        failed.metadata.uid.as_deref().unwrap_or_default(),
    )
    .await?;
    ensure!(
        entries.len() == 1 && !entries[0]["terminated_at"].is_null(),
        "failed pod's RunPod pod: {entries:?}"
    );

    // 2b. No command to wrap: RunPod restarts the container, and `restartPolicy: Never` still
    // ends the pod at the first restart the controller sees (exit code unknown).
    let restarter: Pod = serde_json::from_value(json!({
        "metadata": {"name": "restarter", "annotations": {"runpod.io/burst-mode": "always"}},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "e2e/restarter:1",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &restarter).await?;
    let ended = wait::until("unwrapped pod ended", WAIT, || async {
        let pod = pods.get("restarter").await?;
        Ok(matches!(phase(&pod), Some("Failed" | "Succeeded")).then_some(pod))
    })
    .await?;
    let terminated = ended
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .context("no terminated state")?;
    ensure!(
        terminated.reason.as_deref() == Some("ExitCodeUnknown"),
        "unwrapped pod ended with {terminated:?}"
    );
    let entries = ledger_for(simulator, ended.metadata.uid.as_deref().unwrap_or_default()).await?;
    ensure!(
        entries.len() == 1
            && !entries[0]["terminated_at"].is_null()
            && !entries[0]["args"]
                .as_str()
                .unwrap_or_default()
                .contains("exit-code"),
        "unwrapped pod's RunPod pod: {entries:?}"
    );

    // 2c. A controller that died between terminating a finished pod's RunPod pod and writing
    // its phase left the end recorded on the pod: the pod is finished from the record, never
    // created again. (Bound directly, opted out of the webhook, which would strip the record.)
    namespace(client, "e2e-recorded").await?;
    let recorded: Pod = serde_json::from_value(json!({
        "metadata": {"name": "recorded", "labels": {"runpod.io/burst": "disabled"}, "annotations": {
            "runpod.io/create-requested": "2026-01-01T00:00:00Z",
            "runpod.io/ended": r#"{"exit_code":0,"reason":"Completed","message":"the command exited with code 0"}"#}},
        "spec": {"nodeName": NODE, "restartPolicy": "Never",
            "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}],
            "containers": [{"name": "main", "image": "e2e/trainer:1", "command": ["train"],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    let recorded_pods: Api<Pod> = Api::namespaced(client.clone(), "e2e-recorded");
    recorded_pods
        .create(&PostParams::default(), &recorded)
        .await?;
    let finished = wait::until("recorded pod finished", WAIT, || async {
        let pod = recorded_pods.get("recorded").await?;
        Ok(phase(&pod).is_some_and(|p| p != "Pending").then_some(pod))
    })
    .await?;
    ensure!(
        phase(&finished) == Some("Succeeded") && exit_code(&finished) == Some(0),
        "recorded end not replayed: {:?}",
        finished.status
    );
    let again = ledger_for(
        simulator,
        finished.metadata.uid.as_deref().unwrap_or_default(),
    )
    .await?;
    ensure!(
        again.is_empty(),
        "a finished pod was created again: {again:?}"
    );
    // The same, but the terminate never went through and RunPod restarted the container: the
    // live RunPod pod is found, the pod finishes from the record, and the RunPod pod is
    // terminated. The pod is bound only once its RunPod pod exists.
    let mut unbound = recorded.clone();
    unbound.metadata.name = Some("recorded-live".into());
    if let Some(spec) = unbound.spec.as_mut() {
        spec.node_name = None;
        spec.scheduler_name = Some("none".into());
    }
    let unbound = recorded_pods
        .create(&PostParams::default(), &unbound)
        .await?;
    let live_uid = unbound.metadata.uid.clone().unwrap_or_default();
    let live = simulator
        .create_pod(&json!({"name": "recorded-live", "image": "e2e/server:1",
            "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1},
            "env": {"RUNPOD_KUBELET_CLUSTER": "e2e-cluster", "RUNPOD_KUBELET_NODE": NODE,
                    "RUNPOD_KUBELET_POD_UID": live_uid}}))
        .await?;
    let live_id = live["id"].as_str().unwrap_or_default().to_owned();
    // Bind only once the controller's lists show the RunPod pod (3 more lists, past the lag).
    let seen_before = simulator.successful_lists().await?;
    wait::until("lists after the RunPod pod appeared", WAIT, || async {
        Ok((simulator.successful_lists().await? >= seen_before + 3).then_some(()))
    })
    .await?;
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "recorded-live"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
    recorded_pods
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "recorded-live",
            &PostParams::default(),
            &binding,
        )
        .await?;
    let finished = wait::until("recorded live pod finished", WAIT, || async {
        let pod = recorded_pods.get("recorded-live").await?;
        Ok(phase(&pod).is_some_and(|p| p != "Pending").then_some(pod))
    })
    .await?;
    ensure!(
        phase(&finished) == Some("Succeeded") && exit_code(&finished) == Some(0),
        "recorded end with a live RunPod pod: {:?}",
        finished.status
    );
    wait::until("the recorded pod's RunPod pod terminated", WAIT, || async {
        let entries = ledger_for(simulator, &live_uid).await?;
        Ok((entries.len() == 1
            && entries[0]["id"] == live_id.as_str()
            && !entries[0]["terminated_at"].is_null())
        .then_some(()))
    })
    .await?;
    // 3. A long-running pod: Running and Ready, annotations, logs through the apiserver,
    //    a forged pod id overwritten, anonymous kubelet API refused, deletion terminates.
    let server: Pod = serde_json::from_value(json!({
        "metadata": {"name": "server"},
        "spec": {"containers": [{"name": "main", "image": "e2e/server:1",
            "command": ["python", "-m", "http.server", "8888"],
            "ports": [{"containerPort": 8888}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))?;
    pods.create(&PostParams::default(), &server).await?;
    let running = wait::until("server Running and Ready", WAIT, || async {
        let pod = pods.get("server").await?;
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok((phase(&pod) == Some("Running") && ready).then_some(pod))
    })
    .await?;
    let pod_id = annotation(&running, "runpod.io/pod-id")
        .context("no runpod.io/pod-id")?
        .to_owned();
    for key in [
        "runpod.io/cost-per-hr",
        "runpod.io/gpu-type",
        "runpod.io/datacenter",
        "runpod.io/endpoints",
    ] {
        ensure!(annotation(&running, key).is_some(), "{key} missing");
    }
    let logs = wait::until("kubectl logs", WAIT, || async {
        let text = pods.logs("server", &LogParams::default()).await?;
        Ok(text.contains("serving on 8888").then_some(text))
    })
    .await?;
    ensure!(!logs.contains("s3cr3t"), "logs leak");
    // `kubectl logs -f --tail 1`: a followed stream through the apiserver.
    let stream = pods
        .log_stream(
            "server",
            &LogParams {
                follow: true,
                tail_lines: Some(1),
                ..LogParams::default()
            },
        )
        .await?;
    let mut lines = futures_util::AsyncBufReadExt::lines(stream);
    let first = tokio::time::timeout(WAIT, futures_util::StreamExt::next(&mut lines))
        .await
        .context("no line from the followed log")?
        .context("the followed log ended at once")??;
    ensure!(first.contains("serving on 8888"), "followed log: {first:?}");
    let anonymous = std::process::Command::new("curl")
        .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}"])
        .arg(format!(
            "https://127.0.0.1:{}/containerLogs/{ns}/server/main",
            controller.kubelet_port
        ))
        .output()?;
    ensure!(
        String::from_utf8_lossy(&anonymous.stdout) == "401",
        "anonymous kubelet API: {:?}",
        anonymous
    );
    pods.patch(
        "server",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {"runpod.io/pod-id": "forged-id"}}})),
    )
    .await?;
    wait::until("forged pod id overwritten", WAIT, || async {
        let pod = pods.get("server").await?;
        Ok((annotation(&pod, "runpod.io/pod-id") == Some(pod_id.as_str())).then_some(()))
    })
    .await?;
    // Nothing changes any more, so five reconcile intervals send no write (the apiserver's
    // `lastState: {}` once read as a change, and every reconcile patched the status again).
    const WRITES: &str = "runpod_kubelet_pod_writes_total";
    let settled = support::controller::metric(metrics, WRITES).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = support::controller::metric(metrics, WRITES).await?;
    ensure!(
        settled.is_some() && settled == later,
        "pod writes went from {settled:?} to {later:?} with nothing changed"
    );
    pods.delete("server", &DeleteParams::default()).await?;
    wait::until("server pod removed", WAIT, || async {
        Ok(pods.get_opt("server").await?.is_none().then_some(()))
    })
    .await?;
    let uid = running.metadata.uid.clone().unwrap_or_default();
    let entries = ledger_for(simulator, &uid).await?;
    ensure!(
        entries.len() == 1 && !entries[0]["terminated_at"].is_null(),
        "deleted pod's RunPod pod: {entries:?}"
    );

    // 4. A price cap below the cheapest GPU the node publishes gets an admission warning.
    let nodes: Api<Node> = Api::all(client.clone());
    let published = wait::until("cheapest price on the node", WAIT, || async {
        let node = nodes.get(NODE).await?;
        Ok(node
            .metadata
            .annotations
            .and_then(|a| a.get("runpod.io/cheapest-gpu-price").cloned()))
    })
    .await?;
    ensure!(published.contains("SECURE="), "published {published}");
    let cheap = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "cheap", "annotations": {"runpod.io/max-price": "0.001"}},
        "spec": {"containers": [{"name": "main", "image": "e2e/server:1",
            "command": ["serve"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    });
    let warnings = wait::until("price warning", WAIT, || async {
        let warnings = dry_run_warnings(client, ns, &cheap).await?;
        Ok(warnings
            .iter()
            .any(|w| w.contains("below the cheapest SECURE GPU"))
            .then_some(warnings))
    })
    .await?;
    let fair = {
        let mut pod = cheap.clone();
        pod["metadata"]["annotations"]["runpod.io/max-price"] = json!("1.9");
        pod
    };
    let fair_warnings = dry_run_warnings(client, ns, &fair).await?;
    ensure!(
        !fair_warnings
            .iter()
            .any(|w| w.contains("below the cheapest")),
        "a cap above the market warned: {fair_warnings:?} (and {warnings:?})"
    );

    // Nothing of this cluster bills any more once the Jobs are deleted.
    let all = simulator.ledger().await?;
    let live: Vec<_> = all
        .iter()
        .filter(|e| e["terminated_at"].is_null())
        .collect();
    ensure!(live.is_empty(), "RunPod pods still billing: {live:?}");
    Ok(())
}

/// The admission warnings (`Warning` headers) of a dry-run create of `pod`.
async fn dry_run_warnings(
    client: &kube::Client,
    ns: &str,
    pod: &serde_json::Value,
) -> anyhow::Result<Vec<String>> {
    let request = http::Request::post(format!("/api/v1/namespaces/{ns}/pods?dryRun=All"))
        .header("content-type", "application/json")
        .body(kube::client::Body::from(serde_json::to_vec(pod)?))?;
    let response = client.send(request).await?;
    ensure!(
        response.status().is_success(),
        "dry-run create: {}",
        response.status()
    );
    Ok(response
        .headers()
        .get_all("warning")
        .iter()
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned())
        .collect())
}

async fn node_registers(client: &kube::Client) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = wait::until("virtual node Ready", WAIT, || async {
        let Some(node) = nodes.get_opt(NODE).await? else {
            return Ok(None);
        };
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok(ready.then_some(node))
    })
    .await?;
    let labels = node.metadata.labels.unwrap_or_default();
    ensure!(
        labels
            .get("virtual-kubelet.io/provider")
            .map(String::as_str)
            == Some("runpod"),
        "labels {labels:?}"
    );
    ensure!(
        labels.get("type").map(String::as_str) == Some("virtual-kubelet"),
        "labels {labels:?}"
    );
    let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    ensure!(
        taints
            .iter()
            .any(|t| t.key == "virtual-kubelet.io/provider" && t.effect == "NoSchedule"),
        "taints {taints:?}"
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = wait::until("node Lease", WAIT, || async {
        Ok(leases.get_opt(NODE).await?)
    })
    .await?;
    ensure!(
        lease.spec.and_then(|s| s.lease_duration_seconds) == Some(40),
        "lease duration"
    );
    Ok(())
}

async fn namespace(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    support::pods::namespace(client, name, true).await
}

fn job(name: &str, image: &str, command: &[&str]) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": image, "command": command,
                "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                "ports": [{"containerPort": 8888}, {"containerPort": 22}],
                "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "volumes": [{"name": "config", "configMap": {"name": "train-config"}}]}}}
    }))
    .unwrap()
}

async fn pod_of_job(client: &kube::Client, ns: &str, job: &str) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&kube::api::ListParams::default().labels(&format!("job-name={job}")))
        .await?;
    match list.items.into_iter().next() {
        Some(pod) => Ok(pod),
        None => bail!("no pod of Job {job} yet"),
    }
}
