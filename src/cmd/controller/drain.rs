//! `runpod-kubelet controller drain`: the uninstall hook (and an operator's command) that
//! terminates every instance of this cluster and node, removes the node, and releases the
//! controller Deployment's drain finalizer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use runpod_kubelet::controller;
use runpod_kubelet::controller::node::drain::DrainConfig;
use runpod_kubelet::controller::node::drain::DrainReport;
use runpod_kubelet::provider::Provider;

use super::args::{self, DrainArgs};
use super::clouds::{Owner, WithProvider};
use super::{cluster_id, kube_client};

/// `controller drain`.
pub(super) async fn run(args: DrainArgs) -> anyhow::Result<()> {
    let (client, _) = kube_client(args.kubeconfig.as_ref()).await?;
    let cluster_id = cluster_id(&client, args.cluster_id.as_deref()).await?;
    tracing::info!(node = %args.nodename, cluster_id = %cluster_id, timeout = ?args.timeout, "draining");
    let config = DrainConfig {
        node_name: args.nodename.clone(),
        cluster_id,
        timeout: args.timeout,
        poll_interval: Duration::from_secs(2),
        ack_wait: Duration::from_secs(60),
        create_settle: args.create_settle,
        adoption_namespace: args::adoption_namespace(args.adoption_namespace.as_deref()),
    };
    let owner = Owner {
        cluster_id: &config.cluster_id,
        node: &args.nodename,
    };
    let report = args
        .cloud
        .provide(
            owner,
            None,
            Drain {
                client: client.clone(),
                config: &config,
            },
        )
        .await?;
    if let Some(owner) = &args.owner_deployment {
        controller::node::removal::release_after_drain(&client, owner)
            .await
            .context("releasing the controller Deployment's drain finalizer")?;
    }
    tracing::info!(
        terminated = report.terminated.len(),
        pods_removed = report.pods_removed,
        node_removed = report.node_removed,
        foreign_node = report.foreign_node,
        "drained: nothing of this cluster and node bills any more"
    );
    Ok(())
}

/// The drain itself, with whichever cloud the node runs on.
struct Drain<'a> {
    client: kube::Client,
    config: &'a DrainConfig,
}

impl WithProvider for Drain<'_> {
    type Output = DrainReport;
    async fn with<P: Provider>(self, provider: Arc<P>) -> anyhow::Result<DrainReport> {
        Ok(controller::node::drain::drain(self.client, &*provider, self.config).await?)
    }
}
