//! The one place that names the clouds a node can run on. Every controller subcommand (serving a
//! node, `drain`, `check-key`) takes the same cloud flags and gets its provider here; what it
//! then does with the provider is cloud-blind (`WithProvider`).
//!
//! A third cloud is its folder under `src/` (its flags, its client, a `Provider`), a `CloudArg`
//! value, its flags flattened into `CloudFlags`, and one arm in `CloudFlags::provide`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use runpod_kubelet::provider::CloudName;
use runpod_kubelet::provider::Provider;
use runpod_kubelet::provider::metrics::CloudApiMetrics;
use runpod_kubelet::runpod::args::RunPodArgs;
use runpod_kubelet::runpod::catalogue_cache::CatalogueCache;
use runpod_kubelet::runpod::metrics::RunPodMetrics;
use runpod_kubelet::runpod::provider::RunPodProvider;
use runpod_kubelet::runpod::select::ClusterLimits;
use runpod_kubelet::vastai::args::VastArgs;
use runpod_kubelet::vastai::provider::VastaiProvider;
use runpod_webhook::policy::PolicyConfig;

/// The cloud a controller runs its node's pods on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum CloudArg {
    Runpod,
    Vastai,
}

/// The flags that choose and reach a node's cloud, the same for every subcommand.
#[derive(Debug, Clone, Args)]
pub(crate) struct CloudFlags {
    /// The cloud this node's pods run on: `runpod`, or `vastai` (key from `VAST_API_KEY`).
    #[arg(
        long,
        value_enum,
        default_value = "runpod",
        env = "RUNPOD_KUBELET_PROVIDER"
    )]
    pub provider: CloudArg,
    #[command(flatten)]
    pub runpod: RunPodArgs,
    #[command(flatten)]
    pub vastai: VastArgs,
    #[command(flatten)]
    pub cloud_ca: runpod_kubelet::http::CloudCaArgs,
    /// Where the API key comes from, named in the messages of a refused key (the chart passes
    /// `namespace/secret (key NAME)`); default: the environment variable.
    #[arg(long, env = "RUNPOD_KUBELET_API_KEY_SECRET")]
    pub api_key_secret: Option<String>,
}

/// What is known of a cloud before its provider is built.
struct CloudTraits {
    /// The environment variable its API key is read from.
    key_env: &'static str,
    /// Whether `--datacenter-ids` is this cloud's.
    datacenter_ids: bool,
}

/// Who the provider acts for: the tag its instances carry.
pub(super) struct Owner<'a> {
    pub cluster_id: &'a str,
    pub node: &'a str,
}

/// What a serving node adds to a one-shot's provider: API metrics, the placement limits and
/// the background refreshers.
pub(super) struct Serving {
    pub runpod_metrics: Arc<RunPodMetrics>,
    pub cloud_api: Arc<CloudApiMetrics>,
    pub limits: ClusterLimits,
    pub vastai: runpod_contract::vastai::VastPolicy,
}

/// A job that runs with whichever provider the flags chose.
pub(super) trait WithProvider {
    type Output;
    async fn with<P: Provider>(self, provider: Arc<P>) -> anyhow::Result<Self::Output>;
}

impl CloudFlags {
    /// Where the node's key comes from, for messages.
    pub(super) fn key_source(&self) -> String {
        match self.api_key_secret.as_deref().map(str::trim) {
            Some(secret) if !secret.is_empty() => format!("Secret {secret}"),
            _ => format!("the {} environment variable", self.traits().key_env),
        }
    }

    /// What is known of the cloud before its provider is built.
    fn traits(&self) -> CloudTraits {
        match self.provider {
            CloudArg::Runpod => CloudTraits {
                key_env: runpod_kubelet::runpod::config::API_KEY_ENV,
                datacenter_ids: true,
            },
            CloudArg::Vastai => CloudTraits {
                key_env: runpod_kubelet::vastai::client::API_KEY_ENV,
                datacenter_ids: false,
            },
        }
    }

    /// The admission rules a node of this cloud repeats: `--datacenter-ids` names RunPod's
    /// datacenters, so a node of another cloud does not judge its pods by them.
    pub(super) fn node_admission(&self, mut admission: PolicyConfig) -> PolicyConfig {
        if !self.traits().datacenter_ids {
            admission.allowed_datacenters.clear();
        }
        admission
    }

    /// Builds the chosen cloud's provider (for a serving node with `serving`) and runs `job`
    /// with it.
    pub(super) async fn provide<J: WithProvider>(
        &self,
        owner: Owner<'_>,
        serving: Option<Serving>,
        job: J,
    ) -> anyhow::Result<J::Output> {
        match self.provider {
            CloudArg::Runpod => job.with(self.runpod(owner, serving)?).await,
            CloudArg::Vastai => job.with(self.vastai(owner, serving)?).await,
        }
    }

    /// A RunPod node: its client, catalogue and placement limits.
    fn runpod(
        &self,
        owner: Owner<'_>,
        serving: Option<Serving>,
    ) -> anyhow::Result<Arc<RunPodProvider>> {
        let client = self.runpod.client(&self.cloud_ca).with_context(|| {
            format!(
                "configuring the RunPod client (key from {})",
                self.key_source()
            )
        })?;
        let catalogue = CatalogueCache::new();
        let (client, limits) = match serving {
            Some(serving) => {
                let client = client.with_metrics(serving.runpod_metrics);
                catalogue.spawn_refresher(client.clone(), Duration::from_secs(300));
                (client, serving.limits)
            }
            None => (client, ClusterLimits::default()),
        };
        Ok(Arc::new(RunPodProvider::new(
            client,
            catalogue,
            limits,
            owner.cluster_id.to_owned(),
            owner.node.to_owned(),
        )))
    }

    /// A Vast.ai node: its client, its label's limits and its price refresher.
    fn vastai(
        &self,
        owner: Owner<'_>,
        serving: Option<Serving>,
    ) -> anyhow::Result<Arc<VastaiProvider>> {
        let client = self.vastai.client(&self.cloud_ca).with_context(|| {
            format!(
                "configuring the Vast.ai client (key from {})",
                self.key_source()
            )
        })?;
        // Every instance's label names the cluster and the node: refuse ids it cannot hold.
        runpod_kubelet::vastai::label::Label::new(owner.cluster_id, owner.node, "pod-uid")
            .map_err(anyhow::Error::msg)
            .context("--cluster-id and --nodename must fit in a Vast.ai label")?;
        let Some(serving) = serving else {
            return Ok(Arc::new(VastaiProvider::new(
                client,
                Default::default(),
                owner.cluster_id.to_owned(),
                owner.node.to_owned(),
            )));
        };
        let provider = Arc::new(VastaiProvider::new(
            client.with_metrics(serving.cloud_api.for_provider(CloudName::VASTAI.name)),
            serving.vastai,
            owner.cluster_id.to_owned(),
            owner.node.to_owned(),
        ));
        provider.spawn_price_refresher(Duration::from_secs(300));
        Ok(provider)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        cloud: CloudFlags,
    }

    fn flags(args: &[&str]) -> CloudFlags {
        let mut argv = vec!["test"];
        argv.extend_from_slice(args);
        Flags::parse_from(argv).cloud
    }

    #[test]
    fn the_key_source_names_the_secret_or_the_clouds_variable() {
        assert_eq!(
            flags(&["--api-key-secret", " ns/key (key K) "]).key_source(),
            "Secret ns/key (key K)"
        );
        assert_eq!(
            flags(&[]).key_source(),
            "the RUNPOD_API_KEY environment variable"
        );
        assert_eq!(
            flags(&["--provider", "vastai", "--api-key-secret", " "]).key_source(),
            "the VAST_API_KEY environment variable"
        );
    }

    #[test]
    fn only_a_runpod_node_judges_pods_by_the_datacenter_list() {
        let admission = PolicyConfig {
            allowed_datacenters: vec!["EU-RO-1".into()],
            ..Default::default()
        };
        let runpod = flags(&[]).node_admission(admission.clone());
        assert_eq!(runpod.allowed_datacenters, ["EU-RO-1"]);
        let vastai = flags(&["--provider", "vastai"]).node_admission(admission);
        assert!(vastai.allowed_datacenters.is_empty());
    }
}
