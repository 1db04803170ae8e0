//! RunPod errors and what to do about each, following the classification in the v2 `createPod`
//! description: the decision is a pure function of the status and the problem body.

use std::time::Duration;

use serde::Deserialize;

/// An RFC 9457 problem body; v1-style `{"error"}`/`{"message"}` bodies are read too.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Problem {
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub errors: Option<Vec<String>>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
}

impl Problem {
    /// Parses a body; anything that is not a problem object becomes its (shortened) text.
    pub fn from_body(body: &[u8]) -> Problem {
        serde_json::from_slice::<Problem>(body).unwrap_or_else(|_| Problem {
            detail: Some(truncate(&String::from_utf8_lossy(body), 300)),
            ..Problem::default()
        })
    }

    /// The most specific human-readable text available.
    pub fn text(&self) -> String {
        [&self.detail, &self.error, &self.message, &self.title]
            .into_iter()
            .flatten()
            .find(|text| !text.trim().is_empty())
            .cloned()
            .unwrap_or_else(|| "no detail given".to_owned())
    }
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// Capacity refusals carry no code, only wordings (api-notes P2); these are the known ones.
const CAPACITY_PHRASES: [&str; 6] = [
    "no longer any instances available",
    "no instances currently available",
    "does not have the resources to deploy",
    "could not find any pods with required specifications",
    "not enough free gpus",
    "no instances available",
];

/// Whether a 400's detail reads as "no capacity for this GPU/data centre".
pub fn is_capacity_detail(detail: &str) -> bool {
    let detail = detail.to_lowercase();
    CAPACITY_PHRASES
        .iter()
        .any(|phrase| detail.contains(phrase))
}

/// A failed RunPod call. Messages never contain the API key: the client never puts it
/// anywhere but the `Authorization` header.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    #[error(
        "RunPod rejected the request as invalid (422): {detail}{}",
        list(errors)
    )]
    Invalid { detail: String, errors: Vec<String> },
    #[error("RunPod has no capacity for this GPU type and data centre (400): {detail}")]
    Capacity { detail: String },
    #[error("RunPod refused the request (400): {detail}")]
    BadRequest { detail: String },
    #[error("RunPod rejected the API key (401): {detail}")]
    Unauthorized { detail: String },
    #[error("the RunPod account has insufficient balance (402): {detail}")]
    PaymentRequired { detail: String },
    #[error("the RunPod API key or account cannot use this (403): {detail}")]
    Forbidden { detail: String },
    #[error("not found on RunPod (404): {detail}")]
    NotFound { detail: String },
    /// A 404 that is not a problem document: the path does not exist, which means a wrong
    /// `--runpod-api-url`, not a missing pod. Never read as "already deleted" (api-notes P8).
    #[error(
        "RunPod has no such endpoint (404 {detail:?}); check --runpod-api-url (the server root, without /v2)"
    )]
    NoSuchEndpoint { detail: String },
    #[error("RunPod reports a conflict with the pod's current state (409): {detail}")]
    Conflict { detail: String },
    #[error("RunPod rate limit reached (429), retry after {}s: {detail}", retry_after.as_secs())]
    RateLimited {
        retry_after: Duration,
        detail: String,
    },
    #[error("RunPod failed ({status}): {detail}")]
    Server { status: u16, detail: String },
    #[error("RunPod did not answer within {}s", timeout.as_secs_f32())]
    Timeout { timeout: Duration },
    #[error("could not reach RunPod: {message}")]
    Transport { message: String },
    #[error("RunPod answered {status} with a body that could not be read: {message}")]
    Decode { status: u16, message: String },
    #[error("RunPod answered an unexpected {status}: {detail}")]
    Unexpected { status: u16, detail: String },
}

fn list(errors: &[String]) -> String {
    if errors.is_empty() {
        String::new()
    } else {
        format!(" [{}]", errors.join("; "))
    }
}

/// What a caller should do after an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The request itself is wrong; retrying cannot help (422, 401).
    Fix,
    /// Try the next placement candidate (400 capacity or rule, 403 pool access).
    NextCandidate,
    /// Nothing will succeed until a human acts (402).
    Stop,
    /// Read the pod again before deciding (409).
    Reread,
    /// Wait and retry the same request (429 after `Retry-After`, 5xx and timeouts with
    /// backoff). For a create, the outcome is unknown: look the pod up first.
    Retry,
    /// The resource is gone (404).
    Gone,
}

impl ApiError {
    /// Builds the error for a non-success response.
    pub fn from_response(status: u16, retry_after: Option<Duration>, body: &[u8]) -> ApiError {
        let problem = Problem::from_body(body);
        let detail = problem.text();
        // A missing resource is a JSON document (RFC 9457, or v1's `{"error"}`); a path no
        // route serves is the router's plain text. Decided by the body, not the header.
        let json_body =
            serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|value| value.is_object());
        match status {
            404 if !json_body => ApiError::NoSuchEndpoint { detail },
            400 if is_capacity_detail(&detail) => ApiError::Capacity { detail },
            400 => ApiError::BadRequest { detail },
            401 => ApiError::Unauthorized { detail },
            402 => ApiError::PaymentRequired { detail },
            403 => ApiError::Forbidden { detail },
            404 => ApiError::NotFound { detail },
            409 => ApiError::Conflict { detail },
            422 => ApiError::Invalid {
                detail,
                errors: problem.errors.unwrap_or_default(),
            },
            429 => ApiError::RateLimited {
                retry_after: retry_after.unwrap_or(Duration::from_secs(1)),
                detail,
            },
            500..=599 => ApiError::Server { status, detail },
            _ => ApiError::Unexpected { status, detail },
        }
    }

    /// The classification from the spec's create description.
    pub fn recovery(&self) -> Recovery {
        match self {
            ApiError::Invalid { .. }
            | ApiError::Unauthorized { .. }
            | ApiError::NoSuchEndpoint { .. } => Recovery::Fix,
            ApiError::Capacity { .. }
            | ApiError::BadRequest { .. }
            | ApiError::Forbidden { .. } => Recovery::NextCandidate,
            ApiError::PaymentRequired { .. } => Recovery::Stop,
            ApiError::Conflict { .. } => Recovery::Reread,
            ApiError::NotFound { .. } => Recovery::Gone,
            ApiError::RateLimited { .. }
            | ApiError::Server { .. }
            | ApiError::Timeout { .. }
            | ApiError::Transport { .. } => Recovery::Retry,
            // A body we cannot read or a status the spec does not list: retrying is the
            // cautious choice, and creates look the pod up first anyway.
            ApiError::Decode { .. } | ApiError::Unexpected { .. } => Recovery::Retry,
        }
    }

    /// Whether a create that failed this way may still have created the pod (api-notes P3).
    pub fn create_outcome_unknown(&self) -> bool {
        matches!(
            self,
            ApiError::Server { .. }
                | ApiError::Timeout { .. }
                | ApiError::Transport { .. }
                | ApiError::Decode { .. }
                | ApiError::Unexpected { .. }
        )
    }

    /// A short label for metrics and events.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::Invalid { .. } => "invalid",
            ApiError::Capacity { .. } => "capacity",
            ApiError::BadRequest { .. } => "bad_request",
            ApiError::Unauthorized { .. } => "unauthorized",
            ApiError::PaymentRequired { .. } => "payment_required",
            ApiError::Forbidden { .. } => "forbidden",
            ApiError::NotFound { .. } => "not_found",
            ApiError::NoSuchEndpoint { .. } => "no_such_endpoint",
            ApiError::Conflict { .. } => "conflict",
            ApiError::RateLimited { .. } => "rate_limited",
            ApiError::Server { .. } => "server",
            ApiError::Timeout { .. } => "timeout",
            ApiError::Transport { .. } => "transport",
            ApiError::Decode { .. } => "decode",
            ApiError::Unexpected { .. } => "unexpected",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(status: u16, body: &str) -> (Recovery, &'static str) {
        let error = ApiError::from_response(status, Some(Duration::from_secs(7)), body.as_bytes());
        (error.recovery(), error.kind())
    }

    #[test]
    fn every_row_of_the_create_table() {
        let problem = |detail: &str| format!(r#"{{"title":"t","status":0,"detail":"{detail}"}}"#);
        assert_eq!(
            classify(
                422,
                r#"{"title":"Unprocessable Entity","status":422,"detail":"Request validation failed.","errors":["$: additional properties 'bogus' not allowed"]}"#
            ),
            (Recovery::Fix, "invalid")
        );
        assert_eq!(
            classify(
                400,
                &problem(
                    "There are no longer any instances available with the requested specifications. Please refresh and try again."
                )
            ),
            (Recovery::NextCandidate, "capacity")
        );
        assert_eq!(
            classify(
                400,
                &problem("allowedCudaVersions and minCudaVersion are mutually exclusive")
            ),
            (Recovery::NextCandidate, "bad_request")
        );
        assert_eq!(
            classify(402, &problem("Insufficient balance")),
            (Recovery::Stop, "payment_required")
        );
        assert_eq!(
            classify(403, &problem("no access")),
            (Recovery::NextCandidate, "forbidden")
        );
        assert_eq!(
            classify(409, &problem("not allowed")),
            (Recovery::Reread, "conflict")
        );
        assert_eq!(
            classify(429, &problem("rate limit exceeded for the minute window")),
            (Recovery::Retry, "rate_limited")
        );
        assert_eq!(classify(503, "upstream"), (Recovery::Retry, "server"));
        assert_eq!(
            classify(404, &problem("pod not found")),
            (Recovery::Gone, "not_found")
        );
        // The router's plain-text 404 is a wrong URL, never "already gone" (api-notes P8).
        assert_eq!(
            classify(404, "404 page not found"),
            (Recovery::Fix, "no_such_endpoint")
        );
        assert_eq!(
            classify(401, &problem("bad key")),
            (Recovery::Fix, "unauthorized")
        );
    }

    #[test]
    fn capacity_wordings_from_the_field() {
        for detail in [
            "There are no longer any instances available with enough disk space.",
            "create pod: There are no instances currently available.",
            "This machine does not have the resources to deploy your pod. Please try a different machine",
            "create pod: could not find any pods with required specifications",
            "There are not enough free GPUs on the host machine to start this pod.",
        ] {
            assert!(is_capacity_detail(detail), "{detail}");
        }
        assert!(!is_capacity_detail("name must not be empty"));
    }

    #[test]
    fn messages_carry_detail_and_validation_errors() {
        let error = ApiError::from_response(422, None,
            br#"{"title":"Unprocessable Entity","status":422,"detail":"Request validation failed.","errors":["$.bogus: not allowed"]}"#,
        );
        assert_eq!(
            error.to_string(),
            "RunPod rejected the request as invalid (422): Request validation failed. [$.bogus: not allowed]"
        );
        let v1 = ApiError::from_response(404, None, br#"{"error":"pod not found","status":404}"#);
        assert!(v1.to_string().ends_with("pod not found"));
        let retry = ApiError::from_response(429, Some(Duration::from_secs(12)), b"{}");
        assert!(retry.to_string().contains("retry after 12s"));
        assert!(
            ApiError::Server {
                status: 500,
                detail: String::new()
            }
            .create_outcome_unknown()
        );
        assert!(
            !ApiError::Capacity {
                detail: String::new()
            }
            .create_outcome_unknown()
        );
    }
}
