//! The pure decisions of a reconcile: which one thing to do for a pod now (`decide`), and what
//! an existing instance means for it (`track_step`). Inputs are the pod, the last complete list,
//! what this leader remembers, the settings and the clock; the async shells in `create`,
//! `track` and `finish` carry the step out.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

pub(crate) mod disruption;
pub(crate) mod ends;
pub(crate) mod gates;
pub(crate) mod provisioned;

pub(crate) use disruption::{lost, vanished};

use super::{annotation, bound_at};
use crate::controller::clock::elapsed;
use crate::controller::context::Snapshot;
use crate::controller::pods::status::{self, RecordedEnd, View};
use crate::provider::{CloudName, Instance, InstanceState};

/// An Event to record on the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Note {
    pub(crate) fn normal(reason: &'static str, message: String) -> Note {
        Note {
            warning: false,
            reason,
            message,
        }
    }

    pub(crate) fn warning(reason: &'static str, message: String) -> Note {
        Note {
            warning: true,
            reason,
            message,
        }
    }
}

/// When to look at the pod again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Requeue(Duration),
    AwaitChange,
}

/// What a decision asks one executor (`write::apply`) to write, in this order: the Event,
/// then the status (only when it changes anything); then when to look again.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// Events to say on the pod, in order.
    pub events: Vec<Note>,
    /// The instance whose annotations (id, cost, GPU, datacenter, endpoints) the pod must show.
    pub describes: Option<Instance>,
    pub status: Option<View<'static>>,
    pub next: Next,
}

impl Outcome {
    /// Nothing to write: look again after `after`.
    pub(crate) fn requeue(after: Duration) -> Outcome {
        Outcome {
            events: Vec::new(),
            describes: None,
            status: None,
            next: Next::Requeue(after),
        }
    }

    /// A warning Event and the pod failed with the same reason and message.
    pub(crate) fn fail(reason: &'static str, message: String, next: Next) -> Outcome {
        Outcome {
            events: vec![Note::warning(reason, message.clone())],
            describes: None,
            status: Some(View::Failed { reason, message }),
            next,
        }
    }
}

/// What this leader remembers about the pod that the decision needs.
#[derive(Debug, Default)]
pub(crate) struct Remembered<'a> {
    /// The instance this leader created or adopted, and when.
    pub instance: Option<(&'a str, Timestamp)>,
    pub terminated: Option<&'a HashSet<String>>,
}

/// The one thing to do for a pod now.
#[derive(Debug)]
pub(crate) enum Step<'a> {
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
pub(crate) fn split_duplicates<'a>(
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
pub(crate) fn decide<'a>(
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
pub(crate) enum TrackStep {
    /// The container ended: read its exit code, then finish. `restarted`: RunPod restarted it
    /// (the wrapper could not stop the pod, or there was no command to wrap).
    Exited { restarted: bool },
    /// The pod fails for a reason outside its container; the instance is terminated.
    Fail {
        reason: &'static str,
        message: String,
    },
    /// The cloud took the instance away (outbid, host lost): a disruption, not a failure.
    Disrupted(crate::provider::Disruption),
    /// Nothing ends: write the status.
    Status,
}

/// Since when the pod has waited for a running container, if it is waiting for one: its
/// instance is replacing one that vanished (`replacing_since`), or the pod never ran (its
/// phase never goes back from Running) and waits since it was bound.
pub(crate) fn provisioning_clock(
    pod: &Pod,
    replacing_since: Option<Timestamp>,
) -> Option<Timestamp> {
    let never_ran = pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running");
    replacing_since.or_else(|| never_ran.then(|| bound_at(pod)).flatten())
}

/// The Event when a listed instance's placement breaks the pod's constraints (a cloud may
/// treat datacenters as a preference only): it is terminated and the next offer tried.
pub(crate) fn placement_rejected(cloud: CloudName, id: &str, violation: &str) -> Note {
    Note::warning(
        "PlacementRejected",
        format!(
            "{} {id} {violation}; terminating it and trying the next offer",
            cloud.instance
        ),
    )
}

/// The meaning of `instance` for `pod` now. `restarted`: the container's uptime went back;
/// `waiting_since`: the [`provisioning_clock`].
pub(crate) fn track_step(
    pod: &Pod,
    instance: &Instance,
    restarted: bool,
    waiting_since: Option<Timestamp>,
    provision_timeout: Duration,
    now: Timestamp,
    cloud: CloudName,
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
    if let Some(disruption) = instance.disruption {
        return TrackStep::Disrupted(disruption);
    }
    match instance.state {
        InstanceState::Exited => TrackStep::Exited { restarted: false },
        InstanceState::Error => TrackStep::Fail {
            reason: "RunPodError",
            message: instance.message.clone().unwrap_or_else(|| {
                format!(
                    "{} {} is in ERROR (e.g. the image could not be pulled)",
                    cloud.instance, instance.id
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
                        "{} {} did not start within {waited}: {said}",
                        cloud.instance, instance.id
                    ),
                }
            } else {
                TrackStep::Fail {
                    reason: "ProvisioningTimeout",
                    message: format!(
                        "{} {} was still {} after {waited}{}",
                        cloud.instance,
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
mod tests;
