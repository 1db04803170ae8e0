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
    /// A network volume's storage (its line is keyed by [`storage_key`], not a pod UID).
    Storage,
}

/// The line of a network volume's storage, by its PV's name (a ConfigMap key, never a UID).
pub fn storage_key(pv: &str) -> String {
    format!("volume.{pv}")
}

/// A network volume of one namespace as its PV shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored {
    /// The claim it is bound to.
    pub claim: String,
    /// What its storage costs, USD per hour.
    pub usd: f64,
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
    /// A list of the cloud has shown the instance. Missing from later lists, it still bills
    /// until it is known gone (a lookup by id, or its pod's record): lists omit live instances.
    #[serde(default)]
    pub listed: bool,
    /// The instance the line was last listed with: what a lookup by id asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// A live instance of one pod as a list shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Listed {
    pub pod: String,
    /// The cloud's cost per hour, when it gives one.
    pub cost: Option<f64>,
    /// The instance's id.
    pub instance: String,
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
                State::Storage => spend.storage += entry.usd,
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
                instance: None,
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

    /// `node`'s lines whose instance a list showed and this one does not (pod UID and the
    /// instance id): the shell asks the cloud for each by id before `sync` may drop it.
    pub fn unlisted(
        &self,
        node: &str,
        live: &BTreeMap<String, Listed>,
    ) -> Vec<(String, Option<String>)> {
        self.entries
            .iter()
            .filter(|(uid, entry)| entry.node == node && entry.listed && !live.contains_key(*uid))
            .map(|(uid, entry)| (uid.clone(), entry.instance.clone()))
            .collect()
    }

    /// Brings `node`'s lines in line with its cloud's list: `live` are the namespace's live
    /// instances of this node by pod UID. A live instance bills at the cloud's figure (or
    /// what was reserved for it while the cloud gives none). A line whose instance was listed
    /// and is missing now goes only when it is known gone (`gone`: a lookup by id found
    /// nothing live, or the pod's record says terminated); a list that omits a running
    /// instance must not free its money for another create. A line never listed goes once it
    /// is older than `stale` (a create made by then shows in the list). A create under way
    /// (`in_flight`) keeps its line whatever the list shows. Whether anything changed.
    pub fn sync(
        &mut self,
        node: &str,
        live: &BTreeMap<String, Listed>,
        in_flight: &BTreeSet<String>,
        gone: &BTreeSet<String>,
        now: Timestamp,
        stale: Duration,
    ) -> bool {
        let before = self.entries.clone();
        for (
            uid,
            Listed {
                pod,
                cost,
                instance,
            },
        ) in live
        {
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
                    && entry.instance.as_deref() == Some(instance.as_str())
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
                        instance: Some(instance.clone()),
                    },
                );
            }
        }
        self.entries.retain(|uid, entry| {
            // Storage lines follow the PVs ([`Ledger::storage`]), not the cloud's list.
            if entry.node != node || entry.state == State::Storage || live.contains_key(uid) {
                return true;
            }
            // Listed once and missing now: kept until known gone. Never listed yet: kept while
            // its create runs or the list may still lag behind it.
            if entry.listed {
                return !gone.contains(uid);
            }
            let age = Duration::try_from(now.duration_since(entry.at)).unwrap_or_default();
            in_flight.contains(uid) || age < stale
        });
        self.entries != before
    }

    /// Makes `node`'s storage lines exactly `volumes` (by [`storage_key`]): the PVs are the
    /// truth of what is stored, read from the apiserver, and never lag as a cloud's list does.
    /// Whether anything changed.
    pub fn storage(
        &mut self,
        node: &str,
        volumes: &BTreeMap<String, Stored>,
        now: Timestamp,
    ) -> bool {
        let before = self.entries.clone();
        self.entries.retain(|key, entry| {
            entry.node != node || entry.state != State::Storage || volumes.contains_key(key)
        });
        for (key, Stored { claim, usd }) in volumes {
            let same = self.entries.get(key).is_some_and(|entry| {
                entry.node == node
                    && entry.state == State::Storage
                    && entry.usd == *usd
                    && entry.pod == *claim
            });
            if !same {
                self.entries.insert(
                    key.clone(),
                    Entry {
                        node: node.to_owned(),
                        pod: claim.clone(),
                        usd: *usd,
                        state: State::Storage,
                        at: now,
                        listed: false,
                        instance: None,
                    },
                );
            }
        }
        self.entries != before
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn live(lines: &[(&str, Option<f64>)]) -> BTreeMap<String, Listed> {
        lines
            .iter()
            .map(|(uid, cost)| {
                let listed = Listed {
                    pod: format!("pod-{uid}"),
                    cost: *cost,
                    instance: format!("i-{uid}"),
                };
                ((*uid).to_owned(), listed)
            })
            .collect()
    }

    fn gone(uids: &[&str]) -> BTreeSet<String> {
        uids.iter().map(|uid| (*uid).to_owned()).collect()
    }

    #[test]
    fn spend_counts_every_node_and_reservations_apart() {
        let mut ledger = Ledger::default();
        ledger.reserve("a", "team-a-node", "p", 0.6, at(0));
        ledger.sync(
            "other-node",
            &live(&[("b", Some(0.4))]),
            &BTreeSet::new(),
            &gone(&[]),
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
        assert!(
            !ledger.sync("n", &live(&[]), &none, &gone(&[]), at(10), stale),
            "young"
        );
        assert!(ledger.sync(
            "n",
            &live(&[("a", Some(0.4))]),
            &none,
            &gone(&[]),
            at(20),
            stale
        ));
        assert_eq!(ledger.entries["a"].state, State::Billing);
        assert_eq!(ledger.spend().billing, 0.4);
        assert!(!ledger.sync(
            "n",
            &live(&[("a", Some(0.4))]),
            &none,
            &gone(&[]),
            at(30),
            stale
        ));
        assert!(
            !ledger.sync("n", &live(&[]), &none, &gone(&[]), at(40), stale),
            "missing from a list: not known gone"
        );
        assert!(
            ledger.sync("n", &live(&[]), &none, &gone(&["a"]), at(41), stale),
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
            !ledger.sync("n", &live(&[]), &none, &gone(&[]), at(210), stale),
            "the list lags"
        );
        assert!(ledger.sync(
            "n",
            &live(&[("a", Some(0.4))]),
            &none,
            &gone(&[]),
            at(220),
            stale
        ));
        assert!(ledger.entries["a"].listed);
        assert!(
            ledger.sync("n", &live(&[]), &none, &gone(&["a"]), at(221), stale),
            "terminated"
        );
        assert!(ledger.entries.is_empty());
        // Without a price, the reservation's clock restarts at the create's end.
        ledger.reserve("b", "n", "p", 1.0, at(0));
        assert!(ledger.created("b", "n", None, at(500)));
        assert!(!ledger.sync("n", &live(&[]), &none, &gone(&[]), at(530), stale));
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
            &gone(&[]),
            at(0),
            stale,
        );
        assert!(!ledger.release("a", "n", false), "a listed line stays");
        assert!(ledger.release("a", "n", true));
        ledger.reserve("a", "n", "p", 1.0, at(10));
        ledger.sync(
            "n",
            &live(&[("a", Some(0.4))]),
            &running,
            &gone(&[]),
            at(11),
            stale,
        );
        assert_eq!(
            ledger.spend().in_flight,
            1.0,
            "not the old instance's figure"
        );
        ledger.sync("n", &live(&[]), &running, &gone(&[]), at(12), stale);
        assert_eq!(ledger.spend().in_flight, 1.0, "kept while its create runs");
        assert!(ledger.created("a", "n", Some(0.5), at(13)));
        assert!(!ledger.entries["a"].listed);
        ledger.sync("n", &live(&[]), &BTreeSet::new(), &gone(&[]), at(14), stale);
        assert_eq!(ledger.spend().billing, 0.5, "kept until a list shows it");
    }

    #[test]
    fn a_reservation_outlives_its_settle_time_only_while_its_create_runs() {
        let stale = Duration::from_secs(60);
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 1.0, at(0));
        let running: BTreeSet<String> = ["a".to_owned()].into();
        assert!(!ledger.sync("n", &live(&[]), &running, &gone(&[]), at(300), stale));
        assert!(ledger.sync(
            "n",
            &live(&[]),
            &BTreeSet::new(),
            &gone(&[]),
            at(300),
            stale
        ));
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
            &gone(&[]),
            at(0),
            Duration::from_secs(1),
        );
        let before = ledger.clone();
        assert!(!ledger.sync(
            "n",
            &live(&[]),
            &BTreeSet::new(),
            &gone(&[]),
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
            &gone(&[]),
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

    /// Issue 41, item 7: budget 1.0, a 0.6 pod running, its instance hidden from two lists
    /// while a lookup by id still finds it: its money stays in the ledger, so a second 0.6 pod
    /// does not fit.
    #[test]
    fn an_instance_the_lists_omit_keeps_its_money_until_known_gone() {
        let stale = Duration::from_secs(60);
        let none = BTreeSet::new();
        let mut ledger = Ledger::default();
        ledger.reserve("a", "n", "p", 0.6, at(0));
        ledger.sync(
            "n",
            &live(&[("a", Some(0.6))]),
            &none,
            &gone(&[]),
            at(10),
            stale,
        );
        for list in 0..2 {
            assert_eq!(
                ledger.unlisted("n", &live(&[])),
                vec![("a".to_owned(), Some("i-a".to_owned()))]
            );
            ledger.sync("n", &live(&[]), &none, &gone(&[]), at(20 + list), stale);
        }
        assert_eq!(ledger.spend().billing, 0.6);
        let room = super::super::room("team", 1.0, ledger.spend(), 0.6, 0);
        assert!(matches!(room, super::super::Room::Wait(_)), "{room:?}");
        ledger.sync("n", &live(&[]), &none, &gone(&["a"]), at(30 + 600), stale);
        assert!(ledger.entries.is_empty(), "known gone: its money is free");
        assert!(ledger.unlisted("n", &live(&[])).is_empty());
    }

    /// Issue 46: a namespace's network volumes count against its budget, follow the PVs, and
    /// survive every list of the cloud (a volume is no instance).
    #[test]
    fn storage_counts_in_the_spend_and_follows_the_pvs_alone() {
        let stale = Duration::from_secs(60);
        let none = BTreeSet::new();
        let stored = |lines: &[(&str, f64)]| -> BTreeMap<String, Stored> {
            lines
                .iter()
                .map(|(pv, usd)| {
                    let line = Stored {
                        claim: format!("claim-{pv}"),
                        usd: *usd,
                    };
                    (storage_key(pv), line)
                })
                .collect()
        };
        let mut ledger = Ledger::default();
        assert!(ledger.storage("n", &stored(&[("pv-a", 0.01), ("pv-b", 0.02)]), at(0)));
        assert!(!ledger.storage("n", &stored(&[("pv-a", 0.01), ("pv-b", 0.02)]), at(5)));
        ledger.storage("other", &stored(&[("pv-c", 0.04)]), at(0));
        ledger.sync(
            "n",
            &live(&[("u", Some(0.5))]),
            &none,
            &gone(&[]),
            at(0),
            stale,
        );
        let spend = ledger.spend();
        assert!((spend.storage - 0.07).abs() < 1e-12, "{spend:?}");
        assert!((spend.total() - 0.57).abs() < 1e-12, "{spend:?}");
        // The cloud's lists, empty or not, never touch a storage line...
        ledger.sync("n", &live(&[]), &none, &gone(&["u"]), at(600), stale);
        assert!((ledger.spend().storage - 0.07).abs() < 1e-12);
        assert!(ledger.unlisted("n", &live(&[])).is_empty());
        // ...the PVs do: a deleted one goes, a grown one costs more, another node's stays.
        assert!(ledger.storage("n", &stored(&[("pv-b", 0.03)]), at(700)));
        let spend = ledger.spend();
        assert!((spend.storage - 0.07).abs() < 1e-12, "{spend:?}");
        assert!(!ledger.entries.contains_key(&storage_key("pv-a")));
        assert_eq!(Ledger::parse(&ledger.data()), ledger);
    }
}
