//! A simulated pod and its `Pod` JSON (the v2 schema: `status`, `actions`, `runtime`, `ssh`, …).

use std::collections::BTreeMap;
use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::ledger::LedgerEntry;
use crate::scenario::Outcome;
use crate::timefmt;

/// Env of a created pod that fixes the utilization `runtime` reports, in percent: CPU,
/// memory, and every GPU's compute and memory. Without them the figures wobble.
pub const SIM_CPU_UTIL: &str = "SIM_CPU_UTIL";
pub const SIM_MEM_UTIL: &str = "SIM_MEM_UTIL";
pub const SIM_GPU_UTIL: &str = "SIM_GPU_UTIL";
pub const SIM_GPU_MEM_UTIL: &str = "SIM_GPU_MEM_UTIL";

/// `PodStatus`: the lifecycle state of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PodStatus {
    Provisioning,
    Starting,
    Running,
    Exited,
    Error,
    Terminated,
}

impl PodStatus {
    /// The wire name, e.g. `RUNNING`.
    pub fn as_str(self) -> &'static str {
        match self {
            PodStatus::Provisioning => "PROVISIONING",
            PodStatus::Starting => "STARTING",
            PodStatus::Running => "RUNNING",
            PodStatus::Exited => "EXITED",
            PodStatus::Error => "ERROR",
            PodStatus::Terminated => "TERMINATED",
        }
    }

    /// The actions the `podAction` description allows in this status (the pod's `actions`).
    pub fn actions(self) -> &'static [&'static str] {
        match self {
            PodStatus::Running => &["stop", "restart", "terminate"],
            PodStatus::Provisioning | PodStatus::Starting => &["stop", "terminate"],
            PodStatus::Exited | PodStatus::Error => &["start", "terminate"],
            PodStatus::Terminated => &[],
        }
    }

    /// Billed at the pod's rate (everything but EXITED, ERROR and TERMINATED).
    pub fn is_billed(self) -> bool {
        !matches!(
            self,
            PodStatus::Exited | PodStatus::Error | PodStatus::Terminated
        )
    }
}

impl std::fmt::Display for PodStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// GPU or CPU compute of a pod.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Compute {
    Gpu { id: String, count: u32 },
    Cpu { id: String, vcpu: u32, memory: u32 },
}

/// One published port.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PortMapping {
    pub private: u32,
    pub public: u32,
    pub kind: String,
    /// Served for real on this machine's loopback (the pod's sshd), not a made-up port.
    pub loopback: bool,
}

/// What the pod's image rule scripts for this run.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Script {
    pub outcome: Option<(Outcome, u64)>,
    pub logs: Vec<String>,
    /// The process's exit code (see `ImageRule::exit_code`).
    pub exit_code: Option<i32>,
    /// The command runs for real (see `ImageRule::run`).
    pub run: bool,
}

/// A pod as the simulator keeps it.
#[derive(Debug, Clone)]
pub(crate) struct PodRecord {
    pub id: String,
    pub name: String,
    pub image: String,
    pub args: String,
    pub disk: u32,
    pub ports: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub registry: Option<String>,
    /// The `Mounts` object as sent (`{}` when none).
    pub mounts: Value,
    pub compute: Compute,
    pub cloud: String,
    pub data_center_id: String,
    pub cuda_version: Option<String>,
    /// Rate while billed (list price × count).
    pub cost_per_hr: f64,
    pub locked: bool,
    pub global_networking: bool,
    /// A PATCHed `globalNetworking`, applied at the next start or restart (as the spec says).
    pub global_networking_next: Option<bool>,
    /// Public IP of the host machine.
    pub ip: String,
    /// Private global-networking address.
    pub global_ip: String,
    /// Opaque SSH proxy user, `<id>-<8 hex>`.
    pub proxy_user: String,
    pub status: PodStatus,
    /// When the current status began.
    pub phase_since: Instant,
    /// When the container last became RUNNING.
    pub running_since: Option<Instant>,
    pub started_at: Option<SystemTime>,
    /// `None` until the ports are published after RUNNING.
    pub published: Option<Vec<PortMapping>>,
    pub script: Script,
    pub created_at: SystemTime,
    pub created_instant: Instant,
    pub terminated_at: Option<SystemTime>,
    /// The first stop action or termination: GPU billing ended then.
    pub stopped_at: Option<SystemTime>,
    /// When the container last stopped (EXITED or ERROR, by itself or by a stop): GPU billing
    /// ended then; `None` while it runs (again).
    pub gpu_billing_ended_at: Option<SystemTime>,
    pub create_status: u16,
}

impl PodRecord {
    pub fn gpu_id(&self) -> Option<&str> {
        match &self.compute {
            Compute::Gpu { id, .. } => Some(id),
            Compute::Cpu { .. } => None,
        }
    }

    pub fn is_terminated(&self) -> bool {
        self.status == PodStatus::Terminated
    }

    /// The ledger's view of this pod.
    pub fn ledger_entry(&self) -> LedgerEntry {
        let (gpu_id, gpu_count) = match &self.compute {
            Compute::Gpu { id, count } => (Some(id.clone()), *count),
            Compute::Cpu { .. } => (None, 0),
        };
        LedgerEntry {
            id: self.id.clone(),
            name: self.name.clone(),
            image: self.image.clone(),
            gpu_id,
            gpu_count,
            data_center_id: self.data_center_id.clone(),
            mounts: self.mounts.clone(),
            cloud: self.cloud.clone(),
            env: self.env.clone(),
            args: self.args.clone(),
            ports: self.ports.clone(),
            cost_per_hr: self.cost_per_hr,
            created_at: self.created_at,
            terminated_at: self.terminated_at,
            stopped_at: self.stopped_at,
            gpu_billing_ended_at: self.gpu_billing_ended_at,
            create_status: self.create_status,
        }
    }

    /// The `Pod` JSON as of `now`.
    pub fn to_json(&self, now: Instant) -> Value {
        let mut pod = json!({
            "id": self.id,
            "name": self.name,
            "status": self.status.as_str(),
            "actions": self.status.actions(),
            "image": self.image,
            "args": self.args,
            "disk": self.disk,
            "mounts": self.mounts,
            "ports": self.ports,
            "env": self.env,
            "registry": self.registry,
            "cloud": self.cloud,
            "dataCenterId": self.data_center_id,
            "cudaVersion": self.cuda_version,
            "ssh": {
                "proxy": {
                    "host": "ssh.runpod.io",
                    "port": 22,
                    "username": self.proxy_user,
                    "command": format!("ssh {}@ssh.runpod.io", self.proxy_user),
                },
                "direct": self.ssh_direct(),
            },
            // The spec: a pod created from a template does not keep a link to it.
            "template": Value::Null,
            "cost": if self.status.is_billed() { self.cost_per_hr } else { 0.0 },
            "locked": self.locked,
            "runtime": self.runtime(now),
            "createdAt": timefmt::format(self.created_at),
            "startedAt": self.started_at.map(timefmt::format),
            "globalNetworking": self.global_networking_json(),
        });
        let compute = match &self.compute {
            Compute::Gpu { id, count } => ("gpu", json!({"id": id, "count": count})),
            Compute::Cpu { id, vcpu, memory } => (
                "cpu",
                json!({"id": id, "vcpuCount": vcpu, "memory": memory}),
            ),
        };
        if let Some(object) = pod.as_object_mut() {
            object.insert(compute.0.to_owned(), compute.1);
        }
        pod
    }

    fn ssh_direct(&self) -> Value {
        let published = self.published.as_deref().unwrap_or_default();
        match published
            .iter()
            .find(|p| p.private == 22 && p.kind == "tcp")
        {
            Some(port) => {
                let host = if port.loopback {
                    "127.0.0.1"
                } else {
                    self.ip.as_str()
                };
                json!({
                    "host": host,
                    "port": port.public,
                    "username": "root",
                    "command": format!("ssh root@{host} -p {}", port.public),
                })
            }
            None => Value::Null,
        }
    }

    fn global_networking_json(&self) -> Value {
        if self.global_networking {
            json!({
                "enabled": true,
                "ip": self.global_ip,
                "internalDns": format!("{}.runpod.internal", self.id),
            })
        } else {
            json!({"enabled": false})
        }
    }

    /// A utilization percentage the pod's env fixes (`SIM_CPU_UTIL=40`), so tests can set
    /// what the pod reports; integers 0–100 as the spec's `util` fields are.
    fn utilization(&self, key: &str) -> Option<u64> {
        self.env
            .get(key)
            .and_then(|value| value.trim().parse::<u64>().ok())
            .map(|value| value.min(100))
    }

    /// The schema says `runtime` is null unless RUNNING, but the spec's own 201 example shows
    /// `{}` for a PROVISIONING pod. Both forms appear, so a client must treat both as "not
    /// up": pods on their way up answer `{}`, stopped ones `null`.
    fn runtime(&self, now: Instant) -> Value {
        let (PodStatus::Running, Some(since)) = (self.status, self.running_since) else {
            return match self.status {
                PodStatus::Provisioning | PodStatus::Starting => json!({}),
                _ => Value::Null,
            };
        };
        let uptime = now.saturating_duration_since(since).as_secs();
        // Plausible, slowly moving utilisation figures, unless the pod's env fixes them.
        let wobble = |seed: u64| (seed.wrapping_mul(37).wrapping_add(uptime * 7)) % 100;
        let figure = |key: &str, seed: u64| self.utilization(key).unwrap_or_else(|| wobble(seed));
        let gpus: Vec<Value> = match &self.compute {
            Compute::Gpu { count, .. } => (0..u64::from(*count))
                .map(|i| {
                    json!({"util": figure(SIM_GPU_UTIL, i + 1),
                           "memoryUtil": figure(SIM_GPU_MEM_UTIL, i + 11)})
                })
                .collect(),
            Compute::Cpu { .. } => Vec::new(),
        };
        let ports: Vec<Value> = self
            .published
            .as_deref()
            .unwrap_or_default()
            .iter()
            .map(|p| {
                let ip = if p.loopback {
                    "127.0.0.1"
                } else {
                    self.ip.as_str()
                };
                json!({"private": p.private, "public": p.public, "type": p.kind, "ip": ip})
            })
            .collect();
        json!({
            "uptime": uptime,
            "gpus": gpus,
            "cpu": {"util": figure(SIM_CPU_UTIL, 3)},
            "memory": {"util": figure(SIM_MEM_UTIL, 5)},
            "ports": ports,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_follow_the_pod_action_description() {
        assert_eq!(
            PodStatus::Running.actions(),
            ["stop", "restart", "terminate"]
        );
        assert_eq!(PodStatus::Starting.actions(), ["stop", "terminate"]);
        assert_eq!(PodStatus::Error.actions(), ["start", "terminate"]);
        assert!(!PodStatus::Exited.is_billed());
    }
}
