//! Vast.ai errors and what each means for the caller, as a pure function of the status and
//! the body. Vast.ai's bodies vary (`{"success":false,"error":..,"msg":..}`, `{"detail":..}`
//! for 429s, `{"msg":..}` or plain text), and 404 is not always "not found".

use std::time::Duration;

use serde::Deserialize;

/// The fields an error body may carry.
#[derive(Debug, Clone, Default, Deserialize)]
struct Body {
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    msg: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    detail: Option<String>,
}

/// A failed Vast.ai call. Messages never contain the API key: the client puts it nowhere but
/// the `Authorization` header.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VastError {
    #[error("Vast.ai rejected the API key ({status}): {detail}")]
    Unauthorized { status: u16, detail: String },
    #[error("Vast.ai refused the request (403): {detail}")]
    Forbidden { detail: String },
    /// The offer was taken or cannot start now: nothing was bought; try another offer, never
    /// this id again.
    #[error("the Vast.ai offer is no longer available ({status}): {detail}")]
    NoSuchAsk { status: u16, detail: String },
    #[error("not found on Vast.ai (404): {detail}")]
    NotFound { detail: String },
    /// A 404 that is no API error: the path does not exist, i.e. a wrong `--vastai-api-url`.
    #[error(
        "Vast.ai has no such endpoint (404 {detail:?}); check --vastai-api-url (the server root, without /api)"
    )]
    NoSuchEndpoint { detail: String },
    #[error("the Vast.ai account has insufficient credit ({status}): {detail}")]
    InsufficientCredit { status: u16, detail: String },
    #[error("Vast.ai rejected the request as invalid ({status} {slug}): {detail}")]
    Invalid {
        status: u16,
        slug: String,
        detail: String,
    },
    #[error("Vast.ai rate limit reached (429): {detail}")]
    RateLimited { detail: String },
    #[error("Vast.ai failed ({status}): {detail}")]
    Server { status: u16, detail: String },
    #[error("Vast.ai did not answer within {}s", timeout.as_secs_f32())]
    Timeout { timeout: Duration },
    #[error("could not reach Vast.ai: {message}")]
    Transport { message: String },
    #[error("Vast.ai answered {status} with a body that could not be read: {message}")]
    Decode { status: u16, message: String },
    /// A 2xx whose body says `"success": false`.
    #[error("Vast.ai answered success=false: {detail}")]
    Refused { detail: String },
    #[error("Vast.ai answered an unexpected {status}: {detail}")]
    Unexpected { status: u16, detail: String },
}

fn shorten(text: &str) -> String {
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// What a body says, and its error slug.
fn read_body(body: &[u8]) -> (Option<String>, String) {
    match serde_json::from_slice::<Body>(body) {
        Ok(parsed) => {
            let text = [&parsed.msg, &parsed.detail, &parsed.message, &parsed.error]
                .into_iter()
                .flatten()
                .find(|text| !text.trim().is_empty())
                .cloned()
                .unwrap_or_else(|| "no detail given".to_owned());
            (parsed.error, shorten(&text))
        }
        Err(_) => (None, shorten(String::from_utf8_lossy(body).trim())),
    }
}

fn mentions_credit(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "insufficient credit",
        "insufficient balance",
        "add credit",
        "insufficient_credit",
    ]
    .iter()
    .any(|phrase| text.contains(phrase))
}

impl VastError {
    /// Classifies a non-2xx answer.
    pub fn from_response(status: u16, body: &[u8]) -> VastError {
        let (slug, detail) = read_body(body);
        let slug_is = |want: &str| slug.as_deref() == Some(want);
        let no_such_ask = slug_is("no_such_ask") || detail.contains("no_such_ask");
        match status {
            402 => VastError::InsufficientCredit { status, detail },
            _ if mentions_credit(&detail) || slug.as_deref().is_some_and(mentions_credit) => {
                VastError::InsufficientCredit { status, detail }
            }
            404 | 410 if no_such_ask => VastError::NoSuchAsk { status, detail },
            401 => VastError::Unauthorized { status, detail },
            403 | 404 if slug_is("auth_error") || detail.contains("Invalid user key") => {
                VastError::Unauthorized { status, detail }
            }
            403 => VastError::Forbidden { detail },
            404 if slug.is_some() => VastError::NotFound { detail },
            404 => VastError::NoSuchEndpoint { detail },
            429 => VastError::RateLimited { detail },
            400..=499 => VastError::Invalid {
                status,
                slug: slug.unwrap_or_default(),
                detail,
            },
            500..=599 => VastError::Server { status, detail },
            _ => VastError::Unexpected { status, detail },
        }
    }

    /// Short label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            VastError::Unauthorized { .. } => "unauthorized",
            VastError::Forbidden { .. } => "forbidden",
            VastError::NoSuchAsk { .. } => "no_such_ask",
            VastError::NotFound { .. } => "not_found",
            VastError::NoSuchEndpoint { .. } => "no_such_endpoint",
            VastError::InsufficientCredit { .. } => "insufficient_credit",
            VastError::Invalid { .. } => "invalid",
            VastError::RateLimited { .. } => "rate_limited",
            VastError::Server { .. } => "server",
            VastError::Timeout { .. } => "timeout",
            VastError::Transport { .. } => "transport",
            VastError::Decode { .. } => "decode",
            VastError::Refused { .. } => "refused",
            VastError::Unexpected { .. } => "unexpected",
        }
    }

    /// Worth another try for a call that changes nothing or is idempotent (reads, destroy,
    /// logs): the service may answer next time.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            VastError::RateLimited { .. }
                | VastError::Server { .. }
                | VastError::Timeout { .. }
                | VastError::Transport { .. }
        )
    }

    /// After a create: the instance may exist although the answer says nothing of it (the
    /// answer was lost, cut or garbled). Such a create is never repeated blindly.
    pub fn create_may_have_happened(&self) -> bool {
        matches!(
            self,
            VastError::Server { .. }
                | VastError::Timeout { .. }
                | VastError::Transport { .. }
                | VastError::Decode { .. }
                | VastError::Unexpected { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classify(status: u16, body: &str) -> VastError {
        VastError::from_response(status, body.as_bytes())
    }

    #[test]
    fn the_error_table() {
        let gone = classify(
            404,
            r#"{"success":false,"error":"invalid_args","msg":"error 404/3603: no_such_ask Instance type by id 5 is not available.","ask_id":5}"#,
        );
        assert!(matches!(gone, VastError::NoSuchAsk { status: 404, .. }));
        let cannot_start = classify(
            410,
            r#"{"success":false,"error":"no_such_ask","msg":"error 410/3907: no longer available."}"#,
        );
        assert!(matches!(
            cannot_start,
            VastError::NoSuchAsk { status: 410, .. }
        ));
        assert!(matches!(
            classify(
                401,
                r#"{"success":false,"error":"auth_error","msg":"Invalid user key"}"#
            ),
            VastError::Unauthorized { .. }
        ));
        // Search documents a 404 for a bad key.
        assert!(matches!(
            classify(
                404,
                r#"{"success":false,"error":"auth_error","msg":"Invalid user key"}"#
            ),
            VastError::Unauthorized { .. }
        ));
        assert!(matches!(
            classify(404, r#"{"success":false,"error":"not_found"}"#),
            VastError::NotFound { .. }
        ));
        assert!(matches!(
            classify(404, r#"{"detail":"Not Found"}"#),
            VastError::NoSuchEndpoint { .. }
        ));
        assert!(matches!(
            classify(404, "<html>nginx</html>"),
            VastError::NoSuchEndpoint { .. }
        ));
        let limited = classify(
            429,
            r#"{"detail":"API requests too frequent endpoint threshold=4.5"}"#,
        );
        assert_eq!(
            limited,
            VastError::RateLimited {
                detail: "API requests too frequent endpoint threshold=4.5".into()
            }
        );
        assert!(matches!(
            classify(429, "API requests too frequent"),
            VastError::RateLimited { .. }
        ));
        assert!(matches!(
            classify(
                400,
                r#"{"success":false,"error":"insufficient_credit","msg":"x"}"#
            ),
            VastError::InsufficientCredit { .. }
        ));
        assert!(matches!(
            classify(402, "{}"),
            VastError::InsufficientCredit { .. }
        ));
        assert!(matches!(
            classify(
                400,
                r#"{"success":false,"error":"invalid_args","msg":"disk"}"#
            ),
            VastError::Invalid { .. }
        ));
        assert!(matches!(
            classify(502, "Bad Gateway"),
            VastError::Server { status: 502, .. }
        ));
    }

    #[test]
    fn only_unclear_answers_leave_a_create_in_doubt() {
        let doubtful = [
            classify(502, ""),
            VastError::Timeout {
                timeout: Duration::from_secs(1),
            },
            VastError::Transport {
                message: "reset".into(),
            },
            VastError::Decode {
                status: 200,
                message: "eof".into(),
            },
        ];
        assert!(doubtful.iter().all(VastError::create_may_have_happened));
        let clear = [
            classify(404, r#"{"error":"no_such_ask","msg":"no_such_ask"}"#),
            classify(429, "{}"),
            classify(400, r#"{"error":"invalid_args"}"#),
            classify(401, "{}"),
        ];
        assert!(!clear.iter().any(VastError::create_may_have_happened));
    }
}
