//! End-to-end tests of the controller under RunPod's misbehaviour, on the real control plane
//! with the webhook, the controller and the RunPod simulator as processes: a pod placed outside
//! the allowed datacenters, stock-outs, a pod deleted while provisioning, garbage collection that
//! spares others' pods, a forged pod id naming another RunPod pod, and a refused account.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use anyhow::{Context, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{
    NODE, WAIT, annotation, bound_gpu_pod, event, gone, gpu_pod, has_taint, ledger_for,
    ledger_live, live, namespace, node_condition, node_ready, phase, reason, running, uid,
};
use support::wait;
use support::webhook::WebhookProcess;

const CLUSTER: &str = "e2e-faults";
const ALLOWED: [&str; 2] = ["EU-RO-1", "US-TX-3"];

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 2000, "starting_ms": 500, "ports_ms": 300, "list_lag_ms": 500,
        "rate_limits": [{"name": "minute", "quota": 100000, "window_secs": 60}],
        "images": [{"match": "server", "logs": ["serving"]}]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main("e2e_controller_faults", &ExtraFlags::default(), |cp| {
        Box::pin(run(cp))
    })
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
    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", CLUSTER, "--provision-timeout", "40s"],
    )?;
    let outcome = scenarios(&client, &simulator).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
    }
    outcome
}

async fn scenarios(client: &kube::Client, simulator: &SimulatorProcess) -> anyhow::Result<()> {
    node_ready(client).await?;
    let cheapest = misplaced_pod_is_replaced(client, simulator)
        .await
        .context("misplace")?;
    no_capacity_on_the_cheapest_gpu(client, simulator, &cheapest)
        .await
        .context("capacity on the cheapest GPU")?;
    deleted_while_provisioning(client, simulator)
        .await
        .context("deleted while provisioning")?;
    gc_spares_other_pods(simulator)
        .await
        .context("garbage collection")?;
    let running = forged_pod_id_names_another_pod(client, simulator)
        .await
        .context("forged pod id")?;
    empty_list_is_not_a_disappearance(client, simulator, &running)
        .await
        .context("empty list")?;
    refused_account_marks_the_node(client, simulator, &running)
        .await
        .context("401/402")?;
    // Last: it cools every GPU type down in this controller for minutes.
    no_capacity_anywhere(client, simulator)
        .await
        .context("no capacity anywhere")?;
    Ok(())
}

/// RunPod places the pod outside the allowed datacenters (`dataCenterIds` is a preference):
/// the controller terminates it at once with an Event, and the next try lands inside.
/// Returns the GPU type the first try used (the cheapest candidate).
async fn misplaced_pod_is_replaced(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<String> {
    let ns = "faults-misplace";
    namespace(client, ns, true).await?;
    simulator
        .inject(&json!({"when": {"operation": "createPod"}, "effect": {"kind": "misplace"}, "times": 1}))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &gpu_pod("misplaced", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = running(&pods, "misplaced").await?;
    let message = event(client, ns, "misplaced", "PlacementRejected").await?;
    let entries = ledger_for(simulator, &uid(&pod)).await?;
    ensure!(entries.len() == 2, "expected two RunPod pods: {entries:?}");
    let (first, second) = (&entries[0], &entries[1]);
    let first_dc = first["data_center_id"].as_str().unwrap_or_default();
    ensure!(
        !ALLOWED.contains(&first_dc),
        "the first pod was not misplaced: {first}"
    );
    ensure!(
        message.contains(first["id"].as_str().unwrap_or("?")),
        "Event {message:?}"
    );
    ensure!(!live(first), "the misplaced RunPod pod still bills");
    let second_dc = second["data_center_id"].as_str().unwrap_or_default();
    ensure!(
        ALLOWED.contains(&second_dc) && live(second),
        "the second try: {second}"
    );
    ensure!(
        annotation(&pod, "runpod.io/pod-id") == second["id"].as_str(),
        "pod id annotation"
    );
    ensure!(
        annotation(&pod, "runpod.io/datacenter") == Some(second_dc),
        "datacenter annotation"
    );
    pods.delete("misplaced", &DeleteParams::default()).await?;
    gone(&pods, "misplaced").await?;
    ensure!(
        !ledger_live(simulator, second["id"].as_str().unwrap_or_default()).await?,
        "deleted pod's RunPod pod still bills"
    );
    Ok(first["gpu_id"].as_str().context("no GPU")?.to_owned())
}

/// The cheapest GPU type has no capacity anywhere: the next candidate is used, once.
async fn no_capacity_on_the_cheapest_gpu(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    cheapest: &str,
) -> anyhow::Result<()> {
    let ns = "faults-capacity";
    namespace(client, ns, true).await?;
    simulator
        .inject(&json!({"when": {"gpu_id": cheapest}, "effect": {"kind": "capacity"}}))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &gpu_pod("fallback", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = running(&pods, "fallback").await?;
    simulator.clear_faults().await?;
    let entries = ledger_for(simulator, &uid(&pod)).await?;
    ensure!(entries.len() == 1, "expected one RunPod pod: {entries:?}");
    let gpu = entries[0]["gpu_id"].as_str().unwrap_or_default();
    ensure!(gpu != cheapest, "placed on {gpu}, which has no capacity");
    ensure!(
        ALLOWED.contains(&entries[0]["data_center_id"].as_str().unwrap_or_default()),
        "placed outside: {}",
        entries[0]
    );
    let retries = event(client, ns, "fallback", "CapacityRetries").await?;
    ensure!(retries.contains(cheapest), "CapacityRetries: {retries}");
    pods.delete("fallback", &DeleteParams::default()).await?;
    gone(&pods, "fallback").await?;
    Ok(())
}

/// A pod deleted while its create is still in flight, and one deleted while its RunPod pod is
/// still provisioning: exactly one RunPod pod ever existed for each, and it is terminated.
async fn deleted_while_provisioning(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let ns = "faults-doomed";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // 1. The create answers slowly; the pod is deleted meanwhile.
    simulator
        .inject(&json!({"when": {"operation": "createPod"}, "effect": {"kind": "delay", "millis": 4000}, "times": 1}))
        .await?;
    pods.create(
        &PostParams::default(),
        &gpu_pod("in-flight", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = wait::until("create requested", WAIT, || async {
        let pod = pods.get("in-flight").await?;
        Ok(annotation(&pod, "runpod.io/create-requested")
            .is_some()
            .then_some(pod))
    })
    .await?;
    pods.delete("in-flight", &DeleteParams::default()).await?;
    gone(&pods, "in-flight").await?;
    one_terminated(simulator, &uid(&pod), "in-flight").await?;

    // 2. The RunPod pod exists but is still PROVISIONING (2 s in this scenario).
    pods.create(
        &PostParams::default(),
        &gpu_pod("provisioning", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = wait::until("RunPod pod id known", WAIT, || async {
        let pod = pods.get("provisioning").await?;
        Ok(annotation(&pod, "runpod.io/pod-id")
            .is_some()
            .then_some(pod))
    })
    .await?;
    ensure!(
        phase(&pod) == Some("Pending"),
        "already {:?}: the scenario is too fast",
        phase(&pod)
    );
    pods.delete("provisioning", &DeleteParams::default())
        .await?;
    gone(&pods, "provisioning").await?;
    one_terminated(simulator, &uid(&pod), "provisioning").await
}

/// Exactly one RunPod pod was ever created for the UID, and it ends terminated; a few more list
/// cycles create nothing more.
async fn one_terminated(simulator: &SimulatorProcess, uid: &str, what: &str) -> anyhow::Result<()> {
    wait::until(
        &format!("{what}: its RunPod pod terminated"),
        WAIT,
        || async {
            let entries = ledger_for(simulator, uid).await?;
            Ok((!entries.is_empty() && entries.iter().all(|e| !live(e))).then_some(()))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let entries = ledger_for(simulator, uid).await?;
    ensure!(
        entries.len() == 1 && !live(&entries[0]),
        "{what}: RunPod pods for the deleted pod: {entries:?}"
    );
    Ok(())
}

/// Untagged RunPod pods and pods of another cluster in the same account are never collected;
/// an orphan of this cluster is (the proof that collection ran meanwhile).
async fn gc_spares_other_pods(simulator: &SimulatorProcess) -> anyhow::Result<()> {
    let body = |name: &str, env: serde_json::Value| {
        json!({"name": name, "image": "e2e/server:1",
               "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}, "env": env})
    };
    let untagged = simulator
        .create_pod(&body("someone-elses", json!({"FOO": "bar"})))
        .await?;
    let other_cluster = simulator
        .create_pod(&body(
            "other-cluster",
            json!({"RUNPOD_KUBELET_CLUSTER": "another-cluster", "RUNPOD_KUBELET_NODE": NODE,
                   "RUNPOD_KUBELET_POD_UID": "0000-gone"}),
        ))
        .await?;
    let orphan = simulator
        .create_pod(&body(
            "our-orphan",
            json!({"RUNPOD_KUBELET_CLUSTER": CLUSTER, "RUNPOD_KUBELET_NODE": NODE,
                   "RUNPOD_KUBELET_POD_UID": "0000-gone"}),
        ))
        .await?;
    let id = |pod: &serde_json::Value| pod["id"].as_str().unwrap_or_default().to_owned();
    let orphan_id = id(&orphan);
    wait::until("our orphan collected", WAIT, || async {
        Ok((!ledger_live(simulator, &orphan_id).await?).then_some(()))
    })
    .await?;
    // Some more lists and collections.
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(
        ledger_live(simulator, &id(&untagged)).await?,
        "an untagged RunPod pod was terminated"
    );
    ensure!(
        ledger_live(simulator, &id(&other_cluster)).await?,
        "another cluster's RunPod pod was terminated"
    );
    Ok(())
}

/// A `runpod.io/pod-id` naming another pod's RunPod pod, by a later annotate and on a pod
/// created with it: overwritten, and the other RunPod pod lives on. Returns the running pods.
async fn forged_pod_id_names_another_pod(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<Vec<(String, String, String)>> {
    let ns = "faults-forged";
    namespace(client, ns, true).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in ["alpha", "beta"] {
        pods.create(
            &PostParams::default(),
            &gpu_pod(name, "e2e/server:1", "Always"),
        )
        .await?;
    }
    let alpha = running(&pods, "alpha").await?;
    let beta = running(&pods, "beta").await?;
    let alpha_id = annotation(&alpha, "runpod.io/pod-id").unwrap().to_owned();
    let beta_id = annotation(&beta, "runpod.io/pod-id").unwrap().to_owned();
    ensure!(alpha_id != beta_id, "one RunPod pod for two pods");

    pods.patch(
        "beta",
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {"runpod.io/pod-id": alpha_id}}})),
    )
    .await?;
    wait::until("beta's pod id restored", WAIT, || async {
        let pod = pods.get("beta").await?;
        Ok((annotation(&pod, "runpod.io/pod-id") == Some(beta_id.as_str())).then_some(()))
    })
    .await?;

    // Created with the forged id (bound directly: the webhook would strip it).
    let mut gamma = bound_gpu_pod("gamma", "e2e/server:1", "Always");
    gamma.metadata.annotations = Some([("runpod.io/pod-id".to_owned(), alpha_id.clone())].into());
    pods.create(&PostParams::default(), &gamma).await?;
    let gamma = wait::until("gamma on its own RunPod pod", WAIT, || async {
        let pod = pods.get("gamma").await?;
        let own = annotation(&pod, "runpod.io/pod-id").is_some_and(|id| id != alpha_id);
        Ok((own && phase(&pod) == Some("Running")).then_some(pod))
    })
    .await?;
    let gamma_id = annotation(&gamma, "runpod.io/pod-id").unwrap().to_owned();

    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        ledger_live(simulator, &alpha_id).await?,
        "alpha's RunPod pod was terminated through a forged id"
    );
    for (pod, id) in [(&alpha, &alpha_id), (&beta, &beta_id), (&gamma, &gamma_id)] {
        let entries = ledger_for(simulator, &uid(pod)).await?;
        ensure!(
            entries.len() == 1 && entries[0]["id"] == id.as_str() && live(&entries[0]),
            "RunPod pods of {:?}: {entries:?}",
            pod.metadata.name
        );
    }
    let alpha_now = pods.get("alpha").await?;
    ensure!(
        annotation(&alpha_now, "runpod.io/pod-id") == Some(alpha_id.as_str())
            && phase(&alpha_now) == Some("Running"),
        "alpha disturbed"
    );
    Ok(vec![
        (ns.to_owned(), "alpha".to_owned(), alpha_id),
        (ns.to_owned(), "beta".to_owned(), beta_id),
        (ns.to_owned(), "gamma".to_owned(), gamma_id),
    ])
}

/// RunPod answering 402 (no funds), then 401 (key revoked): the node says so (condition with
/// the reason, NoSchedule taint) and recovers when RunPod does; running pods are untouched.
/// A list that comes back empty once (a glitch) while the pods still run: nothing is failed,
/// created or terminated because of it.
async fn empty_list_is_not_a_disappearance(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    running_pods: &[(String, String, String)],
) -> anyhow::Result<()> {
    let before = simulator.successful_lists().await?;
    simulator
        .inject(&json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 1}))
        .await?;
    // The empty answer, then a few real lists after it.
    wait::until("lists after the empty one", WAIT, || async {
        Ok((simulator.successful_lists().await? >= before + 5).then_some(()))
    })
    .await?;
    for (ns, name, id) in running_pods {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = pods.get(name).await?;
        ensure!(
            phase(&pod) == Some("Running")
                && annotation(&pod, "runpod.io/pod-id") == Some(id.as_str()),
            "{name} disturbed by one empty list: {:?}",
            pod.status
        );
        let entries = ledger_for(simulator, &uid(&pod)).await?;
        ensure!(
            entries.len() == 1 && ledger_live(simulator, id).await?,
            "{name} after one empty list: {entries:?}"
        );
    }
    Ok(())
}

async fn refused_account_marks_the_node(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    running_pods: &[(String, String, String)],
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for status in [402, 401] {
        simulator
            .inject(&json!({"effect": {"kind": "status", "status": status}}))
            .await?;
        wait::until(&format!("node marked after {status}"), WAIT, || async {
            let node = nodes.get(NODE).await?;
            let condition = node_condition(&node, "RunPodAPIAvailable");
            let marked = condition
                .as_ref()
                .is_some_and(|(s, r)| s == "False" && r == "AccountRefused")
                && has_taint(&node, "runpod.io/api-unavailable", "NoSchedule");
            Ok(marked.then_some(()))
        })
        .await?;
        // A few more lists while refused.
        tokio::time::sleep(Duration::from_secs(3)).await;
        simulator.clear_faults().await?;
        wait::until(&format!("node recovered after {status}"), WAIT, || async {
            let node = nodes.get(NODE).await?;
            let condition = node_condition(&node, "RunPodAPIAvailable");
            let ok = condition.as_ref().is_some_and(|(s, _)| s == "True")
                && !has_taint(&node, "runpod.io/api-unavailable", "NoSchedule")
                && node_condition(&node, "Ready").is_some_and(|(s, _)| s == "True");
            Ok(ok.then_some(()))
        })
        .await?;
    }
    for (ns, name, id) in running_pods {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = pods.get(name).await?;
        ensure!(
            phase(&pod) == Some("Running")
                && pod.metadata.deletion_timestamp.is_none()
                && annotation(&pod, "runpod.io/pod-id") == Some(id.as_str()),
            "{name} disturbed by the refused account: {:?}",
            pod.status
        );
        ensure!(
            ledger_live(simulator, id).await?,
            "{name}'s RunPod pod was terminated"
        );
        let entries = ledger_for(simulator, &uid(&pod)).await?;
        ensure!(entries.len() == 1, "{name} created again: {entries:?}");
    }
    for (ns, name, _) in running_pods {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        pods.delete(name, &DeleteParams::default()).await?;
    }
    for (ns, name, id) in running_pods {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        gone(&pods, name).await?;
        ensure!(!ledger_live(simulator, id).await?, "{name} still bills");
    }
    Ok(())
}

/// No capacity anywhere: Event NoGpuCapacity, retries, then the pod fails with
/// ProvisioningTimeout (40 s here) and nothing is left running.
async fn no_capacity_anywhere(
    client: &kube::Client,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let ns = "faults-starved";
    namespace(client, ns, true).await?;
    simulator
        .inject(&json!({"effect": {"kind": "capacity"}}))
        .await?;
    let creates_before = capacity_refusals(simulator).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &gpu_pod("starved", "e2e/server:1", "Always"),
    )
    .await?;
    let message = event(client, ns, "starved", "NoGpuCapacity").await?;
    let failed = wait::until("starved pod Failed", WAIT, || async {
        let pod = pods.get("starved").await?;
        Ok((phase(&pod) == Some("Failed")).then_some(pod))
    })
    .await?;
    ensure!(
        reason(&failed) == Some("ProvisioningTimeout"),
        "failed with {:?}",
        failed.status
    );
    event(client, ns, "starved", "ProvisioningTimeout").await?;
    let refusals = capacity_refusals(simulator).await? - creates_before;
    ensure!(
        refusals >= 2,
        "expected the candidates to be tried one after another, saw {refusals} refusals ({message})"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let entries = ledger_for(simulator, &uid(&failed)).await?;
    ensure!(
        entries.is_empty(),
        "RunPod pods for the starved pod: {entries:?}"
    );
    simulator.clear_faults().await?;

    // Nothing of this cluster bills any more.
    let left: Vec<_> = simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_CLUSTER"] == CLUSTER && live(e))
        .collect();
    ensure!(left.is_empty(), "RunPod pods still billing: {left:?}");
    Ok(())
}

/// createPod calls RunPod refused for capacity so far.
async fn capacity_refusals(simulator: &SimulatorProcess) -> anyhow::Result<usize> {
    Ok(simulator
        .exchanges()
        .await?
        .iter()
        .filter(|e| e["operation"] == "createPod" && e["status"] == 400)
        .count())
}
