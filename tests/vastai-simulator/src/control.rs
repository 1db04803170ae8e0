//! The control API for tests that run the simulator as a process (`simulator --cloud vastai`),
//! outside Vast.ai's paths and without authentication, as the RunPod simulator's:
//!
//! - `GET /_sim/ledger` → every instance ever created, with its bill;
//! - `POST /_sim/faults` with a [`Fault`] → 204 (400 when invalid);
//! - `DELETE /_sim/faults` → 204;
//! - `POST /_sim/instances/{id}/status` with `{"status":"offline"}` → 204 (404 if not live);
//! - `POST /_sim/instances/{id}/outbid` → 204 (404 if not live, 409 if not a bid): a higher bid
//!   took the machine; the instance reads `stopped` while it intends to run, storage billing.

use std::time::Instant;

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::faults::Fault;
use crate::instance::Status;
use crate::state::Shared;

#[derive(Deserialize)]
struct StatusChange {
    status: Status,
}

/// Answers a control request, or `None` when `path` is not one.
pub(crate) fn handle(
    shared: &Shared,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response> {
    let rest = path.strip_prefix("/_sim/")?;
    let bad = |message: String| (StatusCode::BAD_REQUEST, message).into_response();
    Some(match (method, rest.trim_end_matches('/')) {
        (&Method::GET, "ledger") => axum::Json(shared.ledger()).into_response(),
        (&Method::POST, "faults") => match serde_json::from_slice::<Fault>(body) {
            Ok(fault) => match fault.validate() {
                Ok(()) => {
                    shared.with_world(|world| world.faults.push(fault));
                    StatusCode::NO_CONTENT.into_response()
                }
                Err(problem) => bad(problem),
            },
            Err(error) => bad(error.to_string()),
        },
        (&Method::DELETE, "faults") => {
            shared.with_world(|world| world.faults.clear());
            StatusCode::NO_CONTENT.into_response()
        }
        (&Method::POST, other) if other.ends_with("/outbid") => {
            let Some(id) = other
                .strip_prefix("instances/")
                .and_then(|r| r.strip_suffix("/outbid"))
                .and_then(|id| id.parse::<u64>().ok())
            else {
                return Some(StatusCode::NOT_FOUND.into_response());
            };
            let found = shared.with_world(|world| {
                world
                    .instances
                    .get_mut(&id)
                    .filter(|instance| instance.destroyed.is_none())
                    .map(|instance| {
                        let bid = instance.order.bid.is_some();
                        instance.outbid |= bid;
                        if bid && instance.stopped_epoch.is_none() {
                            instance.stopped_epoch = Some(shared.epoch(Instant::now()));
                        }
                        bid
                    })
            });
            match found {
                Some(true) => StatusCode::NO_CONTENT.into_response(),
                Some(false) => (
                    StatusCode::CONFLICT,
                    format!("instance {id} is on-demand: only a bid can be outbid"),
                )
                    .into_response(),
                None => StatusCode::NOT_FOUND.into_response(),
            }
        }
        (&Method::POST, other) => {
            let Some(id) = other
                .strip_prefix("instances/")
                .and_then(|r| r.strip_suffix("/status"))
                .and_then(|id| id.parse::<u64>().ok())
            else {
                return Some(StatusCode::NOT_FOUND.into_response());
            };
            let change = match serde_json::from_slice::<StatusChange>(body) {
                Ok(change) => change,
                Err(error) => return Some(bad(error.to_string())),
            };
            let found = shared.with_world(|world| {
                world
                    .instances
                    .get_mut(&id)
                    .filter(|instance| instance.destroyed.is_none())
                    .map(|instance| instance.forced = Some(change.status))
                    .is_some()
            });
            if found {
                StatusCode::NO_CONTENT.into_response()
            } else {
                StatusCode::NOT_FOUND.into_response()
            }
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    })
}
