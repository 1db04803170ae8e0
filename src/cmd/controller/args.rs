//! The controller's flags (with the Go kubelet's names as aliases); each also reads
//! `RUNPOD_KUBELET_<FLAG>` from the environment.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use runpod_kubelet::controller::usage::idle::IdleSettings;
use runpod_kubelet::vastai::args::VastPolicyArgs;

use super::clouds::CloudFlags;

use runpod_kubelet::flags::{percent, positive_duration, seconds_or_duration};

/// Idle GPUs: when a burst pod's GPUs count as idle (a Warning Event `GpuIdle`, a metric).
#[derive(Debug, Args)]
pub(crate) struct IdleGpuArgs {
    /// Utilization, in percent, below which every GPU of a pod must stay to count as idle.
    #[arg(long, default_value_t = 5.0, value_parser = percent, env = "RUNPOD_KUBELET_IDLE_GPU_THRESHOLD")]
    pub idle_gpu_threshold: f64,
    /// How long a pod's GPUs must stay idle before it is reported (bare seconds accepted; `0`
    /// turns the check off).
    #[arg(long, default_value = "30m", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_IDLE_GPU_AFTER")]
    pub idle_gpu_after: Duration,
}

impl IdleGpuArgs {
    pub(crate) fn settings(&self) -> IdleSettings {
        IdleSettings {
            threshold: self.idle_gpu_threshold / 100.0,
            after: self.idle_gpu_after,
        }
    }
}

/// `controller` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum ControllerCommand {
    /// Terminate every RunPod pod of this cluster and node, wait until none bills, and remove
    /// the virtual node (for uninstalling; a running controller is told to create nothing more).
    Drain(DrainArgs),
    /// Ask the cloud once whether it accepts the node's API key; exit non-zero, naming where
    /// the key comes from, if it refuses it (the chart's pre-install hook). Needs no cluster.
    CheckKey(CheckKeyArgs),
}

#[derive(Debug, Args)]
pub(crate) struct CheckKeyArgs {
    /// Name of the virtual node (for messages).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    #[command(flatten)]
    pub cloud: CloudFlags,
    /// The node's cluster id; taken (and unused) so the node's flags can be passed as they are.
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
    /// Name of the virtual node.
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    #[command(flatten)]
    pub cloud: CloudFlags,
    /// Tag of this cluster (as given to the controller); default: the UID of kube-system.
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Give up (exit non-zero, naming what still bills) after this long.
    #[arg(long, default_value = "5m", value_parser = positive_duration, env = "RUNPOD_KUBELET_TIMEOUT")]
    pub timeout: Duration,
    /// As the controller's: a create whose answer was lost may be missing from lists this long,
    /// so when the node's pods record a create whose instance no list shows, lists count as
    /// showing nothing only from this long after the drain began (on Vast.ai at least
    /// `--vastai-read-lag`).
    #[arg(long, default_value = "30s", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_CREATE_SETTLE")]
    pub create_settle: Duration,
    /// The kubeconfig (same as KUBECONFIG; the Go kubelet's flag).
    #[arg(long, env = "RUNPOD_KUBELET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of `runpod-kubelet adopt`'s record (adopted instances are drained too);
    /// default: the controller's own (`POD_NAMESPACE`).
    #[arg(long, env = "RUNPOD_KUBELET_ADOPTION_NAMESPACE")]
    pub adoption_namespace: Option<String>,
    /// The node's controller Deployment (`NAMESPACE/NAME`): once drained, its
    /// `runpod.io/drain` finalizer is released so its deletion goes on at once.
    #[arg(long, value_parser = runpod_kubelet::controller::node::removal::OwnerDeployment::parse, env = "RUNPOD_KUBELET_OWNER_DEPLOYMENT")]
    pub owner_deployment: Option<runpod_kubelet::controller::node::removal::OwnerDeployment>,
}

/// The namespace of the adoption record: the flag, else the controller's own (`POD_NAMESPACE`),
/// else `default`.
pub(crate) fn adoption_namespace(flag: Option<&str>) -> String {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .map(|ns| ns.trim().to_owned())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

#[derive(Debug, Args)]
pub(crate) struct ControllerArgs {
    #[command(subcommand)]
    pub command: Option<ControllerCommand>,
    /// Name of the virtual node (shared with the webhook).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    #[command(flatten)]
    pub cloud: CloudFlags,
    #[command(flatten)]
    pub vastai_policy: VastPolicyArgs,
    #[command(flatten)]
    pub idle: IdleGpuArgs,
    /// Datacenters RunPod pods may be placed in (comma-separated); empty allows any.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
    /// RunPod cloud tiers pods may run in (comma-separated `SECURE`, `COMMUNITY`). `COMMUNITY`
    /// hosts are third parties that receive the pod's Secret env and registry login, so a pod
    /// asking for it is refused unless it is listed here.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "SECURE", value_parser = runpod_kubelet::flags::cloud_type, env = "RUNPOD_KUBELET_ALLOWED_CLOUD_TYPES")]
    pub allowed_cloud_types: Vec<runpod_contract::CloudType>,
    /// Cap in USD per hour per GPU.
    #[arg(long, default_value_t = 0.5, env = "RUNPOD_KUBELET_MAX_GPU_PRICE")]
    pub max_gpu_price: f64,
    /// Budget in USD per hour of a namespace without `runpod.io/budget-per-hour` (its burst pods
    /// on every node and cloud together); default: none.
    #[arg(long, value_parser = runpod_contract::budget::parse_budget, env = "RUNPOD_KUBELET_DEFAULT_BUDGET_PER_HOUR")]
    pub default_budget_per_hour: Option<f64>,
    /// The namespaces this node serves (comma-separated; the chart's `nodes[].namespaces`):
    /// pods of any other namespace are refused (`WrongNode`), whatever their namespace's
    /// `runpod.io/node` label says (a label only narrows). Empty: namespaces no node lists.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_SERVE_NAMESPACES")]
    pub serve_namespaces: Vec<String>,
    /// The installation's node bindings, `NAMESPACE=NODE@CLOUD` comma-separated (the chart passes every
    /// node's `namespaces`): a namespace listed for another node is refused here even while that
    /// node is not registered.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_NAMESPACE_NODES")]
    pub namespace_nodes: Vec<String>,
    /// What a pod without `runpod.io/ports` exposes: `auto`, its declared container ports (as
    /// public endpoints of the cloud), or `none`. Give the webhook the same.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "RUNPOD_KUBELET_EXPOSE_PORTS"
    )]
    pub expose_ports: runpod_kubelet::flags::ExposePorts,
    /// Migration from the Go kubelet: a pod that tolerates `virtual-kubelet.io/provider=runpod`
    /// by key itself (its manifests unchanged) counts as opted in, without any label.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "RUNPOD_KUBELET_ACCEPT_SEED_TOLERATIONS")]
    pub accept_seed_tolerations: bool,
    /// Namespace of `runpod-kubelet adopt`'s record of taken-over instances (a ConfigMap
    /// `runpod-kubelet-adopted-<node>`); default: the controller's own namespace.
    #[arg(long, env = "RUNPOD_KUBELET_ADOPTION_NAMESPACE")]
    pub adoption_namespace: Option<String>,
    /// Tag of this cluster on every RunPod pod; default: the UID of the kube-system namespace,
    /// so two clusters sharing an account never collect each other's pods.
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// How often RunPod's pod list is read (bare seconds accepted, as the Go kubelet took it).
    #[arg(long, default_value = "10s", value_parser = positive_duration, env = "RUNPOD_KUBELET_RECONCILE_INTERVAL")]
    pub reconcile_interval: Duration,
    /// A pod with no running RunPod pod after this long fails with ProvisioningTimeout.
    #[arg(long, default_value = "15m", value_parser = positive_duration, env = "RUNPOD_KUBELET_PROVISION_TIMEOUT")]
    pub provision_timeout: Duration,
    /// After a create with an unknown outcome, how long RunPod's list must have had to show
    /// the pod before another create is allowed: three lists in a row, the first taken at
    /// least this long after the create, must all omit it.
    #[arg(long, default_value = "30s", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_CREATE_SETTLE")]
    pub create_settle: Duration,
    /// Port of the kubelet API (logs).
    #[arg(
        long,
        alias = "listen-port",
        default_value_t = 10250,
        env = "RUNPOD_KUBELET_KUBELET_PORT"
    )]
    pub kubelet_port: u16,
    /// Address the node advertises (the apiserver dials it for logs); default `POD_IP`, else
    /// 127.0.0.1.
    #[arg(long, env = "RUNPOD_KUBELET_INTERNAL_IP")]
    pub internal_ip: Option<IpAddr>,
    /// Request the kubelet API's serving certificate from the cluster (a
    /// `kubernetes.io/kubelet-serving` CertificateSigningRequest, which the cluster must
    /// approve), and again before it expires; self-signed until then. For apiservers that verify
    /// kubelet certificates (`--kubelet-certificate-authority`).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", conflicts_with = "kubelet_tls_cert", env = "RUNPOD_KUBELET_KUBELET_TLS_CSR")]
    pub kubelet_tls_csr: bool,
    /// With `--kubelet-tls-csr`: approve this node's own request (one fixed name per node,
    /// `<node>-serving-runpod-kubelet`), for clusters without an approver that accepts it.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", requires = "kubelet_tls_csr", env = "RUNPOD_KUBELET_KUBELET_TLS_APPROVE")]
    pub kubelet_tls_approve: bool,
    /// The Deployment that runs this controller (`NAMESPACE/NAME`; the chart sets it): when it
    /// is deleted while it carries the finalizer `runpod.io/drain`, the leader drains the node
    /// and then releases it, so no removal leaves anything billing.
    #[arg(long, value_parser = runpod_kubelet::controller::node::removal::OwnerDeployment::parse, env = "RUNPOD_KUBELET_OWNER_DEPLOYMENT")]
    pub owner_deployment: Option<runpod_kubelet::controller::node::removal::OwnerDeployment>,
    /// With `--owner-deployment`: how long one drain before the Deployment's release may take
    /// (a drain that runs out is tried again; nothing is released while anything may bill).
    #[arg(long, default_value = "10m", value_parser = positive_duration, env = "RUNPOD_KUBELET_DRAIN_TIMEOUT")]
    pub drain_timeout: std::time::Duration,
    /// With `--kubelet-tls-csr`: keep the issued certificate and key in this Secret
    /// (`NAMESPACE/NAME`, type kubernetes.io/tls) and serve them again after a restart.
    #[arg(long, value_parser = runpod_kubelet::controller::kubelet_api::serving::Kept::parse, requires = "kubelet_tls_csr", env = "RUNPOD_KUBELET_KUBELET_TLS_SECRET")]
    pub kubelet_tls_secret: Option<runpod_kubelet::controller::kubelet_api::serving::Kept>,
    /// PEM serving certificate of the kubelet API; default: self-signed in memory.
    #[arg(
        long,
        requires = "kubelet_tls_key",
        env = "RUNPOD_KUBELET_KUBELET_TLS_CERT"
    )]
    pub kubelet_tls_cert: Option<PathBuf>,
    /// PEM private key of `--kubelet-tls-cert`.
    #[arg(
        long,
        requires = "kubelet_tls_cert",
        env = "RUNPOD_KUBELET_KUBELET_TLS_KEY"
    )]
    pub kubelet_tls_key: Option<PathBuf>,
    /// CA that kubelet API callers' client certificates must chain to; default: the cluster CA.
    #[arg(long, env = "RUNPOD_KUBELET_KUBELET_CLIENT_CA")]
    pub kubelet_client_ca: Option<PathBuf>,
    /// Plain-HTTP address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        alias = "health-server-address",
        env = "RUNPOD_KUBELET_METRICS_LISTEN"
    )]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve `/metrics` on `--metrics-listen` too (plain HTTP, unauthenticated). It is always
    /// on the kubelet port, over TLS, for callers allowed `get nodes/metrics`; `false` keeps
    /// the plain listener to `/healthz` and `/readyz`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", env = "RUNPOD_KUBELET_METRICS_PLAIN")]
    pub metrics_plain: bool,
    /// Pods the node accepts.
    #[arg(long, default_value_t = 100, env = "RUNPOD_KUBELET_MAX_PODS")]
    pub max_pods: u32,
    /// GPUs the node advertises.
    #[arg(long, default_value_t = 64, env = "RUNPOD_KUBELET_MAX_GPUS")]
    pub max_gpus: u32,
    /// Job offloading: how long a `delayed` pod waits for a local GPU, from its creation,
    /// before it moves to the virtual node (a duration, or bare seconds as the Go job controller took it; `0`:
    /// as soon as the scheduler finds no local node). `runpod.io/max-pending-time` overrides.
    #[arg(long, default_value = "0", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_MAX_PENDING_TIME")]
    pub max_pending_time: Duration,
    /// Job offloading: how many `delayed` pods may wait for a local GPU at once; the
    /// longest-waiting ones above it move to the virtual node.
    #[arg(
        long,
        default_value_t = 1,
        env = "RUNPOD_KUBELET_PENDING_JOB_THRESHOLD"
    )]
    pub pending_job_threshold: usize,
    /// More namespaces whose pods are never run (comma-separated), as the webhook's flag;
    /// `kube-system` and the controller's own namespace (`POD_NAMESPACE`) always are.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    /// How long burst pods tolerate an unreachable or not-ready virtual node.
    #[arg(long, default_value = "1h", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_OUTAGE_GRACE")]
    pub outage_grace: Duration,
    /// Pods reconciled at once (default: `--max-pods`). The calls that end a deleted pod's GPU
    /// billing do not use these slots: they are sent at once, whatever the workers wait for.
    #[arg(long, env = "RUNPOD_KUBELET_CONCURRENCY")]
    pub concurrency: Option<u16>,
    /// Elect one leader among the replicas (Lease); `--leader-elect=false` for a single local
    /// run.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        env = "RUNPOD_KUBELET_LEADER_ELECT"
    )]
    pub leader_elect: bool,
    /// How long a leader's lease lasts without renewal (a standby takes over after it).
    #[arg(long, default_value = "15s", value_parser = positive_duration, env = "RUNPOD_KUBELET_LEADER_ELECT_LEASE_DURATION")]
    pub leader_elect_lease_duration: Duration,
    /// A leader that has not renewed for this long stops all work and exits.
    #[arg(long, default_value = "10s", value_parser = positive_duration, env = "RUNPOD_KUBELET_LEADER_ELECT_RENEW_DEADLINE")]
    pub leader_elect_renew_deadline: Duration,
    /// How often the lease is renewed or tried.
    #[arg(long, default_value = "2s", value_parser = positive_duration, env = "RUNPOD_KUBELET_LEADER_ELECT_RETRY_PERIOD")]
    pub leader_elect_retry_period: Duration,
    /// Name of the election Lease; default `runpod-kubelet-<nodename>`.
    #[arg(long, env = "RUNPOD_KUBELET_LEADER_ELECT_RESOURCE_NAME")]
    pub leader_elect_resource_name: Option<String>,
    /// Namespace of the election Lease; default `POD_NAMESPACE`, else `default`.
    #[arg(long, env = "RUNPOD_KUBELET_LEADER_ELECT_RESOURCE_NAMESPACE")]
    pub leader_elect_resource_namespace: Option<String>,
    /// `kubectl exec` and `kubectl port-forward` into RunPod pods over SSH: every pod gets the
    /// node's public key (`PUBLIC_KEY`) and port 22/tcp at create. `false`: no key sent, no
    /// port opened, exec and port-forward answer 501.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        env = "RUNPOD_KUBELET_EXEC_SSH"
    )]
    pub exec_ssh: bool,
    /// Burst pods reach the cluster's Services by name (outbound, over the SSH connection exec
    /// uses): the Services of the pod's own namespace, and what its namespace's
    /// `runpod.io/cluster-services` asks for within `--cluster-services-allowed`. Needs
    /// `--exec-ssh`.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        env = "RUNPOD_KUBELET_CLUSTER_NETWORK"
    )]
    pub cluster_network: bool,
    /// Services beyond a pod's own namespace that a namespace's `runpod.io/cluster-services` may
    /// ask for (comma-separated `NS/NAME`, `NS/*`, or `*/*`); default: none. The apiserver is
    /// never reachable.
    #[arg(long, value_parser = selectors, default_value = "", env = "RUNPOD_KUBELET_CLUSTER_SERVICES_ALLOWED")]
    pub cluster_services_allowed: std::vec::Vec<runpod_contract::network::Selector>,
    /// The cluster's DNS domain, for the `NAME.NS.svc.DOMAIN` names burst pods resolve.
    #[arg(
        long,
        default_value = "cluster.local",
        value_parser = runpod_contract::network::parse_cluster_domain,
        env = "RUNPOD_KUBELET_CLUSTER_DOMAIN"
    )]
    pub cluster_domain: String,
    /// The Secret (in the controller's namespace) holding the node's SSH key pair, made if
    /// absent; default `<nodename>-ssh`.
    #[arg(long, env = "RUNPOD_KUBELET_SSH_KEY_SECRET")]
    pub ssh_key_secret: Option<String>,
    /// The kubeconfig (same as KUBECONFIG; the Go kubelet's flag).
    #[arg(long, env = "RUNPOD_KUBELET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The Go kubelet's flag: accepted and ignored (pods in every namespace are served).
    #[arg(long, hide = true)]
    pub namespace: Option<String>,
    /// The Go kubelet's flag: accepted and ignored (the node is linux).
    #[arg(long, hide = true)]
    pub os: Option<String>,
    /// The Go kubelet's flag: accepted and ignored (settings come from flags).
    #[arg(long, hide = true)]
    pub provider_config: Option<PathBuf>,
}

/// `--cluster-services-allowed`: one comma-separated list.
fn selectors(value: &str) -> Result<Vec<runpod_contract::network::Selector>, String> {
    runpod_contract::network::parse_selectors(value)
}
