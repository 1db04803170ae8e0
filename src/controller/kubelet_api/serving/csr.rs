//! The `kubernetes.io/kubelet-serving` request: what it names, and (with `--kubelet-tls-approve`)
//! its approval by the controller itself. A self-approved request has one fixed name per node
//! ([`self_approved_name`]), so the chart can limit the approval right to that one object.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestSpec,
};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use rustls::sign::CertifiedKey;
use tracing::info;

use super::{APPROVAL_WAIT, CsrError, SIGNER};

/// The name of a node's self-approved request (the chart's RBAC names it too).
pub fn self_approved_name(node: &str) -> String {
    format!("{node}-serving-runpod-kubelet")
}

/// What the cluster issued, as served and as kept.
pub(super) struct Issued {
    pub certified: CertifiedKey,
    pub not_after: Timestamp,
    pub key_pem: String,
    pub chain_pem: Vec<u8>,
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

pub(super) async fn request_once(
    client: &kube::Client,
    node: &str,
    ip: IpAddr,
    approve: bool,
) -> Result<Issued, CsrError> {
    let (key, pem) = request(node, ip)?;
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let fixed = approve.then(|| self_approved_name(node));
    if let Some(name) = &fixed {
        // The last one (issued or not) gives way to the new request.
        match csrs.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(error.into()),
        }
    }
    let object = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: fixed.clone(),
            generate_name: fixed.is_none().then(|| format!("{node}-serving-")),
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
    if approve {
        self_approve(&csrs, created, node).await?;
        info!(csr = %name, "approved this node's kubelet serving certificate request; waiting for the signer");
    } else {
        info!(csr = %name, "waiting for the cluster to approve the kubelet serving certificate (kubectl certificate approve {name})");
    }
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
            let (certified, not_after) = super::certified(&key, &certificate.0)?;
            return Ok(Issued {
                certified,
                not_after,
                key_pem: key.serialize_pem(),
                chain_pem: certificate.0,
            });
        }
    }
}

/// Approves the request made just now for this node: what it names was made here
/// (`request`), not read from the cluster.
async fn self_approve(
    csrs: &Api<CertificateSigningRequest>,
    mut created: CertificateSigningRequest,
    node: &str,
) -> Result<(), CsrError> {
    let name = created.metadata.name.clone().unwrap_or_default();
    created
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: "Approved".to_owned(),
            status: "True".to_owned(),
            reason: Some("RunPodKubeletSelfApproved".to_owned()),
            message: Some(format!(
                "runpod-kubelet approved the serving certificate of its virtual node {node}"
            )),
            ..Default::default()
        });
    csrs.replace_subresource("approval", &name, &PostParams::default(), &created)
        .await?;
    Ok(())
}
