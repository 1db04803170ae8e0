//! Deleting the virtual node, on the real control plane (PodGC force-deletes the pods of a node
//! missing for its 40 s quarantine, checked every 20 s):
//!
//! 1. `kubectl delete node` with a burst pod running: the controller registers the node again
//!    at once; it becomes Ready, its Lease is owned by the new node's UID, and through PodGC's
//!    quarantine and beyond the pod is kept with its single RunPod pod alive; a new pod still
//!    bursts.
//! 2. The node deleted after `controller drain`'s marker: it stays deleted and `/readyz` answers
//!    503; PodGC then force-deletes the pod bound to it and the controller terminates its RunPod
//!    pod. That is what an operator loses when the node stays away.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::pods::{
    NODE, WAIT, annotation, bound_gpu_pod, ledger_for, ledger_live, namespace, node_condition,
    node_ready, phase, running, uid,
};
use support::wait;

const NS: &str = "node-deletion";
/// A generous bound for the node to come back.
const BACK: Duration = Duration::from_secs(60);
/// PodGC's period (20 s) plus its quarantine (40 s), with a margin: a pod still there after
/// this, with its node back, is kept for good.
const PODGC_WINDOW: Duration = Duration::from_secs(75);

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 300, "ports_ms": 200, "list_lag_ms": 500,
        "images": [{"match": "server", "logs": ["serving"]}]
    })
}

fn main() -> std::process::ExitCode {
    support::harness::main(
        "e2e_controller_node deleting_the_node_reregisters_it",
        &ExtraFlags::default(),
        |cp| Box::pin(run(cp)),
    )
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let metrics = support::webhook::free_port()?.to_string();
    let controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", "e2e-node", "--metrics-listen", &metrics],
    )?;
    let outcome = scenarios(&client, &simulator, &metrics).await;
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
        eprintln!(
            "--- kube-controller-manager log tail ---\n{}",
            control_plane.log_tail("kube-controller-manager", 30)
        );
    }
    outcome
}

async fn scenarios(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    metrics: &str,
) -> anyhow::Result<()> {
    let old = node_ready(client).await?;
    let old_uid = old.metadata.uid.clone().context("node uid")?;
    namespace(client, NS, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("server", "e2e/server:1", "Always"),
    )
    .await?;
    let pod = running(&pods, "server").await?;
    let pod_uid = uid(&pod);
    let id = annotation(&pod, "runpod.io/pod-id").unwrap().to_owned();
    wait::until("/readyz 200", WAIT, || async {
        Ok((readyz(metrics).await?.0 == 200).then_some(()))
    })
    .await?;

    // 1. The node is deleted: it comes back at once, Ready, owning its Lease.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.delete(NODE, &DeleteParams::default()).await?;
    let deleted = Instant::now();
    let new_uid = wait::until(
        "the virtual node registered again and Ready",
        BACK,
        || async {
            let Some(node) = nodes.get_opt(NODE).await? else {
                return Ok(None);
            };
            let new = node.metadata.uid.clone().filter(|u| *u != old_uid);
            let ready = node_condition(&node, "Ready").is_some_and(|(s, _)| s == "True");
            Ok(new.filter(|_| ready))
        },
    )
    .await?;
    println!("node back and Ready after {:?}", deleted.elapsed());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    wait::until("the node Lease owned by the new node", BACK, || async {
        let owner = leases.get_opt(NODE).await?.and_then(|lease| {
            lease
                .metadata
                .owner_references?
                .into_iter()
                .find(|o| o.kind == "Node" && o.name == NODE)
        });
        Ok(owner.filter(|o| o.uid == new_uid).map(|_| ()))
    })
    .await?;
    wait::until("/readyz 200 with the node back", WAIT, || async {
        Ok((readyz(metrics).await?.0 == 200).then_some(()))
    })
    .await?;

    // Through PodGC's quarantine and beyond, the pod and its RunPod pod are kept.
    while deleted.elapsed() < PODGC_WINDOW {
        pod_kept(&pods, &pod_uid, &id, simulator).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    pod_kept(&pods, &pod_uid, &id, simulator).await?;
    let entries = ledger_for(simulator, &pod_uid).await?;
    ensure!(
        entries.len() == 1,
        "RunPod pods for the kept pod: {entries:?}"
    );
    // The create gate is open again: a new pod bursts.
    pods.create(
        &PostParams::default(),
        &bound_gpu_pod("after", "e2e/server:1", "Always"),
    )
    .await?;
    running(&pods, "after").await?;

    // 2. Deleted after drain's marker: it stays deleted, /readyz says so, PodGC takes the pod.
    let token = "e2e-token";
    let marker = json!({"metadata": {"annotations": {"runpod.io/draining": token}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&marker))
        .await?;
    wait::until("drain acknowledged", WAIT, || async {
        let node = nodes.get(NODE).await?;
        let ack = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("runpod.io/drain-acknowledged"))
            .cloned();
        Ok((ack.as_deref() == Some(token)).then_some(()))
    })
    .await?;
    let after = pods.get("after").await?;
    let after_id = annotation(&after, "runpod.io/pod-id").unwrap().to_owned();
    nodes.delete(NODE, &DeleteParams::default()).await?;
    let deleted = Instant::now();
    let body = wait::until("/readyz 503 with the node gone", WAIT, || async {
        let (code, body) = readyz(metrics).await?;
        Ok((code == 503).then_some(body))
    })
    .await?;
    ensure!(
        body.contains("virtual node exists: false"),
        "/readyz body {body:?}"
    );
    wait::until(
        "PodGC deletes the pods of the missing node",
        WAIT,
        || async {
            ensure!(
                nodes.get_opt(NODE).await?.is_none(),
                "the drained node was registered again"
            );
            Ok(pods.get_opt("after").await?.is_none().then_some(()))
        },
    )
    .await?;
    println!(
        "PodGC deleted the pods {:?} after the node",
        deleted.elapsed()
    );
    wait::until(
        "the controller terminates the RunPod pods",
        WAIT,
        || async {
            Ok(
                (!ledger_live(simulator, &after_id).await? && !ledger_live(simulator, &id).await?)
                    .then_some(()),
            )
        },
    )
    .await?;
    ensure!(
        nodes.get_opt(NODE).await?.is_none(),
        "the drained node was registered again"
    );
    Ok(())
}

/// The pod still exists, not being deleted, Running, naming the same RunPod pod, which is live.
async fn pod_kept(
    pods: &Api<Pod>,
    pod_uid: &str,
    id: &str,
    simulator: &SimulatorProcess,
) -> anyhow::Result<()> {
    let Some(pod) = pods.get_opt("server").await? else {
        bail!("the running pod was deleted");
    };
    ensure!(pod.metadata.uid.as_deref() == Some(pod_uid), "pod replaced");
    ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "the running pod is being deleted"
    );
    ensure!(
        phase(&pod) == Some("Running"),
        "the pod is {:?}",
        phase(&pod)
    );
    ensure!(
        annotation(&pod, "runpod.io/pod-id") == Some(id),
        "the pod names another RunPod pod"
    );
    ensure!(
        ledger_live(simulator, id).await?,
        "the RunPod pod was terminated"
    );
    Ok(())
}

async fn readyz(metrics: &str) -> anyhow::Result<(u16, String)> {
    let response = reqwest::get(format!("http://{metrics}/readyz")).await?;
    Ok((response.status().as_u16(), response.text().await?))
}
