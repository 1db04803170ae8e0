//! What RunPod's answers mean in the provider's common terms: a pod as an instance, its live
//! report as usage, a failed call or placement as the error the controller acts on, and the
//! create Event's summary.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::provider::{
    Endpoint, GpuUsage, Instance, InstanceState, ProviderError, ProvisionError, SshAddress, Tags,
    Usage,
};
use crate::runpod::error::ApiError;
use crate::runpod::model::{self, PodStatus};
use crate::runpod::placement::{Attempt, PlacementError};
use crate::runpod::select::Candidate;
use crate::runpod::translate;
use crate::runpod::wrapper::Completion;

pub(super) fn classify_unreachable(error: &ApiError) -> ProvisionError {
    match error {
        ApiError::Unauthorized { .. } | ApiError::PaymentRequired { .. } => {
            ProvisionError::AccountBlocked(error.to_string())
        }
        other => ProvisionError::NoCandidates(format!("cannot read the RunPod catalogue: {other}")),
    }
}

pub(super) fn provider_error(error: ApiError) -> ProviderError {
    match error {
        ApiError::Unauthorized { .. } | ApiError::Forbidden { .. } => {
            ProviderError::KeyRefused(error.to_string())
        }
        ApiError::PaymentRequired { .. } => ProviderError::Account(error.to_string()),
        other => ProviderError::Unavailable(other.to_string()),
    }
}

pub(super) fn refusals(attempts: &[Attempt]) -> Vec<String> {
    attempts
        .iter()
        .map(|a| {
            format!(
                "{} in {}: {}",
                a.gpu_id,
                a.data_center_ids.join(","),
                a.error.kind()
            )
        })
        .collect()
}

pub(super) fn completion(pod: &Pod) -> Completion {
    match pod
        .spec
        .as_ref()
        .and_then(|spec| spec.restart_policy.as_deref())
    {
        Some("Never") => Completion::RunOnce,
        Some("OnFailure") => Completion::UntilSuccess,
        _ => Completion::Forever,
    }
}

/// A RunPod pod in the provider's common terms.
pub fn to_instance(pod: &model::Pod) -> Instance {
    let tag = |key: &str| pod.env.get(key).cloned().filter(|v| !v.is_empty());
    let state = match pod.status {
        PodStatus::Provisioning => InstanceState::Provisioning,
        PodStatus::Starting => InstanceState::Starting,
        PodStatus::Running => InstanceState::Running,
        PodStatus::Exited => InstanceState::Exited,
        PodStatus::Error => InstanceState::Error,
        PodStatus::Terminated => InstanceState::Terminated,
        PodStatus::Unknown => InstanceState::Unknown,
    };
    let published = pod.published_ports();
    let internal_ssh = pod.env.get(translate::TAG_SSH).map(String::as_str) == Some("internal");
    let endpoints = pod
        .ports
        .iter()
        .filter(|spec| !(internal_ssh && spec.as_str() == "22/tcp"))
        .filter_map(|spec| {
            let (port, protocol) = spec.split_once('/')?;
            let port: u32 = port.trim().parse().ok()?;
            let mapping = published.iter().find(|p| p.private == Some(port));
            let address = match protocol {
                "http" => (state == InstanceState::Running)
                    .then(|| format!("https://{}-{port}.proxy.runpod.net", pod.id)),
                _ => mapping.and_then(|m| Some(format!("{}:{}", m.ip.as_deref()?, m.public?))),
            };
            Some(Endpoint {
                port,
                protocol: protocol.to_owned(),
                address,
            })
        })
        .collect();
    let ip = published.iter().find_map(|p| p.ip.clone());
    // `ssh.direct`, else the public mapping of 22/tcp (the same address, earlier lists).
    let ssh = pod
        .ssh
        .as_ref()
        .and_then(|ssh| ssh.direct.as_ref())
        .and_then(|direct| {
            Some(SshAddress {
                host: direct.host.clone().filter(|h| !h.is_empty())?,
                port: u16::try_from(direct.port?).ok()?,
                user: direct.username.clone().unwrap_or_else(|| "root".to_owned()),
            })
        })
        .or_else(|| {
            let mapping = published.iter().find(|p| {
                p.private == Some(22) && p.protocol.as_deref().is_none_or(|t| t == "tcp")
            })?;
            Some(SshAddress {
                host: mapping.ip.clone()?,
                port: u16::try_from(mapping.public?).ok()?,
                user: "root".to_owned(),
            })
        })
        .filter(|_| state == InstanceState::Running);
    let parse = |ts: &Option<String>| ts.as_deref().and_then(|t| t.parse::<Timestamp>().ok());
    Instance {
        ssh,
        id: pod.id.clone(),
        name: pod.name.clone(),
        tags: Tags {
            cluster_id: tag(crate::provider::TAG_CLUSTER),
            node_name: tag(crate::provider::TAG_NODE),
            pod_uid: tag(crate::provider::TAG_POD_UID),
        },
        state,
        uptime_secs: pod.runtime.as_ref().and_then(|r| r.uptime).map(u64::from),
        cost_per_hour: pod.cost,
        gpu_type: pod
            .gpu
            .as_ref()
            .map(|g| g.id.clone())
            .filter(|id| !id.is_empty()),
        datacenter: pod.data_center_id.clone(),
        endpoints,
        ip,
        created_at: parse(&pod.created_at),
        started_at: parse(&pod.started_at),
        message: None,
        usage: (state == InstanceState::Running)
            .then(|| pod.runtime.as_ref().and_then(usage))
            .flatten(),
        machine: pod.machine_id.clone().filter(|id| !id.is_empty()),
        // A RunPod pod lost to the cloud is one that vanished (no state says so).
        disruption: None,
    }
}

/// The live report in `runtime`, as ratios; `None` when it holds no figure at all (`{}` while
/// the container comes up).
fn usage(runtime: &model::Runtime) -> Option<Usage> {
    let usage = Usage {
        cpu: Usage::ratio(runtime.cpu.as_ref().and_then(|c| c.util)),
        memory: Usage::ratio(runtime.memory.as_ref().and_then(|m| m.util)),
        gpus: runtime
            .gpus
            .iter()
            .map(|g| GpuUsage {
                util: Usage::ratio(g.util),
                memory: Usage::ratio(g.memory_util),
            })
            .collect(),
    };
    let reported = usage.cpu.is_some()
        || usage.memory.is_some()
        || usage
            .gpus
            .iter()
            .any(|g| g.util.is_some() || g.memory.is_some());
    reported.then_some(usage)
}

/// What the create Event says of the offer taken.
pub(super) fn summary(candidate: Option<&Candidate>) -> String {
    match candidate {
        Some(c) => format!(
            "{} x{} on {} cloud at {:.3} USD/h, datacenters {}",
            c.gpu_id,
            c.gpu_count,
            c.cloud.as_str(),
            c.price_per_hour,
            if c.data_center_ids.is_empty() {
                "any".to_owned()
            } else {
                c.data_center_ids.join(",")
            }
        ),
        None => "adopted the RunPod pod that already existed".to_owned(),
    }
}

/// What a placement that made nothing (or nothing known) means to the controller.
pub(super) fn provision_error(error: PlacementError) -> ProvisionError {
    let message = error.to_string();
    match error {
        PlacementError::NoCandidates => ProvisionError::NoCandidates(message),
        PlacementError::NoCapacity { .. } => ProvisionError::NoCapacity(message),
        PlacementError::RequestRejected { .. } => ProvisionError::Rejected(message),
        PlacementError::Invalid(api) => match api {
            ApiError::Unauthorized { .. } => ProvisionError::AccountBlocked(message),
            ApiError::NoSuchEndpoint { .. } => ProvisionError::Unsettled(message),
            _ => ProvisionError::Rejected(message),
        },
        PlacementError::PaymentRequired(_) => ProvisionError::AccountBlocked(message),
        PlacementError::Unsettled(_) => ProvisionError::Unsettled(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: &str, runtime: serde_json::Value) -> model::Pod {
        serde_json::from_value(serde_json::json!({"id": "p", "status": status, "runtime": runtime}))
            .unwrap()
    }

    #[test]
    fn the_controllers_ssh_port_is_no_endpoint_and_its_address_is_read() {
        let json = |env: serde_json::Value, ssh: serde_json::Value| -> model::Pod {
            serde_json::from_value(serde_json::json!({
                "id": "p", "status": "RUNNING", "ports": ["8888/http", "22/tcp"], "env": env,
                "runtime": {"ports": [{"private": 22, "public": 40022, "type": "tcp", "ip": "203.0.113.7"}]},
                "ssh": ssh,
            }))
            .unwrap()
        };
        let internal = to_instance(&json(
            serde_json::json!({"RUNPOD_KUBELET_SSH": "internal"}),
            serde_json::json!({"direct": {"host": "203.0.113.7", "port": 40022, "username": "root"}}),
        ));
        assert_eq!(
            internal
                .endpoints
                .iter()
                .map(|e| e.port)
                .collect::<Vec<_>>(),
            [8888],
            "22/tcp opened for exec is no endpoint (nor a readiness condition)"
        );
        assert_eq!(
            internal.ssh,
            Some(SshAddress {
                host: "203.0.113.7".into(),
                port: 40022,
                user: "root".into()
            })
        );
        // A pod that asked for 22/tcp itself keeps it as an endpoint; without `ssh.direct` the
        // published mapping gives the address; a malformed `ssh` costs exec only.
        let own = to_instance(&json(
            serde_json::json!({}),
            serde_json::json!({"direct": null}),
        ));
        assert_eq!(own.endpoints.len(), 2);
        assert_eq!(own.ssh.as_ref().map(|s| s.port), Some(40022));
        let odd = to_instance(&json(serde_json::json!({}), serde_json::json!("garbage")));
        assert_eq!(odd.ssh.as_ref().map(|s| s.port), Some(40022));
        // Not running: no address.
        let mut stopped = json(serde_json::json!({}), serde_json::json!(null));
        stopped.status = PodStatus::Exited;
        assert!(to_instance(&stopped).ssh.is_none());
    }

    #[test]
    fn a_running_pods_report_becomes_ratios_and_nothing_else_reports() {
        let report = serde_json::json!({"uptime": 5, "cpu": {"util": 40}, "memory": {"util": 150},
            "gpus": [{"util": 80, "memoryUtil": 60}, {"util": 20}]});
        let usage = to_instance(&pod("RUNNING", report.clone())).usage.unwrap();
        assert_eq!(usage.cpu, Some(0.4));
        assert_eq!(usage.memory, Some(1.0), "clamped to a share");
        assert_eq!(usage.gpus.len(), 2);
        assert_eq!(usage.gpu_busiest(), Some(0.8));
        assert_eq!(usage.gpu_util(), Some(0.5));
        assert_eq!(usage.gpu_memory(), Some(0.6));
        // Stopped, or up without figures yet: no live report.
        assert!(to_instance(&pod("EXITED", report)).usage.is_none());
        assert!(
            to_instance(&pod("RUNNING", serde_json::json!({})))
                .usage
                .is_none()
        );
        assert!(
            to_instance(&pod("RUNNING", serde_json::Value::Null))
                .usage
                .is_none()
        );
    }
}
