//! Command-line settings of the Vast.ai client. The API key is not among them: it comes from
//! `VAST_API_KEY` only.

use std::time::Duration;

use clap::Args;

use super::client::{ConfigError, VastClient, VastConfig, VastKey};

/// `--vastai-*` client flags.
#[derive(Debug, Clone, Args)]
pub struct VastArgs {
    /// Vast.ai server root; `/api/v0/...` and `/api/v1/...` are appended (point it at the
    /// simulator in tests).
    #[arg(
        long,
        default_value = "https://console.vast.ai",
        env = "RUNPOD_KUBELET_VASTAI_API_URL"
    )]
    pub vastai_api_url: String,
    /// Per-request timeout for Vast.ai calls.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, env = "RUNPOD_KUBELET_VASTAI_TIMEOUT")]
    pub vastai_timeout: Duration,
}

impl VastArgs {
    pub fn client_config(&self) -> VastConfig {
        VastConfig {
            api_url: self.vastai_api_url.clone(),
            request_timeout: self.vastai_timeout,
            ..VastConfig::default()
        }
    }

    /// A client with the key from `VAST_API_KEY`.
    pub fn client(&self) -> Result<VastClient, ConfigError> {
        VastClient::new(self.client_config(), VastKey::from_env()?)
    }
}
