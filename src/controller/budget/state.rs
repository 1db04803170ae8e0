//! This leader's budget bookkeeping, apart from the shell that reads and writes the ledgers:
//! whether its lines are rebuilt, which creates are under way, which namespaces have series.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
    /// Pods whose create this process is sending now: their reservations stay.
    in_flight: Mutex<BTreeSet<String>>,
    /// Namespaces with spend or budget series on `/metrics`.
    exported: Mutex<BTreeSet<String>>,
}

impl BudgetState {
    /// Whether this leader's own instances in `namespace` are in its ledger (rebuilt from the
    /// cloud since it started, and the last write there succeeded).
    pub fn is_synced(&self, namespace: &str) -> bool {
        self.synced.load(Ordering::Acquire) && !lock(&self.unsynced).contains(namespace)
    }

    /// A new pass starts: only its failures count from now on (a namespace it does not visit
    /// has nothing of this node's to write).
    pub fn new_pass(&self) {
        lock(&self.unsynced).clear();
    }

    /// Records whether the last sync wrote `namespace`'s ledger.
    pub fn wrote(&self, namespace: &str, written: bool) {
        let mut unsynced = lock(&self.unsynced);
        if written {
            unsynced.remove(namespace);
        } else {
            unsynced.insert(namespace.to_owned());
        }
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
pub struct Sending<'a> {
    pub(super) state: &'a BudgetState,
    pub(super) uid: String,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.state.in_flight().remove(&self.uid);
    }
}
