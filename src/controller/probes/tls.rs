//! TLS for HTTPS probes and hooks as the kubelet runs them: the container's certificate is not
//! checked (the kubelet's probes skip verification: the container is the one it runs, reached
//! over its own loopback), but the handshake's signatures are, so the session is real TLS.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

/// Accepts any certificate chain; verifies the handshake's signatures with the provider's
/// algorithms.
#[derive(Debug)]
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// The client configuration of every HTTPS probe (built once): TLS 1.2 or 1.3, HTTP/1.1.
pub(crate) fn probe_config() -> Result<Arc<ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let algorithms = provider.signature_verification_algorithms;
            let config = ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|error| format!("TLS for HTTPS probes: {error}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(algorithms)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

/// The name the TLS client says (SNI): the probe's `httpGet.host` when it is a DNS name, else
/// none (an IP address, as the kubelet dials the pod's IP).
pub(crate) fn server_name(host: Option<&str>) -> ServerName<'static> {
    host.map(|host| host.rsplit_once(':').map_or(host, |(name, _)| name))
        .and_then(|name| ServerName::try_from(name.to_owned()).ok())
        .unwrap_or(ServerName::IpAddress(
            std::net::IpAddr::from([127, 0, 0, 1]).into(),
        ))
}
