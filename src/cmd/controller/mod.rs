//! `runpod-kubelet controller`: flags (with the seed kubelet's names as aliases), the cluster
//! id, the kubelet API's TLS, and the RunPod provider, handed to `controller::run`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use runpod_kubelet::controller::context::Settings;
use runpod_kubelet::controller::kubelet_api::exec::ExecAccess;
use runpod_kubelet::controller::kubelet_api::exec::ssh::HostKeys;
use runpod_kubelet::controller::leader::{self, ElectionConfig};
use runpod_kubelet::controller::metrics::ControllerMetrics;
use runpod_kubelet::controller::node::NodeConfig;
use runpod_kubelet::controller::node::ssh_key;
use runpod_kubelet::controller::{self, Runtime};
use runpod_kubelet::provider::CloudName;
use runpod_kubelet::provider::metrics::CloudApiMetrics;
use runpod_kubelet::provider::{Provider, ShellAccess};
use runpod_kubelet::runpod::metrics::RunPodMetrics;
use runpod_kubelet::runpod::select::ClusterLimits;
use tokio::net::TcpListener;

pub(crate) mod args;
mod check_key;
mod clouds;
mod drain;
mod kube_http;
mod kubelet_tls;

use args::{ControllerArgs, ControllerCommand};
use clouds::{Owner, Serving, WithProvider};

pub(crate) async fn kube_client(
    kubeconfig: Option<&PathBuf>,
) -> anyhow::Result<(kube::Client, kube::Config)> {
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
    let mut config = config;
    // HTTPS_PROXY is set for the cloud clients (chart: cloud.proxy); the apiserver is always
    // reached directly, whether or not NO_PROXY names it. A proxy-url the kubeconfig itself
    // gives is kept.
    if config.proxy_url.is_some() && config.proxy_url == env_proxy() {
        config.proxy_url = None;
    }
    Ok((kube_http::client(config.clone())?, config))
}

/// The proxy the environment names for HTTPS, as the Kubernetes client would read it.
fn env_proxy() -> Option<http::Uri> {
    ["HTTPS_PROXY", "https_proxy"]
        .into_iter()
        .find_map(|name| std::env::var(name).ok())
        .filter(|value| !value.trim().is_empty())
        .and_then(|value| value.trim().parse().ok())
}

/// `--cluster-id`, else the UID of the kube-system namespace.
pub(super) async fn cluster_id(
    client: &kube::Client,
    flag: Option<&str>,
) -> anyhow::Result<String> {
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

pub(crate) async fn run(mut args: ControllerArgs) -> anyhow::Result<()> {
    match args.command.take() {
        Some(ControllerCommand::Drain(drain_args)) => return drain::run(drain_args).await,
        Some(ControllerCommand::CheckKey(check_args)) => return check_key::run(check_args).await,
        None => {}
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
    let cloud_api = CloudApiMetrics::register(&mut registry);
    let runpod_metrics = RunPodMetrics::register(
        &mut registry,
        cloud_api.for_provider(CloudName::RUNPOD.name),
    );
    let metrics = ControllerMetrics::register(&mut registry);
    let admission = args.cloud.node_admission(admission_policy(&args)?);
    let setup = Setup {
        cluster_id,
        internal_ip,
        election,
        registry,
        metrics,
        admission,
        exec: ExecAccess::Off,
    };
    let serving = Serving {
        runpod_metrics,
        cloud_api,
        limits: ClusterLimits {
            max_gpu_price: args.max_gpu_price,
            data_center_ids: trimmed(&args.datacenter_ids),
            cloud_types: args.allowed_cloud_types.clone(),
        },
        vastai: setup.admission.vastai.clone(),
    };
    let (cluster_id, node) = (setup.cluster_id.clone(), args.nodename.clone());
    let owner = Owner {
        cluster_id: &cluster_id,
        node: &node,
    };
    let cloud = args.cloud.clone();
    let job = Serve {
        args,
        config,
        client,
        setup,
    };
    cloud.provide(owner, Some(serving), job).await
}

/// The admission rules the controller repeats (a pod that reached the node without the
/// webhook is held to them too), from the same flags as the webhook's.
fn admission_policy(args: &ControllerArgs) -> anyhow::Result<runpod_webhook::policy::PolicyConfig> {
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
    admission.allowed_cloud_types = args.allowed_cloud_types.clone();
    admission.expose_no_ports = args.expose_ports == runpod_kubelet::flags::ExposePorts::None;
    admission.accept_seed_tolerations = args.accept_seed_tolerations;
    admission.default_budget = args.default_budget_per_hour;
    (admission.namespace_nodes, admission.node_clouds) =
        runpod_contract::teams::parse_assignments(&args.namespace_nodes)
            .map_err(|problem| anyhow::anyhow!("--namespace-nodes: {problem}"))?;
    Ok(admission)
}

/// A serving node: SSH for exec where its cloud offers it, then the controller.
struct Serve {
    args: ControllerArgs,
    config: kube::Config,
    client: kube::Client,
    setup: Setup,
}

impl WithProvider for Serve {
    type Output = ();
    async fn with<P: Provider>(self, provider: Arc<P>) -> anyhow::Result<()> {
        let Serve {
            args,
            config,
            client,
            mut setup,
        } = self;
        setup.exec = shell(&args, &client, &*provider).await;
        serve(provider, args, config, client, setup).await
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
    exec: ExecAccess,
}

/// Exec over SSH, where the node's cloud offers a shell: the node's key from its Secret (made
/// if absent), whose public half the provider installs on every create. A key that cannot be
/// had leaves exec unavailable (saying why) rather than stopping the controller.
async fn shell(
    args: &ControllerArgs,
    client: &kube::Client,
    provider: &impl Provider,
) -> ExecAccess {
    if !args.exec_ssh {
        return ExecAccess::Off;
    }
    if let ShellAccess::Declined(reason) = provider.shell_access() {
        return ExecAccess::Unsupported(reason.to_owned());
    }
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    let name = args
        .ssh_key_secret
        .clone()
        .unwrap_or_else(|| ssh_key::secret_name(&args.nodename));
    // A passing apiserver hiccup at start-up must not leave every pod of this run without SSH.
    let mut outcome = ssh_key::ensure(client, &namespace, &name, &args.nodename).await;
    for delay in [2, 5, 10] {
        if outcome.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(delay)).await;
        outcome = ssh_key::ensure(client, &namespace, &name, &args.nodename).await;
    }
    match outcome {
        Ok(key) => {
            provider.accept_shell_key(key.public_openssh());
            ExecAccess::Ready {
                key,
                host_keys: HostKeys::default(),
            }
        }
        Err(reason) => {
            tracing::error!(%reason, "no SSH key for exec and port-forward; pods are created without SSH");
            ExecAccess::Unavailable(reason)
        }
    }
}

/// The non-empty values of a list flag, trimmed.
fn trimmed(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
        .collect()
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
        exec,
    } = setup;
    let kubelet_tls = kubelet_tls::server(&args, &config, &client, internal_ip)?;
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
    // The namespaces this node serves: published on the node and judged by its controller.
    let serve_namespaces = trimmed(&args.serve_namespaces);
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
            serves: serve_namespaces.clone(),
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
            key_source: args.cloud.key_source(),
            adoption_namespace: args::adoption_namespace(args.adoption_namespace.as_deref()),
            ledger_namespace: args::adoption_namespace(None),
            serve_namespaces,
            exec,
            owner_deployment: args.owner_deployment.clone(),
            drain_timeout: args.drain_timeout,
            network: runpod_kubelet::controller::network::NetworkSettings {
                enabled: args.cluster_network,
                allowed: args.cluster_services_allowed.clone(),
                cluster_domain: args.cluster_domain.trim().trim_matches('.').to_owned(),
            },
        },
        kubelet_listener,
        kubelet_tls,
        metrics_listener,
        plain_metrics: args.metrics_plain,
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
