//! `POST /v2/pods`: schema validation (422), the handler's cross-field rules (400), the P11
//! trap, GPU/CPU resolution and data-centre placement, then the new pod.
//!
//! Placement walks the request's `dataCenterIds` in order (all catalogue data centres when it
//! names none) and takes the first one that exists, has stock of the GPU type (not NONE) and
//! is not taken out by a `Capacity` fault. Nothing placeable → the capacity 400. A `Misplace`
//! fault then moves the pod to a data centre the request did not name.
//! Defaults where the spec is silent: `disk` 50 GB (v1's default), `ports` [], `args` "".

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::contract::SpecValidator;
use crate::faults::{FaultSet, MatchContext};
use crate::lifecycle::{self, Events};
use crate::pods::{Compute, PodRecord, PodStatus, Script};
use crate::reply::Reply;
use crate::scenario::{Availability, Manufacturer, Scenario, cuda_version};
use crate::state::{Clock, World};

const DEFAULT_DISK_GB: u32 = 50;
const MAX_HTTP_PORTS: usize = 10;
/// The simulator's cap on exposed ports (RunPod documents only the http limit).
const MAX_PORTS: usize = 100;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    name: String,
    image: Option<String>,
    template_id: Option<String>,
    args: Option<String>,
    disk: Option<u32>,
    ports: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    registry: Option<String>,
    cloud: Option<String>,
    cpu: Option<CpuRequest>,
    gpu: Option<GpuRequest>,
    data_center_ids: Option<Vec<String>>,
    global_networking: Option<bool>,
    mounts: Option<Value>,
    start_jupyter: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GpuRequest {
    id: String,
    count: Option<u32>,
    allowed_cuda_versions: Option<Vec<String>>,
    min_cuda_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CpuRequest {
    id: String,
    vcpu_count: u32,
}

/// What the request body tells fault matching, even when the body is invalid.
#[derive(Debug, Default, Clone)]
pub(crate) struct CreateHints {
    pub name: Option<String>,
    pub gpu_id: Option<String>,
}

impl CreateHints {
    pub fn from_body(body: &[u8]) -> CreateHints {
        let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_owned);
        CreateHints {
            name: text(value.get("name")),
            gpu_id: text(value.get("gpu").and_then(|g| g.get("id"))),
        }
    }
}

/// A create that passed every check and has a data centre.
#[derive(Debug)]
pub(crate) struct Plan {
    name: String,
    image: String,
    args: String,
    disk: u32,
    ports: Vec<String>,
    env: BTreeMap<String, String>,
    registry: Option<String>,
    mounts: Value,
    compute: Compute,
    cloud: String,
    pub data_center_id: String,
    cuda_version: Option<String>,
    cost_per_hr: f64,
    global_networking: bool,
}

/// A refused create, with the `Capacity` faults that fired on the way.
pub(crate) struct Refusal {
    pub reply: Reply,
    pub fired: Vec<usize>,
}

impl From<Reply> for Refusal {
    fn from(reply: Reply) -> Refusal {
        Refusal {
            reply,
            fired: Vec::new(),
        }
    }
}

/// Checks the body and places the pod, without changing anything. `Ok` carries the `Capacity`
/// faults that fired (data centres skipped before the chosen one).
/// `volume_dc`: the data centre of the network volume the body mounts (checked by the caller),
/// where the pod must run.
pub(crate) fn plan(
    scenario: &Scenario,
    spec: &SpecValidator,
    faults: &FaultSet,
    body: &[u8],
    volume_dc: Option<&str>,
) -> Result<(Plan, Vec<usize>), Refusal> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Reply::problem(400, format!("request body is not valid JSON: {e}")))?;
    spec.validate_request("CreatePodRequest", &value)
        .map_err(Reply::validation)?;
    let req: CreateBody = serde_json::from_value(value.clone())
        .map_err(|e| Reply::validation(vec![format!("$: {e}")]))?;
    check_rules(&req, &value)?;

    let template = match &req.template_id {
        Some(id) => Some(
            scenario
                .templates
                .iter()
                .find(|t| &t.id == id)
                .ok_or_else(|| Reply::problem(404, format!("template {id:?} not found")))?,
        ),
        None => None,
    };
    let image = req
        .image
        .clone()
        .or_else(|| template.map(|t| t.image.clone()))
        .unwrap_or_default();
    let mut env = template.map(|t| t.env.clone()).unwrap_or_default();
    env.extend(req.env.clone().unwrap_or_default());
    if req.start_jupyter == Some(true) && !env.contains_key("JUPYTER_PASSWORD") {
        env.insert("JUPYTER_PASSWORD".to_owned(), fastrand::u64(..).to_string());
    }
    let ports = req
        .ports
        .clone()
        .or_else(|| template.and_then(|t| t.ports.clone()))
        .unwrap_or_default();
    check_ports(&ports)?;
    let cloud = req.cloud.clone().unwrap_or_else(|| "SECURE".to_owned());
    let global_networking = req.global_networking.unwrap_or(false);
    let ctx = MatchContext {
        operation: Some(crate::exchange::Operation::CreatePod),
        gpu_id: req.gpu.as_ref().map(|g| g.id.as_str()),
        data_center_id: None,
        pod_name: Some(&req.name),
    };

    let (compute, cuda, price) = match (&req.gpu, &req.cpu) {
        (Some(gpu), _) => resolve_gpu(scenario, gpu, &cloud, global_networking)?,
        (None, Some(cpu)) => resolve_cpu(scenario, cpu, global_networking)?,
        (None, None) => {
            return Err(Reply::problem(400, "exactly one of `gpu` or `cpu` must be set").into());
        }
    };
    let stock = |dc: &str| {
        let dc = scenario.data_center(dc);
        let level = match &compute {
            Compute::Gpu { id, .. } => dc.and_then(|d| d.gpu_availability.get(id)),
            Compute::Cpu { id, .. } => dc.and_then(|d| d.cpu_availability.get(id)),
        };
        level.copied().unwrap_or(Availability::None)
    };

    let mut candidates: Vec<String> = match req.data_center_ids.as_deref() {
        Some(ids) if !ids.is_empty() => ids.to_vec(),
        _ => scenario.data_centers.iter().map(|d| d.id.clone()).collect(),
    };
    // A network volume is in one data centre: the pod runs there, on Secure Cloud, or nowhere.
    if let Some(volume_dc) = volume_dc {
        if !candidates.iter().any(|dc| dc == volume_dc) {
            return Err(Reply::problem(
                400,
                format!(
                    "the network volume is in {volume_dc}, which dataCenterIds does not include"
                ),
            )
            .into());
        }
        if cloud != "SECURE" {
            return Err(Reply::problem(400, "network volumes need cloudType SECURE").into());
        }
        candidates = vec![volume_dc.to_owned()];
    }
    let mut fired = Vec::new();
    let mut chosen = None;
    for id in candidates {
        let Some(dc) = scenario.data_center(&id) else {
            continue;
        };
        if (global_networking && !dc.global_network) || stock(&id) == Availability::None {
            continue;
        }
        if let Some(fault) = faults.capacity_block(&ctx, &id) {
            fired.push(fault);
            continue;
        }
        chosen = Some(id);
        break;
    }
    let Some(mut data_center_id) = chosen else {
        return Err(Refusal {
            reply: Reply::capacity(),
            fired,
        });
    };
    let requested = req.data_center_ids.as_deref().unwrap_or_default();
    if !requested.is_empty()
        && let Some((fault, wanted)) = faults.misplace(&ctx)
    {
        // RunPod treats `dataCenterIds` as a preference: put the pod somewhere else.
        let elsewhere = scenario
            .data_centers
            .iter()
            .filter(|dc| !requested.contains(&dc.id))
            .filter(|dc| wanted.is_none_or(|w| w == dc.id))
            .find(|dc| {
                (!global_networking || dc.global_network) && stock(&dc.id) != Availability::None
            });
        if let Some(dc) = elsewhere {
            data_center_id = dc.id.clone();
            fired.push(fault);
        }
    }
    let plan = Plan {
        name: req.name.clone(),
        image,
        args: req
            .args
            .clone()
            .or_else(|| template.and_then(|t| t.args.clone()))
            .unwrap_or_default(),
        disk: req
            .disk
            .or_else(|| template.and_then(|t| t.disk))
            .unwrap_or(DEFAULT_DISK_GB),
        ports,
        env,
        registry: req.registry.clone(),
        mounts: req.mounts.clone().unwrap_or_else(|| json!({})),
        compute,
        cloud,
        data_center_id,
        cuda_version: cuda,
        cost_per_hr: (price * 1000.0).round() / 1000.0,
        global_networking,
    };
    Ok((plan, fired))
}

/// The handler-layer rules the schema cannot express (all 400).
fn check_rules(req: &CreateBody, value: &Value) -> Result<(), Reply> {
    let bad = |detail: &str| Err(Reply::problem(400, detail));
    match (&req.gpu, &req.cpu) {
        (Some(_), Some(_)) => return bad("exactly one of `gpu` or `cpu` must be set, not both"),
        (None, None) => return bad("exactly one of `gpu` or `cpu` must be set"),
        _ => {}
    }
    if let Some(gpu) = &req.gpu
        && gpu
            .allowed_cuda_versions
            .as_ref()
            .is_some_and(|v| !v.is_empty())
        && gpu.min_cuda_version.is_some()
    {
        return bad("gpu.allowedCudaVersions and gpu.minCudaVersion cannot be combined");
    }
    let mounts = value.get("mounts");
    let has = |key: &str| mounts.and_then(|m| m.get(key)).is_some();
    if has("persistent") && has("network") {
        return bad("mounts.persistent and mounts.network cannot be combined");
    }
    if let Some(cpu) = &req.cpu {
        if has("persistent") {
            return bad("mounts.persistent is not allowed on CPU pods");
        }
        if !cpu.vcpu_count.is_power_of_two() {
            return bad("cpu.vcpuCount must be a power of two");
        }
    }
    Ok(())
}

/// Ports are `PORT/http` or `PORT/tcp`, each port once, at most 10 http and 100 in all.
pub(crate) fn check_ports(ports: &[String]) -> Result<(), Reply> {
    if ports.len() > MAX_PORTS {
        return Err(Reply::problem(
            400,
            format!("at most {MAX_PORTS} ports can be exposed"),
        ));
    }
    let mut seen = Vec::new();
    for (i, spec) in ports.iter().enumerate() {
        let Some((port, _)) = lifecycle::parse_port(spec) else {
            return Err(Reply::problem(
                400,
                format!("ports[{i}] {spec:?} is not PORT/http or PORT/tcp with PORT 1-65535"),
            ));
        };
        if seen.contains(&port) {
            return Err(Reply::problem(
                400,
                format!("ports[{i}]: port {port} is listed twice"),
            ));
        }
        seen.push(port);
    }
    if ports.iter().filter(|p| p.ends_with("/http")).count() > MAX_HTTP_PORTS {
        return Err(Reply::problem(
            400,
            format!("at most {MAX_HTTP_PORTS} http ports can be exposed"),
        ));
    }
    Ok(())
}

/// GPU id, cloud and count checks, the P11 trap, and the CUDA version the host reports.
fn resolve_gpu(
    scenario: &Scenario,
    gpu: &GpuRequest,
    cloud: &str,
    global_networking: bool,
) -> Result<(Compute, Option<String>, f64), Refusal> {
    let spec = scenario.gpu(&gpu.id).ok_or_else(|| {
        Reply::problem(
            400,
            format!(
                "unknown GPU type id {:?}: use an id from GET /v2/catalog/gpus, verbatim",
                gpu.id
            ),
        )
    })?;
    let (offered, max, price) = if cloud == "COMMUNITY" {
        (
            spec.community,
            spec.max_count.community,
            spec.price.community,
        )
    } else {
        (spec.secure, spec.max_count.secure, spec.price.secure)
    };
    if !offered {
        return Err(Reply::problem(
            400,
            format!("GPU type {:?} is not offered on {cloud} cloud", gpu.id),
        )
        .into());
    }
    if global_networking && spec.manufacturer != Manufacturer::Nvidia {
        return Err(Reply::problem(400, "globalNetworking requires an NVIDIA GPU").into());
    }
    // api-notes P11: the spec says `count` defaults to 1, but without it the real service
    // answers the misleading capacity 400.
    let Some(count) = gpu.count else {
        return Err(Reply::capacity().into());
    };
    if count > max {
        return Err(Reply::problem(
            400,
            format!("gpu.count {count} exceeds the maximum of {max} GPUs per pod for {:?} on {cloud} cloud", gpu.id),
        )
        .into());
    }
    let allowed = gpu.allowed_cuda_versions.as_deref().unwrap_or_default();
    let floor = gpu.min_cuda_version.as_deref().and_then(cuda_version);
    let usable: Vec<&String> = spec
        .cuda_versions
        .iter()
        .filter(|v| allowed.is_empty() || allowed.contains(v))
        .filter(|v| floor.is_none_or(|f| cuda_version(v).is_some_and(|v| v >= f)))
        .collect();
    let constrained = !allowed.is_empty() || floor.is_some();
    if constrained && usable.is_empty() {
        return Err(Reply::capacity().into());
    }
    let cuda = usable.into_iter().max_by_key(|v| cuda_version(v)).cloned();
    Ok((
        Compute::Gpu {
            id: spec.id.clone(),
            count,
        },
        cuda,
        price * f64::from(count),
    ))
}

/// CPU flavour and size checks; CPU pods have no CUDA version.
fn resolve_cpu(
    scenario: &Scenario,
    cpu: &CpuRequest,
    global_networking: bool,
) -> Result<(Compute, Option<String>, f64), Refusal> {
    if global_networking {
        return Err(Reply::problem(400, "globalNetworking requires an NVIDIA GPU pod").into());
    }
    let flavor = scenario
        .cpu_flavors
        .iter()
        .find(|f| f.id == cpu.id)
        .ok_or_else(|| Reply::problem(400, format!("unknown CPU flavor id {:?}", cpu.id)))?;
    if cpu.vcpu_count > flavor.max_vcpu {
        return Err(Reply::problem(
            400,
            format!(
                "cpu.vcpuCount {} exceeds the maximum of {} for {}",
                cpu.vcpu_count, flavor.max_vcpu, flavor.id
            ),
        )
        .into());
    }
    let compute = Compute::Cpu {
        id: flavor.id.clone(),
        vcpu: cpu.vcpu_count,
        memory: cpu.vcpu_count.saturating_mul(flavor.ram_gb_per_vcpu),
    };
    Ok((
        compute,
        None,
        f64::from(cpu.vcpu_count) * flavor.price_per_vcpu,
    ))
}

/// Creates the planned pod (PROVISIONING) and returns its id.
pub(crate) fn commit(
    world: &mut World,
    plan: Plan,
    scenario: &Scenario,
    clock: &Clock,
    create_status: u16,
) -> String {
    let now = Instant::now();
    let id = world.new_pod_id();
    let rng = &mut world.rng;
    let ip = format!(
        "{}.{}.{}.{}",
        rng.u8(64..=199),
        rng.u8(1..=254),
        rng.u8(1..=254),
        rng.u8(1..=254)
    );
    let global_ip = format!(
        "10.{}.{}.{}",
        rng.u8(0..=255),
        rng.u8(0..=255),
        rng.u8(1..=254)
    );
    let proxy_user = format!("{id}-{:08x}", rng.u32(..));
    let mut pod = PodRecord {
        id: id.clone(),
        name: plan.name,
        image: plan.image,
        args: plan.args,
        disk: plan.disk,
        ports: plan.ports,
        env: plan.env,
        registry: plan.registry,
        mounts: plan.mounts,
        compute: plan.compute,
        cloud: plan.cloud,
        data_center_id: plan.data_center_id,
        cuda_version: plan.cuda_version,
        cost_per_hr: plan.cost_per_hr,
        locked: false,
        global_networking: plan.global_networking,
        global_networking_next: None,
        ip,
        global_ip,
        proxy_user,
        status: PodStatus::Provisioning,
        phase_since: now,
        running_since: None,
        started_at: None,
        published: None,
        script: Script::default(),
        created_at: clock.system(now),
        created_instant: now,
        terminated_at: None,
        stopped_at: None,
        gpu_billing_ended_at: None,
        create_status,
    };
    let mut events = Events::new(clock);
    lifecycle::begin_run(&mut pod, now, &scenario.images, &mut events);
    world.insert_pod(pod);
    world.flush(events);
    id
}
