//! One namespace's budget ledger, as pure data: what each of its pods costs, by whichever node
//! runs it. It is stored as a ConfigMap `runpod-kubelet-budget-<namespace>` in the controllers'
//! namespace (one entry per pod UID), so every node's controller sees every node's spend, and a
//! reservation written with the ConfigMap's `resourceVersion` fails when another controller wrote
//! first: two leaders cannot both take the last dollar.
//!
//! Each controller writes only its own entries: a reservation before a create (`starting`, the
//! most the create may cost), the cloud's own figure once its list shows the instance
//! (`billing`, `costPerHr` / `dph_total`), nothing once the instance is gone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::Spend;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// The ledger ConfigMap of a namespace.
pub fn ledger_name(namespace: &str) -> String {
    format!("runpod-kubelet-budget-{namespace}")
}

/// The label every ledger carries (the controllers list them by it).
pub const LEDGER_LABEL: (&str, &str) = ("app.kubernetes.io/component", "budget-ledger");
/// The ledger's annotation naming its namespace (names can be cut; this cannot).
pub const LEDGER_NAMESPACE: &str = "runpod.io/budget-namespace";

/// Where an entry's money stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Reserved before a create: the most the instance may cost.
    Starting,
    /// What the cloud says the live instance costs.
    Billing,
}

/// One pod's line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub node: String,
    pub pod: String,
    /// USD per hour.
    pub usd: f64,
    pub state: State,
    /// When the line was last written.
    pub at: Timestamp,
    /// A list of the cloud has shown the instance: once it is missing from one, it is gone.
    #[serde(default)]
    pub listed: bool,
}

/// A namespace's lines by pod UID.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    pub entries: BTreeMap<String, Entry>,
    /// Lines that could not be read (kept as they are, their money unknown).
    pub unreadable: BTreeMap<String, String>,
}

impl Ledger {
    /// Reads a ConfigMap's data.
    pub fn parse(data: &BTreeMap<String, String>) -> Self {
        let mut ledger = Self::default();
        for (uid, line) in data {
            match serde_json::from_str::<Entry>(line) {
                Ok(entry) if entry.usd.is_finite() && entry.usd >= 0.0 => {
                    ledger.entries.insert(uid.clone(), entry);
                }
                _ => {
                    ledger.unreadable.insert(uid.clone(), line.clone());
                }
            }
        }
        ledger
    }

    /// The ConfigMap's data.
    pub fn data(&self) -> BTreeMap<String, String> {
        let mut data = self.unreadable.clone();
        for (uid, entry) in &self.entries {
            if let Ok(line) = serde_json::to_string(entry) {
                data.insert(uid.clone(), line);
            }
        }
        data
    }

    /// What the namespace spends, every node together.
    pub fn spend(&self) -> Spend {
        let mut spend = Spend::default();
        for entry in self.entries.values() {
            match entry.state {
                State::Billing => spend.billing += entry.usd,
                State::Starting => spend.in_flight += entry.usd,
            }
        }
        spend
    }

    /// Reserves `usd` for a create of `uid` by `node`.
    pub fn reserve(&mut self, uid: &str, node: &str, pod: &str, usd: f64, now: Timestamp) {
        self.entries.insert(
            uid.to_owned(),
            Entry {
                node: node.to_owned(),
                pod: pod.to_owned(),
                usd,
                state: State::Starting,
                at: now,
                listed: false,
            },
        );
    }

    /// A create under `node`'s line of `uid` ended: the cloud's figure when it gave one (the
    /// line then bills), and the line's clock restarted, so it outlives the list's lag.
    /// Whether there was such a line.
    pub fn created(&mut self, uid: &str, node: &str, cost: Option<f64>, now: Timestamp) -> bool {
        let Some(entry) = self.entries.get_mut(uid).filter(|entry| entry.node == node) else {
            return false;
        };
        if let Some(cost) = cost {
            entry.usd = cost;
            entry.state = State::Billing;
        }
        entry.at = now;
        // This create's instance has not been listed yet (whatever an earlier one had).
        entry.listed = false;
        true
    }

    /// Drops `node`'s line of `uid`; whether there was one. `listed_too`: also a line whose
    /// instance a list has shown (it is being replaced); otherwise only a reservation (a create
    /// that made nothing, while an instance an earlier create made may still bill).
    pub fn release(&mut self, uid: &str, node: &str, listed_too: bool) -> bool {
        let ours = self
            .entries
            .get(uid)
            .is_some_and(|entry| entry.node == node && (listed_too || !entry.listed));
        if ours {
            self.entries.remove(uid);
        }
        ours
    }

    /// Brings `node`'s lines in line with its cloud's list: `live` are the namespace's live
    /// instances of this node (pod UID -> pod name and the cloud's cost per hour, if given).
    /// A live instance bills at the cloud's figure (or what was reserved for it while the cloud
    /// gives none); a line whose instance was listed and is gone goes; a line never listed goes
    /// once it is older than `stale` (a create made by then shows in the list). A create under
    /// way (`in_flight`) keeps its line whatever the list shows. Whether anything changed.
    pub fn sync(
        &mut self,
        node: &str,
        live: &BTreeMap<String, (String, Option<f64>)>,
        in_flight: &BTreeSet<String>,
        now: Timestamp,
        stale: Duration,
    ) -> bool {
        let before = self.entries.clone();
        for (uid, (pod, cost)) in live {
            // A create under way for this pod (a replacement) keeps its own reservation: the
            // instance listed is the one it replaces.
            let replacing = in_flight.contains(uid)
                && self
                    .entries
                    .get(uid)
                    .is_some_and(|e| e.node == node && e.state == State::Starting && !e.listed);
            if replacing {
                continue;
            }
            let reserved = self
                .entries
                .get(uid)
                .filter(|entry| entry.node == node)
                .map(|entry| entry.usd);
            let usd = cost.or(reserved).unwrap_or(0.0);
            let unchanged = self.entries.get(uid).is_some_and(|entry| {
                entry.node == node
                    && entry.state == State::Billing
                    && entry.usd == usd
                    && entry.listed
            });
            if !unchanged {
                self.entries.insert(
                    uid.clone(),
                    Entry {
                        node: node.to_owned(),
                        pod: pod.clone(),
                        usd,
                        state: State::Billing,
                        at: now,
                        listed: true,
                    },
                );
            }
        }
        self.entries.retain(|uid, entry| {
            if entry.node != node || live.contains_key(uid) {
                return true;
            }
            // Listed once and missing now: terminated. Never listed yet: kept while its create
            // runs or the list may still lag behind it.
            let age = Duration::try_from(now.duration_since(entry.at)).unwrap_or_default();
            in_flight.contains(uid) || (!entry.listed && age < stale)
        });
        self.entries != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn live(lines: &[(&str, Option<f64>)]) -> BTreeMap<String, (String, Option<f64>)> {
        lines
            .iter()
            .map(|(uid, cost)| ((*uid).to_owned(), (format!("pod-{uid}"), *cost)))
            .collect()
    }

    #[test]
    fn spend_counts_every_node_and_reservations_apart() {
        let mut ledger = Ledger::default();
        ledger.reserve("a", "team-a-node", "p", 0.6, at(0));
        ledger.sync(
            "other-node",
            &live(&[("b", Some(0.4))]),
            &BTreeSet::new(),
            at(0),
            Duration::from_secs(60),
        );
        let spend = ledger.spend();
        assert_eq!((spend.billing, spend.in_flight), (0.4, 0.6));
        let round_trip = Ledger::parse(&ledger.data());
        assert_eq!(round_trip, ledger);
    }

    #[test]
    fn a_reservation_becomes_the_clouds_figure_then_goes_with_the_instance() {
        let stale = Duration::from_secs(60);
        let none = BTreeSet::new();
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 1.0, at(0));
        assert!(!ledger.sync("n", &live(&[]), &none, at(10), stale), "young");
        assert!(ledger.sync("n", &live(&[("a", Some(0.4))]), &none, at(20), stale));
        assert_eq!(ledger.entries["a"].state, State::Billing);
        assert_eq!(ledger.spend().billing, 0.4);
        assert!(!ledger.sync("n", &live(&[("a", Some(0.4))]), &none, at(30), stale));
        assert!(
            ledger.sync("n", &live(&[]), &none, at(40), stale),
            "terminated"
        );
        assert!(ledger.entries.is_empty());
    }

    /// The create answered with the cloud's price before any list showed the instance: the line
    /// bills at once and stays until a list has shown it and then lost it.
    #[test]
    fn a_created_instance_outlives_the_lists_lag() {
        let stale = Duration::from_secs(60);
        let none = BTreeSet::new();
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 1.0, at(0));
        assert!(ledger.created("a", "n", Some(0.4), at(200)));
        assert_eq!(ledger.spend().billing, 0.4);
        assert!(
            !ledger.sync("n", &live(&[]), &none, at(210), stale),
            "the list lags"
        );
        assert!(ledger.sync("n", &live(&[("a", Some(0.4))]), &none, at(220), stale));
        assert!(ledger.entries["a"].listed);
        assert!(
            ledger.sync("n", &live(&[]), &none, at(221), stale),
            "terminated"
        );
        assert!(ledger.entries.is_empty());
        // Without a price, the reservation's clock restarts at the create's end.
        ledger.reserve("b", "n", "p", 1.0, at(0));
        assert!(ledger.created("b", "n", None, at(500)));
        assert!(!ledger.sync("n", &live(&[]), &none, at(530), stale));
        assert_eq!(ledger.spend().in_flight, 1.0);
        assert!(!ledger.created("b", "other", None, at(500)));
    }

    /// A pod's instance is replaced: the old one, still listed, does not take the new create's
    /// reservation's place, and its disappearance does not drop the reservation.
    #[test]
    fn a_replacements_reservation_survives_the_old_instance() {
        let stale = Duration::from_secs(60);
        let running: BTreeSet<String> = ["a".to_owned()].into();
        let mut ledger = Ledger::default();
        ledger.sync(
            "n",
            &live(&[("a", Some(0.4))]),
            &BTreeSet::new(),
            at(0),
            stale,
        );
        assert!(!ledger.release("a", "n", false), "a listed line stays");
        assert!(ledger.release("a", "n", true));
        ledger.reserve("a", "n", "p", 1.0, at(10));
        ledger.sync("n", &live(&[("a", Some(0.4))]), &running, at(11), stale);
        assert_eq!(
            ledger.spend().in_flight,
            1.0,
            "not the old instance's figure"
        );
        ledger.sync("n", &live(&[]), &running, at(12), stale);
        assert_eq!(ledger.spend().in_flight, 1.0, "kept while its create runs");
        assert!(ledger.created("a", "n", Some(0.5), at(13)));
        assert!(!ledger.entries["a"].listed);
        ledger.sync("n", &live(&[]), &BTreeSet::new(), at(14), stale);
        assert_eq!(ledger.spend().billing, 0.5, "kept until a list shows it");
    }

    #[test]
    fn a_reservation_outlives_its_settle_time_only_while_its_create_runs() {
        let stale = Duration::from_secs(60);
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 1.0, at(0));
        let running: BTreeSet<String> = ["a".to_owned()].into();
        assert!(!ledger.sync("n", &live(&[]), &running, at(300), stale));
        assert!(ledger.sync("n", &live(&[]), &BTreeSet::new(), at(300), stale));
        assert!(ledger.entries.is_empty(), "a crashed create's reservation");
    }

    #[test]
    fn a_node_touches_only_its_own_lines() {
        let mut ledger = Ledger::default();
        ledger.reserve("a", "other", "p", 1.0, at(0));
        ledger.sync(
            "other",
            &live(&[("b", Some(0.5))]),
            &BTreeSet::new(),
            at(0),
            Duration::from_secs(1),
        );
        let before = ledger.clone();
        assert!(!ledger.sync(
            "n",
            &live(&[]),
            &BTreeSet::new(),
            at(900),
            Duration::from_secs(1)
        ));
        assert_eq!(ledger, before);
        assert!(!ledger.release("a", "n", true));
        assert!(ledger.release("a", "other", false));
    }

    #[test]
    fn a_live_instance_without_a_price_keeps_what_was_reserved() {
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 0.7, at(0));
        ledger.sync(
            "n",
            &live(&[("a", None)]),
            &BTreeSet::new(),
            at(1),
            Duration::from_secs(60),
        );
        assert_eq!(ledger.spend().billing, 0.7);
    }

    #[test]
    fn unreadable_lines_are_kept_as_they_are() {
        let data: BTreeMap<String, String> = [
            ("x".to_owned(), "not json".to_owned()),
            (
                "y".to_owned(),
                r#"{"node":"n","pod":"p","usd":-1,"state":"billing","at":"2027-01-01T00:00:00Z"}"#
                    .to_owned(),
            ),
        ]
        .into();
        let ledger = Ledger::parse(&data);
        assert!(ledger.entries.is_empty());
        assert_eq!(ledger.data(), data);
    }
}
