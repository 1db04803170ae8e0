//! The control API under `/_sim/` for out-of-process users (the CLI simulator in e2e tests and
//! the demo). No authentication, no rate limiting, not recorded as exchanges.
//!
//! - `GET /_sim/healthz` → `{"status":"ok"}`
//! - `GET /_sim/ledger` → `[LedgerEntry]` (timestamps RFC 3339)
//! - `GET /_sim/volumes` → `[VolumeEntry]`: every network volume ever created, with its bill
//! - `GET /_sim/exchanges` → `[Exchange]`
//! - `POST /_sim/faults` with a `Fault` → 204; `DELETE /_sim/faults` → 204
//! - `POST /_sim/pods/{id}/status` with `{"status":"EXITED"}` → the pod JSON, 404 if unknown
//! - `POST /_sim/pods/{id}/logs` with `{"line":"…","source":"container"|"system"}` → 204

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::faults::Fault;
use crate::ledger::LedgerEntry;
use crate::lifecycle::{self, Events};
use crate::logs::LogSource;
use crate::pods::PodStatus;
use crate::reply::Reply;
use crate::state::{Shared, World};

pub(crate) fn router() -> Router<Arc<Shared>> {
    Router::new()
        .route(
            "/healthz",
            get(|| async { Reply::json(200, json!({"status": "ok"})) }),
        )
        .route("/ledger", get(ledger_handler))
        .route("/volumes", get(volumes_handler))
        .route("/exchanges", get(exchanges_handler))
        .route("/faults", post(add_fault).delete(clear_faults_handler))
        .route("/pods/{id}/status", post(status_handler))
        .route("/pods/{id}/logs", post(log_handler))
}

/// Every pod ever created, in creation order.
pub(crate) fn ledger(shared: &Shared) -> Vec<LedgerEntry> {
    shared.with_world(|w| w.pods.iter().map(|p| p.ledger_entry()).collect())
}

/// Forces a pod's status; false if the pod is unknown or already terminated.
pub(crate) fn set_status(shared: &Shared, id: &str, status: PodStatus) -> bool {
    let now = Instant::now();
    shared.with_world(|world| {
        if status == PodStatus::Terminated {
            return world.terminate(id, now, &shared.clock);
        }
        let Some(pod) = world.live_pod_mut(id) else {
            return false;
        };
        let mut events = Events::new(&shared.clock);
        lifecycle::force(pod, status, now, &mut events);
        world.flush(events);
        true
    })
}

/// Appends a log line to a live pod; false if the pod is unknown or terminated.
pub(crate) fn push_log(shared: &Shared, id: &str, source: LogSource, line: &str) -> bool {
    let now = shared.clock.system(Instant::now());
    shared.with_world(|world| {
        if world.live_pod(id).is_none() {
            return false;
        }
        world.log(id, source, line, now);
        true
    })
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|e| Box::new(Reply::problem(400, format!("invalid body: {e}")).into_response()))
}

async fn ledger_handler(State(shared): State<Arc<Shared>>) -> Response {
    match serde_json::to_value(ledger(&shared)) {
        Ok(value) => Reply::json(200, value).into_response(),
        Err(e) => Reply::problem(500, e.to_string()).into_response(),
    }
}

async fn volumes_handler(State(shared): State<Arc<Shared>>) -> Response {
    match serde_json::to_value(shared.with_world(World::volume_ledger)) {
        Ok(value) => Reply::json(200, value).into_response(),
        Err(e) => Reply::problem(500, e.to_string()).into_response(),
    }
}

async fn exchanges_handler(State(shared): State<Arc<Shared>>) -> Response {
    let exchanges: Vec<_> = shared.with_world(|w| w.exchanges.iter().cloned().collect());
    match serde_json::to_value(exchanges) {
        Ok(value) => Reply::json(200, value).into_response(),
        Err(e) => Reply::problem(500, e.to_string()).into_response(),
    }
}

async fn add_fault(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let fault: Fault = match parse(&body) {
        Ok(fault) => fault,
        Err(response) => return *response,
    };
    if let Err(detail) = fault.validate() {
        return Reply::problem(400, detail).into_response();
    }
    tracing::info!(?fault, "runpod simulator: fault injected");
    shared.with_world(|w| w.faults.push(fault));
    Reply::no_content().into_response()
}

async fn clear_faults_handler(State(shared): State<Arc<Shared>>) -> Response {
    shared.with_world(|w| w.faults.clear());
    Reply::no_content().into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusBody {
    status: PodStatus,
}

async fn status_handler(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let request: StatusBody = match parse(&body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    if !set_status(&shared, &id, request.status) {
        return Reply::not_found("pod").into_response();
    }
    let pod = shared.with_world(|w| w.pod(&id).map(|p| p.to_json(Instant::now())));
    Reply::json(200, pod.unwrap_or(Value::Null)).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogBody {
    line: String,
    #[serde(default)]
    source: Option<LogSource>,
}

async fn log_handler(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let request: LogBody = match parse(&body) {
        Ok(request) => request,
        Err(response) => return *response,
    };
    let source = request.source.unwrap_or(LogSource::Container);
    if push_log(&shared, &id, source, &request.line) {
        Reply::no_content().into_response()
    } else {
        Reply::not_found("pod").into_response()
    }
}
