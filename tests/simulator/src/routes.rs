//! Request dispatch for `/v2`: authentication, rate limiting, fault injection, the operation
//! itself, rate-limit headers, and the exchange record. Anything outside `/v2` and `/_sim` is a
//! problem+json 404.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::response::{IntoResponse, Response};

use crate::catalog;
use crate::control;
use crate::create::{self, CreateHints};
use crate::exchange::Operation;
use crate::faults::{Effect, Fired, MatchContext};
use crate::pod_api;
use crate::query::Query;
use crate::ratelimit::Decision;
use crate::reply::Reply;
use crate::state::{Shared, World};
use crate::volumes;

/// Request bodies above this are refused with 413.
const MAX_BODY: usize = 1 << 20;
/// Keep at most this many exchanges (the oldest are dropped) so a long demo stays bounded.
const MAX_EXCHANGES: usize = 200_000;

/// The whole HTTP surface: `/_sim` control API, `/v2` API, 404 elsewhere.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .nest("/_sim", control::router())
        .fallback(dispatch)
        .with_state(shared)
}

async fn dispatch(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let path = request.uri().path();
    if path == "/v2" || path.starts_with("/v2/") {
        api(shared, request).await.into_response()
    } else {
        Reply::no_such_path().into_response()
    }
}

/// A `/v2` route.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    ListPods,
    CreatePod,
    GetPod(String),
    UpdatePod(String),
    DeletePod(String),
    PodAction(String),
    GetPodLogs(String),
    ListGpuTypes,
    GetGpuType(String),
    ListDataCenters,
    GetDataCenter(String),
    ListVolumes,
    CreateVolume,
    GetVolume(String),
    UpdateVolume(String),
    DeleteVolume(String),
    MethodNotAllowed(&'static str),
    NotFound,
}

impl Route {
    fn resolve(method: &Method, path: &str) -> Route {
        let rest = path.strip_prefix("/v2").unwrap_or_default();
        let segments: Vec<&str> = rest.split('/').skip(1).collect();
        let id = |s: &str| percent_decode(s);
        let get = method == Method::GET;
        match segments.as_slice() {
            ["pods"] => match *method {
                Method::GET => Route::ListPods,
                Method::POST => Route::CreatePod,
                _ => Route::MethodNotAllowed("GET, POST"),
            },
            ["pods", pod] if !pod.is_empty() => match *method {
                Method::GET => Route::GetPod(id(pod)),
                Method::PATCH => Route::UpdatePod(id(pod)),
                Method::DELETE => Route::DeletePod(id(pod)),
                _ => Route::MethodNotAllowed("GET, PATCH, DELETE"),
            },
            ["pods", pod, "action"] if !pod.is_empty() => match *method {
                Method::POST => Route::PodAction(id(pod)),
                _ => Route::MethodNotAllowed("POST"),
            },
            ["pods", pod, "logs"] if !pod.is_empty() => {
                if get {
                    Route::GetPodLogs(id(pod))
                } else {
                    Route::MethodNotAllowed("GET")
                }
            }
            ["network-volumes"] => match *method {
                Method::GET => Route::ListVolumes,
                Method::POST => Route::CreateVolume,
                _ => Route::MethodNotAllowed("GET, POST"),
            },
            ["network-volumes", volume] if !volume.is_empty() => match *method {
                Method::GET => Route::GetVolume(id(volume)),
                Method::PATCH => Route::UpdateVolume(id(volume)),
                Method::DELETE => Route::DeleteVolume(id(volume)),
                _ => Route::MethodNotAllowed("GET, PATCH, DELETE"),
            },
            ["catalog", "gpus"] if get => Route::ListGpuTypes,
            ["catalog", "gpus", gpu] if get && !gpu.is_empty() => Route::GetGpuType(id(gpu)),
            ["catalog", "datacenters"] if get => Route::ListDataCenters,
            ["catalog", "datacenters", dc] if get && !dc.is_empty() => Route::GetDataCenter(id(dc)),
            ["catalog", "gpus"] | ["catalog", "datacenters"] => Route::MethodNotAllowed("GET"),
            ["catalog", "gpus" | "datacenters", x] if !x.is_empty() => {
                Route::MethodNotAllowed("GET")
            }
            _ => Route::NotFound,
        }
    }

    fn operation(&self) -> Option<Operation> {
        Some(match self {
            Route::ListPods => Operation::ListPods,
            Route::CreatePod => Operation::CreatePod,
            Route::GetPod(_) => Operation::GetPod,
            Route::UpdatePod(_) => Operation::UpdatePod,
            Route::DeletePod(_) => Operation::DeletePod,
            Route::PodAction(_) => Operation::PodAction,
            Route::GetPodLogs(_) => Operation::GetPodLogs,
            Route::ListGpuTypes => Operation::ListGpuTypes,
            Route::GetGpuType(_) => Operation::GetGpuType,
            Route::ListDataCenters => Operation::ListDataCenters,
            Route::GetDataCenter(_) => Operation::GetDataCenter,
            Route::ListVolumes => Operation::ListNetworkVolumes,
            Route::CreateVolume => Operation::CreateNetworkVolume,
            Route::GetVolume(_) => Operation::GetNetworkVolume,
            Route::UpdateVolume(_) => Operation::UpdateNetworkVolume,
            Route::DeleteVolume(_) => Operation::DeleteNetworkVolume,
            Route::MethodNotAllowed(_) | Route::NotFound => return None,
        })
    }

    fn pod_id(&self) -> Option<&str> {
        match self {
            Route::GetPod(id)
            | Route::UpdatePod(id)
            | Route::DeletePod(id)
            | Route::PodAction(id)
            | Route::GetPodLogs(id) => Some(id),
            _ => None,
        }
    }
}

/// `%20` → space (GPU ids contain spaces); invalid escapes are kept as written.
fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

async fn api(shared: Arc<Shared>, request: Request) -> Reply {
    let (parts, body) = request.into_parts();
    let method = parts.method.as_str().to_owned();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let route = Route::resolve(&parts.method, parts.uri.path());
    let operation = route.operation();
    let record = |arrival: u64, reply: &Reply| {
        let exchange = reply.exchange(arrival, &method, &path, operation);
        tracing::debug!(%method, %path, status = reply.status, "runpod simulator request");
        shared.with_world(|world| {
            if world.exchanges.len() >= MAX_EXCHANGES {
                world.exchanges.pop_front();
            }
            world.exchanges.push_back(exchange);
        });
    };

    let auth_error = match bearer(&parts.headers) {
        None => Some("missing bearer token"),
        Some(token) if !shared.accepts(token) => Some("invalid API key"),
        Some(_) => None,
    };
    if let Some(detail) = auth_error {
        let reply = Reply::problem(401, detail);
        record(shared.with_world(World::next_arrival), &reply);
        return reply;
    }

    let (arrival, decision) = shared.with_world(|world| {
        let arrival = world.next_arrival();
        (arrival, world.limiter.check(Instant::now()))
    });
    let rate = match decision {
        Decision::Allowed(headers) => headers,
        Decision::Limited {
            headers,
            retry_after,
            window,
        } => {
            let mut reply =
                Reply::problem(429, format!("rate limit exceeded for the {window} window"))
                    .header("retry-after", retry_after.to_string());
            if let Some(headers) = headers {
                reply = reply
                    .header("ratelimit", headers.ratelimit)
                    .header("ratelimit-policy", headers.policy);
            }
            record(arrival, &reply);
            return reply;
        }
    };

    let (reply, delay) = match to_bytes(body, MAX_BODY).await {
        Ok(bytes) => {
            let last_event_id = parts
                .headers
                .get("last-event-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            handle(
                &shared,
                &route,
                &parts.uri,
                &bytes,
                last_event_id.as_deref(),
            )
        }
        Err(_) => (
            Reply::problem(413, format!("request body is larger than {MAX_BODY} bytes")),
            Duration::ZERO,
        ),
    };
    let reply = match rate {
        Some(headers) => reply
            .header("ratelimit", headers.ratelimit)
            .header("ratelimit-policy", headers.policy),
        None => reply,
    };
    record(arrival, &reply);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    reply
}

/// The fault-matching context of a non-create request.
fn context<'a>(route: &'a Route, world: &'a World) -> MatchContext<'a> {
    let mut ctx = MatchContext {
        operation: route.operation(),
        ..MatchContext::default()
    };
    if let Some(pod) = route.pod_id().and_then(|id| world.live_pod(id)) {
        ctx.gpu_id = pod.gpu_id();
        ctx.data_center_id = Some(&pod.data_center_id);
        ctx.pod_name = Some(&pod.name);
    }
    match route {
        Route::GetGpuType(id) => ctx.gpu_id = Some(id),
        Route::GetDataCenter(id) => ctx.data_center_id = Some(id),
        _ => {}
    }
    ctx
}

/// The reply of a `Status` fault.
fn status_reply(status: u16, detail: Option<&str>, retry_after: Option<u32>) -> Reply {
    let default = match status {
        400 => "request could not be processed",
        402 => "insufficient balance: add credit to deploy this pod",
        403 => "access denied",
        404 => "resource not found",
        409 => "conflict with the current state of the resource",
        429 => "rate limit exceeded for the minute window",
        _ if status >= 500 => "Something went wrong. Please try again later or contact support.",
        _ => "request failed",
    };
    let reply = Reply::problem(status, detail.unwrap_or(default)).injected();
    match retry_after {
        Some(secs) => reply.header("retry-after", secs.to_string()),
        None => reply,
    }
}

fn failed_after_side_effect(status: u16) -> Reply {
    Reply::problem(
        status,
        "Something went wrong. Please try again later or contact support.",
    )
    .injected()
}

/// Runs one authenticated, counted request: faults first, then the operation.
fn handle(
    shared: &Arc<Shared>,
    route: &Route,
    uri: &axum::http::Uri,
    body: &[u8],
    last_event_id: Option<&str>,
) -> (Reply, Duration) {
    if *route == Route::CreatePod {
        return handle_create(shared, body);
    }
    let fired: Fired = shared.with_world(|world| {
        let fired = world.faults.response_faults(&context(route, world));
        world.faults.consume(&fired.used);
        fired
    });
    if let Some(Effect::Status {
        status,
        detail,
        retry_after,
    }) = &fired.effect
    {
        return (
            status_reply(*status, detail.as_deref(), *retry_after),
            fired.delay,
        );
    }
    if matches!(fired.effect, Some(Effect::EmptyList)) && *route == Route::ListPods {
        return (
            Reply::json(200, serde_json::Value::Array(Vec::new())).injected(),
            fired.delay,
        );
    }
    let query = match Query::parse(uri) {
        Ok(query) => query,
        Err(reply) => return (reply, fired.delay),
    };
    let scenario = &shared.scenario;
    let reply = match route {
        Route::ListPods => shared.with_world(|w| pod_api::list(shared, w, &query)),
        Route::GetPod(id) => shared.with_world(|w| pod_api::get(w, id)),
        Route::UpdatePod(id) => shared.with_world(|w| pod_api::update(shared, w, id, body)),
        Route::DeletePod(id) => shared.with_world(|w| pod_api::delete(shared, w, id)),
        Route::PodAction(id) => shared.with_world(|w| pod_api::action(shared, w, id, body)),
        Route::GetPodLogs(id) => pod_api::logs(shared, id, &query, last_event_id),
        Route::ListGpuTypes => catalog::list_gpus(scenario, &query),
        Route::GetGpuType(id) => catalog::get_gpu(scenario, id, &query),
        Route::ListDataCenters => catalog::list_data_centers(scenario, &query),
        Route::GetDataCenter(id) => catalog::get_data_center(scenario, id, &query),
        Route::ListVolumes => shared.with_world(|w| volumes::list(w)),
        Route::CreateVolume => {
            let data_centers: Vec<String> =
                scenario.data_centers.iter().map(|d| d.id.clone()).collect();
            shared.with_world(|w| volumes::create(w, &data_centers, body))
        }
        Route::GetVolume(id) => shared.with_world(|w| volumes::get(w, id)),
        Route::UpdateVolume(id) => shared.with_world(|w| volumes::update(w, id, body)),
        Route::DeleteVolume(id) => shared.with_world(|w| volumes::delete(w, id)),
        Route::MethodNotAllowed(allow) => {
            Reply::problem(405, "The requested method is not allowed for this path.")
                .header("allow", *allow)
        }
        Route::CreatePod | Route::NotFound => Reply::no_such_path(),
    };
    let reply = match fired.effect {
        Some(Effect::CreateThenFail { status }) if reply.is_success() => {
            failed_after_side_effect(status)
        }
        _ => reply,
    };
    (reply, fired.delay)
}

/// `POST /v2/pods`: plan (validation + placement), match faults (they may depend on the data
/// centre placement picks), then create for real unless a `Status` fault answers instead.
fn handle_create(shared: &Arc<Shared>, body: &[u8]) -> (Reply, Duration) {
    let hints = CreateHints::from_body(body);
    shared.with_world(|world| {
        let mounts = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|value| value.get("mounts").cloned())
            .unwrap_or_default();
        let volume_dc = match volumes::check_mount(world, &mounts) {
            Ok(dc) => dc,
            Err(reply) => return (reply, Duration::ZERO),
        };
        let planned = create::plan(
            &shared.scenario,
            shared.spec,
            &world.faults,
            body,
            volume_dc.as_deref(),
        );
        let data_center_id = planned
            .as_ref()
            .ok()
            .map(|(plan, _)| plan.data_center_id.clone());
        let ctx = MatchContext {
            operation: Some(Operation::CreatePod),
            gpu_id: hints.gpu_id.as_deref(),
            data_center_id: data_center_id.as_deref(),
            pod_name: hints.name.as_deref(),
        };
        let fired = world.faults.response_faults(&ctx);
        let mut used = fired.used.clone();
        let reply = match (&fired.effect, planned) {
            (
                Some(Effect::Status {
                    status,
                    detail,
                    retry_after,
                }),
                _,
            ) => status_reply(*status, detail.as_deref(), *retry_after),
            (_, Err(refusal)) => {
                used.extend(refusal.fired);
                refusal.reply
            }
            (effect, Ok((plan, capacity_fired))) => {
                used.extend(capacity_fired);
                let create_status = match effect {
                    Some(Effect::CreateThenFail { status }) => *status,
                    _ => 201,
                };
                let id =
                    create::commit(world, plan, &shared.scenario, &shared.clock, create_status);
                match (create_status, world.live_pod(&id)) {
                    (201, Some(pod)) => Reply::json(201, pod.to_json(Instant::now())),
                    _ => failed_after_side_effect(create_status),
                }
            }
        };
        world.faults.consume(&used);
        (reply, fired.delay)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_resolve_with_decoded_ids() {
        assert_eq!(
            Route::resolve(
                &Method::GET,
                "/v2/catalog/gpus/NVIDIA%20GeForce%20RTX%204090"
            ),
            Route::GetGpuType("NVIDIA GeForce RTX 4090".into())
        );
        assert_eq!(
            Route::resolve(&Method::PUT, "/v2/pods/abc"),
            Route::MethodNotAllowed("GET, PATCH, DELETE")
        );
        assert_eq!(Route::resolve(&Method::GET, "/v2/pods/"), Route::NotFound);
        assert_eq!(Route::resolve(&Method::GET, "/v2/nope"), Route::NotFound);
        assert_eq!(percent_decode("a%2"), "a%2");
    }
}
