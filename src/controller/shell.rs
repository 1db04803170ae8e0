//! Reaching a burst pod's sshd, for everything that goes into a pod over SSH (exec,
//! port-forward, the cluster network bridge): whether this node has a shell at all, the pod's
//! SSH address, the node's key, and the host keys the server must present (recorded on the pod,
//! else read once from the cloud's authenticated log and recorded).

use axum::http::StatusCode;
use k8s_openapi::api::core::v1::Pod;

use crate::controller::context::Shared;
use crate::controller::kubelet_api::exec::ssh::{self, Expected, HostKeys, NodeKey, Target};
use crate::controller::node::exec_key::ExecAccess;
use crate::provider::{Instance, Provider, ShellAccess};

/// Why a pod cannot be reached over SSH now: the HTTP status kubectl gets, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    pub(crate) fn new(status: StatusCode, message: String) -> Refusal {
        Refusal { status, message }
    }
}

/// Where a pod's sshd answers, with what to log in and what host key to expect.
pub(crate) struct Reach {
    pub target: Target,
    pub key: NodeKey,
    pub expected: Expected,
}

/// How to reach the sshd of `pod` (`namespace/name`, for messages).
pub(crate) async fn reach<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    namespace: &str,
    name: &str,
) -> Result<Reach, Refusal> {
    let (key, host_keys) = access(shared)?;
    let (instance, target) = ssh_address(shared, pod, namespace, name).await?;
    let fingerprints =
        host_fingerprints(shared, pod, &instance, &target, &host_keys, namespace, name).await?;
    Ok(Reach {
        target,
        key,
        expected: Expected {
            instance: instance.id.clone(),
            fingerprints,
        },
    })
}

/// the log reader's first-line wait, 5 s).
const HOST_KEY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(8);

/// The host keys recorded for `instance` on the pod (the annotation, where every replica and
/// restart finds them), else in this process's cache. A record of another instance (the pod's
/// instance was replaced) is none: the new instance's keys are read again.
pub(crate) fn recorded_keys(pod: &Pod, instance: &str, cache: &HostKeys) -> Option<Vec<String>> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(runpod_contract::SSH_HOST_KEYS))
        .and_then(|value| runpod_contract::parse_host_keys(value))
        .filter(|(recorded, _)| recorded == instance)
        .map(|(_, keys)| keys)
        .or_else(|| cache.get(instance))
}

/// Writes the instance's host keys onto the pod (best effort: the cache serves this process
/// meanwhile, and another replica reads the log again).
async fn record_keys(client: &kube::Client, pod: &Pod, instance: &str, keys: &[String]) {
    let value = runpod_contract::format_host_keys(instance, keys);
    write_keys(client, pod, serde_json::Value::String(value)).await;
}

/// Sets the pod's host-key annotation to `value` (`null` removes it).
async fn write_keys(client: &kube::Client, pod: &Pod, value: serde_json::Value) {
    let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return;
    };
    let pods: kube::Api<Pod> = kube::Api::namespaced(client.clone(), namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {
        runpod_contract::SSH_HOST_KEYS: value
    }}});
    if let Err(error) = pods
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(%namespace, pod = %name, %error, "recording the pod's SSH host keys failed");
    }
}

/// Forgets the host keys of `instance`, whose container restarted: a restarted container may
/// print new ones (a cloud may wipe the container disk its sshd keeps them on), which are
/// read again from its log at the next connection.
pub(crate) async fn forget_host_keys<P: Provider>(shared: &Shared<P>, pod: &Pod, instance: &str) {
    if let ExecAccess::Ready { host_keys, .. } = &shared.settings.exec {
        host_keys.retain(|id| id != instance);
    }
    if recorded_keys(pod, instance, &HostKeys::default()).is_some() {
        write_keys(&shared.client, pod, serde_json::Value::Null).await;
    }
}

/// The node's key and the host keys known so far, or why this node serves no exec.
pub(crate) fn access<P: Provider>(shared: &Shared<P>) -> Result<(NodeKey, HostKeys), Refusal> {
    let (key, host_keys) = match &shared.settings.exec {
        ExecAccess::Off => {
            return Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                "runpod-kubelet: exec and port-forward are turned off on this node (--exec-ssh=false, chart controller.execSsh)".to_owned(),
            ));
        }
        ExecAccess::Unsupported(reason) => {
            return Err(Refusal::new(
                StatusCode::NOT_IMPLEMENTED,
                format!("runpod-kubelet: {reason}"),
            ));
        }
        ExecAccess::Unavailable(reason) => {
            return Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("runpod-kubelet: exec is unavailable: {reason}"),
            ));
        }
        ExecAccess::Ready { key, host_keys } => (key.clone(), host_keys.clone()),
    };
    // Keys of instances that are gone go with them.
    if let Some(snapshot) = shared.latest() {
        let live: std::collections::HashSet<&str> =
            snapshot.instances.iter().map(|i| i.id.as_str()).collect();
        host_keys.retain(|instance| live.contains(instance));
    }
    Ok((key, host_keys))
}

/// The pod's instance and where its sshd answers; the last list may predate the port mapping
/// the cloud published since, so the instance is asked for once by id before answering that
/// there is none.
async fn ssh_address<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    namespace: &str,
    name: &str,
) -> Result<(Instance, Target), Refusal> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let title = shared.provider.cloud().title;
    let instance = shared.pods_instance(&uid);
    let Some(instance) = instance else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!("pod {namespace}/{name} is not running on {title}"),
        ));
    };
    let fresh = match instance.ssh.clone() {
        Some(target) => Some(target),
        None => shared
            .provider
            .lookup(&instance.id)
            .await
            .ok()
            .flatten()
            .and_then(|looked_up| looked_up.ssh),
    };
    let Some(target) = fresh else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "pod {namespace}/{name} has no SSH address on {title} yet: it is still starting, or it was created before exec was turned on (its create did not open port 22); retry in a moment"
            ),
        ));
    };
    Ok((instance, target))
}

/// The fingerprints the instance's sshd must present: recorded on the pod, known to this
/// process, or read once from the cloud's log (and recorded). Nothing listening (an image
/// without sshd) is the plainer answer when none is known.
async fn host_fingerprints<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    instance: &Instance,
    target: &Target,
    host_keys: &HostKeys,
    namespace: &str,
    name: &str,
) -> Result<Vec<String>, Refusal> {
    let title = shared.provider.cloud().title;
    Ok(match recorded_keys(pod, &instance.id, host_keys) {
        Some(keys) => keys,
        None => {
            // Nothing listening (an image without sshd) is the plainer answer.
            if let Err(error) = ssh::reachable(target).await {
                return Err(Refusal::new(
                    StatusCode::BAD_GATEWAY,
                    format!("runpod-kubelet: pod {namespace}/{name}: {error}"),
                ));
            }
            let read = tokio::time::timeout(
                HOST_KEY_READ_TIMEOUT,
                shared.provider.ssh_host_keys(&instance.id),
            )
            .await;
            match read {
                Ok(Ok(keys)) if !keys.is_empty() => {
                    host_keys.insert(&instance.id, keys.clone());
                    record_keys(&shared.client, pod, &instance.id, &keys).await;
                    keys
                }
                Ok(Ok(_)) => {
                    let printed_by = match shared.provider.shell_access() {
                        ShellAccess::Offered {
                            host_key_printed_by,
                            ..
                        } => host_key_printed_by,
                        ShellAccess::Declined(_) => "its sshd's start",
                    };
                    return Err(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!(
                            "pod {namespace}/{name}: the SSH host key of {} {} is not known: its container prints it when its sshd starts ({printed_by}), and none is in its log; exec and port-forward connect only to a server they can verify. Retry once the pod has started",
                            shared.provider.instance_noun(),
                            instance.id
                        ),
                    ));
                }
                Ok(Err(error)) => {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "pod {namespace}/{name}: reading its SSH host key from {title}'s log failed: {error}"
                        ),
                    ));
                }
                Err(_) => {
                    return Err(Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "pod {namespace}/{name}: {title}'s log did not answer within {HOST_KEY_READ_TIMEOUT:?} for its SSH host key"
                        ),
                    ));
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_keys_are_recorded_per_instance() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "annotations": {
                runpod_contract::SSH_HOST_KEYS: "old-instance=SHA256:old"
            }}
        }))
        .unwrap();
        let restarted = HostKeys::default();
        assert_eq!(
            recorded_keys(&pod, "old-instance", &restarted),
            Some(vec!["SHA256:old".to_owned()])
        );
        assert_eq!(recorded_keys(&pod, "new-instance", &restarted), None);
        restarted.insert("new-instance", vec!["SHA256:new".to_owned()]);
        assert_eq!(
            recorded_keys(&pod, "new-instance", &restarted),
            Some(vec!["SHA256:new".to_owned()])
        );
    }
}
