//! `runpod-kubelet certs`: a CA and a serving certificate, either as PEM files (demo and manual
//! installs) or, in the cluster, as Secrets that are renewed when due and whose CA bundle is
//! kept in the webhook configuration (`cluster`).
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use runpod_kubelet::flags::positive_duration;

/// Where `certs` keeps the webhook's certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum CertsMode {
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
pub(crate) enum RotateNow {
    /// A new serving certificate.
    Serving,
    /// A new CA and serving certificate; the old CA stays in the bundle until it expires.
    Ca,
}

#[derive(Debug, Args)]
pub(crate) struct CertsArgs {
    /// `files`, `helm` or `provided`; default `files` with `--out-dir`, else `helm`.
    #[arg(long, value_enum, env = "RUNPOD_KUBELET_MODE")]
    pub mode: Option<CertsMode>,
    /// Directory for ca.crt, ca.key, tls.crt and tls.key (files mode).
    #[arg(long, env = "RUNPOD_KUBELET_OUT_DIR")]
    pub out_dir: Option<PathBuf>,
    /// DNS names of the serving certificate (files mode default: localhost; in the cluster these
    /// come in addition to the Service's names).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_DNS_NAMES")]
    pub dns_names: Vec<String>,
    /// IP addresses of the serving certificate (files mode default: 127.0.0.1).
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_IP_ADDRESSES")]
    pub ip_addresses: Vec<std::net::IpAddr>,
    /// Validity of the serving certificate (files mode: the CA gets ten times as long).
    #[arg(long, default_value = "90d", value_parser = positive_duration, env = "RUNPOD_KUBELET_VALIDITY")]
    pub validity: Duration,
    /// The serving certificate is renewed once less than this is left.
    #[arg(long, default_value = "30d", value_parser = runpod_kubelet::flags::seconds_or_duration, env = "RUNPOD_KUBELET_RENEW_BEFORE")]
    pub renew_before: Duration,
    /// Validity of the CA (cluster modes).
    #[arg(long, default_value = "730d", value_parser = positive_duration, env = "RUNPOD_KUBELET_CA_VALIDITY")]
    pub ca_validity: Duration,
    /// The CA is replaced once less than this is left; the old CA stays in the bundle until it
    /// expires, so certificates it signed keep verifying meanwhile.
    #[arg(long, default_value = "90d", value_parser = runpod_kubelet::flags::seconds_or_duration, env = "RUNPOD_KUBELET_CA_RENEW_BEFORE")]
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

mod cluster;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use anyhow::Context as _;
use runpod_certs::CertificateAuthority;

pub(crate) async fn run(args: &CertsArgs) -> anyhow::Result<()> {
    let mode = args.mode.unwrap_or(if args.out_dir.is_some() {
        CertsMode::Files
    } else {
        CertsMode::Helm
    });
    match mode {
        CertsMode::Files => write_files(args),
        CertsMode::Helm | CertsMode::Provided => cluster::run(args, mode).await,
    }
}

fn write_files(args: &CertsArgs) -> anyhow::Result<()> {
    let out_dir = args
        .out_dir
        .as_ref()
        .context("--mode files needs --out-dir")?;
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let ca = CertificateAuthority::generate("runpod-kubelet-webhook-ca", args.validity * 10)?;
    let mut dns: Vec<&str> = args.dns_names.iter().map(String::as_str).collect();
    let mut ips = args.ip_addresses.clone();
    if dns.is_empty() && ips.is_empty() {
        dns.push("localhost");
        ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let serving = ca.issue_serving(&dns, &ips, args.validity)?;
    write(&out_dir.join("ca.crt"), &ca.certificate().cert_pem, false)?;
    write(&out_dir.join("ca.key"), &ca.certificate().key_pem, true)?;
    write(&out_dir.join("tls.crt"), &serving.cert_pem, false)?;
    write(&out_dir.join("tls.key"), &serving.key_pem, true)?;
    tracing::info!(dir = %out_dir.display(), "certificates written");
    Ok(())
}

/// Writes a new file next to `path` and renames it into place: a private key is never in a
/// file anyone else can read, not even for a moment, and a reader never sees half a file.
fn write(path: &Path, contents: &str, secret: bool) -> anyhow::Result<()> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written =
        write_new(&temporary, contents, secret).and_then(|()| std::fs::rename(&temporary, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

fn write_new(path: &Path, contents: &str, secret: bool) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path)?;
    std::io::Write::write_all(&mut file, contents.as_bytes())?;
    file.sync_all()
}
