//! End-to-end tests of the defects an independent review found in the controller, on the real
//! control plane with the webhook, the controller and the RunPod simulator as processes:
//! opt-in enforced where money is spent (a pod bound by `nodeName` from a namespace that never
//! opted in), pods RunPod cannot run failed at once, `podIP` left empty so a Service never
//! routes to a RunPod host, readiness gates and others' conditions kept, lists that omit a
//! running pod for 30 s (nothing fails), a log endpoint that refuses (the pod still finishes,
//! its RunPod pod terminated) and a create answered 500 while the list lags 12 s (one RunPod pod).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{
    WAIT, annotation, bound_gpu_pod, container_state, event, ledger_for, live, namespace,
    node_ready, phase, reason, running, uid,
};
use support::wait;

/// RunPod's list hides new pods this long (longer than the client's lookups after a failed
/// create last).
const LIST_LAG_MS: u64 = 12_000;

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 500, "ports_ms": 300, "list_lag_ms": LIST_LAG_MS,
        "rate_limits": [{"name": "minute", "quota": 100000, "window_secs": 60}],
        "images": [
            {"match": "server", "logs": ["serving"]},
            {"match": "trainer", "outcome": "EXITED", "after_ms": 2000, "logs": ["done"],
             "exit_code": 0},
            // What the completion wrapper prints when the postStart hook failed (the wrapper
            // itself is run under real shells in its unit tests).
            {"match": "hookfails", "outcome": "EXITED", "after_ms": 2000,
             "logs": ["starting", "runpod-kubelet: post-start-hook-failed=3"], "exit_code": 143}
        ]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_controller_review", &ExtraFlags::default(), |cp| {
        Box::pin(run(cp))
    })
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let mut controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &[
            "--cluster-id",
            "e2e-review",
            "--create-settle",
            "20s",
            "--reconcile-interval",
            "2s",
        ],
    )?;
    let outcome = scenarios(&client, &simulator).await;
    if outcome.is_err() {
        eprintln!(
            "--- controller log tail (alive: {}) ---\n{}",
            controller.alive(),
            controller.log_tail(80)
        );
    }
    outcome
}

async fn scenarios(client: &kube::Client, simulator: &SimulatorProcess) -> anyhow::Result<()> {
    node_ready(client).await?;
    not_opted_in(client, simulator)
        .await
        .context("opt-in enforced by the controller")?;
    cannot_run_fails_fast(client, simulator)
        .await
        .context("a pod RunPod cannot run")?;
    post_start_hook(client, simulator)
        .await
        .context("a postStart hook that fails")?;
    let server = service_and_readiness(client)
        .await
        .context("podIP, Service endpoints, readiness gates")?;
    lists_omit_a_running_pod(client, simulator, &server)
        .await
        .context("lists omitting a running pod")?;
    unreadable_log(client, simulator)
        .await
        .context("a log endpoint that refuses")?;
    ambiguous_create_under_list_lag(client, simulator)
        .await
        .context("500 after create under list lag")?;
    Ok(())
}

/// Waits until the simulator answered `more` further lists: the controller has acted on the
/// simulator's current state by then.
async fn lists_pass(simulator: &SimulatorProcess, more: usize) -> anyhow::Result<()> {
    let start = simulator.successful_lists().await?;
    wait::until("further lists", WAIT, || async {
        Ok((simulator.successful_lists().await? >= start + more).then_some(()))
    })
    .await
}

/// Item 6: a GPU pod bound by `nodeName` from a namespace that never opted in, and one in
/// kube-system that opts itself in, get nothing created: an Event and a status say why.
async fn not_opted_in(client: &kube::Client, simulator: &SimulatorProcess) -> anyhow::Result<()> {
    let ns = "review-closed";
    namespace(client, ns, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut stray = bound_gpu_pod("stray", "e2e/server:1", "Always");
    stray.metadata.labels = None;
    pods.create(&PostParams::default(), &stray).await?;
    let message = event(client, ns, "stray", "NotOptedIn").await?;
    ensure!(
        message.contains("runpod.io/burst=enabled"),
        "the Event says how to opt in: {message}"
    );
    let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    system
        .create(
            &PostParams::default(),
            &bound_gpu_pod("system-stray", "e2e/server:1", "Always"),
        )
        .await?;
    event(client, "kube-system", "system-stray", "NotOptedIn").await?;
    lists_pass(simulator, 3).await?;
    for (api, name) in [(&pods, "stray"), (&system, "system-stray")] {
        let pod = api.get(name).await?;
        ensure!(
            ledger_for(simulator, &uid(&pod)).await?.is_empty(),
            "{name} got a RunPod pod"
        );
        let waiting = container_state(&pod)
            .and_then(|s| s.waiting.as_ref())
            .and_then(|w| w.reason.clone());
        ensure!(
            phase(&pod) == Some("Pending") && waiting.as_deref() == Some("NotOptedIn"),
            "{name} should stay Pending saying why (no churn): {:?}",
            pod.status
        );
    }
    Ok(())
}

/// Item 9: a bare pod with an init container bound to the node fails at once, naming what
/// RunPod cannot do, and gets no RunPod pod.
async fn cannot_run_fails_fast(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let ns = "review-open";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut init = bound_gpu_pod("with-init", "e2e/server:1", "Never");
    init.spec.as_mut().unwrap().init_containers = Some(vec![serde_json::from_value(
        json!({"name": "prep", "image": "busybox"}),
    )?]);
    pods.create(&PostParams::default(), &init).await?;
    let failed = wait::until("the init-container pod failed", WAIT, || async {
        let pod = pods.get("with-init").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    ensure!(
        reason(&failed) == Some("CannotRunOnRunPod"),
        "reason: {:?}",
        failed.status
    );
    let message = failed
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    ensure!(message.contains("init containers"), "message: {message}");
    ensure!(ledger_for(simulator, &uid(&failed)).await?.is_empty());
    // Honest status (issue 45): the init container has a status too, with the reason, and
    // `kubectl logs` of either container says it will never start (not "waiting to start").
    let init_reason = failed
        .status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|l| l.iter().find(|c| c.name == "prep"))
        .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
    ensure!(
        init_reason.as_deref() == Some("CannotRunOnRunPod"),
        "initContainerStatuses: {:?}",
        failed.status
    );
    for container in ["prep", "main"] {
        let params = kube::api::LogParams {
            container: Some(container.to_owned()),
            ..Default::default()
        };
        let said = match pods.logs("with-init", &params).await {
            Ok(text) => text,
            Err(error) => error.to_string(),
        };
        ensure!(
            said.contains("will never start") && said.contains("CannotRunOnRunPod"),
            "kubectl logs -c {container}: {said}"
        );
    }
    Ok(())
}

/// Issue 45: a postStart `exec` hook goes to RunPod inside the wrapper's script; one that
/// failed stops the pod with its Event, and the wrapper's line stays out of `kubectl logs`.
async fn post_start_hook(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let ns = "review-open";
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut hooked = bound_gpu_pod("hooked", "e2e/hookfails:1", "Never");
    hooked.spec.as_mut().unwrap().containers[0].lifecycle = Some(serde_json::from_value(
        json!({"postStart": {"exec": {"command": ["sh", "-c", "touch /tmp/ready"]}}}),
    )?);
    pods.create(&PostParams::default(), &hooked).await?;
    let failed = wait::until("the hooked pod ended", WAIT, || async {
        let pod = pods.get("hooked").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    let message = event(client, ns, "hooked", "FailedPostStartHook").await?;
    ensure!(message.contains("exited with 3"), "Event: {message}");
    let code = container_state(&failed)
        .and_then(|s| s.terminated.as_ref())
        .map(|t| t.exit_code);
    ensure!(code == Some(143), "exit code {code:?}: {:?}", failed.status);
    let entries = ledger_for(simulator, &uid(&failed)).await?;
    let args = entries
        .first()
        .and_then(|entry| entry["args"].as_str())
        .unwrap_or_default()
        .to_owned();
    ensure!(
        args.contains("post_start=") && args.contains("touch /tmp/ready"),
        "the hook is not in the create's args: {args}"
    );
    let logs = pods.logs("hooked", &Default::default()).await?;
    ensure!(
        logs.contains("starting") && !logs.contains("post-start-hook-failed"),
        "kubectl logs: {logs:?}"
    );
    Ok(())
}

/// Item 8 and 12: a Ready burst pod has no `podIP`, so a Service selecting it gets no endpoint
/// address; Ready waits for the pod's readiness gate, and the gate's condition, written by
/// another controller, survives the controller's status writes.
async fn service_and_readiness(client: &kube::Client) -> anyhow::Result<Pod> {
    let ns = "review-open";
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut server = bound_gpu_pod("web", "e2e/server:1", "Always");
    server
        .metadata
        .labels
        .get_or_insert_default()
        .insert("app".into(), "web".into());
    server.spec.as_mut().unwrap().readiness_gates = Some(vec![serde_json::from_value(
        json!({"conditionType": "example.com/lb"}),
    )?]);
    pods.create(&PostParams::default(), &server).await?;
    Api::<Service>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 8888}]}
            }))?,
        )
        .await?;
    let condition = |pod: &Pod, kind: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == kind))
            .map(|c| c.status.clone())
    };
    // Containers ready, the gate not yet: not Ready.
    let gated = wait::until("containers ready", WAIT, || async {
        let pod = pods.get("web").await?;
        Ok((condition(&pod, "ContainersReady").as_deref() == Some("True")).then_some(pod))
    })
    .await?;
    ensure!(
        condition(&gated, "Ready").as_deref() == Some("False"),
        "Ready ignores the readiness gate: {:?}",
        gated.status
    );
    ensure!(
        phase(&gated) == Some("Running")
            && gated
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.as_ref())
                .is_none(),
        "podIP is a RunPod host address: {:?}",
        gated.status
    );
    // Another controller sets the gate's condition.
    pods.patch_status(
        "web",
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"conditions": [
            {"type": "example.com/lb", "status": "True"}]}})),
    )
    .await?;
    let ready = wait::until("Ready with the gate", WAIT, || async {
        let pod = pods.get("web").await?;
        Ok((condition(&pod, "Ready").as_deref() == Some("True")).then_some(pod))
    })
    .await?;
    // Several reconciles later the foreign condition is still there, and no status write
    // happened in between (the controller does not fight over it).
    let version = ready.metadata.resource_version.clone();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let later = pods.get("web").await?;
    ensure!(
        condition(&later, "example.com/lb").as_deref() == Some("True"),
        "the gate's condition was erased: {:?}",
        later.status
    );
    ensure!(
        later.metadata.resource_version == version,
        "a settled pod was written again: {:?}",
        later.status
    );
    ensure!(
        later
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_ref())
            .is_none()
    );
    // The Service has no address for it (the endpoints controller has had time: the pod has
    // been Ready for seconds).
    let endpoints = Api::<Endpoints>::namespaced(client.clone(), ns)
        .get_opt("web")
        .await?;
    let addresses: Vec<String> = endpoints
        .iter()
        .flat_map(|e| e.subsets.iter().flatten())
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .map(|a| a.ip.clone())
        .collect();
    ensure!(
        addresses.is_empty(),
        "a Service routes cluster traffic to a RunPod host: {addresses:?}"
    );
    Ok(later)
}

/// Item 4: lists omit every pod for 30 s while the pods run; only a GET by id could say one
/// is gone, and it is there: nothing fails, nothing is terminated.
async fn lists_omit_a_running_pod(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    server: &Pod,
) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "review-open");
    let id = annotation(server, "runpod.io/pod-id")
        .context("no pod id")?
        .to_owned();
    let gets_before = get_pods(simulator, &id).await?;
    simulator
        .inject(&json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}}))
        .await?;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let pod = pods.get("web").await?;
        ensure!(
            phase(&pod) == Some("Running"),
            "the pod left Running while the lists omitted it: {:?}",
            pod.status
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    simulator.clear_faults().await?;
    lists_pass(simulator, 2).await?;
    let pod = pods.get("web").await?;
    ensure!(phase(&pod) == Some("Running"), "{:?}", pod.status);
    let entries = ledger_for(simulator, &uid(&pod)).await?;
    ensure!(
        entries.len() == 1 && live(&entries[0]),
        "its RunPod pod: {entries:?}"
    );
    ensure!(
        get_pods(simulator, &id).await? > gets_before,
        "the controller never asked for the omitted pod by id"
    );
    Ok(())
}

async fn get_pods(simulator: &SimulatorProcess, id: &str) -> anyhow::Result<usize> {
    Ok(simulator
        .exchanges()
        .await?
        .iter()
        .filter(|e| {
            e["operation"] == "getPod" && e["path"].as_str().is_some_and(|p| p.ends_with(id))
        })
        .count())
}

/// Item 2: the log endpoint answers 403 when the finished container's exit code is read: the
/// pod still finishes (exit code unknown, 137, never 0 on a failed pod) and its RunPod pod is
/// terminated, instead of every reconcile failing forever.
async fn unreadable_log(client: &kube::Client, simulator: &SimulatorProcess) -> anyhow::Result<()> {
    simulator
        .inject(&json!({"when": {"operation": "getPodLogs"},
            "effect": {"kind": "status", "status": 403, "detail": "forbidden"}}))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "review-open");
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("train", "e2e/trainer:1", "Never"),
    )
    .await?;
    let ended = wait::until("the trainer ended", WAIT, || async {
        let pod = pods.get("train").await?;
        Ok(matches!(phase(&pod), Some("Failed" | "Succeeded")).then_some(pod))
    })
    .await?;
    simulator.clear_faults().await?;
    let terminated = container_state(&ended)
        .and_then(|s| s.terminated.clone())
        .context("no terminated state")?;
    ensure!(
        phase(&ended) == Some("Failed")
            && terminated.reason.as_deref() == Some("ContainerStatusUnknown")
            && terminated.exit_code == 137,
        "ended as {terminated:?} in {:?}",
        phase(&ended)
    );
    let entries = wait::until("its RunPod pod terminated", WAIT, || async {
        let entries = ledger_for(simulator, &uid(&ended)).await?;
        Ok((!entries.is_empty() && entries.iter().all(|e| !live(e))).then_some(entries))
    })
    .await?;
    ensure!(entries.len() == 1, "{entries:?}");
    Ok(())
}

/// Item 3: the create answers 500 after really creating, and the list hides the new pod for
/// 12 s (longer than the client's lookups): no second create is sent before a settled list.
async fn ambiguous_create_under_list_lag(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    simulator
        .inject(&json!({"when": {"operation": "createPod"},
            "effect": {"kind": "create_then_fail", "status": 500}, "times": 1}))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "review-open");
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("lagged", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = running(&pods, "lagged").await?;
    // Long enough for a settled list and any second create to show.
    tokio::time::sleep(Duration::from_millis(LIST_LAG_MS + 4_000)).await;
    let entries = ledger_for(simulator, &uid(&pod)).await?;
    ensure!(
        entries.len() == 1,
        "one Kubernetes pod, {} RunPod pods: {entries:?}",
        entries.len()
    );
    Ok(())
}
