//! A container's `preStop` hook (`exec` or `httpGet`), run as the kubelet runs it: in the
//! container, before the stop that sends its command TERM, within the pod's grace period. It
//! runs over the node's SSH connection to the pod (the path `kubectl exec` takes, an `httpGet`
//! to the container's loopback as `port-forward` reaches it), so only on clouds that offer a
//! shell; the admission warning says where it cannot run.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tracing::{debug, warn};

use super::decide::Note;
use super::decide::ends::grace_period;
use crate::controller::context::Shared;
use crate::controller::kubelet_api::exec::ssh;
use crate::controller::probes::{
    self,
    spec::{self, Check},
};
use crate::controller::shell;
use crate::provider::{Provider, ShellAccess};

/// The pod container's `preStop` hook as it runs: a command (`exec`) or an HTTP GET to the
/// container's loopback (`httpGet`, HTTP or HTTPS), if it has one; `Err` says why it cannot
/// run (another scheme, a port the container does not name).
pub(crate) fn pre_stop_check(pod: &Pod) -> Option<Result<Check, String>> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let hook = container.lifecycle.as_ref()?.pre_stop.as_ref()?;
    if let Some(command) = hook
        .exec
        .as_ref()
        .and_then(|exec| exec.command.clone())
        .filter(|command| !command.is_empty())
    {
        return Some(Ok(Check::Exec(command)));
    }
    let http = hook.http_get.as_ref()?;
    Some(spec::http_check(http, container, "preStop hook"))
}

/// What is left of the pod's grace period: the kubelet counts the hook inside it, and the
/// deletion timestamp of a graceful delete is the moment the grace period ends.
fn time_left(pod: &Pod, now: Timestamp) -> Duration {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .and_then(|end| Duration::try_from(end.0.duration_since(now)).ok())
        .unwrap_or(Duration::ZERO)
        .min(grace_period(&pod.metadata))
}

/// What the `preStop` hook did before the stop.
#[derive(Default)]
pub(crate) struct PreStop {
    /// When the hook started: the grace period ran from then (`None`: no hook ran).
    pub began: Option<Timestamp>,
    /// The Event to say after the stop, when the hook could not run or failed.
    pub note: Option<Note>,
}

/// Runs the pod's `preStop` `exec` hook once per pod (not per instance: a duplicate gets
/// none), if it has one and the cloud offers a shell, all of it (reaching the pod, connecting,
/// the command) within what is left of the grace period; a failure is `FailedPreStopHook`, as
/// the kubelet says it.
pub(crate) async fn pre_stop<P: Provider>(shared: &Shared<P>, pod: &Pod, uid: &str) -> PreStop {
    let began = Timestamp::now();
    let none = PreStop::default();
    let Some(check) = pre_stop_check(pod) else {
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
        note: hook(shared, pod, uid, check, left).await,
    }
}

/// [`pre_stop`]'s run, bounded by `left`.
async fn hook<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    check: Result<Check, String>,
    left: Duration,
) -> Option<Note> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let ran = async {
        let check = check?;
        tokio::time::timeout(left, run(shared, pod, (namespace, name), uid, &check, left))
            .await
            .map_err(|_| format!("it did not end within the grace period ({left:?} were left)"))?
    };
    let why = match ran.await {
        Ok(()) => {
            debug!(pod = %format!("{namespace}/{name}"), "the preStop hook ran");
            return None;
        }
        Err(why) => why,
    };
    warn!(pod = %format!("{namespace}/{name}"), %why, "the preStop hook did not run");
    Some(Note::warning(
        "FailedPreStopHook",
        format!("PreStopHook failed: {why}"),
    ))
}

/// Reaches the pod's sshd and runs `check`; why not, if it did not run or failed.
async fn run<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    (namespace, name): (&str, &str),
    uid: &str,
    check: &Check,
    limit: Duration,
) -> Result<(), String> {
    let reach = shell::reach(shared, pod, namespace, name)
        .await
        .map_err(|refusal| refusal.message)?;
    let session = ssh::connect(&reach.target, uid, &reach.key, &reach.expected)
        .await
        .map_err(|error| error.to_string())?;
    let ran = probes::run::check(&session, check, limit).await;
    session.disconnect().await;
    ran.map_err(|failure| failure.message().to_owned())
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
    fn an_exec_or_http_pre_stop_of_the_container_is_run() {
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
            pre_stop_check(&exec),
            Some(Ok(Check::Exec(vec![
                "sh".into(),
                "-c".into(),
                "sleep 1".into()
            ])))
        );
        let http =
            pod(serde_json::json!({"preStop": {"httpGet": {"port": 8080, "path": "/stop"}}}));
        assert_eq!(
            pre_stop_check(&http),
            Some(Ok(Check::Http {
                https: false,
                server_name: None,
                port: 8080,
                path: "/stop".into(),
                host: None,
                headers: Vec::new()
            }))
        );
        let https =
            pod(serde_json::json!({"preStop": {"httpGet": {"port": 8443, "scheme": "HTTPS"}}}));
        assert!(matches!(
            pre_stop_check(&https),
            Some(Ok(Check::Http {
                https: true,
                port: 8443,
                ..
            }))
        ));
        let grpc =
            pod(serde_json::json!({"preStop": {"httpGet": {"port": 8443, "scheme": "FTP"}}}));
        assert!(matches!(pre_stop_check(&grpc), Some(Err(why)) if why.contains("HTTP or HTTPS")));
        let empty = pod(serde_json::json!({"preStop": {"exec": {"command": []}}}));
        assert_eq!(pre_stop_check(&empty), None);
        assert_eq!(pre_stop_check(&pod(serde_json::json!({}))), None);
    }
}
