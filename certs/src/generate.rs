//! CA and serving certificate generation. Every certificate is X.509 v3 with extensions, which
//! rustls (and therefore kube clients) insists on.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use crate::CertError;

/// A PEM certificate with its PEM private key.
#[derive(Clone)]
pub struct IssuedCertificate {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCertificate {
    // The key must never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCertificate")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// A certificate authority able to sign serving certificates for the webhook.
pub struct CertificateAuthority {
    issued: IssuedCertificate,
    issuer: Issuer<'static, KeyPair>,
}

impl CertificateAuthority {
    /// Creates a new self-signed CA valid from now (minus a small clock-skew margin).
    pub fn generate(common_name: &str, valid_for: Duration) -> Result<Self, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = named(common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, valid_for);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let issued = IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        };
        Ok(Self {
            issued,
            issuer: Issuer::new(params, key),
        })
    }

    /// Loads an existing CA from its PEM certificate and key (used by rotation).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(Self {
            issued: IssuedCertificate {
                cert_pem: cert_pem.to_owned(),
                key_pem: key_pem.to_owned(),
            },
            issuer,
        })
    }

    /// The CA certificate and key, PEM.
    pub fn certificate(&self) -> &IssuedCertificate {
        &self.issued
    }

    /// Issues a TLS serving certificate for the given DNS names and IP addresses.
    pub fn issue_serving(
        &self,
        dns_names: &[&str],
        ip_addresses: &[IpAddr],
        valid_for: Duration,
    ) -> Result<IssuedCertificate, CertError> {
        let mut params = CertificateParams::new(
            dns_names
                .iter()
                .map(|n| (*n).to_owned())
                .collect::<Vec<_>>(),
        )?;
        params
            .subject_alt_names
            .extend(ip_addresses.iter().copied().map(SanType::IpAddress));
        params.distinguished_name = named(
            dns_names
                .first()
                .copied()
                .unwrap_or("runpod-kubelet-webhook"),
        );
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        set_validity(&mut params, valid_for);
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

fn named(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn set_validity(params: &mut CertificateParams, valid_for: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + valid_for;
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::ReloadingCertResolver;

    #[test]
    fn a_reloaded_ca_issues_certificates_that_serve() {
        let ca = CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
        let reloaded =
            CertificateAuthority::from_pem(&ca.certificate().cert_pem, &ca.certificate().key_pem)
                .unwrap();
        let serving = reloaded
            .issue_serving(
                &["webhook.svc"],
                &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
                Duration::from_secs(60),
            )
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, &serving.cert_pem).unwrap();
        std::fs::write(&key, &serving.key_pem).unwrap();
        assert!(ReloadingCertResolver::load(&cert, &key).is_ok());
        // A key from another pair is refused: the resolver never serves a mismatched pair.
        let other = ca
            .issue_serving(&["x"], &[], Duration::from_secs(60))
            .unwrap();
        std::fs::write(&key, &other.key_pem).unwrap();
        assert!(matches!(
            ReloadingCertResolver::load(&cert, &key),
            Err(CertError::KeyMismatch(_))
        ));
        assert!(
            !format!("{other:?}").contains("PRIVATE KEY"),
            "Debug leaks the key"
        );
    }

    #[test]
    fn the_resolver_reports_the_served_certificate_expiry() {
        let ca = CertificateAuthority::generate("ca", Duration::from_secs(3600)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let write = |valid_for: u64| {
            let before = OffsetDateTime::now_utc().unix_timestamp();
            let issued = ca
                .issue_serving(&["x"], &[], Duration::from_secs(valid_for))
                .unwrap();
            let after = OffsetDateTime::now_utc().unix_timestamp();
            std::fs::write(&cert, &issued.cert_pem).unwrap();
            std::fs::write(&key, &issued.key_pem).unwrap();
            let valid_for = i64::try_from(valid_for).unwrap();
            before + valid_for..=after + valid_for
        };
        let expected = write(600);
        let resolver = ReloadingCertResolver::load(&cert, &key).unwrap();
        let not_after = resolver.not_after().unwrap();
        assert!(
            expected.contains(&not_after),
            "{not_after} not in {expected:?}"
        );
        let expected = write(86_400);
        resolver.reload().unwrap();
        let not_after = resolver.not_after().unwrap();
        assert!(
            expected.contains(&not_after),
            "{not_after} not in {expected:?}"
        );
    }
}
