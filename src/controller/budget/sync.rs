//! After every complete list of the cloud: this node's live instances written into their
//! namespaces' ledgers at the cloud's own cost per hour, reservations whose create made nothing
//! dropped, terminated instances removed. The first pass of a leader (a restart included) must
//! succeed before it creates anything in a namespace with a budget.

use crate::controller::cached::{CachedPod, PodStore};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use tracing::{debug, warn};

use super::{ledgers, write};
use crate::controller::context::{Shared, Snapshot};
use crate::provider::{Instance, Provider, ProviderError};
use runpod_contract::budget::budget_of;
use runpod_contract::budget::ledger::{LEDGER_LABEL, LEDGER_NAMESPACE, Ledger, Listed};

/// Runs a sync after each new list until the leader stops.
pub(crate) async fn run<P: Provider>(shared: Arc<Shared<P>>, store: PodStore) {
    let mut snapshots = shared.snapshot.clone();
    loop {
        if snapshots.changed().await.is_err() {
            return;
        }
        let Some(snapshot) = snapshots.borrow_and_update().clone() else {
            continue;
        };
        // Before the pod cache is filled, an instance's namespace may be unknown.
        let ready = futures_util::FutureExt::now_or_never(store.wait_until_ready())
            .is_some_and(|r| r.is_ok());
        if !ready {
            continue;
        }
        // A namespace whose ledger could not be written is marked (no create there until a
        // later pass writes it); the others go on.
        match once(&shared, &store.state(), &snapshot).await {
            Ok(()) => shared.budget.synced.store(true, Ordering::Release),
            Err(error) => warn!(%error, "reading the budget ledgers failed"),
        }
    }
}

/// How long a reservation outlives its create when nothing shows up: a create sent under it
/// shows in the list by then (the create marker's settle rule).
fn stale_after(settings: &crate::controller::context::Settings) -> Duration {
    settings.create_settle * 2 + settings.reconcile_interval * 3
}

/// Pods whose create marker is younger than `stale`: a create sent for them may not show in
/// the list yet.
fn recently_marked(pods: &[Arc<CachedPod>], now: Timestamp, stale: Duration) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|pod| {
            let marked: Timestamp = pod
                .metadata
                .annotations
                .as_ref()?
                .get(runpod_contract::CREATE_REQUESTED)?
                .parse()
                .ok()?;
            let age = Duration::try_from(now.duration_since(marked)).unwrap_or_default();
            (age < stale).then(|| pod.metadata.uid.clone()).flatten()
        })
        .collect()
}

/// Lookups by id one pass may send for lines the list left out (the rest wait for the next
/// pass, their money still counted).
const LOOKUPS_PER_PASS: usize = 16;

/// Of this node's lines whose instance a list showed and this one does not, those whose
/// instance is known gone: the pod's record says it was terminated, or the cloud, asked by id,
/// has nothing live under it. An answer that fails, or one not asked this pass, keeps the
/// line (lists omit running instances; the money stays counted). A line written before lines
/// named their instance cannot be asked about and goes, as it did then.
async fn known_gone<F, Fut>(
    unlisted: Vec<(String, Option<String>)>,
    terminated: impl Fn(&str, &str) -> bool,
    lookup: F,
) -> BTreeSet<String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Result<Option<Instance>, ProviderError>>,
{
    let mut gone = BTreeSet::new();
    let mut asked = 0;
    for (uid, instance) in unlisted {
        let Some(id) = instance else {
            gone.insert(uid);
            continue;
        };
        if terminated(&uid, &id) {
            gone.insert(uid);
            continue;
        }
        if asked == LOOKUPS_PER_PASS {
            continue;
        }
        asked += 1;
        match lookup(id.clone()).await {
            Ok(found) if found.as_ref().is_none_or(|i| !i.state.is_live()) => {
                gone.insert(uid);
            }
            Ok(_) => debug!(instance = %id, "missing from the list but live: its spend stays"),
            Err(error) => {
                debug!(instance = %id, %error, "asking for an unlisted instance failed; its spend stays")
            }
        }
    }
    gone
}

/// The ledgers by namespace (the ConfigMap each lives in), and the namespace of every pod this
/// node knows: from its ledger lines and from the pods bound here.
fn by_namespace(
    listed: Vec<ConfigMap>,
    pods: &[Arc<CachedPod>],
    node: &str,
) -> (
    BTreeMap<String, Option<ConfigMap>>,
    BTreeMap<String, String>,
) {
    let mut by_namespace = BTreeMap::new();
    let mut namespace_of = BTreeMap::new();
    for map in listed {
        let Some(namespace) = map
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEDGER_NAMESPACE))
            .cloned()
        else {
            continue;
        };
        let ledger = map.data.as_ref().map(Ledger::parse).unwrap_or_default();
        for (uid, entry) in &ledger.entries {
            if entry.node == node {
                namespace_of.insert(uid.clone(), namespace.clone());
            }
        }
        by_namespace.insert(namespace, Some(map));
    }
    for pod in pods {
        if let (Some(uid), Some(namespace)) = (&pod.metadata.uid, &pod.metadata.namespace) {
            namespace_of.insert(uid.clone(), namespace.clone());
        }
    }
    (by_namespace, namespace_of)
}

/// What the cloud lists as billing, folded per namespace and pod: two instances of one pod
/// (a duplicate being terminated) both bill. Instances of pods this node never knew are in no
/// ledger.
fn live_by_namespace(
    instances: &[Instance],
    pods: &[Arc<CachedPod>],
    namespace_of: &BTreeMap<String, String>,
) -> BTreeMap<String, BTreeMap<String, Listed>> {
    let mut live: BTreeMap<String, BTreeMap<String, Listed>> = BTreeMap::new();
    for instance in instances.iter().filter(|i| i.state.is_live()) {
        let Some(uid) = instance.tags.pod_uid.as_deref() else {
            continue;
        };
        let Some(namespace) = namespace_of.get(uid) else {
            debug!(instance = %instance.id, "a live instance of a pod this node never knew; not in any ledger");
            continue;
        };
        let pod = pods
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
            .and_then(|p| p.metadata.name.clone())
            .unwrap_or_else(|| instance.name.clone());
        live.entry(namespace.clone())
            .or_default()
            .entry(uid.to_owned())
            .and_modify(|listed| {
                listed.cost = match (listed.cost, instance.cost_per_hour) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                }
            })
            .or_insert(Listed {
                pod,
                cost: instance.cost_per_hour,
                instance: instance.id.clone(),
            });
    }
    live
}

/// One pass over every ledger this node has a line in or should have.
async fn once<P: Provider>(
    shared: &Shared<P>,
    pods: &[Arc<CachedPod>],
    snapshot: &Snapshot,
) -> Result<(), kube::Error> {
    let node = &shared.settings.node_name;
    let maps = ledgers(shared);
    let listed = maps
        .list(&ListParams::default().labels(&format!("{}={}", LEDGER_LABEL.0, LEDGER_LABEL.1)))
        .await?
        .items;
    shared.budget.new_pass();
    let (mut by_namespace, namespace_of) = by_namespace(listed, pods, node);
    let live = live_by_namespace(&snapshot.instances, pods, &namespace_of);
    let stored = shared.budget.stored();
    for namespace in live.keys().chain(stored.iter().flat_map(|s| s.keys())) {
        by_namespace.entry(namespace.clone()).or_insert(None);
    }
    let now = Timestamp::now();
    let stale = stale_after(&shared.settings);
    // Creates under way: sent by this process, or marked on the pod recently (by this process
    // or one that died): their reservations stay until a list can show what they made.
    let mut creating = shared.budget.creating();
    creating.extend(recently_marked(pods, now, stale));
    let namespaces: Api<Namespace> = Api::all(shared.client.clone());
    // Namespaces whose series stay: a pod of theirs is bound here or a line bills.
    let mut keep: BTreeSet<String> = pods
        .iter()
        .filter_map(|pod| pod.metadata.namespace.clone())
        .collect();
    for (namespace, existing) in by_namespace {
        let mut ledger = existing
            .as_ref()
            .and_then(|map| map.data.as_ref())
            .map(Ledger::parse)
            .unwrap_or_default();
        let empty = BTreeMap::new();
        let mine = live.get(&namespace).unwrap_or(&empty);
        let unlisted = ledger.unlisted(node, mine);
        let gone = known_gone(
            unlisted,
            |uid, id| shared.remember(uid, |m| m.terminated.contains(id)),
            |id: String| async move { shared.provider.lookup(&id).await },
        )
        .await;
        let mut changed = ledger.sync(node, mine, &creating, &gone, now, stale);
        if let Some(stored) = &stored {
            let empty = BTreeMap::new();
            let volumes = stored.get(&namespace).unwrap_or(&empty);
            changed |= ledger.storage(node, volumes, now);
        }
        if !ledger.entries.is_empty() {
            keep.insert(namespace.clone());
        }
        if changed {
            let written = match write(&maps, &namespace, existing, &ledger).await {
                Ok(written) => written,
                Err(error) => {
                    warn!(%error, namespace, "writing this node's spend into the budget ledger failed");
                    false
                }
            };
            // Another controller wrote first, or the write failed: the next list tries again.
            shared.budget.wrote(&namespace, written);
            if !written {
                continue;
            }
        } else {
            shared.budget.wrote(&namespace, true);
        }
        if !keep.contains(&namespace) {
            continue;
        }
        shared
            .budget
            .show_spend(&shared.metrics, &namespace, ledger.spend().total());
        let budget = match namespaces.get_metadata_opt(&namespace).await {
            Ok(found) => found
                .and_then(|ns| ns.metadata.annotations)
                .unwrap_or_default(),
            Err(error) => {
                debug!(%error, namespace, "reading the namespace's budget failed");
                continue;
            }
        };
        let budget =
            budget_of(&budget, shared.settings.admission.default_budget).and_then(Result::ok);
        shared
            .budget
            .show_budget(&shared.metrics, &namespace, budget);
    }
    shared.budget.hide_all_but(&shared.metrics, &keep);
    shared.budget.end_pass();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, state: crate::provider::InstanceState) -> Instance {
        let mut instance = crate::controller::fixtures::instance(id, "c", "n", None);
        instance.state = state;
        instance
    }

    /// Issue 41, item 7: only an answer that says so makes an unlisted line gone.
    #[tokio::test]
    async fn an_unlisted_line_is_gone_only_when_the_cloud_or_the_record_says_so() {
        use crate::provider::InstanceState;
        let unlisted = vec![
            ("running".to_owned(), Some("i-running".to_owned())),
            ("exited".to_owned(), Some("i-exited".to_owned())),
            ("deleted".to_owned(), Some("i-deleted".to_owned())),
            ("failing".to_owned(), Some("i-failing".to_owned())),
            ("recorded".to_owned(), Some("i-recorded".to_owned())),
            ("old-line".to_owned(), None),
        ];
        let asked = std::sync::Mutex::new(Vec::new());
        let gone = known_gone(
            unlisted,
            |uid, id| uid == "recorded" && id == "i-recorded",
            |id: String| {
                asked.lock().unwrap().push(id.clone());
                let answer = match id.as_str() {
                    "i-running" => Ok(Some(instance(&id, InstanceState::Running))),
                    "i-exited" => Ok(Some(instance(&id, InstanceState::Terminated))),
                    "i-deleted" => Ok(None),
                    _ => Err(ProviderError::Unavailable("503".into())),
                };
                async move { answer }
            },
        )
        .await;
        let expected: BTreeSet<String> = ["exited", "deleted", "recorded", "old-line"]
            .map(str::to_owned)
            .into();
        assert_eq!(gone, expected);
        assert!(!asked.lock().unwrap().contains(&"i-recorded".to_owned()));
    }

    fn pod(uid: &str, marked: Option<&str>) -> Arc<CachedPod> {
        let mut pod = serde_json::json!({"metadata": {"name": uid, "uid": uid}});
        if let Some(at) = marked {
            pod["metadata"]["annotations"] =
                serde_json::json!({runpod_contract::CREATE_REQUESTED: at});
        }
        Arc::new(serde_json::from_value(pod).unwrap())
    }

    /// A controller restarted after a SIGKILL mid-create keeps that create's reservation while
    /// the cloud's list may still lag behind it.
    #[test]
    fn a_recent_create_marker_keeps_the_reservation() {
        let now: Timestamp = "2026-11-27T12:01:00Z".parse().unwrap();
        let pods = [
            pod("fresh", Some("2026-11-27T12:00:30Z")),
            pod("old", Some("2026-11-27T11:50:00Z")),
            pod("never", None),
            pod("garbled", Some("yesterday")),
        ];
        let marked = recently_marked(&pods, now, Duration::from_secs(60));
        assert_eq!(marked, ["fresh".to_owned()].into());
    }
}
