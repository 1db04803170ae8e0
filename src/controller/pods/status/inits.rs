//! A pod's init containers in its status, as the kubelet shows them: each one's state from how
//! far the wrapper got (read from the container's log), and while they have not all succeeded,
//! the pod Pending (or ended), not Initialized, its container waiting `PodInitializing`.

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
    Pod, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::{condition, is_terminal, keep_times, waiting};
use crate::provider::InitProgress;

const INITIALIZING: &str = "PodInitializing";

/// `status` (what [`super::desired`] gave) with the pod's init containers: unchanged for a pod
/// without them, one already ended, or one that lists them already (it will never start).
/// `progress`: what the log said last (`None`: not read yet, so none is known to be done).
pub(crate) fn with_inits(
    pod: &Pod,
    mut status: PodStatus,
    progress: Option<&InitProgress>,
    now: Timestamp,
) -> PodStatus {
    let inits: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|spec| spec.init_containers.iter().flatten())
        .collect();
    if inits.is_empty() || is_terminal(pod) || status.init_container_statuses.is_some() {
        return status;
    }
    let current = pod.status.clone().unwrap_or_default();
    let empty = InitProgress::default();
    let mut progress = progress.unwrap_or(&empty).clone();
    // Once said, kept: a log whose tail no longer shows the wrapper's mark (a chatty container
    // read by a restarted controller) does not make a running pod initialize again.
    progress.initialized |= said_initialized(pod);
    let mut incomplete = Vec::new();
    let mut statuses = Vec::new();
    for init in &inits {
        let previous = current
            .init_container_statuses
            .iter()
            .flatten()
            .find(|s| s.name == init.name)
            .and_then(|s| s.state.clone());
        let shown = init_status(init, &progress, previous, now);
        if !shown.ready {
            incomplete.push(init.name.as_str());
        }
        statuses.push(shown);
    }
    status.init_container_statuses = Some(statuses);
    if incomplete.is_empty() {
        return status;
    }
    not_initialized(&mut status, &current, &incomplete, now);
    status
}

/// One init container's status from how far it got (ready: it is done).
fn init_status(
    init: &Container,
    progress: &InitProgress,
    previous: Option<ContainerState>,
    now: Timestamp,
) -> ContainerStatus {
    let run = progress.runs.iter().find(|run| run.name == init.name);
    // First seen running now, then kept (no write every reconcile).
    let started_at = previous
        .as_ref()
        .and_then(|s| s.running.as_ref())
        .and_then(|r| r.started_at.clone())
        .unwrap_or(Time(now));
    let (state, done) = match run {
        _ if progress.initialized => (terminated(0), true),
        Some(run) if run.running => (
            ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(started_at),
                }),
                ..Default::default()
            },
            false,
        ),
        Some(run) => match run.last_code {
            Some(0) => (terminated(0), true),
            Some(code) => (terminated(code), false),
            None => (waiting(INITIALIZING, ""), false),
        },
        None => (waiting(INITIALIZING, ""), false),
    };
    ContainerStatus {
        name: init.name.clone(),
        image: init.image.clone().unwrap_or_default(),
        ready: done,
        restart_count: run.map_or(0, |run| {
            i32::try_from(run.starts.saturating_sub(1)).unwrap_or(i32::MAX)
        }),
        started: Some(state.running.is_some()),
        state: Some(keep_times(previous, state)),
        ..Default::default()
    }
}

/// The pod whose init containers `incomplete` are not done: Pending (or ended), not
/// Initialized nor Ready, its container not started (what its instance does is the init
/// containers'; a reason it waits for, a budget or a config error, is kept as it is).
fn not_initialized(
    status: &mut PodStatus,
    current: &PodStatus,
    incomplete: &[&str],
    now: Timestamp,
) {
    if status.phase.as_deref() == Some("Running") {
        status.phase = Some("Pending".to_owned());
    }
    for container in status.container_statuses.iter_mut().flatten() {
        if container.state.as_ref().is_none_or(|s| s.waiting.is_none()) {
            container.state = Some(waiting(INITIALIZING, ""));
            container.container_id = None;
        }
        container.ready = false;
        container.started = Some(false);
    }
    let message = format!(
        "containers with incomplete status: [{}]",
        incomplete.join(" ")
    );
    for existing in status.conditions.iter_mut().flatten() {
        let replaced = match existing.type_.as_str() {
            "Initialized" => Some(condition(
                current,
                "Initialized",
                false,
                Some("ContainersNotInitialized"),
                Some(message.clone()),
                now,
            )),
            kind @ ("Ready" | "ContainersReady") => Some(condition(
                current,
                kind,
                false,
                Some("ContainersNotReady"),
                None,
                now,
            )),
            _ => None,
        };
        if let Some(replaced) = replaced {
            *existing = replaced;
        }
    }
}

/// Whether the pod's status already says its init containers are done (only ever written
/// once they were).
pub(crate) fn said_initialized(pod: &Pod) -> bool {
    has_inits(pod) && status_says_initialized(pod.status.as_ref())
}

/// Whether `status` has the `Initialized` condition true.
fn status_says_initialized(status: Option<&PodStatus>) -> bool {
    status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == "Initialized" && c.status == "True")
    })
}

/// Whether the pod has init containers.
pub(crate) fn has_inits(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|inits| !inits.is_empty())
}

/// Whether the pod's container may have started: it has no init containers, or they are done
/// (its status says so, or `progress`, what its log said last).
pub(crate) fn inits_done(pod: &Pod, progress: Option<&InitProgress>) -> bool {
    initialized(has_inits(pod), pod.status.as_ref(), progress)
}

/// [`inits_done`] from its parts: whether the pod has init containers (fixed for its life),
/// its status and `progress` (what a cached pod's readers have without decoding its spec).
pub(crate) fn initialized(
    has_inits: bool,
    status: Option<&PodStatus>,
    progress: Option<&InitProgress>,
) -> bool {
    !has_inits || status_says_initialized(status) || progress.is_some_and(|p| p.initialized)
}

fn terminated(code: i32) -> ContainerState {
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: code,
            reason: Some(if code == 0 { "Completed" } else { "Error" }.to_owned()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::provider::InitRun;

    fn pod(phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "n", "uid": "u"},
            "spec": {
                "initContainers": [{"name": "fetch", "image": "img"}, {"name": "check", "image": "img"}],
                "containers": [{"name": "main", "image": "img"}]
            },
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    fn running_status() -> PodStatus {
        serde_json::from_value(json!({
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "Ready", "status": "True"}
            ],
            "containerStatuses": [{"name": "main", "image": "img", "imageID": "", "ready": true,
                                   "restartCount": 0, "state": {"running": {}}}]
        }))
        .unwrap()
    }

    fn state(status: &PodStatus, init: usize) -> ContainerState {
        status.init_container_statuses.as_ref().unwrap()[init]
            .state
            .clone()
            .unwrap()
    }

    fn waiting_reason(container: &ContainerStatus) -> Option<&str> {
        container
            .state
            .as_ref()?
            .waiting
            .as_ref()?
            .reason
            .as_deref()
    }

    fn condition_of(status: &PodStatus, kind: &str) -> (String, Option<String>) {
        let c = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == kind)
            .unwrap();
        (c.status.clone(), c.reason.clone())
    }

    #[test]
    fn while_init_containers_run_the_pod_is_pending_and_its_container_waits() {
        let now = Timestamp::now();
        let mut progress = InitProgress::default();
        progress.run("fetch").starts = 2;
        progress.run("fetch").last_code = Some(1);
        progress.run("fetch").running = true;
        let status = with_inits(&pod("Pending"), running_status(), Some(&progress), now);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert!(state(&status, 0).running.is_some());
        assert_eq!(
            status.init_container_statuses.as_ref().unwrap()[0].restart_count,
            1
        );
        assert_eq!(
            state(&status, 1).waiting.unwrap().reason.as_deref(),
            Some("PodInitializing")
        );
        let main = &status.container_statuses.as_ref().unwrap()[0];
        assert!(!main.ready);
        assert_eq!(waiting_reason(main), Some("PodInitializing"));
        assert_eq!(
            condition_of(&status, "Initialized"),
            ("False".into(), Some("ContainersNotInitialized".into()))
        );
        assert_eq!(condition_of(&status, "Ready").0, "False");
        // Not read yet: none is known to be done.
        let unread = with_inits(&pod("Pending"), running_status(), None, now);
        assert_eq!(unread.phase.as_deref(), Some("Pending"));
        // Said before (a restarted controller, a log whose tail lost the mark): kept.
        let mut said = pod("Running");
        said.status = Some(running_status());
        let kept = with_inits(&said, running_status(), None, now);
        assert_eq!(kept.phase.as_deref(), Some("Running"));
        assert_eq!(condition_of(&kept, "Initialized").0, "True");
    }

    #[test]
    fn a_container_may_have_started_once_its_init_containers_are_done() {
        let mut plain = pod("Running");
        plain.spec.as_mut().unwrap().init_containers = None;
        assert!(inits_done(&plain, None));
        assert!(!inits_done(&pod("Pending"), None));
        let mut said = pod("Running");
        said.status = Some(running_status());
        assert!(inits_done(&said, None));
        let read = InitProgress {
            initialized: true,
            ..InitProgress::default()
        };
        assert!(inits_done(&pod("Pending"), Some(&read)));
    }

    #[test]
    fn once_initialized_each_init_container_completed_and_the_container_runs() {
        let progress = InitProgress {
            runs: vec![InitRun {
                name: "fetch".into(),
                starts: 1,
                last_code: Some(0),
                running: false,
            }],
            initialized: true,
        };
        let status = with_inits(
            &pod("Pending"),
            running_status(),
            Some(&progress),
            Timestamp::now(),
        );
        assert_eq!(status.phase.as_deref(), Some("Running"));
        for init in 0..2 {
            let done = state(&status, init).terminated.unwrap();
            assert_eq!(
                (done.exit_code, done.reason.as_deref()),
                (0, Some("Completed"))
            );
        }
        assert_eq!(condition_of(&status, "Initialized").0, "True");
        assert!(status.container_statuses.as_ref().unwrap()[0].ready);
    }

    #[test]
    fn a_failed_init_container_ends_the_pod_with_the_container_never_started() {
        let mut progress = InitProgress::default();
        progress.run("fetch").starts = 1;
        progress.run("fetch").last_code = Some(3);
        let mut failed = running_status();
        failed.phase = Some("Failed".into());
        let status = with_inits(&pod("Running"), failed, Some(&progress), Timestamp::now());
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        let ended = state(&status, 0).terminated.unwrap();
        assert_eq!(
            (ended.exit_code, ended.reason.as_deref()),
            (3, Some("Error"))
        );
        assert!(
            status.container_statuses.as_ref().unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .waiting
                .is_some()
        );
        // A container that waits for something else keeps saying so (a budget, say).
        let mut budget = running_status();
        budget.phase = Some("Pending".into());
        budget.container_statuses.as_mut().unwrap()[0].state =
            Some(waiting("BudgetExceeded", "over"));
        let status = with_inits(&pod("Pending"), budget, None, Timestamp::now());
        let main = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!(waiting_reason(main), Some("BudgetExceeded"));
        // A pod without init containers is left as it is.
        let mut plain = pod("Running");
        plain.spec.as_mut().unwrap().init_containers = None;
        assert_eq!(
            with_inits(&plain, running_status(), Some(&progress), Timestamp::now()),
            running_status()
        );
    }
}
