//! `runpod-kubelet webhook-configuration`: prints the registration for `kubectl apply -f -`.

use anyhow::{Context as _, bail};
use runpod_webhook::registration::{Endpoint, Registration, mutating_webhook_configuration};

use crate::cli::RegistrationArgs;

pub fn run(args: &RegistrationArgs) -> anyhow::Result<()> {
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
