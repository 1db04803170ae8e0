//! AdmissionReview in and out. A pod review is read in one pass, its object straight into the
//! [`PodView`] the policy reads ([`read`]); what that does not take is read again in parts (the
//! envelope and request with the object kept as raw JSON, then the object) so that each error
//! says which part is malformed. The response is written directly, with the patch in base64 as
//! the apiserver expects. Anything malformed is a [`BadReview`] (HTTP 400), never a panic.

use base64::Engine;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::pod::PodView;
use crate::policy::Verdict;

/// Largest review accepted; the apiserver's own request limit is 3 MiB.
pub(crate) const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// A request that is not a well-formed `admission.k8s.io/v1` AdmissionReview.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error("the body is larger than the {MAX_REVIEW_BYTES}-byte limit")]
    TooLarge,
    #[error("the body could not be read: {0}")]
    Unreadable(String),
    #[error("the body is not UTF-8, so not JSON: {0}")]
    NotUtf8(std::str::Utf8Error),
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
    #[error("request.object is missing for a pod {0}")]
    NoObject(String),
    #[error("request.object is not a valid Pod: {0}")]
    BadPod(serde_json::Error),
}

/// The review in one pass; [`Envelope`] then tells what is wrong with one that does not parse.
#[derive(Deserialize)]
struct Review<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: &'a str,
    #[serde(default)]
    kind: &'a str,
    #[serde(default, borrow)]
    request: Option<AdmissionRequest<'a>>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default, borrow)]
    request: Option<&'a RawValue>,
}

/// The review in one pass with its object read straight into the [`PodView`]: the common case,
/// a pod the view reads, costs one scan of the body instead of two (object skipped as raw JSON,
/// then parsed). Anything this does not read goes the way of [`parse`] and [`pod_creation`].
#[derive(Deserialize)]
struct PodReview<'a> {
    #[serde(default, rename = "apiVersion")]
    api_version: &'a str,
    #[serde(default)]
    kind: &'a str,
    #[serde(default)]
    request: Option<PodRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodRequest {
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    operation: String,
    #[serde(default)]
    object: Option<PodView>,
}

/// A review as read: its uid (for the response) and the pod creation to judge, if it is one.
#[derive(Debug)]
pub(crate) struct Reviewed {
    pub uid: String,
    pub creation: Option<PodCreation>,
}

/// The fields of an AdmissionRequest this webhook uses.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AdmissionRequest<'a> {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub sub_resource: Option<String>,
    #[serde(default)]
    pub namespace: Option<String>,
    pub operation: String,
    #[serde(default, borrow)]
    pub object: Option<&'a RawValue>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    // `version` is not read: a Pod is admitted whatever version the apiserver sends it as.
    pub kind: String,
}

/// A pod creation to judge.
#[derive(Debug)]
pub(crate) struct PodCreation {
    pub pod: PodView,
    pub namespace: String,
}

/// Reads a review body: one pass for a pod the view reads, else the envelope, the request and
/// the object in turn, so a malformed part gets its own error.
pub(crate) fn read(body: &[u8]) -> Result<Reviewed, BadReview> {
    if body.len() > MAX_REVIEW_BYTES {
        return Err(BadReview::TooLarge);
    }
    // See `parse` for why the whole body's UTF-8 is checked first.
    let text = std::str::from_utf8(body).map_err(BadReview::NotUtf8)?;
    if let Ok(PodReview {
        api_version: API_VERSION,
        kind: KIND,
        request: Some(request),
    }) = serde_json::from_str::<PodReview<'_>>(text)
    {
        if !judged(
            &request.kind,
            request.sub_resource.as_deref(),
            &request.operation,
        ) {
            return Ok(Reviewed {
                uid: request.uid,
                creation: None,
            });
        }
        // A `null` or missing object is refused by the precise path below, with its error.
        if let Some(pod) = request.object {
            let namespace = creation_namespace(request.namespace, &pod);
            return Ok(Reviewed {
                uid: request.uid,
                creation: Some(PodCreation { pod, namespace }),
            });
        }
    }
    let request = parse(body)?;
    let creation = pod_creation(&request)?;
    Ok(Reviewed {
        uid: request.uid,
        creation,
    })
}

/// Whether this webhook judges a request: a core Pod's creation, not a subresource's.
fn judged(kind: &GroupVersionKind, sub_resource: Option<&str>, operation: &str) -> bool {
    kind.group.is_empty()
        && kind.kind == "Pod"
        && sub_resource.unwrap_or_default().is_empty()
        && operation == "CREATE"
}

/// The namespace a pod is created in: the request's, else the pod's own, else `default`.
fn creation_namespace(requested: Option<String>, pod: &PodView) -> String {
    requested
        .or_else(|| pod.meta().namespace.as_deref().map(str::to_owned))
        .unwrap_or_else(|| "default".to_owned())
}

/// Parses and checks the envelope.
pub(crate) fn parse(body: &[u8]) -> Result<AdmissionRequest<'_>, BadReview> {
    if body.len() > MAX_REVIEW_BYTES {
        return Err(BadReview::TooLarge);
    }
    // serde_json skips the fields a struct ignores without checking their UTF-8, so the whole
    // body is checked once here; JSON is UTF-8 (RFC 8259), and the apiserver sends nothing else.
    let body = std::str::from_utf8(body).map_err(BadReview::NotUtf8)?;
    // A string with escapes cannot be borrowed, so `apiVersion: "admission.k8s.io\/v1"` fails
    // here too and is judged by the two-pass parse below, which owns its strings.
    match serde_json::from_str::<Review<'_>>(body) {
        Ok(review) if review.api_version == API_VERSION && review.kind == KIND => {
            review.request.ok_or(BadReview::NoRequest)
        }
        _ => parse_precisely(body),
    }
}

/// Parses in two passes (envelope, then request) to tell which part of a review is malformed.
fn parse_precisely(body: &str) -> Result<AdmissionRequest<'_>, BadReview> {
    let envelope: Envelope<'_> = serde_json::from_str(body).map_err(BadReview::NotJson)?;
    if envelope.api_version != API_VERSION || envelope.kind != KIND {
        return Err(BadReview::WrongType {
            api_version: envelope.api_version,
            kind: envelope.kind,
        });
    }
    let request = envelope
        .request
        .filter(|raw| raw.get() != "null")
        .ok_or(BadReview::NoRequest)?;
    serde_json::from_str(request.get()).map_err(BadReview::BadRequest)
}

/// The pod creation inside a request, or `None` for anything this webhook does not judge
/// (other resources, subresources, operations other than CREATE).
pub(crate) fn pod_creation(
    request: &AdmissionRequest<'_>,
) -> Result<Option<PodCreation>, BadReview> {
    if !judged(
        &request.kind,
        request.sub_resource.as_deref(),
        &request.operation,
    ) {
        return Ok(None);
    }
    let object = request
        .object
        .filter(|raw| raw.get() != "null")
        .ok_or_else(|| BadReview::NoObject(request.operation.clone()))?;
    let pod = pod_view(object.get())?;
    let namespace = creation_namespace(request.namespace.clone(), &pod);
    Ok(Some(PodCreation { pod, namespace }))
}

/// The view of a pod object. A pod the view does not read but the full API type does (a `null`
/// where a list belongs, a quantity as a number, a repeated key) is read through the API type,
/// so the view accepts every pod the API type accepts, and a rejected one gets its error.
fn pod_view(object: &str) -> Result<PodView, BadReview> {
    if let Ok(pod) = serde_json::from_str::<PodView>(object) {
        return Ok(pod);
    }
    let typed: Pod = serde_json::from_str(object).map_err(BadReview::BadPod)?;
    let metadata_absent = typed.metadata == ObjectMeta::default();
    let normalised = serde_json::to_value(&typed).map_err(BadReview::BadPod)?;
    let mut pod: PodView = serde_json::from_value(normalised).map_err(BadReview::BadPod)?;
    if metadata_absent {
        // The API type has no "no metadata"; treat an empty one as absent, as before.
        pod.metadata = None;
    }
    Ok(pod)
}

/// An AdmissionResponse, as sent back.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// Base64 of the JSON Patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Base64Patch>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// A JSON Patch in base64, as the response carries it. Made only by encoding, so it holds
/// nothing but the base64 alphabet, which JSON never escapes: [`encode`] copies it as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Base64Patch(String);

impl Base64Patch {
    pub(crate) fn encode(json: &[u8]) -> Self {
        Self(base64::engine::general_purpose::STANDARD.encode(json))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The refusal shown to the user (`metav1.Status`).
#[derive(Debug, Serialize)]
pub struct Status {
    pub status: &'static str,
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl AdmissionResponse {
    /// Admitted without change.
    pub(crate) fn allow(uid: &str) -> Self {
        Self {
            uid: uid.to_owned(),
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
        }
    }

    /// Refused with an HTTP-style code, a reason and a message for the user.
    pub(crate) fn deny(uid: &str, code: u16, reason: &str, message: String) -> Self {
        Self {
            allowed: false,
            status: Some(Status {
                status: "Failure",
                code,
                reason: reason.to_owned(),
                message,
            }),
            ..Self::allow(uid)
        }
    }

    /// Whether the response carries a patch.
    pub(crate) fn is_patched(&self) -> bool {
        self.patch.is_some()
    }

    /// The decoded JSON Patch, if any (tests and fuzzing).
    pub fn decoded_patch(&self) -> Option<Vec<u8>> {
        let patch = self.patch.as_ref()?;
        base64::engine::general_purpose::STANDARD
            .decode(patch.as_str())
            .ok()
    }
}

/// Turns a verdict into the response.
pub(crate) fn respond(uid: &str, creation: &PodCreation, verdict: Verdict) -> AdmissionResponse {
    match verdict {
        Verdict::Deny {
            code,
            reason,
            message,
        } => AdmissionResponse::deny(uid, code, &reason, message),
        Verdict::Allow {
            mutation, warnings, ..
        } => {
            let mut response = AdmissionResponse::allow(uid);
            response.warnings = warnings;
            let operations = mutation.patch(&creation.pod);
            if !operations.is_empty() {
                // Sized for a typical patch, so it is written without regrowing.
                let mut json = Vec::with_capacity(PATCH_CAPACITY);
                match serde_json::to_writer(&mut json, &operations) {
                    Ok(()) => {
                        response.patch = Some(Base64Patch::encode(&json));
                        response.patch_type = Some("JSONPatch");
                    }
                    Err(error) => {
                        return AdmissionResponse::deny(
                            uid,
                            500,
                            "InternalError",
                            format!("runpod-kubelet could not encode its patch: {error}"),
                        );
                    }
                }
            }
            response
        }
    }
}

/// Room for a typical patch (a Job's GPU pod: about 700 bytes) and its review around it.
const PATCH_CAPACITY: usize = 1024;
const REVIEW_CAPACITY: usize = 2048;

/// Serialises the response in its review envelope, member by member in the order of
/// [`AdmissionResponse`]'s fields. The patch ([`Base64Patch`]) is copied as it is instead of
/// being scanned for escapes: it is the longest string of an answer.
pub fn encode(response: &AdmissionResponse) -> Vec<u8> {
    let mut out = Vec::with_capacity(REVIEW_CAPACITY);
    // Plain data types always serialise; an empty body would be answered as a 500 upstream.
    match write_review(&mut out, response) {
        Ok(()) => out,
        Err(_) => Vec::new(),
    }
}

fn write_review(out: &mut Vec<u8>, response: &AdmissionResponse) -> serde_json::Result<()> {
    out.extend_from_slice(br#"{"apiVersion":""#);
    out.extend_from_slice(API_VERSION.as_bytes());
    out.extend_from_slice(br#"","kind":""#);
    out.extend_from_slice(KIND.as_bytes());
    out.extend_from_slice(br#"","response":{"uid":"#);
    serde_json::to_writer(&mut *out, &response.uid)?;
    out.extend_from_slice(if response.allowed {
        br#","allowed":true"#.as_slice()
    } else {
        br#","allowed":false"#.as_slice()
    });
    if let Some(status) = &response.status {
        out.extend_from_slice(br#","status":"#);
        serde_json::to_writer(&mut *out, status)?;
    }
    if let Some(patch) = &response.patch {
        out.extend_from_slice(br#","patch":""#);
        out.extend_from_slice(patch.as_str().as_bytes());
        out.push(b'"');
    }
    if let Some(patch_type) = response.patch_type {
        out.extend_from_slice(br#","patchType":"#);
        serde_json::to_writer(&mut *out, patch_type)?;
    }
    if !response.warnings.is_empty() {
        out.extend_from_slice(br#","warnings":"#);
        serde_json::to_writer(&mut *out, &response.warnings)?;
    }
    out.extend_from_slice(b"}}");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    fn creation(object: serde_json::Value) -> Result<Option<PodCreation>, BadReview> {
        let body = serde_json::to_vec(&json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "request": {
                "uid": "u",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": "ml",
                "operation": "CREATE",
                "object": object
            }
        }))
        .unwrap();
        let request = parse(&body)?;
        pod_creation(&request)
    }

    /// The envelope as serde writes it, field by field.
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ReviewOut<'a> {
        api_version: &'static str,
        kind: &'static str,
        response: &'a AdmissionResponse,
    }

    /// The hand-written envelope is byte for byte what serde writes, whatever the response
    /// holds: escapes in the uid, the message and the warnings.
    #[test]
    fn the_answer_is_written_as_serde_writes_it() {
        let mut patched = AdmissionResponse::allow("u-\"1\"");
        patched.patch = Some(Base64Patch::encode(b"[{\"op\":1}]"));
        patched.patch_type = Some("JSONPatch");
        patched.warnings = vec!["a \"quoted\"\nwarning \u{1}".to_owned(), "é".to_owned()];
        let responses = [
            AdmissionResponse::allow("u"),
            AdmissionResponse::allow(""),
            AdmissionResponse::deny("u\\2", 403, "Forbidden", "no \"GPU\"\t<here>".to_owned()),
            patched,
        ];
        for response in &responses {
            let expected = serde_json::to_vec(&ReviewOut {
                api_version: API_VERSION,
                kind: KIND,
                response,
            })
            .unwrap();
            assert_eq!(
                String::from_utf8(encode(response)).unwrap(),
                String::from_utf8(expected).unwrap()
            );
        }
        // Every byte base64 can hold is one JSON writes as it is.
        let every_byte: Vec<u8> = (0..=255).collect();
        let patch = Base64Patch::encode(&every_byte);
        let written = serde_json::to_string(patch.as_str()).unwrap();
        assert_eq!(written, format!("\"{}\"", patch.as_str()));
    }

    #[test]
    fn pods_the_api_type_accepts_are_read_even_where_the_view_is_stricter() {
        // `null` for the container list, a GPU quantity as a number: the API type reads both.
        let pod = creation(json!({
            "spec": {
                "containers": null,
                "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": 2}}}]
            }
        }))
        .unwrap()
        .unwrap()
        .pod;
        assert!(pod.metadata.is_none(), "an empty metadata reads as absent");
        let init = &pod.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        assert_eq!(init.resources.as_ref().unwrap().gpu(), Some("2"));
        assert_eq!(crate::policy::view_gpu_count(&pod), 2);
        // A repeated key: the last one counts, as in the API type.
        let body = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":{"metadata":{"name":"a","name":"b"}}}}"#;
        let request = parse(body).unwrap();
        let pod = pod_creation(&request).unwrap().unwrap().pod;
        assert_eq!(pod.meta().name.as_deref(), Some("b"));
    }

    /// `read`'s one pass answers as the envelope-then-object reading does, on the reviews it
    /// takes and on those it hands over.
    #[test]
    fn one_pass_reads_as_the_two_pass_reading_does() {
        let pod = json!({"metadata": {"name": "p", "namespace": "own",
                         "annotations": {"runpod.io/ports": "8080/http"}},
                         "spec": {"containers": [{"name": "c", "image": "i",
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let request = |kind: &str, operation: &str, namespace: Option<&str>, object| {
            let mut request = json!({"uid": "u-1", "operation": operation,
                                     "kind": {"group": "", "version": "v1", "kind": kind}});
            if let Some(namespace) = namespace {
                request["namespace"] = json!(namespace);
            }
            if let Some(object) = object {
                request["object"] = object;
            }
            request
        };
        let mut with_subresource = request("Pod", "CREATE", Some("ml"), Some(pod.clone()));
        with_subresource["subResource"] = json!("status");
        let requests = [
            request("Pod", "CREATE", Some("ml"), Some(pod.clone())),
            request("Pod", "CREATE", None, Some(pod.clone())),
            request(
                "Pod",
                "CREATE",
                None,
                Some(json!({"spec": {"containers": null}})),
            ),
            request("Pod", "CREATE", Some("ml"), Some(json!(null))),
            request("Pod", "CREATE", Some("ml"), None),
            request("Pod", "CREATE", Some("ml"), Some(json!({"metadata": []}))),
            request("Pod", "UPDATE", Some("ml"), Some(pod.clone())),
            request(
                "Service",
                "CREATE",
                Some("ml"),
                Some(json!({"spec": {"ports": []}})),
            ),
            with_subresource,
        ];
        for request in requests {
            let body = serde_json::to_vec(&json!({
                "apiVersion": API_VERSION, "kind": KIND, "request": request
            }))
            .unwrap();
            let two_pass = parse(&body).and_then(|request| {
                let creation = pod_creation(&request)?;
                Ok((request.uid.clone(), creation))
            });
            let one_pass = read(&body).map(|read| (read.uid, read.creation));
            assert_eq!(
                format!("{one_pass:?}"),
                format!("{two_pass:?}"),
                "{request}"
            );
        }
        // The one pass does take the common case.
        let body = serde_json::to_vec(&json!({"apiVersion": API_VERSION, "kind": KIND,
            "request": request("Pod", "CREATE", None, Some(pod))}))
        .unwrap();
        let creation = read(&body).unwrap().creation.unwrap();
        assert_eq!(creation.namespace, "own");
        assert!(serde_json::from_slice::<PodReview<'_>>(&body).is_ok());
        // So does the benches' review (a Job's pod as the apiserver sends it).
        let bench = include_bytes!("../../benches/fixtures/review.json");
        let review = serde_json::from_slice::<PodReview<'_>>(bench).unwrap();
        assert!(review.request.unwrap().object.is_some());
    }

    #[test]
    fn a_pod_neither_reading_accepts_is_a_bad_pod() {
        for object in [json!({"metadata": []}), json!({"spec": {"containers": 5}})] {
            assert!(
                matches!(creation(object.clone()), Err(BadReview::BadPod(_))),
                "{object}"
            );
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_rejected_even_inside_a_field_nobody_reads() {
        // `request.resource` is skipped by the parse, and serde_json skips unread strings
        // without checking them; found by the cargo-fuzz smoke.
        let body = b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{\"uid\":\"u\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},\"resource\":{\"resource\":\"p\x96ds\"},\"operation\":\"CREATE\",\"object\":{}}}";
        assert!(matches!(parse(body), Err(BadReview::NotUtf8(_))));
        let valid = String::from_utf8_lossy(body).into_owned();
        assert!(
            parse(valid.as_bytes()).is_ok(),
            "the same review in UTF-8 parses"
        );
    }
}
