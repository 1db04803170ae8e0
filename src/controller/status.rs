//! The pure mapping from what the cloud shows to the Kubernetes pod status, and the check
//! whether a write is needed at all (the apiserver is written only when something changed).

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::provider::{Instance, InstanceState};

/// What the pod's one container is doing, as far as the controller knows.
#[derive(Debug, Clone)]
pub enum View<'a> {
    /// Not created yet, or provisioning; `reason` is the kubelet-style waiting reason.
    Waiting { reason: &'a str, message: String },
    /// An instance exists (provisioning, starting or running).
    Instance {
        instance: &'a Instance,
        restarts: i32,
    },
    /// The container ended with this code (`None`: unknown).
    Ended {
        exit_code: Option<i32>,
        reason: &'a str,
        message: String,
        started_at: Option<Timestamp>,
        restarts: i32,
    },
    /// The pod failed before or outside its container (ProvisioningTimeout, rejected by the
    /// cloud, its instance vanished).
    Failed { reason: &'a str, message: String },
}

/// The status the pod should have. Times of conditions that did not change are kept, so an
/// unchanged state gives an identical status (no write).
pub fn desired(pod: &Pod, view: &View<'_>, host_ip: &str, now: Timestamp) -> PodStatus {
    let current = pod.status.clone().unwrap_or_default();
    // RunPod may leave `startedAt` unset: the time first seen running is kept, not renewed.
    let seen_running_at = current
        .container_statuses
        .as_ref()
        .and_then(|list| list.first())
        .and_then(|status| status.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|time| time.0);
    let container = pod.spec.as_ref().and_then(|spec| spec.containers.first());
    let container_name = container.map(|c| c.name.clone()).unwrap_or_default();
    let image = container.and_then(|c| c.image.clone()).unwrap_or_default();

    let (phase, state, ready, restarts, container_id, pod_ip, reason, message) = match view {
        View::Waiting { reason, message } => (
            "Pending",
            waiting(reason, message),
            false,
            0,
            None,
            None,
            None,
            None,
        ),
        View::Instance { instance, restarts } => {
            let id = Some(format!("runpod://{}", instance.id));
            match instance.state {
                InstanceState::Running => (
                    "Running",
                    ContainerState {
                        running: Some(ContainerStateRunning {
                            started_at: Some(Time(
                                instance.started_at.or(seen_running_at).unwrap_or(now),
                            )),
                        }),
                        ..Default::default()
                    },
                    instance.ports_ready(),
                    *restarts,
                    id,
                    instance.ip.clone(),
                    None,
                    None,
                ),
                other => (
                    "Pending",
                    waiting(
                        "ContainerCreating",
                        &format!("RunPod pod {} is {}", instance.id, other.as_str()),
                    ),
                    false,
                    *restarts,
                    id,
                    None,
                    None,
                    None,
                ),
            }
        }
        View::Ended {
            exit_code,
            reason,
            message,
            started_at,
            restarts,
        } => {
            let phase = if *exit_code == Some(0) {
                "Succeeded"
            } else {
                "Failed"
            };
            let state = ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: exit_code.unwrap_or(0),
                    reason: Some((*reason).to_owned()),
                    message: Some(message.clone()),
                    started_at: started_at.map(Time),
                    finished_at: Some(Time(now)),
                    ..Default::default()
                }),
                ..Default::default()
            };
            (phase, state, false, *restarts, None, None, None, None)
        }
        View::Failed { reason, message } => (
            "Failed",
            waiting(reason, message),
            false,
            0,
            None,
            None,
            Some((*reason).to_owned()),
            Some(message.clone()),
        ),
    };

    // Keep the earlier container state's times when the state kind did not change.
    let previous = current
        .container_statuses
        .as_ref()
        .and_then(|list| list.first())
        .and_then(|status| status.state.clone());
    let state = keep_times(previous, state);

    let started = phase == "Running" || state.terminated.is_some();
    let container_status = ContainerStatus {
        name: container_name,
        image,
        image_id: String::new(),
        ready,
        restart_count: restarts,
        started: Some(started && phase == "Running"),
        state: Some(state),
        container_id: container_id.or_else(|| {
            current
                .container_statuses
                .as_ref()
                .and_then(|l| l.first())
                .and_then(|s| s.container_id.clone())
        }),
        ..Default::default()
    };
    let conditions = vec![
        condition(&current, "PodScheduled", true, None, now),
        condition(&current, "Initialized", true, None, now),
        condition(
            &current,
            "ContainersReady",
            ready,
            (!ready).then_some("ContainersNotReady"),
            now,
        ),
        condition(
            &current,
            "Ready",
            ready,
            (!ready).then_some("ContainersNotReady"),
            now,
        ),
    ];
    let start_time = current.start_time.clone().or(Some(Time(now)));
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        container_statuses: Some(vec![container_status]),
        host_ip: Some(host_ip.to_owned()),
        pod_ip: pod_ip
            .filter(|ip| ip.parse::<std::net::IpAddr>().is_ok())
            .or_else(|| current.pod_ip.clone()),
        start_time,
        reason,
        message,
        qos_class: current.qos_class.clone(),
        ..Default::default()
    }
}

fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
        }),
        ..Default::default()
    }
}

fn keep_times(previous: Option<ContainerState>, mut next: ContainerState) -> ContainerState {
    let Some(previous) = previous else {
        return next;
    };
    if let (Some(old), Some(new)) = (&previous.terminated, &mut next.terminated)
        && old.exit_code == new.exit_code
        && old.reason == new.reason
    {
        new.finished_at = old.finished_at.clone();
        if new.started_at.is_none() {
            new.started_at = old.started_at.clone();
        }
    }
    next
}

fn condition(
    current: &PodStatus,
    kind: &str,
    status: bool,
    reason: Option<&str>,
    now: Timestamp,
) -> PodCondition {
    let status = if status { "True" } else { "False" }.to_owned();
    let previous = current
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == kind && c.status == status);
    PodCondition {
        type_: kind.to_owned(),
        status,
        reason: reason.map(str::to_owned),
        last_transition_time: previous
            .and_then(|c| c.last_transition_time.clone())
            .or(Some(Time(now))),
        ..Default::default()
    }
}

/// The status members the controller owns: [`changes`] compares them and a status write sets
/// each one (`null` removes it).
const OWNED: [&str; 8] = [
    "phase",
    "conditions",
    "containerStatuses",
    "hostIP",
    "podIP",
    "startTime",
    "reason",
    "message",
];

/// The owned members of `status`, each one present (`null` when unset), with empty objects
/// and nulls inside them dropped: the apiserver returns an unset struct as `{}` (a container's
/// `lastState`), which must read as equal to leaving it out, or every reconcile would write.
pub fn owned_members(status: &PodStatus) -> serde_json::Map<String, serde_json::Value> {
    let mut all = match serde_json::to_value(status) {
        Ok(serde_json::Value::Object(all)) => all,
        _ => serde_json::Map::new(),
    };
    OWNED
        .iter()
        .map(|&name| {
            let value = all
                .remove(name)
                .map(pruned)
                .unwrap_or(serde_json::Value::Null);
            (name.to_owned(), value)
        })
        .collect()
}

fn pruned(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Object(members) => Value::Object(
            members
                .into_iter()
                .map(|(name, value)| (name, pruned(value)))
                .filter(|(_, value)| {
                    !value.is_null() && value.as_object().is_none_or(|o| !o.is_empty())
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(pruned).collect()),
        other => other,
    }
}

/// The owned members that writing `desired` would change (empty: no write is needed); named
/// so a write can say why it was made.
pub fn changes(pod: &Pod, desired: &PodStatus) -> Vec<&'static str> {
    let current = owned_members(&pod.status.clone().unwrap_or_default());
    let wanted = owned_members(desired);
    OWNED
        .into_iter()
        .filter(|name| current.get(*name) != wanted.get(*name))
        .collect()
}

/// Whether the pod has reached a phase it never leaves.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// How a pod ended, as recorded on the pod (annotation `runpod.io/ended`) before its instance
/// is terminated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RecordedEnd {
    /// `true`: the pod failed outside its container ([`View::Failed`]).
    #[serde(default)]
    pub failed: bool,
    #[serde(default)]
    pub exit_code: Option<i32>,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub restarts: i32,
}

impl RecordedEnd {
    /// The record of a terminal view; `None` for views that are not terminal.
    pub fn of(view: &View<'_>) -> Option<RecordedEnd> {
        match view {
            View::Ended {
                exit_code,
                reason,
                message,
                restarts,
                ..
            } => Some(RecordedEnd {
                failed: false,
                exit_code: *exit_code,
                reason: (*reason).to_owned(),
                message: message.clone(),
                restarts: *restarts,
            }),
            View::Failed { reason, message } => Some(RecordedEnd {
                failed: true,
                exit_code: None,
                reason: (*reason).to_owned(),
                message: message.clone(),
                restarts: 0,
            }),
            View::Waiting { .. } | View::Instance { .. } => None,
        }
    }

    /// The record on `pod`, if any (a malformed one counts as none).
    pub fn on(pod: &Pod) -> Option<RecordedEnd> {
        let text = pod
            .metadata
            .annotations
            .as_ref()?
            .get(runpod_webhook::contract::ENDED)?;
        serde_json::from_str(text).ok()
    }

    /// The view that writes the recorded end.
    pub fn view(&self) -> View<'_> {
        if self.failed {
            View::Failed {
                reason: &self.reason,
                message: self.message.clone(),
            }
        } else {
            View::Ended {
                exit_code: self.exit_code,
                reason: &self.reason,
                message: self.message.clone(),
                started_at: None,
                restarts: self.restarts,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::provider::{Endpoint, Tags};
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
                instance: &unmapped,
                restarts: 0,
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
                instance: &mapped,
                restarts: 0,
            },
            "10.0.0.1",
            now(),
        );
        let container = &status.container_statuses.as_ref().unwrap()[0];
        assert!(container.ready);
        assert_eq!(container.container_id.as_deref(), Some("runpod://abc"));
        assert_eq!(status.pod_ip.as_deref(), Some("1.2.3.4"));
        let ready = status
            .conditions
            .unwrap()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True");
    }

    #[test]
    fn provisioning_is_pending_and_exit_codes_decide_the_phase() {
        let pod = pod();
        let starting = instance(InstanceState::Starting, false);
        let status = desired(
            &pod,
            &View::Instance {
                instance: &starting,
                restarts: 0,
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
            assert_eq!(terminated.exit_code, code.unwrap_or(0));
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
            instance: &running,
            restarts: 0,
        };
        let first = desired(&pod, &view, "h", now());
        assert_eq!(
            changes(&pod, &first),
            [
                "phase",
                "conditions",
                "containerStatuses",
                "hostIP",
                "podIP",
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
                instance: &running,
                restarts: 0,
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
            instance: &running,
            restarts: 0,
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
            instance: &running,
            restarts: 0,
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
                    runpod_webhook::contract::ENDED.to_owned(),
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
}
