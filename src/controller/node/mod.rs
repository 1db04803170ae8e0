//! The virtual node: its object (pure), registration that never takes over a real node, and a
//! status loop that applies only our own fields (server-side apply with force) and changes
//! taints by read-modify-write, so what others add (conditions, labels, taints) is kept.

pub mod drain;
pub(crate) mod exec_key;
pub(crate) mod health;
pub(crate) mod heartbeat;
pub(crate) mod lease;
pub(crate) mod presence;
pub mod removal;
pub mod ssh_key;

use std::collections::BTreeMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use runpod_contract::{NODE_TYPE_LABEL, NODE_TYPE_VALUE, PROVIDER_TAINT_KEY};
use serde_json::json;

use health::ApiHealth;

/// Field manager of every write the controller makes.
pub const FIELD_MANAGER: &str = "runpod-kubelet";
/// Node condition saying whether the cloud's API is usable.
pub const API_CONDITION: &str = "RunPodAPIAvailable";
/// Taint keeping new pods away while the cloud's API is unusable.
pub use runpod_contract::names::API_UNAVAILABLE_TAINT as UNAVAILABLE_TAINT;

/// What the node is configured to offer.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub provider: &'static str,
    pub internal_ip: String,
    pub kubelet_port: u16,
    pub max_pods: u32,
    pub max_gpus: u32,
    pub cpu: String,
    pub memory: String,
    /// The namespaces this node serves (`--serve-namespaces`), published on the node for the
    /// webhook and the other nodes' controllers.
    pub serves: Vec<String>,
}

impl NodeConfig {
    pub fn labels(&self) -> BTreeMap<String, String> {
        [
            (NODE_TYPE_LABEL, NODE_TYPE_VALUE),
            ("kubernetes.io/role", "agent"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/hostname", self.name.as_str()),
            (PROVIDER_TAINT_KEY, self.provider),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// Our taints for the given API health.
    pub fn taints(&self, health: &ApiHealth) -> Vec<Taint> {
        let mut taints = vec![
            taint(PROVIDER_TAINT_KEY, self.provider, "NoSchedule"),
            taint(PROVIDER_TAINT_KEY, self.provider, "PreferNoSchedule"),
        ];
        if let ApiHealth::Unavailable { .. } = health {
            taints.push(taint(UNAVAILABLE_TAINT, "true", "NoSchedule"));
        }
        taints
    }

    fn capacity(&self) -> BTreeMap<String, Quantity> {
        [
            ("cpu", self.cpu.clone()),
            ("memory", self.memory.clone()),
            ("pods", self.max_pods.to_string()),
            (runpod_contract::GPU_RESOURCE, self.max_gpus.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Quantity(v)))
        .collect()
    }
}

fn taint(key: &str, value: &str, effect: &str) -> Taint {
    Taint {
        key: key.to_owned(),
        value: Some(value.to_owned()),
        effect: effect.to_owned(),
        time_added: None,
    }
}

/// Our taints merged into the node's list: ours added or removed, everyone else's kept.
pub fn merge_taints(current: &[Taint], ours: &[Taint]) -> Vec<Taint> {
    let owned = |t: &Taint| t.key == PROVIDER_TAINT_KEY || t.key == UNAVAILABLE_TAINT;
    let mut merged: Vec<Taint> = current.iter().filter(|t| !owned(t)).cloned().collect();
    merged.extend(ours.iter().cloned());
    merged
}

fn same_taints(a: &[Taint], b: &[Taint]) -> bool {
    let key = |t: &Taint| (t.key.clone(), t.value.clone(), t.effect.clone());
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}

/// The status fields we own, as a server-side-apply body.
pub fn status_patch(
    config: &NodeConfig,
    health: &ApiHealth,
    now: Timestamp,
    transitions: &TransitionTimes,
) -> serde_json::Value {
    let time = |kind: &str, status: &str| transitions.time(kind, status, now);
    let pressure = |kind: &str, reason: &str| {
        json!({"type": kind, "status": "False", "reason": reason, "message": "virtual node",
               "lastHeartbeatTime": Time(now), "lastTransitionTime": time(kind, "False")})
    };
    let (api_status, api_reason, api_message) = match health {
        ApiHealth::Available => (
            "True",
            "APIReachable".to_owned(),
            "the cloud API answers".to_owned(),
        ),
        ApiHealth::Unavailable { reason, message } => ("False", reason.clone(), message.clone()),
    };
    let capacity = config.capacity();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": config.name},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "runpod-kubelet is posting ready status",
                 "lastHeartbeatTime": Time(now), "lastTransitionTime": time("Ready", "True")},
                pressure("MemoryPressure", "KubeletHasSufficientMemory"),
                pressure("DiskPressure", "KubeletHasNoDiskPressure"),
                pressure("PIDPressure", "KubeletHasSufficientPID"),
                pressure("NetworkUnavailable", "RouteCreated"),
                {"type": API_CONDITION, "status": api_status, "reason": api_reason,
                 "message": api_message, "lastHeartbeatTime": Time(now),
                 "lastTransitionTime": time(API_CONDITION, api_status)},
            ],
            "addresses": [{"type": "InternalIP", "address": config.internal_ip}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": config.kubelet_port}},
            "nodeInfo": {
                "architecture": "amd64", "operatingSystem": "linux",
                "kubeletVersion": concat!("v1.20.2-runpod-kubelet-", env!("CARGO_PKG_VERSION")),
                "kubeProxyVersion": "", "containerRuntimeVersion": config.provider.to_owned() + "://v2",
                "osImage": "", "kernelVersion": "", "bootID": "", "machineID": "", "systemUUID": ""
            }
        }
    })
}

/// When each of our conditions last changed status, so heartbeats do not move them.
#[derive(Debug, Default)]
pub struct TransitionTimes(Mutex<BTreeMap<String, (String, Timestamp)>>);

impl TransitionTimes {
    fn time(&self, kind: &str, status: &str, now: Timestamp) -> Time {
        let Ok(mut map) = self.0.lock() else {
            return Time(now);
        };
        match map.get(kind) {
            Some((previous, at)) if previous == status => Time(*at),
            _ => {
                map.insert(kind.to_owned(), (status.to_owned(), now));
                Time(now)
            }
        }
    }
}

/// Why the node cannot be registered.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(
        "a node named {0:?} exists without the label {PROVIDER_TAINT_KEY}={1}; refusing to take over a node that is not ours"
    )]
    NotOurs(String, &'static str),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Creates the node, or adopts it when it carries our provider label; returns it (its UID
/// owns the node Lease).
pub async fn register(api: &Api<Node>, config: &NodeConfig) -> Result<Node, NodeError> {
    if let Some(existing) = api.get_opt(&config.name).await? {
        let labels = existing.metadata.labels.unwrap_or_default();
        if labels.get(PROVIDER_TAINT_KEY).map(String::as_str) != Some(config.provider) {
            return Err(NodeError::NotOurs(config.name.clone(), config.provider));
        }
        // Ours (from an earlier run or another replica): make sure labels are complete.
        let patch = json!({"metadata": {"labels": config.labels()}});
        let adopted = api
            .patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(adopted);
    }
    let node = Node {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            labels: Some(config.labels()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(config.taints(&ApiHealth::Available)),
            ..Default::default()
        }),
        status: None,
    };
    match api.create(&PostParams::default(), &node).await {
        Ok(created) => Ok(created),
        // Created meanwhile by another replica: fine if it is ours.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            Box::pin(register(api, config)).await
        }
        Err(error) => Err(error.into()),
    }
}

/// Applies our status fields (force: the node lifecycle controller may have set Ready).
pub async fn apply_status(
    api: &Api<Node>,
    config: &NodeConfig,
    health: &ApiHealth,
    transitions: &TransitionTimes,
) -> Result<(), kube::Error> {
    let patch = status_patch(config, health, Timestamp::now(), transitions);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch_status(&config.name, &params, &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// Sets our taints for `health` and the published price annotations, by read-modify-write with
/// the node's resourceVersion (taints are an atomic list: applying ours would drop others').
pub async fn sync_spec(
    api: &Api<Node>,
    config: &NodeConfig,
    health: &ApiHealth,
    published: &[(&str, String)],
) -> Result<(), kube::Error> {
    for _ in 0..5 {
        let mut node = api.get(&config.name).await?;
        let current = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let wanted = merge_taints(&current, &config.taints(health));
        let annotations = node.metadata.annotations.get_or_insert_with(BTreeMap::new);
        let annotation_changed = published
            .iter()
            .any(|(key, value)| annotations.get(*key) != Some(value));
        if same_taints(&current, &wanted) && !annotation_changed {
            return Ok(());
        }
        for (key, value) in published {
            annotations.insert((*key).to_owned(), value.clone());
        }
        node.spec.get_or_insert_with(Default::default).taints = Some(wanted);
        match api
            .replace(&config.name, &PostParams::default(), &node)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NodeConfig {
        NodeConfig {
            name: "virtual-runpod".into(),
            provider: "runpod",
            internal_ip: "10.1.2.3".into(),
            kubelet_port: 10250,
            max_pods: 100,
            max_gpus: 8,
            cpu: "100".into(),
            memory: "1Ti".into(),
            serves: Vec::new(),
        }
    }

    #[test]
    fn taints_follow_api_health_and_keep_foreign_ones() {
        let config = config();
        let foreign = taint("node.kubernetes.io/unreachable", "", "NoExecute");
        let healthy = merge_taints(
            std::slice::from_ref(&foreign),
            &config.taints(&ApiHealth::Available),
        );
        assert_eq!(healthy.len(), 3);
        assert!(healthy.contains(&foreign));
        let down = ApiHealth::Unavailable {
            reason: "Unreachable".into(),
            message: "m".into(),
        };
        let tainted = merge_taints(&healthy, &config.taints(&down));
        assert!(
            tainted
                .iter()
                .any(|t| t.key == UNAVAILABLE_TAINT && t.effect == "NoSchedule")
        );
        assert!(tainted.contains(&foreign));
        let back = merge_taints(&tainted, &config.taints(&ApiHealth::Available));
        assert!(same_taints(&back, &healthy));
    }

    #[test]
    fn status_carries_address_port_capacity_and_stable_transition_times() {
        let config = config();
        let times = TransitionTimes::default();
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let first = status_patch(&config, &ApiHealth::Available, t0, &times);
        let second = status_patch(&config, &ApiHealth::Available, t1, &times);
        let status = &second["status"];
        assert_eq!(status["addresses"][0]["address"], "10.1.2.3");
        assert_eq!(status["addresses"].as_array().unwrap().len(), 1);
        assert_eq!(status["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
        assert_eq!(status["capacity"]["nvidia.com/gpu"], "8");
        assert_eq!(status["capacity"]["pods"], "100");
        let ready = |v: &serde_json::Value| v["status"]["conditions"][0].clone();
        assert_eq!(
            ready(&first)["lastTransitionTime"],
            ready(&second)["lastTransitionTime"]
        );
        assert_ne!(
            ready(&first)["lastHeartbeatTime"],
            ready(&second)["lastHeartbeatTime"]
        );
        let down = ApiHealth::Unavailable {
            reason: "PaymentRequired".into(),
            message: "top up".into(),
        };
        let third = status_patch(&config, &down, t1, &times);
        let api = third["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == API_CONDITION)
            .unwrap()
            .clone();
        assert_eq!(api["status"], "False");
        assert_eq!(api["reason"], "PaymentRequired");
    }
}
