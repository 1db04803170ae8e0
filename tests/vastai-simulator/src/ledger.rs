//! The ledger: every instance ever created, including those whose create answer was lost, with
//! what each has cost, so tests can prove a client never buys twice and never leaves anything
//! billing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::instance::Status;

/// One instance as created, and its bill so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub id: u64,
    pub offer_id: u64,
    pub label: Option<String>,
    pub image: String,
    pub env: BTreeMap<String, String>,
    pub ports: Vec<String>,
    pub disk: f64,
    pub runtype: String,
    pub onstart: Option<String>,
    pub args: Option<Vec<String>>,
    /// A registry login was sent (its value is never recorded).
    pub image_login: bool,
    pub gpu_name: String,
    /// The host machine it runs on.
    #[serde(default)]
    pub machine_id: u64,
    /// The bid of an interruptible instance (USD/h); `None`: on-demand.
    #[serde(default)]
    pub bid: Option<f64>,
    /// A higher bid took its machine.
    #[serde(default)]
    pub outbid: bool,
    pub num_gpus: u32,
    pub geolocation: String,
    /// USD/h while running, storage included.
    pub dph_total: f64,
    pub status: Status,
    /// Epoch seconds.
    pub created_at: f64,
    pub destroyed_at: Option<f64>,
    /// Epoch seconds when GPU billing ended: the first stop, the destroy or the container's
    /// own exit; `None` while it may still bill a GPU.
    #[serde(default)]
    pub gpu_billing_ended_at: Option<f64>,
    /// What the create call answered: 200, or e.g. 502 for a create whose answer was lost.
    pub create_status: u16,
    /// USD billed for compute (running only) and storage (create to destroy).
    pub gpu_cost: f64,
    pub storage_cost: f64,
}

impl LedgerEntry {
    /// Not destroyed: still billing storage at least.
    pub fn is_live(&self) -> bool {
        self.destroyed_at.is_none()
    }
}

/// The entries not destroyed.
pub fn live_instances(ledger: &[LedgerEntry]) -> Vec<&LedgerEntry> {
    ledger.iter().filter(|entry| entry.is_live()).collect()
}

/// Labels carried by more than one instance ever created (alive or not): with one label per
/// pod, a client that bought twice for one pod. Sorted.
pub fn duplicate_labels(ledger: &[LedgerEntry]) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut twice = BTreeSet::new();
    for label in ledger.iter().filter_map(|entry| entry.label.as_ref()) {
        if !seen.insert(label) {
            twice.insert(label.clone());
        }
    }
    twice.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, label: Option<&str>, destroyed: bool) -> LedgerEntry {
        LedgerEntry {
            id,
            offer_id: id,
            label: label.map(str::to_owned),
            image: "img".into(),
            env: BTreeMap::new(),
            ports: Vec::new(),
            disk: 8.0,
            runtype: "args".into(),
            onstart: None,
            args: None,
            image_login: false,
            gpu_name: "RTX 4090".into(),
            machine_id: 1,
            bid: None,
            outbid: false,
            num_gpus: 1,
            geolocation: "Texas, US".into(),
            dph_total: 0.4,
            status: Status::Running,
            created_at: 0.0,
            destroyed_at: destroyed.then_some(1.0),
            gpu_billing_ended_at: destroyed.then_some(1.0),
            create_status: 200,
            gpu_cost: 0.0,
            storage_cost: 0.0,
        }
    }

    #[test]
    fn a_label_bought_twice_is_a_duplicate_even_after_a_destroy() {
        let ledger = vec![
            entry(1, Some("a"), true),
            entry(2, Some("a"), false),
            entry(3, Some("b"), false),
            entry(4, None, false),
            entry(5, None, false),
        ];
        assert_eq!(duplicate_labels(&ledger), vec!["a".to_owned()]);
        assert_eq!(live_instances(&ledger).len(), 4);
    }
}
