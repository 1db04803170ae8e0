//! Responses as the simulator builds them: JSON, RFC 9457 problems, 204s and SSE streams, each
//! convertible to an HTTP response and to the [`Exchange`] record tests check afterwards.

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::exchange::{Exchange, Operation};

/// The v2 "no capacity" detail (api-notes P2; also what P11's missing `gpu.count` gets).
pub(crate) const CAPACITY_DETAIL: &str = "There are no longer any instances available with the requested specifications. Please refresh and try again.";

/// Body of a reply.
pub(crate) enum ReplyBody {
    Json {
        content_type: &'static str,
        value: Value,
    },
    Empty,
    /// An SSE stream; recorded without a body.
    Stream {
        content_type: &'static str,
        body: Body,
    },
}

/// A response before it goes on the wire.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: ReplyBody,
    /// Made by an injected fault rather than by the simulated service (recorded, not sent).
    pub injected: bool,
}

impl Reply {
    /// `application/json` with this status.
    pub fn json(status: u16, value: Value) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            injected: false,
            body: ReplyBody::Json {
                content_type: "application/json",
                value,
            },
        }
    }

    /// An RFC 9457 problem (`application/problem+json`, the spec's `ErrorResponse`).
    pub fn problem(status: u16, detail: impl Into<String>) -> Reply {
        Reply::problem_body(status, detail.into(), None)
    }

    /// 422 with one message per violation in `errors`.
    pub fn validation(errors: Vec<String>) -> Reply {
        Reply::problem_body(422, "Request validation failed.".to_owned(), Some(errors))
    }

    /// 404 for a resource that does not exist (or no longer does).
    pub fn not_found(what: &str) -> Reply {
        Reply::problem(404, format!("{what} not found"))
    }

    /// A path no route serves: the router's plain-text 404, as the real service's gateway
    /// answers it (api-notes P8). Unlike a missing pod it is not a problem document, so a
    /// client can tell a wrong base URL from "already gone".
    pub fn no_such_path() -> Reply {
        Reply::stream(
            404,
            "text/plain; charset=utf-8",
            Body::from("404 page not found\n"),
        )
    }

    /// The capacity 400.
    pub fn capacity() -> Reply {
        Reply::problem(400, CAPACITY_DETAIL)
    }

    fn problem_body(status: u16, detail: String, errors: Option<Vec<String>>) -> Reply {
        let title = StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error");
        let mut value = json!({"title": title, "status": status, "detail": detail});
        if let (Some(errors), Some(object)) = (errors, value.as_object_mut()) {
            object.insert("errors".to_owned(), json!(errors));
        }
        Reply {
            status,
            headers: Vec::new(),
            injected: false,
            body: ReplyBody::Json {
                content_type: "application/problem+json",
                value,
            },
        }
    }

    /// 204 without a body.
    pub fn no_content() -> Reply {
        Reply {
            status: 204,
            headers: Vec::new(),
            injected: false,
            body: ReplyBody::Empty,
        }
    }

    /// A streamed body (SSE).
    pub fn stream(status: u16, content_type: &'static str, body: Body) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            injected: false,
            body: ReplyBody::Stream { content_type, body },
        }
    }

    /// Marks the reply as the work of an injected fault.
    pub fn injected(mut self) -> Reply {
        self.injected = true;
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: impl Into<String>) -> Reply {
        self.headers.push((name.to_ascii_lowercase(), value.into()));
        self
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    fn content_type(&self) -> Option<&'static str> {
        match &self.body {
            ReplyBody::Json { content_type, .. } | ReplyBody::Stream { content_type, .. } => {
                Some(content_type)
            }
            ReplyBody::Empty => None,
        }
    }

    /// The record of this reply for `SimulatorHandle::exchanges`.
    pub fn exchange(
        &self,
        arrival: u64,
        method: &str,
        path: &str,
        operation: Option<Operation>,
    ) -> Exchange {
        let content_type = self.content_type().map(str::to_owned);
        let mut headers = self.headers.clone();
        if let Some(ct) = &content_type {
            headers.insert(0, ("content-type".to_owned(), ct.clone()));
        }
        Exchange {
            arrival,
            at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                }),
            method: method.to_owned(),
            path: path.to_owned(),
            operation,
            status: self.status,
            content_type,
            headers,
            body: match &self.body {
                ReplyBody::Json { value, .. } => Some(value.clone()),
                ReplyBody::Empty | ReplyBody::Stream { .. } => None,
            },
            injected: self.injected,
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let content_type = self.content_type();
        let mut response = match self.body {
            ReplyBody::Json { value, .. } => Response::new(Body::from(value.to_string())),
            ReplyBody::Empty => Response::new(Body::empty()),
            ReplyBody::Stream { body, .. } => Response::new(body),
        };
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        if let Some(ct) = content_type {
            headers.insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static(ct),
            );
        }
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(&value),
            ) {
                headers.append(name, value);
            }
        }
        response
    }
}
