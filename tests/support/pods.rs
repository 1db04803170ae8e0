//! Pods, namespaces, Events and ledger look-ups shared by the controller e2e tests.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::controller::SimulatorProcess;
use super::wait;

pub const NODE: &str = "virtual-runpod";
pub const WAIT: Duration = Duration::from_secs(180);

/// Creates a namespace (labelled for bursting when `burst`) and waits for its ServiceAccount.
pub async fn namespace(client: &kube::Client, name: &str, burst: bool) -> anyhow::Result<()> {
    let labels: &[(&str, &str)] = if burst {
        &[("runpod.io/burst", "enabled")]
    } else {
        &[]
    };
    namespace_labelled(client, name, labels).await
}

/// Creates a namespace with `labels` and waits for its ServiceAccount.
pub async fn namespace_labelled(
    client: &kube::Client,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    namespace_annotated(client, name, labels, &[]).await
}

/// Creates a namespace with `labels` and `annotations` and waits for its ServiceAccount.
pub async fn namespace_annotated(
    client: &kube::Client,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let labels: std::collections::BTreeMap<&str, &str> = labels.iter().copied().collect();
    let annotations: std::collections::BTreeMap<&str, &str> = annotations.iter().copied().collect();
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name, "labels": labels,
                "annotations": annotations}}))?,
        )
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), name);
    // Pods are refused until the account's token secret exists.
    wait::until("default ServiceAccount with its token", WAIT, || async {
        let account = accounts.get_opt("default").await?;
        Ok(account
            .filter(|a| a.secrets.as_ref().is_some_and(|s| !s.is_empty()))
            .map(|_| ()))
    })
    .await
}

/// A one-GPU pod for a burst namespace (the webhook sends it to the virtual node).
pub fn gpu_pod(name: &str, image: &str, restart_policy: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"restartPolicy": restart_policy,
            "containers": [{"name": "main", "image": image,
                "command": ["python", "run.py"],
                "ports": [{"containerPort": 8888}],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    }))
    .unwrap_or_default()
}

/// A one-GPU pod bound straight to the virtual node (no scheduler, no webhook). It opts in
/// with its own label: the controller runs only pods that opted in, however they got there.
pub fn bound_gpu_pod(name: &str, image: &str, restart_policy: &str) -> Pod {
    let mut pod = gpu_pod(name, image, restart_policy);
    pod.metadata.labels = Some([("runpod.io/burst".to_owned(), "enabled".to_owned())].into());
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(NODE.into());
        spec.tolerations = Some(vec![provider_toleration()]);
    }
    pod
}

/// Tolerates the virtual node's `virtual-kubelet.io/provider` taints.
pub fn provider_toleration() -> k8s_openapi::api::core::v1::Toleration {
    k8s_openapi::api::core::v1::Toleration {
        key: Some("virtual-kubelet.io/provider".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }
}

pub fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

pub fn reason(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.reason.as_deref())
}

pub fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The state of the pod's first container, as the controller reported it.
pub fn container_state(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()
}

pub fn exit_code(pod: &Pod) -> Option<i32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// Waits until the pod is Running and Ready on RunPod (its pod id annotated).
pub async fn running(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait::until(&format!("pod {name} Running and Ready"), WAIT, || async {
        let pod = pods.get(name).await?;
        let up = phase(&pod) == Some("Running")
            && ready(&pod)
            && annotation(&pod, "runpod.io/pod-id").is_some();
        Ok(up.then_some(pod))
    })
    .await
}

/// Waits until the pod object is gone.
pub async fn gone(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    wait::until(&format!("pod {name} removed"), WAIT, || async {
        Ok(pods.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// The ledger entries (every RunPod pod ever created) tagged with this Kubernetes pod UID.
pub async fn ledger_for(
    simulator: &SimulatorProcess,
    uid: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(simulator
        .ledger()
        .await?
        .into_iter()
        .filter(|e| e["env"]["RUNPOD_KUBELET_POD_UID"] == uid)
        .collect())
}

pub fn live(entry: &serde_json::Value) -> bool {
    entry["terminated_at"].is_null()
}

/// Whether the ledger entry with this RunPod id is still live.
pub async fn ledger_live(simulator: &SimulatorProcess, id: &str) -> anyhow::Result<bool> {
    let ledger = simulator.ledger().await?;
    let entry = ledger
        .iter()
        .find(|e| e["id"] == id)
        .with_context(|| format!("RunPod pod {id} not in the ledger"))?;
    Ok(live(entry))
}

/// (reason, message) of every Event about the named object in the namespace.
pub async fn events(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// Waits for an Event with this reason on the named object; returns its message.
pub async fn event(
    client: &kube::Client,
    ns: &str,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    wait::until(&format!("Event {reason} on {ns}/{name}"), WAIT, || async {
        Ok(events(client, ns, name)
            .await?
            .into_iter()
            .find(|(r, _)| r == reason)
            .map(|(_, m)| m))
    })
    .await
}

/// A node condition's (status, reason).
pub fn node_condition(node: &Node, kind: &str) -> Option<(String, String)> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

pub fn has_taint(node: &Node, key: &str, effect: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key && t.effect == effect))
}

/// Waits until the virtual node exists and is Ready.
pub async fn node_ready(client: &kube::Client) -> anyhow::Result<Node> {
    node_ready_named(client, NODE).await
}

/// Waits until the node `name` exists and is Ready.
pub async fn node_ready_named(client: &kube::Client, name: &str) -> anyhow::Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait::until(&format!("node {name} Ready"), WAIT, || async {
        let Some(node) = nodes.get_opt(name).await? else {
            return Ok(None);
        };
        let ready = node_condition(&node, "Ready").is_some_and(|(s, _)| s == "True");
        Ok(ready.then_some(node))
    })
    .await
}
