//! `runpod-kubelet controller`: flags (with the seed kubelet's names as aliases), the cluster
//! id, the kubelet API's TLS, and the RunPod provider, handed to `controller::run`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use runpod_kubelet::controller::context::Settings;
use runpod_kubelet::controller::metrics::ControllerMetrics;
use runpod_kubelet::controller::node::NodeConfig;
use runpod_kubelet::controller::runpod_provider::RunPodProvider;
use runpod_kubelet::controller::{self, Runtime, kubelet_api};
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::metrics::RunPodMetrics;
use runpod_kubelet::runpod::select::ClusterLimits;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;

/// `--reconcile-interval 30` (the seed's bare seconds) or `10s`.
pub fn seconds_or_duration(value: &str) -> Result<Duration, String> {
    if let Ok(seconds) = value.trim().parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    humantime::parse_duration(value).map_err(|e| format!("{value:?}: {e}"))
}

fn positive_duration(value: &str) -> Result<Duration, String> {
    let duration = seconds_or_duration(value)?;
    if duration.is_zero() {
        return Err(format!("{value:?} must be longer than zero"));
    }
    Ok(duration)
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Name of the virtual node (shared with the webhook).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    #[command(flatten)]
    pub runpod: RunPodArgs,
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
    /// How long burst pods tolerate an unreachable or not-ready virtual node.
    #[arg(long, default_value = "1h", value_parser = seconds_or_duration, env = "RUNPOD_KUBELET_OUTAGE_GRACE")]
    pub outage_grace: Duration,
    /// Pods reconciled at once.
    #[arg(long, default_value_t = 16, env = "RUNPOD_KUBELET_CONCURRENCY")]
    pub concurrency: u16,
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

async fn kube_client(args: &ControllerArgs) -> anyhow::Result<(kube::Client, kube::Config)> {
    let config = match &args.kubeconfig {
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

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    if args.provider_config.is_some() || args.namespace.is_some() || args.os.is_some() {
        tracing::warn!(
            "--provider-config, --namespace and --os are accepted for compatibility and ignored"
        );
    }
    anyhow::ensure!(
        args.max_gpu_price.is_finite() && args.max_gpu_price > 0.0,
        "--max-gpu-price must be a positive number"
    );
    let (client, config) = kube_client(&args).await?;
    let cluster_id = match &args.cluster_id {
        Some(id) if !id.trim().is_empty() => id.trim().to_owned(),
        _ => Api::<Namespace>::all(client.clone())
            .get("kube-system")
            .await
            .context("reading the kube-system namespace for the default --cluster-id")?
            .metadata
            .uid
            .context("kube-system has no uid")?,
    };
    let internal_ip = match args.internal_ip {
        Some(ip) => ip,
        None => std::env::var("POD_IP")
            .ok()
            .and_then(|ip| ip.parse().ok())
            .unwrap_or(IpAddr::from([127, 0, 0, 1])),
    };

    let mut registry = prometheus_client::registry::Registry::with_prefix("runpod_kubelet");
    let runpod_metrics = RunPodMetrics::register(&mut registry);
    let metrics = ControllerMetrics::register(&mut registry);
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
        cluster_id.clone(),
        args.nodename.clone(),
    ));

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
        runpod_api = %args.runpod.runpod_api_url,
        kubelet_port = args.kubelet_port,
        "controller starting"
    );
    let runtime = Runtime {
        client,
        node: NodeConfig {
            name: args.nodename.clone(),
            provider: "runpod",
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
            create_settle: args.create_settle,
            outage_grace: args.outage_grace,
        },
        kubelet_listener,
        kubelet_tls,
        metrics_listener,
        registry,
        metrics,
        concurrency: args.concurrency.max(1),
    };
    controller::run(provider, runtime, crate::shutdown::signal()).await
}
