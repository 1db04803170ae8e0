//! AdmissionReview in and out: strict parsing of what the apiserver sends, and the response
//! for a verdict. Anything malformed is a [`BadReview`] (HTTP 400), never a panic.

use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::Status;
use serde_json::Value;

use crate::policy::{self, Verdict};

/// Largest review accepted; the apiserver's own request limit is 3 MiB.
pub const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// A request that is not a well-formed `admission.k8s.io/v1` AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error("the body is larger than the {MAX_REVIEW_BYTES}-byte limit")]
    TooLarge,
    #[error("the body could not be read: {0}")]
    Unreadable(String),
    #[error("the body is not JSON: {0}")]
    NotJson(serde_json::Error),
    #[error(
        "expected apiVersion {API_VERSION:?} and kind {KIND:?}, got {api_version:?} and {kind:?}"
    )]
    WrongType { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("request is not a valid AdmissionRequest: {0}")]
    BadRequest(serde_json::Error),
    #[error("request.object is missing for a pod {0:?}")]
    NoObject(Operation),
    #[error("request.object is not a valid Pod: {0}")]
    BadPod(serde_json::Error),
}

/// A pod creation to judge.
#[derive(Debug)]
pub struct PodCreation {
    /// The pod exactly as sent (the base for the patch).
    pub raw: Value,
    pub pod: Pod,
    pub namespace: String,
}

/// Parses and checks the envelope.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, BadReview> {
    if body.len() > MAX_REVIEW_BYTES {
        return Err(BadReview::TooLarge);
    }
    let mut review: Value = serde_json::from_slice(body).map_err(BadReview::NotJson)?;
    let field = |name: &str| {
        review
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, kind) = (field("apiVersion"), field("kind"));
    if api_version != API_VERSION || kind != KIND {
        return Err(BadReview::WrongType { api_version, kind });
    }
    let request = review
        .get_mut("request")
        .map(Value::take)
        .filter(|request| !request.is_null())
        .ok_or(BadReview::NoRequest)?;
    let mut request: AdmissionRequest<DynamicObject> =
        serde_json::from_value(request).map_err(BadReview::BadRequest)?;
    request.types.api_version = api_version;
    request.types.kind = kind;
    Ok(request)
}

/// The pod creation inside a request, or `None` for anything this webhook does not judge
/// (other resources, subresources, operations other than CREATE).
pub fn pod_creation(
    request: &AdmissionRequest<DynamicObject>,
) -> Result<Option<PodCreation>, BadReview> {
    let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
    let is_main_resource = request
        .sub_resource
        .as_deref()
        .unwrap_or_default()
        .is_empty();
    if !is_pod || !is_main_resource || request.operation != Operation::Create {
        return Ok(None);
    }
    let object = request
        .object
        .as_ref()
        .ok_or_else(|| BadReview::NoObject(request.operation.clone()))?;
    let raw = serde_json::to_value(object).map_err(BadReview::BadPod)?;
    let pod: Pod = serde_json::from_value(raw.clone()).map_err(BadReview::BadPod)?;
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod.metadata.namespace.clone())
        .unwrap_or_else(|| "default".to_owned());
    Ok(Some(PodCreation {
        raw,
        pod,
        namespace,
    }))
}

/// Turns a verdict into the response, computing the patch against the raw pod.
pub fn respond(
    request: &AdmissionRequest<DynamicObject>,
    creation: &PodCreation,
    verdict: &Verdict,
) -> (AdmissionResponse, bool) {
    let mut response = AdmissionResponse::from(request);
    match verdict {
        Verdict::Deny {
            code,
            reason,
            message,
        } => {
            response.allowed = false;
            response.result = Status::failure(message, reason).with_code(*code);
            (response, false)
        }
        Verdict::Allow {
            mutation, warnings, ..
        } => {
            if !warnings.is_empty() {
                response.warnings = Some(warnings.clone());
            }
            let patch = policy::patch_for(&creation.raw, mutation);
            if patch.0.is_empty() {
                return (response, false);
            }
            match response.clone().with_patch(patch) {
                Ok(patched) => (patched, true),
                Err(error) => {
                    response.allowed = false;
                    response.result = Status::failure(
                        &format!("runpod-kubelet could not encode its patch: {error}"),
                        "InternalError",
                    )
                    .with_code(500);
                    (response, false)
                }
            }
        }
    }
}

/// A refusal that is not the pod's fault (the cluster could not be read): retryable.
pub fn internal_error(
    request: &AdmissionRequest<DynamicObject>,
    message: String,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::from(request);
    response.allowed = false;
    response.result = Status::failure(&message, "InternalError").with_code(500);
    response
}

/// Serialises the response in its review envelope, with the request's apiVersion.
pub fn encode(response: AdmissionResponse) -> Vec<u8> {
    let review = response.into_review();
    // Serialising plain data types cannot fail; an empty body would still be answered as 500.
    serde_json::to_vec(&review).unwrap_or_default()
}
