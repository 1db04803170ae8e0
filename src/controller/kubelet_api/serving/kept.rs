//! The issued kubelet certificate and its key, kept in a `kubernetes.io/tls` Secret of the
//! controller's namespace: a restart or a failover to the standby serves it again at once
//! instead of waiting for a new approval. Only a certificate that names the node's current
//! address and is still valid for more than a minute is served from it.

use std::fmt;
use std::net::IpAddr;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use rustls::sign::CertifiedKey;

use super::CsrError;

/// The address the kept certificate was issued for, on the Secret.
const ADDRESS_ANNOTATION: &str = "runpod.io/kubelet-address";

/// The Secret's namespace and name (`--kubelet-tls-secret NAMESPACE/NAME`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    pub namespace: String,
    pub name: String,
}

impl Kept {
    /// `NAMESPACE/NAME`, both non-empty.
    pub fn parse(value: &str) -> Result<Kept, String> {
        match value.trim().split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() => Ok(Kept {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            _ => Err(format!("{value:?} is not NAMESPACE/NAME")),
        }
    }

    fn api(&self, client: &kube::Client) -> Api<Secret> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// The kept certificate, when there is one for `ip` that is valid for more than a minute.
    pub async fn load(
        &self,
        client: &kube::Client,
        ip: IpAddr,
    ) -> Result<Option<(CertifiedKey, Timestamp)>, CsrError> {
        let Some(secret) = self.api(client).get_opt(&self.name).await? else {
            return Ok(None);
        };
        let data = secret.data.unwrap_or_default();
        let (Some(cert), Some(key)) = (data.get("tls.crt"), data.get("tls.key")) else {
            return Ok(None);
        };
        usable(&cert.0, &key.0, ip, Timestamp::now())
    }

    /// Keeps `key_pem` and `chain_pem`, issued for `node` at `ip` (created, or replaced),
    /// labelled as the node's other Secrets are (the uninstall docs delete them by label).
    pub async fn store(
        &self,
        client: &kube::Client,
        node: &str,
        key_pem: &str,
        chain_pem: &[u8],
        ip: IpAddr,
    ) -> Result<(), CsrError> {
        let api = self.api(client);
        let mut secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    [
                        (
                            "app.kubernetes.io/managed-by".to_owned(),
                            "runpod-kubelet".to_owned(),
                        ),
                        ("runpod.io/node".to_owned(), node.to_owned()),
                    ]
                    .into(),
                ),
                annotations: Some([(ADDRESS_ANNOTATION.to_owned(), ip.to_string())].into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(
                [
                    ("tls.crt".to_owned(), ByteString(chain_pem.to_vec())),
                    (
                        "tls.key".to_owned(),
                        ByteString(key_pem.as_bytes().to_vec()),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        };
        match api.get_opt(&self.name).await? {
            Some(existing) => {
                secret.metadata.resource_version = existing.metadata.resource_version;
                api.replace(&self.name, &PostParams::default(), &secret)
                    .await?;
            }
            None => {
                api.create(&PostParams::default(), &secret).await?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The decision: a kept pair is served when it parses, names `ip` and outlives `now` by more
/// than a minute; anything else (an address that moved, an expired or garbled pair) is not an
/// error, just not served.
fn usable(
    cert_pem: &[u8],
    key_pem: &[u8],
    ip: IpAddr,
    now: Timestamp,
) -> Result<Option<(CertifiedKey, Timestamp)>, CsrError> {
    let key = std::str::from_utf8(key_pem)
        .ok()
        .and_then(|pem| rcgen::KeyPair::from_pem(pem).ok());
    let Some(key) = key else {
        return Err(CsrError::Kept(
            "tls.key is not a PEM private key".to_owned(),
        ));
    };
    let (certified, not_after, addresses) =
        super::certified_for(&key, cert_pem).map_err(|error| CsrError::Kept(error.to_string()))?;
    let lasting = not_after.duration_since(now).as_secs() > 60;
    Ok((lasting && addresses.contains(&ip)).then_some((certified, not_after)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(ip: IpAddr, days: u64) -> (String, String) {
        let ca = runpod_certs::CertificateAuthority::generate(
            "test CA",
            std::time::Duration::from_secs(86_400 * 30),
        )
        .unwrap();
        let cert = ca
            .issue_serving(
                &["virtual-runpod"],
                &[ip],
                std::time::Duration::from_secs(86_400 * days),
            )
            .unwrap();
        (cert.cert_pem, cert.key_pem)
    }

    /// A kept pair is served only for the address it names and while it lasts.
    #[test]
    fn a_kept_certificate_is_served_for_its_address_while_it_lasts() {
        let ip: IpAddr = "10.0.0.7".parse().unwrap();
        let (cert, key) = issued(ip, 10);
        let now = Timestamp::now();
        let (_, not_after) = usable(cert.as_bytes(), key.as_bytes(), ip, now)
            .unwrap()
            .expect("served");
        assert!(not_after > now);
        let moved: IpAddr = "10.0.0.8".parse().unwrap();
        assert!(
            usable(cert.as_bytes(), key.as_bytes(), moved, now)
                .unwrap()
                .is_none(),
            "a certificate for another address was served"
        );
        let later = now
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(86_400 * 11))
            .unwrap();
        assert!(
            usable(cert.as_bytes(), key.as_bytes(), ip, later)
                .unwrap()
                .is_none(),
            "an expired certificate was served"
        );
        assert!(usable(cert.as_bytes(), b"garbage", ip, now).is_err());
        assert!(usable(b"garbage", key.as_bytes(), ip, now).is_err());
    }

    #[test]
    fn the_secret_is_named_namespace_slash_name() {
        assert_eq!(
            Kept::parse("runpod-system/virtual-runpod-kubelet-serving"),
            Ok(Kept {
                namespace: "runpod-system".into(),
                name: "virtual-runpod-kubelet-serving".into()
            })
        );
        for wrong in ["", "name", "/name", "ns/"] {
            assert!(Kept::parse(wrong).is_err(), "{wrong}");
        }
    }
}
