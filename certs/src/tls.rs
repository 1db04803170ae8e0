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

/// A client configuration trusting only the given PEM CA bundle (tests, benchmarks, probes).
pub fn client_config(
    ca_bundle_pem: &str,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, CertError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut std::io::BufReader::new(ca_bundle_pem.as_bytes())) {
        let cert = cert.map_err(|source| CertError::Pem {
            path: "<ca bundle>".to_owned(),
            source,
        })?;
        roots.add(cert)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}
