//! Reading what a stored certificate is: its validity window, its DER identity, who signed it,
//! its names and whether a key belongs to it. The rotation decisions work on these facts only.

use std::io::BufReader;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use crate::CertError;

/// The facts about one certificate that rotation decides on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// notBefore, Unix seconds.
    pub not_before: i64,
    /// notAfter, Unix seconds.
    pub not_after: i64,
    /// The certificate itself (DER), its identity in bundles.
    pub der: Vec<u8>,
}

/// Every certificate of a PEM bundle, in order.
pub fn parse_bundle(pem: &str) -> Result<Vec<CertInfo>, CertError> {
    ders(pem)?
        .iter()
        .map(|der| info(der.as_ref()))
        .collect::<Result<Vec<_>, _>>()
}

/// The first certificate of a PEM text.
pub fn parse_first(pem: &str) -> Result<CertInfo, CertError> {
    parse_bundle(pem)?
        .into_iter()
        .next()
        .ok_or(CertError::MissingPem {
            path: "<pem>".to_owned(),
            what: "certificate",
        })
}

/// Whether the first certificate of `leaf_pem` carries a valid signature of `ca_pem`'s first
/// certificate.
pub fn signed_by(leaf_pem: &str, ca_pem: &str) -> Result<bool, CertError> {
    let leaf = first_der(leaf_pem)?;
    let ca = first_der(ca_pem)?;
    let (_, leaf) = X509Certificate::from_der(leaf.as_ref()).map_err(parse_error)?;
    let (_, ca) = X509Certificate::from_der(ca.as_ref()).map_err(parse_error)?;
    Ok(leaf.issuer() == ca.subject() && leaf.verify_signature(Some(ca.public_key())).is_ok())
}

/// The DNS names and IP addresses (as text) of the first certificate's subjectAltName.
pub fn subject_alt_names(pem: &str) -> Result<Vec<String>, CertError> {
    let der = first_der(pem)?;
    let (_, cert) = X509Certificate::from_der(der.as_ref()).map_err(parse_error)?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push((*dns).to_owned()),
                GeneralName::IPAddress(bytes) => {
                    if let Some(ip) = ip_text(bytes) {
                        names.push(ip);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(names)
}

/// Whether `key_pem` is the private key of the first certificate of `cert_pem`.
pub fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    let Ok(chain) = ders(cert_pem) else {
        return false;
    };
    let key: Option<PrivateKeyDer<'static>> =
        rustls_pemfile::private_key(&mut BufReader::new(key_pem.as_bytes()))
            .ok()
            .flatten();
    let Some(key) = key else { return false };
    let Ok(signing) = rustls::crypto::ring::sign::any_supported_type(&key) else {
        return false;
    };
    rustls::sign::CertifiedKey::new(chain, signing)
        .keys_match()
        .is_ok()
}

/// Who a client certificate names, read as the apiserver reads it: the subject's common name is
/// the user and its organization values are the groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// The last CN of the subject (as Go's `pkix.Name` keeps it); `None` when there is none.
    pub common_name: Option<String>,
    /// Every O of the subject, in order.
    pub organizations: Vec<String>,
}

/// The subject of a DER certificate. A CN or O whose value is not a string is an error.
pub fn subject(der: &[u8]) -> Result<Subject, CertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(parse_error)?;
    let name = cert.subject();
    let text = |attribute: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attribute.as_str().map(str::to_owned).map_err(parse_error)
    };
    Ok(Subject {
        common_name: name.iter_common_name().map(text).last().transpose()?,
        organizations: name
            .iter_organization()
            .map(text)
            .collect::<Result<_, _>>()?,
    })
}

/// A DER certificate as PEM text (bundles are rebuilt from the certificates they keep).
pub fn pem_of(der: &[u8]) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in encoded.as_bytes().chunks(64) {
        pem.push_str(&String::from_utf8_lossy(line));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| std::net::IpAddr::from(b).to_string()),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| std::net::IpAddr::from(b).to_string()),
        _ => None,
    }
}

fn ders(pem: &str) -> Result<Vec<CertificateDer<'static>>, CertError> {
    rustls_pemfile::certs(&mut BufReader::new(pem.as_bytes()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::Pem {
            path: "<pem>".to_owned(),
            source,
        })
}

fn first_der(pem: &str) -> Result<CertificateDer<'static>, CertError> {
    ders(pem)?.into_iter().next().ok_or(CertError::MissingPem {
        path: "<pem>".to_owned(),
        what: "certificate",
    })
}

fn info(der: &[u8]) -> Result<CertInfo, CertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(parse_error)?;
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        der: der.to_vec(),
    })
}

fn parse_error(error: impl std::fmt::Display) -> CertError {
    CertError::Parse(error.to_string())
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;
    use crate::CertificateAuthority;

    #[test]
    fn facts_of_an_issued_certificate() {
        let ca = CertificateAuthority::generate("ca-a", Duration::from_secs(7200)).unwrap();
        let other = CertificateAuthority::generate("ca-b", Duration::from_secs(7200)).unwrap();
        let leaf = ca
            .issue_serving(
                &["svc.ns.svc"],
                &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
                Duration::from_secs(600),
            )
            .unwrap();
        assert!(signed_by(&leaf.cert_pem, &ca.certificate().cert_pem).unwrap());
        assert!(!signed_by(&leaf.cert_pem, &other.certificate().cert_pem).unwrap());
        assert_eq!(
            subject_alt_names(&leaf.cert_pem).unwrap(),
            vec!["svc.ns.svc".to_owned(), "127.0.0.1".to_owned()]
        );
        assert!(key_matches(&leaf.cert_pem, &leaf.key_pem));
        assert!(!key_matches(&leaf.cert_pem, &other.certificate().key_pem));
        let info = parse_first(&leaf.cert_pem).unwrap();
        assert!(info.not_after - info.not_before >= 600);
        let bundle = format!(
            "{}{}",
            ca.certificate().cert_pem,
            other.certificate().cert_pem
        );
        assert_eq!(parse_bundle(&bundle).unwrap().len(), 2);
    }

    fn self_signed(name: rcgen::DistinguishedName) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = name;
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn subject_is_the_common_name_and_every_organization() {
        use rcgen::{DistinguishedName, DnType};
        let mut name = DistinguishedName::new();
        name.push(DnType::OrganizationName, "team-a");
        // rcgen keeps one value per type: the same OID as a custom type adds a second O.
        name.push(DnType::CustomDnType(vec![2, 5, 4, 10]), "system:masters");
        name.push(DnType::CommonName, "alice");
        assert_eq!(
            subject(&self_signed(name)).unwrap(),
            Subject {
                common_name: Some("alice".to_owned()),
                organizations: vec!["team-a".to_owned(), "system:masters".to_owned()],
            }
        );
        let mut groups_only = DistinguishedName::new();
        groups_only.push(DnType::OrganizationName, "team-a");
        assert_eq!(
            subject(&self_signed(groups_only)).unwrap().common_name,
            None
        );
        assert!(subject(b"not a certificate").is_err());
    }
}
