//! The kubelet API's serving certificate, swappable while serving: self-signed or from files at
//! start, or requested from the cluster through a `kubernetes.io/kubelet-serving`
//! CertificateSigningRequest (`--kubelet-tls-csr`), as a kubelet with
//! `serverTLSBootstrap` does, so that an apiserver started with `--kubelet-certificate-authority`
//! can verify it. The cluster must approve the request (`kubectl certificate approve`); until
//! then the first certificate keeps serving. The certificate is requested again when two thirds
//! of its life have passed.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

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
}

/// A fresh key and the PEM request for `node` at `ip` (subject `system:node:<node>` in
/// `system:nodes`, the names the kubelet-serving signer requires).
pub fn request(node: &str, ip: IpAddr) -> Result<(rcgen::KeyPair, String), CsrError> {
    let key = rcgen::KeyPair::generate().map_err(|e| CsrError::Request(e.to_string()))?;
    let mut params = rcgen::CertificateParams::new(vec![node.to_owned()])
        .map_err(|e| CsrError::Request(e.to_string()))?;
    params.subject_alt_names.push(rcgen::SanType::IpAddress(ip));
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    name.push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name = name;
    let csr = params
        .serialize_request(&key)
        .and_then(|csr| csr.pem())
        .map_err(|e| CsrError::Request(e.to_string()))?;
    Ok((key, csr))
}

/// The key and the issued PEM chain as rustls serves them, and when the certificate expires.
pub fn certified(
    key: &rcgen::KeyPair,
    chain_pem: &[u8],
) -> Result<(CertifiedKey, Timestamp), CsrError> {
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
    let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, der, &provider)
        .map_err(|e| CsrError::Issued(e.to_string()))?;
    Ok((certified, not_after))
}

/// When to ask again: two thirds into the certificate's life (at least a minute from now).
pub fn renew_in(now: Timestamp, not_after: Timestamp) -> Duration {
    let left = Duration::try_from(not_after.duration_since(now)).unwrap_or_default();
    (left * 2 / 3).max(Duration::from_secs(60))
}

/// Requests a certificate, waits for the cluster to approve and sign it, installs it into
/// `serving`, and does it again before it expires. Runs until the process stops.
pub async fn keep_requesting(
    client: kube::Client,
    node: String,
    ip: IpAddr,
    serving: Arc<ServingCert>,
) {
    let mut delay = Duration::from_secs(5);
    loop {
        match request_once(&client, &node, ip).await {
            Ok((key, not_after)) => {
                serving.set(key);
                let wait = renew_in(Timestamp::now(), not_after);
                info!(%not_after, renew_in = ?wait, "kubelet API serves the certificate the cluster issued");
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

async fn request_once(
    client: &kube::Client,
    node: &str,
    ip: IpAddr,
) -> Result<(CertifiedKey, Timestamp), CsrError> {
    let (key, pem) = request(node, ip)?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let object = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}-serving-")),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: SIGNER.to_owned(),
            usages: Some(vec![
                "digital signature".to_owned(),
                "key encipherment".to_owned(),
                "server auth".to_owned(),
            ]),
            ..Default::default()
        },
        status: None,
    };
    let created = csrs.create(&PostParams::default(), &object).await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    info!(csr = %name, "waiting for the cluster to approve the kubelet serving certificate (kubectl certificate approve {name})");
    let deadline = tokio::time::Instant::now() + APPROVAL_WAIT;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        if tokio::time::Instant::now() > deadline {
            return Err(CsrError::Denied {
                name: name.clone(),
                reason: format!(
                    "not approved within {APPROVAL_WAIT:?}; approve it (kubectl certificate \
                     approve {name}) or run an approver: a new request follows"
                ),
            });
        }
        let Some(csr) = csrs.get_opt(&name).await? else {
            return Err(CsrError::Denied {
                name,
                reason: "deleted before it was issued".to_owned(),
            });
        };
        let status = csr.status.unwrap_or_default();
        if let Some(condition) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(CsrError::Denied {
                name,
                reason: condition
                    .message
                    .clone()
                    .unwrap_or_else(|| condition.type_.clone()),
            });
        }
        if let Some(certificate) = status.certificate.filter(|c| !c.0.is_empty()) {
            return certified(&key, &certificate.0);
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
