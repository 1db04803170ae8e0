//! One list of the cloud's instances per interval, shared by every pod: the snapshot every
//! decision is taken on. After each complete list, tagged instances that match no Kubernetes
//! pod are garbage-collected (only once the pod cache has synced; never untagged instances or
//! another cluster's or node's).

use crate::controller::cached::PodStore;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, warn};

use super::gc::{self, Collector};
use crate::controller::context::{Settings, Shared, Snapshot};
use crate::controller::metrics::{ControllerMetrics, StateLabel};
use crate::controller::node::health::ApiHealth;
use crate::controller::usage::watch::UsageWatch;
use crate::provider::{Instance, InstanceState, LISTS_TO_CONFIRM, Provider, ProviderError};

/// The longest a list may take (the client retries inside it).
const LIST_TIMEOUT: Duration = Duration::from_secs(120);

/// Consecutive failed lists before the node says the API is unavailable.
const FAILURES_BEFORE_UNAVAILABLE: u32 = 3;

/// Tagged with this cluster's id and this node's name.
fn is_ours(instance: &Instance, settings: &Settings) -> bool {
    instance.tags.cluster_id.as_deref() == Some(settings.cluster_id.as_str())
        && instance.tags.node_name.as_deref() == Some(settings.node_name.as_str())
}

/// Instances missing from a list are carried forward from the previous one until
/// [`LISTS_TO_CONFIRM`] lists in a row have omitted them: a list that comes back empty or
/// partial must not make a running pod look gone, nor a created one look never made.
/// `missing_from` holds, for each instance carried last time, how many lists in a row have
/// omitted it. Returns the instances to publish and the same count for those carried now.
pub(crate) fn carry_forward(
    previous: &[Instance],
    listed: Vec<Instance>,
    missing_from: &HashMap<String, u32>,
) -> (Vec<Instance>, HashMap<String, u32>) {
    let listed_ids: HashSet<String> = listed.iter().map(|i| i.id.clone()).collect();
    let mut carried = HashMap::new();
    let mut instances = listed;
    for instance in previous
        .iter()
        .filter(|i| i.state.is_live())
        .filter(|i| !listed_ids.contains(&i.id))
    {
        let lists = missing_from.get(&instance.id).copied().unwrap_or(0) + 1;
        if lists >= LISTS_TO_CONFIRM {
            continue;
        }
        carried.insert(instance.id.clone(), lists);
        // Its utilization is the last list's, not a live report: never shown again.
        instances.push(Instance {
            usage: None,
            ..instance.clone()
        });
    }
    (instances, carried)
}

/// Records the list asked for at `taken_at` and returns the snapshot's `confirmed_at`: the
/// time of the oldest of the last [`LISTS_TO_CONFIRM`] complete lists of this process, `None`
/// before there are that many. An instance absent from a snapshot was absent from every one of
/// those lists (instances are carried until that many omit them), so a create recorded, plus
/// its settle time, before that time is proven to have made nothing.
pub(crate) fn confirmed_at(
    taken: &mut VecDeque<Timestamp>,
    taken_at: Timestamp,
) -> Option<Timestamp> {
    taken.push_back(taken_at);
    while taken.len() > LISTS_TO_CONFIRM as usize {
        taken.pop_front();
    }
    (taken.len() == LISTS_TO_CONFIRM as usize)
        .then(|| taken.front().copied())
        .flatten()
}

/// What a failed list says about the cloud's API: a refused key or account at once, an
/// unreachable API only after a few failures in a row (one slow list is not an outage); `None`:
/// no change. A key refused before any list of this process succeeded is `KeyRefused` (a wrong
/// key: the message names where it comes from, `key_source`); refused after it worked, it is
/// `AccountRefused` (revoked, or the account blocked), like a 402.
pub(crate) fn health_after_failure(
    error: &ProviderError,
    failures: u32,
    key_worked: bool,
    key_source: &str,
) -> Option<ApiHealth> {
    let key_message;
    let (reason, message) = match error {
        ProviderError::KeyRefused(message) if !key_worked => {
            key_message = format!(
                "{message}; the key comes from {key_source}: fix it there and restart the controller"
            );
            ("KeyRefused", &key_message)
        }
        ProviderError::KeyRefused(message) | ProviderError::Account(message) => {
            ("AccountRefused", message)
        }
        ProviderError::Unavailable(message) if failures >= FAILURES_BEFORE_UNAVAILABLE => {
            ("APIUnreachable", message)
        }
        ProviderError::Unavailable(_) => return None,
    };
    Some(ApiHealth::Unavailable {
        reason: reason.into(),
        message: message.clone(),
    })
}

/// The operator's adoptions, read at each list (a failed read keeps the last one), tag the
/// instances they took over.
async fn tag_adopted<P: Provider>(shared: &Shared<P>, instances: &mut [Instance]) {
    let settings = &shared.settings;
    let loaded = crate::controller::adoption::load(
        &shared.client,
        &settings.adoption_namespace,
        &settings.node_name,
    )
    .await;
    match loaded {
        Ok(record) => {
            if let Ok(mut adopted) = shared.adopted.lock() {
                *adopted = record;
            }
        }
        Err(error) => warn!(%error, "reading the adoption record failed"),
    }
    if let Ok(adopted) = shared.adopted.lock()
        && !adopted.is_empty()
    {
        for instance in instances.iter_mut() {
            crate::controller::adoption::tag(instance, &adopted, settings.owner());
        }
    }
}

/// After the `failures`-th failed list in a row: the API's health as the failure means it, and
/// a refused key or account said on the node once.
async fn failed_list<P: Provider>(
    shared: &Shared<P>,
    health: &watch::Sender<ApiHealth>,
    error: &ProviderError,
    failures: u32,
    key_worked: bool,
) {
    let Some(next) = health_after_failure(error, failures, key_worked, &shared.settings.key_source)
    else {
        return;
    };
    let changed = health.send_if_modified(|current| {
        let changed = *current != next;
        *current = next.clone();
        changed
    });
    if let (true, ApiHealth::Unavailable { reason, message }) = (changed, &next)
        && reason.ends_with("Refused")
    {
        error!(cloud = shared.provider.name(), reason = %reason, %message, "the cloud refuses this node's API key or account; nothing can be created or stopped until it is fixed");
        shared.node_event(true, reason, message.clone()).await;
    }
}

/// Runs the list loop until the process stops. `ticks` is told after every complete list so
/// that every pod is reconciled against it.
pub(crate) async fn run<P: Provider>(
    shared: Arc<Shared<P>>,
    store: PodStore,
    snapshot_tx: watch::Sender<Option<Arc<Snapshot>>>,
    health: watch::Sender<ApiHealth>,
    ticks: mpsc::Sender<()>,
) {
    let provider = shared.provider.clone();
    let settings = shared.settings.clone();
    let metrics = shared.metrics.clone();
    let mut failures = 0u32;
    // Whether any list of this process succeeded: a key refused before is a wrong key.
    let mut key_worked = false;
    // The last snapshot published, for carrying forward what the next list omits: shared with
    // the snapshot's readers, not a second copy of every instance.
    let mut previous: Option<Arc<Snapshot>> = None;
    let mut taken: VecDeque<Timestamp> = VecDeque::new();
    let mut missing_from: HashMap<String, u32> = HashMap::new();
    let mut collector = Collector::default();
    let mut usage = UsageWatch::default();
    let mut interval = tokio::time::interval(settings.reconcile_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let available = matches!(*health.borrow(), ApiHealth::Available);
        metrics
            .cloud_api_available
            .get_or_create(&crate::controller::metrics::ProviderLabel {
                provider: provider.name(),
            })
            .set(i64::from(available));
        let started = Timestamp::now();
        debug!(cloud = provider.name(), "listing instances");
        let instances = match list_within_timeout(provider.as_ref()).await {
            Ok(mut instances) => {
                tag_adopted(&shared, &mut instances).await;
                instances
            }
            Err(error) => {
                failures += 1;
                metrics.listed(provider.name(), "error");
                warn!(error = %error, failures, cloud = provider.name(), "listing instances failed");
                usage.outage(&shared);
                failed_list(&shared, &health, &error, failures, key_worked).await;
                continue;
            }
        };
        failures = 0;
        key_worked = true;
        metrics.listed(provider.name(), "ok");
        health.send_if_modified(|current| {
            let changed = *current != ApiHealth::Available;
            *current = ApiHealth::Available;
            changed
        });
        collector.report_foreign(&shared, &instances).await;
        let elsewhere: Vec<Instance> = gc::other_nodes(&instances, &settings).cloned().collect();
        // Moved, not copied: the cloud's whole list is not needed past this point.
        let listed: Vec<Instance> = instances
            .into_iter()
            .filter(|i| is_ours(i, &settings))
            .collect();
        let previous_instances = previous.as_ref().map_or(&[][..], |p| &p.instances[..]);
        let (instances, carried_now) = carry_forward(previous_instances, listed, &missing_from);
        if !carried_now.is_empty() {
            debug!(missing = ?carried_now, "instances missing from this list kept until more lists omit them");
        }
        missing_from = carried_now;
        let carried: HashSet<String> = missing_from.keys().cloned().collect();
        // The list is as of when it was asked for, not when it arrived.
        let snapshot = Arc::new(Snapshot {
            taken_at: started,
            instances,
            confirmed_at: confirmed_at(&mut taken, started),
        });
        record(&snapshot, &metrics, provider.name());
        collector.see(&snapshot, &elsewhere);
        snapshot_tx.send_replace(Some(snapshot.clone()));
        previous = Some(Arc::clone(&snapshot));
        let _ = ticks.try_send(());
        debug!(instances = snapshot.instances.len(), "snapshot published");
        usage.observe(&shared, &store.state(), &snapshot).await;

        collect_garbage(
            &shared,
            &store,
            &mut collector,
            &snapshot,
            &carried,
            elsewhere,
        )
        .await;
    }
}

/// One list of the cloud; a list that hangs must not stop every later one.
async fn list_within_timeout<P: Provider>(provider: &P) -> Result<Vec<Instance>, ProviderError> {
    match tokio::time::timeout(LIST_TIMEOUT, provider.list()).await {
        Ok(listed) => listed,
        Err(_) => Err(ProviderError::Unavailable(format!(
            "listing {}s timed out",
            provider.instance_noun()
        ))),
    }
}

/// After a list: the memory of pods that are gone is dropped, and instances of no pod are
/// collected; only once the pod cache has synced, as before that every instance looks
/// orphaned.
async fn collect_garbage<P: Provider>(
    shared: &Shared<P>,
    store: &PodStore,
    collector: &mut Collector,
    snapshot: &Snapshot,
    carried: &HashSet<String>,
    elsewhere: Vec<Instance>,
) {
    let synced =
        futures_util::FutureExt::now_or_never(store.wait_until_ready()).is_some_and(|r| r.is_ok());
    if !synced {
        return;
    }
    let uids: HashSet<String> = store
        .state()
        .iter()
        .filter_map(|pod| pod.metadata.uid.clone())
        .collect();
    // Memory of pods that are gone (a finished pod's kept log lives until then).
    let terminated = shared.forget_all_but(&uids);
    collector.departed(&uids, terminated, snapshot.taken_at);
    collector
        .collect(shared, &uids, snapshot, carried, elsewhere)
        .await;
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
    use crate::controller::fixtures::{instance, settings};
    use crate::provider::Tags;

    #[test]
    fn only_this_cluster_and_node_are_ours() {
        let all = [
            instance("mine", "c1", "vr", Some("u1")),
            instance("other-cluster", "c2", "vr", Some("u1")),
            instance("other-node", "c1", "vr2", Some("u1")),
            Instance {
                tags: Tags::default(),
                ..instance("untagged", "", "", None)
            },
        ];
        let settings = settings();
        let ids: Vec<_> = all
            .iter()
            .filter(|i| is_ours(i, &settings))
            .map(|i| i.id.as_str())
            .collect();
        assert_eq!(ids, ["mine"]);
    }

    #[test]
    fn an_instance_must_be_missing_from_three_lists_in_a_row_to_be_gone() {
        let a = instance("a", "c1", "n1", Some("u1"));
        let b = instance("b", "c1", "n1", Some("u2"));
        let ids = |list: &[Instance]| {
            let mut ids: Vec<String> = list.iter().map(|i| i.id.clone()).collect();
            ids.sort();
            ids
        };
        // Both listed.
        let (now, carried) = carry_forward(&[], vec![a.clone(), b.clone()], &HashMap::new());
        assert_eq!(now.len(), 2);
        assert!(carried.is_empty());
        // Two empty lists: both kept, counted.
        let (now, carried) = carry_forward(&now, Vec::new(), &carried);
        assert_eq!(ids(&now), ["a", "b"]);
        let (now, carried) = carry_forward(&now, Vec::new(), &carried);
        assert_eq!(ids(&now), ["a", "b"]);
        assert_eq!(carried.get("a"), Some(&2));
        assert!(
            now.iter().all(|i| i.usage.is_none()),
            "carried usage is not live"
        );
        // `a` came back; `b` is missing from a third list: gone.
        let (now, carried) = carry_forward(&now, vec![a.clone()], &carried);
        assert_eq!(ids(&now), ["a"]);
        assert!(carried.is_empty());
        // `a`'s count starts again after it was listed.
        let (now, carried) = carry_forward(&now, Vec::new(), &carried);
        assert_eq!(ids(&now), ["a"]);
        assert_eq!(carried.get("a"), Some(&1));
        // Terminated instances are not carried.
        let mut done = b.clone();
        done.state = InstanceState::Terminated;
        let (now, _) = carry_forward(&[a.clone(), done], vec![a], &HashMap::new());
        assert_eq!(ids(&now), ["a"]);
    }

    #[test]
    fn absence_is_confirmed_from_the_oldest_of_the_last_three_lists() {
        let at = |secs: i64| Timestamp::from_second(1_800_000_000 + secs).unwrap();
        let mut taken = VecDeque::new();
        assert_eq!(
            confirmed_at(&mut taken, at(0)),
            None,
            "one list proves nothing"
        );
        assert_eq!(
            confirmed_at(&mut taken, at(1)),
            None,
            "nor two (a restart's glitch)"
        );
        assert_eq!(confirmed_at(&mut taken, at(2)), Some(at(0)));
        // A gap (failed lists in an outage) does not count as lists.
        assert_eq!(confirmed_at(&mut taken, at(60)), Some(at(1)));
        assert_eq!(confirmed_at(&mut taken, at(61)), Some(at(2)));
        assert_eq!(taken.len(), 3, "older lists are dropped");
    }

    #[test]
    fn a_refused_account_is_unavailable_at_once_an_unreachable_api_after_three_failures() {
        let unreachable = ProviderError::Unavailable("timeout".into());
        let health = |error: &ProviderError, failures, worked| match health_after_failure(
            error,
            failures,
            worked,
            "Secret ns/rp (key K)",
        ) {
            Some(ApiHealth::Unavailable { reason, message }) => (reason, message),
            Some(ApiHealth::Available) => ("available".into(), String::new()),
            None => ("unchanged".into(), String::new()),
        };
        let reason = |error: &ProviderError, failures| health(error, failures, true).0;
        assert_eq!(reason(&unreachable, 1), "unchanged");
        assert_eq!(reason(&unreachable, 2), "unchanged");
        assert_eq!(reason(&unreachable, 3), "APIUnreachable");
        assert_eq!(
            reason(&ProviderError::Account("402".into()), 1),
            "AccountRefused"
        );
        // A key that worked and is refused now: revoked, like a blocked account.
        assert_eq!(
            reason(&ProviderError::KeyRefused("401".into()), 1),
            "AccountRefused"
        );
        // A key refused before anything worked: a wrong key, named where it comes from.
        let (reason, message) = health(
            &ProviderError::KeyRefused("401 Unauthorized".into()),
            1,
            false,
        );
        assert_eq!(reason, "KeyRefused");
        assert!(
            message.contains("401 Unauthorized") && message.contains("Secret ns/rp (key K)"),
            "{message}"
        );
        assert_eq!(
            health(&ProviderError::Account("402".into()), 1, false).0,
            "AccountRefused"
        );
    }
}
