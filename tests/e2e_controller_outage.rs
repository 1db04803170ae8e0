//! Outages with running pods, on a control plane that evicts quickly
//! (`--default-not-ready-toleration-seconds=30 --default-unreachable-toleration-seconds=30`,
//! `--node-monitor-grace-period=20s`):
//!
//! 1. RunPod's API down (503 on everything) for over a minute;
//! 2. then the controller killed for over 90 s: the node goes Unknown and is tainted
//!    unreachable:NoExecute.
//!
//! No burst pod is evicted, failed or deleted, the same RunPod pods run afterwards and nothing
//! is created again. A second node stays healthy all along (Ready, Lease renewed by the test):
//! were every node of the zone unhealthy, the node lifecycle controller would assume a network
//! partition and evict nothing, and the test would pass for the wrong reason. The proof that
//! evictions really happen: a pod bound to the virtual node with the default 30 s tolerations
//! (a CPU pod, which the controller does not run and so does not lengthen) is evicted in the
//! same run. When the controller returns, the node and the burst pods are Ready again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use support::control_plane::{ControlPlane, ExtraFlags};
use support::controller::{ControllerProcess, SimulatorProcess};
use support::nodes::FakeNode;
use support::pods::{
    NODE, WAIT, annotation, bound_gpu_pod, event, has_taint, ledger_for, ledger_live, namespace,
    node_condition, node_ready, phase, provider_toleration, ready, running, uid,
};
use support::wait;

const CLUSTER: &str = "e2e-outage";
const NS: &str = "outage";
const BURST: [&str; 3] = ["burst-a", "burst-b", "burst-c"];
const API_OUTAGE: Duration = Duration::from_secs(65);
const CONTROLLER_OUTAGE: Duration = Duration::from_secs(95);

fn scenario() -> serde_json::Value {
    json!({
        "provisioning_ms": 500, "starting_ms": 300, "ports_ms": 200, "list_lag_ms": 500,
        "rate_limits": [{"name": "minute", "quota": 100000, "window_secs": 60}],
        "images": [{"match": "server", "logs": ["serving"]}]
    })
}

fn main() -> std::process::ExitCode {
    let extra = ExtraFlags {
        apiserver: vec![
            "--default-not-ready-toleration-seconds=30".into(),
            "--default-unreachable-toleration-seconds=30".into(),
        ],
        controller_manager: vec!["--node-monitor-grace-period=20s".into()],
    };
    support::harness::main("e2e_controller_outage", &extra, |cp| Box::pin(run(cp)))
}

async fn run(control_plane: &ControlPlane) -> anyhow::Result<()> {
    let client = control_plane.client().await?;
    // The healthy second node: no GPUs, so no burst pod can land on it.
    let healthy = FakeNode {
        allocatable: [
            ("cpu", "8"),
            ("memory", "32Gi"),
            ("pods", "110"),
            ("nvidia.com/gpu", "0"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        ..FakeNode::local_gpu("healthy-node")
    };
    let heartbeat = healthy
        .register_every(client.clone(), Duration::from_secs(3))
        .await?;
    let simulator = SimulatorProcess::start(&scenario())?;
    let mut controller = ControllerProcess::start(
        &control_plane.kubeconfig,
        &control_plane.ca_file(),
        &simulator,
        &["--cluster-id", CLUSTER],
    )?;
    let outcome = outages(&client, &simulator, &mut controller).await;
    heartbeat.abort();
    if outcome.is_err() {
        eprintln!("--- controller log tail ---\n{}", controller.log_tail(80));
        eprintln!(
            "--- kube-controller-manager log tail ---\n{}",
            control_plane.log_tail("kube-controller-manager", 30)
        );
    }
    outcome
}

async fn outages(
    client: &kube::Client,
    simulator: &SimulatorProcess,
    controller: &mut ControllerProcess,
) -> anyhow::Result<()> {
    node_ready(client).await?;
    namespace(client, NS, false).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in BURST {
        pods.create(
            &PostParams::default(),
            &bound_gpu_pod(name, "e2e/server:1", "Always"),
        )
        .await?;
    }
    // Bound to the virtual node with the cluster's default (30 s) tolerations: not a GPU pod,
    // so the controller does not run it and leaves its tolerations alone.
    let plain: Pod = serde_json::from_value(json!({
        "metadata": {"name": "plain"},
        "spec": {"nodeName": NODE, "tolerations": [provider_toleration()],
                 "containers": [{"name": "main", "image": "busybox"}]}
    }))?;
    pods.create(&PostParams::default(), &plain).await?;
    let mut ids = BTreeMap::new();
    for name in BURST {
        let pod = running(&pods, name).await?;
        let id = annotation(&pod, "runpod.io/pod-id").unwrap().to_owned();
        ids.insert(name, (uid(&pod), id));
    }
    event(client, NS, "plain", "NotRunOnRunPod").await?;
    let plain = pods.get("plain").await?;
    ensure!(
        toleration_seconds(&plain, "node.kubernetes.io/unreachable") == Some(30),
        "the plain pod should keep the 30 s default: {:?}",
        plain.spec.as_ref().and_then(|s| s.tolerations.clone())
    );
    for name in BURST {
        let pod = pods.get(name).await?;
        ensure!(
            toleration_seconds(&pod, "node.kubernetes.io/unreachable") == Some(3600),
            "{name} keeps short outage tolerations"
        );
    }
    let created_before = simulator.ledger().await?.len();

    // 1. RunPod's API down for over a minute.
    simulator
        .inject(&json!({"effect": {"kind": "status", "status": 503}}))
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    let mut marked = false;
    while started.elapsed() < API_OUTAGE {
        burst_pods_intact(&pods, &ids).await?;
        let node = nodes.get(NODE).await?;
        marked |= node_condition(&node, "RunPodAPIAvailable")
            .is_some_and(|(s, r)| s == "False" && r == "APIUnreachable")
            && has_taint(&node, "runpod.io/api-unavailable", "NoSchedule");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    ensure!(marked, "the node never said the RunPod API was unreachable");
    simulator.clear_faults().await?;
    wait::until("RunPod API available again", WAIT, || async {
        let node = nodes.get(NODE).await?;
        let ok = node_condition(&node, "RunPodAPIAvailable").is_some_and(|(s, _)| s == "True")
            && !has_taint(&node, "runpod.io/api-unavailable", "NoSchedule");
        Ok(ok.then_some(()))
    })
    .await?;
    for name in BURST {
        running(&pods, name).await?;
    }
    burst_pods_intact(&pods, &ids).await?;

    // 2. Every controller down for over 90 s.
    controller.kill();
    let killed = Instant::now();
    wait::until(
        "virtual node Unknown and tainted unreachable",
        WAIT,
        || async {
            let node = nodes.get(NODE).await?;
            let unknown = node_condition(&node, "Ready").is_some_and(|(s, _)| s == "Unknown");
            Ok(
                (unknown && has_taint(&node, "node.kubernetes.io/unreachable", "NoExecute"))
                    .then_some(()),
            )
        },
    )
    .await?;
    let healthy = nodes.get("healthy-node").await?;
    ensure!(
        node_condition(&healthy, "Ready").is_some_and(|(s, _)| s == "True"),
        "the second node is not healthy: evictions would be off for the wrong reason"
    );
    let mut plain_evicted = false;
    while killed.elapsed() < CONTROLLER_OUTAGE {
        burst_pods_intact(&pods, &ids).await?;
        plain_evicted |= match pods.get_opt("plain").await? {
            None => true,
            Some(pod) => pod.metadata.deletion_timestamp.is_some(),
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if !plain_evicted {
        // The taint manager may be a little late under load; wait for it (still no controller).
        wait::until("the default-toleration pod evicted", WAIT, || async {
            Ok(match pods.get_opt("plain").await? {
                None => Some(()),
                Some(pod) => pod.metadata.deletion_timestamp.map(|_| ()),
            })
        })
        .await
        .context("eviction never happened: the test would prove nothing")?;
    }
    burst_pods_intact(&pods, &ids).await?;

    // The controller returns: it adopts what runs and creates nothing.
    controller.restart()?;
    wait::until("virtual node Ready and untainted", WAIT, || async {
        let node = nodes.get(NODE).await?;
        let ready = node_condition(&node, "Ready").is_some_and(|(s, _)| s == "True");
        let clean = !has_taint(&node, "node.kubernetes.io/unreachable", "NoExecute")
            && !has_taint(&node, "node.kubernetes.io/not-ready", "NoExecute");
        Ok((ready && clean).then_some(()))
    })
    .await?;
    for name in BURST {
        wait::until(&format!("{name} Ready again"), WAIT, || async {
            let pod = pods.get(name).await?;
            Ok((phase(&pod) == Some("Running") && ready(&pod)).then_some(()))
        })
        .await?;
    }
    burst_pods_intact(&pods, &ids).await?;
    // A few more lists: still nothing created.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, (uid, id)) in &ids {
        let entries = ledger_for(simulator, uid).await?;
        ensure!(
            entries.len() == 1 && entries[0]["id"] == id.as_str(),
            "{name}: RunPod pods {entries:?}"
        );
        ensure!(
            ledger_live(simulator, id).await?,
            "{name}'s RunPod pod was terminated"
        );
    }
    let created_after = simulator.ledger().await?.len();
    ensure!(
        created_after == created_before,
        "{} RunPod pods created during the outages",
        created_after - created_before
    );
    // The evicted pod is cleaned up by the returning controller.
    wait::until("the evicted pod removed", WAIT, || async {
        Ok(pods.get_opt("plain").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

/// Every burst pod still exists, is not being deleted, has not failed, and names the same
/// RunPod pod, which is still alive.
async fn burst_pods_intact(
    pods: &Api<Pod>,
    ids: &BTreeMap<&str, (String, String)>,
) -> anyhow::Result<()> {
    for (name, (uid, id)) in ids {
        let Some(pod) = pods.get_opt(name).await? else {
            bail!("burst pod {name} was deleted");
        };
        ensure!(
            pod.metadata.uid.as_deref() == Some(uid.as_str()),
            "{name} replaced"
        );
        ensure!(
            pod.metadata.deletion_timestamp.is_none(),
            "burst pod {name} is being deleted (evicted?)"
        );
        ensure!(
            phase(&pod) == Some("Running"),
            "burst pod {name} is {:?}: {:?}",
            phase(&pod),
            pod.status.as_ref().and_then(|s| s.reason.clone())
        );
        ensure!(
            annotation(&pod, "runpod.io/pod-id") == Some(id.as_str()),
            "{name} names another RunPod pod"
        );
    }
    Ok(())
}

fn toleration_seconds(pod: &Pod, key: &str) -> Option<i64> {
    pod.spec
        .as_ref()?
        .tolerations
        .as_ref()?
        .iter()
        .find(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some("NoExecute"))?
        .toleration_seconds
}
