//! `runpod-kubelet controller`: flags (with the seed kubelet's names as aliases), the cluster
//! id, the kubelet API's TLS, and the RunPod provider, handed to `controller::run`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use runpod_kubelet::controller::context::Settings;
use runpod_kubelet::controller::leader::{self, ElectionConfig};
use runpod_kubelet::controller::metrics::ControllerMetrics;
use runpod_kubelet::controller::node::NodeConfig;
use runpod_kubelet::controller::node::drain::DrainConfig;
use runpod_kubelet::controller::usage::idle::IdleSettings;
use runpod_kubelet::controller::{self, Runtime, kubelet_api};
use runpod_kubelet::provider::Provider;
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::metrics::RunPodMetrics;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;
use runpod_kubelet::vastai::args::{VastArgs, VastPolicyArgs};
use runpod_kubelet::vastai::provider::VastaiProvider;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

use crate::cmd::flags::{percent, positive_duration, seconds_or_duration};

/// Idle GPUs: when a burst pod's GPUs count as idle (a Warning Event `GpuIdle`, a metric).
#[derive(Debug, Args)]
pub struct IdleGpuArgs {
    /// Utilization, in percent, below which every GPU of a pod must stay to count as idle.
    #[arg(long, default_value_t = 5.0, value_parser = percent, env = "RUNPOD_KUBELET_IDLE_GPU_THRESHOLD")]
    pub idle_gpu_threshold: f64,
    /// How long a pod's GPUs must stay idle before it is reported (bare seconds accepted; `0`
    /// turns the check off).
    #[arg(long, default_value = "30m", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_IDLE_GPU_AFTER")]
    pub idle_gpu_after: Duration,
}

impl IdleGpuArgs {
    pub fn settings(&self) -> IdleSettings {
        IdleSettings {
            threshold: self.idle_gpu_threshold / 100.0,
            after: self.idle_gpu_after,
        }
    }
}

/// A percentage from 0 to 100.
/// `controller` subcommands.
#[derive(Debug, Subcommand)]
pub enum ControllerCommand {
    /// Terminate every RunPod pod of this cluster and node, wait until none bills, and remove
    /// the virtual node (for uninstalling; a running controller is told to create nothing more).
    Drain(DrainArgs),
}

/// The cloud a controller runs its node's pods on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CloudArg {
    Runpod,
    Vastai,
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// Name of the virtual node.
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    /// The cloud of the node (`runpod` or `vastai`).
    #[arg(
        long,
        value_enum,
        default_value = "runpod",
        env = "RUNPOD_KUBELET_PROVIDER"
    )]
    pub provider: CloudArg,
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub vastai: VastArgs,
    /// Tag of this cluster (as given to the controller); default: the UID of kube-system.
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// Give up (exit non-zero, naming what still bills) after this long.
    #[arg(long, default_value = "5m", value_parser = positive_duration, env = "RUNPOD_KUBELET_TIMEOUT")]
    pub timeout: Duration,
    /// Seed compatibility: the kubeconfig (same as KUBECONFIG).
    #[arg(long, env = "RUNPOD_KUBELET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    #[command(subcommand)]
    pub command: Option<ControllerCommand>,
    /// Name of the virtual node (shared with the webhook).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    /// The cloud this node's pods run on: `runpod`, or `vastai` (key from `VAST_API_KEY`).
    #[arg(
        long,
        value_enum,
        default_value = "runpod",
        env = "RUNPOD_KUBELET_PROVIDER"
    )]
    pub provider: CloudArg,
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub vastai: VastArgs,
    #[command(flatten)]
    pub vastai_policy: VastPolicyArgs,
    #[command(flatten)]
    pub idle: IdleGpuArgs,
    /// Datacenters RunPod pods may be placed in (comma-separated); empty allows any.
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
    /// Cap in USD per hour per GPU.
    #[arg(long, default_value_t = 0.5, env = "RUNPOD_KUBELET_MAX_GPU_PRICE")]
    pub max_gpu_price: f64,
    /// Tag of this cluster on every RunPod pod; default: the UID of the kube-system namespace,
    /// so two clusters sharing an account never collect each other's pods.
    #[arg(long, env = "RUNPOD_KUBELET_CLUSTER_ID")]
    pub cluster_id: Option<String>,
    /// How often RunPod's pod list is read (bare seconds accepted, as in the seed).
    #[arg(long, default_value = "10s", value_parser = positive_duration, env = "RUNPOD_KUBELET_RECONCILE_INTERVAL")]
    pub reconcile_interval: Duration,
    /// A pod with no running RunPod pod after this long fails with ProvisioningTimeout.
    #[arg(long, default_value = "15m", value_parser = positive_duration, env = "RUNPOD_KUBELET_PROVISION_TIMEOUT")]
    pub provision_timeout: Duration,
    /// After a create with an unknown outcome, how long RunPod's list must have had to show
    /// the pod before another create is allowed.
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
    /// PEM serving certificate of the kubelet API; default: self-signed in memory.
    #[arg(
        long,
        requires = "kubelet_tls_key",
        env = "RUNPOD_KUBELET_KUBELET_TLS_CERT"
    )]
    pub kubelet_tls_cert: Option<PathBuf>,
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
    /// Pods the node accepts.
    #[arg(long, default_value_t = 100, env = "RUNPOD_KUBELET_MAX_PODS")]
    pub max_pods: u32,
    /// GPUs the node advertises.
    #[arg(long, default_value_t = 64, env = "RUNPOD_KUBELET_MAX_GPUS")]
    pub max_gpus: u32,
    /// Job offloading: how long a `delayed` pod waits for a local GPU, from its creation,
    /// before it moves to the virtual node (a duration, or bare seconds as in the seed; `0`:
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
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    /// How long burst pods tolerate an unreachable or not-ready virtual node.
    #[arg(long, default_value = "1h", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_OUTAGE_GRACE")]
    pub outage_grace: Duration,
    /// Pods reconciled at once (default: `--max-pods`). A reconcile waiting for the RunPod
    /// quota holds its slot, so with fewer slots than pods a deleted pod's stop could wait
    /// behind creates queued for the quota instead of going first.
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
    /// Seed compatibility: the seed's kubeconfig flag (same as KUBECONFIG).
    #[arg(long, env = "RUNPOD_KUBELET_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Seed compatibility: accepted and ignored (pods in every namespace are served).
    #[arg(long, hide = true)]
    pub namespace: Option<String>,
    /// Seed compatibility: accepted and ignored (the node is linux).
    #[arg(long, hide = true)]
    pub os: Option<String>,
    /// Seed compatibility: accepted and ignored (settings come from flags).
    #[arg(long, hide = true)]
    pub provider_config: Option<PathBuf>,
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<(kube::Client, kube::Config)> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?,
    };
    Ok((kube::Client::try_from(config.clone())?, config))
}

fn client_ca(args: &ControllerArgs, config: &kube::Config) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let ders: Vec<CertificateDer<'static>> = match &args.kubelet_client_ca {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<_, _>>()?
        }
        None => {
            let from_file = config
                .root_cert_file
                .as_ref()
                .and_then(|path| std::fs::read(path).ok())
                .map(|pem| {
                    rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<Vec<_>, _>>()
                })
                .transpose()?;
            match from_file {
                Some(certs) => certs,
                None => config
                    .root_cert
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(CertificateDer::from)
                    .collect(),
            }
        }
    };
    for der in ders {
        roots.add(der)?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "no CA for kubelet API clients: pass --kubelet-client-ca (the cluster CA)"
    );
    Ok(roots)
}

fn kubelet_identity(
    args: &ControllerArgs,
    ip: IpAddr,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (cert_pem, key_pem) = match (&args.kubelet_tls_cert, &args.kubelet_tls_key) {
        (Some(cert), Some(key)) => (
            std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
            std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
        ),
        _ => {
            let ca = runpod_certs::CertificateAuthority::generate(
                "runpod-kubelet kubelet API",
                Duration::from_secs(365 * 24 * 3600),
            )?;
            let issued = ca.issue_serving(
                &[args.nodename.as_str()],
                &[ip],
                Duration::from_secs(365 * 24 * 3600),
            )?;
            (issued.cert_pem.into_bytes(), issued.key_pem.into_bytes())
        }
    };
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())?
        .context("the kubelet TLS key file holds no private key")?;
    Ok((certs, key))
}

/// `--cluster-id`, else the UID of the kube-system namespace.
async fn cluster_id(client: &kube::Client, flag: Option<&str>) -> anyhow::Result<String> {
    match flag {
        Some(id) if !id.trim().is_empty() => Ok(id.trim().to_owned()),
        _ => Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
            .context("reading the kube-system namespace for the default --cluster-id")?
            .metadata
            .uid
            .context("kube-system has no uid"),
    }
}

/// The election settings from the flags; `None` with `--leader-elect=false`.
fn election(args: &ControllerArgs, internal_ip: IpAddr) -> anyhow::Result<Option<ElectionConfig>> {
    if !args.leader_elect {
        return Ok(None);
    }
    let host = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "runpod-kubelet".into());
    let namespace = args
        .leader_elect_resource_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "default".into());
    let config = ElectionConfig {
        lease_name: args
            .leader_elect_resource_name
            .clone()
            .filter(|n| !n.trim().is_empty())
            .unwrap_or_else(|| format!("runpod-kubelet-{}", args.nodename)),
        namespace,
        identity: leader::identity(&host, &internal_ip.to_string()),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    config.validate()?;
    Ok(Some(config))
}

/// `controller drain`.
async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    let (client, _) = kube_client(args.kubeconfig.as_ref()).await?;
    let cluster_id = cluster_id(&client, args.cluster_id.as_deref()).await?;
    tracing::info!(node = %args.nodename, cluster_id = %cluster_id, timeout = ?args.timeout, "draining");
    let config = DrainConfig {
        node_name: args.nodename.clone(),
        cluster_id,
        timeout: args.timeout,
        poll_interval: Duration::from_secs(2),
        ack_wait: Duration::from_secs(60),
    };
    let report = match args.provider {
        CloudArg::Runpod => {
            let runpod_client = args
                .runpod
                .client()
                .context("configuring the RunPod client")?;
            let provider = RunPodProvider::new(
                runpod_client,
                CatalogueCache::new(),
                ClusterLimits {
                    max_gpu_price: 0.0,
                    data_center_ids: vec![],
                },
                config.cluster_id.clone(),
                args.nodename.clone(),
            );
            controller::node::drain::drain(client, &provider, &config).await?
        }
        CloudArg::Vastai => {
            let vast_client = args
                .vastai
                .client()
                .context("configuring the Vast.ai client")?;
            let provider = VastaiProvider::new(
                vast_client,
                Default::default(),
                config.cluster_id.clone(),
                args.nodename.clone(),
            );
            controller::node::drain::drain(client, &provider, &config).await?
        }
    };
    tracing::info!(
        terminated = report.terminated.len(),
        pods_removed = report.pods_removed,
        node_removed = report.node_removed,
        foreign_node = report.foreign_node,
        "drained: nothing of this cluster and node bills any more"
    );
    Ok(())
}

pub async fn run(mut args: ControllerArgs) -> anyhow::Result<()> {
    if let Some(ControllerCommand::Drain(drain_args)) = args.command.take() {
        return drain(drain_args).await;
    }
    if args.provider_config.is_some() || args.namespace.is_some() || args.os.is_some() {
        tracing::warn!(
            "--provider-config, --namespace and --os are accepted for compatibility and ignored"
        );
    }
    anyhow::ensure!(
        args.max_gpu_price.is_finite() && args.max_gpu_price > 0.0,
        "--max-gpu-price must be a positive number"
    );
    let (client, config) = kube_client(args.kubeconfig.as_ref()).await?;
    let cluster_id = cluster_id(&client, args.cluster_id.as_deref()).await?;
    let internal_ip = match args.internal_ip {
        Some(ip) => ip,
        None => std::env::var("POD_IP")
            .ok()
            .and_then(|ip| ip.parse().ok())
            .unwrap_or(IpAddr::from([127, 0, 0, 1])),
    };
    let election = election(&args, internal_ip)?;

    let mut registry = prometheus_client::registry::Registry::with_prefix("runpod_kubelet");
    let runpod_metrics = RunPodMetrics::register(&mut registry);
    let metrics = ControllerMetrics::register(&mut registry);
    let mut admission = runpod_webhook::policy::PolicyConfig::from_flags(
        &args.exclude_namespaces,
        &args.datacenter_ids,
        args.max_gpu_price,
        std::env::var("POD_NAMESPACE").ok(),
    );
    admission.vastai = args
        .vastai_policy
        .policy(args.max_gpu_price)
        .map_err(anyhow::Error::msg)?;
    let mut setup = Setup {
        cluster_id,
        internal_ip,
        election,
        registry,
        metrics,
        admission,
    };
    match args.provider {
        CloudArg::Runpod => {
            let runpod_client = args
                .runpod
                .client()
                .context("configuring the RunPod client")?
                .with_metrics(runpod_metrics);
            let catalogue = CatalogueCache::new();
            catalogue.spawn_refresher(runpod_client.clone(), Duration::from_secs(300));
            let limits = ClusterLimits {
                max_gpu_price: args.max_gpu_price,
                data_center_ids: args
                    .datacenter_ids
                    .iter()
                    .map(|d| d.trim().to_owned())
                    .filter(|d| !d.is_empty())
                    .collect(),
            };
            let provider = Arc::new(RunPodProvider::new(
                runpod_client,
                catalogue,
                limits,
                setup.cluster_id.clone(),
                args.nodename.clone(),
            ));
            serve(provider, args, config, client, setup).await
        }
        CloudArg::Vastai => {
            let vast_client = args
                .vastai
                .client()
                .context("configuring the Vast.ai client")?;
            // Every instance's label names the cluster and the node: refuse ids it cannot hold.
            runpod_kubelet::vastai::label::Label::new(&setup.cluster_id, &args.nodename, "pod-uid")
                .map_err(anyhow::Error::msg)
                .context("--cluster-id and --nodename must fit in a Vast.ai label")?;
            // The node's taints and selection are Vast.ai's; RunPod's datacenter list is not
            // this node's policy.
            setup.admission.allowed_datacenters.clear();
            let provider = Arc::new(VastaiProvider::new(
                vast_client,
                setup.admission.vastai.clone(),
                setup.cluster_id.clone(),
                args.nodename.clone(),
            ));
            provider.spawn_price_refresher(Duration::from_secs(300));
            serve(provider, args, config, client, setup).await
        }
    }
}

/// What `run` settles before the provider is chosen.
struct Setup {
    cluster_id: String,
    internal_ip: IpAddr,
    election: Option<ElectionConfig>,
    registry: prometheus_client::registry::Registry,
    metrics: Arc<ControllerMetrics>,
    admission: runpod_webhook::policy::PolicyConfig,
}

/// Binds the listeners and runs the controller with `provider`.
async fn serve<P: Provider>(
    provider: Arc<P>,
    args: ControllerArgs,
    config: kube::Config,
    client: kube::Client,
    setup: Setup,
) -> anyhow::Result<()> {
    let Setup {
        cluster_id,
        internal_ip,
        election,
        registry,
        metrics,
        admission,
    } = setup;
    let (certs, key) = kubelet_identity(&args, internal_ip)?;
    let kubelet_tls = kubelet_api::server_config(certs, key, client_ca(&args, &config)?)?;
    let kubelet_listener = TcpListener::bind(SocketAddr::new(
        IpAddr::from([0, 0, 0, 0]),
        args.kubelet_port,
    ))
    .await
    .with_context(|| format!("binding the kubelet API port {}", args.kubelet_port))?;
    let metrics_listener = match args.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding {addr}"))?,
        ),
        None => None,
    };
    tracing::info!(
        node = %args.nodename,
        cluster_id = %cluster_id,
        provider = provider.name(),
        kubelet_port = args.kubelet_port,
        "controller starting"
    );
    let runtime = Runtime {
        client,
        node: NodeConfig {
            name: args.nodename.clone(),
            provider: provider.name(),
            internal_ip: internal_ip.to_string(),
            kubelet_port: args.kubelet_port,
            max_pods: args.max_pods,
            max_gpus: args.max_gpus,
            cpu: "1000".into(),
            memory: "4Ti".into(),
        },
        settings: Settings {
            node_name: args.nodename.clone(),
            cluster_id,
            host_ip: internal_ip.to_string(),
            reconcile_interval: args.reconcile_interval,
            provision_timeout: args.provision_timeout,
            create_settle: args.create_settle.max(provider.read_lag()),
            outage_grace: args.outage_grace,
            idle: args.idle.settings(),
            admission,
        },
        kubelet_listener,
        kubelet_tls,
        metrics_listener,
        registry,
        metrics,
        offload: runpod_kubelet::controller::offload::plan::OffloadSettings {
            max_pending_time: args.max_pending_time,
            pending_job_threshold: args.pending_job_threshold,
        },
        concurrency: args
            .concurrency
            .unwrap_or_else(|| u16::try_from(args.max_pods).unwrap_or(u16::MAX))
            .max(1),
        election,
    };
    controller::run(provider, runtime, crate::shutdown::signal()).await
}
