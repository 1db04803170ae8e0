//! This leader's budget bookkeeping, apart from the shell that reads and writes the ledgers:
//! whether its lines are rebuilt, which creates are under way, which namespaces have series.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;

use crate::controller::metrics::ControllerMetrics;

/// This leader's budget bookkeeping.
#[derive(Debug, Default)]
pub struct BudgetState {
    /// This leader has written its own instances into the ledgers once: until then it creates
    /// nothing in a namespace with a budget (a restart rebuilds spend from the cloud first).
    pub synced: AtomicBool,
    /// Namespaces whose ledger this leader's last sync could not write: no create there until
    /// one does.
    unsynced: Mutex<BTreeSet<String>>,
    /// Namespaces the current pass has written or found current.
    visited: Mutex<BTreeSet<String>>,
    /// Pods whose create this process is sending now: their reservations stay.
    in_flight: Mutex<BTreeSet<String>>,
    /// Namespaces with spend or budget series on `/metrics`.
    exported: Mutex<BTreeSet<String>>,
    /// Each namespace's pods as last listed for the budget queue, shared by its waiting pods.
    listed: Mutex<HashMap<String, ListSlot>>,
    /// The network volumes of this node's PVs by namespace, as the storage controller last
    /// read them (`None`: it has not, so the ledgers' storage lines are left as they are).
    stored: Mutex<Option<Stored>>,
}

/// Network volumes by namespace, each by its ledger key.
pub(crate) type Stored =
    BTreeMap<String, BTreeMap<String, runpod_contract::budget::ledger::Stored>>;

/// One namespace's last list and when it was taken; locked while a list is under way, so the
/// namespace's other waiting pods wait for it rather than list too.
type ListSlot = Arc<tokio::sync::Mutex<Option<(Instant, Arc<Vec<Pod>>)>>>;

/// Lists a namespace's pods (the apiserver; a fake in tests).
pub trait PodLister {
    fn list(&self, namespace: &str) -> impl Future<Output = Result<Vec<Pod>, kube::Error>> + Send;
}

impl BudgetState {
    /// The storage controller's last reading of this node's volumes.
    pub fn set_stored(&self, stored: Stored) {
        *lock(&self.stored) = Some(stored);
    }

    /// What the budget sync writes as this node's storage lines (`None`: not read yet).
    pub fn stored(&self) -> Option<Stored> {
        lock(&self.stored).clone()
    }

    /// Whether this leader's own instances in `namespace` are in its ledger (rebuilt from the
    /// cloud since it started, and the last write there succeeded).
    pub fn is_synced(&self, namespace: &str) -> bool {
        self.synced.load(Ordering::Acquire) && !lock(&self.unsynced).contains(namespace)
    }

    /// A new pass starts. A namespace stays unsynced until a write there succeeds: a failure
    /// is not forgotten because a pass began.
    pub fn new_pass(&self) {
        lock(&self.visited).clear();
    }

    /// The pass ended: a namespace it did not visit has nothing of this node's to write (no
    /// ledger, no live instance), so an old failure there no longer holds its creates.
    pub fn end_pass(&self) {
        let visited = lock(&self.visited);
        lock(&self.unsynced).retain(|namespace| visited.contains(namespace));
    }

    /// Records whether the last sync wrote `namespace`'s ledger.
    pub fn wrote(&self, namespace: &str, written: bool) {
        lock(&self.visited).insert(namespace.to_owned());
        let mut unsynced = lock(&self.unsynced);
        if written {
            unsynced.remove(namespace);
        } else {
            unsynced.insert(namespace.to_owned());
        }
    }

    /// The namespace's pods for the budget queue (who waits ahead of whom): one list per
    /// namespace per `max_age`, however many of its pods wait, and one at a time (the others
    /// wait for it). A queue read up to a pass old only orders creates; the money is guarded
    /// by the ledger's `resourceVersion`.
    pub async fn namespace_pods<L: PodLister>(
        &self,
        lister: &L,
        namespace: &str,
        max_age: Duration,
    ) -> Result<Arc<Vec<Pod>>, kube::Error> {
        let slot = {
            let mut listed = lock(&self.listed);
            // Namespaces no pod asked about for a while are forgotten.
            listed.retain(|_, slot| {
                slot.try_lock().map_or(true, |cached| {
                    cached
                        .as_ref()
                        .is_some_and(|(at, _)| at.elapsed() < max_age * 10)
                })
            });
            Arc::clone(listed.entry(namespace.to_owned()).or_default())
        };
        let mut cached = slot.lock().await;
        if let Some((at, pods)) = cached.as_ref()
            && at.elapsed() < max_age
        {
            return Ok(Arc::clone(pods));
        }
        let pods = Arc::new(lister.list(namespace).await?);
        *cached = Some((Instant::now(), Arc::clone(&pods)));
        Ok(pods)
    }

    pub(super) fn in_flight(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        lock(&self.in_flight)
    }

    /// The pods whose create is under way here.
    pub fn creating(&self) -> BTreeSet<String> {
        self.in_flight().clone()
    }

    fn exported(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        lock(&self.exported)
    }

    /// Publishes what a namespace spends.
    pub fn show_spend(&self, metrics: &ControllerMetrics, namespace: &str, usd: f64) {
        self.exported().insert(namespace.to_owned());
        metrics.namespace_spend(namespace, usd);
    }

    /// Publishes a namespace's budget (no series without one).
    pub fn show_budget(&self, metrics: &ControllerMetrics, namespace: &str, usd: Option<f64>) {
        self.exported().insert(namespace.to_owned());
        metrics.namespace_budget(namespace, usd);
    }

    /// Removes the series of every namespace not in `keep` (none of its pods bills or waits
    /// here any more), so a team's series end with its pods.
    pub fn hide_all_but(&self, metrics: &ControllerMetrics, keep: &BTreeSet<String>) {
        self.exported().retain(|namespace| {
            let kept = keep.contains(namespace);
            if !kept {
                metrics.forget_namespace(namespace);
            }
            kept
        });
    }
}

/// A lock, even after a panic elsewhere poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// While alive, the pod's create counts as under way here (its reservation survives the
/// ledger's sync); dropped once the create's outcome is in the ledger.
pub(crate) struct Sending<'a> {
    pub(super) state: &'a BudgetState,
    pub(super) uid: String,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.state.in_flight().remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synced() -> BudgetState {
        let state = BudgetState::default();
        state.synced.store(true, Ordering::Release);
        state
    }

    #[test]
    fn a_failed_write_holds_its_namespace_across_the_next_pass_start() {
        let state = synced();
        state.wrote("x", false);
        state.new_pass();
        assert!(!state.is_synced("x"));
        state.wrote("x", true);
        assert!(state.is_synced("x"));
    }

    /// Counts the lists it is asked for.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl PodLister for Counting {
        async fn list(&self, _: &str) -> Result<Vec<Pod>, kube::Error> {
            self.0.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(Vec::new())
        }
    }

    /// Issue 41, item 11: a thousand waiting pods of one namespace, reconciled together, make
    /// one list per pass, not one each.
    #[tokio::test]
    async fn waiting_pods_share_one_list_per_pass() {
        let state = Arc::new(BudgetState::default());
        let lister = Arc::new(Counting(Default::default()));
        let pass = Duration::from_secs(60);
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..1000 {
            let (state, lister) = (Arc::clone(&state), Arc::clone(&lister));
            waiting.spawn(async move {
                state.namespace_pods(&*lister, "team", pass).await.unwrap();
            });
        }
        while let Some(done) = waiting.join_next().await {
            done.unwrap();
        }
        assert_eq!(lister.0.load(Ordering::SeqCst), 1);
        state.namespace_pods(&*lister, "other", pass).await.unwrap();
        assert_eq!(lister.0.load(Ordering::SeqCst), 2, "one per namespace");
        state
            .namespace_pods(&*lister, "team", Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(lister.0.load(Ordering::SeqCst), 3, "listed again once old");
    }

    #[test]
    fn a_pass_that_no_longer_visits_a_namespace_releases_it() {
        let state = synced();
        state.wrote("gone", false);
        state.wrote("failing", false);
        state.new_pass();
        state.wrote("failing", false);
        state.end_pass();
        assert!(state.is_synced("gone"));
        assert!(!state.is_synced("failing"));
    }
}
