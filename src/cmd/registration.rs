//! `runpod-kubelet webhook-configuration`: prints the registration for `kubectl apply -f -`.

use anyhow::{Context as _, bail};
use runpod_webhook::registration::{Endpoint, Registration, mutating_webhook_configuration};

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args)]
pub(crate) struct RegistrationArgs {
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
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_EXCLUDE_NAMESPACES")]
    pub exclude_namespaces: Vec<String>,
    /// Seconds the apiserver waits for the webhook.
    #[arg(long, default_value_t = 10, env = "RUNPOD_KUBELET_TIMEOUT_SECONDS")]
    pub timeout_seconds: i32,
    /// Send only the pods the webhook may change (GPU pods, pods with a `runpod.io/` or
    /// `vast.ai/` annotation, Job pods), by a CEL match condition: apiservers 1.28 and later.
    #[arg(long, env = "RUNPOD_KUBELET_MATCH_CONDITIONS")]
    pub match_conditions: bool,
}

pub(crate) fn run(args: &RegistrationArgs) -> anyhow::Result<()> {
    let endpoint = match (&args.url, &args.service) {
        (Some(url), _) => Endpoint::Url(url.clone()),
        (None, Some(service)) => parse_service(service)?,
        (None, None) => bail!("give --url or --service"),
    };
    let ca_bundle_pem = args
        .ca_bundle
        .as_ref()
        .map(|path| std::fs::read(path).with_context(|| format!("reading {}", path.display())))
        .transpose()?;
    let configuration = mutating_webhook_configuration(&Registration {
        name: args.name.clone(),
        endpoint,
        ca_bundle_pem,
        failure_policy: args.failure_policy.clone(),
        excluded_namespaces: args.exclude_namespaces.clone(),
        timeout_seconds: args.timeout_seconds,
        match_conditions: args.match_conditions,
    });
    let mut json = serde_json::to_value(&configuration)?;
    json["apiVersion"] = "admissionregistration.k8s.io/v1".into();
    json["kind"] = "MutatingWebhookConfiguration".into();
    println!("{}", serde_json::to_string_pretty(&json)?);
    Ok(())
}

fn parse_service(service: &str) -> anyhow::Result<Endpoint> {
    let (namespace, rest) = service
        .split_once('/')
        .context("--service must be NAMESPACE/NAME:PORT")?;
    let (name, port) = rest.split_once(':').unwrap_or((rest, "443"));
    Ok(Endpoint::Service {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        port: port.parse().context("--service port must be a number")?,
    })
}
