//! Helpers of tests/e2e_helm.rs: Helm against the test cluster, the host's address, the webhook
//! configuration's caBundle watched through an upgrade, and clients of the chart's accounts.

use std::path::Path;

use anyhow::{Context, bail};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use kube::Api;
use serde_json::json;

use super::{CONFIG, FULL, NS};

pub use crate::support::chart::{helm, host_ip};

/// Watches the webhook configuration from now on, counting its versions and those with an entry
/// lacking a caBundle.
pub struct BundleWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<(usize, usize)>,
}

impl BundleWatch {
    pub async fn finish(self) -> (usize, usize) {
        let _ = self.stop.send(());
        self.task.await.unwrap_or((0, usize::MAX))
    }
}

pub async fn watch_ca_bundle(client: &kube::Client) -> anyhow::Result<BundleWatch> {
    use futures::StreamExt as _;
    use kube::api::{WatchEvent, WatchParams};
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let version = api
        .get(CONFIG)
        .await?
        .metadata
        .resource_version
        .context("no resourceVersion")?;
    let params = WatchParams::default()
        .fields(&format!("metadata.name={CONFIG}"))
        .timeout(290);
    let mut stream = api.watch(&params, &version).await?.boxed();
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let (mut changes, mut without) = (0, 0);
        loop {
            tokio::select! {
                _ = &mut stopped => return (changes, without),
                event = stream.next() => match event {
                    Some(Ok(WatchEvent::Modified(config) | WatchEvent::Added(config))) => {
                        changes += 1;
                        let missing = config.webhooks.unwrap_or_default().iter().any(|w| {
                            w.client_config.ca_bundle.as_ref().is_none_or(|b| b.0.is_empty())
                        });
                        if missing {
                            without += 1;
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(_))) => without += 1,
                    Some(_) => {}
                    None => return (changes, without),
                },
            }
        }
    });
    Ok(BundleWatch { stop, task })
}

pub fn gpu_pod(name: &str, annotations: serde_json::Value, runtime_class: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "runtimeClassName": runtime_class,
            "restartPolicy": "Always",
            "containers": [{"name": "main", "image": "e2e/server:1", "command": ["serve"],
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
        }
    }))
    .unwrap()
}

/// The stored CA and bundle.
pub async fn ca_pems(client: &kube::Client) -> anyhow::Result<(String, String)> {
    let secret = Api::<Secret>::namespaced(client.clone(), NS)
        .get(&format!("{FULL}-webhook-tls-ca"))
        .await?;
    let data = secret.data.context("CA Secret without data")?;
    let text = |key: &str| -> anyhow::Result<String> {
        Ok(String::from_utf8(
            data.get(key).context("missing key")?.0.clone(),
        )?)
    };
    Ok((text("ca.crt")?, text("ca-bundle.crt")?))
}

/// A client authenticating with a ServiceAccount's token.
pub async fn token_client(
    admin: &kube::Client,
    kubeconfig: &Path,
    account: &str,
) -> anyhow::Result<kube::Client> {
    let sa = Api::<ServiceAccount>::namespaced(admin.clone(), NS)
        .get(account)
        .await?;
    let secret_name = sa
        .secrets
        .and_then(|s| s.first().and_then(|r| r.name.clone()))
        .context("the ServiceAccount has no token Secret")?;
    let secret = Api::<Secret>::namespaced(admin.clone(), NS)
        .get(&secret_name)
        .await?;
    let token = String::from_utf8(secret.data.context("no token")?["token"].0.clone())?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig)?,
        &Default::default(),
    )
    .await?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    if config.auth_info.token.is_none() {
        bail!("no token");
    }
    Ok(kube::Client::try_from(config)?)
}
