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
    CloudName, Constraints, Ends, FinalLog, Instance, LogEntries, LogEntry, LogOptions,
    NetworkVolume, PriceSheet, Provider, ProviderError, ProvisionError, ProvisionRequest,
    Provisioned, ShellAccess, VolumeRequest,
};
use crate::runpod::catalogue_cache::CatalogueCache;
use crate::runpod::client::RunPodClient;
use crate::runpod::error::ApiError;
use crate::runpod::limiter::Priority;
use crate::runpod::logs::{LogRequest, LogSource, MAX_TAIL};
use crate::runpod::model::{CreatePodRequest, PodAction};
use crate::runpod::placement::{Attempt, PlacementError};
use crate::runpod::select::{self, Candidate, ClusterLimits};
use crate::runpod::translate::{self, Origin};
use crate::runpod::wrapper::{self, FileToWrite, Setup};

mod convert;
mod volumes;

pub use convert::to_instance;
use convert::{
    classify_unreachable, completion, provider_error, provision_error, refusals, summary,
};

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

    /// The GPU types and datacenters to try, best first: the catalogue's that fit the pod,
    /// less those cooling down, within its network volume's datacenter when it mounts one.
    async fn candidates_for(
        &self,
        request: &ProvisionRequest<'_>,
    ) -> Result<Vec<Candidate>, ProvisionError> {
        let pod = request.pod;
        let requirements = select::requirements(pod, &self.limits)
            .map_err(|e| ProvisionError::Rejected(e.to_string()))?;
        let cached = self.catalogue().await?;
        let all = select::candidates(&cached.catalogue, &requirements, &self.limits);
        let mut candidates = self.usable(all, request.excluded_gpu_types);
        // A network volume is in one datacenter, on Secure Cloud: the pod runs there or waits.
        if let Some(mount) = request.network_volume {
            candidates = volumes::pinned(candidates, &mount.datacenter);
            if candidates.is_empty() {
                return Err(ProvisionError::NoCandidates(format!(
                    "no GPU type the pod may use has Secure Cloud stock in {}, where its \
                     network volume {} is",
                    mount.datacenter, mount.volume_id
                )));
            }
        }
        if candidates.is_empty() {
            return Err(ProvisionError::NoCandidates(
                "no GPU type in the RunPod catalogue satisfies the pod's requirements now \
                 (memory, count, types, price cap, allowed datacenters with stock)"
                    .into(),
            ));
        }
        Ok(candidates)
    }

    /// The create request for the first candidate (the others differ only in GPU and
    /// placement): the pod's container translated, its files and hooks in the wrapper, and its
    /// network volume's mount.
    fn create_body(
        &self,
        request: &ProvisionRequest<'_>,
        candidates: &[Candidate],
    ) -> Result<CreatePodRequest, ProvisionError> {
        let pod = request.pod;
        let Some(first) = candidates.first() else {
            return Err(ProvisionError::NoCandidates(
                "no GPU type in the RunPod catalogue satisfies the pod's requirements now".into(),
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
        let init_envs: Vec<_> = pod
            .spec
            .iter()
            .flat_map(|spec| spec.init_containers.iter().flatten())
            .enumerate()
            .map(|(index, init)| {
                let resolved = request.init_env.get(index).cloned().unwrap_or_default();
                (init, resolved.container_env(init))
            })
            .collect();
        let inits = wrapper::Inits::of(&init_envs, &env)
            .map_err(|e| ProvisionError::Rejected(format!("init containers: {e}")))?;
        // The ServiceAccount's ca.crt and namespace only where the wrapper runs a command; an
        // image run without one keeps its own start (and cannot be handed files).
        let service_account = if words.is_empty() {
            &[][..]
        } else {
            &request.volumes.service_account[..]
        };
        let files: Vec<FileToWrite<'_>> = request
            .volumes
            .files
            .iter()
            .chain(service_account)
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
        if let Some(inits) = &inits {
            base.env.extend(inits.env.clone());
        }
        base.mounts = request.network_volume.map(volumes::mounts);
        let post_start = container
            .lifecycle
            .as_ref()
            .and_then(|hooks| hooks.post_start.as_ref())
            .and_then(|hook| hook.exec.as_ref())
            .and_then(|exec| exec.command.as_deref());
        // Probes, a preStop hook and an httpGet postStart hook run over SSH: a pod that runs
        // forever then starts sshd too.
        let shell = container.startup_probe.is_some()
            || container.liveness_probe.is_some()
            || container.readiness_probe.is_some()
            || container
                .lifecycle
                .as_ref()
                .and_then(|hooks| hooks.pre_stop.as_ref())
                .is_some_and(|hook| hook.exec.is_some() || hook.http_get.is_some())
            || container
                .lifecycle
                .as_ref()
                .and_then(|hooks| hooks.post_start.as_ref())
                .is_some_and(|hook| hook.http_get.is_some());
        if let Some(args) = wrapper::wrapped_args(
            &words,
            completion(pod),
            setup.as_ref(),
            post_start,
            shell,
            inits.as_ref(),
        )
        .map_err(|e| ProvisionError::Rejected(format!("command/args: {e}")))?
        {
            base.args = Some(args);
        }
        Ok(base)
    }

    /// The container log's last `tail` lines (where the wrapper's markers are read).
    async fn container_tail(
        &self,
        id: &str,
        tail: u32,
    ) -> Result<Vec<crate::runpod::logs::LogLine>, ProviderError> {
        let request = LogRequest {
            source: Some(LogSource::Container),
            tail: Some(tail),
            since: None,
            follow: false,
            after_id: None,
            quiet: None,
        };
        let mut lines = self.client.logs(id, request);
        let mut seen = Vec::new();
        while let Some(line) = lines.next().await {
            seen.push(line.map_err(provider_error)?);
        }
        Ok(seen)
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

/// Lines read from a finished pod's log (the exit code is the last of them).
const FINAL_LOG_LINES: u32 = 500;

impl Provider for RunPodProvider {
    fn cloud(&self) -> CloudName {
        CloudName::RUNPOD
    }

    /// RunPod's images run sshd with the key in `PUBLIC_KEY`; a create opens `22/tcp`.
    fn shell_access(&self) -> ShellAccess {
        ShellAccess::Offered {
            opened: "22/tcp for kubectl exec on a public IP and port (answers only this node's \
                     SSH key)",
            host_key_printed_by: "runpod-kubelet's wrapper for pods that end; RunPod's start \
                                  script for images run without a command",
        }
    }

    fn runs_post_start_hooks(&self) -> bool {
        true
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
        let candidates = self.candidates_for(&request).await?;
        let base = self.create_body(&request, &candidates)?;
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

    async fn restart(&self, id: &str) -> Result<bool, ProviderError> {
        match self.client.pod_action(id, PodAction::Restart).await {
            Ok(_) => Ok(true),
            // Not running (409), or gone: nothing to restart.
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

    /// The code from the wrapper's exit line; the lines kept for `kubectl logs` without the
    /// wrapper's markers.
    async fn final_log(&self, id: &str) -> Result<FinalLog, ProviderError> {
        let seen = self.container_tail(id, FINAL_LOG_LINES).await?;
        let code = crate::provider::exit_code(seen.iter().map(|entry| entry.line.as_str()));
        let hook = wrapper::post_start_failure(seen.iter().map(|entry| entry.line.as_str()));
        let init = wrapper::init_progress(seen.iter().map(|entry| entry.line.as_str()));
        // Each line to its container: the main container's, or an init container's.
        let mut kept = Vec::new();
        let mut init_lines: Vec<(String, Vec<LogEntry>)> = init
            .runs
            .iter()
            .map(|run| (run.name.clone(), Vec::new()))
            .collect();
        let mut owner = wrapper::LogOwner::for_window(seen.iter().map(|entry| entry.line.as_str()));
        for entry in seen {
            let whose = owner
                .read(&entry.line)
                .map(|whose| whose.map(str::to_owned));
            let line = LogEntry {
                timestamp: entry.ts,
                line: entry.line,
            };
            match whose {
                None => {}
                Some(None) => kept.push(line),
                Some(Some(init)) => {
                    if let Some((_, lines)) = init_lines.iter_mut().find(|(name, _)| *name == init)
                    {
                        lines.push(line);
                    }
                }
            }
        }
        let mut log = FinalLog::bounded(code, kept);
        log.init = init;
        log.init_lines = init_lines
            .into_iter()
            .map(|(name, lines)| (name, FinalLog::bounded(None, lines).lines))
            .collect();
        if let Some(hook) = hook {
            log.warnings.push((
                "FailedPostStartHook",
                format!("the postStart hook exited with {hook}: the container was stopped"),
            ));
        }
        Ok(log)
    }

    /// Read from the log's tail, as the exit code is.
    async fn init_progress(
        &self,
        id: &str,
    ) -> Result<crate::provider::InitProgress, ProviderError> {
        let seen = self.container_tail(id, MAX_TAIL).await?;
        Ok(wrapper::init_progress(seen.iter().map(|l| l.line.as_str())))
    }

    async fn ssh_host_keys(&self, id: &str) -> Result<Vec<String>, ProviderError> {
        let seen = self.container_tail(id, MAX_TAIL).await?;
        Ok(wrapper::host_key_fingerprints(
            seen.iter().map(|l| l.line.as_str()),
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
        // The wrapper's markers are for the controller, not the user's log; each container's
        // lines are its own (init containers run before the pod's container, in order).
        let wanted = options.container;
        let mut owner = wrapper::LogOwner::new(options.init_containers);
        Box::pin(
            self.client
                .logs(id, request)
                .filter(move |item| {
                    let ours = item
                        .as_ref()
                        .map_or(true, |line| owner.keeps(&line.line, wanted.as_deref()));
                    std::future::ready(ours)
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

    fn network_volumes(&self) -> bool {
        true
    }

    /// The first of the installation's datacenters (`--datacenter-ids`); without any, the
    /// one where the most Secure Cloud GPU types have stock now (the claim's pod can only run
    /// where its volume is).
    async fn default_volume_datacenter(&self, wanted: &[String]) -> Option<String> {
        let installation = &self.limits.data_center_ids;
        if wanted.is_empty() {
            if let Some(first) = installation.first() {
                return Some(first.clone());
            }
            let cached = self.catalogue().await.ok()?;
            return volumes::best_stocked(&cached.catalogue, &[]);
        }
        // The first pod's own datacenters, within the installation's.
        let allowed: Vec<String> = wanted
            .iter()
            .filter(|id| installation.is_empty() || installation.contains(id))
            .cloned()
            .collect();
        // Nothing both allow: no datacenter (an empty list would read as "any").
        if allowed.is_empty() {
            return None;
        }
        let stocked = match self.catalogue().await {
            Ok(cached) => volumes::best_stocked(&cached.catalogue, &allowed),
            Err(_) => None,
        };
        stocked.or_else(|| allowed.first().cloned())
    }

    async fn list_volumes(&self) -> Result<Vec<NetworkVolume>, ProviderError> {
        let listed = self.client.list_volumes().await.map_err(provider_error)?;
        Ok(listed.into_iter().map(volumes::from_runpod).collect())
    }

    async fn create_volume(&self, request: &VolumeRequest) -> Result<NetworkVolume, ProviderError> {
        let made = self
            .client
            .create_volume_once(&volumes::create_body(request))
            .await
            .map_err(provider_error)?;
        Ok(volumes::from_runpod(made))
    }

    async fn resize_volume(&self, id: &str, size_gb: u32) -> Result<NetworkVolume, ProviderError> {
        let grown = self
            .client
            .resize_volume(id, size_gb)
            .await
            .map_err(provider_error)?;
        Ok(volumes::from_runpod(grown))
    }

    async fn delete_volume(&self, id: &str) -> Result<bool, ProviderError> {
        self.client.delete_volume(id).await.map_err(provider_error)
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
