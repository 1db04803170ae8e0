//! When `controller drain` may believe that nothing of ours is left: the pure rule, kept apart
//! from the lists and writes that feed it.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use runpod_contract::CREATE_REQUESTED;

use crate::provider::{Instance, LISTS_TO_CONFIRM};

/// The create records (`runpod.io/create-requested`, whatever their value) on the node's
/// pods, by pod uid: a new or changed one means a create may have been sent since last looked.
pub(crate) fn create_records(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .filter_map(|pod| {
            let marker = pod.metadata.annotations.as_ref()?.get(CREATE_REQUESTED)?;
            Some((pod.metadata.uid.clone()?, marker.clone()))
        })
        .collect()
}

/// Whether a create on record (`records`, by pod uid) has no instance of this cluster and
/// node in `listed`, in any state: only such a create may have made an instance the lists do
/// not show yet. A pod whose instance is listed has its create's outcome known.
pub(crate) fn unseen_creates(
    records: &BTreeMap<String, String>,
    listed: &[Instance],
    cluster_id: &str,
    node_name: &str,
) -> bool {
    let seen: HashSet<&str> = listed
        .iter()
        .filter(|i| {
            i.tags.cluster_id.as_deref() == Some(cluster_id)
                && i.tags.node_name.as_deref() == Some(node_name)
        })
        .filter_map(|i| i.tags.pod_uid.as_deref())
        .collect();
    records.keys().any(|uid| !seen.contains(uid.as_str()))
}

/// Lists in a row that showed nothing of ours alive, counted only from when every create that
/// may have been sent can show in lists. Times are the drain's own monotonic clock, never a
/// marker's (a controller's clock behind the drain's would shorten the wait; a junk marker would
/// end it) nor the wall clock (a step forward would).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct ClearLists {
    counts_from: Option<Instant>,
    clear: u32,
}

impl ClearLists {
    /// A create may have been sent up to `now` (a record was seen on the node's pods, or a new
    /// one appeared): lists count only from `settle` later, and the count starts again.
    pub(crate) fn hold(&mut self, now: Instant, settle: Duration) {
        // A settle time too long to add waits as long as can be said, never not at all.
        let from = now
            .checked_add(settle)
            .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
            .unwrap_or(now);
        if self.counts_from.is_none_or(|current| from > current) {
            self.counts_from = Some(from);
            self.clear = 0;
        }
    }

    /// A list asked at `asked` showed nothing of ours alive (`empty`) or something. Returns
    /// whether the drain may stop: [`LISTS_TO_CONFIRM`] lists in a row showed nothing, all
    /// asked once every create could show.
    pub(crate) fn seen(&mut self, asked: Instant, empty: bool) -> bool {
        if !empty {
            self.clear = 0;
            return false;
        }
        if self.counts_from.is_none_or(|from| asked >= from) {
            self.clear += 1;
        }
        self.clear >= LISTS_TO_CONFIRM
    }

    /// A failed list breaks the row.
    pub(crate) fn failed(&mut self) {
        self.clear = 0;
    }

    /// How much longer lists cannot count, if they cannot at `now`.
    pub(crate) fn waiting(&self, now: Instant) -> Option<Duration> {
        self.counts_from
            .filter(|from| *from > now)
            .map(|from| from.duration_since(now))
    }

    /// Lists in a row that showed nothing and counted, so far.
    pub(crate) fn clear(&self) -> u32 {
        self.clear
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Instant {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_secs(secs)
    }

    #[test]
    fn three_empty_lists_in_a_row_end_it_without_a_create_on_record() {
        let mut lists = ClearLists::default();
        assert!(!lists.seen(at(0), true));
        assert!(!lists.seen(at(2), true), "two empty lists prove nothing");
        assert!(lists.seen(at(4), true));
        // Something listed, or a failed list, breaks the row.
        let mut lists = ClearLists::default();
        assert!(!lists.seen(at(0), true));
        assert!(!lists.seen(at(2), true));
        assert!(!lists.seen(at(4), false));
        assert!(!lists.seen(at(6), true));
        lists.failed();
        assert!(!lists.seen(at(8), true));
        assert!(!lists.seen(at(10), true));
        assert!(lists.seen(at(12), true));
    }

    #[test]
    fn with_a_create_on_record_lists_count_only_from_the_settle_time_on() {
        let mut lists = ClearLists::default();
        lists.hold(at(0), Duration::from_secs(30));
        for secs in [0, 2, 4, 28] {
            assert!(!lists.seen(at(secs), true), "at {secs} s");
        }
        assert_eq!(lists.waiting(at(28)), Some(Duration::from_secs(2)));
        assert!(!lists.seen(at(30), true));
        assert!(!lists.seen(at(32), true));
        // A new record (an unacknowledged controller created again) holds it further and
        // starts the count again.
        lists.hold(at(33), Duration::from_secs(30));
        assert!(!lists.seen(at(34), true));
        assert_eq!(lists.waiting(at(34)), Some(Duration::from_secs(29)));
        assert_eq!(lists.clear(), 0);
        assert!(!lists.seen(at(63), true));
        assert!(!lists.seen(at(65), true));
        assert!(lists.seen(at(67), true));
        assert_eq!(lists.waiting(at(67)), None);
        // An earlier hold never shortens a later one.
        lists.hold(at(0), Duration::from_secs(1));
        assert_eq!(lists.waiting(at(40)), Some(Duration::from_secs(23)));
        // A settle time too long to add still holds.
        let mut forever = ClearLists::default();
        forever.hold(at(0), Duration::MAX);
        assert!(!forever.seen(at(100), true));
        assert!(forever.waiting(at(100)).is_some());
    }

    #[test]
    fn create_records_are_read_by_pod_whatever_their_value() {
        let pod = |uid: &str, marker: Option<&str>| {
            let mut pod = Pod::default();
            pod.metadata.uid = Some(uid.into());
            pod.metadata.annotations =
                marker.map(|m| BTreeMap::from([(CREATE_REQUESTED.to_owned(), m.to_owned())]));
            pod
        };
        let records = create_records(&[
            pod("a", Some("2026-01-01T00:00:00Z")),
            pod("b", None),
            pod("c", Some("junk")),
        ]);
        assert_eq!(
            records.into_iter().collect::<Vec<_>>(),
            [
                ("a".to_owned(), "2026-01-01T00:00:00Z".to_owned()),
                ("c".to_owned(), "junk".to_owned())
            ]
        );
    }

    #[test]
    fn only_a_create_whose_instance_is_not_listed_holds_the_drain() {
        use crate::controller::fixtures::instance;
        let records = BTreeMap::from([
            ("u1".to_owned(), "2026-01-01T00:00:00Z".to_owned()),
            ("u2".to_owned(), "junk".to_owned()),
        ]);
        let both = [
            instance("a", "c1", "n1", Some("u1")),
            instance("b", "c1", "n1", Some("u2")),
        ];
        assert!(!unseen_creates(&records, &both, "c1", "n1"));
        assert!(unseen_creates(&records, &both[..1], "c1", "n1"));
        // Another node's or cluster's instance with the uid tells nothing of ours.
        let elsewhere = [
            instance("a", "c1", "n2", Some("u1")),
            instance("b", "c2", "n1", Some("u2")),
        ];
        assert!(unseen_creates(&records, &elsewhere, "c1", "n1"));
        // A failed list (nothing listed) holds for every create on record; no record, no hold.
        assert!(unseen_creates(&records, &[], "c1", "n1"));
        assert!(!unseen_creates(&BTreeMap::new(), &[], "c1", "n1"));
    }
}
