//! The seam between the virtual kubelet and a GPU cloud. The node and pod machinery only sees
//! these types, so a second cloud (Vast.ai) can be added behind the same trait without touching
//! the reconcile logic.

use std::future::Future;
use std::pin::Pin;

use futures_util::Stream;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

mod instance;
pub mod metrics;
pub(crate) mod request;
mod volumes;

pub use instance::{
    Disruption, Endpoint, Ends, GpuUsage, Instance, InstanceOrigin, InstanceState, SshAddress,
    Tags, Usage,
};
pub use request::ProvisionRequest;
pub use volumes::{NetworkVolume, VolumeMount, VolumeRequest};

/// Env tags on every instance we create (the cloud's env or label), so instances can be
/// matched back to the cluster, node and Kubernetes pod (and orphans found) without trusting
/// the free-text name. Both clouds use the same names.
pub const TAG_CLUSTER: &str = "RUNPOD_KUBELET_CLUSTER";
pub const TAG_NODE: &str = "RUNPOD_KUBELET_NODE";
pub const TAG_POD_UID: &str = "RUNPOD_KUBELET_POD_UID";
pub const TAG_NAMESPACE: &str = "RUNPOD_KUBELET_NAMESPACE";
pub const TAG_POD_NAME: &str = "RUNPOD_KUBELET_POD_NAME";
/// The line that reports a container's exit code: RunPod's completion wrapper prints it last;
/// on Vast.ai an image may print it (the spec's convention), which wins over the status.
pub const EXIT_CODE_PREFIX: &str = "runpod-kubelet: exit-code=";

/// The exit code the wrapper reported last in `lines`, if any.
pub fn exit_code<'a>(lines: impl IntoIterator<Item = &'a str>) -> Option<i32> {
    lines
        .into_iter()
        .filter_map(|line| line.trim().strip_prefix(EXIT_CODE_PREFIX))
        .filter_map(|code| code.trim().parse::<i32>().ok())
        .last()
}

/// Where a pod may run and what it may cost, for verifying a placement the cloud made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Constraints {
    /// Empty: anywhere.
    pub allowed_datacenters: Vec<String>,
    pub max_price_per_hour: Option<f64>,
}

impl Constraints {
    /// Why `instance` breaks these constraints, if it does.
    pub fn violation(&self, instance: &Instance) -> Option<String> {
        if !self.allowed_datacenters.is_empty() {
            match instance.datacenter.as_deref() {
                Some(dc) if self.allowed_datacenters.iter().any(|allowed| allowed == dc) => {}
                Some(dc) => {
                    return Some(format!(
                        "placed in datacenter {dc}, outside the allowed {}",
                        self.allowed_datacenters.join(",")
                    ));
                }
                // Not placed yet: nothing to verify.
                None => {}
            }
        }
        match (self.max_price_per_hour, instance.cost_per_hour) {
            // A small tolerance for prices rounded differently by the list and the catalogue.
            (Some(cap), Some(cost)) if cost > cap + 1e-6 => Some(format!(
                "billed {cost:.3} USD/h, above the pod's cap of {cap:.3} USD/h"
            )),
            _ => None,
        }
    }
}

/// The instance a provision made or adopted.
#[derive(Debug, Clone)]
pub struct Provisioned {
    pub instance: Instance,
    /// The offer chosen, for the Event: GPU type, price and datacenter preference.
    pub summary: String,
    /// Offers refused before this one (capacity, access), for the Event.
    pub refusals: Vec<String>,
    /// Other instances for the same pod that the cloud showed; to be terminated.
    pub duplicates: Vec<Instance>,
    /// An earlier attempt's outcome was unknown: another instance may appear later.
    pub possibly_duplicated: bool,
}

/// Why nothing was provisioned, classified by what the controller should do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProvisionError {
    /// No offer satisfies the pod: wait and retry (the catalogue changes).
    #[error("{0}")]
    NoCandidates(String),
    /// Every offer was out of capacity: Event `NoGpuCapacity`, retry with backoff.
    #[error("{0}")]
    NoCapacity(String),
    /// The pod itself cannot be run as it is: fail it with this message.
    #[error("{0}")]
    Rejected(String),
    /// The account cannot create anything (key rejected, out of funds): mark the node.
    #[error("{0}")]
    AccountBlocked(String),
    /// The outcome is unknown (an instance may exist); never fail the pod on this.
    #[error("{0}")]
    Unsettled(String),
}

/// A failed call whose effect is known not to have happened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProviderError {
    /// The API key itself is refused (401, 403): a wrong or revoked key.
    #[error("API key refused: {0}")]
    KeyRefused(String),
    /// The account is refused (402, no credit): the node reports it.
    #[error("account refused: {0}")]
    Account(String),
    /// Anything else: the cloud is unreachable, slow or failing.
    #[error("{0}")]
    Unavailable(String),
}

/// How `kubectl logs` wants the log.
#[derive(Debug, Clone, Default)]
pub struct LogOptions {
    pub follow: bool,
    pub tail_lines: Option<u32>,
    pub since: Option<Timestamp>,
    /// The init container whose lines are wanted (`None`: the pod's container).
    pub container: Option<String>,
    /// The pod has init containers (its log has their lines too).
    pub init_containers: bool,
}

/// How far a pod's init containers got, as its cloud container's log says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitProgress {
    /// Each init container that started, in the order they started.
    pub runs: Vec<InitRun>,
    /// All of them are done: the container's own command runs.
    pub initialized: bool,
}

/// One init container's runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InitRun {
    pub name: String,
    /// How often it started (more than once: it failed and was run again).
    pub starts: u32,
    /// The code of its last run that ended.
    pub last_code: Option<i32>,
    /// It runs now.
    pub running: bool,
}

impl InitProgress {
    /// Takes in what a later read said, never going back: a read of the log's tail may have
    /// lost lines an earlier one saw (that they were done, an earlier run).
    pub fn merge(&mut self, newer: InitProgress) {
        self.initialized |= newer.initialized;
        for run in newer.runs {
            let known = self.run(&run.name);
            known.starts = known.starts.max(run.starts);
            if run.last_code.is_some() {
                known.last_code = run.last_code;
            }
            known.running = run.running;
        }
        if self.initialized {
            for run in &mut self.runs {
                run.running = false;
            }
        }
    }

    /// The runs of the init container `name`, added when it has none yet.
    pub fn run(&mut self, name: &str) -> &mut InitRun {
        let at = match self.runs.iter().position(|run| run.name == name) {
            Some(at) => at,
            None => {
                self.runs.push(InitRun {
                    name: name.to_owned(),
                    ..InitRun::default()
                });
                self.runs.len() - 1
            }
        };
        &mut self.runs[at]
    }
}

/// One log line with its timestamp, when the cloud gives one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    pub timestamp: Option<String>,
    pub line: String,
}

/// What is kept of a finished container's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalLog {
    pub exit_code: Option<i32>,
    /// The last lines, bounded by [`FINAL_LOG_BYTES`].
    pub lines: Vec<LogEntry>,
    /// Warnings the cloud's adapter read in the log for the pod's Events, as the kubelet says
    /// them (`FailedPostStartHook`).
    pub warnings: Vec<(&'static str, String)>,
    /// How far the init containers got, and the last lines of each (bounded as `lines`).
    pub init: InitProgress,
    pub init_lines: InitLogs,
}

/// Each init container's kept lines, by name.
pub type InitLogs = Vec<(String, Vec<LogEntry>)>;

/// At most this much of a finished container's log is kept in memory per pod.
pub const FINAL_LOG_BYTES: usize = 32 * 1024;

impl FinalLog {
    /// Keeps the newest lines that fit in [`FINAL_LOG_BYTES`].
    pub fn bounded(exit_code: Option<i32>, mut lines: Vec<LogEntry>) -> FinalLog {
        let mut total = 0usize;
        let keep_from = lines
            .iter()
            .rposition(|entry| {
                total += entry.line.len() + entry.timestamp.as_ref().map_or(0, String::len) + 1;
                total > FINAL_LOG_BYTES
            })
            .map_or(0, |index| index + 1);
        lines.drain(..keep_from);
        FinalLog {
            exit_code,
            lines,
            ..FinalLog::default()
        }
    }
}

pub type LogEntries = Pin<Box<dyn Stream<Item = Result<LogEntry, ProviderError>> + Send>>;

/// What a node publishes for `runpod.io/provider: cheapest`: per canonical GPU, count and
/// class the lowest price inside the installation's placement policy (no price cap: the webhook
/// applies each pod's), and the names of GPUs the cloud sells that the catalogue does not know.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriceSheet {
    pub prices: runpod_contract::gpus::GpuPrices,
    pub unknown_gpus: std::collections::BTreeSet<String>,
    /// When the oldest of these prices was read from the cloud (Unix seconds): what the node
    /// stamps, so that prices a failing refresh keeps go stale.
    pub fetched_at: Option<i64>,
    /// The GPU types (canonical names) each datacenter offers where network volumes can be
    /// mounted; empty for a cloud without them.
    pub volume_gpus: std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
}

impl PriceSheet {
    /// Adds another sheet of the same cloud (a search tier): the lowest prices, every unknown
    /// GPU, the older read time.
    pub fn merge(&mut self, other: PriceSheet) {
        self.prices.merge(other.prices);
        self.unknown_gpus.extend(other.unknown_gpus);
        for (datacenter, gpus) in other.volume_gpus {
            self.volume_gpus.entry(datacenter).or_default().extend(gpus);
        }
        self.fetched_at = match (self.fetched_at, other.fetched_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

/// How a cloud is named to users: in messages, Events, log lines and container ids. Event
/// reasons keep their names (users alert on them); everything a person reads names the cloud
/// the pod really runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloudName {
    /// The provider's name in flags, labels and metrics (`runpod`, `vastai`).
    pub name: &'static str,
    /// The cloud's own name (`RunPod`, `Vast.ai`).
    pub title: &'static str,
    /// What one instance is called there (`RunPod pod`, `Vast.ai instance`).
    pub instance: &'static str,
}

impl CloudName {
    pub const RUNPOD: CloudName = CloudName {
        name: "runpod",
        title: "RunPod",
        instance: "RunPod pod",
    };
    pub const VASTAI: CloudName = CloudName {
        name: "vastai",
        title: "Vast.ai",
        instance: "Vast.ai instance",
    };

    /// The container id the pod status shows, e.g. `vastai://123`.
    pub fn container_id(self, id: &str) -> String {
        format!("{}://{id}", self.name)
    }
}

/// Whether a cloud offers a shell into its containers (exec, port-forward, and what else needs
/// to reach into one): SSH to the container's sshd, authorised by the node's key, which the
/// cloud's creates install once it is given ([`Provider::accept_shell_key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellAccess {
    /// Offered; `opened` says, in the create Event, what a create opens for it, and
    /// `host_key_printed_by` names what prints the container's SSH host key to its log (the
    /// only place the controller learns it from), for the message when none is there yet.
    Offered {
        opened: &'static str,
        host_key_printed_by: &'static str,
    },
    /// Declined, with the reason users read when they try.
    Declined(&'static str),
}

/// Complete lists of a cloud's instances that must all omit an instance before it counts as
/// gone or never made: one or two lists that come back empty or partial (a glitch, a lagging
/// replica of the cloud's database, just after a restart) prove nothing. Counted in lists, not
/// time, so failed lists in an outage never shorten it. The controller's lists and `controller
/// drain` both hold to it.
pub const LISTS_TO_CONFIRM: u32 = 3;

/// A GPU cloud, as the virtual kubelet needs it.
pub trait Provider: Send + Sync + 'static {
    /// Which cloud this is, for names in messages and metrics.
    fn cloud(&self) -> CloudName;

    /// Short name: node label value, metrics label.
    fn name(&self) -> &'static str {
        self.cloud().name
    }

    /// How long the cloud's reads may lag a create: the controller waits at least this long
    /// (beside `--create-settle`) before it takes lists that show nothing as proof that a
    /// recorded create made nothing.
    fn read_lag(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// What an instance is called in Events and messages (`RunPod pod`, `Vast.ai instance`).
    fn instance_noun(&self) -> &'static str {
        self.cloud().instance
    }

    /// Whether this cloud offers a shell into its containers.
    fn shell_access(&self) -> ShellAccess {
        ShellAccess::Declined("this cloud offers no shell into its containers")
    }

    /// Whether a container that sets its command or args gets its `postStart` `exec` hook run
    /// (a cloud whose adapter wraps the command can run it beside the command).
    fn runs_post_start_hooks(&self) -> bool {
        false
    }

    /// The node's public SSH key, which every create from now on installs (clouds that offer a
    /// shell; the others ignore it).
    fn accept_shell_key(&self, _public_key: String) {}

    /// How the internet reaches `port` of an instance, as the create Event tells the user.
    fn endpoint(&self, _instance_id: &str, port: &runpod_contract::PortSpec) -> String {
        format!("{port} on a public IP and port")
    }

    /// The pod annotation that holds the instance id (written by the controller only).
    fn id_annotation(&self) -> &'static str {
        runpod_contract::POD_ID
    }

    /// Every instance of the account in one call. Only a successful answer is a complete list.
    fn list(&self) -> impl Future<Output = Result<Vec<Instance>, ProviderError>> + Send;

    /// One instance by id, asked directly: `None` only when the cloud says it does not exist
    /// (404). A list that omits an instance is no evidence that it is gone; this answer is.
    fn lookup(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<Instance>, ProviderError>> + Send;

    /// Where `pod` may run and what it may cost, from its annotations and the cluster's limits.
    fn constraints(&self, pod: &Pod) -> Result<Constraints, String>;

    /// Creates the one instance of `request.pod`. The caller has established that none exists
    /// (no create was ever recorded, or complete lists taken after the last one settled show
    /// none), so an implementation need not look it up first; it must still settle an
    /// ambiguous create of its own before trying anything else.
    fn provision(
        &self,
        request: ProvisionRequest<'_>,
    ) -> impl Future<Output = Result<Provisioned, ProvisionError>> + Send;

    /// Stops the container (SIGTERM) without releasing the machine. `true` when the provider
    /// accepted the stop (GPU billing ended); `false` when there was nothing it would stop (already
    /// stopped, gone, or refused).
    fn stop(&self, id: &str) -> impl Future<Output = Result<bool, ProviderError>> + Send;

    /// Restarts the container in place (a failed liveness or startup probe). `true` when the
    /// cloud accepted; `false` when it would not (not running, or no such call on this cloud).
    fn restart(&self, _id: &str) -> impl Future<Output = Result<bool, ProviderError>> + Send {
        async { Ok(false) }
    }

    /// How far the pod's init containers got on instance `id`, read while it runs (a cloud
    /// that runs none: nothing).
    fn init_progress(
        &self,
        _id: &str,
    ) -> impl Future<Output = Result<InitProgress, ProviderError>> + Send {
        async { Ok(InitProgress::default()) }
    }

    /// Terminates and releases the instance; an instance already gone counts as done. `ends`
    /// says whether this ends GPU billing, which puts it ahead of other calls when they queue.
    fn terminate(
        &self,
        id: &str,
        ends: Ends,
    ) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// The end of the instance's log, read once after its container ended: the exit code it
    /// reported, and the last lines, kept so `kubectl logs` works after the instance is gone.
    fn final_log(&self, id: &str) -> impl Future<Output = Result<FinalLog, ProviderError>> + Send;

    /// The instance's container log.
    fn logs(&self, id: &str, options: LogOptions) -> LogEntries;

    /// The SHA-256 fingerprints of the SSH host keys the instance's container printed when its
    /// sshd started, read through the cloud's authenticated log API (not from the network, so
    /// an address the cloud gave to someone else cannot answer for the pod); empty when none
    /// were printed. Clouds without SSH into the container have none.
    fn ssh_host_keys(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Vec<String>, ProviderError>> + Send;

    /// The image and environment an instance was made with, to tell whether an instance
    /// without our tags was made for a given pod (the Go kubelet copied both from it); `None`
    /// when the cloud does not say, or the instance is gone.
    fn origin(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Option<InstanceOrigin>, ProviderError>> + Send;

    /// Prices per GPU type from the provider's cached catalogue or last price search; empty
    /// until the first one.
    fn price_sheet(&self) -> PriceSheet;

    /// Whether this cloud sells network volumes (PersistentVolumeClaims of this project's
    /// StorageClass); the volume calls below answer only where it does.
    fn network_volumes(&self) -> bool {
        false
    }

    /// Where a claim's volume goes when its class names no datacenter: one of `wanted` (the
    /// datacenters its first pod allows; empty: any) that the installation allows.
    fn default_volume_datacenter(
        &self,
        _wanted: &[String],
    ) -> impl Future<Output = Option<String>> + Send {
        async { None }
    }

    /// Every network volume of the account.
    fn list_volumes(
        &self,
    ) -> impl Future<Output = Result<Vec<NetworkVolume>, ProviderError>> + Send {
        async { Err(no_volumes()) }
    }

    /// Creates one network volume, once: a lost answer is settled by listing by name.
    fn create_volume(
        &self,
        _request: &VolumeRequest,
    ) -> impl Future<Output = Result<NetworkVolume, ProviderError>> + Send {
        async { Err(no_volumes()) }
    }

    /// Grows a volume to `size_gb` (never shrinks).
    fn resize_volume(
        &self,
        _id: &str,
        _size_gb: u32,
    ) -> impl Future<Output = Result<NetworkVolume, ProviderError>> + Send {
        async { Err(no_volumes()) }
    }

    /// Deletes a volume; `Ok(false)` when it was gone already. Refused while an instance
    /// mounts it.
    fn delete_volume(&self, _id: &str) -> impl Future<Output = Result<bool, ProviderError>> + Send {
        async { Err(no_volumes()) }
    }
}

fn no_volumes() -> ProviderError {
    ProviderError::Unavailable("this cloud sells no network volumes".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_progress_never_goes_back() {
        let mut known = InitProgress::default();
        known.run("fetch").starts = 2;
        known.run("fetch").last_code = Some(0);
        known.initialized = true;
        // A later tail that lost those lines and shows only the last init container running.
        let mut later = InitProgress::default();
        later.run("check").starts = 1;
        later.run("check").running = true;
        later.run("fetch").starts = 1;
        known.merge(later);
        assert!(known.initialized);
        assert_eq!(known.runs[0].starts, 2);
        assert_eq!(known.runs[0].last_code, Some(0));
        assert!(!known.runs[1].running);
    }

    #[test]
    fn a_final_log_keeps_the_newest_lines_within_its_bound() {
        let lines: Vec<LogEntry> = (0..10_000)
            .map(|i| LogEntry {
                timestamp: None,
                line: format!("line {i:05}"),
            })
            .collect();
        let kept = FinalLog::bounded(Some(0), lines);
        let bytes: usize = kept.lines.iter().map(|e| e.line.len() + 1).sum();
        assert!(bytes <= FINAL_LOG_BYTES, "{bytes}");
        assert!(bytes > FINAL_LOG_BYTES - 20, "fills the bound: {bytes}");
        assert_eq!(kept.lines.last().unwrap().line, "line 09999");
        let few = FinalLog::bounded(None, kept.lines[..3].to_vec());
        assert_eq!(few.lines.len(), 3);
    }
}
