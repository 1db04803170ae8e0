//! Burst pods in the cluster's network, outbound: the leader keeps one bridge per running burst
//! pod that has an SSH path (see `bridge`), so that a process in the pod reaches the cluster's
//! Services by the names it would use on a local node. Which Services a pod reaches and under
//! which addresses is decided by `runpod_contract::network::plan`; this module only watches
//! the cluster (Services, Endpoints, Namespaces) and carries the plan out, every few seconds.

pub mod bridge;
mod endpoints;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Endpoints as CoreEndpoints, Namespace, Pod, Service};
use kube::Api;
use kube::Resource as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
pub use runpod_contract::network::NetworkSettings;
use runpod_contract::network::{CLUSTER_SERVICES, Selector, parse_selectors, plan};
use tokio::time::Instant;

use crate::controller::context::Shared;
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::shell;
use crate::provider::Provider;
use bridge::Bridge;
pub use endpoints::{ClusterEndpoints, service_view};

/// How often the bridges are brought to the cluster's Services (a new Service is reachable
/// within about this long).
const ROUND: Duration = Duration::from_secs(2);
/// After a failed connection, the next try for that pod.
const RETRY: Duration = Duration::from_secs(10);

/// A watched copy of every object of one kind, kept by a background task.
fn mirror<K>(api: Api<K>) -> Store<K>
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
    let stream = reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader
}

/// One pod's bridge, or when to try again.
enum Slot {
    Up(Bridge),
    Down { retry_at: Instant },
}

/// The leader's bridge loop (returns at once where the network is off or there is no shell).
pub async fn run<P: Provider>(shared: Arc<Shared<P>>, pods: Store<Pod>) {
    let settings = shared.settings.network.clone();
    if !settings.enabled {
        return;
    }
    if !matches!(shared.settings.exec, ExecAccess::Ready { .. }) {
        tracing::info!("no SSH to the pods on this node: burst pods do not reach cluster Services");
        return;
    }
    let client = shared.client.clone();
    let services = mirror(Api::<Service>::all(client.clone()));
    let endpoints = mirror(Api::<CoreEndpoints>::all(client.clone()));
    let namespaces = mirror(Api::<Namespace>::all(client));
    let cluster = Arc::new(ClusterEndpoints {
        services: services.clone(),
        endpoints: endpoints.clone(),
    });
    let mut slots: HashMap<String, Slot> = HashMap::new();
    let mut tick = tokio::time::interval(ROUND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let views = cluster.views();
        let mut live = std::collections::HashSet::new();
        for pod in pods.state() {
            if !bridged(&shared, &pod) {
                continue;
            }
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            live.insert(uid.clone());
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let asked = asked(&shared, &namespaces, &pod, &namespace).await;
            let plan = plan(
                &namespace,
                &asked,
                &settings.allowed,
                &views,
                &settings.cluster_domain,
            );
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
            let slot = slots.entry(uid.clone()).or_insert(Slot::Down {
                retry_at: Instant::now(),
            });
            if let Slot::Up(bridge) = slot
                && bridge.is_closed()
            {
                tracing::info!(namespace, pod = %name, "the pod's bridge connection dropped; reconnecting");
                *slot = Slot::Down {
                    retry_at: Instant::now(),
                };
            }
            if let Slot::Down { retry_at } = slot {
                if Instant::now() < *retry_at {
                    continue;
                }
                match connect(&shared, &pod, &namespace, &name, &uid, cluster.clone()).await {
                    Ok(bridge) => *slot = Slot::Up(bridge),
                    Err(reason) => {
                        tracing::debug!(namespace, pod = %name, %reason, "no bridge yet");
                        *retry_at = Instant::now() + RETRY;
                        continue;
                    }
                }
            }
            if let Slot::Up(bridge) = slot {
                for problem in bridge.apply(&plan).await {
                    tracing::warn!(namespace, pod = %name, %problem, "the pod's bridge");
                }
            }
        }
        slots.retain(|uid, _| live.contains(uid));
    }
}

/// Whether `pod` gets a bridge: running on its instance, with an SSH path (not `ports: none`).
fn bridged<P: Provider>(shared: &Shared<P>, pod: &Pod) -> bool {
    let running = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| phase == "Running");
    running
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
    endpoints: Arc<ClusterEndpoints>,
) -> Result<Bridge, String> {
    let reach = shell::reach(shared, pod, namespace, name)
        .await
        .map_err(|refusal| refusal.message)?;
    let bridge = Bridge::open(&reach, uid, endpoints)
        .await
        .map_err(|error| error.to_string())?;
    tracing::info!(namespace, pod = %name, "bridge to the cluster's Services connected");
    Ok(bridge)
}
