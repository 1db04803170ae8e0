//! What the webhook needs from the cluster: namespace labels (opt-in and default mode) and the
//! owning Job's annotations. Served from metadata-only watch caches; a cache miss (an object
//! created a moment ago) falls back to one direct GET, so a fresh namespace or Job is never
//! judged on stale data.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{
    ConfigMap, Namespace, Node, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::policy::OwningJob;
use runpod_contract::budget::ledger::Ledger;
use runpod_contract::gpus::GpuPrices;
use runpod_contract::provider::Cloud;
use runpod_contract::teams::Served;

/// A lookup that could not be answered; the review is refused as retryable.
#[derive(Debug, thiserror::Error)]
#[error("could not read {what}: {reason}")]
pub struct LookupError {
    pub what: String,
    pub reason: String,
}

/// Read access to the cluster state the policy depends on.
pub trait ClusterView: Send + Sync + 'static {
    /// Labels of a namespace (empty if it does not exist).
    fn namespace_labels(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, LookupError>> + Send;
    /// The Job `name` in `namespace` if it exists with this `uid`.
    fn job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<Option<OwningJob>, LookupError>> + Send;
    /// Whether the caches have completed their first listing.
    fn synced(&self) -> bool;
    /// Cheapest GPU price per cloud type published on the virtual nodes (lowest across
    /// nodes); empty when none is known. Only feeds a warning, so it never blocks a review.
    fn cheapest_gpu_prices(&self) -> BTreeMap<String, f64> {
        BTreeMap::new()
    }
    /// The prices per GPU type each cloud's virtual nodes publish, all its nodes' together,
    /// for `runpod.io/provider: cheapest`; a cloud without published prices is absent.
    fn gpu_prices(&self) -> BTreeMap<Cloud, GpuPrices> {
        BTreeMap::new()
    }
    /// Annotations of a namespace as cached (its budget); empty when unknown. The controller
    /// enforces the budget before every create: admission only refuses early.
    fn namespace_annotations(
        &self,
        _name: &str,
    ) -> impl Future<Output = BTreeMap<String, String>> + Send {
        async { BTreeMap::new() }
    }
    /// Each virtual node of ours: its cloud and the namespaces it lists.
    fn served(&self) -> Vec<(Cloud, Served)> {
        Vec::new()
    }
    /// The GPU types each datacenter offers where network volumes are, as the RunPod nodes
    /// publish them (all together); empty when none does.
    fn datacenter_gpus(&self) -> BTreeMap<String, BTreeSet<String>> {
        BTreeMap::new()
    }
    /// Claim `name` in `namespace`: its StorageClass's provisioner and where its volume is;
    /// `None` when the claim or its class cannot be read.
    fn claim(&self, _namespace: &str, _name: &str) -> impl Future<Output = Option<Claimed>> + Send {
        async { None }
    }
    /// What a namespace spends now per its budget ledger, when it can be read (only feeds a
    /// warning, so it never blocks a review).
    fn namespace_spend(&self, _namespace: &str) -> impl Future<Output = Option<f64>> + Send {
        async { None }
    }
}

/// What admission needs of a claim a pod mounts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Claimed {
    /// Its StorageClass's provisioner.
    pub provisioner: String,
    /// The datacenter its network volume is in, when known: its PV's, else its class's
    /// `dataCenter` parameter (a claim not provisioned yet goes where its first pod lands).
    pub datacenter: Option<String>,
}

const DIRECT_GET_TIMEOUT: Duration = Duration::from_secs(3);

/// [`ClusterView`] backed by the Kubernetes API.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    namespaces: Store<PartialObjectMeta<Namespace>>,
    jobs: Store<PartialObjectMeta<Job>>,
    /// Virtual nodes of ours (provider label), for the price annotation.
    nodes: Store<PartialObjectMeta<Node>>,
    synced: Arc<AtomicBool>,
    /// Where the controllers keep the budget ledgers (their namespace, and this webhook's).
    ledger_namespace: String,
}

/// Named background tasks that must run as long as the server; one that ends has failed.
pub type BackgroundTasks = Vec<(&'static str, JoinHandle<()>)>;

impl KubeCluster {
    /// Starts the watch caches on the current runtime; the returned watch tasks run until
    /// aborted, so the caller should treat one that ends as a failure.
    pub fn start(client: Client) -> (Self, BackgroundTasks) {
        let (namespaces, namespace_writer) = reflector::store();
        let (jobs, job_writer) = reflector::store();
        let (nodes, node_writer) = reflector::store();
        let node_stream = watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default().labels(&format!(
                "{} in ({})",
                crate::contract::PROVIDER_TAINT_KEY,
                Cloud::ALL.map(Cloud::as_str).join(",")
            )),
        )
        .default_backoff()
        .modify(forget_managed_fields)
        .reflect(node_writer)
        .applied_objects();
        let namespace_stream = watcher(
            Api::<PartialObjectMeta<Namespace>>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(forget_managed_fields)
        .reflect(namespace_writer)
        .applied_objects();
        let job_stream = watcher(
            Api::<PartialObjectMeta<Job>>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(forget_managed_fields)
        .reflect(job_writer)
        .applied_objects();
        let tasks = vec![
            (
                "namespace cache",
                tokio::spawn(drain(namespace_stream, "namespaces")),
            ),
            ("job cache", tokio::spawn(drain(job_stream, "jobs"))),
            (
                "virtual node cache",
                tokio::spawn(drain(node_stream, "virtual nodes")),
            ),
        ];
        let synced = Arc::new(AtomicBool::new(false));
        {
            let (namespaces, jobs, synced) =
                (namespaces.clone(), jobs.clone(), Arc::clone(&synced));
            tokio::spawn(async move {
                if namespaces.wait_until_ready().await.is_ok()
                    && jobs.wait_until_ready().await.is_ok()
                {
                    synced.store(true, Ordering::Release);
                    tracing::info!("namespace and job caches synced");
                }
            });
        }
        let cluster = Self {
            client,
            namespaces,
            jobs,
            nodes,
            synced,
            ledger_namespace: "default".to_owned(),
        };
        (cluster, tasks)
    }

    /// Reads the budget ledgers in `namespace` (the release's own).
    pub fn with_ledger_namespace(mut self, namespace: String) -> Self {
        self.ledger_namespace = namespace;
        self
    }
}

async fn drain<S, T>(stream: S, what: &'static str)
where
    S: futures::Stream<Item = Result<T, watcher::Error>>,
{
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        if let Err(error) = event {
            tracing::warn!(%error, cache = what, "watch error; retrying with backoff");
        }
    }
}

impl ClusterView for KubeCluster {
    async fn namespace_labels(&self, name: &str) -> Result<BTreeMap<String, String>, LookupError> {
        if let Some(namespace) = self.namespaces.get(&ObjectRef::new(name)) {
            return Ok(namespace.metadata.labels.clone().unwrap_or_default());
        }
        let api = Api::<Namespace>::all(self.client.clone());
        let found = direct_get(api.get_metadata_opt(name), || format!("namespace {name}")).await?;
        Ok(found.and_then(|ns| ns.metadata.labels).unwrap_or_default())
    }

    async fn job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<OwningJob>, LookupError> {
        let cached = self.jobs.get(&ObjectRef::new(name).within(namespace));
        // Only the annotations are copied out of the cache, once per review.
        let annotations = match cached {
            Some(job) if job.metadata.uid.as_deref() == Some(uid) => {
                Some(job.metadata.annotations.clone().unwrap_or_default())
            }
            _ => {
                let api = Api::<Job>::namespaced(self.client.clone(), namespace);
                direct_get(api.get_metadata_opt(name), || {
                    format!("Job {namespace}/{name}")
                })
                .await?
                .map(|job| job.metadata)
                .filter(|metadata| metadata.uid.as_deref() == Some(uid))
                .map(|metadata| metadata.annotations.unwrap_or_default())
            }
        };
        Ok(annotations.map(|annotations| OwningJob {
            name: name.to_owned(),
            annotations,
        }))
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn cheapest_gpu_prices(&self) -> BTreeMap<String, f64> {
        lowest_prices(self.nodes.state().iter().filter_map(|node| {
            (node_cloud(&node.metadata) == Some(Cloud::RunPod))
                .then(|| published_prices(&node.metadata))
                .flatten()
        }))
    }

    fn gpu_prices(&self) -> BTreeMap<Cloud, GpuPrices> {
        let nodes = self.nodes.state();
        let mut by_cloud: BTreeMap<Cloud, GpuPrices> = BTreeMap::new();
        if nodes.is_empty() {
            return by_cloud;
        }
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        for node in nodes {
            let Some(cloud) = node_cloud(&node.metadata) else {
                continue;
            };
            let Some(value) = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(runpod_contract::gpus::GPU_PRICES))
            else {
                continue;
            };
            // A node whose controller stopped publishing is not compared.
            let prices = GpuPrices::parse(value);
            if prices.fresh(now) {
                by_cloud.entry(cloud).or_default().merge(prices);
            }
        }
        by_cloud.retain(|_, prices| !prices.is_empty());
        by_cloud
    }

    fn datacenter_gpus(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut offered: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for node in self.nodes.state() {
            if node_cloud(&node.metadata) != Some(Cloud::RunPod) {
                continue;
            }
            let Some(value) = node
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(runpod_contract::volumes::DATACENTER_GPUS))
            else {
                continue;
            };
            for (datacenter, gpus) in runpod_contract::volumes::parse_datacenter_gpus(value) {
                offered.entry(datacenter).or_default().extend(gpus);
            }
        }
        offered
    }

    /// Read directly (rare: only pods that mount a claim), each with the lookups' timeout.
    async fn claim(&self, namespace: &str, name: &str) -> Option<Claimed> {
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let claim = direct_get(claims.get_opt(name), || format!("claim {namespace}/{name}"))
            .await
            .ok()
            .flatten()?;
        let spec = claim.spec?;
        let class_name = spec.storage_class_name?;
        let classes = Api::<StorageClass>::all(self.client.clone());
        let class = direct_get(classes.get_opt(&class_name), || {
            format!("StorageClass {class_name}")
        })
        .await
        .ok()
        .flatten()?;
        // A bound claim's volume is where its PV says, and only there (a static PV names any
        // datacenter, or none: then the controller asks the cloud); an unbound claim's is where
        // its class puts it, if it says.
        let datacenter = match spec.volume_name.filter(|n| !n.is_empty()) {
            Some(pv_name) => {
                let pvs = Api::<PersistentVolume>::all(self.client.clone());
                direct_get(pvs.get_opt(&pv_name), || {
                    format!("PersistentVolume {pv_name}")
                })
                .await
                .ok()
                .flatten()
                .as_ref()
                .and_then(runpod_contract::volumes::pv_datacenter)
            }
            None => class
                .parameters
                .as_ref()
                .and_then(|p| p.get(runpod_contract::volumes::PARAM_DATACENTER))
                .map(|dc| dc.trim().to_owned())
                .filter(|dc| !dc.is_empty()),
        };
        Some(Claimed {
            provisioner: class.provisioner,
            datacenter,
        })
    }

    async fn namespace_annotations(&self, name: &str) -> BTreeMap<String, String> {
        if let Some(namespace) = self.namespaces.get(&ObjectRef::new(name)) {
            return namespace.metadata.annotations.clone().unwrap_or_default();
        }
        // A namespace created a moment ago: one direct read (best effort).
        let api = Api::<Namespace>::all(self.client.clone());
        direct_get(api.get_metadata_opt(name), || format!("namespace {name}"))
            .await
            .ok()
            .flatten()
            .and_then(|ns| ns.metadata.annotations)
            .unwrap_or_default()
    }

    fn served(&self) -> Vec<(Cloud, Served)> {
        self.nodes
            .state()
            .iter()
            .filter_map(|node| {
                let cloud = node_cloud(&node.metadata)?;
                let name = node.metadata.name.as_deref()?;
                let listed = node
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(runpod_contract::teams::SERVES_NAMESPACES));
                Some((cloud, Served::parse(name, listed.map(String::as_str))))
            })
            .collect()
    }

    async fn namespace_spend(&self, namespace: &str) -> Option<f64> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.ledger_namespace);
        let name = runpod_contract::budget::ledger::ledger_name(namespace);
        let found = direct_get(api.get_opt(&name), || format!("ConfigMap {name}"))
            .await
            .ok()?;
        let ledger = found
            .and_then(|map| map.data)
            .map(|data| Ledger::parse(&data))
            .unwrap_or_default();
        Some(ledger.spend().total())
    }
}

/// The cloud a virtual node of ours serves, from its provider label.
fn node_cloud(metadata: &kube::core::ObjectMeta) -> Option<Cloud> {
    metadata
        .labels
        .as_ref()?
        .get(crate::contract::PROVIDER_TAINT_KEY)
        .and_then(|value| Cloud::parse(value))
}

fn published_prices(metadata: &kube::core::ObjectMeta) -> Option<BTreeMap<String, f64>> {
    metadata
        .annotations
        .as_ref()?
        .get(crate::contract::CHEAPEST_GPU_PRICE)
        .map(|value| crate::contract::parse_cheapest_prices(value))
}

/// The caches keep metadata only for labels and annotations; managedFields (often the largest
/// part of an object's metadata) would only cost memory.
fn forget_managed_fields<K: kube::Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The lowest price per key (cloud type, or cloud) across nodes.
fn lowest_prices<K: Ord>(per_node: impl Iterator<Item = BTreeMap<K, f64>>) -> BTreeMap<K, f64> {
    let mut lowest: BTreeMap<K, f64> = BTreeMap::new();
    for prices in per_node {
        for (cloud, price) in prices {
            lowest
                .entry(cloud)
                .and_modify(|current| *current = current.min(price))
                .or_insert(price);
        }
    }
    lowest
}

async fn direct_get<T>(
    request: impl Future<Output = Result<Option<T>, kube::Error>>,
    what: impl Fn() -> String,
) -> Result<Option<T>, LookupError> {
    match tokio::time::timeout(DIRECT_GET_TIMEOUT, request).await {
        Ok(Ok(found)) => Ok(found),
        Ok(Err(error)) => Err(LookupError {
            what: what(),
            reason: error.to_string(),
        }),
        Err(_) => Err(LookupError {
            what: what(),
            reason: format!("no answer within {DIRECT_GET_TIMEOUT:?}"),
        }),
    }
}

/// Shared views (tests keep a handle to flip state while the server runs).
impl<T: ClusterView> ClusterView for Arc<T> {
    fn namespace_labels(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, String>, LookupError>> + Send {
        T::namespace_labels(self, name)
    }

    fn job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<Option<OwningJob>, LookupError>> + Send {
        T::job(self, namespace, name, uid)
    }

    fn synced(&self) -> bool {
        T::synced(self)
    }

    fn cheapest_gpu_prices(&self) -> BTreeMap<String, f64> {
        T::cheapest_gpu_prices(self)
    }

    fn gpu_prices(&self) -> BTreeMap<Cloud, GpuPrices> {
        T::gpu_prices(self)
    }

    fn namespace_annotations(
        &self,
        name: &str,
    ) -> impl Future<Output = BTreeMap<String, String>> + Send {
        T::namespace_annotations(self, name)
    }

    fn served(&self) -> Vec<(Cloud, Served)> {
        T::served(self)
    }

    fn namespace_spend(&self, namespace: &str) -> impl Future<Output = Option<f64>> + Send {
        T::namespace_spend(self, namespace)
    }

    fn claim(&self, namespace: &str, name: &str) -> impl Future<Output = Option<Claimed>> + Send {
        T::claim(self, namespace, name)
    }

    fn datacenter_gpus(&self) -> BTreeMap<String, BTreeSet<String>> {
        T::datacenter_gpus(self)
    }
}

/// A [`ClusterView`] held in memory: for fuzzing, tests and benchmarks of the policy path
/// without an apiserver.
#[derive(Debug, Default)]
pub struct MemoryCluster {
    /// Namespace name → labels.
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// (namespace, name) → (uid, annotations).
    pub jobs: BTreeMap<(String, String), (String, BTreeMap<String, String>)>,
    pub synced: AtomicBool,
    /// Make every lookup fail, as when the apiserver cannot be reached.
    pub fail_lookups: bool,
    /// What the virtual node publishes as the cheapest GPU prices.
    pub cheapest_gpu_prices: BTreeMap<String, f64>,
    /// What each cloud's virtual nodes publish per GPU type.
    pub gpu_prices: BTreeMap<Cloud, GpuPrices>,
    /// Namespace name → annotations.
    pub namespace_annotations: BTreeMap<String, BTreeMap<String, String>>,
    /// The virtual nodes and what they serve.
    pub served: Vec<(Cloud, Served)>,
    /// Namespace name → what its ledger says it spends.
    pub spend: BTreeMap<String, f64>,
    /// `namespace/claim` → its StorageClass's provisioner and volume's datacenter.
    pub claims: BTreeMap<String, Claimed>,
    /// The GPU types each datacenter offers where network volumes are.
    pub datacenter_gpus: BTreeMap<String, BTreeSet<String>>,
}

impl ClusterView for MemoryCluster {
    async fn namespace_labels(&self, name: &str) -> Result<BTreeMap<String, String>, LookupError> {
        if self.fail_lookups {
            return Err(LookupError {
                what: format!("namespace {name}"),
                reason: "lookups disabled".to_owned(),
            });
        }
        Ok(self.namespaces.get(name).cloned().unwrap_or_default())
    }

    async fn job(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<Option<OwningJob>, LookupError> {
        if self.fail_lookups {
            return Err(LookupError {
                what: format!("Job {namespace}/{name}"),
                reason: "lookups disabled".to_owned(),
            });
        }
        Ok(self
            .jobs
            .get(&(namespace.to_owned(), name.to_owned()))
            .filter(|(job_uid, _)| job_uid == uid)
            .map(|(_, annotations)| OwningJob {
                name: name.to_owned(),
                annotations: annotations.clone(),
            }))
    }

    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn cheapest_gpu_prices(&self) -> BTreeMap<String, f64> {
        self.cheapest_gpu_prices.clone()
    }

    fn gpu_prices(&self) -> BTreeMap<Cloud, GpuPrices> {
        self.gpu_prices.clone()
    }

    async fn namespace_annotations(&self, name: &str) -> BTreeMap<String, String> {
        self.namespace_annotations
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    fn served(&self) -> Vec<(Cloud, Served)> {
        self.served.clone()
    }

    async fn namespace_spend(&self, namespace: &str) -> Option<f64> {
        self.spend.get(namespace).copied()
    }

    async fn claim(&self, namespace: &str, name: &str) -> Option<Claimed> {
        self.claims.get(&format!("{namespace}/{name}")).cloned()
    }

    fn datacenter_gpus(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.datacenter_gpus.clone()
    }
}
