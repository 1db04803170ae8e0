use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::controller::fixtures::instance;
use crate::provider::Instance;

fn deleted(grace: Option<i64>) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.uid = Some("u1".into());
    pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-01-01T00:00:00Z".parse().unwrap(),
    ));
    pod.metadata.deletion_grace_period_seconds = grace;
    pod
}

fn in_state(id: &str, state: InstanceState) -> Instance {
    Instance {
        state,
        ..instance(id, "c1", "vr", Some("u1"))
    }
}

fn calls(pod: &Pod, live: &[Instance], memory: &PodMemory) -> Vec<(String, EndCall)> {
    due(&pod.metadata, live, memory)
        .into_iter()
        .map(|(instance, call)| (instance.id.clone(), call))
        .collect()
}

#[test]
fn a_deleted_pods_running_instance_is_stopped_and_others_terminated_once() {
    let live = [
        in_state("run", InstanceState::Running),
        in_state("boot", InstanceState::Starting),
        in_state("err", InstanceState::Error),
        in_state("done", InstanceState::Exited),
    ];
    let memory = PodMemory::default();
    assert_eq!(
        calls(&deleted(None), &live, &memory),
        [
            ("run".to_owned(), EndCall::Stop),
            ("boot".to_owned(), EndCall::Terminate),
            ("err".to_owned(), EndCall::Terminate),
        ],
        "an exited instance bills storage only: the worker's DELETE"
    );
    // A grace-0 deletion is one DELETE, also of a running instance.
    assert_eq!(
        calls(&deleted(Some(0)), &live[..1], &memory),
        [("run".to_owned(), EndCall::Terminate)]
    );
    // A pod not being deleted needs nothing from here.
    let mut alive = deleted(None);
    alive.metadata.deletion_timestamp = None;
    assert!(calls(&alive, &live, &memory).is_empty());
}

#[test]
fn nothing_is_sent_twice() {
    let live = [
        in_state("a", InstanceState::Running),
        in_state("b", InstanceState::Running),
        in_state("c", InstanceState::Running),
        in_state("d", InstanceState::Running),
        in_state("e", InstanceState::Running),
    ];
    let memory = PodMemory {
        ending: ["a".to_owned()].into(),
        stop_sent: HashMap::from([("b".to_owned(), "2026-01-01T00:00:01Z".parse().unwrap())]),
        stopped: ["c".to_owned()].into(),
        terminated: ["d".to_owned()].into(),
        ..PodMemory::default()
    };
    assert_eq!(
        calls(&deleted(None), &live, &memory),
        [("e".to_owned(), EndCall::Stop)]
    );
}

#[test]
fn the_grace_period_defaults_to_thirty_seconds() {
    assert_eq!(
        grace_period(&deleted(None).metadata),
        Duration::from_secs(30)
    );
    assert_eq!(
        grace_period(&deleted(Some(5)).metadata),
        Duration::from_secs(5)
    );
    assert_eq!(grace_period(&deleted(Some(-1)).metadata), Duration::ZERO);
}

#[test]
fn an_instance_the_list_does_not_show_is_ended_or_waited_for() {
    let listed_instance = in_state("a", InstanceState::Running);
    let listed = [&listed_instance];
    let none: [&Instance; 0] = [];
    let gone: HashSet<String> = ["x".to_owned()].into();
    let facts = |known, listed, create_unsettled| UnlistedFacts {
        known,
        listed,
        terminated: &gone,
        create_unsettled,
    };
    let cases = [
        // A known instance the list lags behind: its DELETE goes by id, not after the pod.
        (
            "known, unlisted",
            facts(Some("b"), &none, false),
            Unlisted::TerminateById("b".into()),
        ),
        (
            "known, others listed",
            facts(Some("b"), &listed, true),
            Unlisted::TerminateById("b".into()),
        ),
        (
            "known and listed",
            facts(Some("a"), &listed, true),
            Unlisted::Nothing,
        ),
        (
            "known and terminated",
            facts(Some("x"), &none, false),
            Unlisted::Nothing,
        ),
        // A create whose answer was lost: the pod waits for lists that may show it.
        (
            "lost answer",
            facts(None, &none, true),
            Unlisted::WaitForList,
        ),
        (
            "terminated, then a create",
            facts(Some("x"), &none, true),
            Unlisted::WaitForList,
        ),
        (
            "settled absence",
            facts(None, &none, false),
            Unlisted::Nothing,
        ),
        (
            "listed, create unsettled",
            facts(None, &listed, true),
            Unlisted::Nothing,
        ),
    ];
    for (case, facts, expected) in cases {
        assert_eq!(unlisted(&facts), expected, "{case}");
    }
}

#[test]
fn an_annotated_id_is_ended_only_when_the_cloud_says_it_is_this_pods() {
    let mine = in_state("i1", InstanceState::Running);
    let other = Instance {
        tags: crate::provider::Tags {
            pod_uid: Some("someone-else".into()),
            ..mine.tags.clone()
        },
        ..in_state("i2", InstanceState::Running)
    };
    let gone = in_state("i3", InstanceState::Terminated);
    assert!(
        ours_to_end("i9", Some("i9"), "u1", None),
        "made by this leader"
    );
    assert!(ours_to_end("i1", None, "u1", Some(&mine)));
    assert!(
        !ours_to_end("i2", None, "u1", Some(&other)),
        "another pod's instance"
    );
    assert!(!ours_to_end("i3", None, "u1", Some(&gone)), "already gone");
    assert!(
        !ours_to_end("i4", None, "u1", None),
        "the cloud does not know it"
    );
}
