//! A container's `preStop` `exec` hook, run as the kubelet runs it: in the container, before
//! the stop that sends its command TERM, within the pod's grace period. It runs over the
//! node's SSH connection to the pod (the path `kubectl exec` takes), so only on clouds that
//! offer a shell; the admission warning says where it cannot run.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tracing::{debug, warn};

use super::decide::Note;
use super::decide::ends::grace_period;
use crate::controller::context::Shared;
use crate::controller::kubelet_api::exec::ssh;
use crate::controller::shell;
use crate::provider::{Provider, ShellAccess};

/// The `preStop` `exec` command of the pod's container, if it has one.
pub fn pre_stop_command(pod: &Pod) -> Option<&[String]> {
    pod.spec
        .as_ref()?
        .containers
        .first()?
        .lifecycle
        .as_ref()?
        .pre_stop
        .as_ref()?
        .exec
        .as_ref()?
        .command
        .as_deref()
        .filter(|command| !command.is_empty())
}

/// What is left of the pod's grace period: the kubelet counts the hook inside it, and the
/// deletion timestamp of a graceful delete is the moment the grace period ends.
fn time_left(pod: &Pod, now: Timestamp) -> Duration {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|end| Duration::try_from(end.0.duration_since(now)).ok())
        .unwrap_or(Duration::ZERO)
        .min(grace_period(pod))
}

/// What the `preStop` hook did before the stop.
pub struct PreStop {
    /// When the hook started: the grace period ran from then (`None`: no hook ran).
    pub began: Option<Timestamp>,
    /// The Event to say after the stop, when the hook could not run or failed.
    pub note: Option<Note>,
}

/// Runs the pod's `preStop` `exec` hook once per pod (not per instance: a duplicate gets
/// none), if it has one and the cloud offers a shell, all of it (reaching the pod, connecting,
/// the command) within what is left of the grace period; a failure is `FailedPreStopHook`, as
/// the kubelet says it.
pub async fn pre_stop<P: Provider>(shared: &Shared<P>, pod: &Pod, uid: &str) -> PreStop {
    let began = Timestamp::now();
    let none = PreStop {
        began: None,
        note: None,
    };
    let Some(command) = pre_stop_command(pod) else {
        return none;
    };
    if !matches!(shared.provider.shell_access(), ShellAccess::Offered { .. }) {
        return none;
    }
    let left = time_left(pod, began);
    if left.is_zero() {
        return none;
    }
    let first = shared.remember(uid, |m| !std::mem::replace(&mut m.pre_stop_ran, true));
    if !first {
        return none;
    }
    PreStop {
        began: Some(began),
        note: hook(shared, pod, uid, command, left).await,
    }
}

/// [`pre_stop`]'s run, bounded by `left`.
async fn hook<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    command: &[String],
    left: Duration,
) -> Option<Note> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let ran = tokio::time::timeout(
        left,
        run(shared, pod, (namespace, name), uid, command, left),
    );
    let why = match ran.await {
        Ok(Ok(())) => {
            debug!(pod = %format!("{namespace}/{name}"), "the preStop hook ran");
            return None;
        }
        Ok(Err(why)) => why,
        Err(_) => format!("it did not end within the grace period ({left:?} were left)"),
    };
    warn!(pod = %format!("{namespace}/{name}"), %why, "the preStop hook did not run");
    Some(Note::warning(
        "FailedPreStopHook",
        format!("PreStopHook failed: {why}"),
    ))
}

/// Reaches the pod's sshd and runs `command`; why not, if it did not run or failed.
async fn run<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    (namespace, name): (&str, &str),
    uid: &str,
    command: &[String],
    limit: Duration,
) -> Result<(), String> {
    let reach = shell::reach(shared, pod, namespace, name)
        .await
        .map_err(|refusal| refusal.message)?;
    let session = ssh::connect(&reach.target, uid, &reach.key, &reach.expected)
        .await
        .map_err(|error| error.to_string())?;
    let joined = shlex::try_join(command.iter().map(String::as_str))
        .map_err(|error| format!("the command cannot be quoted: {error}"))?;
    let ran = session.output_within(&joined, limit).await;
    session.disconnect().await;
    match ran.map_err(|error| error.to_string())? {
        (0, _) => Ok(()),
        (code, output) => {
            let output = String::from_utf8_lossy(&output);
            let tail: String = output.trim().chars().rev().take(300).collect();
            let tail: String = tail.chars().rev().collect();
            Err(format!("command {joined:?} exited with {code}: {tail}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hook gets what is left of the grace period, which the deletion timestamp ends.
    #[test]
    fn the_hook_runs_inside_what_is_left_of_the_grace_period() {
        let deleted: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "deletionTimestamp": "2026-01-01T00:00:30Z",
                         "deletionGracePeriodSeconds": 30},
            "spec": {"containers": [{"name": "main"}]}
        }))
        .unwrap();
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        assert_eq!(
            time_left(&deleted, at("2026-01-01T00:00:10Z")),
            Duration::from_secs(20)
        );
        assert_eq!(
            time_left(&deleted, at("2026-01-01T00:00:31Z")),
            Duration::ZERO
        );
        assert_eq!(
            time_left(&deleted, at("2025-12-31T23:00:00Z")),
            Duration::from_secs(30),
            "never more than the grace period"
        );
    }

    #[test]
    fn only_an_exec_pre_stop_of_the_container_is_run() {
        let pod = |lifecycle: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [{"name": "main", "lifecycle": lifecycle}]}
            }))
            .unwrap()
        };
        let exec =
            pod(serde_json::json!({"preStop": {"exec": {"command": ["sh", "-c", "sleep 1"]}}}));
        assert_eq!(
            pre_stop_command(&exec),
            Some(&["sh".to_owned(), "-c".to_owned(), "sleep 1".to_owned()][..])
        );
        let http =
            pod(serde_json::json!({"preStop": {"httpGet": {"port": 8080, "path": "/stop"}}}));
        assert_eq!(pre_stop_command(&http), None);
        let empty = pod(serde_json::json!({"preStop": {"exec": {"command": []}}}));
        assert_eq!(pre_stop_command(&empty), None);
        assert_eq!(pre_stop_command(&pod(serde_json::json!({}))), None);
    }
}
