//! RunPod behind the provider seam: the v2 client, its idempotent create, the catalogue cache,
//! placement selection and translation, with capacity cool-downs per GPU type and datacenter.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use runpod_contract::env::command_words;
use tokio::time::Instant;
use tracing::warn;

use crate::provider::{
    CloudName, Constraints, Endpoint, Ends, FinalLog, GpuUsage, Instance, InstanceState,
    LogEntries, LogEntry, LogOptions, PriceSheet, Provider, ProviderError, ProvisionError,
    ProvisionRequest, Provisioned, ShellAccess, SshAddress, Tags, Usage,
};
use crate::runpod::catalogue_cache::CatalogueCache;
use crate::runpod::client::RunPodClient;
use crate::runpod::error::ApiError;
use crate::runpod::limiter::Priority;
use crate::runpod::logs::{LogRequest, LogSource, MAX_TAIL};
use crate::runpod::model::{self, PodAction, PodStatus};
use crate::runpod::placement::{Attempt, PlacementError};
use crate::runpod::select::{self, Candidate, ClusterLimits};
use crate::runpod::translate::{self, Origin};
use crate::runpod::wrapper::{self, Completion, FileToWrite, Setup};

/// How long a GPU type × datacenter that answered "no capacity" is skipped.
const CAPACITY_COOLDOWN: Duration = Duration::from_secs(180);

/// The RunPod provider.
pub struct RunPodProvider {
    client: RunPodClient,
    catalogue: Arc<CatalogueCache>,
    limits: ClusterLimits,
    cluster_id: String,
    node_name: String,
    /// (GPU type, datacenter) → skipped until.
    cooldowns: Mutex<HashMap<(String, String), Instant>>,
    /// Sent as `PUBLIC_KEY` with `22/tcp` on every create (exec and port-forward), once given.
    ssh_public_key: std::sync::OnceLock<String>,
}

impl RunPodProvider {
    pub fn new(
        client: RunPodClient,
        catalogue: Arc<CatalogueCache>,
        limits: ClusterLimits,
        cluster_id: String,
        node_name: String,
    ) -> RunPodProvider {
        RunPodProvider {
            client,
            catalogue,
            limits,
            cluster_id,
            node_name,
            cooldowns: Mutex::new(HashMap::new()),
            ssh_public_key: std::sync::OnceLock::new(),
        }
    }

    fn cool_down(&self, attempts: &[Attempt]) {
        let until = Instant::now() + CAPACITY_COOLDOWN;
        if let Ok(mut cooldowns) = self.cooldowns.lock() {
            for attempt in attempts {
                if matches!(attempt.error, ApiError::Capacity { .. }) {
                    for dc in &attempt.data_center_ids {
                        cooldowns.insert((attempt.gpu_id.clone(), dc.clone()), until);
                    }
                }
            }
        }
    }

    /// Candidates without excluded GPU types and without cooled-down datacenters.
    fn usable(&self, mut candidates: Vec<Candidate>, excluded: &[String]) -> Vec<Candidate> {
        let now = Instant::now();
        let cooldowns = match self.cooldowns.lock() {
            Ok(mut cooldowns) => {
                cooldowns.retain(|_, until| *until > now);
                cooldowns.clone()
            }
            Err(_) => HashMap::new(),
        };
        candidates.retain(|c| !excluded.contains(&c.gpu_id));
        for candidate in &mut candidates {
            candidate
                .data_center_ids
                .retain(|dc| !cooldowns.contains_key(&(candidate.gpu_id.clone(), dc.clone())));
        }
        // A candidate whose every datacenter cooled down is skipped; one that had none
        // (anywhere allowed) stays.
        candidates
            .into_iter()
            .filter(|c| {
                !c.data_center_ids.is_empty() || !cooldowns.keys().any(|(gpu, _)| gpu == &c.gpu_id)
            })
            .collect()
    }

    async fn catalogue(
        &self,
    ) -> Result<Arc<crate::runpod::catalogue_cache::CachedCatalogue>, ProvisionError> {
        if let Some(cached) = self.catalogue.get() {
            return Ok(cached);
        }
        match self.catalogue.refresh(&self.client).await {
            Ok(()) => {}
            Err(error) => return Err(classify_unreachable(&error)),
        }
        self.catalogue.get().ok_or_else(|| {
            ProvisionError::NoCandidates("the RunPod catalogue is not loaded yet".into())
        })
    }
}

fn classify_unreachable(error: &ApiError) -> ProvisionError {
    match error {
        ApiError::Unauthorized { .. } | ApiError::PaymentRequired { .. } => {
            ProvisionError::AccountBlocked(error.to_string())
        }
        other => ProvisionError::NoCandidates(format!("cannot read the RunPod catalogue: {other}")),
    }
}

fn provider_error(error: ApiError) -> ProviderError {
    match error {
        ApiError::Unauthorized { .. } | ApiError::Forbidden { .. } => {
            ProviderError::KeyRefused(error.to_string())
        }
        ApiError::PaymentRequired { .. } => ProviderError::Account(error.to_string()),
        other => ProviderError::Unavailable(other.to_string()),
    }
}

fn refusals(attempts: &[Attempt]) -> Vec<String> {
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

fn completion(pod: &Pod) -> Completion {
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

/// Lines read from a finished pod's log (the exit code is the last of them).
const FINAL_LOG_LINES: u32 = 500;

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

impl Provider for RunPodProvider {
    fn cloud(&self) -> CloudName {
        CloudName::RUNPOD
    }

    /// RunPod's images run sshd with the key in `PUBLIC_KEY`; a create opens `22/tcp`.
    fn shell_access(&self) -> ShellAccess {
        ShellAccess::Offered {
            opened: "22/tcp for kubectl exec on a public IP and port (answers only this node's \
                     SSH key)",
        }
    }

    fn accept_shell_key(&self, public_key: String) {
        // Given once at start; a second key would be ignored rather than split the node.
        let _ = self.ssh_public_key.set(public_key);
    }

    /// HTTP ports go through RunPod's HTTPS proxy; TCP ports get a public IP and port.
    fn endpoint(&self, instance_id: &str, port: &runpod_contract::PortSpec) -> String {
        translate::endpoint(instance_id, port)
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let pods = self.client.list_pods().await.map_err(provider_error)?;
        Ok(pods.iter().map(to_instance).collect())
    }

    async fn lookup(&self, id: &str) -> Result<Option<Instance>, ProviderError> {
        let pod = self.client.get_pod(id).await.map_err(provider_error)?;
        Ok(pod.as_ref().map(to_instance))
    }

    async fn origin(
        &self,
        id: &str,
    ) -> Result<Option<crate::provider::InstanceOrigin>, ProviderError> {
        let pod = self.client.get_pod(id).await.map_err(provider_error)?;
        Ok(pod.map(|pod| crate::provider::InstanceOrigin {
            image: pod.image,
            env: pod.env,
        }))
    }

    fn constraints(&self, pod: &Pod) -> Result<Constraints, String> {
        let requirements = select::requirements(pod, &self.limits).map_err(|e| e.to_string())?;
        let cluster_cap = self.limits.max_gpu_price * f64::from(requirements.gpu_count.max(1));
        let cap = requirements
            .max_price_per_hour
            .map_or(cluster_cap, |pod_cap| pod_cap.min(cluster_cap));
        let allowed = if requirements.allowed_data_centers.is_empty() {
            self.limits.data_center_ids.clone()
        } else {
            requirements.allowed_data_centers
        };
        Ok(Constraints {
            allowed_datacenters: allowed,
            max_price_per_hour: Some(cap),
        })
    }

    async fn provision(
        &self,
        request: ProvisionRequest<'_>,
    ) -> Result<Provisioned, ProvisionError> {
        let pod = request.pod;
        let requirements = select::requirements(pod, &self.limits)
            .map_err(|e| ProvisionError::Rejected(e.to_string()))?;
        let cached = self.catalogue().await?;
        let all = select::candidates(&cached.catalogue, &requirements, &self.limits);
        let candidates = self.usable(all, request.excluded_gpu_types);
        let Some(first) = candidates.first() else {
            return Err(ProvisionError::NoCandidates(
                "no GPU type in the RunPod catalogue satisfies the pod's requirements now \
                 (memory, count, types, price cap, allowed datacenters with stock)"
                    .into(),
            ));
        };
        let origin = Origin {
            cluster_id: &self.cluster_id,
            node_name: &self.node_name,
            ssh_public_key: self.ssh_public_key.get().map(String::as_str),
        };
        let container = request.container()?;
        let env = request.env.container_env(container);
        let mut base = translate::create_request(pod, &env, &origin, first)
            .map_err(|e| ProvisionError::Rejected(e.to_string()))?;
        let words = command_words(container, &env);
        let files: Vec<FileToWrite<'_>> = request
            .volumes
            .files
            .iter()
            .map(|file| FileToWrite {
                path: &file.path,
                content: &file.content,
                mode: file.mode,
            })
            .collect();
        let setup = Setup::new(&files, &request.volumes.directories)
            .map_err(|e| ProvisionError::Rejected(format!("volumes: {e}")))?;
        if let Some(setup) = &setup {
            base.env.extend(setup.env.clone());
        }
        if let Some(args) = wrapper::wrapped_args(&words, completion(pod), setup.as_ref())
            .map_err(|e| ProvisionError::Rejected(format!("command/args: {e}")))?
        {
            base.args = Some(args);
        }
        let name = base.name.clone();
        let build = |candidate: &Candidate| {
            let mut request = base.clone();
            request.gpu.id = candidate.gpu_id.clone();
            request.gpu.count = candidate.gpu_count.max(1);
            request.cloud = candidate.cloud.as_str().to_owned();
            request.data_center_ids = candidate.data_center_ids.clone();
            request
        };
        match self
            .client
            .create_known_absent(&name, &candidates, build)
            .await
        {
            Ok(placement) => {
                self.cool_down(&placement.attempts);
                Ok(Provisioned {
                    instance: to_instance(&placement.pod),
                    summary: summary(placement.candidate.as_ref()),
                    refusals: refusals(&placement.attempts),
                    duplicates: placement.duplicates.iter().map(to_instance).collect(),
                    possibly_duplicated: placement.possibly_duplicated,
                })
            }
            Err(error) => {
                if let PlacementError::NoCapacity { attempts } = &error {
                    self.cool_down(attempts);
                }
                Err(provision_error(error))
            }
        }
    }

    async fn stop(&self, id: &str) -> Result<bool, ProviderError> {
        match self.client.pod_action(id, PodAction::Stop).await {
            Ok(_) => Ok(true),
            // Already stopped, gone, or refused (a locked pod): nothing stopped by this call.
            Err(ApiError::Conflict { .. } | ApiError::NotFound { .. }) => Ok(false),
            Err(error) => Err(provider_error(error)),
        }
    }

    async fn terminate(&self, id: &str, ends: Ends) -> Result<(), ProviderError> {
        let priority = match ends {
            Ends::GpuBilling => Priority::EndsBilling,
            Ends::Storage => Priority::Cleanup,
        };
        self.client
            .delete_pod_as(id, priority)
            .await
            .map(|_| ())
            .map_err(provider_error)
    }

    async fn final_log(&self, id: &str) -> Result<FinalLog, ProviderError> {
        let mut lines = self.logs(
            id,
            LogOptions {
                follow: false,
                tail_lines: Some(FINAL_LOG_LINES),
                since: None,
            },
        );
        let mut seen = Vec::new();
        while let Some(line) = lines.next().await {
            seen.push(line?);
        }
        let code = crate::provider::exit_code(seen.iter().map(|entry| entry.line.as_str()));
        Ok(FinalLog::bounded(code, seen))
    }

    async fn ssh_host_keys(&self, id: &str) -> Result<Vec<String>, ProviderError> {
        let request = LogRequest {
            source: Some(LogSource::Container),
            tail: Some(MAX_TAIL),
            since: None,
            follow: false,
            after_id: None,
            quiet: None,
        };
        let mut lines = self.client.logs(id, request);
        let mut seen = Vec::new();
        while let Some(line) = lines.next().await {
            seen.push(line.map_err(provider_error)?.line);
        }
        Ok(wrapper::host_key_fingerprints(
            seen.iter().map(String::as_str),
        ))
    }

    fn logs(&self, id: &str, options: LogOptions) -> LogEntries {
        let request = LogRequest {
            source: Some(LogSource::Container),
            tail: Some(options.tail_lines.unwrap_or(MAX_TAIL).min(MAX_TAIL)),
            since: options.since,
            follow: options.follow,
            after_id: None,
            quiet: None,
        };
        // The wrapper's host-key lines are for the controller, not the user's log.
        Box::pin(
            self.client
                .logs(id, request)
                .filter(|item| {
                    let ours = item
                        .as_ref()
                        .is_ok_and(|line| wrapper::is_host_key_line(&line.line));
                    std::future::ready(!ours)
                })
                .map(|item| {
                    item.map(|line| LogEntry {
                        timestamp: line.ts,
                        line: line.line,
                    })
                    .map_err(provider_error)
                }),
        )
    }

    fn price_sheet(&self) -> PriceSheet {
        let Some(cached) = self.catalogue.get() else {
            return PriceSheet::default();
        };
        let age = i64::try_from(cached.fetched_at.elapsed().as_secs()).unwrap_or(i64::MAX);
        PriceSheet {
            fetched_at: Some(Timestamp::now().as_second().saturating_sub(age)),
            ..select::price_sheet(&cached.catalogue, &self.limits.data_center_ids)
        }
    }
}

/// Logs a failed background call without the details a caller already has.
pub fn note_failure(what: &str, error: &ProviderError) {
    warn!(what, error = %error, "RunPod call failed");
}

/// What the create Event says of the offer taken.
fn summary(candidate: Option<&Candidate>) -> String {
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
fn provision_error(error: PlacementError) -> ProvisionError {
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
