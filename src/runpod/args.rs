//! Command-line settings of the RunPod client, shared by every subcommand that talks to
//! RunPod. The API key is deliberately not among them: it comes from `RUNPOD_API_KEY` only.

use std::time::Duration;

use clap::Args;

use super::client::RunPodClient;
use super::config::{ClientConfig, ConfigError, api_key_from_env};

/// `--runpod-*` flags.
#[derive(Debug, Clone, Args)]
pub struct RunPodArgs {
    /// RunPod API server root; `/v2/...` is appended (point it at the simulator in tests).
    #[arg(
        long,
        default_value = "https://api.runpod.io",
        env = "RUNPOD_KUBELET_RUNPOD_API_URL"
    )]
    pub runpod_api_url: String,
    /// Per-request timeout for RunPod calls.
    #[arg(long, default_value = "30s", value_parser = crate::flags::positive_duration, env = "RUNPOD_KUBELET_RUNPOD_TIMEOUT")]
    pub runpod_timeout: Duration,
    /// Requests per minute assumed until RunPod's `RateLimit-Policy` header says otherwise.
    #[arg(
        long,
        default_value_t = 60,
        value_parser = clap::value_parser!(u32).range(1..),
        env = "RUNPOD_KUBELET_RUNPOD_REQUESTS_PER_MINUTE"
    )]
    pub runpod_requests_per_minute: u32,
}

impl RunPodArgs {
    /// The client configuration these flags describe.
    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            api_url: self.runpod_api_url.clone(),
            request_timeout: self.runpod_timeout,
            requests_per_minute: self.runpod_requests_per_minute,
            ..ClientConfig::default()
        }
    }

    /// A client with the key from `RUNPOD_API_KEY`, trusting `ca` besides the compiled-in roots.
    pub fn client(&self, ca: &crate::http::CloudCaArgs) -> Result<RunPodClient, ConfigError> {
        let config = ClientConfig {
            ca_file: ca.cloud_ca_file.clone(),
            ..self.client_config()
        };
        RunPodClient::new(config, api_key_from_env()?)
    }
}
