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

pub(super) fn kubelet_identity(
    args: &ControllerArgs,
    ip: IpAddr,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (cert_pem, key_pem) = match (&args.kubelet_tls_cert, &args.kubelet_tls_key) {
        (Some(cert), Some(key)) => (
            std::fs::read(cert).with_context(|| format!("reading {}", cert.display()))?,
            std::fs::read(key).with_context(|| format!("reading {}", key.display()))?,
        ),
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
