//! Node objects registered by the test (no kubelet runs here): created Ready, then kept Ready by
//! renewing their Lease and status heartbeat, as a kubelet would, so the node lifecycle
//! controller never taints them unreachable.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

pub struct FakeNode {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub allocatable: BTreeMap<String, String>,
}

impl FakeNode {
    /// The virtual node as the controller will register it (labels, both taints, GPUs).
    pub fn virtual_runpod(name: &str) -> Self {
        let labels = [
            ("type", "virtual-kubelet"),
            ("kubernetes.io/role", "agent"),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("kubernetes.io/hostname", name),
            ("virtual-kubelet.io/provider", "runpod"),
        ];
        let taint = |effect: &str| Taint {
            key: "virtual-kubelet.io/provider".into(),
            value: Some("runpod".into()),
            effect: effect.into(),
            time_added: None,
        };
        Self {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            taints: vec![taint("NoSchedule"), taint("PreferNoSchedule")],
            allocatable: resources("100", "512Gi", "110", "16"),
        }
    }

    /// A local node with one GPU.
    pub fn local_gpu(name: &str) -> Self {
        Self {
            name: name.into(),
            labels: [
                ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ]
            .into(),
            taints: Vec::new(),
            allocatable: resources("8", "32Gi", "110", "1"),
        }
    }

    /// Creates the node and keeps it alive until the returned task is aborted.
    pub async fn register(
        self,
        client: kube::Client,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        self.register_every(client, Duration::from_secs(10)).await
    }

    /// Like [`FakeNode::register`], renewing the Lease and heartbeat every `period` (a
    /// shortened `--node-monitor-grace-period` needs a faster beat).
    pub async fn register_every(
        self,
        client: kube::Client,
        period: Duration,
    ) -> anyhow::Result<tokio::task::JoinHandle<()>> {
        let nodes: Api<Node> = Api::all(client.clone());
        let capacity: BTreeMap<String, Quantity> = self
            .allocatable
            .iter()
            .map(|(k, v)| (k.clone(), Quantity(v.clone())))
            .collect();
        let node = Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(self.taints.clone()),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some(capacity.clone()),
                allocatable: Some(capacity),
                conditions: Some(conditions()),
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: "127.0.0.1".into(),
                }]),
                ..NodeStatus::default()
            }),
        };
        nodes.create(&PostParams::default(), &node).await?;
        heartbeat(&client, &self.name).await?;
        let name = self.name.clone();
        Ok(tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                if let Err(error) = heartbeat(&client, &name).await {
                    eprintln!("heartbeat of node {name} failed: {error}");
                }
            }
        }))
    }
}

fn resources(cpu: &str, memory: &str, pods: &str, gpus: &str) -> BTreeMap<String, String> {
    [
        ("cpu", cpu),
        ("memory", memory),
        ("pods", pods),
        ("nvidia.com/gpu", gpus),
    ]
    .iter()
    .map(|(k, v)| ((*k).into(), (*v).into()))
    .collect()
}

fn conditions() -> Vec<NodeCondition> {
    let now = Time(Timestamp::now());
    let condition = |type_: &str, status: &str, reason: &str| NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(reason.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    };
    vec![
        condition("Ready", "True", "KubeletReady"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID"),
    ]
}

/// Renews the node's Lease and its Ready heartbeat.
async fn heartbeat(client: &kube::Client, name: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    let mut lease_json = serde_json::to_value(&lease)?;
    lease_json["apiVersion"] = json!("coordination.k8s.io/v1");
    lease_json["kind"] = json!("Lease");
    let params = PatchParams::apply("e2e-fake-kubelet").force();
    leases
        .patch(name, &params, &Patch::Apply(&lease_json))
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let status = json!({"status": {"conditions": conditions()}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&status))
        .await?;
    Ok(())
}
