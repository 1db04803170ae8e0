//! `runpod-kubelet controller drain`: the uninstall hook (and an operator's command) that
//! terminates every instance of this cluster and node, removes the node, and releases the
//! controller Deployment's drain finalizer.

use std::time::Duration;

use anyhow::Context as _;
use runpod_kubelet::controller;
use runpod_kubelet::controller::node::drain::DrainConfig;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;
use runpod_kubelet::vastai::provider::VastaiProvider;

use super::args::{self, CloudArg, DrainArgs};
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
        adoption_namespace: args::adoption_namespace(args.adoption_namespace.as_deref()),
    };
    let report = match args.provider {
        CloudArg::Runpod => {
            let runpod_client = args
                .runpod
                .client(&args.cloud_ca)
                .context("configuring the RunPod client")?;
            let provider = RunPodProvider::new(
                runpod_client,
                CatalogueCache::new(),
                ClusterLimits {
                    max_gpu_price: 0.0,
                    data_center_ids: vec![],
                    cloud_types: Vec::new(),
                },
                config.cluster_id.clone(),
                args.nodename.clone(),
            );
            controller::node::drain::drain(client.clone(), &provider, &config).await?
        }
        CloudArg::Vastai => {
            let vast_client = args
                .vastai
                .client(&args.cloud_ca)
                .context("configuring the Vast.ai client")?;
            let provider = VastaiProvider::new(
                vast_client,
                Default::default(),
                config.cluster_id.clone(),
                args.nodename.clone(),
            );
            controller::node::drain::drain(client.clone(), &provider, &config).await?
        }
    };
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
