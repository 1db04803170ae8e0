//! `certs` in the cluster: read the Secrets, decide with `runpod_certs::rotation::plan`, write
//! what is due, and keep the webhook configuration's `caBundle` in step.
//!
//! Order of writes: the CA Secret, then the `caBundle` (so the apiserver trusts a new CA before
//! anything it signed is served), then the serving Secret. Every write carries a precondition (a
//! create fails if the object appeared, a replace carries the `resourceVersion` read), so two runs
//! racing never overwrite each other: the loser re-reads and decides again, and finds the winner's
//! work done.

use std::collections::BTreeMap;
use std::net::IpAddr;

use anyhow::Context as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use runpod_certs::CertificateAuthority;
use runpod_certs::inspect;
use runpod_certs::rotation::{
    self, CaAction, Force, Observed, Plan, RotationPolicy, ServingAction, StoredCa, StoredServing,
};
use serde_json::json;

use super::{CertsArgs, CertsMode, RotateNow};

/// Field manager of the `caBundle`: Helm never renders it, so the two never fight.
pub(super) const FIELD_MANAGER: &str = "runpod-kubelet-certs";
/// Keys of the CA Secret.
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CA_BUNDLE: &str = "ca-bundle.crt";
/// Keys of the serving Secret (type kubernetes.io/tls, plus the bundle).
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
const TLS_BUNDLE: &str = "ca.crt";
/// Races are settled by re-reading; this many rounds is far more than two racing runs need.
const ATTEMPTS: usize = 8;

/// Why a write did not happen.
#[derive(Debug, thiserror::Error)]
enum WriteError {
    /// Someone else wrote first (409): read again and decide again.
    #[error("{0} changed since it was read")]
    Conflict(String),
    #[error(transparent)]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Cert(#[from] runpod_certs::CertError),
}

/// What the caBundle sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BundleSync {
    Patched,
    Unchanged,
    /// The configuration does not exist (yet): a pre-install hook runs before the chart's
    /// resources; the post-install run patches it.
    Absent,
}

struct Target {
    secrets: Api<Secret>,
    configurations: Api<MutatingWebhookConfiguration>,
    namespace: String,
    tls_secret: String,
    ca_secret: String,
    configuration: String,
    dns_names: Vec<String>,
    ip_addresses: Vec<IpAddr>,
}

pub(super) async fn run(args: &CertsArgs, mode: CertsMode) -> anyhow::Result<()> {
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes (KUBECONFIG or in-cluster config)")?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok())
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let target = Target {
        secrets: Api::namespaced(client.clone(), &namespace),
        configurations: Api::all(client),
        tls_secret: args.secret_name.clone(),
        ca_secret: args
            .ca_secret_name
            .clone()
            .unwrap_or_else(|| format!("{}-ca", args.secret_name)),
        configuration: args.webhook_configuration.clone(),
        dns_names: service_names(&args.service_name, &namespace, &args.dns_names),
        ip_addresses: args.ip_addresses.clone(),
        namespace,
    };
    match mode {
        CertsMode::Provided => provided(&target).await,
        _ => rotate(&target, args).await,
    }
}

/// The Service's in-cluster names, then any extra ones, without duplicates.
fn service_names(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        service.to_owned(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    for name in extra {
        let name = name.trim();
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    names
}

fn policy(args: &CertsArgs) -> RotationPolicy {
    RotationPolicy {
        ca_validity: args.ca_validity,
        ca_renew_before: args.ca_renew_before,
        serving_validity: args.validity,
        serving_renew_before: args.renew_before,
        ..RotationPolicy::default()
    }
}

#[tracing::instrument(skip_all, fields(namespace = %target.namespace, secret = %target.tls_secret))]
async fn rotate(target: &Target, args: &CertsArgs) -> anyhow::Result<()> {
    let policy = policy(args);
    let mut force = match args.rotate {
        None => Force::Nothing,
        Some(RotateNow::Serving) => Force::Serving,
        Some(RotateNow::Ca) => Force::Ca,
    };
    for attempt in 1..=ATTEMPTS {
        let ca_secret = target.secrets.get_opt(&target.ca_secret).await?;
        let tls_secret = target.secrets.get_opt(&target.tls_secret).await?;
        let wanted = wanted_names(target);
        let observed = observe(ca_secret.as_ref(), tls_secret.as_ref(), &wanted);
        let now = unix_now();
        let plan = rotation::plan(&observed, &policy, now, force);
        tracing::info!(
            namespace = %target.namespace,
            ca = ?plan.ca,
            serving = ?plan.serving,
            previous_cas = plan.previous.len(),
            attempt,
            "certificate plan"
        );
        match carry_out(target, &policy, &plan, ca_secret, tls_secret, now).await {
            Ok(()) => {
                // The bundle from the Secret as it is now, so the last writer leaves the
                // configuration matching the stored CA even after a race.
                let bundle = stored_bundle(target).await?;
                let sync = sync_ca_bundle(target, &bundle).await?;
                report(&plan, sync);
                return Ok(());
            }
            Err(WriteError::Conflict(what)) => {
                tracing::info!(%what, attempt, "another run wrote first; reading again");
                // A forced rotation was carried out by whoever won, or will be on a later run.
                if attempt > 1 {
                    force = Force::Nothing;
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    anyhow::bail!("gave up after {ATTEMPTS} conflicting writes")
}

/// One line on stdout saying what was done (for people and for tests).
fn report(plan: &Plan, sync: BundleSync) {
    let ca = match plan.ca {
        CaAction::Keep => "kept",
        CaAction::Create => "created",
        CaAction::Rotate => "rotated",
    };
    let serving = match plan.serving {
        ServingAction::Keep => "kept".to_owned(),
        ServingAction::RefreshBundle => "bundle-refreshed".to_owned(),
        ServingAction::Issue(reason) => format!("issued ({reason:?})"),
    };
    let bundle = match sync {
        BundleSync::Patched => "patched",
        BundleSync::Unchanged => "unchanged",
        BundleSync::Absent => "no-configuration",
    };
    tracing::info!(ca, %serving, ca_bundle = bundle, "certificates done");
    println!(
        "{}",
        json!({"ca": ca, "serving": serving, "previousCas": plan.previous.len(), "caBundle": bundle})
    );
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX)
        })
}

fn wanted_names(target: &Target) -> Vec<String> {
    let mut names: Vec<String> = target.dns_names.clone();
    names.extend(target.ip_addresses.iter().map(ToString::to_string));
    names.sort();
    names
}

fn data_text(secret: Option<&Secret>, key: &str) -> Option<String> {
    let bytes = secret?.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

/// What is stored, as the facts the plan needs. Anything unreadable counts as absent.
fn observe(ca_secret: Option<&Secret>, tls_secret: Option<&Secret>, wanted: &[String]) -> Observed {
    let ca_cert = data_text(ca_secret, CA_CERT);
    let ca = ca_cert.as_deref().and_then(|cert| {
        let info = inspect::parse_first(cert).ok()?;
        let usable = data_text(ca_secret, CA_KEY)
            .is_some_and(|key| CertificateAuthority::from_pem(cert, &key).is_ok());
        Some(StoredCa { info, usable })
    });
    let previous = data_text(ca_secret, CA_BUNDLE)
        .and_then(|bundle| inspect::parse_bundle(&bundle).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|cert| ca.as_ref().is_none_or(|ca| ca.info.der != cert.der))
        .collect();
    let serving = data_text(tls_secret, TLS_CERT).and_then(|cert| {
        let info = inspect::parse_first(&cert).ok()?;
        let key = data_text(tls_secret, TLS_KEY).unwrap_or_default();
        let mut names = inspect::subject_alt_names(&cert).unwrap_or_default();
        names.sort();
        Some(StoredServing {
            info,
            signed_by_current_ca: ca_cert
                .as_deref()
                .is_some_and(|ca| inspect::signed_by(&cert, ca).unwrap_or(false)),
            names_match: names == wanted,
            key_matches: inspect::key_matches(&cert, &key),
            bundle: data_text(tls_secret, TLS_BUNDLE)
                .and_then(|bundle| inspect::parse_bundle(&bundle).ok())
                .unwrap_or_default()
                .into_iter()
                .map(|cert| cert.der)
                .collect(),
        })
    });
    Observed {
        ca,
        previous,
        serving,
    }
}

async fn carry_out(
    target: &Target,
    policy: &RotationPolicy,
    plan: &Plan,
    ca_secret: Option<Secret>,
    tls_secret: Option<Secret>,
    now: i64,
) -> Result<(), WriteError> {
    let previous_pem: String = plan
        .previous
        .iter()
        .map(|cert| inspect::pem_of(&cert.der))
        .collect();
    // The CA that signs from now on.
    let (ca, ca_not_after) = match plan.ca {
        CaAction::Keep => {
            let cert = data_text(ca_secret.as_ref(), CA_CERT).unwrap_or_default();
            let key = data_text(ca_secret.as_ref(), CA_KEY).unwrap_or_default();
            let not_after = inspect::parse_first(&cert)?.not_after;
            (CertificateAuthority::from_pem(&cert, &key)?, not_after)
        }
        CaAction::Create | CaAction::Rotate => {
            let ca = CertificateAuthority::generate(
                &format!("runpod-kubelet-webhook-ca-{now}"),
                policy.ca_validity,
            )?;
            let not_after = inspect::parse_first(&ca.certificate().cert_pem)?.not_after;
            (ca, not_after)
        }
    };
    let bundle = format!("{}{previous_pem}", ca.certificate().cert_pem);
    if plan.write_ca_secret {
        let data = [
            (CA_CERT, ca.certificate().cert_pem.as_str()),
            (CA_KEY, ca.certificate().key_pem.as_str()),
            (CA_BUNDLE, bundle.as_str()),
        ];
        write_secret(target, &target.ca_secret, ca_secret, "Opaque", &data).await?;
        tracing::info!(secret = %target.ca_secret, ca = ?plan.ca, "CA Secret written");
        // Trusted before it signs anything that is served.
        if let Err(error) = sync_ca_bundle(target, &bundle).await {
            return Err(WriteError::Kube(error));
        }
    }
    match plan.serving {
        ServingAction::Keep => {}
        ServingAction::RefreshBundle => {
            let cert = data_text(tls_secret.as_ref(), TLS_CERT).unwrap_or_default();
            let key = data_text(tls_secret.as_ref(), TLS_KEY).unwrap_or_default();
            let data = [
                (TLS_CERT, cert.as_str()),
                (TLS_KEY, key.as_str()),
                (TLS_BUNDLE, bundle.as_str()),
            ];
            write_secret(
                target,
                &target.tls_secret,
                tls_secret,
                "kubernetes.io/tls",
                &data,
            )
            .await?;
        }
        ServingAction::Issue(reason) => {
            let lifetime = rotation::serving_lifetime(policy, ca_not_after, now);
            let dns: Vec<&str> = target.dns_names.iter().map(String::as_str).collect();
            let serving = ca.issue_serving(&dns, &target.ip_addresses, lifetime)?;
            let data = [
                (TLS_CERT, serving.cert_pem.as_str()),
                (TLS_KEY, serving.key_pem.as_str()),
                (TLS_BUNDLE, bundle.as_str()),
            ];
            write_secret(
                target,
                &target.tls_secret,
                tls_secret,
                "kubernetes.io/tls",
                &data,
            )
            .await?;
            tracing::info!(secret = %target.tls_secret, ?reason, valid_for = ?lifetime, "serving certificate issued");
        }
    }
    Ok(())
}

/// Creates the Secret if it was absent when read, else replaces it carrying the
/// `resourceVersion` read: either fails with a conflict if someone wrote in between.
async fn write_secret(
    target: &Target,
    name: &str,
    read: Option<Secret>,
    type_: &str,
    data: &[(&str, &str)],
) -> Result<(), WriteError> {
    let data: BTreeMap<String, ByteString> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let labels: BTreeMap<String, String> = [
        ("app.kubernetes.io/part-of", "runpod-kubelet"),
        ("app.kubernetes.io/managed-by", FIELD_MANAGER),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PostParams::default()
    };
    let result = match read {
        None => {
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(target.namespace.clone()),
                    labels: Some(labels),
                    ..ObjectMeta::default()
                },
                type_: Some(type_.to_owned()),
                data: Some(data),
                ..Secret::default()
            };
            target.secrets.create(&params, &secret).await.map(drop)
        }
        Some(mut secret) => {
            // A Secret's type is immutable; a wrong one (a hand-made Opaque serving Secret) is
            // an operator's to fix, and the write below says so.
            secret.data = Some(data);
            secret.string_data = None;
            secret
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(labels);
            secret.metadata.managed_fields = None;
            target
                .secrets
                .replace(name, &params, &secret)
                .await
                .map(drop)
        }
    };
    match result {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Err(WriteError::Conflict(format!(
            "Secret {}/{name}",
            target.namespace
        ))),
        Err(error) => Err(error.into()),
    }
}

async fn stored_bundle(target: &Target) -> anyhow::Result<String> {
    let secret = target.secrets.get_opt(&target.ca_secret).await?;
    // A CA Secret written by hand may lack the bundle: then the CA alone is the bundle.
    data_text(secret.as_ref(), CA_BUNDLE)
        .or_else(|| data_text(secret.as_ref(), CA_CERT))
        .with_context(|| format!("Secret {} holds no {CA_BUNDLE}", target.ca_secret))
}

/// Puts `bundle` into every entry of the webhook configuration with server-side apply under our
/// own field manager (forced: the rotator owns `caBundle`), unless it is already there.
async fn sync_ca_bundle(target: &Target, bundle: &str) -> Result<BundleSync, kube::Error> {
    let Some(configuration) = target.configurations.get_opt(&target.configuration).await? else {
        tracing::info!(configuration = %target.configuration, "webhook configuration not there yet; caBundle left for a later run");
        return Ok(BundleSync::Absent);
    };
    let webhooks = configuration.webhooks.unwrap_or_default();
    let in_step = webhooks.iter().all(|webhook| {
        webhook
            .client_config
            .ca_bundle
            .as_ref()
            .is_some_and(|b| b.0 == bundle.as_bytes())
    });
    if in_step {
        return Ok(BundleSync::Unchanged);
    }
    let entries: Vec<serde_json::Value> = webhooks
        .iter()
        .map(|webhook| {
            json!({
                "name": webhook.name,
                "clientConfig": {"caBundle": ByteString(bundle.as_bytes().to_vec())},
            })
        })
        .collect();
    let body = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": target.configuration},
        "webhooks": entries,
    });
    target
        .configurations
        .patch(
            &target.configuration,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
    tracing::info!(configuration = %target.configuration, entries = webhooks.len(), "caBundle patched");
    Ok(BundleSync::Patched)
}

/// `provided`: the user's Secret is only read; its `ca.crt` goes into the configuration.
#[tracing::instrument(skip_all, fields(namespace = %target.namespace, secret = %target.tls_secret))]
async fn provided(target: &Target) -> anyhow::Result<()> {
    let secret = target
        .secrets
        .get_opt(&target.tls_secret)
        .await?
        .with_context(|| {
            format!(
                "the provided Secret {}/{} does not exist",
                target.namespace, target.tls_secret
            )
        })?;
    let cert = data_text(Some(&secret), TLS_CERT).context("the provided Secret has no tls.crt")?;
    let key = data_text(Some(&secret), TLS_KEY).context("the provided Secret has no tls.key")?;
    let bundle = data_text(Some(&secret), TLS_BUNDLE)
        .context("the provided Secret has no ca.crt (the CA bundle the apiserver must trust)")?;
    anyhow::ensure!(
        inspect::key_matches(&cert, &key),
        "the provided Secret's tls.key does not belong to its tls.crt"
    );
    let trusted = inspect::parse_bundle(&bundle)?
        .iter()
        .any(|ca| inspect::signed_by(&cert, &inspect::pem_of(&ca.der)).unwrap_or(false));
    anyhow::ensure!(
        trusted,
        "the provided Secret's tls.crt is not signed by any certificate of its ca.crt"
    );
    let sync = sync_ca_bundle(target, &bundle).await?;
    println!(
        "{}",
        json!({"mode": "provided", "caBundle": format!("{sync:?}").to_lowercase()})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn pem_round_trips_through_our_encoder() {
        let ca = CertificateAuthority::generate("x", Duration::from_secs(600)).unwrap();
        let info = inspect::parse_first(&ca.certificate().cert_pem).unwrap();
        let again = inspect::parse_first(&inspect::pem_of(&info.der)).unwrap();
        assert_eq!(info, again);
    }

    #[test]
    fn serving_names_cover_the_service_dns_forms() {
        let names = service_names("hook", "ns", &["extra.example".into(), "hook".into()]);
        assert_eq!(
            names,
            vec![
                "hook",
                "hook.ns",
                "hook.ns.svc",
                "hook.ns.svc.cluster.local",
                "extra.example"
            ]
        );
    }
}
