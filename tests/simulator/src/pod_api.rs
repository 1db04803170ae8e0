//! The pod endpoints other than create: list, get, PATCH, DELETE, actions and logs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::create::check_ports;
use crate::lifecycle::{self, Events};
use crate::logs::{self, Cursor, LogSource};
use crate::pods::{Compute, PodStatus};
use crate::query::Query;
use crate::reply::Reply;
use crate::scenario::Manufacturer;
use crate::state::{Shared, World};
use crate::timefmt;

/// `GET /v2/pods`: live pods in creation order, minus those younger than `list_lag_ms`.
pub(crate) fn list(shared: &Shared, world: &World, query: &Query) -> Reply {
    let mut errors = Vec::new();
    let _include_cluster_pods = query.boolean("includeClusterPods", &mut errors);
    if !errors.is_empty() {
        return Reply::validation(errors);
    }
    let now = Instant::now();
    let lag = Duration::from_millis(shared.scenario.list_lag_ms);
    let pods: Vec<Value> = world
        .pods
        .iter()
        .filter(|p| !p.is_terminated() && now.saturating_duration_since(p.created_instant) >= lag)
        .map(|p| p.to_json(now))
        .collect();
    Reply::json(200, json!({"pods": pods}))
}

/// `GET /v2/pods/{id}`: 404 once terminated.
pub(crate) fn get(world: &World, id: &str) -> Reply {
    match world.live_pod(id) {
        Some(pod) => Reply::json(200, pod.to_json(Instant::now())),
        None => Reply::not_found("pod"),
    }
}

fn parse_json(body: &[u8]) -> Result<Value, Reply> {
    serde_json::from_slice(body)
        .map_err(|e| Reply::problem(400, format!("request body is not valid JSON: {e}")))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateBody {
    name: Option<String>,
    image: Option<String>,
    args: Option<String>,
    disk: Option<u32>,
    ports: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    mounts: Option<Value>,
    locked: Option<bool>,
    global_networking: Option<bool>,
    template_id: Option<String>,
}

/// `PATCH /v2/pods/{id}`: only the fields present change. Changing the container (image,
/// args, env, ports, disk) of a STARTING or RUNNING pod restarts its container, as RunPod
/// resets a pod on edit (api-notes P7); name, lock, registry and mount paths apply in place.
pub(crate) fn update(shared: &Shared, world: &mut World, id: &str, body: &[u8]) -> Reply {
    let value = match parse_json(body) {
        Ok(value) => value,
        Err(reply) => return reply,
    };
    if let Err(errors) = shared.spec.validate_request("UpdatePodRequest", &value) {
        return Reply::validation(errors);
    }
    let req: UpdateBody = match serde_json::from_value(value.clone()) {
        Ok(req) => req,
        Err(e) => return Reply::validation(vec![format!("$: {e}")]),
    };
    let template = match &req.template_id {
        Some(tid) => match shared.scenario.templates.iter().find(|t| &t.id == tid) {
            Some(t) => Some(t),
            None => return Reply::problem(404, format!("template {tid:?} not found")),
        },
        None => None,
    };
    let ports = req
        .ports
        .clone()
        .or_else(|| template.and_then(|t| t.ports.clone()));
    if let Some(ports) = &ports
        && let Err(reply) = check_ports(ports)
    {
        return reply;
    }
    let scenario = &shared.scenario;
    let Some(pod) = world.live_pod_mut(id) else {
        return Reply::not_found("pod");
    };
    if let Some(mounts) = &req.mounts
        && let Err(detail) = check_mounts(&pod.mounts, mounts)
    {
        return Reply::problem(400, detail);
    }
    if req.global_networking == Some(true) {
        let nvidia = match &pod.compute {
            Compute::Gpu { id, .. } => scenario
                .gpu(id)
                .is_some_and(|g| g.manufacturer == Manufacturer::Nvidia),
            Compute::Cpu { .. } => false,
        };
        let dc_ok = scenario
            .data_center(&pod.data_center_id)
            .is_some_and(|dc| dc.global_network);
        if !nvidia || !dc_ok {
            return Reply::problem(
                400,
                "globalNetworking requires an NVIDIA GPU pod in a global-networking data center",
            );
        }
    }

    let before = (
        pod.image.clone(),
        pod.args.clone(),
        pod.env.clone(),
        pod.ports.clone(),
        pod.disk,
    );
    if let Some(t) = template {
        pod.image = t.image.clone();
        if let Some(args) = &t.args {
            pod.args = args.clone();
        }
        if let Some(disk) = t.disk {
            pod.disk = disk;
        }
    }
    if let Some(name) = req.name {
        pod.name = name;
    }
    if let Some(image) = req.image {
        pod.image = image;
    }
    if let Some(args) = req.args {
        pod.args = args;
    }
    if let Some(disk) = req.disk {
        pod.disk = disk;
    }
    if let Some(ports) = ports {
        pod.ports = ports;
    }
    if req.env.is_some() || template.is_some_and(|t| !t.env.is_empty()) {
        let mut env = template.map(|t| t.env.clone()).unwrap_or_default();
        env.extend(req.env.unwrap_or_default());
        pod.env = env;
    }
    if let Some(registry) = value.get("registry") {
        pod.registry = registry.as_str().map(str::to_owned);
    }
    if let Some(mounts) = req.mounts
        && mounts.as_object().is_some_and(|m| !m.is_empty())
    {
        pod.mounts = mounts;
    }
    if let Some(locked) = req.locked {
        pod.locked = locked;
    }
    if let Some(enabled) = req.global_networking {
        pod.global_networking_next = Some(enabled);
    }
    let changed = before
        != (
            pod.image.clone(),
            pod.args.clone(),
            pod.env.clone(),
            pod.ports.clone(),
            pod.disk,
        );
    let now = Instant::now();
    let mut events = Events::new(&shared.clock);
    if changed && matches!(pod.status, PodStatus::Starting | PodStatus::Running) {
        events.system(pod, "Pod updated; restarting container", now);
        lifecycle::restart_container(pod, now, &scenario.images, &mut events);
    }
    let reply = Reply::json(200, pod.to_json(now));
    world.flush(events);
    reply
}

/// The PATCH rules for `mounts` from the `Mounts` description (all 400).
fn check_mounts(current: &Value, patch: &Value) -> Result<(), String> {
    let has = |v: &Value, key: &str| v.get(key).is_some();
    if has(patch, "persistent") && has(patch, "network") {
        return Err("mounts.persistent and mounts.network cannot be combined".into());
    }
    if patch
        .get("network")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        return Err("mounts.network cannot be cleared with []".into());
    }
    for kind in ["persistent", "network"] {
        if has(patch, kind) && !has(current, kind) {
            return Err(format!(
                "mounts.{kind} cannot be added: the mount kind is fixed when the pod is created"
            ));
        }
    }
    let volume = |v: &Value| {
        v.pointer("/network/0/volumeId")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    if has(patch, "network") && volume(patch) != volume(current) {
        return Err("mounts.network[0].volumeId cannot be changed".into());
    }
    Ok(())
}

/// `DELETE /v2/pods/{id}`: 204, then 404 (api-notes P8: clients treat that as done).
pub(crate) fn delete(shared: &Shared, world: &mut World, id: &str) -> Reply {
    if world.terminate(id, Instant::now(), &shared.clock) {
        Reply::no_content()
    } else {
        Reply::not_found("pod")
    }
}

#[derive(Debug, Deserialize)]
struct ActionBody {
    action: String,
}

/// `POST /v2/pods/{id}/action`: allowed per status as in the `podAction` description, else
/// 409. A locked pod refuses `stop` and `restart` with 409 (unlock it with PATCH first).
pub(crate) fn action(shared: &Shared, world: &mut World, id: &str, body: &[u8]) -> Reply {
    let value = match parse_json(body) {
        Ok(value) => value,
        Err(reply) => return reply,
    };
    if let Err(errors) = shared.spec.validate_request("PodActionRequest", &value) {
        return Reply::validation(errors);
    }
    let action = match serde_json::from_value::<ActionBody>(value) {
        Ok(body) => body.action,
        Err(e) => return Reply::validation(vec![format!("$: {e}")]),
    };
    let now = Instant::now();
    let Some(pod) = world.live_pod_mut(id) else {
        return Reply::not_found("pod");
    };
    let allowed = pod.status.actions();
    if !allowed.contains(&action.as_str()) {
        return Reply::problem(
            409,
            format!(
                "action {action:?} is not allowed while the pod is {}; allowed: {}",
                pod.status,
                allowed.join(", ")
            ),
        );
    }
    if pod.locked && matches!(action.as_str(), "stop" | "restart") {
        return Reply::problem(
            409,
            format!("pod is locked: unlock it (PATCH locked=false) before {action}"),
        );
    }
    let mut events = Events::new(&shared.clock);
    match action.as_str() {
        "start" => {
            events.system(pod, "Starting pod", now);
            lifecycle::begin_run(pod, now, &shared.scenario.images, &mut events);
        }
        "stop" => {
            pod.stopped_at.get_or_insert(shared.clock.system(now));
            events.system(pod, "Stopping container", now);
            lifecycle::enter_stopped(pod, PodStatus::Exited, now);
            events.system(pod, "Container stopped", now);
        }
        "restart" => {
            events.system(pod, "Restarting container", now);
            lifecycle::restart_container(pod, now, &shared.scenario.images, &mut events);
        }
        _ => {
            world.flush(events);
            world.terminate(id, now, &shared.clock);
            return Reply::no_content();
        }
    }
    let reply = Reply::json(200, pod.to_json(now));
    world.flush(events);
    reply
}

/// `GET /v2/pods/{id}/logs`: SSE backlog (`Last-Event-ID` > `since` > `tail`), then follow
/// until the pod is terminated.
pub(crate) fn logs(
    shared: &Arc<Shared>,
    id: &str,
    query: &Query,
    last_event_id: Option<&str>,
) -> Reply {
    let mut errors = Vec::new();
    let source = query.single("source").and_then(|s| {
        let parsed = LogSource::parse(s);
        if parsed.is_none() {
            errors.push(format!(
                "query.source: {s:?} is not one of container, system"
            ));
        }
        parsed
    });
    let tail = query.integer("tail", 0, 5000, &mut errors);
    let since = query.single("since").and_then(|s| {
        let parsed = timefmt::parse(s);
        if parsed.is_none() {
            errors.push(format!("query.since: {s:?} is not an RFC 3339 timestamp"));
        }
        parsed
    });
    let resume = last_event_id.and_then(|s| {
        let parsed = Cursor::from_event_id(s);
        if parsed.is_none() {
            errors.push(format!(
                "header.Last-Event-ID: {s:?} is not an event id of this stream"
            ));
        }
        parsed
    });
    if !errors.is_empty() {
        return Reply::validation(errors);
    }
    let tail = usize::try_from(tail.unwrap_or(100)).unwrap_or(100);
    let cursor = resume
        .or(since.map(Cursor::Since))
        .unwrap_or(Cursor::Tail(tail));
    let changes = shared.subscribe();
    let snapshot = shared.with_world(|world| {
        world.live_pod(id)?;
        Some((
            world.logs.backlog(id, source, cursor),
            world.logs.next_seq(),
        ))
    });
    let Some((backlog, next_seq)) = snapshot else {
        return Reply::not_found("pod");
    };
    let stream = logs::stream(
        shared.clone(),
        id.to_owned(),
        source,
        backlog,
        next_seq,
        changes,
    );
    Reply::stream(200, "text/event-stream", Body::from_stream(stream))
        .header("cache-control", "no-cache")
        .header("x-accel-buffering", "no")
}
