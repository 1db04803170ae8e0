//! What the chaos soak knows of each cloud: its simulator's scenario, the controller's flags,
//! the faults it injects, and its ledger read into one shape.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

/// The cloud a soak runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    RunPod,
    VastAi,
}

/// Images the simulators know (by substring), and what their containers do.
pub const EXITS_ZERO: &str = "chaos/exits-zero:1";
pub const EXITS_THREE: &str = "chaos/exits-three:1";
pub const SERVES: &str = "chaos/serves:1";

/// How long a container of the exiting images runs.
const RUNS_MS: u64 = 2500;

impl Cloud {
    pub fn name(self) -> &'static str {
        match self {
            Cloud::RunPod => "runpod",
            Cloud::VastAi => "vastai",
        }
    }

    pub fn node(self) -> &'static str {
        match self {
            Cloud::RunPod => "chaos-runpod",
            Cloud::VastAi => "chaos-vastai",
        }
    }

    pub fn namespace(self) -> &'static str {
        match self {
            Cloud::RunPod => "chaos-runpod",
            Cloud::VastAi => "chaos-vastai",
        }
    }

    /// The simulator's world: fast lifecycles, a list that lags creates, a quota the soak
    /// runs into, and (Vast.ai) an offer for every create the soak may make.
    pub fn scenario(self, lifecycles: usize) -> Value {
        match self {
            Cloud::RunPod => json!({
                "provisioning_ms": 600, "starting_ms": 400, "ports_ms": 200, "list_lag_ms": 1500,
                "rate_limits": [{"name": "minute", "quota": 600, "window_secs": 60}],
                "images": [
                    {"match": "exits-zero", "outcome": "EXITED", "after_ms": RUNS_MS,
                     "logs": ["working"], "exit_code": 0},
                    {"match": "exits-three", "outcome": "EXITED", "after_ms": RUNS_MS,
                     "logs": ["failing"], "exit_code": 3},
                    {"match": "serves", "logs": ["serving"]}
                ]
            }),
            Cloud::VastAi => {
                // Each offer sells once; creates that fail after buying, and lost answers,
                // buy too.
                let offers: Vec<Value> = (0..lifecycles * 2 + 100)
                    .map(|i| {
                        let id = 10_000 + i as u64;
                        json!({"id": id, "machine_id": id, "host_id": id / 10,
                               "gpu_name": "RTX 4090", "num_gpus": 1, "gpu_ram": 24564,
                               "dph_base": 0.30 + 0.0001 * (i % 100) as f64,
                               "storage_cost": 0.15, "geolocation": "Poland, PL",
                               "verification": "verified", "hosting_type": 1,
                               "reliability": 0.995})
                    })
                    .collect();
                // Vast.ai's documented limits, ten times faster (the controller divides its
                // pacing alike): search 10 per 6 s, creates 450 ms apart with a 1.2 s penalty.
                let limit = |interval_ms: u64| json!({"interval_ms": interval_ms});
                let rate_limits = json!([
                    ["search", {"per_window": 10, "window_ms": 6000}],
                    ["create", {"interval_ms": 450, "penalty_ms": 1200}],
                    ["destroy", limit(300)], ["get", limit(200)], ["list", limit(100)],
                    ["manage", limit(100)], ["logs", limit(100)]
                ]);
                json!({
                    "offers": offers, "rate_limits": rate_limits,
                    "provisioning_ms": 500, "loading_ms": 500, "list_lag_ms": 1500,
                    "log_ready_polls": 1, "credit": 1_000_000.0,
                    "images": [
                        {"contains": "exits-zero",
                         "behaviour": {"kind": "exit", "after_ms": RUNS_MS, "code": 0},
                         "logs": ["working"]},
                        {"contains": "exits-three",
                         "behaviour": {"kind": "exit", "after_ms": RUNS_MS, "code": 3},
                         "logs": ["failing"]},
                        {"contains": "serves", "behaviour": {"kind": "run"}, "logs": ["serving"]}
                    ]
                })
            }
        }
    }

    /// The controller's flags besides leader election (the same for both replicas).
    pub fn controller_args(self, cluster: &str, api_url: &str) -> Vec<String> {
        let mut args: Vec<String> = [
            "--nodename",
            self.node(),
            "--cluster-id",
            cluster,
            "--reconcile-interval",
            "2s",
            // The default settle time, as in production.
            "--create-settle",
            "30s",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        if self == Cloud::VastAi {
            args.extend(
                [
                    "--provider",
                    "vastai",
                    "--vastai-api-url",
                    api_url,
                    "--vastai-regions",
                    "Europe",
                    // The simulator's list lags creates by 1.5 s; a lost answer comes after 8.
                    "--vastai-read-lag",
                    "10s",
                    "--vastai-timeout",
                    "4s",
                    "--vastai-pace-divisor",
                    "10",
                ]
                .iter()
                .map(|s| (*s).to_owned()),
            );
        }
        args
    }

    /// The faults the injector picks from: answers lost after a real create, errors, 429
    /// bursts, slow answers, lists that omit every instance, whole-API outages.
    pub fn faults(self) -> Vec<Value> {
        match self {
            Cloud::RunPod => vec![
                json!({"when": {"operation": "createPod"}, "effect": {"kind": "create_then_fail", "status": 500}, "times": 1}),
                json!({"when": {"operation": "createPod"}, "effect": {"kind": "create_then_fail", "status": 502}, "times": 2}),
                json!({"when": {"operation": "createPod"}, "effect": {"kind": "status", "status": 503}, "times": 1}),
                json!({"when": {"operation": "createPod"}, "effect": {"kind": "delay", "millis": 3000}, "times": 1}),
                json!({"when": {"operation": "listPods"}, "effect": {"kind": "delay", "millis": 2500}, "times": 2}),
                json!({"when": {"operation": "listPods"}, "effect": {"kind": "empty_list"}, "times": 4}),
                json!({"when": {"operation": "deletePod"}, "effect": {"kind": "status", "status": 503}, "times": 2}),
                json!({"when": {"operation": "podAction"}, "effect": {"kind": "status", "status": 502}, "times": 1}),
                json!({"effect": {"kind": "delay", "millis": 800}, "times": 5}),
                json!({"effect": {"kind": "status", "status": 503}, "times": 15}),
                json!({"effect": {"kind": "status", "status": 429, "retry_after": 1}, "times": 10}),
            ],
            Cloud::VastAi => vec![
                json!({"when": {"route": "create"}, "effect": {"kind": "create_then_fail", "status": 502}, "times": 1}),
                json!({"when": {"route": "create"}, "effect": {"kind": "create_then_stall", "millis": 8000}, "times": 1}),
                json!({"when": {"route": "create"}, "effect": {"kind": "status", "status": 503}, "times": 1}),
                json!({"when": {"route": "create"}, "effect": {"kind": "no_such_ask"}, "times": 1}),
                json!({"when": {"route": "list"}, "effect": {"kind": "delay", "millis": 2500}, "times": 2}),
                json!({"when": {"route": "list"}, "effect": {"kind": "empty_list"}, "times": 3}),
                json!({"when": {"route": "destroy"}, "effect": {"kind": "status", "status": 503}, "times": 2}),
                json!({"when": {"route": "manage"}, "effect": {"kind": "status", "status": 502}, "times": 1}),
                json!({"effect": {"kind": "delay", "millis": 800}, "times": 5}),
                json!({"effect": {"kind": "status", "status": 503}, "times": 15}),
                json!({"effect": {"kind": "status", "status": 429, "error": "too_many_requests"}, "times": 10}),
            ],
        }
    }
}

/// One ledger entry, in the same shape for both clouds (times in seconds since the epoch).
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub pod_uid: Option<String>,
    pub cluster: Option<String>,
    pub created: f64,
    /// When GPU billing ended (first stop, exit or termination); `None`: it may still bill.
    pub billing_ended: Option<f64>,
    pub live: bool,
    pub create_status: u64,
}

/// Seconds since the epoch of an RFC 3339 time or an epoch number.
fn epoch(value: &Value) -> Option<f64> {
    if let Some(seconds) = value.as_f64() {
        return Some(seconds);
    }
    let at: k8s_openapi::jiff::Timestamp = value.as_str()?.parse().ok()?;
    Some(at.as_millisecond() as f64 / 1000.0)
}

/// Reads one simulator's ledger entry.
pub fn entry(cloud: Cloud, raw: &Value) -> Entry {
    let env = |key: &str| raw["env"][key].as_str().map(str::to_owned);
    let (billing_fields, end_field): (&[&str], &str) = match cloud {
        Cloud::RunPod => (
            &["gpu_billing_ended_at", "stopped_at", "terminated_at"],
            "terminated_at",
        ),
        Cloud::VastAi => (&["gpu_billing_ended_at", "destroyed_at"], "destroyed_at"),
    };
    Entry {
        id: match &raw["id"] {
            Value::String(id) => id.clone(),
            other => other.to_string(),
        },
        pod_uid: env("RUNPOD_KUBELET_POD_UID"),
        cluster: env("RUNPOD_KUBELET_CLUSTER"),
        created: epoch(&raw["created_at"]).unwrap_or(0.0),
        billing_ended: billing_fields
            .iter()
            .filter_map(|field| epoch(&raw[*field]))
            .reduce(f64::min),
        live: raw[end_field].is_null(),
        create_status: raw["create_status"].as_u64().unwrap_or(0),
    }
}

/// Now, in seconds since the epoch.
pub fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}
