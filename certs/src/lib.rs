//! Certificates for the admission webhook: a CA and serving certificates (rcgen), and a rustls
//! certificate resolver that picks up rotated files without a restart or a failed handshake.

mod generate;
pub mod inspect;
mod reload;
pub mod rotation;
mod tls;

pub use generate::{CertificateAuthority, IssuedCertificate};
pub use reload::{ReloadOutcome, ReloadingCertResolver};
pub use tls::{client_config, server_config};

/// Why a certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} holds no PEM {what}")]
    MissingPem { path: String, what: &'static str },
    #[error("{path} is not valid PEM: {source}")]
    Pem {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the private key is not usable by rustls: {0}")]
    Key(rustls::Error),
    #[error("the certificate does not match the private key (a rotation may be half written): {0}")]
    KeyMismatch(rustls::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("cannot parse the certificate: {0}")]
    Parse(String),
    #[error("the certificate reload interval must be longer than zero")]
    ZeroReloadInterval,
}
