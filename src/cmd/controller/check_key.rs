//! `runpod-kubelet controller check-key`: one list call with the node's key, before anything is
//! installed (the chart's pre-install and pre-upgrade hook), so that a wrong key stops `helm
//! install` at once with a message naming the Secret, instead of a controller that never gets
//! ready. Needs no Kubernetes access. A cloud that cannot be reached does not stop the install
//! (the controller reports an outage on its node); only a refusal does.

use anyhow::Context as _;
use runpod_kubelet::provider::{Provider, ProviderError};
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;
use runpod_kubelet::vastai::provider::VastaiProvider;

use super::args::{CheckKeyArgs, CloudArg, key_source};

pub async fn run(args: CheckKeyArgs) -> anyhow::Result<()> {
    let source = key_source(args.provider, args.api_key_secret.as_deref());
    let listed = match args.provider {
        CloudArg::Runpod => {
            let client = args
                .runpod
                .client(&args.cloud_ca)
                .with_context(|| format!("the API key from {source}"))?;
            let limits = ClusterLimits {
                max_gpu_price: 0.0,
                data_center_ids: vec![],
                cloud_types: Vec::new(),
            };
            let provider = RunPodProvider::new(
                client,
                CatalogueCache::new(),
                limits,
                "check-key".into(),
                args.nodename.clone(),
            );
            provider.list().await.map(|_| provider.cloud().title)
        }
        CloudArg::Vastai => {
            let client = args
                .vastai
                .client(&args.cloud_ca)
                .with_context(|| format!("the API key from {source}"))?;
            let provider = VastaiProvider::new(
                client,
                Default::default(),
                "check-key".into(),
                args.nodename.clone(),
            );
            provider.list().await.map(|_| provider.cloud().title)
        }
    };
    match listed {
        Ok(cloud) => {
            tracing::info!(node = %args.nodename, "{cloud} accepts the API key from {source}");
            Ok(())
        }
        Err(ProviderError::KeyRefused(message) | ProviderError::Account(message)) => {
            anyhow::bail!(
                "node {}: the cloud refused the API key from {source}: {message}. Nothing was \
                 installed: put the right key into that Secret (or fix the account) and run \
                 helm again",
                args.nodename
            )
        }
        Err(ProviderError::Unavailable(message)) => {
            tracing::warn!(node = %args.nodename, %message, "the cloud could not be asked about the key; the controller will report it on its node");
            Ok(())
        }
    }
}
