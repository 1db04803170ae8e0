//! Budgets per namespace (`runpod.io/budget-per-hour`): before every create the controller
//! reserves the most the new instance may cost in the namespace's shared ledger (`ledger`),
//! against what the namespace's live instances really cost, on every node and cloud; a pod that
//! does not fit waits Pending (`BudgetExceeded`) and is created when room frees up. After every
//! list each controller writes its own instances' costs into the ledgers (`sync`), so a
//! restarted controller rebuilds them from the cloud before its first create.
//!
//! The decisions are pure (`runpod_contract::budget`, `ledger`); this is the shell that reads
//! and writes the ledger ConfigMaps with optimistic concurrency.

pub(crate) mod state;
pub(crate) mod sync;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use runpod_contract::budget::{self, BUDGET_EXCEEDED, BUDGET_PER_HOUR, Room, budget_of};
use runpod_contract::checks::gpu_count;
use tracing::warn;

use crate::controller::context::Shared;
use crate::provider::Provider;
use runpod_contract::budget::ledger::{self, LEDGER_LABEL, LEDGER_NAMESPACE, Ledger, ledger_name};
pub(crate) use state::Sending;

/// What the budget says about a create.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Gate {
    /// The namespace has no budget.
    Unbounded,
    /// `usd` per hour is reserved for this pod: the create may cost up to that.
    Reserved { usd: f64 },
    /// Wait, Pending with `BudgetExceeded` (the message names budget, spend and price).
    Wait(String),
    /// The pod alone costs more than the whole budget: Pending with `BudgetTooSmall`, and left
    /// out of the namespace's queue (it would block every pod behind it).
    TooSmall(String),
    /// The ledger is not rebuilt yet, or another controller wrote it first: look again soon.
    Later,
}

/// Whether `pod` waits for budget now (as its controller, on any node, wrote it).
pub(crate) fn waits_for_budget(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    status.phase.as_deref() == Some("Pending")
        && status
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
            .any(|reason| reason == BUDGET_EXCEEDED)
}

/// Pods of the namespace that wait for budget and came first (creation time, then name): they
/// start before `pod`.
pub(crate) fn ahead_of(pod: &Pod, namespace_pods: &[Pod], ledger: &Ledger) -> usize {
    let key = |p: &Pod| {
        (
            p.metadata.creation_timestamp.as_ref().map(|t| t.0),
            p.metadata.name.clone(),
        )
    };
    let mine = key(pod);
    namespace_pods
        .iter()
        .filter(|other| {
            let uid = other.metadata.uid.as_deref().unwrap_or_default();
            uid != pod.metadata.uid.as_deref().unwrap_or_default()
                && !ledger.entries.contains_key(uid)
                && other.metadata.deletion_timestamp.is_none()
                && waits_for_budget(other)
                && key(other) < mine
        })
        .count()
}

/// The price a create is judged by (the cheapest fit this cloud publishes, else the pod's cap)
/// and the most it may cost (its cap), USD per hour for the whole pod.
fn price_of<P: Provider>(ctx: &Shared<P>, pod: &Pod) -> (f64, Option<f64>, &'static str) {
    let Some(cloud) = runpod_contract::provider::Cloud::parse(ctx.provider.name()) else {
        return (0.0, None, "its price cap");
    };
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let sheet = ctx.provider.price_sheet();
    let (fit, cap) = runpod_contract::gpus::pod_price::price_on(
        cloud,
        &annotations,
        gpu_count(pod),
        &ctx.settings.admission,
        &sheet.prices,
    );
    match fit {
        Some(fit) => (fit.per_hour, cap, fit.gpu),
        None => (cap.unwrap_or(0.0), cap, "its price cap"),
    }
}

/// Lists a namespace's pods from the apiserver.
struct ListPods<'a>(&'a kube::Client);

impl state::PodLister for ListPods<'_> {
    async fn list(&self, namespace: &str) -> Result<Vec<Pod>, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.0.clone(), namespace);
        Ok(pods.list(&ListParams::default()).await?.items)
    }
}

fn ledgers<P>(ctx: &Shared<P>) -> Api<ConfigMap> {
    Api::namespaced(ctx.client.clone(), &ctx.settings.ledger_namespace)
}

/// The namespace's annotations, where its budget is set. A namespace this controller may not
/// read (403) holds its creates with a reason that says what to grant: its budget is unknown,
/// and a budget must never be ignored because of missing RBAC (the team binding fails closed
/// the same way). A namespace that no longer exists has none.
fn budget_source(
    namespace: &str,
    read: Result<Option<BTreeMap<String, String>>, kube::Error>,
) -> Result<Result<BTreeMap<String, String>, Gate>, kube::Error> {
    match read {
        Ok(found) => Ok(Ok(found.unwrap_or_default())),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Err(Gate::Wait(format!(
            "namespace {namespace}'s {BUDGET_PER_HOUR} cannot be read (the controller may not \
             get namespaces: {}); nothing is created there until it can (grant `get` on \
             namespaces, as the chart does)",
            status.message
        )))),
        Err(error) => Err(error),
    }
}

/// Judges a create of `pod` against its namespace's budget and, when it fits, reserves its
/// most in the shared ledger (only one of two controllers racing for the last dollar wins: the
/// write carries the ledger's `resourceVersion`).
pub(crate) async fn before_create<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
) -> Result<Gate, kube::Error> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let read = namespaces
        .get_metadata_opt(namespace)
        .await
        .map(|found| found.map(|ns| ns.metadata.annotations.unwrap_or_default()));
    let annotations = match budget_source(namespace, read)? {
        Ok(annotations) => annotations,
        Err(wait) => return Ok(wait),
    };
    let budget = match budget_of(&annotations, ctx.settings.admission.default_budget) {
        None => {
            ctx.budget.show_budget(&ctx.metrics, namespace, None);
            return Ok(Gate::Unbounded);
        }
        Some(Err(problem)) => {
            return Ok(Gate::Wait(format!(
                "namespace {namespace}'s {BUDGET_PER_HOUR}: {problem}; nothing is created \
                 there until it is fixed"
            )));
        }
        Some(Ok(budget)) => budget,
    };
    ctx.budget
        .show_budget(&ctx.metrics, namespace, Some(budget));
    if !ctx.budget.is_synced(namespace) {
        return Ok(Gate::Later);
    }
    let maps = ledgers(ctx);
    let existing = maps.get_opt(&ledger_name(namespace)).await?;
    let mut ledger = existing
        .as_ref()
        .and_then(|map| map.data.as_ref())
        .map(Ledger::parse)
        .unwrap_or_default();
    let node = &ctx.settings.node_name;
    let now = Timestamp::now();
    let unlisted = ledger.entries.get_mut(uid).filter(|entry| {
        &entry.node == node && entry.state == ledger::State::Starting && !entry.listed
    });
    if let Some(entry) = unlisted {
        // Reserved by an earlier attempt (or before a restart): the create goes on under it,
        // the reservation's clock restarted so that the sync keeps it meanwhile.
        let usd = entry.usd;
        entry.at = now;
        return Ok(if write(&maps, namespace, existing, &ledger).await? {
            ctx.budget.in_flight().insert(uid.to_owned());
            Gate::Reserved { usd }
        } else {
            Gate::Later
        });
    }
    // A line of the pod's previous instance (it is being replaced) gives way to the new one.
    ledger.release(uid, node, true);
    let spend = ledger.spend();
    ctx.budget
        .show_spend(&ctx.metrics, namespace, spend.total());
    // The pods waiting before this one (a cached list of the namespace's pods).
    let namespace_pods = ctx
        .budget
        .namespace_pods(
            &ListPods(&ctx.client),
            namespace,
            ctx.settings.reconcile_interval,
        )
        .await?;
    let ahead = ahead_of(pod, &namespace_pods, &ledger);
    let (price, cap, gpu) = price_of(ctx, pod);
    if let Some(message) = budget::never_fits(namespace, budget, Some((gpu, price))) {
        return Ok(Gate::TooSmall(message));
    }
    match budget::room(namespace, budget, spend, price, ahead) {
        Room::Wait(message) => Ok(Gate::Wait(message)),
        Room::Create => {
            let usd = budget::reservation(budget, spend.total(), price, cap);
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            ledger.reserve(uid, node, name, usd, now);
            if write(&maps, namespace, existing, &ledger).await? {
                ctx.budget.in_flight().insert(uid.to_owned());
                ctx.budget
                    .show_spend(&ctx.metrics, namespace, ledger.spend().total());
                Ok(Gate::Reserved { usd })
            } else {
                Ok(Gate::Later)
            }
        }
    }
}

/// How a create under a reservation ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settled {
    /// The instance exists; the cloud's cost per hour when it said.
    Created(Option<f64>),
    /// Nothing was created: the reservation goes.
    Nothing,
    /// Unknown: the reservation stays until a list settles it (`sync`), counted from now.
    Unknown,
}

/// The create of a pod `before_create` reserved for is under way until the guard drops (after
/// `after_create`).
pub(crate) fn sending<'a, P>(ctx: &'a Shared<P>, uid: &str) -> Sending<'a> {
    ctx.budget.in_flight().insert(uid.to_owned());
    Sending {
        state: &ctx.budget,
        uid: uid.to_owned(),
    }
}

/// Replaces a reservation by what the create made. Best effort: the next sync settles whatever
/// this could not write.
pub(crate) async fn after_create<P>(ctx: &Shared<P>, pod: &Pod, uid: &str, settled: Settled) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let node = ctx.settings.node_name.clone();
    let maps = ledgers(ctx);
    for _ in 0..3 {
        let existing = match maps.get_opt(&ledger_name(namespace)).await {
            Ok(existing) => existing,
            Err(error) => {
                warn!(%error, namespace, "reading the budget ledger failed");
                return;
            }
        };
        let mut ledger = existing
            .as_ref()
            .and_then(|map| map.data.as_ref())
            .map(Ledger::parse)
            .unwrap_or_default();
        let changed = match settled {
            Settled::Created(cost) => ledger.created(uid, &node, cost, Timestamp::now()),
            Settled::Nothing => ledger.release(uid, &node, false),
            // The reservation's clock restarts: an instance made at the end of a long create
            // shows in a list within the settle time from now.
            Settled::Unknown => ledger.created(uid, &node, None, Timestamp::now()),
        };
        if !changed {
            return;
        }
        match write(&maps, namespace, existing, &ledger).await {
            Ok(true) => {
                ctx.budget
                    .show_spend(&ctx.metrics, namespace, ledger.spend().total());
                return;
            }
            Ok(false) => continue,
            Err(error) => {
                warn!(%error, namespace, "writing the budget ledger failed");
                return;
            }
        }
    }
}

/// Writes a ledger over `existing` (its `resourceVersion`), or creates it; `false` when another
/// writer came first (a conflict): read it again.
async fn write(
    maps: &Api<ConfigMap>,
    namespace: &str,
    existing: Option<ConfigMap>,
    ledger: &Ledger,
) -> Result<bool, kube::Error> {
    let result = match existing {
        Some(mut map) => {
            map.data = Some(ledger.data());
            let name = map.metadata.name.clone().unwrap_or_default();
            maps.replace(&name, &PostParams::default(), &map).await
        }
        None => {
            let map = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(ledger_name(namespace)),
                    labels: Some([(LEDGER_LABEL.0.to_owned(), LEDGER_LABEL.1.to_owned())].into()),
                    annotations: Some([(LEDGER_NAMESPACE.to_owned(), namespace.to_owned())].into()),
                    ..Default::default()
                },
                data: Some(ledger.data()),
                ..Default::default()
            };
            maps.create(&PostParams::default(), &map).await
        }
    };
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, created: &str, waiting: Option<&str>) -> Pod {
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}"),
                "creationTimestamp": created},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending"}
        });
        if let Some(reason) = waiting {
            pod["status"]["containerStatuses"] = json!([{"name": "c", "image": "i",
                "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason}}}]);
        }
        serde_json::from_value(pod).unwrap()
    }

    #[test]
    fn only_earlier_pods_waiting_for_budget_go_first() {
        let me = pod("c", "2026-01-01T00:00:10Z", Some(BUDGET_EXCEEDED));
        let pods = vec![
            pod("a", "2026-01-01T00:00:00Z", Some(BUDGET_EXCEEDED)),
            pod("b", "2026-01-01T00:00:05Z", Some("NotOptedIn")),
            pod("d", "2026-01-01T00:00:20Z", Some(BUDGET_EXCEEDED)),
            pod("e", "2026-01-01T00:00:01Z", None),
            me.clone(),
        ];
        assert_eq!(ahead_of(&me, &pods, &Ledger::default()), 1);
        let mut reserved = Ledger::default();
        reserved.reserve("uid-a", "n", "a", 1.0, Timestamp::now());
        assert_eq!(ahead_of(&me, &pods, &reserved), 0, "a has its turn");
        let same_time = pod("cc", "2026-01-01T00:00:10Z", Some(BUDGET_EXCEEDED));
        assert_eq!(
            ahead_of(&me, &[same_time], &Ledger::default()),
            0,
            "same time: by name"
        );
    }

    fn api_error(code: u16) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(
            json!({ "code": code, "message": "namespaces \"team\" is forbidden" }),
        )
        .unwrap();
        kube::Error::Api(Box::new(status))
    }

    /// Issue 41, item 9: a namespace the controller may not read holds its creates.
    #[test]
    fn a_namespace_that_cannot_be_read_holds_its_creates() {
        match budget_source("team", Err(api_error(403))) {
            Ok(Err(Gate::Wait(message))) => {
                assert!(message.contains("cannot be read"), "{message}");
                assert!(message.contains("get"), "{message}");
            }
            other => panic!("a 403 must wait: {other:?}"),
        }
        let annotations: BTreeMap<String, String> =
            [(BUDGET_PER_HOUR.to_owned(), "1.0".to_owned())].into();
        assert_eq!(
            budget_source("team", Ok(Some(annotations.clone()))).unwrap(),
            Ok(annotations)
        );
        assert_eq!(
            budget_source("team", Ok(None)).unwrap(),
            Ok(BTreeMap::new())
        );
        assert!(budget_source("team", Err(api_error(500))).is_err());
    }

    #[test]
    fn a_pod_waits_for_budget_only_while_pending_with_the_reason() {
        assert!(waits_for_budget(&pod(
            "a",
            "2026-01-01T00:00:00Z",
            Some(BUDGET_EXCEEDED)
        )));
        assert!(!waits_for_budget(&pod("a", "2026-01-01T00:00:00Z", None)));
        let mut running = pod("a", "2026-01-01T00:00:00Z", Some(BUDGET_EXCEEDED));
        if let Some(status) = running.status.as_mut() {
            status.phase = Some("Running".into());
        }
        assert!(!waits_for_budget(&running));
    }
}
