//! `runpod-kubelet webhook`: wires flags, the cluster caches, certificate reload and the server.

use std::sync::Arc;

use anyhow::Context as _;
use runpod_certs::{ReloadingCertResolver, server_config};
use runpod_webhook::cluster::KubeCluster;
use runpod_webhook::policy::PolicyConfig;
use runpod_webhook::serve::{ServeOptions, serve_tls};
use runpod_webhook::server::AppState;
use tokio::net::TcpListener;

use crate::supervise::Supervisor;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use runpod_kubelet::flags::{positive_duration, positive_price};

#[derive(Debug, Args)]
pub(crate) struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443", env = "RUNPOD_KUBELET_LISTEN")]
    pub listen: SocketAddr,
    /// PEM serving certificate (chain); re-read when it changes.
    #[arg(long, env = "RUNPOD_KUBELET_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM private key of the serving certificate; re-read when it changes.
    #[arg(long, env = "RUNPOD_KUBELET_TLS_KEY")]
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for a rotation.
    #[arg(long, default_value = "10s", value_parser = positive_duration, env = "RUNPOD_KUBELET_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Duration,
    /// Datacenters pods may ask for (comma-separated); empty allows any.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
    /// RunPod cloud tiers pods may run in (comma-separated `SECURE`, `COMMUNITY`). `COMMUNITY`
    /// hosts are third parties that receive the pod's Secret env and registry login, so a pod
    /// asking for it is refused unless it is listed here.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "SECURE", value_parser = runpod_kubelet::flags::cloud_type, env = "RUNPOD_KUBELET_ALLOWED_CLOUD_TYPES")]
    pub allowed_cloud_types: Vec<runpod_contract::CloudType>,
    /// Cap in USD per hour per GPU; a pod's `runpod.io/max-price` may not exceed it × GPU count.
    #[arg(long, default_value_t = 0.5, value_parser = positive_price, env = "RUNPOD_KUBELET_MAX_GPU_PRICE")]
    pub max_gpu_price: f64,
    /// Name of the virtual node (shared with the controller).
    #[arg(
        long,
        default_value = "virtual-runpod",
        env = "RUNPOD_KUBELET_NODENAME"
    )]
    pub nodename: String,
    /// More namespaces whose pods are never touched (comma-separated); `kube-system` and the
    /// webhook's own namespace (`POD_NAMESPACE`) always are.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    #[command(flatten)]
    pub vastai_policy: runpod_kubelet::vastai::args::VastPolicyArgs,
    /// The clouds this installation runs a virtual node for (comma-separated): a pod asking for
    /// another is refused at admission, and a pod naming none goes to the first of RunPod,
    /// Vast.ai listed (`--clouds vastai`: a Vast.ai-only install).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, default_value = "runpod,vastai", value_parser = parse_cloud, env = "RUNPOD_KUBELET_CLOUDS")]
    pub clouds: Vec<runpod_contract::provider::Cloud>,
    /// What a pod that names no `runpod.io/ports` (nor its Job or namespace) exposes: `auto`,
    /// its declared container ports, or `none`.
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
    /// After SIGTERM, how long to keep answering reviews (with /readyz failing) before closing,
    /// so that endpoints stop routing here first.
    #[arg(long, default_value = "10s", value_parser = runpod_kubelet::flags::seconds_or_duration, env = "RUNPOD_KUBELET_SHUTDOWN_DRAIN")]
    pub shutdown_drain: Duration,
    /// A connection (HTTP/1.1 or h2) with no review in flight for this long is closed.
    #[arg(long, default_value = "60s", value_parser = positive_duration, env = "RUNPOD_KUBELET_IDLE_TIMEOUT")]
    pub idle_timeout: Duration,
    /// Most connections served at once; further clients wait until one closes.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..), env = "RUNPOD_KUBELET_MAX_CONNECTIONS")]
    pub max_connections: u32,
    /// Most reviews in flight at once on one h2 connection.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..), env = "RUNPOD_KUBELET_MAX_CONCURRENT_STREAMS")]
    pub max_concurrent_streams: u32,
    /// Budget in USD per hour of a namespace without `runpod.io/budget-per-hour` (give the
    /// controllers the same); default: none.
    #[arg(long, value_parser = runpod_contract::budget::parse_budget, env = "RUNPOD_KUBELET_DEFAULT_BUDGET_PER_HOUR")]
    pub default_budget_per_hour: Option<f64>,
    /// The installation's node bindings, `NAMESPACE=NODE@CLOUD` comma-separated (the chart passes every
    /// node's `namespaces`); the nodes' own `runpod.io/serves-namespaces` come first.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_NAMESPACE_NODES")]
    pub namespace_nodes: Vec<String>,
}

pub(crate) async fn run(args: WebhookArgs) -> anyhow::Result<()> {
    let policy = policy_config(&args, std::env::var("POD_NAMESPACE").ok())?;
    let resolver = Arc::new(
        ReloadingCertResolver::load(&args.tls_cert, &args.tls_key)
            .context("loading the serving certificate")?,
    );
    let tls = Arc::new(server_config(resolver.clone())?);
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    let mut supervisor = Supervisor::default();
    let (cluster, cache_tasks) = KubeCluster::start(client);
    // The budget ledgers live in the release's namespace, where the controllers run.
    let cluster = cluster.with_ledger_namespace(
        std::env::var("POD_NAMESPACE")
            .ok()
            .map(|ns| ns.trim().to_owned())
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| "default".to_owned()),
    );
    for (name, task) in cache_tasks {
        supervisor.adopt(name, task);
    }
    let state = Arc::new(AppState::new(cluster, policy, resolver.clone()));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr()?,
        datacenters = ?state.policy.allowed_datacenters,
        max_gpu_price = args.max_gpu_price,
        nodename = %args.nodename,
        "webhook serving"
    );

    // Certificates keep being reloaded through the drain, until the server is done.
    let watch = resolver.watch(args.tls_reload_interval, std::future::pending());
    supervisor.spawn("certificate reload", async move {
        if let Err(error) = watch.await {
            tracing::error!(%error, "certificate reload stopped");
        }
    });
    let mut failure = None;
    let stop = async {
        tokio::select! {
            () = crate::shutdown::signal() => tracing::info!("shutdown signal received"),
            error = supervisor.failed() => {
                tracing::error!(%error, "shutting down: a background task stopped");
                failure = Some(error);
            }
        }
    };
    serve_tls(listener, tls, state, serve_options(&args), stop).await;
    match failure {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

fn serve_options(args: &WebhookArgs) -> ServeOptions {
    ServeOptions {
        shutdown_drain: args.shutdown_drain,
        idle_timeout: args.idle_timeout,
        max_connections: usize::try_from(args.max_connections).unwrap_or(usize::MAX),
        max_concurrent_streams: args.max_concurrent_streams,
        ..ServeOptions::default()
    }
}

fn policy_config(
    args: &WebhookArgs,
    own_namespace: Option<String>,
) -> anyhow::Result<PolicyConfig> {
    let mut config = PolicyConfig::from_flags(
        &args.exclude_namespaces,
        &args.datacenter_ids,
        args.max_gpu_price,
        own_namespace,
    );
    config.vastai = args
        .vastai_policy
        .policy(args.max_gpu_price)
        .map_err(anyhow::Error::msg)?;
    config.allowed_cloud_types = args.allowed_cloud_types.clone();
    config.expose_no_ports = args.expose_ports == runpod_kubelet::flags::ExposePorts::None;
    config.accept_seed_tolerations = args.accept_seed_tolerations;
    config.default_budget = args.default_budget_per_hour;
    (config.namespace_nodes, config.node_clouds) =
        runpod_contract::teams::parse_assignments(&args.namespace_nodes)
            .map_err(|problem| anyhow::anyhow!("--namespace-nodes: {problem}"))?;
    config.disabled_clouds = runpod_contract::provider::Cloud::ALL
        .into_iter()
        .filter(|cloud| !args.clouds.contains(cloud))
        .collect();
    Ok(config)
}

fn parse_cloud(value: &str) -> Result<runpod_contract::provider::Cloud, String> {
    runpod_contract::provider::Cloud::parse(value)
        .ok_or_else(|| format!("{value:?} is not a cloud: runpod or vastai"))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    #[test]
    fn flag_defaults_are_the_server_defaults() {
        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "webhook",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
        ])
        .unwrap();
        let Command::Webhook(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(serve_options(&args), ServeOptions::default());
    }
}
