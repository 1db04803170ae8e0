//! What every cloud client shares and neither cloud owns: the API key type, the TLS
//! configuration, and the rendering of an error with its causes.

use std::fmt;
use std::sync::Arc;

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

/// TLS for cloud APIs: the ring provider, TLS 1.2+, the Mozilla roots compiled in.
pub(crate) fn tls_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

#[cfg(test)]
mod tests {
    use super::*;

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
