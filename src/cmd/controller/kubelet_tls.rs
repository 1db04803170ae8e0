//! The kubelet API's TLS: the CA its clients' certificates must chain to, and its own serving
//! certificate (given as files, else self-signed for the node's name and address).

use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ControllerArgs;

pub(super) fn client_ca(
    args: &ControllerArgs,
    config: &kube::Config,
) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    let ders: Vec<CertificateDer<'static>> = match &args.kubelet_client_ca {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<_, _>>()?
        }
        None => {
            let from_file = config
                .root_cert_file
                .as_ref()
                .and_then(|path| std::fs::read(path).ok())
                .map(|pem| {
                    rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<Vec<_>, _>>()
                })
                .transpose()?;
            match from_file {
                Some(certs) => certs,
                None => config
                    .root_cert
                    .clone()
                    .unwrap_or_default()
                    .into_iter()
                    .map(CertificateDer::from)
                    .collect(),
            }
        }
    };
    for der in ders {
        roots.add(der)?;
    }
    anyhow::ensure!(
        !roots.is_empty(),
        "no CA for kubelet API clients: pass --kubelet-client-ca (the cluster CA)"
    );
    Ok(roots)
}

/// The kubelet API's TLS: its serving certificate (from files, else self-signed until the
/// cluster issues one when `--kubelet-tls-csr` asks, requested in the background) and the CA
/// its clients must chain to.
pub(super) fn server(
    args: &ControllerArgs,
    config: &kube::Config,
    client: &kube::Client,
    ip: IpAddr,
) -> anyhow::Result<std::sync::Arc<rustls::ServerConfig>> {
    use runpod_kubelet::controller::kubelet_api;
    let (certs, key) = kubelet_identity(args, ip)?;
    let first =
        rustls::sign::CertifiedKey::from_der(certs, key, &rustls::crypto::ring::default_provider())
            .context("the kubelet API's certificate and key")?;
    let serving = kubelet_api::serving::ServingCert::new(first);
    if args.kubelet_tls_csr {
        // Served self-signed until the cluster approves and signs the request.
        tokio::spawn(kubelet_api::serving::keep_requesting(
            client.clone(),
            args.nodename.clone(),
            ip,
            serving.clone(),
            kubelet_api::serving::CsrOptions {
                approve: args.kubelet_tls_approve,
                kept: args.kubelet_tls_secret.clone(),
            },
        ));
    }
    kubelet_api::server_config(serving, client_ca(args, config)?)
}

fn kubelet_identity(
    args: &ControllerArgs,
    ip: IpAddr,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (cert_pem, key_pem) = match (&args.kubelet_tls_cert, &args.kubelet_tls_key) {
        (Some(cert), Some(key)) => {
            let cert_pem =
                std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?;
            if let Some(problem) = unnamed_address(&String::from_utf8_lossy(&cert_pem), ip) {
                tracing::warn!(
                    certificate = %cert.display(),
                    address = %ip,
                    "{problem}"
                );
            }
            (
                cert_pem,
                std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
            )
        }
        _ => {
            let ca = runpod_certs::CertificateAuthority::generate(
                "runpod-kubelet kubelet API",
                Duration::from_secs(365 * 24 * 3600),
            )?;
            let issued = ca.issue_serving(
                &[args.nodename.as_str()],
                &[ip],
                Duration::from_secs(365 * 24 * 3600),
            )?;
            (issued.cert_pem.into_bytes(), issued.key_pem.into_bytes())
        }
    };
    let certs = rustls_pemfile::certs(&mut cert_pem.as_slice()).collect::<Result<Vec<_>, _>>()?;
    let key = rustls_pemfile::private_key(&mut key_pem.as_slice())?
        .context("the kubelet TLS key file holds no private key")?;
    Ok((certs, key))
}

/// Why an apiserver that verifies kubelet certificates would refuse this one, if it would: it
/// dials the node's address (`InternalIP`), so the certificate must name that IP. A certificate
/// from cert-manager or an existing Secret usually names DNS names only.
fn unnamed_address(cert_pem: &str, ip: IpAddr) -> Option<String> {
    let names = match runpod_certs::inspect::subject_alt_names(cert_pem) {
        Ok(names) => names,
        Err(error) => return Some(format!("the kubelet certificate cannot be read: {error}")),
    };
    let wanted = ip.to_string();
    (!names.contains(&wanted)).then(|| {
        format!(
            "the kubelet certificate names {} but not the node's address {wanted}: an apiserver \
             that verifies kubelet certificates (and metrics-server) will refuse `kubectl logs`, \
             `exec` and `top` for this node; use controller.kubeletTls.mode csr, or a \
             certificate naming this address (docs/install.md#platform-compatibility)",
            if names.is_empty() {
                "no address".to_owned()
            } else {
                names.join(", ")
            }
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_without_the_node_address_is_named_and_one_with_it_is_not() {
        let ca = runpod_certs::CertificateAuthority::generate("test", Duration::from_secs(3600))
            .unwrap();
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        let dns_only = ca
            .issue_serving(&["virtual-runpod"], &[], Duration::from_secs(3600))
            .unwrap();
        let problem = unnamed_address(&dns_only.cert_pem, ip).unwrap();
        assert!(problem.contains("virtual-runpod"), "{problem}");
        assert!(problem.contains("10.1.2.3"), "{problem}");
        let other_ip = ca
            .issue_serving(
                &["virtual-runpod"],
                &["10.9.9.9".parse().unwrap()],
                Duration::from_secs(3600),
            )
            .unwrap();
        assert!(unnamed_address(&other_ip.cert_pem, ip).is_some());
        let named = ca
            .issue_serving(&["virtual-runpod"], &[ip], Duration::from_secs(3600))
            .unwrap();
        assert_eq!(unnamed_address(&named.cert_pem, ip), None);
        assert!(unnamed_address("not a certificate", ip).is_some());
    }
}
