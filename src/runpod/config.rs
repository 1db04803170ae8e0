//! The RunPod client's settings: where the key comes from, the API root, timeouts, the assumed
//! quota and the retry timings, and what can be wrong with them at start-up.

use std::time::Duration;

use crate::http::{ApiKey, KeyError};

/// The environment variable holding the key; never a flag, so it stays out of `ps` output.
pub const API_KEY_ENV: &str = "RUNPOD_API_KEY";

/// Start-up problems with the client configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "{API_KEY_ENV} is not set or empty; put the RunPod API key in that variable (from a Secret)"
    )]
    MissingKey,
    #[error("{API_KEY_ENV} contains characters that cannot be sent in an HTTP header")]
    MalformedKey,
    #[error(transparent)]
    Setup(#[from] crate::http::SetupError),
}

impl From<KeyError> for ConfigError {
    fn from(error: KeyError) -> Self {
        match error {
            KeyError::Missing => ConfigError::MissingKey,
            KeyError::Malformed => ConfigError::MalformedKey,
        }
    }
}

/// Reads the key from `RUNPOD_API_KEY`.
pub fn api_key_from_env() -> Result<ApiKey, ConfigError> {
    let key = std::env::var(API_KEY_ENV).map_err(|_| ConfigError::MissingKey)?;
    Ok(ApiKey::new(key)?)
}

pub use crate::http::RetryPolicy;

/// RunPod's timings: its lists lag a create by seconds.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        base_delay: Duration::from_millis(500),
        max_delay: Duration::from_secs(10),
        lookup_attempts: 4,
        lookup_interval: Duration::from_secs(2),
    }
}

/// Client settings, from the controller's flags.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server root, e.g. `https://api.runpod.io`; paths `/v2/...` are appended.
    pub api_url: String,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// The quota assumed until the service's `RateLimit-Policy` header says otherwise.
    pub requests_per_minute: u32,
    pub retry: RetryPolicy,
    /// PEM roots added to the compiled-in ones (`--cloud-ca-file`).
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            api_url: "https://api.runpod.io".to_owned(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            requests_per_minute: 60,
            retry: retry_policy(),
            ca_file: None,
        }
    }
}
