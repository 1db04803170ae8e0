//! The pure mapping from what the cloud shows to the Kubernetes pod status, and the check
//! whether a write is needed at all (the apiserver is written only when something changed).

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, Pod, PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::Patch;

use crate::controller::probes::state::Probed;
use crate::provider::{CloudName, Instance, InstanceState};

/// The value of one of the pod's annotations.
pub(crate) fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// When the pod was bound to the node (its clock for the provisioning timeout).
pub(crate) fn bound_at(pod: &Pod) -> Option<Timestamp> {
    scheduled_or_created(&pod.metadata, pod.status.as_ref())
}

/// The transition of the pod's `PodScheduled` condition, else its creation: from the parts a
/// cached pod keeps decoded, so the cache's readers need not decode its spec.
pub(crate) fn scheduled_or_created(
    metadata: &ObjectMeta,
    status: Option<&PodStatus>,
) -> Option<Timestamp> {
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    scheduled.or_else(|| metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// What the pod's one container is doing, as far as the controller knows.
#[derive(Debug, Clone)]
pub(crate) enum View<'a> {
    /// Not created yet, or provisioning; `reason` is the kubelet-style waiting reason.
    Waiting { reason: &'a str, message: String },
    /// An instance exists (provisioning, starting or running) on `cloud`.
    Instance {
        instance: &'a Instance,
        restarts: i32,
        cloud: CloudName,
        /// What the pod's probes say (`None`: no prober runs for it; the ports decide).
        probed: Option<Probed>,
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

/// The condition types the controller writes: those a kubelet owns (its
/// `PodConditionsByKubelet`, which includes `PodScheduled`: a kubelet reports it True for every
/// pod it runs). Every other type (readiness gates, other controllers) is someone else's.
const OWNED_CONDITIONS: [&str; 4] = ["PodScheduled", "Initialized", "ContainersReady", "Ready"];

/// The exit code a kubelet reports for a container whose end it did not see
/// (`ContainerStatusUnknown`): a failed pod never shows 0.
const UNKNOWN_EXIT_CODE: i32 = 137;

/// The status the pod should have. Times of conditions that did not change are kept, so an
/// unchanged state gives an identical status (no write). A phase never goes back: a Succeeded
/// or Failed pod keeps its status as it is, and a Running pod whose instance is starting again
/// stays Running with its container waiting and not ready (a kubelet's restarting container).
/// `podIP` stays unset: a RunPod host is not on the pod network (the endpoints are in
/// `runpod.io/endpoints`), so a Service must not send cluster traffic there.
pub(crate) fn desired(pod: &Pod, view: &View<'_>, host_ip: &str, now: Timestamp) -> PodStatus {
    let current = pod.status.clone().unwrap_or_default();
    if is_terminal(pod) {
        return current;
    }
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

    let Shown {
        phase,
        state,
        ready,
        restarts,
        container_id,
        reason,
        message,
    } = shown(view, seen_running_at, now);
    // Keep the earlier container state's times when the state kind did not change.
    let previous = current
        .container_statuses
        .as_ref()
        .and_then(|list| list.first())
        .and_then(|status| status.state.clone());
    let state = keep_times(previous, state);
    let phase = if phase == "Pending" && current.phase.as_deref() == Some("Running") {
        "Running"
    } else {
        phase
    };

    let container_status = ContainerStatus {
        name: container_name,
        image,
        image_id: String::new(),
        ready,
        restart_count: restarts,
        // A container with a startup probe has started once that probe succeeded.
        started: Some(
            state.running.is_some()
                && match view {
                    View::Instance {
                        probed: Some(probed),
                        ..
                    } => probed.started,
                    _ => true,
                },
        ),
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
    let (more, init_container_statuses) = never_started(view, pod, &container_status.state);
    let mut conditions = conditions(pod, &current, ready, now);
    add_disruption(view, &current, &mut conditions, now);
    let start_time = current.start_time.clone().or(Some(Time(now)));
    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        container_statuses: Some(std::iter::once(container_status).chain(more).collect()),
        init_container_statuses,
        host_ip: Some(host_ip.to_owned()),
        start_time,
        reason,
        message,
        qos_class: current.qos_class.clone(),
        ..Default::default()
    }
}

/// A pod that will never start (refused, say) shows every container after the first, and its
/// init containers, waiting with the first's state: the kubelet's `kubectl get` and
/// `describe` read them all. Other pods show the first container alone.
fn never_started(
    view: &View<'_>,
    pod: &Pod,
    state: &Option<ContainerState>,
) -> (Vec<ContainerStatus>, Option<Vec<ContainerStatus>>) {
    let waiting = |containers: &[k8s_openapi::api::core::v1::Container]| {
        containers
            .iter()
            .map(|container| ContainerStatus {
                name: container.name.clone(),
                image: container.image.clone().unwrap_or_default(),
                started: Some(false),
                state: state.clone(),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    match (view, pod.spec.as_ref()) {
        (View::Failed { .. }, Some(spec)) => (
            waiting(spec.containers.get(1..).unwrap_or_default()),
            spec.init_containers
                .as_deref()
                .filter(|init| !init.is_empty())
                .map(waiting),
        ),
        _ => (Vec::new(), None),
    }
}

/// The cloud took the instance away: said as Kubernetes says a disruption
/// (`DisruptionTarget`), so a Job's `podFailurePolicy` can tell it from the program's failure.
fn add_disruption(
    view: &View<'_>,
    current: &PodStatus,
    conditions: &mut Vec<PodCondition>,
    now: Timestamp,
) {
    if let View::Failed { reason, message } = view
        && runpod_contract::interruptible::is_disruption(reason)
    {
        conditions.retain(|c| c.type_ != runpod_contract::interruptible::DISRUPTION_TARGET);
        conditions.push(condition(
            current,
            runpod_contract::interruptible::DISRUPTION_TARGET,
            true,
            Some(reason),
            Some(message.clone()),
            now,
        ));
    }
}

/// What a view shows of the pod and its container, before earlier times are kept.
struct Shown {
    phase: &'static str,
    state: ContainerState,
    ready: bool,
    restarts: i32,
    container_id: Option<String>,
    reason: Option<String>,
    message: Option<String>,
}

/// The phase, container state and readiness a view means; `seen_running_at` keeps the time
/// the container was first seen running when the cloud gives none.
fn shown(view: &View<'_>, seen_running_at: Option<Timestamp>, now: Timestamp) -> Shown {
    let (phase, state, ready, restarts, container_id, reason, message) = match view {
        View::Waiting { reason, message } => (
            "Pending",
            waiting(reason, message),
            false,
            0,
            None,
            None,
            None,
        ),
        View::Instance {
            instance,
            restarts,
            cloud,
            probed,
        } => {
            let id = Some(cloud.container_id(&instance.id));
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
                    instance.ports_ready()
                        && probed.and_then(|probed| probed.ready).unwrap_or(true),
                    *restarts,
                    id,
                    None,
                    None,
                ),
                other => (
                    "Pending",
                    waiting(
                        "ContainerCreating",
                        &format!("{} {} is {}", cloud.instance, instance.id, other.as_str()),
                    ),
                    false,
                    *restarts,
                    id,
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
                    exit_code: exit_code.unwrap_or(UNKNOWN_EXIT_CODE),
                    reason: Some((*reason).to_owned()),
                    message: Some(message.clone()),
                    started_at: started_at.map(Time),
                    finished_at: Some(Time(now)),
                    ..Default::default()
                }),
                ..Default::default()
            };
            (phase, state, false, *restarts, None, None, None)
        }
        View::Failed { reason, message } => (
            "Failed",
            waiting(reason, message),
            false,
            0,
            None,
            Some((*reason).to_owned()),
            Some(message.clone()),
        ),
    };
    Shown {
        phase,
        state,
        ready,
        restarts,
        container_id,
        reason,
        message,
    }
}

/// The conditions this controller owns (scheduled, initialized, containers ready, ready with
/// the pod's readiness gates), merged into the others'.
fn conditions(pod: &Pod, current: &PodStatus, ready: bool, now: Timestamp) -> Vec<PodCondition> {
    let not_ready = (!ready).then_some("ContainersNotReady");
    let unmet = unmet_gates(pod, current);
    let pod_ready = if ready && !unmet.is_empty() {
        condition(
            current,
            "Ready",
            false,
            Some("ReadinessGatesNotReady"),
            Some(unmet.join(", ")),
            now,
        )
    } else {
        condition(current, "Ready", ready, not_ready, None, now)
    };
    let owned = [
        condition(current, "PodScheduled", true, None, None, now),
        condition(current, "Initialized", true, None, None, now),
        condition(current, "ContainersReady", ready, not_ready, None, now),
        pod_ready,
    ];
    merged_conditions(current.conditions.as_deref().unwrap_or_default(), owned)
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

/// The readiness gates of `pod` whose condition is missing or not True in `current`, each
/// described in a kubelet's words (empty: all gates are met).
fn unmet_gates(pod: &Pod, current: &PodStatus) -> Vec<String> {
    let gates = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.readiness_gates.as_deref())
        .unwrap_or_default();
    gates
        .iter()
        .filter_map(|gate| {
            let kind = &gate.condition_type;
            match current
                .conditions
                .iter()
                .flatten()
                .find(|c| &c.type_ == kind)
            {
                None => Some(format!(
                    "corresponding condition of pod readiness gate {kind:?} does not exist."
                )),
                Some(c) if c.status != "True" => Some(format!(
                    "the status of pod readiness gate {kind:?} is not \"True\", but {}",
                    c.status
                )),
                Some(_) => None,
            }
        })
        .collect()
}

/// `current`'s conditions with the owned ones replaced where they stand and the others kept as
/// they are; owned ones not present yet are appended. The order stays stable from one
/// reconcile to the next, so an unchanged state compares equal.
fn merged_conditions(current: &[PodCondition], owned: [PodCondition; 4]) -> Vec<PodCondition> {
    let mut owned = owned.map(Some);
    let mut merged = Vec::with_capacity(current.len() + owned.len());
    for existing in current {
        if let Some(slot) = owned
            .iter_mut()
            .find(|slot| slot.as_ref().is_some_and(|c| c.type_ == existing.type_))
        {
            merged.extend(slot.take());
        } else if !OWNED_CONDITIONS.contains(&existing.type_.as_str()) {
            merged.push(existing.clone());
        }
    }
    merged.extend(owned.into_iter().flatten());
    merged
}

fn condition(
    current: &PodStatus,
    kind: &str,
    status: bool,
    reason: Option<&str>,
    message: Option<String>,
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
        message,
        last_transition_time: previous
            .and_then(|c| c.last_transition_time.clone())
            .or(Some(Time(now))),
        ..Default::default()
    }
}

/// The status members the controller owns: [`changes`] compares them and a status write sets
/// each one (`null` removes it). `podIPs` as well as `podIP`: the apiserver refills an unset
/// `podIP` from `podIPs`, so one written by an earlier version is only gone when both are.
const OWNED: [&str; 10] = [
    "phase",
    "conditions",
    "containerStatuses",
    "initContainerStatuses",
    "hostIP",
    "podIP",
    "podIPs",
    "startTime",
    "reason",
    "message",
];

/// The owned members of `status`, each one present (`null` when unset), with empty objects
/// and nulls inside them dropped: the apiserver returns an unset struct as `{}` (a container's
/// `lastState`), which must read as equal to leaving it out, or every reconcile would write.
pub(crate) fn owned_members(status: &PodStatus) -> serde_json::Map<String, serde_json::Value> {
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
pub(crate) fn changes(pod: &Pod, desired: &PodStatus) -> Vec<&'static str> {
    let current = owned_members(&pod.status.clone().unwrap_or_default());
    let wanted = owned_members(desired);
    OWNED
        .into_iter()
        .filter(|name| current.get(*name) != wanted.get(*name))
        .collect()
}

/// The status write for `desired`: a strategic merge patch, as a kubelet sends. A JSON merge
/// patch would replace the whole `conditions` list with the one read, erasing a condition
/// another controller wrote in between; a strategic merge patch merges `conditions` by `type`,
/// so the body carries only the owned conditions and the server keeps every other one as it
/// stands at the write, whenever that was written. Each owned condition carries every member
/// (`null` when unset) because its fields merge too: a stale `message` must go.
/// `containerStatuses` has no patch strategy, so the list is replaced whole, as in a merge
/// patch (no old `waiting` left next to a new `running`); the other owned members are scalars
/// or `null` (removed). `metadata.uid` is a precondition: a pod re-created under the same name
/// is not written with this one's status. All of this was checked against a 1.20.2 apiserver.
pub(crate) fn patch(pod: &Pod, desired: &PodStatus) -> Patch<serde_json::Value> {
    use serde_json::{Value, json};
    let mut status = owned_members(desired);
    let conditions = desired
        .conditions
        .iter()
        .flatten()
        // `DisruptionTarget` is written once, with the terminal phase, when the cloud took the
        // instance away.
        .filter(|c| {
            OWNED_CONDITIONS.contains(&c.type_.as_str())
                || c.type_ == runpod_contract::interruptible::DISRUPTION_TARGET
        })
        .map(|c| {
            json!({
                "type": c.type_,
                "status": c.status,
                "reason": c.reason,
                "message": c.message,
                "lastProbeTime": c.last_probe_time,
                "lastTransitionTime": c.last_transition_time,
            })
        })
        .collect();
    status.insert("conditions".to_owned(), Value::Array(conditions));
    let mut body = json!({ "status": status });
    if let Some(uid) = &pod.metadata.uid {
        body["metadata"] = json!({ "uid": uid });
    }
    Patch::Strategic(body)
}

/// Whether the pod has reached a phase it never leaves.
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// How a pod ended, as recorded on the pod (annotation `runpod.io/ended`) before its instance
/// is terminated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RecordedEnd {
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
    pub(crate) fn of(view: &View<'_>) -> Option<RecordedEnd> {
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
    pub(crate) fn on(pod: &Pod) -> Option<RecordedEnd> {
        let text = pod
            .metadata
            .annotations
            .as_ref()?
            .get(runpod_contract::ENDED)?;
        serde_json::from_str(text).ok()
    }

    /// The view that writes the recorded end.
    pub(crate) fn view(&self) -> View<'_> {
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

pub(crate) mod inits;

#[cfg(test)]
mod tests;
