//! Job offloading, the pure part: which waiting `delayed` pods move to the virtual node now,
//! and why. A `delayed` pod is admitted without the virtual node's toleration, so it runs on a
//! local GPU when one fits and otherwise waits; it moves (the offloader adds the toleration)
//! once it waited longer than its max-pending-time, while more of them wait than the threshold
//! allows (longest-waiting first), or at once when `runpod.io/offload: "true"` is on the pod or
//! its Job. The decision depends only on the pods, their Jobs, the flags and the clock, so a
//! restarted controller decides the same.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::jiff::Timestamp;
use runpod_contract::provider::{Cloud, PROVIDER};
use runpod_contract::{self as contract, BurstMode};

use crate::controller::clock::elapsed;
use crate::provider::CloudName;

/// The offloading flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadSettings {
    /// How long a waiting pod waits for a local GPU (from its creation) before it moves.
    pub max_pending_time: Duration,
    /// How many pods may wait at once; the longest-waiting ones above it move.
    pub pending_job_threshold: usize,
}

/// Why a pod moves, for its Event and the metric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    MaxPendingTime { waited: Duration, limit: Duration },
    Threshold { waiting: usize, threshold: usize },
    OffloadAnnotation,
}

impl Reason {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Reason::MaxPendingTime { .. } => "max_pending_time",
            Reason::Threshold { .. } => "threshold",
            Reason::OffloadAnnotation => "offload_annotation",
        }
    }

    /// The Event's message.
    pub fn message(&self, cloud: CloudName) -> String {
        match self {
            Reason::MaxPendingTime { waited, limit } => format!(
                "waited {} for a local GPU (max-pending-time {}); moved to {}",
                go_duration(*waited),
                humantime::format_duration(*limit),
                cloud.title
            ),
            Reason::Threshold { waiting, threshold } => format!(
                "{waiting} pods waiting for a local GPU, threshold {threshold}; moved to {} \
                 (the longest-waiting first)",
                cloud.title
            ),
            Reason::OffloadAnnotation => format!(
                "{}: \"true\" on the pod or its Job; moved to {}",
                contract::OFFLOAD,
                cloud.title
            ),
        }
    }
}

/// `5m0s`, `40s`, `1h2m3s`: whole seconds, as the seed's users read waits.
pub fn go_duration(duration: Duration) -> String {
    let total = duration.as_secs();
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    match (hours, minutes) {
        (0, 0) => format!("{seconds}s"),
        (0, _) => format!("{minutes}m{seconds}s"),
        _ => format!("{hours}h{minutes}m{seconds}s"),
    }
}

/// One waiting pod with what the decision reads of its Job.
#[derive(Debug, Clone, Copy)]
pub struct Waiting<'a> {
    pub pod: &'a Pod,
    /// The owning Job's annotations, when the pod has a Job and it is known.
    pub job: Option<&'a BTreeMap<String, String>>,
}

/// A pod to move now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub reason: Reason,
}

/// What the offloader sees this round: the moves, and the waiting pods left (for metrics).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub moves: Vec<Move>,
    /// Pods still waiting after the moves.
    pub waiting: usize,
    /// The longest wait among the pods still waiting.
    pub longest_wait: Duration,
}

fn annotation<'a>(map: Option<&'a BTreeMap<String, String>>, key: &str) -> Option<&'a str> {
    map?.get(key).map(String::as_str)
}

/// The value of `key` on the pod, else on its Job.
fn effective<'a>(waiting: &Waiting<'a>, key: &str) -> Option<&'a str> {
    annotation(waiting.pod.metadata.annotations.as_ref(), key)
        .or_else(|| annotation(waiting.job, key))
}

/// Whether the pod is in `delayed` mode: its effective burst mode (the webhook writes it on the
/// pod), else `runpod.io/managed: "true"` on it or its Job.
pub fn is_delayed(waiting: &Waiting<'_>) -> bool {
    match effective(waiting, contract::BURST_MODE) {
        Some(mode) => BurstMode::parse(mode) == Some(BurstMode::Delayed),
        None => effective(waiting, contract::MANAGED) == Some("true"),
    }
}

/// The cloud a waiting pod is for: `runpod.io/provider` on it (the webhook writes its choice
/// there) or its Job; RunPod when neither names one. Each controller moves only its cloud's.
pub fn wanted_cloud(waiting: &Waiting<'_>) -> Cloud {
    effective(waiting, PROVIDER)
        .and_then(Cloud::parse)
        .unwrap_or(Cloud::RunPod)
}

/// Whether the pod already tolerates the virtual node's `NoSchedule` taint (moved, or admitted
/// as a burst pod): the offloader leaves it alone.
pub fn tolerates_virtual_node(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.tolerations.as_ref())
        .into_iter()
        .flatten()
        .any(|t| {
            t.key.as_deref() == Some(contract::PROVIDER_TAINT_KEY)
                && t.effect.as_deref().is_none_or(|e| e == "NoSchedule")
                && match t.operator.as_deref() {
                    Some("Exists") => true,
                    _ => t.value.as_deref().and_then(Cloud::parse).is_some(),
                }
        })
}

/// The toleration a move adds: the one the webhook gives burst pods of `provider` (the node's
/// provider label value).
pub fn virtual_node_toleration(provider: &str) -> Toleration {
    Toleration {
        key: Some(contract::PROVIDER_TAINT_KEY.to_owned()),
        operator: Some("Equal".to_owned()),
        value: Some(provider.to_owned()),
        effect: Some("NoSchedule".to_owned()),
        toleration_seconds: None,
    }
}

/// Waiting for a local GPU: pending, bound to no node and nominated for none (the scheduler
/// preempting local pods for it has found it one), not being deleted, not yet tolerating the
/// virtual node.
fn unbound_and_pending(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && pod.spec.as_ref().is_some_and(|s| s.node_name.is_none())
        && status.and_then(|s| s.phase.as_deref()) == Some("Pending")
        && status
            .and_then(|s| s.nominated_node_name.as_deref())
            .is_none_or(str::is_empty)
        && !tolerates_virtual_node(pod)
}

/// The scheduler reported that no node fits (`PodScheduled=False`).
fn unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "False")
        })
}

/// Decides which of `pods` move now. Pods that are not waiting delayed pods are ignored; the
/// caller has already left out pods the controller would not run (opt-in, shape, policy).
pub fn plan(pods: &[Waiting<'_>], settings: OffloadSettings, now: Timestamp) -> Plan {
    let mut moves = Vec::new();
    let mut waiting: Vec<(&Waiting<'_>, Duration)> = Vec::new();
    for candidate in pods
        .iter()
        .filter(|w| is_delayed(w) && unbound_and_pending(w.pod))
    {
        let created = candidate
            .pod
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0);
        let waited = elapsed(created, now);
        // On the pod or its Job: the Job's may be set to "true" after the pod was admitted
        // with a copy of an earlier "false".
        let offload = [
            annotation(
                candidate.pod.metadata.annotations.as_ref(),
                contract::OFFLOAD,
            ),
            annotation(candidate.job, contract::OFFLOAD),
        ]
        .contains(&Some("true"));
        let reason = if offload {
            Some(Reason::OffloadAnnotation)
        } else if !unschedulable(candidate.pod) {
            // The scheduler has not said no local node fits yet.
            None
        } else {
            let limit = effective(candidate, contract::MAX_PENDING_TIME)
                .and_then(|value| contract::parse_max_pending_time(value).ok())
                .unwrap_or(settings.max_pending_time);
            (waited >= limit).then_some(Reason::MaxPendingTime { waited, limit })
        };
        match reason {
            Some(reason) => moves.push(to_move(candidate.pod, reason)),
            None if unschedulable(candidate.pod) => waiting.push((candidate, waited)),
            None => {}
        }
    }
    // Too many waiting: the longest-waiting move until at most the threshold wait.
    let total = waiting.len();
    waiting.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| name_of(a.0.pod).cmp(&name_of(b.0.pod)))
    });
    let excess = total.saturating_sub(settings.pending_job_threshold);
    let longest_wait = waiting
        .iter()
        .skip(excess)
        .map(|(_, waited)| *waited)
        .max()
        .unwrap_or(Duration::ZERO);
    for (candidate, _) in waiting.iter().take(excess) {
        moves.push(to_move(
            candidate.pod,
            Reason::Threshold {
                waiting: total,
                threshold: settings.pending_job_threshold,
            },
        ));
    }
    Plan {
        moves,
        waiting: total - excess,
        longest_wait,
    }
}

fn name_of(pod: &Pod) -> (String, String) {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

fn to_move(pod: &Pod, reason: Reason) -> Move {
    let (namespace, name) = name_of(pod);
    Move {
        namespace,
        name,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: &str = "2026-01-01T01:00:00Z";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    /// A pending pod created `age` seconds before NOW, with these annotations; `scheduled`:
    /// Some(false) when the scheduler said no, None when it has not looked yet.
    fn pod(name: &str, age: i64, annotations: serde_json::Value, scheduled: Option<bool>) -> Pod {
        let created = now()
            .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(age))
            .unwrap();
        let conditions = match scheduled {
            Some(ok) => json!([{"type": "PodScheduled", "status": if ok {"True"} else {"False"},
                "reason": "Unschedulable"}]),
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                "creationTimestamp": created.to_string(), "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": "Pending", "conditions": conditions}
        }))
        .unwrap()
    }

    fn delayed(name: &str, age: i64) -> Pod {
        pod(
            name,
            age,
            json!({"runpod.io/burst-mode": "delayed"}),
            Some(false),
        )
    }

    fn settings(max_pending: u64, threshold: usize) -> OffloadSettings {
        OffloadSettings {
            max_pending_time: Duration::from_secs(max_pending),
            pending_job_threshold: threshold,
        }
    }

    fn moved(plan: &Plan) -> Vec<(String, &'static str)> {
        plan.moves
            .iter()
            .map(|m| (m.name.clone(), m.reason.label()))
            .collect()
    }

    fn waiting(pods: &[Pod]) -> Vec<Waiting<'_>> {
        pods.iter().map(|pod| Waiting { pod, job: None }).collect()
    }

    #[test]
    fn a_pod_moves_once_it_waited_its_max_pending_time() {
        let pods = [delayed("old", 50), delayed("young", 30)];
        let plan = plan(&waiting(&pods), settings(40, 10), now());
        assert_eq!(moved(&plan), [("old".to_owned(), "max_pending_time")]);
        assert_eq!(plan.waiting, 1);
        assert_eq!(
            plan.longest_wait,
            Duration::from_secs(30),
            "of those still waiting"
        );
        assert_eq!(
            plan.moves[0].reason.message(CloudName::RUNPOD),
            "waited 50s for a local GPU (max-pending-time 40s); moved to RunPod"
        );
    }

    #[test]
    fn zero_moves_a_pod_as_soon_as_the_scheduler_says_no() {
        let pods = [
            delayed("refused", 0),
            pod(
                "not-looked-at",
                0,
                json!({"runpod.io/burst-mode": "delayed"}),
                None,
            ),
        ];
        let plan = plan(&waiting(&pods), settings(0, 10), now());
        assert_eq!(moved(&plan), [("refused".to_owned(), "max_pending_time")]);
    }

    #[test]
    fn the_annotation_on_the_pod_or_its_job_overrides_the_flag() {
        let own = pod(
            "own",
            120,
            json!({"runpod.io/burst-mode": "delayed", "runpod.io/max-pending-time": "5m"}),
            Some(false),
        );
        let by_job = delayed("by-job", 120);
        let job: BTreeMap<String, String> =
            [("runpod.io/max-pending-time".to_owned(), "60".to_owned())].into();
        let pods = [
            Waiting {
                pod: &own,
                job: None,
            },
            Waiting {
                pod: &by_job,
                job: Some(&job),
            },
        ];
        let plan = plan(&pods, settings(0, 10), now());
        assert_eq!(moved(&plan), [("by-job".to_owned(), "max_pending_time")]);
        assert_eq!(plan.waiting, 1, "own waits for its 5m");
    }

    #[test]
    fn above_the_threshold_the_longest_waiting_move() {
        let pods = [
            delayed("a", 10),
            delayed("b", 30),
            delayed("c", 20),
            delayed("d", 5),
        ];
        let plan = plan(&waiting(&pods), settings(3600, 1), now());
        assert_eq!(
            moved(&plan),
            [
                ("b".to_owned(), "threshold"),
                ("c".to_owned(), "threshold"),
                ("a".to_owned(), "threshold")
            ]
        );
        assert_eq!(plan.waiting, 1);
        assert_eq!(
            plan.moves[0].reason.message(CloudName::RUNPOD),
            "4 pods waiting for a local GPU, threshold 1; moved to RunPod (the longest-waiting first)"
        );
        // At the threshold nothing moves.
        let at_threshold = super::plan(&waiting(&pods[..1]), settings(3600, 1), now());
        assert!(at_threshold.moves.is_empty());
    }

    #[test]
    fn offload_true_moves_at_once_even_before_the_scheduler_looked() {
        let on_pod = pod(
            "p",
            0,
            json!({"runpod.io/burst-mode": "delayed", "runpod.io/offload": "true"}),
            None,
        );
        let by_job = delayed("j", 1);
        let job: BTreeMap<String, String> =
            [("runpod.io/offload".to_owned(), "true".to_owned())].into();
        let pods = [
            Waiting {
                pod: &on_pod,
                job: None,
            },
            Waiting {
                pod: &by_job,
                job: Some(&job),
            },
        ];
        let plan = plan(&pods, settings(3600, 10), now());
        assert_eq!(
            moved(&plan),
            [
                ("p".to_owned(), "offload_annotation"),
                ("j".to_owned(), "offload_annotation")
            ]
        );
    }

    #[test]
    fn only_waiting_delayed_pods_are_ever_moved() {
        let fallback = pod(
            "fallback",
            99,
            json!({"runpod.io/burst-mode": "fallback"}),
            Some(false),
        );
        let managed = pod(
            "managed",
            99,
            json!({"runpod.io/managed": "true"}),
            Some(false),
        );
        let explicit_beats_managed = pod(
            "explicit",
            99,
            json!({"runpod.io/managed": "true", "runpod.io/burst-mode": "never"}),
            Some(false),
        );
        let mut bound = delayed("bound", 99);
        bound.spec.as_mut().unwrap().node_name = Some("gpu-1".into());
        let mut moved_already = delayed("moved", 99);
        moved_already.spec.as_mut().unwrap().tolerations =
            Some(vec![virtual_node_toleration("runpod")]);
        let mut running = delayed("running", 99);
        running.status.as_mut().unwrap().phase = Some("Running".into());
        let mut deleted = delayed("deleted", 99);
        deleted.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
        let pods = [
            fallback,
            managed,
            explicit_beats_managed,
            bound,
            moved_already,
            running,
            deleted,
        ];
        let plan = plan(&waiting(&pods), settings(0, 10), now());
        assert_eq!(moved(&plan), [("managed".to_owned(), "max_pending_time")]);
    }

    #[test]
    fn a_jobs_later_offload_true_wins_over_the_pods_copied_false() {
        let copied = pod(
            "p",
            5,
            json!({"runpod.io/burst-mode": "delayed", "runpod.io/offload": "false"}),
            Some(false),
        );
        let job: BTreeMap<String, String> =
            [("runpod.io/offload".to_owned(), "true".to_owned())].into();
        let pods = [Waiting {
            pod: &copied,
            job: Some(&job),
        }];
        let plan = plan(&pods, settings(3600, 10), now());
        assert_eq!(moved(&plan), [("p".to_owned(), "offload_annotation")]);
    }

    #[test]
    fn a_pod_nominated_for_a_local_node_is_left_to_the_scheduler() {
        let mut nominated = delayed("n", 99);
        nominated.status.as_mut().unwrap().nominated_node_name = Some("gpu-1".into());
        let pods = [nominated];
        let plan = plan(&waiting(&pods), settings(0, 0), now());
        assert!(plan.moves.is_empty());
    }

    #[test]
    fn the_same_inputs_give_the_same_moves() {
        let pods = [delayed("a", 10), delayed("b", 30), delayed("c", 20)];
        let first = plan(&waiting(&pods), settings(25, 1), now());
        let again = plan(&waiting(&pods), settings(25, 1), now());
        assert_eq!(first, again);
        assert_eq!(
            moved(&first),
            [
                ("b".to_owned(), "max_pending_time"),
                ("c".to_owned(), "threshold")
            ]
        );
    }

    #[test]
    fn waits_read_as_the_seed_prints_them() {
        assert_eq!(go_duration(Duration::from_secs(300)), "5m0s");
        assert_eq!(go_duration(Duration::from_secs(40)), "40s");
        assert_eq!(go_duration(Duration::from_secs(3723)), "1h2m3s");
    }

    #[test]
    fn the_webhooks_toleration_is_recognised_in_its_forms() {
        let mut pod = delayed("p", 1);
        assert!(!tolerates_virtual_node(&pod));
        pod.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some(contract::PROVIDER_TAINT_KEY.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(tolerates_virtual_node(&pod));
        pod.spec.as_mut().unwrap().tolerations = Some(vec![virtual_node_toleration("runpod")]);
        assert!(tolerates_virtual_node(&pod));
    }
}
