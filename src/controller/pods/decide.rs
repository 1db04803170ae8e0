//! The pure decisions of a reconcile: which one thing to do for a pod now (`decide`), and what
//! an existing instance means for it (`track_step`). Inputs are the pod, the last complete list,
//! what this leader remembers, the settings and the clock; the async shells in `create`,
//! `track` and `finish` carry the step out.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{annotation, bound_at};
use crate::controller::clock::elapsed;
use crate::controller::context::Snapshot;
use crate::controller::pods::status::{self, RecordedEnd};
use crate::provider::{Instance, InstanceState};

/// What this leader remembers about the pod that the decision needs.
#[derive(Debug, Default)]
pub struct Remembered<'a> {
    /// The instance this leader created or adopted, and when.
    pub instance: Option<(&'a str, Timestamp)>,
    pub terminated: Option<&'a HashSet<String>>,
}

/// The one thing to do for a pod now.
#[derive(Debug)]
pub enum Step<'a> {
    /// Being deleted: stop, then terminate, every live instance; then remove the pod.
    Delete { live: Vec<&'a Instance> },
    /// The pod has ended: terminate what still lives.
    Ended { live: Vec<&'a Instance> },
    /// Follow this instance; the duplicates are terminated first.
    Track {
        primary: &'a Instance,
        duplicates: Vec<&'a Instance>,
    },
    /// An instance we made is not listed yet; the list may lag.
    WaitForList,
    /// An instance that existed is missing from lists that had time to show it. A list that
    /// omits a pod is no evidence that it is gone: only the cloud's answer for its id is.
    Confirm { id: Option<String> },
    /// Ended as recorded on the pod: terminate what this leader knows of, write the phase.
    FinishFromRecord {
        record: RecordedEnd,
        terminate: Option<String>,
    },
    /// Nothing exists and nothing is known to exist: create (subject to the create gate).
    Create,
}

/// The oldest instance is the one kept; the others are duplicates.
pub fn split_duplicates<'a>(
    mut instances: Vec<&'a Instance>,
    preferred: Option<&str>,
) -> (Option<&'a Instance>, Vec<&'a Instance>) {
    instances.sort_by_key(|i| {
        (
            Some(i.id.as_str()) != preferred,
            i.created_at.is_none(),
            i.created_at,
            i.id.clone(),
        )
    });
    let mut iter = instances.into_iter();
    let first = iter.next();
    (first, iter.collect())
}

/// Decides the next step for `pod` (its UID is `uid`) from the last complete list.
pub fn decide<'a>(
    pod: &Pod,
    uid: &'a str,
    snapshot: &'a Snapshot,
    remembered: &Remembered<'_>,
    create_settle: Duration,
    id_annotation: &str,
) -> Step<'a> {
    let terminated = |id: &str| remembered.terminated.is_some_and(|t| t.contains(id));
    let live: Vec<&Instance> = snapshot
        .for_pod(uid)
        .filter(|i| !terminated(&i.id))
        .collect();
    if pod.metadata.deletion_timestamp.is_some() {
        return Step::Delete { live };
    }
    if status::is_terminal(pod) {
        return Step::Ended { live };
    }
    let (primary, duplicates) = split_duplicates(live, remembered.instance.map(|(id, _)| id));
    if let Some(primary) = primary {
        return Step::Track {
            primary,
            duplicates,
        };
    }
    // Lists this old or newer may show an instance made at `since`.
    let listed_since = |since: Timestamp| {
        snapshot
            .confirmed_at
            .is_some_and(|confirmed| elapsed(since, confirmed) >= create_settle)
    };
    // Ended and recorded (by a controller that died before writing the phase, or whose
    // terminate answer was lost): nothing else decides this pod any more.
    if let Some(record) = RecordedEnd::on(pod) {
        return Step::FinishFromRecord {
            record,
            terminate: remembered
                .instance
                .map(|(id, _)| id)
                .filter(|id| !terminated(id))
                .map(str::to_owned),
        };
    }
    if let Some((id, created)) = remembered.instance.filter(|(id, _)| !terminated(id)) {
        return if listed_since(created) {
            Step::Confirm {
                id: Some(id.to_owned()),
            }
        } else {
            Step::WaitForList
        };
    }
    match annotation(pod, id_annotation) {
        // An instance this pod had (maybe a previous leader's): RunPod is asked for it by id
        // before anything is created, since lists that omit it prove nothing.
        Some(id) if !terminated(id) => Step::Confirm {
            id: Some(id.to_owned()),
        },
        // Known gone, and the pod goes on (restartPolicy Always, or it never ran): a new one.
        Some(_) => Step::Create,
        None => {
            let status = pod.status.as_ref();
            let was_running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
            let started = status.and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            if was_running && started.is_some_and(listed_since) {
                // Running, yet neither listed nor known by id: gone by the lists alone.
                Step::Confirm { id: None }
            } else {
                Step::Create
            }
        }
    }
}

/// What an existing instance means for its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrackStep {
    /// The container ended: read its exit code, then finish. `restarted`: RunPod restarted it
    /// (the wrapper could not stop the pod, or there was no command to wrap).
    Exited { restarted: bool },
    /// The pod fails for a reason outside its container; the instance is terminated.
    Fail {
        reason: &'static str,
        message: String,
    },
    /// Nothing ends: write the status.
    Status,
}

/// Since when the pod has waited for a running container, if it is waiting for one: its
/// instance is replacing one that vanished (`replacing_since`), or the pod never ran (its
/// phase never goes back from Running) and waits since it was bound.
pub fn provisioning_clock(pod: &Pod, replacing_since: Option<Timestamp>) -> Option<Timestamp> {
    let never_ran = pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running");
    replacing_since.or_else(|| never_ran.then(|| bound_at(pod)).flatten())
}

/// The meaning of `instance` for `pod` now. `restarted`: the container's uptime went back;
/// `waiting_since`: the [`provisioning_clock`].
pub fn track_step(
    pod: &Pod,
    instance: &Instance,
    restarted: bool,
    waiting_since: Option<Timestamp>,
    provision_timeout: Duration,
    now: Timestamp,
) -> TrackStep {
    let spec = pod.spec.as_ref();
    if let Some(deadline) = spec.and_then(|s| s.active_deadline_seconds)
        && let Some(start) = pod.status.as_ref().and_then(|s| s.start_time.as_ref())
        && elapsed(start.0, now) > Duration::from_secs(u64::try_from(deadline).unwrap_or(0))
    {
        return TrackStep::Fail {
            reason: "DeadlineExceeded",
            message: format!(
                "Pod was active on the node longer than the specified deadline ({deadline} s)"
            ),
        };
    }
    let restart_policy = spec
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    match instance.state {
        InstanceState::Exited => TrackStep::Exited { restarted: false },
        InstanceState::Error => TrackStep::Fail {
            reason: "RunPodError",
            message: instance.message.clone().unwrap_or_else(|| {
                format!(
                    "RunPod pod {} is in ERROR (e.g. the image could not be pulled)",
                    instance.id
                )
            }),
        },
        InstanceState::Running if restarted && restart_policy != "Always" => {
            TrackStep::Exited { restarted: true }
        }
        InstanceState::Running => TrackStep::Status,
        // Never started: after the provisioning timeout it is given up, not billed forever (a
        // bad image, a private image without registry auth, a stuck host).
        _ if waiting_since.is_some_and(|since| elapsed(since, now) > provision_timeout) => {
            let waited = humantime::format_duration(provision_timeout);
            let said = instance.message.as_deref().unwrap_or_default();
            if mentions_image(said) {
                TrackStep::Fail {
                    reason: "ImagePullBackOff",
                    message: format!(
                        "RunPod pod {} did not start within {waited}: {said}",
                        instance.id
                    ),
                }
            } else {
                TrackStep::Fail {
                    reason: "ProvisioningTimeout",
                    message: format!(
                        "RunPod pod {} was still {} after {waited}{}",
                        instance.id,
                        instance.state.as_str(),
                        if said.is_empty() {
                            String::new()
                        } else {
                            format!(": {said}")
                        }
                    ),
                }
            }
        }
        _ => TrackStep::Status,
    }
}

fn mentions_image(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    ["pull", "image", "manifest", "registry"]
        .iter()
        .any(|word| lower.contains(word))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Tags;
    use runpod_contract::POD_ID;
    use serde_json::json;

    const SETTLE: Duration = Duration::from_secs(30);
    const TIMEOUT: Duration = Duration::from_secs(60);

    fn at(text: &str) -> Timestamp {
        format!("2026-01-01T00:{text}Z").parse().unwrap()
    }

    fn instance(id: &str, uid: &str, state: InstanceState, created: &str) -> Instance {
        Instance {
            id: id.into(),
            name: "n".into(),
            tags: Tags {
                cluster_id: Some("c".into()),
                node_name: Some("vr".into()),
                pod_uid: Some(uid.into()),
            },
            state,
            uptime_secs: None,
            cost_per_hour: Some(0.44),
            gpu_type: Some("RTX".into()),
            datacenter: Some("EU-RO-1".into()),
            endpoints: vec![],
            ip: None,
            created_at: Some(at(created)),
            started_at: None,
            message: None,
            usage: None,
        }
    }

    fn pod(extra: serde_json::Value) -> Pod {
        let mut value = json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        });
        for (path, member) in extra.as_object().cloned().unwrap_or_default() {
            let (outer, inner) = path.split_once('.').unwrap();
            value[outer][inner] = member;
        }
        serde_json::from_value(value).unwrap()
    }

    fn snapshot(instances: Vec<Instance>, confirmed: Option<&str>) -> Snapshot {
        Snapshot {
            taken_at: at("10:00"),
            instances,
            confirmed_at: confirmed.map(at),
        }
    }

    fn name(step: &Step<'_>) -> String {
        match step {
            Step::Delete { live } => format!("delete {}", live.len()),
            Step::Ended { live } => format!("ended {}", live.len()),
            Step::Track {
                primary,
                duplicates,
            } => format!("track {} dup {}", primary.id, duplicates.len()),
            Step::WaitForList => "wait".into(),
            Step::Confirm { id } => format!("confirm {}", id.as_deref().unwrap_or("?")),
            Step::FinishFromRecord { terminate, .. } => {
                format!("record {}", terminate.as_deref().unwrap_or("-"))
            }
            Step::Create => "create".into(),
        }
    }

    #[test]
    fn the_next_step_for_a_pod() {
        let running = instance("a", "u1", InstanceState::Running, "00:00");
        let younger = instance("b", "u1", InstanceState::Running, "00:05");
        let other = instance("x", "u2", InstanceState::Running, "00:00");
        let terminated: HashSet<String> = ["a".to_owned()].into();
        let started = json!({"status.phase": "Running",
            "status.startTime": "2026-01-01T00:01:00Z"});
        let cases: Vec<(&str, Pod, Snapshot, Remembered<'_>, &str)> = vec![
            (
                "nothing listed, nothing known: create",
                pod(json!({})),
                snapshot(vec![other.clone()], Some("09:00")),
                Remembered::default(),
                "create",
            ),
            (
                "the oldest is kept, the younger is a duplicate",
                pod(json!({})),
                snapshot(vec![younger.clone(), running.clone()], None),
                Remembered::default(),
                "track a dup 1",
            ),
            (
                "the one this leader made is kept even if younger",
                pod(json!({})),
                snapshot(vec![younger.clone(), running.clone()], None),
                Remembered {
                    instance: Some(("b", at("00:05"))),
                    terminated: None,
                },
                "track b dup 1",
            ),
            (
                "a terminated instance is not tracked again",
                pod(json!({})),
                snapshot(vec![running.clone()], Some("09:00")),
                Remembered {
                    instance: None,
                    terminated: Some(&terminated),
                },
                "create",
            ),
            (
                "deleted: delete whatever lives",
                pod(json!({"metadata.deletionTimestamp": "2026-01-01T00:09:00Z"})),
                snapshot(vec![running.clone()], None),
                Remembered::default(),
                "delete 1",
            ),
            (
                "ended: terminate whatever lives",
                pod(json!({"status.phase": "Succeeded"})),
                snapshot(vec![running.clone()], None),
                Remembered::default(),
                "ended 1",
            ),
            (
                "made a moment ago and not listed yet: wait, never create again",
                pod(json!({})),
                snapshot(vec![], Some("00:20")),
                Remembered {
                    instance: Some(("a", at("00:00"))),
                    terminated: None,
                },
                "wait",
            ),
            (
                "made long ago and missing from settled lists: ask RunPod by id",
                pod(json!({})),
                snapshot(vec![], Some("05:00")),
                Remembered {
                    instance: Some(("a", at("00:00"))),
                    terminated: None,
                },
                "confirm a",
            ),
            (
                "running, unknown to this leader, missing: ask RunPod by id",
                pod(json!({"status.phase": "Running",
                    "status.startTime": "2026-01-01T00:01:00Z",
                    "metadata.annotations": {"runpod.io/pod-id": "a"}})),
                snapshot(vec![], Some("05:00")),
                Remembered::default(),
                "confirm a",
            ),
            (
                "running but just started: the list may lag, create is gated later",
                pod(started.clone()),
                snapshot(vec![], Some("01:10")),
                Remembered::default(),
                "create",
            ),
            (
                "pending with a pod-id from a previous leader, lists omit it: ask by id, never create",
                pod(json!({"metadata.annotations": {"runpod.io/pod-id": "a"}})),
                snapshot(vec![], Some("05:00")),
                Remembered::default(),
                "confirm a",
            ),
            (
                "recorded end while this leader's instance is not listed: finish, terminating it",
                pod(json!({"metadata.annotations": {"runpod.io/ended":
                    r#"{"exit_code":0,"reason":"Completed"}"#}})),
                snapshot(vec![], Some("05:00")),
                Remembered {
                    instance: Some(("a", at("00:00"))),
                    terminated: None,
                },
                "record a",
            ),
            (
                "running, no pod-id, missing from settled lists",
                pod(json!({"status.phase": "Running",
                    "status.startTime": "2026-01-01T00:01:00Z"})),
                snapshot(vec![], Some("05:00")),
                Remembered::default(),
                "confirm ?",
            ),
            (
                "running, its instance known gone (restartPolicy Always): create anew",
                pod(json!({"status.phase": "Running",
                    "status.startTime": "2026-01-01T00:01:00Z",
                    "metadata.annotations": {"runpod.io/pod-id": "a"}})),
                snapshot(vec![], Some("05:00")),
                Remembered {
                    instance: None,
                    terminated: Some(&terminated),
                },
                "create",
            ),
            (
                "the end is recorded: finish from the record",
                pod(json!({"metadata.annotations": {"runpod.io/ended":
                    r#"{"exit_code":0,"reason":"Completed"}"#}})),
                snapshot(vec![], Some("09:00")),
                Remembered::default(),
                "record -",
            ),
        ];
        for (what, pod, snapshot, remembered, expected) in cases {
            let step = decide(&pod, "u1", &snapshot, &remembered, SETTLE, POD_ID);
            assert_eq!(name(&step), expected, "{what}");
        }
    }

    #[test]
    fn what_an_instance_means_for_its_pod() {
        let now = at("05:00");
        let bound_long_ago = pod(json!({}));
        let just_bound = pod(json!({"status.conditions": [{"type": "PodScheduled",
            "status": "True", "lastTransitionTime": "2026-01-01T00:04:30Z"}]}));
        let was_running = pod(json!({"status.phase": "Running",
            "status.startTime": "2026-01-01T00:01:00Z"}));
        let always = pod(json!({"spec.restartPolicy": "Always"}));
        let deadline = pod(json!({"spec.activeDeadlineSeconds": 60,
            "status.startTime": "2026-01-01T00:01:00Z", "status.phase": "Running"}));
        let state = |state| instance("a", "u1", state, "00:00");
        let mut pulling = state(InstanceState::Starting);
        pulling.message = Some("Error response: pull access denied for private/img".into());
        let reason = |step: TrackStep| match step {
            TrackStep::Fail { reason, .. } => reason.to_owned(),
            TrackStep::Exited { restarted } => format!("exited restarted={restarted}"),
            TrackStep::Status => "status".to_owned(),
        };
        let cases: Vec<(&str, &Pod, Instance, bool, &str)> = vec![
            (
                "running",
                &bound_long_ago,
                state(InstanceState::Running),
                false,
                "status",
            ),
            (
                "exited",
                &bound_long_ago,
                state(InstanceState::Exited),
                false,
                "exited restarted=false",
            ),
            (
                "error",
                &bound_long_ago,
                state(InstanceState::Error),
                false,
                "RunPodError",
            ),
            (
                "restarted, Never",
                &bound_long_ago,
                state(InstanceState::Running),
                true,
                "exited restarted=true",
            ),
            (
                "restarted, Always",
                &always,
                state(InstanceState::Running),
                true,
                "status",
            ),
            (
                "stuck provisioning past the timeout",
                &bound_long_ago,
                state(InstanceState::Provisioning),
                false,
                "ProvisioningTimeout",
            ),
            (
                "stuck starting past the timeout",
                &bound_long_ago,
                state(InstanceState::Starting),
                false,
                "ProvisioningTimeout",
            ),
            (
                "unknown state past the timeout",
                &bound_long_ago,
                state(InstanceState::Unknown),
                false,
                "ProvisioningTimeout",
            ),
            (
                "an image that cannot be pulled",
                &bound_long_ago,
                pulling,
                false,
                "ImagePullBackOff",
            ),
            (
                "starting within the timeout",
                &just_bound,
                state(InstanceState::Starting),
                false,
                "status",
            ),
            (
                "ran before, restarting now: not a provisioning timeout",
                &was_running,
                state(InstanceState::Starting),
                false,
                "status",
            ),
            (
                "past its active deadline",
                &deadline,
                state(InstanceState::Running),
                false,
                "DeadlineExceeded",
            ),
        ];
        for (what, pod, instance, restarted, expected) in cases {
            let clock = provisioning_clock(pod, None);
            let step = track_step(pod, &instance, restarted, clock, TIMEOUT, now);
            assert_eq!(reason(step), expected, "{what}");
        }
        // A replacement for a vanished instance has its own clock, even on a Running pod.
        let stuck = instance("b", "u1", InstanceState::Starting, "00:00");
        let clock = provisioning_clock(&was_running, Some(at("03:00")));
        assert_eq!(
            reason(track_step(&was_running, &stuck, false, clock, TIMEOUT, now)),
            "ProvisioningTimeout",
            "a replacement stuck past the timeout"
        );
        let clock = provisioning_clock(&was_running, Some(at("04:30")));
        assert_eq!(
            reason(track_step(&was_running, &stuck, false, clock, TIMEOUT, now)),
            "status",
            "a replacement within the timeout"
        );
    }

    #[test]
    fn the_oldest_instance_is_kept_unless_one_is_known() {
        let old = instance("old", "u1", InstanceState::Running, "00:00");
        let new = instance("new", "u1", InstanceState::Running, "00:05");
        let (keep, extra) = split_duplicates(vec![&new, &old], None);
        assert_eq!(keep.unwrap().id, "old");
        assert_eq!(extra[0].id, "new");
        let (keep, _) = split_duplicates(vec![&new, &old], Some("new"));
        assert_eq!(keep.unwrap().id, "new");
    }
}
