//! The rustls server configuration shared by every HTTPS listener of the project.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::ResolvesServerCert;

use crate::CertError;

/// TLS 1.2 and 1.3 only, ALPN h2 then http/1.1, certificates from `resolver` at every handshake.
pub fn server_config(resolver: Arc<dyn ResolvesServerCert>) -> Result<ServerConfig, CertError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
