use super::*;
use crate::provider::CloudName;
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
        ssh: None,
        machine: None,
        disruption: None,
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
        TrackStep::Disrupted(disruption) => format!("disrupted {}", disruption.reason()),
    };
    let mut outbid = state(InstanceState::Error);
    outbid.disruption = Some(crate::provider::Disruption::Outbid);
    let mut host_lost = state(InstanceState::Error);
    host_lost.disruption = Some(crate::provider::Disruption::Lost);
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
            "outbid: the cloud's doing, not an error",
            &bound_long_ago,
            outbid,
            false,
            "disrupted Outbid",
        ),
        (
            "the host lost",
            &always,
            host_lost,
            false,
            "disrupted CloudInstanceLost",
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
        let step = track_step(
            pod,
            &instance,
            restarted,
            clock,
            TIMEOUT,
            now,
            CloudName::RUNPOD,
        );
        assert_eq!(reason(step), expected, "{what}");
    }
    // A replacement for a vanished instance has its own clock, even on a Running pod.
    let stuck = instance("b", "u1", InstanceState::Starting, "00:00");
    let clock = provisioning_clock(&was_running, Some(at("03:00")));
    assert_eq!(
        reason(track_step(
            &was_running,
            &stuck,
            false,
            clock,
            TIMEOUT,
            now,
            CloudName::RUNPOD
        )),
        "ProvisioningTimeout",
        "a replacement stuck past the timeout"
    );
    let clock = provisioning_clock(&was_running, Some(at("04:30")));
    assert_eq!(
        reason(track_step(
            &was_running,
            &stuck,
            false,
            clock,
            TIMEOUT,
            now,
            CloudName::RUNPOD
        )),
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

#[test]
fn a_vanished_instance_is_replaced_for_always_and_fails_any_other_pod() {
    let always = pod(json!({"spec.restartPolicy": "Always"}));
    let replaced = vanished(&always, "abc", CloudName::RUNPOD);
    assert!(replaced.replace);
    assert!(replaced.outcome.status.is_none());
    assert_eq!(
        replaced.outcome.next,
        Next::Requeue(crate::controller::pods::SHORT)
    );
    assert_eq!(replaced.outcome.events[0].reason, "CloudInstanceLost");
    assert!(
        replaced.outcome.events[0]
            .message
            .contains("abc no longer exists")
    );
    assert!(
        replaced.outcome.events[0]
            .message
            .contains("creating a new one")
    );

    // Never, or an id nobody recorded: failed for good.
    for (pod, id) in [(pod(json!({})), "abc"), (always, "(unknown)")] {
        let failed = vanished(&pod, id, CloudName::RUNPOD);
        assert!(!failed.replace, "{id}");
        assert_eq!(failed.outcome.next, Next::AwaitChange);
        assert!(matches!(
            failed.outcome.status,
            Some(View::Failed {
                reason: "CloudInstanceLost",
                ..
            })
        ));
        assert!(failed.outcome.events[0].warning);
    }
}

#[test]
fn a_rejected_placement_names_the_instance_and_the_violation() {
    let note = placement_rejected(CloudName::RUNPOD, "abc", "is in US-CA-1, not allowed");
    assert!(note.warning);
    assert_eq!(note.reason, "PlacementRejected");
    assert!(
        note.message
            .contains("abc is in US-CA-1, not allowed; terminating it")
    );
}
