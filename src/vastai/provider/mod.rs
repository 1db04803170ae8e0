//! Vast.ai behind the provider seam: offers searched inside the installation's policy, one
//! instance bought per pod label (adopted, never bought twice, after a lost answer or a crash),
//! instances destroyed (never stopped: a stopped instance bills storage), logs read through
//! `request_logs` and followed by polling.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use runpod_contract::vastai::{self as contract_vastai, Requirements, VastPolicy};
use serde_json::json;
use tracing::{debug, warn};

use crate::provider::{
    CloudName, Constraints, Disruption, Endpoint, Ends, FinalLog, GpuUsage, Instance,
    InstanceState, LogEntries, LogOptions, PriceSheet, Provider, ProviderError, ProvisionError,
    ProvisionRequest, Provisioned, ShellAccess, Tags, Usage,
};
use logs::{async_stream, entries, lines_of};

mod logs;
mod offers;
use offers::bought_summary;
#[cfg(test)]
mod tests;
use crate::vastai::client::VastClient;
use crate::vastai::error::VastError;
use crate::vastai::label::Label;
use crate::vastai::model::{self, RegistryLogin};
use crate::vastai::placement::BuyError;
use crate::vastai::select::OfferQuery;
use crate::vastai::translate;

/// Disk of a pod that names none (GB), priced into every offer.
pub const DEFAULT_DISK_GB: u32 = runpod_contract::vastai::DEFAULT_DISK_GB;
/// Between two price searches (Vast.ai allows 10 searches a minute, and creates search too).
const PRICE_SEARCH_GAP: Duration = Duration::from_secs(8);
/// Lines read from a finished instance's log.
const FINAL_LOG_LINES: u32 = 500;

/// The Vast.ai provider.
pub struct VastaiProvider {
    client: VastClient,
    policy: VastPolicy,
    cluster_id: String,
    node_name: String,
    /// Prices per GPU type inside the policy, from the last price search of each tier.
    prices: Mutex<Vec<PriceSheet>>,
}

impl VastaiProvider {
    pub fn new(
        client: VastClient,
        policy: VastPolicy,
        cluster_id: String,
        node_name: String,
    ) -> VastaiProvider {
        VastaiProvider {
            client,
            policy,
            cluster_id,
            node_name,
            prices: Mutex::new(Vec::new()),
        }
    }

    /// Reads the market's prices inside the policy every `every` (five searches, 8 s apart),
    /// for the node's published prices (`runpod.io/provider: cheapest` compares them). Vast.ai
    /// allows 10 searches a minute: a few every few minutes leave the rest to creates.
    pub fn spawn_price_refresher(self: &Arc<Self>, every: Duration) {
        let provider = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(strong) = provider.upgrade() else {
                    return;
                };
                strong.refresh_price().await;
                drop(strong);
                tokio::time::sleep(every).await;
            }
        });
    }

    /// One price search per memory tier, [`PRICE_SEARCH_GAP`] apart so that a pod's own search
    /// never queues behind all of them; a tier whose search fails keeps its last prices.
    async fn refresh_price(&self) {
        for (tier, query) in OfferQuery::price_searches(&self.policy).iter().enumerate() {
            if tier > 0 {
                tokio::time::sleep(PRICE_SEARCH_GAP).await;
            }
            match self.client.search(query).await {
                Ok(offers) => {
                    let sheet = PriceSheet {
                        fetched_at: Some(Timestamp::now().as_second()),
                        ..crate::vastai::prices::price_sheet(
                            &offers,
                            query.disk_gb,
                            query.interruptible.is_some(),
                        )
                    };
                    let mut tiers = self.prices.lock().unwrap_or_else(PoisonError::into_inner);
                    if tiers.len() <= tier {
                        tiers.resize(tier + 1, PriceSheet::default());
                    }
                    tiers[tier] = sheet;
                }
                Err(error) => debug!(error = %error, tier, "vastai price search failed"),
            }
        }
    }

    fn requirements(&self, pod: &Pod) -> Result<Requirements, String> {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let gpus = runpod_contract::checks::gpu_count(pod);
        contract_vastai::requirements(&annotations, gpus, &self.policy)
            .map_err(|problems| problems.join("; "))
    }

    fn label(&self, pod: &Pod) -> Result<Label, ProvisionError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        Label::new(&self.cluster_id, &self.node_name, uid).map_err(ProvisionError::Rejected)
    }

    /// The instance just bought or adopted, as Vast.ai shows it; a placeholder in
    /// `provisioning` while reads lag the create.
    async fn instance_after_buy(&self, id: u64, label: &Label) -> Instance {
        match self.client.get(id).await {
            Ok(Some(found)) => to_instance(&found),
            _ => Instance {
                ssh: None,
                machine: None,
                disruption: None,
                id: id.to_string(),
                name: label.to_string(),
                tags: tags(Some(label)),
                state: InstanceState::Provisioning,
                uptime_secs: None,
                cost_per_hour: None,
                gpu_type: None,
                datacenter: None,
                endpoints: Vec::new(),
                ip: None,
                created_at: Some(Timestamp::now()),
                started_at: None,
                message: None,
                usage: None,
            },
        }
    }
}

fn tags(label: Option<&Label>) -> Tags {
    match label {
        Some(label) => Tags {
            cluster_id: Some(label.cluster().to_owned()),
            node_name: Some(label.node().to_owned()),
            pod_uid: Some(label.pod_uid().to_owned()),
        },
        None => Tags::default(),
    }
}

/// Vast.ai's `actual_status` in the provider's terms: `exited` ends the container; `unknown`,
/// `offline`, an OCI failure, and `stopped` or `frozen` (we never stop an instance: credit,
/// contract end) never run the pod again, so they fail it and the instance is destroyed.
pub fn state_of(instance: &model::Instance) -> InstanceState {
    use model::InstanceState as Vast;
    // A destroyed contract that a read still shows.
    if instance.cur_state.as_deref() == Some("unloaded") {
        return InstanceState::Terminated;
    }
    match instance.state() {
        Vast::Provisioning => InstanceState::Provisioning,
        Vast::Created if instance.is_dead() => InstanceState::Error,
        Vast::Created | Vast::Loading | Vast::Rebooting => InstanceState::Starting,
        Vast::Running => InstanceState::Running,
        Vast::Exited => InstanceState::Exited,
        Vast::Stopped | Vast::Frozen | Vast::Unknown | Vast::Offline => InstanceState::Error,
        Vast::Other(_) => InstanceState::Unknown,
    }
}

/// A Vast.ai instance in the provider's common terms.
pub fn to_instance(instance: &model::Instance) -> Instance {
    let label = instance.label.as_deref().and_then(Label::parse);
    let state = state_of(instance);
    let endpoints = instance
        .endpoints()
        .into_iter()
        .filter_map(|(port, address)| {
            let (number, protocol) = port.split_once('/')?;
            Some(Endpoint {
                port: number.parse().ok()?,
                protocol: if protocol == "udp" { "udp" } else { "tcp" }.to_owned(),
                address: Some(address),
            })
        })
        .collect();
    let started_at = instance
        .start_date
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Timestamp::from_millisecond((s * 1000.0) as i64).ok());
    let message = match state {
        InstanceState::Error if disruption_of(instance) == Some(Disruption::Outbid) => {
            Some(format!(
                "Vast.ai instance {} was outbid: a higher bid took machine {}",
                instance.id,
                instance
                    .machine_id
                    .map_or("(unknown)".to_owned(), |m| m.to_string())
            ))
        }
        InstanceState::Error => Some(format!(
            "Vast.ai instance {} is {}{}; it never runs again",
            instance.id,
            instance.actual_status.as_deref().unwrap_or("unknown"),
            instance
                .status_msg
                .as_deref()
                .filter(|m| !m.is_empty())
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        )),
        _ => instance.status_msg.clone().filter(|m| !m.is_empty()),
    };
    Instance {
        ssh: None,
        machine: instance.machine_id.map(|machine| machine.to_string()),
        disruption: disruption_of(instance),
        id: instance.id.to_string(),
        name: instance.label.clone().unwrap_or_default(),
        tags: tags(label.as_ref()),
        state,
        uptime_secs: None,
        cost_per_hour: instance.dph_total,
        gpu_type: instance.gpu_name.clone().filter(|g| !g.is_empty()),
        datacenter: instance
            .geolocation
            .as_deref()
            .and_then(model::country_code),
        endpoints,
        ip: instance
            .public_ipaddr
            .as_deref()
            .map(str::trim)
            .filter(|ip| !ip.is_empty())
            .map(str::to_owned),
        created_at: started_at,
        started_at,
        message,
        usage: (state == InstanceState::Running)
            .then(|| usage(instance))
            .flatten(),
    }
}

/// Whether Vast.ai took the instance away: a bid stopped while it still intends to run was
/// outbid; a stopped or frozen instance we never stopped (credit, contract end), or a host
/// that is `offline` or silent (`unknown`), was lost. An image that fails is the pod's own
/// doing, not a disruption.
pub fn disruption_of(instance: &model::Instance) -> Option<Disruption> {
    use model::InstanceState as Vast;
    if instance.cur_state.as_deref() == Some("unloaded") {
        return None;
    }
    match instance.state() {
        Vast::Stopped
            if instance.is_bid == Some(true)
                && instance.intended_status.as_deref() != Some("stopped") =>
        {
            Some(Disruption::Outbid)
        }
        Vast::Stopped | Vast::Frozen | Vast::Unknown | Vast::Offline => Some(Disruption::Lost),
        _ => None,
    }
}

/// The live report of a running instance as shares: `cpu_util` and `gpu_util` are fractions
/// (one `gpu_util` for all its GPUs), memory is `mem_usage` of `mem_limit`. `None` when it
/// reports nothing.
fn usage(instance: &model::Instance) -> Option<Usage> {
    let fraction = |value: Option<f64>| Usage::ratio(value.map(|v| v * 100.0));
    let memory = match (instance.mem_usage, instance.mem_limit) {
        (Some(used), Some(limit)) if limit > 0.0 => Usage::ratio(Some(used / limit * 100.0)),
        _ => None,
    };
    let gpu = fraction(instance.gpu_util);
    let usage = Usage {
        cpu: fraction(instance.cpu_util),
        memory,
        gpus: match gpu {
            Some(util) => vec![
                GpuUsage {
                    util: Some(util),
                    memory: None
                };
                instance.num_gpus.unwrap_or(1).max(1) as usize
            ],
            None => Vec::new(),
        },
    };
    (usage.cpu.is_some() || usage.memory.is_some() || !usage.gpus.is_empty()).then_some(usage)
}

/// The exit code Vast.ai's status message gives (`Container exited with code N`), if any.
pub fn exit_code_from_status(message: &str) -> Option<i32> {
    let lower = message.to_ascii_lowercase();
    let (_, rest) = lower.split_once("exited with code")?;
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

fn provider_error(error: VastError) -> ProviderError {
    match error {
        VastError::Unauthorized { .. } => ProviderError::KeyRefused(error.to_string()),
        VastError::InsufficientCredit { .. } => ProviderError::Account(error.to_string()),
        other => ProviderError::Unavailable(other.to_string()),
    }
}

fn parse_id(id: &str) -> Option<u64> {
    id.trim().parse().ok()
}

fn buy_error(error: BuyError) -> ProvisionError {
    match &error {
        BuyError::NoOffer(attempts) if attempts.is_empty() => {
            ProvisionError::NoCandidates(error.to_string())
        }
        BuyError::NoOffer(_) => ProvisionError::NoCapacity(error.to_string()),
        BuyError::Refused(
            VastError::Unauthorized { .. } | VastError::InsufficientCredit { .. },
        ) => ProvisionError::AccountBlocked(error.to_string()),
        BuyError::Refused(VastError::Invalid { .. }) => ProvisionError::Rejected(error.to_string()),
        // Rate limits and the like: nothing was bought, try again later.
        BuyError::Refused(_) | BuyError::Lookup(_) => {
            ProvisionError::NoCandidates(error.to_string())
        }
        BuyError::Unconfirmed { .. } => ProvisionError::Unsettled(error.to_string()),
    }
}

impl Provider for VastaiProvider {
    fn cloud(&self) -> CloudName {
        CloudName::VASTAI
    }

    fn shell_access(&self) -> ShellAccess {
        ShellAccess::Declined(
            "exec and port-forward are not available on Vast.ai pods: instances run in Vast.ai's \
             args mode, which starts no SSH server (its SSH run types would replace the image's \
             entrypoint)",
        )
    }

    fn id_annotation(&self) -> &'static str {
        contract_vastai::INSTANCE_ID
    }

    fn read_lag(&self) -> Duration {
        self.client.grace_window()
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let instances = self.client.list(&json!({})).await.map_err(provider_error)?;
        Ok(instances.iter().map(to_instance).collect())
    }

    async fn lookup(&self, id: &str) -> Result<Option<Instance>, ProviderError> {
        // Not a Vast.ai id (a forged annotation): no such instance.
        let Some(id) = parse_id(id) else {
            return Ok(None);
        };
        let found = self.client.get(id).await.map_err(provider_error)?;
        match found {
            Some(instance) => Ok(Some(to_instance(&instance))),
            // Reads lag a create: an instance this process bought is not gone because a read
            // does not show it yet.
            None if self.client.created_lately(id) => Err(ProviderError::Unavailable(format!(
                "Vast.ai does not show instance {id} yet, which this controller created"
            ))),
            None => Ok(None),
        }
    }

    fn constraints(&self, pod: &Pod) -> Result<Constraints, String> {
        let wanted = self.requirements(pod)?;
        Ok(Constraints {
            allowed_datacenters: wanted.countries,
            max_price_per_hour: wanted.max_price_per_hour,
        })
    }

    async fn provision(
        &self,
        request: ProvisionRequest<'_>,
    ) -> Result<Provisioned, ProvisionError> {
        let pod = request.pod;
        let wanted = self.requirements(pod).map_err(ProvisionError::Rejected)?;
        if !request.volumes.files.is_empty() {
            return Err(ProvisionError::Rejected(
                "the pod mounts files, which Vast.ai instances cannot receive".into(),
            ));
        }
        if pod
            .spec
            .as_ref()
            .is_some_and(|s| s.init_containers.as_ref().is_some_and(|i| !i.is_empty()))
        {
            return Err(ProvisionError::Rejected(
                "the pod has init containers, which Vast.ai cannot run (nothing runs commands \
                 in its instances before the container's)"
                    .into(),
            ));
        }
        let label = self.label(pod)?;
        let container = request.container()?;
        let env = request.env.container_env(container);
        let query = OfferQuery {
            // The pod's memory and CPU requests choose machines that have them (Vast.ai does
            // not enforce them inside the container, as no cloud does).
            min_cpu_ram_gb: runpod_contract::quantity::pod_requested(pod, "memory")
                .map(|bytes| bytes / 1e9),
            min_cpu_cores: runpod_contract::quantity::pod_requested(pod, "cpu"),
            avoided_machines: request
                .avoided_machines
                .iter()
                .filter_map(|machine| machine.parse().ok())
                .collect(),
            ..OfferQuery::for_pod(&wanted, &self.policy, DEFAULT_DISK_GB)
        };
        let mut create = translate::create_request(pod, &env, &label, query.disk_gb)
            .map_err(|e| ProvisionError::Rejected(e.to_string()))?;
        create.interruptible = wanted.interruptible;
        create.price_cap = query.max_price_per_hour;
        if let Some(login) = request.pull_credential {
            create.registry = Some(
                RegistryLogin::new(&login.username, &login.password, &login.registry).map_err(
                    |problem| {
                        ProvisionError::Rejected(format!(
                            "imagePullSecrets for {}: {problem}",
                            login.registry
                        ))
                    },
                )?,
            );
        }
        let offers = self
            .offers(&query, &wanted, request.excluded_gpu_types)
            .await?;
        let bought = self
            .client
            .buy(&label, &offers, &create)
            .await
            .map_err(buy_error)?;
        let summary = bought_summary(&bought, &offers, &create);
        let instance = self.instance_after_buy(bought.instance_id(), &label).await;
        Ok(Provisioned {
            instance,
            summary,
            refusals: Vec::new(),
            duplicates: Vec::new(),
            possibly_duplicated: false,
        })
    }

    /// Vast.ai has no stop that ends billing (a stopped instance bills storage): the instance is
    /// destroyed at once, which also ends its container.
    async fn stop(&self, id: &str) -> Result<bool, ProviderError> {
        let Some(number) = parse_id(id) else {
            return Ok(false);
        };
        match self.client.destroy(number).await {
            Ok(_) => Ok(true),
            Err(error) => Err(provider_error(error)),
        }
    }

    async fn terminate(&self, id: &str, _ends: Ends) -> Result<(), ProviderError> {
        let Some(number) = parse_id(id) else {
            return Ok(());
        };
        self.client
            .destroy(number)
            .await
            .map(drop)
            .map_err(provider_error)
    }

    /// Not read on Vast.ai (no `adopt` there): an untagged instance is treated as before.
    async fn origin(
        &self,
        _id: &str,
    ) -> Result<Option<crate::provider::InstanceOrigin>, ProviderError> {
        Ok(None)
    }

    /// Vast.ai instances run without an SSH server of ours (exec is not served there).
    async fn ssh_host_keys(&self, _id: &str) -> Result<Vec<String>, ProviderError> {
        Ok(Vec::new())
    }

    async fn final_log(&self, id: &str) -> Result<FinalLog, ProviderError> {
        let Some(number) = parse_id(id) else {
            return Ok(FinalLog::default());
        };
        let read = self.client.logs(number, FINAL_LOG_LINES).await;
        let lines = match &read {
            Ok(text) => lines_of(text),
            Err(error) => {
                warn!(instance = number, error = %error, "reading the final Vast.ai log failed");
                Vec::new()
            }
        };
        let from_log = crate::provider::exit_code(lines.iter().map(String::as_str));
        let code = match from_log {
            Some(code) => Some(code),
            None => self
                .client
                .get(number)
                .await
                .map_err(provider_error)?
                .and_then(|instance| instance.status_msg)
                .as_deref()
                .and_then(exit_code_from_status),
        };
        // Without a code and without the log, the caller tries again rather than end the pod
        // with an unknown code.
        if let (None, Err(error)) = (code, read) {
            return Err(provider_error(error));
        }
        Ok(FinalLog::bounded(code, entries(&lines)))
    }

    fn logs(&self, id: &str, options: LogOptions) -> LogEntries {
        let client = self.client.clone();
        let id = parse_id(id);
        let tail = options.tail_lines;
        let stream = async_stream(client, id, tail, options.follow);
        Box::pin(stream)
    }

    fn price_sheet(&self) -> PriceSheet {
        let tiers = self.prices.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Timestamp::now().as_second();
        let mut sheet = PriceSheet::default();
        // A tier whose searches keep failing drops out once its prices are stale.
        for tier in tiers.iter().filter(|tier| {
            tier.fetched_at
                .is_some_and(|at| now - at <= runpod_contract::gpus::STALE_AFTER_SECS)
        }) {
            sheet.merge(tier.clone());
        }
        sheet
    }
}
