//! Garbage collection after each complete list: instances this node made whose pod is gone,
//! instances of this cluster tagged with another node's name whose pod exists nowhere in the
//! cluster, and (reported, never touched) instances of another cluster carrying this node's
//! name. The choices are pure; `Collector` keeps what they need between lists and carries
//! them out.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use tracing::{info, warn};

use crate::controller::clock::elapsed;
use crate::controller::context::{Settings, Shared, Snapshot};
use crate::provider::{Instance, Provider};

/// How old the cluster-wide list of pod UIDs may be before other nodes' instances are checked
/// against a new one.
const CLUSTER_PODS_MAX_AGE: Duration = Duration::from_secs(300);

/// Live instances of this cluster tagged with another node's name (the node was renamed, or
/// another virtual node of this cluster made them): candidates for garbage collection when
/// their pod exists nowhere in the cluster.
pub(crate) fn other_nodes<'a>(
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
pub(crate) fn foreign<'a>(
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
/// for longer than the settle time (a pod just bound may not be in this replica's cache yet),
/// or at once when this replica saw that pod leave (`departed`: a UID never comes back, so no
/// cache lag can explain its absence, and its instance bills until collected) and did not
/// terminate the instance itself (a list may lag behind that DELETE; a second would take
/// quota).
/// Only instances the list showed: one it omitted is carried from the previous list, and is
/// mostly gone already (its pod's own DELETE went just before); a second DELETE would take
/// quota that waiting calls need.
pub(crate) fn orphans<'a>(
    snapshot: &'a Snapshot,
    pod_uids: &HashSet<String>,
    first_seen: &HashMap<String, Timestamp>,
    settle: Duration,
    carried: &HashSet<String>,
    departed: &Departed,
) -> Vec<&'a Instance> {
    snapshot
        .instances
        .iter()
        .filter(|i| i.state.is_live() && !carried.contains(&i.id))
        .filter(|i| match i.tags.pod_uid.as_deref() {
            Some(uid) => !pod_uids.contains(uid),
            None => false,
        })
        .filter(|i| {
            departed.collect_at_once(i)
                || first_seen
                    .get(&i.id)
                    .is_some_and(|seen| elapsed(*seen, snapshot.taken_at) >= settle)
        })
        .collect()
}

/// How long a departed pod's UID is remembered: far longer than any list lag, while the set
/// stays small (one entry per pod deleted in that time).
const DEPARTED_KEPT: Duration = Duration::from_secs(3600);

/// The pods this replica saw leave the node, and the instances it terminated for them.
#[derive(Debug, Default)]
pub(crate) struct Departed {
    /// The node's pod UIDs at the last look.
    known: HashSet<String>,
    /// UIDs that left, and when.
    uids: HashMap<String, Timestamp>,
    /// Instances terminated for pods that left, and when their pod's memory was dropped.
    terminated: HashMap<String, Timestamp>,
}

impl Departed {
    /// Notes the UIDs that were on the node at the last look and are not now, and the
    /// instances terminated for them; forgets what is older than `DEPARTED_KEPT`.
    pub(crate) fn note(
        &mut self,
        now_uids: &HashSet<String>,
        terminated: HashSet<String>,
        now: Timestamp,
    ) {
        for uid in self.known.difference(now_uids) {
            self.uids.entry(uid.clone()).or_insert(now);
        }
        for id in terminated {
            self.terminated.entry(id).or_insert(now);
        }
        self.uids.retain(|_, at| elapsed(*at, now) < DEPARTED_KEPT);
        self.terminated
            .retain(|_, at| elapsed(*at, now) < DEPARTED_KEPT);
        self.known.clone_from(now_uids);
    }

    /// Whether this replica terminated `instance` for a pod that left (a list may lag behind
    /// that DELETE).
    fn terminated_here(&self, instance: &Instance) -> bool {
        self.terminated.contains_key(&instance.id)
    }

    /// Whether `instance` belongs to a pod that left, and was not terminated here.
    fn collect_at_once(&self, instance: &Instance) -> bool {
        instance
            .tags
            .pod_uid
            .as_deref()
            .is_some_and(|uid| self.uids.contains_key(uid))
            && !self.terminated.contains_key(&instance.id)
    }
}

/// Whether the cluster's pods must be listed again for the settled instances of other nodes:
/// never listed, the list is old, or one of them names a pod that list did not have (several
/// virtual nodes of one cluster always have instances here, so not at every round).
pub(crate) fn cluster_list_due(
    listed: Option<&(Timestamp, HashSet<String>)>,
    settled_elsewhere: &[&Instance],
    now: Timestamp,
) -> bool {
    if settled_elsewhere.is_empty() {
        return false;
    }
    listed.is_none_or(|(at, known)| {
        elapsed(*at, now) >= CLUSTER_PODS_MAX_AGE
            || settled_elsewhere
                .iter()
                .any(|i| !known.contains(&uid_of(i)))
    })
}

/// This node's instances whose pod is missing from the node's pods but that are neither
/// settled nor seen leaving (`orphans` does not take them yet): a pod deleted while this
/// replica was not leading (or not running). The cluster's pods, listed afresh, decide at once
/// instead of after the settle time: an instance's pod existed before it, so a pod missing
/// from a list taken after the instance was seen is gone, and its instance bills for nothing.
/// One this replica terminated itself is left alone (a list may lag behind that DELETE).
pub(crate) fn unsettled_orphans<'a>(
    snapshot: &'a Snapshot,
    pod_uids: &HashSet<String>,
    first_seen: &HashMap<String, Timestamp>,
    carried: &HashSet<String>,
    departed: &Departed,
    collected: &[&Instance],
) -> Vec<&'a Instance> {
    orphans(
        snapshot,
        pod_uids,
        first_seen,
        Duration::ZERO,
        carried,
        &Departed::default(),
    )
    .into_iter()
    .filter(|i| !departed.terminated_here(i))
    .filter(|i| !collected.iter().any(|c| c.id == i.id))
    .collect()
}

/// Instances (another node's, or this node's unsettled orphans) whose pod is missing from a
/// cluster list taken after the instance was first seen (its pod existed before it, so a pod
/// missing from that list is really gone).
pub(crate) fn gone_elsewhere<'a>(
    settled_elsewhere: Vec<&'a Instance>,
    listed: &(Timestamp, HashSet<String>),
    first_seen: &HashMap<String, Timestamp>,
) -> Vec<&'a Instance> {
    let (listed_at, known) = listed;
    settled_elsewhere
        .into_iter()
        .filter(|i| {
            !known.contains(&uid_of(i))
                && first_seen.get(&i.id).is_some_and(|seen| seen <= listed_at)
        })
        .collect()
}

fn uid_of(instance: &Instance) -> String {
    instance.tags.pod_uid.clone().unwrap_or_default()
}

/// What garbage collection remembers between lists.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    /// When each listed instance (ours and other nodes') was first seen.
    first_seen: HashMap<String, Timestamp>,
    /// Another cluster's instances already reported.
    reported_foreign: HashSet<String>,
    /// The cluster's pod UIDs and when they were listed.
    cluster_uids: Option<(Timestamp, HashSet<String>)>,
    /// Pods this replica saw leave the node.
    departed: Departed,
    /// Instances this collector terminated, and when: a lagging list may show them a while
    /// yet, and a second DELETE (or a cluster list for them) would spend quota for nothing.
    /// Asked again once a settle time has passed, should the first not have taken.
    collected: HashMap<String, Timestamp>,
}

impl Collector {
    /// Notes when each instance of a new list was first seen; forgets the ones no longer listed.
    pub(crate) fn see(&mut self, snapshot: &Snapshot, elsewhere: &[Instance]) {
        for instance in snapshot.instances.iter().chain(elsewhere) {
            self.first_seen
                .entry(instance.id.clone())
                .or_insert(snapshot.taken_at);
        }
        self.first_seen.retain(|id, _| {
            snapshot
                .instances
                .iter()
                .chain(elsewhere)
                .any(|i| &i.id == id)
        });
        let first_seen = &self.first_seen;
        self.collected.retain(|id, _| first_seen.contains_key(id));
    }

    /// Whether this collector terminated `instance` less than `settle` before `now`.
    fn collected_lately(&self, instance: &Instance, settle: Duration, now: Timestamp) -> bool {
        self.collected
            .get(&instance.id)
            .is_some_and(|at| elapsed(*at, now) < settle)
    }

    /// Notes the pods that left the node since the last look (`pod_uids` is the node's pods
    /// now), and the instances this leader terminated for them.
    pub(crate) fn departed(
        &mut self,
        pod_uids: &HashSet<String>,
        terminated: HashSet<String>,
        now: Timestamp,
    ) {
        self.departed.note(pod_uids, terminated, now);
    }

    /// Terminates what the list shows to be garbage: this node's orphans, and other nodes'
    /// instances whose pod exists nowhere in the cluster; never one this list did not show
    /// (`carried` forward from the last one).
    pub(crate) async fn collect<P: Provider>(
        &mut self,
        shared: &Shared<P>,
        pod_uids: &HashSet<String>,
        snapshot: &Snapshot,
        carried: &HashSet<String>,
        elsewhere: Vec<Instance>,
    ) {
        let settle = shared.settings.create_settle;
        let mut collect: Vec<&Instance> = orphans(
            snapshot,
            pod_uids,
            &self.first_seen,
            settle,
            carried,
            &self.departed,
        );
        let elsewhere_snapshot = Snapshot {
            taken_at: snapshot.taken_at,
            instances: elsewhere,
            confirmed_at: None,
        };
        let mut settled_elsewhere = orphans(
            &elsewhere_snapshot,
            &HashSet::new(),
            &self.first_seen,
            settle,
            &HashSet::new(),
            &Departed::default(),
        );
        settled_elsewhere.extend(unsettled_orphans(
            snapshot,
            pod_uids,
            &self.first_seen,
            carried,
            &self.departed,
            &collect,
        ));
        let now = snapshot.taken_at;
        settled_elsewhere.retain(|i| !self.collected_lately(i, settle, now));
        if cluster_list_due(
            self.cluster_uids.as_ref(),
            &settled_elsewhere,
            snapshot.taken_at,
        ) {
            match cluster_pod_uids(&shared.client).await {
                Ok(uids) => self.cluster_uids = Some((snapshot.taken_at, uids)),
                Err(error) => {
                    warn!(error = %error, cloud = shared.provider.name(), "listing the cluster's pods failed; other nodes' instances are not collected this time")
                }
            }
        }
        if let Some(listed) = &self.cluster_uids {
            collect.extend(gone_elsewhere(settled_elsewhere, listed, &self.first_seen));
        }
        collect.retain(|i| !self.collected_lately(i, settle, now));
        // All at once: each waits in the rate limiter by what it ends (a running orphan's
        // GPU before any stopped instance's storage), not behind the one before it.
        let terminations = collect.into_iter().map(|orphan| async move {
            info!(instance = %orphan.id, cloud = shared.provider.name(), pod_uid = ?orphan.tags.pod_uid, node = ?orphan.tags.node_name, "terminating an instance whose Kubernetes pod is gone");
            match shared
                .provider
                .terminate(&orphan.id, orphan.state.termination_ends())
                .await
            {
                Ok(()) => {
                    shared.metrics.garbage_collected.inc();
                    Some(orphan.id.clone())
                }
                Err(error) => {
                    warn!(instance = %orphan.id, error = %error, "garbage collection failed");
                    None
                }
            }
        });
        let ended: Vec<String> = futures_util::future::join_all(terminations)
            .await
            .into_iter()
            .flatten()
            .collect();
        // From when the DELETEs were answered: they may have waited in the pacer for longer
        // than the settle time.
        let answered = Timestamp::now();
        for id in ended {
            self.collected.insert(id, answered);
        }
    }

    /// Logs, counts and (when the set changes) puts an Event on the node for instances tagged
    /// with this node's name but another cluster id.
    pub(crate) async fn report_foreign<P: Provider>(
        &mut self,
        shared: &Shared<P>,
        instances: &[Instance],
    ) {
        let reported = &mut self.reported_foreign;
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
            "{}s tagged with this node's name but another cluster id are left alone: {}. \
             If this cluster was cloned from another, or --cluster-id changed, set an explicit \
             --cluster-id and terminate these in {}'s console if nothing owns them",
            shared.provider.instance_noun(),
            listed.join(", "),
            shared.provider.cloud().title
        );
        warn!(instances = ?ids, cloud = shared.provider.name(), "instances of another cluster carry this node's name");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{instance, settings};
    use crate::provider::InstanceState;

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
        let found: Vec<_> = orphans(
            &snapshot,
            &uids,
            &seen,
            Duration::from_secs(30),
            &HashSet::new(),
            &Departed::default(),
        )
        .into_iter()
        .map(|i| i.id.as_str())
        .collect();
        assert_eq!(found, ["orphan"]);
        // Carried forward from the last list (this one omitted it): not collected now.
        let carried: HashSet<String> = ["orphan".to_owned()].into();
        let none = Departed::default();
        assert!(
            orphans(
                &snapshot,
                &uids,
                &seen,
                Duration::from_secs(30),
                &carried,
                &none
            )
            .is_empty()
        );
        // A pod this replica saw leave: its instance goes at once, however new to the list,
        // unless this leader terminated it already (the list lags behind that DELETE).
        let mut departed = Departed::default();
        let all: HashSet<String> = ["u-alive", "u-gone", "u-gone2", "u-ended"]
            .iter()
            .map(|u| (*u).to_owned())
            .collect();
        departed.note(&all, HashSet::new(), t0);
        departed.note(&uids, ["ended".to_owned()].into(), t1);
        let mut with_ended = snapshot.clone();
        with_ended
            .instances
            .push(instance("ended", "c1", "vr", Some("u-ended")));
        let found: Vec<_> = orphans(
            &with_ended,
            &uids,
            &seen,
            Duration::from_secs(30),
            &HashSet::new(),
            &departed,
        )
        .into_iter()
        .map(|i| i.id.as_str())
        .collect();
        assert_eq!(found, ["orphan", "young"]);
    }

    #[test]
    fn a_new_leader_asks_the_cluster_about_an_unsettled_orphan_at_once() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let snapshot = Snapshot {
            taken_at: t0,
            confirmed_at: None,
            instances: vec![
                instance("alive", "c1", "vr", Some("u-alive")),
                instance("fresh", "c1", "vr", Some("u-gone")),
                instance("ended-here", "c1", "vr", Some("u-ended")),
                instance("settled", "c1", "vr", Some("u-old")),
            ],
        };
        let uids: HashSet<String> = ["u-alive".to_owned()].into();
        let seen: HashMap<String, Timestamp> = snapshot
            .instances
            .iter()
            .map(|i| (i.id.clone(), t0))
            .collect();
        let mut departed = Departed::default();
        departed.note(&uids, ["ended-here".to_owned()].into(), t0);
        let collected = [&snapshot.instances[3]];
        let found = unsettled_orphans(
            &snapshot,
            &uids,
            &seen,
            &HashSet::new(),
            &departed,
            &collected,
        );
        let ids =
            |found: Vec<&Instance>| -> Vec<String> { found.iter().map(|i| i.id.clone()).collect() };
        assert_eq!(ids(found.clone()), ["fresh"]);
        // A fresh cluster list without its pod: gone, collected now. With it (this replica's
        // cache lags): left alone.
        let without: (Timestamp, HashSet<String>) = (t0, uids.clone());
        assert_eq!(
            ids(gone_elsewhere(found.clone(), &without, &seen)),
            ["fresh"]
        );
        let with: (Timestamp, HashSet<String>) = (t0, ["u-gone".to_owned()].into());
        assert!(gone_elsewhere(found.clone(), &with, &seen).is_empty());
        assert!(!cluster_list_due(Some(&with), &found, t0));
        assert!(cluster_list_due(Some(&without), &found, t0));
    }

    /// A lagging list shows an instance the collector just terminated: no second DELETE
    /// until a settle time has passed, and nothing kept once no list shows it.
    #[test]
    fn an_instance_the_collector_ended_is_left_alone_for_a_settle_time() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let soon: Timestamp = "2026-01-01T00:00:20Z".parse().unwrap();
        let settled: Timestamp = "2026-01-01T00:00:31Z".parse().unwrap();
        let settle = Duration::from_secs(30);
        let ended = instance("ended", "c", "n", Some("u-gone"));
        let snapshot = |taken_at, instances| Snapshot {
            taken_at,
            instances,
            confirmed_at: None,
        };
        let mut collector = Collector::default();
        collector.see(&snapshot(t0, vec![ended.clone()]), &[]);
        assert!(!collector.collected_lately(&ended, settle, t0));
        collector.collected.insert("ended".to_owned(), t0);
        collector.see(&snapshot(soon, vec![ended.clone()]), &[]);
        assert!(collector.collected_lately(&ended, settle, soon));
        assert!(
            !collector.collected_lately(&ended, settle, settled),
            "asked again should the first DELETE not have taken"
        );
        collector.see(&snapshot(settled, Vec::new()), &[]);
        assert!(
            collector.collected.is_empty(),
            "forgotten once no list shows it"
        );
    }

    #[test]
    fn departures_are_the_uids_that_left_and_are_kept_an_hour() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-01-01T00:59:00Z".parse().unwrap();
        let past: Timestamp = "2026-01-01T01:00:01Z".parse().unwrap();
        let mut departed = Departed::default();
        let uids = |list: &[&str]| list.iter().map(|u| (*u).to_owned()).collect::<HashSet<_>>();
        let keys = |d: &Departed| {
            let mut keys: Vec<String> = d.uids.keys().cloned().collect();
            keys.sort();
            keys
        };
        departed.note(&uids(&["a", "b"]), HashSet::new(), t0);
        assert!(
            departed.uids.is_empty(),
            "the first look has nothing that left"
        );
        departed.note(&uids(&["b", "c"]), HashSet::new(), t0);
        assert_eq!(keys(&departed), ["a"]);
        departed.note(&uids(&["c"]), HashSet::new(), later);
        assert_eq!(
            departed.uids.get("a"),
            Some(&t0),
            "first departure time kept"
        );
        assert_eq!(keys(&departed), ["a", "b"]);
        departed.note(&uids(&["c"]), HashSet::new(), past);
        assert_eq!(keys(&departed), ["b"]);
    }

    #[test]
    fn the_cluster_is_listed_when_never_listed_old_or_missing_a_pod() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let soon: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let late: Timestamp = "2026-01-01T00:06:00Z".parse().unwrap();
        let known = instance("k", "c1", "other", Some("u-known"));
        let new = instance("n", "c1", "other", Some("u-new"));
        let listed = (t0, HashSet::from(["u-known".to_owned()]));
        type Case<'a> = (
            &'a str,
            Option<&'a (Timestamp, HashSet<String>)>,
            Vec<&'a Instance>,
            Timestamp,
            bool,
        );
        let cases: [Case<'_>; 5] = [
            ("nothing settled elsewhere", None, vec![], soon, false),
            ("never listed", None, vec![&known], soon, true),
            (
                "fresh list knows the pod",
                Some(&listed),
                vec![&known],
                soon,
                false,
            ),
            (
                "fresh list lacks the pod",
                Some(&listed),
                vec![&new],
                soon,
                true,
            ),
            ("old list", Some(&listed), vec![&known], late, true),
        ];
        for (case, listed, settled, now, due) in cases {
            assert_eq!(cluster_list_due(listed, &settled, now), due, "{case}");
        }
    }

    #[test]
    fn only_instances_seen_before_the_cluster_list_and_missing_from_it_are_gone() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let alive = instance("alive", "c1", "other", Some("u-alive"));
        let gone = instance("gone", "c1", "other", Some("u-gone"));
        let newer = instance("newer", "c1", "other", Some("u-newer"));
        let listed = (t1, HashSet::from(["u-alive".to_owned()]));
        let seen: HashMap<String, Timestamp> = [
            ("alive".to_owned(), t0),
            ("gone".to_owned(), t0),
            ("newer".to_owned(), t2),
        ]
        .into();
        let found: Vec<&str> = gone_elsewhere(vec![&alive, &gone, &newer], &listed, &seen)
            .into_iter()
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(found, ["gone"]);
    }
}
