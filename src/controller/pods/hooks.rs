//! A container's `preStop` `exec` hook, run as the kubelet runs it: in the container, before
//! the stop that sends its command TERM, within the pod's grace period. It runs over the
//! node's SSH connection to the pod (the path `kubectl exec` takes), so only on clouds that
//! offer a shell; the admission warning says where it cannot run.

use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, warn};

use super::decide::Note;
use super::decide::ends::grace_period;
use crate::controller::context::Shared;
use crate::controller::kubelet_api::exec::ssh;
use crate::controller::shell;
use crate::provider::{Provider, ShellAccess};

/// The shortest time a hook is given, whatever the grace period (a grace of 0 skips it).
const MIN_HOOK_TIME: std::time::Duration = std::time::Duration::from_secs(2);

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

/// Runs the pod's `preStop` `exec` hook once per instance, if it has one and the cloud offers
/// a shell; returns the Event to say when it could not run or failed (`FailedPreStopHook`, as
/// the kubelet says it). The stop follows whatever the hook did.
pub async fn pre_stop<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance_id: &str,
) -> Option<Note> {
    let command = pre_stop_command(pod)?;
    if !matches!(shared.provider.shell_access(), ShellAccess::Offered { .. }) {
        return None;
    }
    let grace = grace_period(pod);
    if grace.is_zero() {
        return None;
    }
    let first = shared.remember(uid, |m| m.pre_stop_ran.insert(instance_id.to_owned()));
    if !first {
        return None;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let failed = |why: String| {
        warn!(pod = %format!("{namespace}/{name}"), %why, "the preStop hook did not run");
        Some(Note::warning(
            "FailedPreStopHook",
            format!("PreStopHook failed: {why}"),
        ))
    };
    let reach = match shell::reach(shared, pod, namespace, name).await {
        Ok(reach) => reach,
        Err(refusal) => return failed(refusal.message),
    };
    let session = match ssh::connect(&reach.target, uid, &reach.key, &reach.expected).await {
        Ok(session) => session,
        Err(error) => return failed(error.to_string()),
    };
    let joined = match shlex::try_join(command.iter().map(String::as_str)) {
        Ok(joined) => joined,
        Err(error) => return failed(format!("the command cannot be quoted: {error}")),
    };
    let ran = session
        .output_within(&joined, grace.max(MIN_HOOK_TIME))
        .await;
    session.disconnect().await;
    match ran {
        Ok((0, _)) => {
            debug!(pod = %format!("{namespace}/{name}"), "the preStop hook ran");
            None
        }
        Ok((code, output)) => {
            let output = String::from_utf8_lossy(&output);
            let tail: String = output.trim().chars().rev().take(300).collect();
            let tail: String = tail.chars().rev().collect();
            failed(format!("command {joined:?} exited with {code}: {tail}"))
        }
        Err(error) => failed(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
