//! What every cloud client shares and neither cloud owns: the API key type, the TLS
//! configuration, the retry policy, and the rendering of an error with its causes.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Backoff and lookup timings of a cloud client. No default: each cloud names its own
/// (`runpod::config::retry_policy`, `vastai::client::retry_policy`), whose lists lag differently.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Tries per request (and per placement candidate) for transient failures (429, 5xx,
    /// timeouts) where repeating is safe.
    pub attempts: u32,
    /// First backoff after a failure; doubles, jittered, up to `max_delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// After an ambiguous create: lookups, this far apart, before anything else is tried;
    /// together longer than the cloud's list can lag behind a create.
    pub lookup_attempts: u32,
    pub lookup_interval: Duration,
}

impl RetryPolicy {
    /// Full-jitter exponential backoff for attempt `n` (0-based): between half and all of
    /// `base_delay × 2ⁿ`, capped at `max_delay`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let ceiling = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(attempt.min(16)))
            .min(self.max_delay);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(fastrand::u64(millis / 2..=millis.max(1)))
    }
}

/// Why a cloud's API root or HTTP client cannot be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    /// The API URL (given by `flag`) is not an http(s) base URL.
    #[error("{flag} {url:?} is not an http(s) URL: {reason}")]
    BadUrl {
        flag: &'static str,
        url: String,
        reason: String,
    },
    /// The HTTP client cannot be built (TLS roots, the builder).
    #[error("could not build the HTTP client: {0}")]
    Http(String),
}

/// A cloud API's root URL and its HTTP client: rustls with the compiled-in roots plus
/// `ca_file`, the connect timeout, and TCP keepalive when calls may idle for long stretches.
pub fn api_client(
    flag: &'static str,
    api_url: &str,
    ca_file: Option<&Path>,
    connect_timeout: Duration,
    keepalive: Option<Duration>,
) -> Result<(reqwest::Url, reqwest::Client), SetupError> {
    let bad_url = |reason: String| SetupError::BadUrl {
        flag,
        url: api_url.to_owned(),
        reason,
    };
    let root = reqwest::Url::parse(api_url.trim()).map_err(|e| bad_url(e.to_string()))?;
    if !matches!(root.scheme(), "http" | "https") || root.cannot_be_a_base() {
        return Err(bad_url("the scheme must be http or https".to_owned()));
    }
    let tls = tls_config(ca_file).map_err(SetupError::Http)?;
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(connect_timeout)
        .user_agent(concat!("runpod-kubelet/", env!("CARGO_PKG_VERSION")));
    if let Some(keepalive) = keepalive {
        builder = builder.tcp_keepalive(keepalive);
    }
    let http = builder
        .build()
        .map_err(|e| SetupError::Http(e.to_string()))?;
    Ok((root, http))
}

/// A cloud's bearer key. Its `Debug` is redacted and it has no `Display`, so it cannot end up
/// in a log line or an error message by accident.
#[derive(Clone)]
pub struct ApiKey(String);

/// Why a key cannot be used; each cloud's configuration error names its own variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the API key is not set or empty")]
    Missing,
    #[error("the API key contains characters that cannot be sent in an HTTP header")]
    Malformed,
}

impl ApiKey {
    /// Checks the key can be sent as a header value.
    pub fn new(key: String) -> Result<ApiKey, KeyError> {
        let key = key.trim().to_owned();
        if key.is_empty() {
            return Err(KeyError::Missing);
        }
        if !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(KeyError::Malformed);
        }
        Ok(ApiKey(key))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// The error and its sources, e.g. "error sending request: connection refused".
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `--cloud-ca-file`, taken by every command that calls a cloud.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CloudCaArgs {
    /// PEM file of CA certificates trusted for the cloud APIs besides the compiled-in roots
    /// (a TLS-inspecting egress gateway). The proxy itself comes from `HTTPS_PROXY`/`NO_PROXY`.
    #[arg(long, env = "RUNPOD_KUBELET_CLOUD_CA_FILE")]
    pub cloud_ca_file: Option<std::path::PathBuf>,
}

/// TLS for cloud APIs: the ring provider, TLS 1.2+, the Mozilla roots compiled in, plus the PEM
/// roots of `--cloud-ca-file` (a TLS-inspecting gateway's CA).
pub(crate) fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig, String> {
    let mut roots =
        rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = ca_file {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("--cloud-ca-file {shown}: {e}"))?;
        let mut found = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| format!("--cloud-ca-file {shown}: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("--cloud-ca-file {shown}: {e}"))?;
            found += 1;
        }
        if found == 0 {
            return Err(format!(
                "--cloud-ca-file {shown}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it"
            ));
        }
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_api_url_is_named_with_its_flag() {
        for url in ["not a url", "ftp://x", "mailto:a@b"] {
            let error = api_client("--x-api-url", url, None, Duration::from_secs(1), None)
                .err()
                .unwrap();
            let text = error.to_string();
            assert!(text.starts_with(&format!("--x-api-url {url:?}")), "{text}");
        }
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (root, _) = api_client(
            "--x-api-url",
            " https://api.example ",
            None,
            Duration::from_secs(1),
            None,
        )
        .unwrap();
        assert_eq!(root.as_str(), "https://api.example/");
    }

    #[test]
    fn backoff_grows_jittered_and_is_capped() {
        let policy = RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            lookup_attempts: 1,
            lookup_interval: Duration::from_secs(1),
        };
        for attempt in 0..20 {
            let delay = policy.backoff(attempt);
            let ceiling = Duration::from_millis(1_000 * 2u64.pow(attempt.min(5)))
                .min(Duration::from_secs(30));
            assert!(
                delay <= ceiling && delay >= ceiling / 2,
                "{attempt}: {delay:?}"
            );
        }
    }

    /// `--cloud-ca-file` adds roots; a missing, empty or garbled file is a start-up error naming
    /// the flag and the file, never a silent fallback to the compiled-in roots.
    #[test]
    fn the_cloud_ca_file_adds_roots_or_fails_clearly() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["gateway.corp".to_owned()]).unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, ca.cert.pem()).unwrap();
        assert!(tls_config(Some(&good)).is_ok());
        assert!(tls_config(None).is_ok());

        let missing = dir.path().join("missing.pem");
        let error = tls_config(Some(&missing)).unwrap_err();
        assert!(
            error.starts_with("--cloud-ca-file ") && error.contains("missing.pem"),
            "{error}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = tls_config(Some(&empty)).unwrap_err();
        assert!(error.contains("no PEM certificate"), "{error}");
        let garbled = dir.path().join("garbled.pem");
        std::fs::write(
            &garbled,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(tls_config(Some(&garbled)).is_err());
    }

    #[test]
    fn keys_are_trimmed_checked_and_never_printed() {
        let key = ApiKey::new("  rpa_SECRET \n".to_owned()).unwrap();
        assert_eq!(key.expose(), "rpa_SECRET");
        assert!(!format!("{key:?}").contains("SECRET"));
        assert_eq!(ApiKey::new(" ".to_owned()).unwrap_err(), KeyError::Missing);
        assert_eq!(
            ApiKey::new("a b".to_owned()).unwrap_err(),
            KeyError::Malformed
        );
    }
}
