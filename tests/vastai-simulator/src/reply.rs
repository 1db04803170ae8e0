//! Responses as Vast.ai shapes them: JSON bodies, `{"success":false,"error":..,"msg":..}`
//! errors, `{"detail":..}` for 429s, text for log files.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// A response about to be sent.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    body: Body,
}

#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Text(String),
}

impl Reply {
    pub fn ok(body: Value) -> Reply {
        Reply {
            status: 200,
            body: Body::Json(body),
        }
    }

    pub fn success() -> Reply {
        Reply::ok(json!({"success": true}))
    }

    /// The usual error body.
    pub fn error(status: u16, error: &str, msg: impl Into<String>) -> Reply {
        Reply {
            status,
            body: Body::Json(json!({"success": false, "error": error, "msg": msg.into()})),
        }
    }

    /// 400 `invalid_args`.
    pub fn invalid(msg: impl Into<String>) -> Reply {
        Reply::error(400, "invalid_args", msg)
    }

    /// An offer that cannot be bought (404 gone, 410 cannot start now).
    pub fn no_such_ask(status: u16, ask_id: u64) -> Reply {
        let msg = if status == 410 {
            format!(
                "error 410/3907: no_such_ask Instance type by id {ask_id} is no longer available."
            )
        } else {
            format!("error 404/3603: no_such_ask Instance type by id {ask_id} is not available.")
        };
        let error = if status == 410 {
            "no_such_ask"
        } else {
            "invalid_args"
        };
        Reply {
            status,
            body: Body::Json(
                json!({"success": false, "error": error, "msg": msg, "ask_id": ask_id}),
            ),
        }
    }

    /// 429 with FastAPI's `detail` and no `Retry-After`.
    pub fn too_frequent(detail: String) -> Reply {
        Reply {
            status: 429,
            body: Body::Json(json!({"detail": detail})),
        }
    }

    pub fn text(status: u16, text: String) -> Reply {
        Reply {
            status,
            body: Body::Text(text),
        }
    }

    pub fn no_such_path() -> Reply {
        Reply {
            status: 404,
            body: Body::Json(json!({"detail": "Not Found"})),
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let (content_type, bytes) = match self.body {
            Body::Json(value) => ("application/json", value.to_string()),
            Body::Text(text) => ("text/plain; charset=utf-8", text),
        };
        let mut response = (status, bytes).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        response
    }
}
