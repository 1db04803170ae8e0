//! The kubelet API's serving certificate, swappable while serving: self-signed or from files at
//! start, or requested from the cluster through a `kubernetes.io/kubelet-serving`
//! CertificateSigningRequest (`--kubelet-tls-csr`), as a kubelet with
//! `serverTLSBootstrap` does, so that an apiserver started with `--kubelet-certificate-authority`
//! can verify it. The request is approved by the cluster (an approver, `kubectl certificate
//! approve`) or, with `--kubelet-tls-approve`, by the controller itself for its own node only;
//! until then the first certificate keeps serving. The issued certificate and key are kept in a
//! Secret (`--kubelet-tls-secret`) and served again after a restart, so a restart or failover
//! asks nobody. The certificate is requested again when two thirds of its life have passed.

mod csr;
mod kept;

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

pub use csr::{request, self_approved_name};
pub use kept::Kept;

/// The signer of kubelet serving certificates.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";

/// How long one request waits for approval before a new one is made (the served certificate
/// stays meanwhile).
pub const APPROVAL_WAIT: Duration = Duration::from_secs(15 * 60);

/// The certificate the kubelet API presents; [`ServingCert::set`] swaps it for every later
/// handshake.
#[derive(Debug)]
pub struct ServingCert(RwLock<Arc<CertifiedKey>>);

impl ServingCert {
    pub fn new(key: CertifiedKey) -> Arc<ServingCert> {
        Arc::new(ServingCert(RwLock::new(Arc::new(key))))
    }

    pub fn set(&self, key: CertifiedKey) {
        if let Ok(mut current) = self.0.write() {
            *current = Arc::new(key);
        }
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|key| key.clone())
    }
}

/// Why a certificate could not be requested or used.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("making the request: {0}")]
    Request(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("CertificateSigningRequest {name} was denied or failed: {reason}")]
    Denied { name: String, reason: String },
    #[error("the issued certificate: {0}")]
    Issued(String),
    #[error("the kept certificate: {0}")]
    Kept(String),
}

/// The key and the issued PEM chain as rustls serves them, and when the certificate expires.
pub fn certified(
    key: &rcgen::KeyPair,
    chain_pem: &[u8],
) -> Result<(CertifiedKey, Timestamp), CsrError> {
    let (certified, not_after, _) = certified_for(key, chain_pem)?;
    Ok((certified, not_after))
}

/// [`certified`], and the IP addresses the certificate names.
fn certified_for(
    key: &rcgen::KeyPair,
    chain_pem: &[u8],
) -> Result<(CertifiedKey, Timestamp, Vec<IpAddr>), CsrError> {
    let chain = rustls_pemfile::certs(&mut &chain_pem[..])
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CsrError::Issued(e.to_string()))?;
    let first = chain
        .first()
        .ok_or_else(|| CsrError::Issued("no certificate in status.certificate".to_owned()))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(first.as_ref())
        .map_err(|e| CsrError::Issued(e.to_string()))?;
    let not_after = Timestamp::from_second(parsed.validity().not_after.timestamp())
        .map_err(|e| CsrError::Issued(e.to_string()))?;
    let addresses: Vec<IpAddr> = parsed
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|extension| {
            extension
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    x509_parser::extensions::GeneralName::IPAddress(bytes) => match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    },
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, der, &provider)
        .map_err(|e| CsrError::Issued(e.to_string()))?;
    Ok((certified, not_after, addresses))
}

/// When to ask again: two thirds into the certificate's life (at least a minute from now).
pub fn renew_in(now: Timestamp, not_after: Timestamp) -> Duration {
    let left = Duration::try_from(not_after.duration_since(now)).unwrap_or_default();
    (left * 2 / 3).max(Duration::from_secs(60))
}

/// How the certificate is requested and kept.
#[derive(Debug, Clone)]
pub struct CsrOptions {
    /// The controller approves its own node's request (`--kubelet-tls-approve`).
    pub approve: bool,
    /// Where the issued certificate and key are kept across restarts (`--kubelet-tls-secret`).
    pub kept: Option<Kept>,
}

/// Serves the kept certificate when there is a valid one for this address; otherwise (and
/// before it expires) requests one, waits for it to be approved and signed, installs it into
/// `serving` and keeps it. Runs until the process stops.
pub async fn keep_requesting(
    client: kube::Client,
    node: String,
    ip: IpAddr,
    serving: Arc<ServingCert>,
    options: CsrOptions,
) {
    let mut wait = None;
    if let Some(kept) = &options.kept {
        match kept.load(&client, ip).await {
            Ok(Some((key, not_after))) => {
                serving.set(key);
                let renew = renew_in(Timestamp::now(), not_after);
                info!(secret = %kept, %not_after, renew_in = ?renew, "kubelet API serves the certificate kept from before");
                wait = Some(renew);
            }
            Ok(None) => info!(secret = %kept, "no kept kubelet certificate for this address"),
            Err(error) => {
                warn!(secret = %kept, %error, "reading the kept kubelet certificate failed")
            }
        }
    }
    if let Some(wait) = wait {
        tokio::time::sleep(wait).await;
    }
    let mut delay = Duration::from_secs(5);
    loop {
        match csr::request_once(&client, &node, ip, options.approve).await {
            Ok(issued) => {
                serving.set(issued.certified);
                if let Some(kept) = &options.kept
                    && let Err(error) = kept
                        .store(&client, &node, &issued.key_pem, &issued.chain_pem, ip)
                        .await
                {
                    // Still served; a restart would ask again.
                    warn!(secret = %kept, %error, "keeping the kubelet certificate failed");
                }
                let wait = renew_in(Timestamp::now(), issued.not_after);
                info!(not_after = %issued.not_after, renew_in = ?wait, "kubelet API serves the certificate the cluster issued");
                delay = Duration::from_secs(5);
                tokio::time::sleep(wait).await;
            }
            Err(error) => {
                warn!(%error, retry_in = ?delay, "requesting the kubelet serving certificate failed");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(300));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use x509_parser::prelude::FromDer as _;

    use super::*;

    /// The request carries what the kubelet-serving signer requires: subject
    /// `system:node:<node>` in `system:nodes`, the node's name and address as SANs.
    #[test]
    fn the_request_names_the_node_as_the_signer_requires() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let (_, pem) = request("virtual-runpod", ip).unwrap();
        let der = rustls_pemfile::csr(&mut pem.as_bytes()).unwrap().unwrap();
        let (_, csr) =
            x509_parser::certification_request::X509CertificationRequest::from_der(der.as_ref())
                .unwrap();
        let subject = csr.certification_request_info.subject.to_string();
        assert!(
            subject.contains("CN=system:node:virtual-runpod"),
            "{subject}"
        );
        assert!(subject.contains("O=system:nodes"), "{subject}");
        let sans = format!(
            "{:?}",
            csr.requested_extensions().map(|e| e.collect::<Vec<_>>())
        );
        assert!(sans.contains("virtual-runpod"), "{sans}");
        assert!(
            sans.contains("10.1.2.3") || sans.contains("[10, 1, 2, 3]"),
            "{sans}"
        );
    }

    #[test]
    fn renewal_comes_two_thirds_into_the_life() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let year: Timestamp = "2026-12-27T00:00:00Z".parse().unwrap();
        let wait = renew_in(now, year);
        assert_eq!(wait.as_secs(), 360 * 24 * 3600 * 2 / 3);
        assert_eq!(renew_in(now, now).as_secs(), 60);
    }

    /// An issued chain and its key become what the server presents; a garbled chain is an
    /// error, not a panic.
    #[test]
    fn an_issued_certificate_is_served_with_its_key() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let (key, _) = request("n", ip).unwrap();
        let ca = issued_by_a_throwaway_ca(&key);
        let (certified, not_after) = certified(&key, ca.as_bytes()).unwrap();
        assert_eq!(certified.cert.len(), 1);
        assert!(not_after > Timestamp::now());
        assert!(super::certified(&key, b"garbage").is_err());
    }

    /// A certificate for `key`, signed by a throwaway CA (what the cluster's signer returns).
    fn issued_by_a_throwaway_ca(key: &rcgen::KeyPair) -> String {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(vec![]).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let params = rcgen::CertificateParams::new(vec!["n".to_owned()]).unwrap();
        params.signed_by(key, &issuer).unwrap().pem()
    }
}
