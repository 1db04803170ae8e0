//! Burst pods in the cluster's network: the leader keeps one bridge per running burst pod that
//! has an SSH path (see `bridge`). Outbound, a process in the pod reaches the cluster's
//! Services by the names it would use on a local node; which Services, under which addresses,
//! is decided by `runpod_contract::network::plan`. Inbound, a Service that selects the pod gets
//! an EndpointSlice pointing at the leader, which carries each connection to the pod
//! (`slices` decides, `publish` writes). This module watches the cluster (Services, Endpoints,
//! Namespaces) and carries both out every few seconds.

pub(crate) mod bridge;
mod endpoints;
mod guard;
pub(crate) mod policy;
mod publish;
pub(crate) mod slices;

use crate::controller::cached::{self, CachedPod, PodStore};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Endpoints as CoreEndpoints, Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::Resource as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
pub use runpod_contract::network::NetworkSettings;
use runpod_contract::network::{CLUSTER_SERVICES, Selector, ServiceKey, parse_selectors, plan};
use tokio::time::Instant;

use crate::controller::context::Shared;
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::shell;
use crate::provider::Provider;
use bridge::Bridge;
pub use endpoints::{ClusterEndpoints, service_view};
use publish::{Publisher, SliceKey};

/// How often the bridges are brought to the cluster's Services (a new Service is reachable
/// within about this long).
const ROUND: Duration = Duration::from_secs(2);
/// After a failed connection, the next try for that pod: every `RETRY` while it may still be
/// starting, then doubling up to `RETRY_MAX` (a pod without sshd is not asked about forever).
const RETRY: Duration = Duration::from_secs(5);
const RETRY_STEADY: u32 = 12;
const RETRY_MAX: Duration = Duration::from_secs(300);

/// How long after `failures` failed connections in a row the next is tried.
fn retry_after(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(RETRY_STEADY).min(10);
    RETRY.saturating_mul(1 << doublings).min(RETRY_MAX)
}
/// Pods whose bridges are worked on at once in a round: one slow pod does not hold the others.
const CONCURRENT_PODS: usize = 32;

/// The watches of one leadership, stopped with it (a leader that leads again starts anew).
#[derive(Default)]
struct Watches(Vec<tokio::task::AbortHandle>);

impl Drop for Watches {
    fn drop(&mut self) {
        for watch in &self.0 {
            watch.abort();
        }
    }
}

impl Watches {
    /// A watched copy of every object of one kind, kept by a background task.
    fn mirror<K>(&mut self, api: Api<K>) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
    {
        let (reader, writer) = reflector::store();
        // Without `managedFields`: often half an object's memory, and nothing here reads them
        // (these are every Service, Endpoints, Namespace and policy of the cluster).
        let watched = watcher(api, watcher::Config::default())
            .modify(|object: &mut K| object.meta_mut().managed_fields = None);
        let stream = reflector::reflector(writer, watched)
            .default_backoff()
            .applied_objects();
        let task = tokio::spawn(async move {
            futures_util::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        self.0.push(task.abort_handle());
        reader
    }
}

/// Waits for a store's first complete list, saying so while it takes long (RBAC missing).
async fn synced<K>(store: &Store<K>, what: &str)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(30), store.wait_until_ready()).await {
            Ok(_) => return,
            Err(_) => tracing::warn!(
                what,
                "still waiting for the first list of {what} (RBAC?); burst pods are not bridged until then"
            ),
        }
    }
}

/// One pod's bridge, or when to try again.
enum Slot {
    Up(Bridge),
    /// `localhost`: the pod's sshd binds forwards to `127.0.0.1` only (learnt on a connection);
    /// `failures`: connections that failed in a row; `settled`: a bridge of this leader brought
    /// the pod to a plan with nothing in it (its hosts block cleared) and was let go.
    Down {
        retry_at: Instant,
        localhost: bool,
        failures: u32,
        settled: bool,
    },
}

impl Slot {
    fn fresh(localhost: bool) -> Slot {
        Slot::Down {
            retry_at: Instant::now(),
            localhost,
            failures: 0,
            settled: false,
        }
    }
}

/// The cluster as the leader's watches see it.
struct Cluster {
    services: Store<Service>,
    policies: Store<NetworkPolicy>,
    namespaces: Store<Namespace>,
    endpoints: Arc<ClusterEndpoints>,
    /// Who a connection's peer is, for NetworkPolicy rules that name pods.
    peers: Arc<guard::Peers>,
}

/// The leader's bridge loop (returns at once where the network is off or there is no shell).
pub(crate) async fn run<P: Provider>(shared: Arc<Shared<P>>, pods: PodStore) {
    if !shared.settings.network.enabled {
        return;
    }
    if !matches!(shared.settings.exec, ExecAccess::Ready { .. }) {
        tracing::info!(
            "no SSH to the pods on this node: burst pods are not bridged to the cluster"
        );
        return;
    }
    let client = shared.client.clone();
    let mut watches = Watches::default();
    let services = watches.mirror(Api::<Service>::all(client.clone()));
    let endpoints = watches.mirror(Api::<CoreEndpoints>::all(client.clone()));
    let namespaces = watches.mirror(Api::<Namespace>::all(client.clone()));
    let cluster = Cluster {
        services: services.clone(),
        policies: watches.mirror(Api::<NetworkPolicy>::all(client.clone())),
        namespaces: namespaces.clone(),
        peers: Arc::new(guard::Peers::new(client.clone(), namespaces)),
        endpoints: Arc::new(ClusterEndpoints::new(
            services,
            endpoints.clone(),
            shared.settings.host_ip.parse().ok(),
        )),
    };
    // Nothing is decided on a half-read cluster: the first hosts block would be empty, and a
    // policy not yet seen would not be applied. (The node's pods come from the controller's own
    // watch, which says nothing of its first list: a pod it has not listed yet waits a round,
    // and the first sweep of slices waits a full sweep period.)
    synced(&cluster.services, "Services").await;
    synced(&endpoints, "Endpoints").await;
    synced(&cluster.policies, "NetworkPolicies").await;
    synced(&cluster.namespaces, "Namespaces").await;
    let mut publisher = Publisher::new(client).await;
    let mut slots: HashMap<String, Slot> = HashMap::new();
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        cluster.endpoints.refresh();
        let views = cluster.endpoints.views();
        let policies = cluster.policies.state();
        let jobs: Vec<(String, Arc<CachedPod>, Slot)> = pods
            .state()
            .into_iter()
            .filter(|pod| bridged(&shared, pod))
            .filter_map(|pod| {
                let uid = pod.metadata.uid.clone()?;
                let slot = slots.remove(&uid).unwrap_or_else(|| Slot::fresh(false));
                Some((uid, pod, slot))
            })
            .collect();
        let (shared, cluster, views, policies, publisher_ref) =
            (&shared, &cluster, &views, &policies, &publisher);
        let done: Vec<(String, Slot, Inbound)> = futures_util::stream::iter(jobs)
            .map(|(uid, cached, mut slot)| async move {
                let mut slices = Inbound::default();
                // Decoded here, so that at most CONCURRENT_PODS pods are decoded at once.
                let Some(pod) = cached::decode(&cached) else {
                    return (uid, slot, slices);
                };
                let verdict = policy::judge(&pod, policies);
                said_restricted(shared, &pod, &verdict).await;
                outbound(shared, cluster, views, &pod, &mut slot, &verdict).await;
                if let Slot::Up(bridge) = &slot {
                    bridge.set_policy(verdict.clone(), policy::named_ports(&pod));
                }
                if !verdict
                    .ingress
                    .as_ref()
                    .is_some_and(policy::Restriction::denies_all)
                {
                    inbound(shared, cluster, publisher_ref, &pod, &mut slot, &mut slices).await;
                } else if let Slot::Up(bridge) = &mut slot {
                    bridge
                        .expose(&BTreeSet::new(), std::net::Ipv4Addr::UNSPECIFIED.into())
                        .await;
                }
                (uid, slot, slices)
            })
            .buffer_unordered(CONCURRENT_PODS)
            .collect()
            .await;
        // Pods gone since the last round: their bridges are dropped here (and disconnect).
        slots.clear();
        let mut slices = HashMap::new();
        let mut bursts = endpoints::BurstBackends::new();
        for (uid, slot, pod_inbound) in done {
            slots.insert(uid, slot);
            slices.extend(pod_inbound.slices);
            for (key, listeners) in pod_inbound.backends {
                bursts.entry(key).or_default().extend(listeners);
            }
        }
        cluster.endpoints.set_bursts(bursts);
        publisher.publish(slices).await;
    }
}

/// Connects the pod's bridge where it is down (and due), and brings its remote forwards and
/// hosts block to the plan.
async fn outbound<P: Provider>(
    shared: &Shared<P>,
    cluster: &Cluster,
    views: &[runpod_contract::network::ServiceView],
    pod: &Pod,
    slot: &mut Slot,
    verdict: &policy::Verdict,
) {
    let settings = &shared.settings.network;
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let asked = asked(shared, &cluster.namespaces, pod, &namespace).await;
    let mut plan = plan(
        &namespace,
        &asked,
        &settings.allowed,
        views,
        &settings.cluster_domain,
    );
    if verdict
        .egress
        .as_ref()
        .is_some_and(policy::Restriction::denies_all)
    {
        plan.forwards.clear();
        plan.hosts.clear();
    }
    if !plan.refused.is_empty() {
        let refused: Vec<String> = plan.refused.iter().map(ToString::to_string).collect();
        shared
            .event(
                &pod.object_ref(&()),
                true,
                "ClusterServicesRefused",
                format!(
                    "namespace {namespace}'s {CLUSTER_SERVICES} asks for {} outside what this installation allows (--cluster-services-allowed); those Services are not reachable from the pod",
                    refused.join(", ")
                ),
            )
            .await;
    }
    if let Slot::Up(bridge) = slot
        && bridge.is_closed().await
    {
        tracing::info!(namespace, pod = %name, "the pod's bridge connection dropped; reconnecting");
        *slot = Slot::fresh(bridge.on_localhost());
    }
    // A pod that reaches no Service and that no Service selects needs no connection (an SSH
    // session per running pod is most of what a thousand pods cost in memory), once a bridge
    // of this leader has cleared what an earlier one may have written into it.
    let idle = plan.forwards.is_empty() && plan.hosts.is_empty() && !selected(cluster, pod);
    if let Slot::Down {
        retry_at,
        localhost,
        failures,
        settled,
    } = slot
    {
        if Instant::now() < *retry_at || (*settled && idle) {
            return;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let endpoints = cluster.endpoints.clone();
        let guard = Arc::new(guard::Guard::new(cluster.peers.clone()));
        match connect(
            shared,
            pod,
            &namespace,
            &name,
            &uid,
            (endpoints, guard),
            *localhost,
        )
        .await
        {
            Ok(bridge) => *slot = Slot::Up(bridge),
            Err(reason) => {
                tracing::debug!(namespace, pod = %name, %reason, "no bridge yet");
                *failures = failures.saturating_add(1);
                let wait = retry_after(*failures);
                *retry_at = Instant::now() + wait;
                return;
            }
        }
    }
    if let Slot::Up(bridge) = slot {
        let applied = bridge.apply(&plan).await;
        for problem in &applied.problems {
            tracing::warn!(namespace, pod = %name, %problem, "the pod's bridge");
        }
        if applied.sshd_binds_localhost {
            // Its forwards listen where the names do not point: start again on 127.0.0.1.
            tracing::info!(namespace, pod = %name, "the pod's sshd binds remote forwards to 127.0.0.1 only (GatewayPorts no): one Service per port, on 127.0.0.1");
            *slot = Slot::fresh(true);
        } else if idle && applied.problems.is_empty() {
            *slot = Slot::Down {
                retry_at: Instant::now(),
                localhost: bridge.on_localhost(),
                failures: 0,
                settled: true,
            };
        }
    }
}

/// What one pod's inbound round found: the slices that point at its listeners, and, while it
/// is Ready and its bridge up, the listeners behind each (Service, port) for other burst pods.
#[derive(Default)]
struct Inbound {
    slices: HashMap<SliceKey, serde_json::Value>,
    backends: endpoints::BurstBackends,
}

/// Listens for the pod's ports that Services selecting it target, and adds the slices that
/// point there (ready while the pod is Ready and its bridge is up; a pod whose bridge is down
/// keeps its last slices, not ready).
/// Whether a Service of the cluster selects `pod` (its inbound listeners need the bridge).
fn selected(cluster: &Cluster, pod: &Pod) -> bool {
    cluster
        .services
        .state()
        .iter()
        .any(|service| slices::selects(service, pod))
}

async fn inbound<P: Provider>(
    shared: &Shared<P>,
    cluster: &Cluster,
    publisher: &Publisher,
    pod: &Pod,
    slot: &mut Slot,
    found: &mut Inbound,
) {
    let slices = &mut found.slices;
    let Ok(address) = shared.settings.host_ip.parse::<std::net::IpAddr>() else {
        return;
    };
    let selecting: Vec<Arc<Service>> = cluster
        .services
        .state()
        .into_iter()
        .filter(|service| slices::selects(service, pod))
        .collect();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let key = |service: &Service| {
        (
            service.metadata.namespace.clone().unwrap_or_default(),
            slices::slice_name(service.metadata.name.as_deref().unwrap_or_default(), &uid),
        )
    };
    let Slot::Up(bridge) = slot else {
        for service in &selecting {
            let key = key(service);
            if let Some(mut last) = publisher.applied(&key).cloned() {
                last["endpoints"][0]["conditions"]["ready"] = serde_json::json!(false);
                slices.insert(key, last);
            }
        }
        return;
    };
    let targets: BTreeSet<u16> = selecting
        .iter()
        .flat_map(|service| service.spec.iter().flat_map(|s| s.ports.iter().flatten()))
        .filter_map(|port| slices::target_port(port, pod))
        .collect();
    for problem in bridge.expose(&targets, address).await {
        tracing::warn!(pod = %uid, %problem, "the pod's inbound listeners");
    }
    let ready = pod_ready(pod);
    for service in &selecting {
        if ready
            && let (Some(namespace), Some(name)) = (
                service.metadata.namespace.clone(),
                service.metadata.name.clone(),
            )
        {
            let key = ServiceKey { namespace, name };
            let this = pod
                .metadata
                .namespace
                .clone()
                .zip(pod.metadata.name.clone());
            for (port, target, listener) in
                slices::burst_ports(service, pod, |target| bridge.inbound_port(target))
            {
                found
                    .backends
                    .entry((key.clone(), port))
                    .or_default()
                    .push(guard::Candidate {
                        dial: std::net::SocketAddr::new(address, listener),
                        ip: None,
                        pod: this.clone(),
                        port: target,
                    });
            }
        }
        let body = slices::slice(
            service,
            pod,
            address,
            |target| bridge.inbound_port(target),
            ready,
            &publisher.api_version(),
        );
        if let Some(body) = body {
            slices.insert(key(service), body);
        }
    }
}

/// Says (once per message) which NetworkPolicies the bridge applies to the pod, and how.
async fn said_restricted<P: Provider>(shared: &Shared<P>, pod: &Pod, verdict: &policy::Verdict) {
    let cloud = shared.provider.cloud().title;
    for (restriction, direction, what, address) in [
        (
            &verdict.egress,
            "egress",
            "outbound connections to the cluster's Services",
            "the endpoint it dials",
        ),
        (
            &verdict.ingress,
            "ingress",
            "connections from the cluster's Services to it",
            "the connection's source as the controller sees it (kube-proxy may have replaced it with a node's address)",
        ),
    ] {
        let Some(restriction) = restriction else {
            continue;
        };
        let names = restriction.by.join(", ");
        let (warning, message) = if restriction.denies_all() {
            (
                false,
                format!(
                    "NetworkPolicy {names} selects this pod and allows no {direction}: the bridge to {cloud} carries no {what} (docs/networking.md)"
                ),
            )
        } else {
            let blocks = if restriction.has_ip_blocks() {
                format!(", and ipBlock against {address}")
            } else {
                String::new()
            };
            (
                restriction.has_ip_blocks() && direction == "ingress",
                format!(
                    "NetworkPolicy {names} selects this pod and restricts its {direction}: the bridge to {cloud} carries only the {what} that their rules allow, judged per TCP connection (peer pods by their labels and their namespace's labels, ports{blocks}; docs/networking.md)"
                ),
            )
        };
        shared
            .event(
                &pod.object_ref(&()),
                warning,
                "NetworkPolicyApplied",
                message,
            )
            .await;
    }
}

#[cfg(test)]
#[test]
fn a_pod_that_never_answers_is_asked_less_and_less() {
    assert_eq!(retry_after(1), RETRY);
    assert_eq!(retry_after(RETRY_STEADY), RETRY);
    assert_eq!(retry_after(RETRY_STEADY + 1), RETRY * 2);
    assert_eq!(retry_after(RETRY_STEADY + 3), RETRY * 8);
    assert_eq!(retry_after(u32::MAX), RETRY_MAX);
}

/// The pod's Ready condition.
fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether `pod` gets a bridge: running on its instance, with an SSH path (not `ports: none`).
fn bridged<P: Provider>(shared: &Shared<P>, pod: &CachedPod) -> bool {
    pod.phase() == Some("Running")
        && !runpod_contract::exposes_nothing(
            pod.metadata.annotations.as_ref(),
            shared.settings.admission.expose_no_ports,
        )
}

/// What the pod's namespace asks for beyond its own Services (a bad value: nothing, with an
/// Event saying why).
async fn asked<P: Provider>(
    shared: &Shared<P>,
    namespaces: &Store<Namespace>,
    pod: &Pod,
    namespace: &str,
) -> Vec<Selector> {
    let Some(value) = namespaces
        .get(&reflector::ObjectRef::new(namespace))
        .and_then(|ns| {
            ns.metadata
                .annotations
                .as_ref()?
                .get(CLUSTER_SERVICES)
                .cloned()
        })
    else {
        return Vec::new();
    };
    match parse_selectors(&value) {
        Ok(selectors) => selectors,
        Err(problem) => {
            shared
                .event(
                    &pod.object_ref(&()),
                    true,
                    "ClusterServicesInvalid",
                    format!("namespace {namespace}'s {CLUSTER_SERVICES}: {problem}; only the namespace's own Services are reachable"),
                )
                .await;
            Vec::new()
        }
    }
}

async fn connect<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    namespace: &str,
    name: &str,
    uid: &str,
    (endpoints, guard): (Arc<ClusterEndpoints>, Arc<guard::Guard>),
    localhost: bool,
) -> Result<Bridge, String> {
    let reach = shell::reach(shared, pod, namespace, name)
        .await
        .map_err(|refusal| refusal.message)?;
    let bridge = Bridge::open(&reach, uid, endpoints, guard, localhost)
        .await
        .map_err(|error| error.to_string())?;
    tracing::info!(namespace, pod = %name, "bridge to the cluster's Services connected");
    Ok(bridge)
}
