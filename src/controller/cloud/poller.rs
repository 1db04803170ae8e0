//! One list of the cloud's instances per interval, shared by every pod: the snapshot every
//! decision is taken on. After each complete list, tagged instances that match no Kubernetes
//! pod are garbage-collected (only once the pod cache has synced; never untagged instances or
//! another cluster's or node's).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::reflector::Store;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::controller::clock::elapsed;
use crate::controller::cloud::usage::UsageWatch;
use crate::controller::context::{Settings, Shared, Snapshot};
use crate::controller::metrics::{ControllerMetrics, StateLabel};
use crate::controller::node::health::ApiHealth;
use crate::provider::{Instance, InstanceState, Provider, ProviderError};

/// The longest a list may take (the client retries inside it).
const LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// How old the cluster-wide list of pod UIDs may be before other nodes' instances are checked
/// against a new one.
const CLUSTER_PODS_MAX_AGE: Duration = Duration::from_secs(300);

/// Consecutive failed lists before the node says the API is unavailable.
const FAILURES_BEFORE_UNAVAILABLE: u32 = 3;

/// Instances of this cluster and node.
pub fn ours<'a>(
    instances: &'a [Instance],
    settings: &'a Settings,
) -> impl Iterator<Item = &'a Instance> + 'a {
    instances.iter().filter(|i| {
        i.tags.cluster_id.as_deref() == Some(settings.cluster_id.as_str())
            && i.tags.node_name.as_deref() == Some(settings.node_name.as_str())
    })
}

/// Live instances of this cluster tagged with another node's name (the node was renamed, or
/// another virtual node of this cluster made them): candidates for garbage collection when
/// their pod exists nowhere in the cluster.
pub fn other_nodes<'a>(
    instances: &'a [Instance],
    settings: &'a Settings,
) -> impl Iterator<Item = &'a Instance> + 'a {
    instances.iter().filter(|i| {
        i.state.is_live()
            && i.tags.pod_uid.is_some()
            && i.tags.cluster_id.as_deref() == Some(settings.cluster_id.as_str())
            && i.tags.node_name.as_deref() != Some(settings.node_name.as_str())
    })
}

/// Live instances tagged with this node's name but another cluster id: `--cluster-id` changed,
/// or another cluster with an explicit id uses the same node name on this account. They are
/// reported, never touched: they may be another cluster's running work. (Two clusters cloned
/// from one etcd backup share the default cluster id, the kube-system UID, and cannot be told
/// apart here: only an explicit `--cluster-id` separates them.)
pub fn foreign<'a>(
    instances: &'a [Instance],
    settings: &'a Settings,
) -> impl Iterator<Item = &'a Instance> + 'a {
    instances.iter().filter(|i| {
        i.state.is_live()
            && i.tags.node_name.as_deref() == Some(settings.node_name.as_str())
            && i.tags.cluster_id.is_some()
            && i.tags.cluster_id.as_deref() != Some(settings.cluster_id.as_str())
    })
}

/// Orphans: live, ours, tagged with a pod UID that no Kubernetes pod on the node has, and seen
/// for longer than the settle time (a pod just bound may not be in this replica's cache yet).
pub fn orphans<'a>(
    snapshot: &'a Snapshot,
    pod_uids: &HashSet<String>,
    first_seen: &HashMap<String, Timestamp>,
    settle: Duration,
) -> Vec<&'a Instance> {
    snapshot
        .instances
        .iter()
        .filter(|i| i.state.is_live())
        .filter(|i| match i.tags.pod_uid.as_deref() {
            Some(uid) => !pod_uids.contains(uid),
            None => false,
        })
        .filter(|i| {
            first_seen
                .get(&i.id)
                .is_some_and(|seen| elapsed(*seen, snapshot.taken_at) >= settle)
        })
        .collect()
}

/// Instances missing from one list are carried forward from the previous one, once: a list that
/// comes back empty or partial (a glitch, a lagging replica of RunPod's database) must not make
/// a running pod look gone. Only an instance missing from two lists in a row is dropped.
/// Returns the instances to publish and the ids carried this time.
pub fn carry_forward(
    previous: &[Instance],
    listed: Vec<Instance>,
    carried_last_time: &HashSet<String>,
) -> (Vec<Instance>, HashSet<String>) {
    let listed_ids: HashSet<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    let missing: Vec<Instance> = previous
        .iter()
        .filter(|i| i.state.is_live())
        .filter(|i| !listed_ids.contains(i.id.as_str()))
        .filter(|i| !carried_last_time.contains(&i.id))
        // Its utilization is the last list's, not a live report: never shown again.
        .map(|i| Instance {
            usage: None,
            ..i.clone()
        })
        .collect();
    let carried = missing.iter().map(|i| i.id.clone()).collect();
    let mut instances = listed;
    instances.extend(missing);
    (instances, carried)
}

/// Runs the list loop until the process stops. `ticks` is told after every complete list so
/// that every pod is reconciled against it.
pub async fn run<P: Provider>(
    shared: Arc<Shared<P>>,
    store: Store<Pod>,
    snapshot_tx: watch::Sender<Option<Arc<Snapshot>>>,
    health: watch::Sender<ApiHealth>,
    ticks: mpsc::Sender<()>,
) {
    let provider = shared.provider.clone();
    let settings = shared.settings.clone();
    let metrics = shared.metrics.clone();
    let mut failures = 0u32;
    let mut first_seen: HashMap<String, Timestamp> = HashMap::new();
    let mut previous: Vec<Instance> = Vec::new();
    let mut previous_taken_at: Option<Timestamp> = None;
    let mut carried: HashSet<String> = HashSet::new();
    let mut reported_foreign: HashSet<String> = HashSet::new();
    let mut cluster_uids: Option<(Timestamp, HashSet<String>)> = None;
    let mut usage = UsageWatch::default();
    let mut interval = tokio::time::interval(settings.reconcile_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let available = matches!(*health.borrow(), ApiHealth::Available);
        metrics.cloud_api_available.set(i64::from(available));
        let started = Timestamp::now();
        debug!("listing RunPod pods");
        // A list that hangs must not stop every later one.
        let listed = match tokio::time::timeout(LIST_TIMEOUT, provider.list()).await {
            Ok(listed) => listed,
            Err(_) => Err(ProviderError::Unavailable(
                "listing RunPod pods timed out".into(),
            )),
        };
        let instances = match listed {
            Ok(instances) => instances,
            Err(error) => {
                failures += 1;
                metrics
                    .lists
                    .get_or_create(&crate::controller::metrics::OutcomeLabel { outcome: "error" })
                    .inc();
                warn!(error = %error, failures, "listing RunPod pods failed");
                usage.outage(&shared);
                let unavailable = match &error {
                    ProviderError::Account(message) => Some(("AccountRefused", message.clone())),
                    ProviderError::Unavailable(message)
                        if failures >= FAILURES_BEFORE_UNAVAILABLE =>
                    {
                        Some(("APIUnreachable", message.clone()))
                    }
                    ProviderError::Unavailable(_) => None,
                };
                if let Some((reason, message)) = unavailable {
                    health.send_if_modified(|current| {
                        let next = ApiHealth::Unavailable {
                            reason: reason.into(),
                            message,
                        };
                        let changed = *current != next;
                        *current = next;
                        changed
                    });
                }
                continue;
            }
        };
        failures = 0;
        metrics
            .lists
            .get_or_create(&crate::controller::metrics::OutcomeLabel { outcome: "ok" })
            .inc();
        health.send_if_modified(|current| {
            let changed = *current != ApiHealth::Available;
            *current = ApiHealth::Available;
            changed
        });
        report_foreign(&shared, &instances, &mut reported_foreign).await;
        let elsewhere: Vec<Instance> = other_nodes(&instances, &settings).cloned().collect();
        let listed: Vec<Instance> = ours(&instances, &settings).cloned().collect();
        let (instances, carried_now) = carry_forward(&previous, listed, &carried);
        if !carried_now.is_empty() {
            debug!(missing = ?carried_now, "instances missing from this list kept for one more list");
        }
        carried = carried_now;
        previous.clone_from(&instances);
        // The list is as of when it was asked for, not when it arrived.
        let snapshot = Arc::new(Snapshot {
            taken_at: started,
            instances,
            confirmed_at: previous_taken_at.replace(started),
        });
        record(&snapshot, &metrics, provider.name());
        for instance in snapshot.instances.iter().chain(&elsewhere) {
            first_seen.entry(instance.id.clone()).or_insert(started);
        }
        first_seen.retain(|id, _| {
            snapshot
                .instances
                .iter()
                .chain(&elsewhere)
                .any(|i| &i.id == id)
        });
        snapshot_tx.send_replace(Some(snapshot.clone()));
        let _ = ticks.try_send(());
        debug!(instances = snapshot.instances.len(), "snapshot published");
        usage.observe(&shared, &store.state(), &snapshot).await;

        // Only once the pod cache has synced: before that every instance looks orphaned.
        let synced = futures_util::FutureExt::now_or_never(store.wait_until_ready())
            .is_some_and(|r| r.is_ok());
        if synced {
            let uids: HashSet<String> = store
                .state()
                .iter()
                .filter_map(|pod| pod.metadata.uid.clone())
                .collect();
            // Memory of pods that are gone (a finished pod's kept log lives until then).
            shared.forget_all_but(&uids);
            let mut collect: Vec<&Instance> =
                orphans(&snapshot, &uids, &first_seen, settings.create_settle);
            // Another node's tag: its pod may be bound anywhere in the cluster, so the whole
            // cluster's pods are listed (only when such an instance has settled).
            let elsewhere_snapshot = Snapshot {
                taken_at: snapshot.taken_at,
                instances: elsewhere,
                confirmed_at: None,
            };
            let settled_elsewhere = orphans(
                &elsewhere_snapshot,
                &HashSet::new(),
                &first_seen,
                settings.create_settle,
            );
            // The cluster's pods are listed again only for an instance whose pod was not
            // there at the last such list, or once that list is old (several virtual nodes of
            // one cluster always have instances here).
            let uid_of = |i: &Instance| i.tags.pod_uid.clone().unwrap_or_default();
            let stale = cluster_uids.as_ref().is_none_or(|(at, known)| {
                elapsed(*at, started) >= CLUSTER_PODS_MAX_AGE
                    || settled_elsewhere
                        .iter()
                        .any(|i| !known.contains(&uid_of(i)))
            });
            if !settled_elsewhere.is_empty() && stale {
                match cluster_pod_uids(&shared.client).await {
                    Ok(uids) => cluster_uids = Some((started, uids)),
                    Err(error) => {
                        warn!(error = %error, "listing the cluster's pods failed; other nodes' RunPod pods are not collected this time")
                    }
                }
            }
            if let Some((listed_at, known)) = &cluster_uids {
                // Only against a list taken after the instance was first seen: its pod
                // existed before it, so a pod missing from that list is really gone.
                collect.extend(settled_elsewhere.into_iter().filter(|i| {
                    !known.contains(&uid_of(i))
                        && first_seen.get(&i.id).is_some_and(|seen| seen <= listed_at)
                }));
            }
            for orphan in collect {
                info!(instance = %orphan.id, pod_uid = ?orphan.tags.pod_uid, node = ?orphan.tags.node_name, "terminating a RunPod pod whose Kubernetes pod is gone");
                match provider
                    .terminate(&orphan.id, orphan.state.termination_ends())
                    .await
                {
                    Ok(()) => {
                        metrics.garbage_collected.inc();
                    }
                    Err(error) => {
                        warn!(instance = %orphan.id, error = %error, "garbage collection failed")
                    }
                }
            }
        }
    }
}

/// Every pod UID in the cluster, on any node.
async fn cluster_pod_uids(client: &kube::Client) -> Result<HashSet<String>, kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = pods.list_metadata(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .filter_map(|pod| pod.metadata.uid)
        .collect())
}

/// Logs, counts and (when the set changes) puts an Event on the node for instances tagged
/// with this node's name but another cluster id.
async fn report_foreign<P>(
    shared: &Shared<P>,
    instances: &[Instance],
    reported: &mut HashSet<String>,
) {
    let found: Vec<&Instance> = foreign(instances, &shared.settings).collect();
    shared
        .metrics
        .foreign_instances
        .set(i64::try_from(found.len()).unwrap_or(i64::MAX));
    let ids: HashSet<String> = found.iter().map(|i| i.id.clone()).collect();
    if ids.is_empty() || ids == *reported {
        *reported = ids;
        return;
    }
    let listed: Vec<String> = found
        .iter()
        .map(|i| {
            format!(
                "{} (cluster {})",
                i.id,
                i.tags.cluster_id.as_deref().unwrap_or("?")
            )
        })
        .collect();
    let message = format!(
        "RunPod pods tagged with this node's name but another cluster id are left alone: {}. \
         If this cluster was cloned from another, or --cluster-id changed, set an explicit \
         --cluster-id and terminate these in RunPod's console if nothing owns them",
        listed.join(", ")
    );
    warn!(instances = ?ids, "RunPod pods of another cluster carry this node's name");
    let node = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(shared.settings.node_name.clone()),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: "ForeignRunPodPods".into(),
        note: Some(message),
        action: "ForeignRunPodPods".into(),
        secondary: None,
    };
    if let Err(error) = shared.recorder.publish(&event, &node).await {
        warn!(error = %error, "could not publish an Event on the node");
    }
    *reported = ids;
}

fn record(snapshot: &Snapshot, metrics: &ControllerMetrics, provider: &'static str) {
    let states = [
        InstanceState::Provisioning,
        InstanceState::Starting,
        InstanceState::Running,
        InstanceState::Exited,
        InstanceState::Error,
        InstanceState::Terminated,
        InstanceState::Unknown,
    ];
    for state in states {
        let count = snapshot
            .instances
            .iter()
            .filter(|i| i.state == state)
            .count();
        metrics
            .pods_by_state
            .get_or_create(&StateLabel {
                state: state.as_str(),
                provider,
            })
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }
    let cost: f64 = snapshot
        .instances
        .iter()
        .filter(|i| i.state.is_live())
        .filter_map(|i| i.cost_per_hour)
        .sum();
    metrics.cost_per_hour.set(cost);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Tags;

    fn instance(id: &str, cluster: &str, node: &str, uid: Option<&str>) -> Instance {
        Instance {
            id: id.into(),
            name: id.into(),
            tags: Tags {
                cluster_id: Some(cluster.into()),
                node_name: Some(node.into()),
                pod_uid: uid.map(str::to_owned),
            },
            state: InstanceState::Running,
            uptime_secs: None,
            cost_per_hour: Some(0.5),
            gpu_type: None,
            datacenter: None,
            endpoints: vec![],
            ip: None,
            created_at: None,
            started_at: None,
            message: None,
            usage: None,
        }
    }

    fn settings() -> Settings {
        Settings {
            node_name: "vr".into(),
            cluster_id: "c1".into(),
            host_ip: "127.0.0.1".into(),
            reconcile_interval: Duration::from_secs(10),
            provision_timeout: Duration::from_secs(900),
            create_settle: Duration::from_secs(30),
            outage_grace: Duration::from_secs(3600),
            admission: Default::default(),
            idle: Default::default(),
        }
    }

    #[test]
    fn only_this_cluster_and_node_are_ours() {
        let all = vec![
            instance("mine", "c1", "vr", Some("u1")),
            instance("other-cluster", "c2", "vr", Some("u1")),
            instance("other-node", "c1", "vr2", Some("u1")),
            Instance {
                tags: Tags::default(),
                ..instance("untagged", "", "", None)
            },
        ];
        let settings = settings();
        let ids: Vec<_> = ours(&all, &settings).map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["mine"]);
    }

    #[test]
    fn another_nodes_instances_are_candidates_and_another_clusters_are_foreign() {
        let mut gone = instance("done", "c1", "old-name", Some("u9"));
        gone.state = InstanceState::Terminated;
        let all = vec![
            instance("mine", "c1", "vr", Some("u1")),
            instance("renamed", "c1", "old-name", Some("u2")),
            gone,
            instance("untagged-pod", "c1", "old-name", None),
            instance("cloned", "c2", "vr", Some("u3")),
            instance("stranger", "c2", "elsewhere", Some("u4")),
        ];
        let settings = settings();
        let ids = |it: Vec<&Instance>| it.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(other_nodes(&all, &settings).collect()), ["renamed"]);
        assert_eq!(ids(foreign(&all, &settings).collect()), ["cloned"]);
    }

    #[test]
    fn orphans_need_a_missing_uid_and_settled_age() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let snapshot = Snapshot {
            taken_at: t1,
            confirmed_at: None,
            instances: vec![
                instance("alive", "c1", "vr", Some("u-alive")),
                instance("orphan", "c1", "vr", Some("u-gone")),
                instance("young", "c1", "vr", Some("u-gone2")),
                instance("no-uid", "c1", "vr", None),
            ],
        };
        let uids: HashSet<String> = ["u-alive".to_owned()].into();
        let seen: HashMap<String, Timestamp> = [
            ("alive".to_owned(), t0),
            ("orphan".to_owned(), t0),
            ("young".to_owned(), t1),
            ("no-uid".to_owned(), t0),
        ]
        .into();
        let found: Vec<_> = orphans(&snapshot, &uids, &seen, Duration::from_secs(30))
            .into_iter()
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(found, ["orphan"]);
    }

    #[test]
    fn an_instance_must_be_missing_from_two_lists_in_a_row_to_be_gone() {
        let a = instance("a", "c1", "n1", Some("u1"));
        let b = instance("b", "c1", "n1", Some("u2"));
        // Both listed.
        let (now, carried) = carry_forward(&[], vec![a.clone(), b.clone()], &HashSet::new());
        assert_eq!(now.len(), 2);
        assert!(carried.is_empty());
        // An empty list: both kept once.
        let (now, carried) = carry_forward(&now, Vec::new(), &carried);
        let ids: HashSet<&str> = now.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, HashSet::from(["a", "b"]));
        assert_eq!(carried.len(), 2);
        // Still missing: gone. `a` came back.
        let ids = |list: &[Instance]| list.iter().map(|i| i.id.clone()).collect::<Vec<_>>();
        let (now, carried) = carry_forward(&now, vec![a.clone()], &carried);
        assert_eq!(ids(&now), ["a"]);
        assert!(carried.is_empty());
        // Terminated instances are not carried.
        let mut done = b.clone();
        done.state = InstanceState::Terminated;
        let (now, _) = carry_forward(&[a.clone(), done], vec![a], &HashSet::new());
        assert_eq!(ids(&now), ["a"]);
    }
}
