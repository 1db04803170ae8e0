//! Prometheus metrics of the controller: pods by cloud state, cost per hour running now, lease
//! renewals, reconcile errors, creates, terminations and apiserver writes; per burst pod its GPU
//! utilization and cost (series removed when the pod ends), idle GPUs, the longest wait for a
//! cloud instance and whether the cloud's API is usable (what the chart's alerts need).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The provider label of RunPod, whose older `runpod_*` series count it alone.
const RUNPOD: &str = "runpod";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
    pub provider: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    pub provider: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderOutcome {
    pub provider: &'static str,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// What kind of error it was.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// One namespace (budgets are per namespace; the set is bounded by namespaces with burst pods).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: &'static str,
}

/// One burst pod. Values are owned: the set is bounded by the pods on the node, and a pod's
/// series are removed when it ends.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
    pub provider: String,
}

/// Handles into the registry.
#[derive(Debug, Default)]
pub struct ControllerMetrics {
    pub pods_by_state: Family<StateLabel, Gauge>,
    pub cost_per_hour: Gauge<f64, AtomicU64>,
    pub lease_renewals: Family<OutcomeLabel, Counter>,
    /// Failed reconciles by `ReconcileError::metric_label`.
    pub reconcile_errors: Family<KindLabel, Counter>,
    /// Deprecated `runpod_creates`: RunPod's creates only (see `cloud_creates`).
    pub creates: Counter,
    /// Deprecated `runpod_terminations`: RunPod's only.
    pub terminations: Counter,
    /// Create attempts by provider.
    pub cloud_creates: Family<ProviderLabel, Counter>,
    /// Instances terminated by provider.
    pub cloud_terminations: Family<ProviderLabel, Counter>,
    /// Complete lists of instances by provider and outcome.
    pub cloud_lists: Family<ProviderOutcome, Counter>,
    pub garbage_collected: Counter,
    /// Live cloud instances tagged with this node's name but another cluster id: reported,
    /// never touched (a cloned cluster, or a changed `--cluster-id`).
    pub foreign_instances: Gauge,
    pub pod_writes: Counter,
    /// Deprecated `runpod_lists`: RunPod's only.
    pub lists: Family<OutcomeLabel, Counter>,
    /// Waiting `delayed` pods moved to the virtual node, by reason.
    pub offloaded: Family<ReasonLabel, Counter>,
    /// `delayed` pods waiting for a local GPU (the scheduler found none) after the last round.
    pub offload_waiting: Gauge,
    /// The longest of those waits, seconds.
    pub offload_longest_wait: Gauge<f64, AtomicU64>,
    /// 1 while this replica leads (or runs without election), 0 as a standby.
    pub leader: Gauge,
    /// Mean GPU utilization per burst pod with a live report, 0..=1.
    pub pod_gpu_utilization: Family<PodLabels, Gauge<f64, AtomicU64>>,
    /// Mean GPU memory utilization per burst pod with a live report, 0..=1.
    pub pod_gpu_memory_utilization: Family<PodLabels, Gauge<f64, AtomicU64>>,
    /// What each burst pod's instance costs per hour now.
    pub pod_cost_per_hour: Family<PodLabels, Gauge<f64, AtomicU64>>,
    /// Pods whose GPUs have been idle past `--idle-gpu-after`.
    pub idle_gpu_pods: Gauge,
    /// The longest a pod bound to the node has waited for a running cloud instance, seconds.
    pub provisioning_longest_wait: Gauge<f64, AtomicU64>,
    /// 1 while the cloud's API answers (the node's own condition), 0 while it is unreachable
    /// or refuses the key.
    pub cloud_api_available: Family<ProviderLabel, Gauge>,
    /// GPU types the cloud sells that the GPU catalogue does not know (named in the log).
    pub unknown_gpu_types: Gauge,
    /// What each namespace's burst pods cost per hour now, every node and cloud together (the
    /// shared budget ledger), creates under way included.
    pub namespace_spend: Family<NamespaceLabel, Gauge<f64, AtomicU64>>,
    /// Each namespace's `runpod.io/budget-per-hour` (or the installation's default).
    pub namespace_budget: Family<NamespaceLabel, Gauge<f64, AtomicU64>>,
    /// What the network volumes of each namespace's claims on this node cost per hour.
    pub volume_cost_per_hour: Family<NamespaceLabel, Gauge<f64, AtomicU64>>,
}

impl ControllerMetrics {
    /// A create attempt on `provider`'s cloud.
    pub fn created(&self, provider: &'static str) {
        self.cloud_creates
            .get_or_create(&ProviderLabel { provider })
            .inc();
        if provider == RUNPOD {
            self.creates.inc();
        }
    }

    /// An instance terminated on `provider`'s cloud.
    pub fn terminated(&self, provider: &'static str) {
        self.cloud_terminations
            .get_or_create(&ProviderLabel { provider })
            .inc();
        if provider == RUNPOD {
            self.terminations.inc();
        }
    }

    /// A complete list of `provider`'s instances, `ok` or `error`.
    pub fn listed(&self, provider: &'static str, outcome: &'static str) {
        self.cloud_lists
            .get_or_create(&ProviderOutcome { provider, outcome })
            .inc();
        if provider == RUNPOD {
            self.lists.get_or_create(&OutcomeLabel { outcome }).inc();
        }
    }

    /// One example series in each labelled family, so that an exposition lists every family
    /// (an empty family is not exported): for the generated metrics reference only.
    pub fn add_example_series(&self) {
        let pod = PodLabels {
            namespace: "team-a".to_string(),
            pod: "train-x7k2p".to_string(),
            provider: "runpod".to_string(),
        };
        let _ = self.pods_by_state.get_or_create(&StateLabel {
            state: "RUNNING",
            provider: "runpod",
        });
        let _ = self
            .lease_renewals
            .get_or_create(&OutcomeLabel { outcome: "ok" });
        let _ = self
            .reconcile_errors
            .get_or_create(&KindLabel { kind: "conflict" });
        self.listed(RUNPOD, "ok");
        let _ = self
            .cloud_api_available
            .get_or_create(&ProviderLabel { provider: RUNPOD });
        let _ = self
            .cloud_creates
            .get_or_create(&ProviderLabel { provider: RUNPOD });
        let _ = self
            .cloud_terminations
            .get_or_create(&ProviderLabel { provider: RUNPOD });
        let _ = self.offloaded.get_or_create(&ReasonLabel {
            reason: "max_pending_time",
        });
        let _ = self.pod_gpu_utilization.get_or_create(&pod);
        let _ = self.pod_gpu_memory_utilization.get_or_create(&pod);
        let _ = self.pod_cost_per_hour.get_or_create(&pod);
        let team = NamespaceLabel {
            namespace: "team-a".to_string(),
        };
        let _ = self.namespace_spend.get_or_create(&team);
        let _ = self.namespace_budget.get_or_create(&team);
        let _ = self.volume_cost_per_hour.get_or_create(&team);
    }

    /// Each namespace's volume storage cost per hour, as the PVs now say (namespaces without
    /// volumes have no series).
    pub fn volume_costs(&self, costs: &std::collections::BTreeMap<String, f64>) {
        self.volume_cost_per_hour.clear();
        for (namespace, usd) in costs {
            self.volume_cost_per_hour
                .get_or_create(&NamespaceLabel {
                    namespace: namespace.clone(),
                })
                .set(*usd);
        }
    }

    /// A namespace's spend, as its ledger says.
    pub fn namespace_spend(&self, namespace: &str, usd: f64) {
        self.namespace_spend
            .get_or_create(&NamespaceLabel {
                namespace: namespace.to_owned(),
            })
            .set(usd);
    }

    /// Removes a namespace's spend and budget series (it has no burst pods any more).
    pub fn forget_namespace(&self, namespace: &str) {
        let label = NamespaceLabel {
            namespace: namespace.to_owned(),
        };
        self.namespace_spend.remove(&label);
        self.namespace_budget.remove(&label);
    }

    /// A namespace's budget, or no series when it has none.
    pub fn namespace_budget(&self, namespace: &str, usd: Option<f64>) {
        let label = NamespaceLabel {
            namespace: namespace.to_owned(),
        };
        match usd {
            Some(usd) => {
                self.namespace_budget.get_or_create(&label).set(usd);
            }
            None => {
                self.namespace_budget.remove(&label);
            }
        }
    }

    /// Registers every metric under the registry's prefix.
    pub fn register(registry: &mut Registry) -> Arc<ControllerMetrics> {
        let metrics = ControllerMetrics::default();
        registry.register(
            "pods",
            "Cloud pods of this cluster and node by state and provider, from the last list",
            metrics.pods_by_state.clone(),
        );
        registry.register(
            "cost_per_hour_usd",
            "What the cloud instances of this cluster and node cost per hour now",
            metrics.cost_per_hour.clone(),
        );
        registry.register(
            "node_lease_renewals",
            "Node Lease renewals by outcome",
            metrics.lease_renewals.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Pod reconciles that failed and were retried",
            metrics.reconcile_errors.clone(),
        );
        registry.register(
            "runpod_creates",
            "Deprecated (use cloud_creates): RunPod create attempts (provision calls)",
            metrics.creates.clone(),
        );
        registry.register(
            "runpod_terminations",
            "Deprecated (use cloud_terminations): RunPod pods terminated",
            metrics.terminations.clone(),
        );
        registry.register(
            "cloud_creates",
            "Create attempts (provision calls) by provider",
            metrics.cloud_creates.clone(),
        );
        registry.register(
            "cloud_terminations",
            "Cloud instances terminated, by provider",
            metrics.cloud_terminations.clone(),
        );
        registry.register(
            "cloud_lists",
            "Complete lists of cloud instances by provider and outcome",
            metrics.cloud_lists.clone(),
        );
        registry.register(
            "garbage_collected",
            "Tagged cloud instances terminated because no Kubernetes pod matches them",
            metrics.garbage_collected.clone(),
        );
        registry.register(
            "foreign_instances",
            "Live cloud instances tagged with this node's name but another cluster id (never touched: check --cluster-id)",
            metrics.foreign_instances.clone(),
        );
        registry.register(
            "pod_writes",
            "Writes of pod status and annotations to the apiserver",
            metrics.pod_writes.clone(),
        );
        metrics.register_offload_usage_and_budgets(registry);
        Arc::new(metrics)
    }

    /// The second half of the families: deprecated lists, offloading, per-pod usage and cost,
    /// and budgets.
    fn register_offload_usage_and_budgets(&self, registry: &mut Registry) {
        let metrics = self;
        registry.register(
            "runpod_lists",
            "Deprecated (use cloud_lists): complete lists of RunPod pods by outcome",
            metrics.lists.clone(),
        );
        registry.register(
            "offloaded",
            "Waiting delayed pods moved to the virtual node, by reason (max_pending_time, threshold, offload_annotation)",
            metrics.offloaded.clone(),
        );
        registry.register(
            "offload_waiting_pods",
            "Delayed pods waiting for a local GPU after the offloader's last round",
            metrics.offload_waiting.clone(),
        );
        registry.register(
            "offload_longest_wait_seconds",
            "The longest wait of a delayed pod for a local GPU, seconds",
            metrics.offload_longest_wait.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica is the elected leader (or runs without election), 0 as a standby",
            metrics.leader.clone(),
        );
        registry.register(
            "pod_gpu_utilization_ratio",
            "Mean GPU utilization of each burst pod (0..1) from the cloud's live report",
            metrics.pod_gpu_utilization.clone(),
        );
        registry.register(
            "pod_gpu_memory_utilization_ratio",
            "Mean GPU memory utilization of each burst pod (0..1) from the cloud's live report",
            metrics.pod_gpu_memory_utilization.clone(),
        );
        registry.register(
            "pod_cost_per_hour_usd",
            "What each burst pod's cloud instance costs per hour now",
            metrics.pod_cost_per_hour.clone(),
        );
        registry.register(
            "idle_gpu_pods",
            "Burst pods whose GPUs have stayed below --idle-gpu-threshold for --idle-gpu-after",
            metrics.idle_gpu_pods.clone(),
        );
        registry.register(
            "provisioning_longest_wait_seconds",
            "The longest a pod bound to the virtual node has waited for a running cloud instance",
            metrics.provisioning_longest_wait.clone(),
        );
        registry.register(
            "cloud_api_available",
            "1 while the cloud's API answers, 0 while it is unreachable or refuses the key (the node's condition), by provider",
            metrics.cloud_api_available.clone(),
        );
        registry.register(
            "unknown_gpu_types",
            "GPU types the cloud sells that the GPU catalogue does not know: pods cannot name them and cheapest does not compare them (the controller's log names them)",
            metrics.unknown_gpu_types.clone(),
        );
        registry.register(
            "namespace_spend_per_hour",
            "USD per hour each namespace's burst pods cost now, every node and cloud together (the clouds' own figures, plus creates under way)",
            metrics.namespace_spend.clone(),
        );
        registry.register(
            "namespace_budget_per_hour",
            "Each namespace's budget in USD per hour (runpod.io/budget-per-hour, or the installation's default)",
            metrics.namespace_budget.clone(),
        );
        registry.register(
            "volume_cost_per_hour",
            "USD per hour the network volumes of each namespace's claims on this node cost (storage, billed whether a pod mounts them or not)",
            metrics.volume_cost_per_hour.clone(),
        );
    }
}
