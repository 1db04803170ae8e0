//! Command-line settings of the Vast.ai client. The API key is not among them: it comes from
//! `VAST_API_KEY` only.

use std::time::Duration;

use clap::Args;

use runpod_contract::vastai::VastPolicy;

use super::client::{ConfigError, VastClient, VastConfig, VastKey};
use super::limiter::Paces;

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
    #[arg(long, default_value = "30s", value_parser = crate::flags::seconds_or_duration, env = "RUNPOD_KUBELET_VASTAI_TIMEOUT")]
    pub vastai_timeout: Duration,
    /// How long Vast.ai's reads may lag a create (undocumented): after an unclear create, and
    /// after a restart with a create on record, nothing is bought for the pod until label
    /// lookups this long after it found none.
    #[arg(long, default_value = "2m", value_parser = crate::flags::seconds_or_duration, env = "RUNPOD_KUBELET_VASTAI_READ_LAG")]
    pub vastai_read_lag: Duration,
    /// For tests against a simulator only: the client's pacing of Vast.ai's documented
    /// per-route limits, divided by this (keep 1 against Vast.ai itself)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000), env = "RUNPOD_KUBELET_VASTAI_PACE_DIVISOR")]
    pub vastai_pace_divisor: u32,
}

impl VastArgs {
    pub fn client_config(&self) -> VastConfig {
        let mut config = VastConfig {
            api_url: self.vastai_api_url.clone(),
            request_timeout: self.vastai_timeout,
            paces: Paces::default().divided(self.vastai_pace_divisor),
            ..VastConfig::default()
        };
        // The label lookups after an unclear create span the read lag.
        let retry = &mut config.retry;
        let gaps = retry.lookup_attempts.saturating_sub(1).max(1);
        retry.lookup_interval = self.vastai_read_lag / gaps;
        config
    }

    /// A client with the key from `VAST_API_KEY`, trusting `ca` besides the compiled-in roots.
    pub fn client(&self, ca: &crate::http::CloudCaArgs) -> Result<VastClient, ConfigError> {
        let config = VastConfig {
            ca_file: ca.cloud_ca_file.clone(),
            ..self.client_config()
        };
        VastClient::new(config, VastKey::from_env()?)
    }
}

/// The installation's Vast.ai policy, taken by the webhook (refusals at admission) and the
/// controller (offers searched and re-checked only inside it).
#[derive(Debug, Clone, Args)]
pub struct VastPolicyArgs {
    /// Regions Vast.ai instances may run in (`Europe,North America`; case, `_` and spaces
    /// ignored); empty: anywhere. Not with `--vastai-countries`.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_VASTAI_REGIONS")]
    pub vastai_regions: Vec<String>,
    /// ISO country codes Vast.ai instances may run in (comma-separated); empty: anywhere.
    #[arg(long, value_delimiter = ',', action = clap::ArgAction::Set, env = "RUNPOD_KUBELET_VASTAI_COUNTRIES")]
    pub vastai_countries: Vec<String>,
    /// Only hosts in Vast.ai's datacenter tier ("Secure Cloud").
    #[arg(
        long,
        default_value_t = false,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        env = "RUNPOD_KUBELET_VASTAI_DATACENTER_ONLY"
    )]
    pub vastai_datacenter_only: bool,
    /// Only verified hosts.
    #[arg(
        long,
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        env = "RUNPOD_KUBELET_VASTAI_VERIFIED_ONLY"
    )]
    pub vastai_verified_only: bool,
    /// Lowest host reliability accepted (0 to 1).
    #[arg(
        long,
        default_value_t = 0.98,
        env = "RUNPOD_KUBELET_VASTAI_MIN_RELIABILITY"
    )]
    pub vastai_min_reliability: f64,
}

impl VastPolicyArgs {
    /// The policy, with `--max-gpu-price` as the price cap per GPU.
    pub fn policy(&self, max_gpu_price: f64) -> Result<VastPolicy, String> {
        VastPolicy::from_flags(
            &self.vastai_regions,
            &self.vastai_countries,
            self.vastai_datacenter_only,
            self.vastai_verified_only,
            self.vastai_min_reliability,
            Some(max_gpu_price),
        )
    }
}
