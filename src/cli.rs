//! Command line: every flag also reads `RUNPOD_KUBELET_<FLAG>` from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "runpod-kubelet",
    version,
    about = "Burst Kubernetes GPU pods to RunPod"
)]
pub struct Cli {
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "RUNPOD_KUBELET_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `runpod_webhook=debug,info`.
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "RUNPOD_KUBELET_LOG_LEVEL"
    )]
    pub log_level: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the mutating admission webhook (HTTPS).
    Webhook(WebhookArgs),
    /// Write a new CA and a serving certificate signed by it (PEM files).
    Certs(CertsArgs),
    /// Print the MutatingWebhookConfiguration (JSON) that routes opted-in pods to the webhook.
    WebhookConfiguration(RegistrationArgs),
    /// Serve a cloud simulator over plain HTTP (e2e tests and the demo): RunPod REST v2, or
    /// Vast.ai with `--cloud vastai`. The API key, if any, comes from `RUNPOD_API_KEY` or
    /// `VAST_API_KEY` only.
    Simulator(SimulatorArgs),
    /// Print the RunPod placement candidates (GPU type × data centres, cheapest first) for
    /// given requirements, from the live catalogue. Needs `RUNPOD_API_KEY`.
    Gpus(crate::gpus_cmd::GpusArgs),
    /// Run the virtual kubelet: register the virtual node and run the pods bound to it on
    /// RunPod. The API key comes from `RUNPOD_API_KEY` only.
    Controller(Box<crate::controller_cmd::ControllerArgs>),
}

#[derive(Debug, Args)]
pub struct SimulatorArgs {
    /// Address to serve plain HTTP on; port 0 picks a free port (printed on start).
    #[arg(long, default_value = "127.0.0.1:8089", env = "RUNPOD_KUBELET_LISTEN")]
    pub listen: SocketAddr,
    /// JSON scenario (catalogue or offers, rate limits, timings, image rules, faults) in the
    /// chosen cloud's format; default: a realistic market.
    #[arg(long, env = "RUNPOD_KUBELET_SCENARIO")]
    pub scenario: Option<PathBuf>,
    /// Which cloud to simulate.
    #[arg(long, value_enum, default_value_t = SimulatedCloud::Runpod, env = "RUNPOD_KUBELET_SIMULATED_CLOUD")]
    pub cloud: SimulatedCloud,
}

/// The clouds `simulator` can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SimulatedCloud {
    /// RunPod REST v2 (`/v2/...`); key from `RUNPOD_API_KEY`.
    Runpod,
    /// Vast.ai (`/api/v0/...`, `/api/v1/...`); key from `VAST_API_KEY`.
    Vastai,
}

/// Where `certs` keeps the webhook's certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CertsMode {
    /// PEM files in `--out-dir` (demo, manual installs); the default when `--out-dir` is given.
    Files,
    /// In the cluster: a CA Secret and a serving Secret, renewed when due, the CA bundle patched
    /// into the webhook configuration (the chart's hook Job and CronJob).
    Helm,
    /// A Secret the user provides (`tls.crt`, `tls.key`, `ca.crt`): never written; only its
    /// `ca.crt` is patched into the webhook configuration.
    Provided,
}

/// A rotation an operator asks for, due or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RotateNow {
    /// A new serving certificate.
    Serving,
    /// A new CA and serving certificate; the old CA stays in the bundle until it expires.
    Ca,
}

#[derive(Debug, Args)]
pub struct CertsArgs {
    /// `files`, `helm` or `provided`; default `files` with `--out-dir`, else `helm`.
    #[arg(long, value_enum, env = "RUNPOD_KUBELET_MODE")]
    pub mode: Option<CertsMode>,
    /// Directory for ca.crt, ca.key, tls.crt and tls.key (files mode).
    #[arg(long, env = "RUNPOD_KUBELET_OUT_DIR")]
    pub out_dir: Option<PathBuf>,
    /// DNS names of the serving certificate (files mode default: localhost; in the cluster these
    /// come in addition to the Service's names).
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_DNS_NAMES")]
    pub dns_names: Vec<String>,
    /// IP addresses of the serving certificate (files mode default: 127.0.0.1).
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_IP_ADDRESSES")]
    pub ip_addresses: Vec<std::net::IpAddr>,
    /// Validity of the serving certificate (files mode: the CA gets ten times as long).
    #[arg(long, default_value = "90d", value_parser = positive_duration, env = "RUNPOD_KUBELET_VALIDITY")]
    pub validity: Duration,
    /// The serving certificate is renewed once less than this is left.
    #[arg(long, default_value = "30d", value_parser = humantime::parse_duration, env = "RUNPOD_KUBELET_RENEW_BEFORE")]
    pub renew_before: Duration,
    /// Validity of the CA (cluster modes).
    #[arg(long, default_value = "730d", value_parser = positive_duration, env = "RUNPOD_KUBELET_CA_VALIDITY")]
    pub ca_validity: Duration,
    /// The CA is replaced once less than this is left; the old CA stays in the bundle until it
    /// expires, so certificates it signed keep verifying meanwhile.
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration, env = "RUNPOD_KUBELET_CA_RENEW_BEFORE")]
    pub ca_renew_before: Duration,
    /// Rotate now, whether due or not.
    #[arg(long, value_enum, env = "RUNPOD_KUBELET_ROTATE")]
    pub rotate: Option<RotateNow>,
    /// Namespace of the Secrets and the Service; default `POD_NAMESPACE`, else `default`.
    #[arg(long, env = "RUNPOD_KUBELET_NAMESPACE")]
    pub namespace: Option<String>,
    /// The serving Secret (`tls.crt`, `tls.key`, `ca.crt`), mounted by the webhook.
    #[arg(
        long,
        default_value = "runpod-kubelet-webhook-tls",
        env = "RUNPOD_KUBELET_SECRET_NAME"
    )]
    pub secret_name: String,
    /// The CA Secret (`ca.crt`, `ca.key`, `ca-bundle.crt`); default `<secret-name>-ca`. Only
    /// the certs Job reads it: the webhook never holds the CA key.
    #[arg(long, env = "RUNPOD_KUBELET_CA_SECRET_NAME")]
    pub ca_secret_name: Option<String>,
    /// The webhook's Service; its in-cluster DNS names go into the serving certificate.
    #[arg(
        long,
        default_value = "runpod-kubelet-webhook",
        env = "RUNPOD_KUBELET_SERVICE_NAME"
    )]
    pub service_name: String,
    /// The MutatingWebhookConfiguration whose `caBundle` is kept in step (absent: skipped, as
    /// before the chart's resources exist on a first install).
    #[arg(
        long,
        default_value = "burst.runpod.io",
        env = "RUNPOD_KUBELET_WEBHOOK_CONFIGURATION"
    )]
    pub webhook_configuration: String,
}

#[derive(Debug, Args)]
pub struct RegistrationArgs {
    /// Name of the configuration; the two webhook entries are `namespaces.NAME` and `pods.NAME`.
    #[arg(long, default_value = "burst.runpod.io", env = "RUNPOD_KUBELET_NAME")]
    pub name: String,
    /// URL of `/mutate` for a webhook outside the cluster (e.g. https://127.0.0.1:8443/mutate).
    #[arg(
        long,
        conflicts_with = "service",
        required_unless_present = "service",
        env = "RUNPOD_KUBELET_URL"
    )]
    pub url: Option<String>,
    /// In-cluster Service as NAMESPACE/NAME:PORT.
    #[arg(long, env = "RUNPOD_KUBELET_SERVICE")]
    pub service: Option<String>,
    /// PEM CA bundle the apiserver uses to verify the webhook; without it `caBundle` is left
    /// out, for `runpod-kubelet certs` to patch in (the chart).
    #[arg(long, env = "RUNPOD_KUBELET_CA_BUNDLE")]
    pub ca_bundle: Option<PathBuf>,
    /// What the apiserver does when the webhook cannot be reached: `Fail` or `Ignore`.
    #[arg(long, default_value = "Fail", value_parser = ["Fail", "Ignore"], env = "RUNPOD_KUBELET_FAILURE_POLICY")]
    pub failure_policy: String,
    /// More namespaces never sent to the webhook (comma-separated); `kube-system` and the
    /// `--service` namespace always are.
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    /// Seconds the apiserver waits for the webhook.
    #[arg(long, default_value_t = 10, env = "RUNPOD_KUBELET_TIMEOUT_SECONDS")]
    pub timeout_seconds: i32,
}

#[derive(Debug, Args)]
pub struct WebhookArgs {
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
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_DATACENTER_IDS")]
    pub datacenter_ids: Vec<String>,
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
    #[arg(long, value_delimiter = ',', env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    #[command(flatten)]
    pub vastai_policy: runpod_kubelet::vastai::args::VastPolicyArgs,
    /// After SIGTERM, how long to keep answering reviews (with /readyz failing) before closing,
    /// so that endpoints stop routing here first.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration, env = "RUNPOD_KUBELET_SHUTDOWN_DRAIN")]
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
}

/// A humantime duration above zero (a zero period would mean "never" or a busy loop).
fn positive_duration(value: &str) -> Result<Duration, String> {
    match humantime::parse_duration(value) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        Ok(_) => Err("must be longer than zero".to_owned()),
        Err(error) => Err(error.to_string()),
    }
}

fn positive_price(value: &str) -> Result<f64, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|price| price.is_finite() && *price > 0.0)
        .ok_or_else(|| format!("{value:?} is not a positive number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_fall_back_to_environment_and_defaults() {
        let cli = Cli::try_parse_from([
            "runpod-kubelet",
            "webhook",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--datacenter-ids",
            "EU-RO-1,US-TX-3",
        ])
        .unwrap();
        let Command::Webhook(args) = cli.command else {
            panic!("parsed another subcommand");
        };
        assert_eq!(args.listen.port(), 8443);
        assert_eq!(args.datacenter_ids, vec!["EU-RO-1", "US-TX-3"]);
        assert_eq!(args.max_gpu_price, 0.5);
        assert!(args.exclude_namespaces.is_empty());
        assert_eq!(args.tls_reload_interval, Duration::from_secs(10));
    }
}
