//! A controller removed by anything (a `helm upgrade` that drops a node, Argo CD or Flux pruning
//! it, `kubectl delete`) drains its node before it goes, without Helm's `lookup` or hooks. The
//! chart renders the controller's Deployment with the finalizer [`FINALIZER`]: deleting it
//! leaves it (and, under the default background deletion, its ReplicaSet and pods) in place
//! until the leader has drained the node (every instance terminated, the node removed) and
//! released the finalizer. A drain that fails is tried again; nothing is released while
//! anything may bill.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use tracing::{info, warn};

use crate::controller::node::drain::{self, DrainConfig};
use crate::provider::Provider;

/// Held on the controller's Deployment until its node is drained.
pub const FINALIZER: &str = "runpod.io/drain";

/// How often the Deployment is looked at.
const LOOK_EVERY: Duration = Duration::from_secs(5);
/// Pause after a failed drain.
const RETRY: Duration = Duration::from_secs(30);

/// The Deployment that runs this controller (`--owner-deployment NAMESPACE/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerDeployment {
    pub namespace: String,
    pub name: String,
}

impl OwnerDeployment {
    /// `NAMESPACE/NAME`, both non-empty.
    pub fn parse(value: &str) -> Result<OwnerDeployment, String> {
        match value.trim().split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => {
                Ok(OwnerDeployment {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{value:?} is not NAMESPACE/NAME")),
        }
    }
}

/// What one look at the Deployment calls for.
#[derive(Debug, PartialEq, Eq)]
pub enum Removal {
    /// Not being deleted (or our finalizer is not on it): nothing to do.
    Keep,
    /// Deleted while our finalizer holds it: drain, then release.
    Drain,
    /// Gone: nothing is held any more.
    Gone,
}

/// Decides from the Deployment (`None`: it no longer exists).
pub fn removal(deployment: Option<&Deployment>) -> Removal {
    let Some(deployment) = deployment else {
        return Removal::Gone;
    };
    let held = deployment
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == FINALIZER);
    if deployment.metadata.deletion_timestamp.is_some() && held {
        Removal::Drain
    } else {
        Removal::Keep
    }
}

/// Watches the Deployment until it is gone; when it is deleted, drains the node and releases
/// the finalizer. Runs on the leader only (one drain at a time).
pub async fn hold<P: Provider>(
    client: kube::Client,
    owner: OwnerDeployment,
    provider: std::sync::Arc<P>,
    config: DrainConfig,
) {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &owner.namespace);
    loop {
        let deployment = match deployments.get_opt(&owner.name).await {
            Ok(deployment) => deployment,
            Err(error) => {
                warn!(%error, deployment = %owner.name, "reading the controller's Deployment failed");
                tokio::time::sleep(LOOK_EVERY).await;
                continue;
            }
        };
        match removal(deployment.as_ref()) {
            Removal::Keep => tokio::time::sleep(LOOK_EVERY).await,
            Removal::Gone => return,
            Removal::Drain => {
                info!(deployment = %owner.name, node = %config.node_name, "this controller's Deployment is being deleted: draining its node before it goes");
                match drain::drain(client.clone(), &*provider, &config).await {
                    Ok(report) => {
                        info!(
                            terminated = report.terminated.len(),
                            node_removed = report.node_removed,
                            "drained; releasing the Deployment"
                        );
                        match release(&deployments, &owner.name, deployment.as_ref()).await {
                            Ok(()) => return,
                            Err(error) => {
                                warn!(%error, "releasing the Deployment's finalizer failed; retrying");
                                tokio::time::sleep(LOOK_EVERY).await;
                            }
                        }
                    }
                    Err(error) => {
                        warn!(%error, retry_in = ?RETRY, "draining before removal failed; the Deployment is held");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
        }
    }
}

/// After a drain that succeeded elsewhere (`controller drain`, the uninstall hook, which runs
/// while the release's RBAC still exists): releases the Deployment so its deletion goes on at
/// once. A Deployment that is gone, or never carried the finalizer, is fine.
pub async fn release_after_drain(
    client: &kube::Client,
    owner: &OwnerDeployment,
) -> Result<(), kube::Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &owner.namespace);
    let deployment = deployments.get_opt(&owner.name).await?;
    release(&deployments, &owner.name, deployment.as_ref()).await
}

/// Removes our finalizer, keeping any other; the resourceVersion makes it fail (and be tried
/// again from a fresh read) if the list changed meanwhile.
async fn release(
    deployments: &Api<Deployment>,
    name: &str,
    seen: Option<&Deployment>,
) -> Result<(), kube::Error> {
    let Some(seen) = seen.filter(|d| {
        d.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    }) else {
        return Ok(());
    };
    let finalizers: Vec<&String> = seen
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": seen.metadata.resource_version,
    }});
    deployments
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(deleted: bool, finalizers: &[&str]) -> Deployment {
        let mut deployment = Deployment::default();
        deployment.metadata.finalizers = Some(finalizers.iter().map(|f| (*f).to_owned()).collect());
        if deleted {
            deployment.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        deployment
    }

    #[test]
    fn only_a_deleted_deployment_that_we_hold_is_drained() {
        assert_eq!(removal(None), Removal::Gone);
        assert_eq!(
            removal(Some(&deployment(false, &[FINALIZER]))),
            Removal::Keep
        );
        assert_eq!(
            removal(Some(&deployment(true, &[FINALIZER]))),
            Removal::Drain
        );
        assert_eq!(
            removal(Some(&deployment(true, &["other.io/x", FINALIZER]))),
            Removal::Drain
        );
        // Deleted, but not held by us: whoever removed the finalizer decided.
        assert_eq!(
            removal(Some(&deployment(true, &["other.io/x"]))),
            Removal::Keep
        );
    }

    #[test]
    fn the_owner_is_named_namespace_slash_name() {
        assert_eq!(
            OwnerDeployment::parse("runpod-system/r-runpod-kubelet-controller"),
            Ok(OwnerDeployment {
                namespace: "runpod-system".into(),
                name: "r-runpod-kubelet-controller".into(),
            })
        );
        assert!(OwnerDeployment::parse("nope").is_err());
    }
}
