//! The ledger: every pod ever created, including ones whose create answered an error
//! (api-notes P3), so tests can prove a client never leaks or duplicates billed pods.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::timefmt::serde_time;

/// One pod as created (name, image, env, args and ports follow later PATCHes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub id: String,
    pub name: String,
    pub image: String,
    /// GPU type; `None` for CPU pods.
    pub gpu_id: Option<String>,
    /// 0 for CPU pods.
    pub gpu_count: u32,
    /// The create's `mounts` (`{}` when none).
    #[serde(default)]
    pub mounts: serde_json::Value,
    pub data_center_id: String,
    /// `SECURE` or `COMMUNITY`.
    pub cloud: String,
    pub env: BTreeMap<String, String>,
    pub args: String,
    pub ports: Vec<String>,
    /// USD per hour while running (list price × count).
    pub cost_per_hr: f64,
    #[serde(with = "serde_time")]
    pub created_at: SystemTime,
    /// Set when the pod was terminated (DELETE, `terminate` action, or the control API).
    #[serde(with = "serde_time::option")]
    pub terminated_at: Option<SystemTime>,
    /// The first stop action or termination: when GPU billing ended (storage bills on until
    /// `terminated_at`).
    #[serde(with = "serde_time::option", default)]
    pub stopped_at: Option<SystemTime>,
    /// When the container last stopped by itself or by a stop (EXITED, ERROR): GPU billing
    /// ended then; `None` while it runs.
    #[serde(with = "serde_time::option", default)]
    pub gpu_billing_ended_at: Option<SystemTime>,
    /// The HTTP status the create call answered: 201, or e.g. 500 for an injected
    /// create-then-fail.
    pub create_status: u16,
}

impl LedgerEntry {
    /// Not terminated yet (still billed or at least still existing).
    pub fn is_live(&self) -> bool {
        self.terminated_at.is_none()
    }

    fn overlaps(&self, other: &LedgerEntry) -> bool {
        let ends_after =
            |entry: &LedgerEntry, t: SystemTime| entry.terminated_at.is_none_or(|end| end > t);
        ends_after(self, other.created_at) && ends_after(other, self.created_at)
    }
}

/// The entries that are not terminated.
pub fn live_pods(ledger: &[LedgerEntry]) -> Vec<&LedgerEntry> {
    ledger.iter().filter(|e| e.is_live()).collect()
}

/// Names used by two pods whose lifetimes overlap (a client that created a pod twice), sorted.
pub fn duplicate_names(ledger: &[LedgerEntry]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for (i, a) in ledger.iter().enumerate() {
        for b in &ledger[i + 1..] {
            if a.name == b.name && a.overlaps(b) {
                names.insert(a.name.clone());
            }
        }
    }
    names.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn entry(name: &str, start: u64, end: Option<u64>) -> LedgerEntry {
        let at = |s: u64| SystemTime::UNIX_EPOCH + Duration::from_secs(s);
        LedgerEntry {
            id: format!("{name}{start}"),
            name: name.to_owned(),
            image: "img".into(),
            gpu_id: None,
            gpu_count: 0,
            data_center_id: "EU-RO-1".into(),
            mounts: serde_json::Value::Null,
            cloud: "SECURE".into(),
            env: BTreeMap::new(),
            args: String::new(),
            ports: Vec::new(),
            cost_per_hr: 0.0,
            created_at: at(start),
            terminated_at: end.map(at),
            stopped_at: end.map(at),
            gpu_billing_ended_at: None,
            create_status: 201,
        }
    }

    #[test]
    fn sequential_reuse_of_a_name_is_not_a_duplicate() {
        let ledger = vec![
            entry("a", 0, Some(10)),
            entry("a", 10, None),
            entry("b", 0, Some(5)),
            entry("b", 4, Some(6)),
        ];
        assert_eq!(duplicate_names(&ledger), vec!["b".to_owned()]);
        assert_eq!(live_pods(&ledger).len(), 1);
    }
}
