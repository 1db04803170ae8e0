use super::*;
use crate::controller::probes::state::Probed;
use crate::provider::CloudName;
use crate::provider::{Endpoint, Tags};
use serde_json::json;

fn pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"containers": [{"name": "main", "image": "img"}], "nodeName": "virtual-runpod"}
    }))
    .unwrap()
}

fn instance(state: InstanceState, tcp_published: bool) -> Instance {
    Instance {
        ssh: None,
        machine: None,
        disruption: None,
        id: "abc".into(),
        name: "n".into(),
        tags: Tags::default(),
        state,
        uptime_secs: Some(5),
        cost_per_hour: Some(0.4),
        gpu_type: Some("RTX".into()),
        datacenter: Some("EU-RO-1".into()),
        endpoints: vec![Endpoint {
            port: 22,
            protocol: "tcp".into(),
            address: tcp_published.then(|| "1.2.3.4:40000".into()),
        }],
        ip: Some("1.2.3.4".into()),
        created_at: None,
        started_at: Some("2026-01-01T00:00:00Z".parse().unwrap()),
        message: None,
        usage: None,
    }
}

fn now() -> Timestamp {
    "2026-01-01T00:10:00Z".parse().unwrap()
}

#[test]
fn running_is_ready_only_once_tcp_ports_are_mapped() {
    let pod = pod();
    let unmapped = instance(InstanceState::Running, false);
    let status = desired(
        &pod,
        &View::Instance {
            cloud: CloudName::RUNPOD,
            instance: &unmapped,
            restarts: 0,
            probed: None,
        },
        "10.0.0.1",
        now(),
    );
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert!(!status.container_statuses.as_ref().unwrap()[0].ready);
    let mapped = instance(InstanceState::Running, true);
    let status = desired(
        &pod,
        &View::Instance {
            cloud: CloudName::RUNPOD,
            instance: &mapped,
            restarts: 0,
            probed: None,
        },
        "10.0.0.1",
        now(),
    );
    let container = &status.container_statuses.as_ref().unwrap()[0];
    assert!(container.ready);
    assert_eq!(container.container_id.as_deref(), Some("runpod://abc"));
    assert_eq!(status.pod_ip, None);
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");
}

#[test]
fn a_readiness_probe_gates_ready_and_a_startup_probe_gates_started() {
    let pod = pod();
    let mapped = instance(InstanceState::Running, true);
    let with = |probed| {
        desired(
            &pod,
            &View::Instance {
                cloud: CloudName::RUNPOD,
                instance: &mapped,
                restarts: 0,
                probed: Some(probed),
            },
            "10.0.0.1",
            now(),
        )
    };
    let ready_condition = |status: &k8s_openapi::api::core::v1::PodStatus| {
        status
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .status
            .clone()
    };
    let failing = with(Probed {
        ready: Some(false),
        started: false,
    });
    let container = &failing.container_statuses.as_ref().unwrap()[0];
    assert!(
        !container.ready,
        "ports mapped, but the readiness probe has not passed"
    );
    assert_eq!(
        container.started,
        Some(false),
        "the startup probe has not passed"
    );
    assert_eq!(ready_condition(&failing), "False");
    let passing = with(Probed {
        ready: Some(true),
        started: true,
    });
    let container = &passing.container_statuses.as_ref().unwrap()[0];
    assert!(container.ready);
    assert_eq!(container.started, Some(true));
    assert_eq!(ready_condition(&passing), "True");
    // No readiness probe: the ports decide.
    let unprobed = with(Probed {
        ready: None,
        started: true,
    });
    assert!(unprobed.container_statuses.as_ref().unwrap()[0].ready);
}

#[test]
fn provisioning_is_pending_and_exit_codes_decide_the_phase() {
    let pod = pod();
    let starting = instance(InstanceState::Starting, false);
    let status = desired(
        &pod,
        &View::Instance {
            cloud: CloudName::RUNPOD,
            instance: &starting,
            restarts: 0,
            probed: None,
        },
        "h",
        now(),
    );
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    for (code, phase) in [
        (Some(0), "Succeeded"),
        (Some(3), "Failed"),
        (None, "Failed"),
    ] {
        let view = View::Ended {
            exit_code: code,
            reason: "Completed",
            message: String::new(),
            started_at: None,
            restarts: 0,
        };
        let status = desired(&pod, &view, "h", now());
        assert_eq!(status.phase.as_deref(), Some(phase));
        let terminated = status.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(terminated.exit_code, code.unwrap_or(137));
    }
    let failed = desired(
        &pod,
        &View::Failed {
            reason: "ProvisioningTimeout",
            message: "m".into(),
        },
        "h",
        now(),
    );
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    assert_eq!(failed.reason.as_deref(), Some("ProvisioningTimeout"));
}

#[test]
fn an_unchanged_state_needs_no_write() {
    let mut pod = pod();
    let running = instance(InstanceState::Running, true);
    let view = View::Instance {
        cloud: CloudName::RUNPOD,
        instance: &running,
        restarts: 0,
        probed: None,
    };
    let first = desired(&pod, &view, "h", now());
    assert_eq!(
        changes(&pod, &first),
        [
            "phase",
            "conditions",
            "containerStatuses",
            "hostIP",
            "startTime"
        ]
    );
    pod.status = Some(first);
    let later: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
    let second = desired(&pod, &view, "h", later);
    assert!(
        changes(&pod, &second).is_empty(),
        "a later identical view rewrote the status"
    );
}

#[test]
fn a_status_as_the_apiserver_returns_it_needs_no_write() {
    let mut pod = pod();
    for state in [
        InstanceState::Running,
        InstanceState::Starting,
        InstanceState::Provisioning,
    ] {
        let running = instance(state, true);
        let view = View::Instance {
            cloud: CloudName::RUNPOD,
            instance: &running,
            restarts: 0,
            probed: None,
        };
        let written = desired(&pod, &view, "h", now());
        // What the apiserver sends back: an unset `lastState` as `{}`, what is unset
        // left out.
        let mut stored = serde_json::to_value(&written).unwrap();
        for status in stored["containerStatuses"].as_array_mut().unwrap() {
            status["lastState"] = serde_json::json!({});
        }
        pod.status = Some(serde_json::from_value(stored).unwrap());
        let later: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
        let again = desired(&pod, &view, "h", later);
        assert!(changes(&pod, &again).is_empty(), "{state:?} rewritten");
    }
}

#[test]
fn a_running_pod_without_a_start_time_keeps_the_first_one_seen() {
    let mut pod = pod();
    let mut running = instance(InstanceState::Running, true);
    running.started_at = None;
    let view = View::Instance {
        cloud: CloudName::RUNPOD,
        instance: &running,
        restarts: 0,
        probed: None,
    };
    pod.status = Some(desired(&pod, &view, "h", now()));
    let later: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
    assert!(changes(&pod, &desired(&pod, &view, "h", later)).is_empty());
}

#[test]
fn members_the_controller_owns_are_cleared_when_unset() {
    let mut pod = pod();
    let running = instance(InstanceState::Running, true);
    let view = View::Instance {
        cloud: CloudName::RUNPOD,
        instance: &running,
        restarts: 0,
        probed: None,
    };
    let mut written = desired(&pod, &view, "h", now());
    written.reason = Some("NodeLost".into());
    pod.status = Some(written);
    let again = desired(&pod, &view, "h", now());
    assert_eq!(changes(&pod, &again), ["reason"]);
    assert_eq!(owned_members(&again)["reason"], serde_json::Value::Null);
}

#[test]
fn a_recorded_end_writes_the_same_terminal_status() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "uid": "u"},
        "spec": {"containers": [{"name": "main", "image": "img"}]}
    }))
    .unwrap();
    for view in [
        View::Ended {
            exit_code: Some(0),
            reason: "Completed",
            message: "the command exited with code 0".into(),
            started_at: None,
            restarts: 1,
        },
        View::Failed {
            reason: "ProvisioningTimeout",
            message: "no GPU".into(),
        },
    ] {
        let record = RecordedEnd::of(&view).unwrap();
        let mut annotated = pod.clone();
        annotated.metadata.annotations = Some(
            [(
                runpod_contract::ENDED.to_owned(),
                serde_json::to_string(&record).unwrap(),
            )]
            .into(),
        );
        let read = RecordedEnd::on(&annotated).unwrap();
        let at = now();
        let direct = desired(&pod, &view, "h", at);
        let replayed = desired(&pod, &read.view(), "h", at);
        assert_eq!(direct.phase, replayed.phase);
        assert_eq!(direct.reason, replayed.reason);
        assert_eq!(
            serde_json::to_value(&direct.container_statuses).unwrap()[0]["state"],
            serde_json::to_value(&replayed.container_statuses).unwrap()[0]["state"]
        );
    }
    assert_eq!(RecordedEnd::on(&pod), None);
}

fn running_view(instance: &Instance) -> View<'_> {
    View::Instance {
        cloud: CloudName::RUNPOD,
        instance,
        restarts: 0,
        probed: None,
    }
}

fn find<'a>(status: &'a PodStatus, kind: &str) -> &'a PodCondition {
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind)
        .unwrap_or_else(|| panic!("no {kind} condition"))
}

fn foreign(kind: &str, status: &str) -> PodCondition {
    PodCondition {
        type_: kind.into(),
        status: status.into(),
        reason: Some("SetElsewhere".into()),
        last_transition_time: Some(Time("2025-12-31T00:00:00Z".parse().unwrap())),
        ..Default::default()
    }
}

fn with_gates(gates: &[&str]) -> Pod {
    let mut pod = pod();
    pod.spec.as_mut().unwrap().readiness_gates = Some(
        gates
            .iter()
            .map(|g| k8s_openapi::api::core::v1::PodReadinessGate {
                condition_type: (*g).into(),
            })
            .collect(),
    );
    pod
}

#[test]
fn pod_ip_is_never_set_and_one_written_earlier_is_cleared() {
    let mut pod = pod();
    let running = instance(InstanceState::Running, true);
    let fresh = desired(&pod, &running_view(&running), "h", now());
    assert_eq!((&fresh.pod_ip, &fresh.pod_ips), (&None, &None));
    // What an earlier version wrote: the apiserver keeps both members.
    let mut old = fresh.clone();
    old.pod_ip = Some("1.2.3.4".into());
    old.pod_ips = Some(vec![k8s_openapi::api::core::v1::PodIP {
        ip: "1.2.3.4".into(),
    }]);
    pod.status = Some(old);
    let again = desired(&pod, &running_view(&running), "h", now());
    assert_eq!(changes(&pod, &again), ["podIP", "podIPs"]);
    let Patch::Strategic(body) = patch(&pod, &again) else {
        panic!("not a strategic merge patch");
    };
    assert_eq!(body["status"]["podIP"], serde_json::Value::Null);
    assert_eq!(body["status"]["podIPs"], serde_json::Value::Null);
    assert!(body["status"].as_object().unwrap().contains_key("podIPs"));
}

#[test]
fn a_running_pod_never_goes_back_to_pending() {
    let running = instance(InstanceState::Running, true);
    let mut pod = pod();
    pod.status = Some(desired(&pod, &running_view(&running), "h", now()));
    let starting = instance(InstanceState::Starting, false);
    let provisioning = instance(InstanceState::Provisioning, false);
    let unknown = instance(InstanceState::Unknown, false);
    for view in [
        running_view(&starting),
        running_view(&provisioning),
        running_view(&unknown),
        View::Waiting {
            reason: "ContainerCreating",
            message: "a new RunPod pod".into(),
        },
    ] {
        let status = desired(&pod, &view, "h", now());
        assert_eq!(status.phase.as_deref(), Some("Running"), "{view:?}");
        let container = &status.container_statuses.as_ref().unwrap()[0];
        let state = container.state.as_ref().unwrap();
        assert!(
            state.waiting.is_some() && state.running.is_none(),
            "{view:?}"
        );
        assert!(!container.ready, "{view:?}");
        assert_eq!(container.started, Some(false), "{view:?}");
        assert_eq!(find(&status, "Ready").status, "False", "{view:?}");
    }
    // A pod that never ran is still Pending while its instance starts.
    assert_eq!(
        desired(&self::pod(), &running_view(&starting), "h", now())
            .phase
            .as_deref(),
        Some("Pending")
    );
}

#[test]
fn a_terminal_pod_keeps_its_status() {
    let running = instance(InstanceState::Running, true);
    let starting = instance(InstanceState::Starting, false);
    for (code, phase) in [(Some(0), "Succeeded"), (Some(2), "Failed")] {
        let mut pod = pod();
        let ended = View::Ended {
            exit_code: code,
            reason: "Completed",
            message: String::new(),
            started_at: None,
            restarts: 0,
        };
        let end = desired(&pod, &ended, "h", now());
        assert_eq!(end.phase.as_deref(), Some(phase));
        pod.status = Some(end.clone());
        for view in [
            running_view(&running),
            running_view(&starting),
            View::Waiting {
                reason: "ContainerCreating",
                message: String::new(),
            },
            View::Ended {
                exit_code: Some(if code == Some(0) { 1 } else { 0 }),
                reason: "Error",
                message: String::new(),
                started_at: None,
                restarts: 0,
            },
            View::Failed {
                reason: "NodeLost",
                message: String::new(),
            },
        ] {
            let later: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
            let status = desired(&pod, &view, "h", later);
            assert_eq!(status, end, "{phase} changed by {view:?}");
            assert!(changes(&pod, &status).is_empty());
        }
    }
}

#[test]
fn foreign_conditions_are_kept_in_place_and_need_no_write() {
    let running = instance(InstanceState::Running, true);
    let view = running_view(&running);
    let later: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
    // A foreign condition first (written before the controller's first write), and one
    // between owned ones (written after).
    let mut pod = pod();
    pod.status = Some(PodStatus {
        conditions: Some(vec![foreign("example.com/first", "True")]),
        ..Default::default()
    });
    let first = desired(&pod, &view, "h", now());
    let mut conditions = first.conditions.clone().unwrap();
    assert_eq!(conditions[0], foreign("example.com/first", "True"));
    conditions.insert(2, foreign("example.com/between", "False"));
    pod.status = Some(PodStatus {
        conditions: Some(conditions.clone()),
        ..first
    });
    let again = desired(&pod, &view, "h", later);
    assert_eq!(again.conditions.as_ref(), Some(&conditions));
    assert!(
        changes(&pod, &again).is_empty(),
        "foreign conditions rewritten"
    );
    // An owned condition that changes is replaced where it stands.
    let unmapped = instance(InstanceState::Running, false);
    let unready = desired(&pod, &running_view(&unmapped), "h", later);
    let kinds: Vec<_> = unready
        .conditions
        .iter()
        .flatten()
        .map(|c| c.type_.as_str())
        .collect();
    let expected: Vec<_> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(kinds, expected);
    assert_eq!(changes(&pod, &unready), ["conditions", "containerStatuses"]);
}

#[test]
fn ready_honours_readiness_gates() {
    let mapped = instance(InstanceState::Running, true);
    let unmapped = instance(InstanceState::Running, false);
    // (gate conditions present, containers ready, Ready, its reason, message contains)
    let missing =
        "corresponding condition of pod readiness gate \"example.com/lb\" does not exist.";
    let not_true = "the status of pod readiness gate \"example.com/lb\" is not \"True\", but False";
    for (gate, instance, ready, reason, message) in [
        (
            None,
            &mapped,
            "False",
            Some("ReadinessGatesNotReady"),
            Some(missing),
        ),
        (
            Some("False"),
            &mapped,
            "False",
            Some("ReadinessGatesNotReady"),
            Some(not_true),
        ),
        (Some("True"), &mapped, "True", None, None),
        (
            Some("True"),
            &unmapped,
            "False",
            Some("ContainersNotReady"),
            None,
        ),
    ] {
        let mut pod = with_gates(&["example.com/lb"]);
        pod.status = Some(PodStatus {
            conditions: gate.map(|status| vec![foreign("example.com/lb", status)]),
            ..Default::default()
        });
        let status = desired(&pod, &running_view(instance), "h", now());
        let case = format!("gate {gate:?}, ports mapped {}", instance.ports_ready());
        let condition = find(&status, "Ready");
        assert_eq!(condition.status, ready, "{case}");
        assert_eq!(condition.reason.as_deref(), reason, "{case}");
        assert_eq!(condition.message.as_deref(), message, "{case}");
        // ContainersReady ignores the gates.
        let containers = if instance.ports_ready() {
            "True"
        } else {
            "False"
        };
        assert_eq!(
            find(&status, "ContainersReady").status,
            containers,
            "{case}"
        );
        if let Some(status_of_gate) = gate {
            assert_eq!(find(&status, "example.com/lb").status, status_of_gate);
        }
    }
    // Two gates, one unmet: the message names that one only.
    let mut pod = with_gates(&["example.com/a", "example.com/b"]);
    pod.status = Some(PodStatus {
        conditions: Some(vec![foreign("example.com/a", "True")]),
        ..Default::default()
    });
    let status = desired(&pod, &running_view(&mapped), "h", now());
    let message = find(&status, "Ready").message.clone().unwrap();
    assert!(message.contains("example.com/b") && !message.contains("example.com/a"));
}

#[test]
fn an_unknown_exit_code_fails_the_pod_with_137_and_the_given_reason() {
    let pod = pod();
    for reason in ["ExitCodeUnknown", "ContainerStatusUnknown"] {
        let view = View::Ended {
            exit_code: None,
            reason,
            message: "m".into(),
            started_at: None,
            restarts: 1,
        };
        let status = desired(&pod, &view, "h", now());
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let state = status.container_statuses.unwrap()[0].state.clone().unwrap();
        let terminated = state.terminated.unwrap();
        assert_eq!(terminated.exit_code, 137, "{reason}");
        assert_eq!(terminated.reason.as_deref(), Some(reason));
    }
}

#[test]
fn the_write_carries_only_owned_conditions_with_every_member() {
    let mapped = instance(InstanceState::Running, true);
    let mut pod = with_gates(&["example.com/lb"]);
    pod.status = Some(PodStatus {
        conditions: Some(vec![foreign("example.com/lb", "False")]),
        ..Default::default()
    });
    let gated = desired(&pod, &running_view(&mapped), "h", now());
    let Patch::Strategic(body) = patch(&pod, &gated) else {
        panic!("not a strategic merge patch");
    };
    assert_eq!(body["metadata"], json!({"uid": "u"}));
    let conditions = body["status"]["conditions"].as_array().unwrap();
    let kinds: Vec<_> = conditions.iter().map(|c| c["type"].clone()).collect();
    assert_eq!(
        kinds,
        [
            json!("PodScheduled"),
            json!("Initialized"),
            json!("ContainersReady"),
            json!("Ready")
        ]
    );
    let ready = &conditions[3];
    assert_eq!(ready["reason"], "ReadinessGatesNotReady");
    // Once the gate is met, the write removes the old reason and message.
    pod.status.as_mut().unwrap().conditions = Some(vec![foreign("example.com/lb", "True")]);
    let open = desired(&pod, &running_view(&mapped), "h", now());
    let Patch::Strategic(body) = patch(&pod, &open) else {
        panic!("not a strategic merge patch");
    };
    let ready = &body["status"]["conditions"][3];
    assert_eq!(ready["status"], "True");
    for member in ["reason", "message", "lastProbeTime"] {
        assert!(ready.as_object().unwrap().contains_key(member), "{member}");
        assert_eq!(ready[member], serde_json::Value::Null, "{member}");
    }
    // Everything else the controller owns is in the body, as `changes` compares it.
    let mut rest = body["status"].as_object().unwrap().clone();
    rest.remove("conditions");
    let mut owned = owned_members(&open);
    owned.remove("conditions");
    assert_eq!(rest, owned);
}

/// A refused pod shows every container and init container, each waiting with the reason; a
/// pod that runs shows its one container and no init containers.
#[test]
fn a_pod_that_never_starts_shows_every_container_with_the_reason() {
    let refused: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [{"name": "main", "image": "img"}, {"name": "side", "image": "proxy"}],
            "nodeName": "virtual-runpod"
        }
    }))
    .unwrap();
    let status = desired(
        &refused,
        &View::Failed {
            reason: "CannotRunOnRunPod",
            message: "RunPod cannot run this pod: init containers".into(),
        },
        "10.0.0.1",
        now(),
    );
    let reason_of = |s: &ContainerStatus| {
        let waiting = s.state.as_ref()?.waiting.as_ref()?;
        Some((s.name.clone(), waiting.reason.clone()?))
    };
    let shown: Vec<_> = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten())
        .filter_map(reason_of)
        .collect();
    assert_eq!(
        shown,
        [
            ("main".to_owned(), "CannotRunOnRunPod".to_owned()),
            ("side".to_owned(), "CannotRunOnRunPod".to_owned()),
            ("fetch".to_owned(), "CannotRunOnRunPod".to_owned()),
        ]
    );
    assert!(changes(&refused, &status).contains(&"initContainerStatuses"));
    let running = desired(
        &pod(),
        &View::Waiting {
            reason: "ContainerCreating",
            message: "creating".into(),
        },
        "10.0.0.1",
        now(),
    );
    assert_eq!(running.container_statuses.map(|l| l.len()), Some(1));
    assert!(running.init_container_statuses.is_none());
}

#[test]
fn a_pod_the_cloud_took_away_fails_with_disruption_target_and_others_do_not() {
    let failed = |reason: &'static str| {
        desired(
            &pod(),
            &View::Failed {
                reason,
                message: format!("{reason} happened"),
            },
            "10.0.0.1",
            now(),
        )
    };
    for reason in ["Outbid", "CloudInstanceLost"] {
        let status = failed(reason);
        assert_eq!(status.phase.as_deref(), Some("Failed"), "{reason}");
        let condition = find(&status, "DisruptionTarget");
        assert_eq!(condition.status, "True");
        assert_eq!(condition.reason.as_deref(), Some(reason));
        assert_eq!(
            condition.message.as_deref(),
            Some(format!("{reason} happened").as_str())
        );
        // The shape a Job's podFailurePolicy `onPodConditions` matches.
        let value = serde_json::to_value(condition).unwrap();
        assert_eq!(value["type"], "DisruptionTarget");
        assert_eq!(value["status"], "True");
        // And the write carries it (the patch sends only the conditions the controller writes).
        let Patch::Strategic(body) = patch(&pod(), &status) else {
            panic!("not a strategic merge patch");
        };
        assert!(
            body["status"]["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["type"] == "DisruptionTarget" && c["reason"] == reason),
            "{body}"
        );
    }
    for reason in ["RunPodError", "ProvisioningTimeout", "DeadlineExceeded"] {
        let status = failed(reason);
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .all(|c| c.type_ != "DisruptionTarget"),
            "{reason} is the pod's own failure"
        );
    }
}
