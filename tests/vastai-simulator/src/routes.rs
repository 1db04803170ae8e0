//! Request dispatch: authentication (bearer or `?api_key=`), per-route rate limits, faults, the
//! operation, and the per-route counters. Paths keep their trailing slashes, as every official
//! client sends them; anything else is a 404.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use crate::faults::Effect;
use crate::logs;
use crate::market;
use crate::ratelimit::Route;
use crate::reply::Reply;
use crate::state::{Shared, World};

/// Request bodies above this are refused.
const MAX_BODY: usize = 1 << 20;
/// The v1 list's page size limit.
const MAX_PAGE: usize = 25;
/// Columns `select_filters` may name (stored ones); computed ones answer 400.
const FILTERABLE: [&str; 6] = [
    "id",
    "label",
    "actual_status",
    "gpu_name",
    "verification",
    "machine_id",
];

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(dispatch).with_state(shared)
}

/// Where a request goes: the route and the id in its path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Api(Route, Option<u64>),
    LogFile(String),
    WrongMethod,
    NotFound,
}

fn resolve(method: &Method, path: &str) -> Target {
    let Some(rest) = path.strip_suffix('/') else {
        return match path
            .strip_prefix("/_logs/")
            .and_then(|p| p.strip_suffix(".log"))
        {
            Some(token) if *method == Method::GET => Target::LogFile(token.to_owned()),
            _ => Target::NotFound,
        };
    };
    let segments: Vec<&str> = rest.split('/').skip(1).collect();
    let id = |text: &str| text.parse::<u64>().ok();
    let (route, wanted, number) = match segments.as_slice() {
        ["api", "v0", "bundles"] => (Route::Search, Method::POST, None),
        ["api", "v0", "asks", ask] => match id(ask) {
            Some(ask) => (Route::Create, Method::PUT, Some(ask)),
            None => return Target::NotFound,
        },
        ["api", "v0", "instances", "request_logs", instance] => match id(instance) {
            Some(instance) => (Route::Logs, Method::PUT, Some(instance)),
            None => return Target::NotFound,
        },
        ["api", "v0", "instances", instance] => {
            let Some(instance) = id(instance) else {
                return Target::NotFound;
            };
            return match *method {
                Method::GET => Target::Api(Route::Get, Some(instance)),
                Method::PUT => Target::Api(Route::Manage, Some(instance)),
                Method::DELETE => Target::Api(Route::Destroy, Some(instance)),
                _ => Target::WrongMethod,
            };
        }
        ["api", "v1", "instances"] => (Route::List, Method::GET, None),
        ["api", "v0", "users", "current"] => (Route::User, Method::GET, None),
        _ => return Target::NotFound,
    };
    if *method == wanted {
        Target::Api(route, number)
    } else {
        Target::WrongMethod
    }
}

fn credential(headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim().to_owned());
    bearer.or_else(|| {
        Query::<HashMap<String, String>>::try_from_uri(uri)
            .ok()
            .and_then(|query| query.0.get("api_key").cloned())
    })
}

async fn dispatch(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    if parts.uri.path().starts_with("/_sim/") {
        let body = to_bytes(body, MAX_BODY).await.unwrap_or_default();
        return crate::control::handle(&shared, &parts.method, parts.uri.path(), &body)
            .unwrap_or_else(|| Reply::no_such_path().into_response());
    }
    let target = resolve(&parts.method, parts.uri.path());
    let (route, id) = match target {
        Target::Api(route, id) => (route, id),
        Target::LogFile(token) => {
            let timings = shared.timings();
            return shared
                .with_world(|world| logs::fetch(world, &token, Instant::now(), timings))
                .into_response();
        }
        Target::WrongMethod => {
            return Reply::error(405, "method_not_allowed", "Method Not Allowed").into_response();
        }
        Target::NotFound => return Reply::no_such_path().into_response(),
    };
    let Some(token) = credential(&parts.headers, &parts.uri).filter(|t| shared.accepts(t)) else {
        return Reply::error(401, "auth_error", "Invalid user key").into_response();
    };
    let body = match to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(_) => return Reply::invalid("request body too large").into_response(),
    };
    let base_url = parts
        .headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(|host| format!("http://{host}"))
        .unwrap_or_default();
    let (reply, delay) = shared.with_world(|world| {
        *world.counts.entry(route).or_default() += 1;
        if let Err(detail) = world.limiter.check(route, &token, Instant::now()) {
            *world.limited.entry(route).or_default() += 1;
            return (Reply::too_frequent(detail), Duration::ZERO);
        }
        let effect = world
            .faults
            .fire(route, id.filter(|_| route == Route::Create));
        match effect {
            Some(Effect::Status { status, error }) => {
                let error = error.unwrap_or_else(|| "server_error".to_owned());
                (
                    Reply::error(status, &error, "injected fault"),
                    Duration::ZERO,
                )
            }
            Some(Effect::EmptyList) => (list(&shared, world, &parts.uri, true), Duration::ZERO),
            Some(Effect::Delay { millis }) if route != Route::Create => (
                handle(&shared, world, route, id, &parts.uri, &body, &base_url),
                Duration::from_millis(millis),
            ),
            _ if route == Route::Create => {
                let created = market::create(&shared, world, id.unwrap_or_default(), &body, effect);
                (created.reply, created.delay)
            }
            _ => (
                handle(&shared, world, route, id, &parts.uri, &body, &base_url),
                Duration::ZERO,
            ),
        }
    });
    tracing::debug!(
        ?route,
        ?id,
        status = reply.status,
        "vastai simulator request"
    );
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    reply.into_response()
}

fn handle(
    shared: &Shared,
    world: &mut World,
    route: Route,
    id: Option<u64>,
    uri: &Uri,
    body: &[u8],
    base_url: &str,
) -> Reply {
    let id = id.unwrap_or_default();
    let now = Instant::now();
    let timings = shared.timings();
    match route {
        Route::Search => market::search(world, body),
        Route::Create => Reply::invalid("creates are handled by the market"),
        Route::Get => {
            let instance = world
                .instances
                .get(&id)
                .filter(|instance| instance.destroyed.is_none())
                .map(|instance| instance.to_json(now, timings));
            Reply::ok(json!({ "instances": instance }))
        }
        Route::List => list(shared, world, uri, false),
        Route::Destroy => match world.instances.get_mut(&id) {
            Some(instance) if instance.destroyed.is_none() => {
                instance.bill(now, timings);
                instance.destroyed = Some(now);
                instance.destroyed_epoch = Some(shared.epoch(now));
                Reply::success()
            }
            _ => Reply::error(404, "not_found", format!("instance {id} not found")),
        },
        Route::Manage => manage(world, id, body, shared.epoch(now)),
        Route::Logs => logs::request(world, id, body, base_url, shared.scenario.log_ready_polls),
        Route::User => {
            let spent: f64 = world
                .instances
                .values()
                .map(|i| i.gpu_cost + i.storage_billed)
                .sum();
            Reply::ok(
                json!({"id": 1, "email": "simulator@example.com", "credit": shared.scenario.credit - spent}),
            )
        }
    }
}

/// `PUT /api/v0/instances/{id}/`: `{"state":"stopped"|"running"}` or `{"label":..}`.
fn manage(world: &mut World, id: u64, body: &[u8], now_epoch: f64) -> Reply {
    let Some(instance) = world
        .instances
        .get_mut(&id)
        .filter(|i| i.destroyed.is_none())
    else {
        return Reply::error(404, "not_found", format!("instance {id} not found"));
    };
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    match (
        value.get("state").and_then(Value::as_str),
        value.get("label"),
    ) {
        (Some("stopped"), None) => {
            instance.order.stopped = true;
            if instance.stopped_epoch.is_none() {
                instance.stopped_epoch = Some(now_epoch);
            }
        }
        (Some("running"), None) => instance.order.stopped = false,
        (None, Some(Value::String(label))) if label.len() <= 1024 => {
            instance.order.label = Some(label.clone())
        }
        (None, Some(Value::String(_))) => return Reply::invalid("label_too_long"),
        _ => {
            return Reply::invalid(
                "expected {\"state\": \"stopped\"|\"running\"} or {\"label\": ...}",
            );
        }
    }
    Reply::success()
}

/// `GET /api/v1/instances/`: keyset pages of at most 25 by id, `select_filters` on stored
/// columns, instances younger than the list lag left out.
/// `GET /api/v1/instances/`; `empty`: a glitch (or a lagging replica) that answers 200 with no
/// instances while they exist and bill.
fn list(shared: &Shared, world: &World, uri: &Uri, empty: bool) -> Reply {
    let query = Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let limit = match query.get("limit").map(|l| l.parse::<i64>()) {
        None => MAX_PAGE,
        Some(Ok(limit)) if limit <= 0 => 5,
        Some(Ok(limit)) => usize::try_from(limit).unwrap_or(MAX_PAGE).min(MAX_PAGE),
        Some(Err(_)) => return Reply::error(400, "invalid_request", "limit is not an integer"),
    };
    let after = match query.get("after_token").filter(|t| !t.is_empty()) {
        None => None,
        Some(token) => match token
            .strip_prefix("tok-")
            .and_then(|n| u64::from_str_radix(n, 16).ok())
        {
            Some(after) => Some(after),
            None => return Reply::error(400, "invalid_token", "after_token cannot be decoded"),
        },
    };
    let descending = match query.get("order_by").filter(|o| !o.is_empty()) {
        None => false,
        Some(order) => match serde_json::from_str::<Value>(order)
            .ok()
            .as_ref()
            .and_then(Value::as_array)
        {
            Some(items) if items.iter().all(|i| i["col"] == "id") => {
                items.first().is_some_and(|i| i["dir"] == "desc")
            }
            _ => {
                return Reply::error(
                    400,
                    "invalid_request",
                    format!("order_by {order} is not supported (id only)"),
                );
            }
        },
    };
    let filters: Map<String, Value> = match query.get("select_filters").filter(|f| !f.is_empty()) {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(filters)) => filters,
            _ => {
                return Reply::error(
                    400,
                    "invalid_request",
                    "select_filters is not a JSON object",
                );
            }
        },
    };
    let mut parsed = Vec::new();
    for (column, ops) in &filters {
        if !FILTERABLE.contains(&column.as_str()) {
            return Reply::error(400, "invalid_request", format!("cannot filter on {column}"));
        }
        let mut wrapped = Map::new();
        wrapped.insert(column.clone(), ops.clone());
        match crate::filter::parse_instance_filter(&Value::Object(wrapped)) {
            Ok(mut more) => parsed.append(&mut more),
            Err(problem) => return Reply::error(400, "invalid_request", problem),
        }
    }
    let now = Instant::now();
    let timings = shared.timings();
    let lag = Duration::from_millis(shared.scenario.list_lag_ms);
    let mut rows: Vec<(u64, Map<String, Value>)> = world
        .instances
        .values()
        .filter(|i| {
            !empty && i.destroyed.is_none() && now.saturating_duration_since(i.created) >= lag
        })
        .filter_map(|i| Some((i.id, i.to_json(now, timings).as_object()?.clone())))
        .filter(|(_, row)| parsed.iter().all(|filter| filter.accepts(row)))
        .collect();
    if descending {
        rows.reverse();
    }
    let total = rows.len();
    let mut label_counts = Map::new();
    for (_, row) in &rows {
        let label = row
            .get("label")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let count = label_counts
            .get(&label)
            .and_then(Value::as_u64)
            .unwrap_or(0);
        label_counts.insert(label, json!(count + 1));
    }
    let page: Vec<(u64, Map<String, Value>)> = rows
        .into_iter()
        .filter(|(id, _)| {
            after.is_none_or(|after| if descending { *id < after } else { *id > after })
        })
        .take(limit + 1)
        .collect();
    let more = page.len() > limit;
    let page: Vec<_> = page.into_iter().take(limit).collect();
    let next_token = more
        .then(|| page.last().map(|(id, _)| format!("tok-{id:x}")))
        .flatten();
    let instances: Vec<Value> = page
        .into_iter()
        .map(|(_, row)| Value::Object(row))
        .collect();
    Reply::ok(json!({
        "success": true,
        "instances_found": instances.len(),
        "total_instances": total,
        "label_counts": label_counts,
        "next_token": next_token,
        "instances": instances,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_with_their_trailing_slashes() {
        assert_eq!(
            resolve(&Method::POST, "/api/v0/bundles/"),
            Target::Api(Route::Search, None)
        );
        assert_eq!(
            resolve(&Method::PUT, "/api/v0/asks/12/"),
            Target::Api(Route::Create, Some(12))
        );
        assert_eq!(
            resolve(&Method::GET, "/api/v0/instances/7/"),
            Target::Api(Route::Get, Some(7))
        );
        assert_eq!(
            resolve(&Method::DELETE, "/api/v0/instances/7/"),
            Target::Api(Route::Destroy, Some(7))
        );
        assert_eq!(
            resolve(&Method::PUT, "/api/v0/instances/request_logs/7/"),
            Target::Api(Route::Logs, Some(7))
        );
        assert_eq!(
            resolve(&Method::GET, "/api/v1/instances/"),
            Target::Api(Route::List, None)
        );
        assert_eq!(
            resolve(&Method::GET, "/_logs/abc.log"),
            Target::LogFile("abc".into())
        );
        assert_eq!(resolve(&Method::PUT, "/api/v0/asks/12"), Target::NotFound);
        assert_eq!(
            resolve(&Method::GET, "/api/v0/bundles/"),
            Target::WrongMethod
        );
        assert_eq!(
            resolve(&Method::GET, "/api/v0/instances/x/"),
            Target::NotFound
        );
        assert_eq!(resolve(&Method::GET, "/v2/pods"), Target::NotFound);
    }
}
