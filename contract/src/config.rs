//! What an installation configures (the cluster-wide policy) and what a pod inherits from its
//! Job: the inputs of the checks and the rules, kept apart from both so neither imports the
//! other.

use std::collections::{BTreeMap, BTreeSet};

/// Cluster-wide policy, from the webhook's flags.
#[derive(Debug, Clone, Default)]
pub struct PolicyConfig {
    /// Datacenters pods may ask for; empty means any.
    pub allowed_datacenters: Vec<String>,
    /// RunPod cloud tiers pods may run in (`--allowed-cloud-types`); empty means any.
    /// `COMMUNITY` hosts are third parties: the pod's Secret env and registry login go there.
    pub allowed_cloud_types: Vec<crate::CloudType>,
    /// Highest USD per hour per GPU a pod may offer; `None` means no cap.
    pub max_gpu_price: Option<f64>,
    /// Namespaces whose pods are never touched (the chart's own); `kube-system` always is.
    pub excluded_namespaces: BTreeSet<String>,
    /// Where Vast.ai pods may run and what they may cost (`--vastai-*`, `--max-gpu-price`).
    pub vastai: crate::vastai::VastPolicy,
    /// Clouds with no virtual node in this installation (`--clouds`; a Vast.ai-only install
    /// disables RunPod): a pod sent there would wait forever, so it is refused at admission.
    pub disabled_clouds: BTreeSet<crate::provider::Cloud>,
    /// `--expose-ports none`: a pod that names no ports exposes none (instead of its declared
    /// `containerPort`s), as if it said `runpod.io/ports: none`.
    pub expose_no_ports: bool,
    /// `--accept-seed-tolerations`: a pod that itself tolerates the RunPod node's taint by key
    /// (the Go kubelet's manifests) counts as opted in.
    pub accept_seed_tolerations: bool,
    /// The budget (USD per hour) of a namespace without `runpod.io/budget-per-hour`
    /// (`--default-budget-per-hour`); `None`: no budget.
    pub default_budget: Option<f64>,
    /// The installation's node bindings (`--namespace-nodes`, from the chart's `namespaces`).
    pub namespace_nodes: Vec<crate::teams::Served>,
    /// The cloud of each of those nodes, for a node not registered yet.
    pub node_clouds: BTreeMap<String, crate::provider::Cloud>,
}

impl PolicyConfig {
    /// The cloud of a pod that names none: RunPod, unless this installation has none.
    pub fn default_cloud(&self) -> crate::provider::Cloud {
        crate::provider::Cloud::ALL
            .into_iter()
            .find(|cloud| !self.disabled_clouds.contains(cloud))
            .unwrap_or_default()
    }
}

impl PolicyConfig {
    /// From the flags the webhook and the controller share: `kube-system` is excluded by
    /// [`crate::policy::screen`] itself, the component's own namespace (`POD_NAMESPACE`) here.
    pub fn from_flags(
        exclude_namespaces: &[String],
        datacenter_ids: &[String],
        max_gpu_price: f64,
        own_namespace: Option<String>,
    ) -> PolicyConfig {
        let trimmed = |items: &[String]| -> Vec<String> {
            items
                .iter()
                .map(|item| item.trim().to_owned())
                .filter(|item| !item.is_empty())
                .collect()
        };
        let mut excluded: BTreeSet<String> = trimmed(exclude_namespaces).into_iter().collect();
        excluded.extend(own_namespace.filter(|ns| !ns.is_empty()));
        PolicyConfig {
            allowed_datacenters: trimmed(datacenter_ids),
            allowed_cloud_types: Vec::new(),
            max_gpu_price: Some(max_gpu_price),
            excluded_namespaces: excluded,
            vastai: crate::vastai::VastPolicy {
                max_gpu_price: Some(max_gpu_price),
                ..crate::vastai::VastPolicy::default()
            },
            disabled_clouds: BTreeSet::new(),
            expose_no_ports: false,
            accept_seed_tolerations: false,
            default_budget: None,
            namespace_nodes: Vec::new(),
            node_clouds: BTreeMap::new(),
        }
    }
}

/// The Job a pod belongs to, for the annotation fallback.
#[derive(Debug, Clone, Default)]
pub struct OwningJob {
    pub name: String,
    pub annotations: BTreeMap<String, String>,
}
