//! `runpod-kubelet controller check-key`: one list call with the node's key, before anything is
//! installed (the chart's pre-install and pre-upgrade hook), so that a wrong key stops `helm
//! install` at once with a message naming the Secret, instead of a controller that never gets
//! ready. Needs no Kubernetes access. A cloud that cannot be reached does not stop the install
//! (the controller reports an outage on its node); only a refusal does.

use runpod_kubelet::provider::{Provider, ProviderError};
use std::sync::Arc;

use super::args::CheckKeyArgs;
use super::clouds::{Owner, WithProvider};

/// One list call with the provider's key: the cloud's title, or why it refused.
struct ListOnce;

impl WithProvider for ListOnce {
    type Output = Result<&'static str, ProviderError>;
    async fn with<P: Provider>(self, provider: Arc<P>) -> anyhow::Result<Self::Output> {
        Ok(provider.list().await.map(|_| provider.cloud().title))
    }
}

pub(super) async fn run(args: CheckKeyArgs) -> anyhow::Result<()> {
    let source = args.cloud.key_source();
    let owner = Owner {
        cluster_id: "check-key",
        node: &args.nodename,
    };
    let listed = args.cloud.provide(owner, None, ListOnce).await?;
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
