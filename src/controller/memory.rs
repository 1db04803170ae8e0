//! What the leader remembers about each pod between reconciles. None of it is needed for
//! safety across restarts (that lives in the pod's annotations and the cloud's tags); it saves
//! calls and avoids repeating Events.

use std::collections::{HashMap, HashSet};

use k8s_openapi::jiff::Timestamp;

use crate::controller::eligibility::Judged;
use crate::provider::{Instance, LogEntry};

/// Per Kubernetes pod (by UID).
#[derive(Debug, Default, Clone)]
pub struct PodMemory {
    /// The instance this leader created or adopted, and when; the list may not show it yet.
    pub instance: Option<(String, Timestamp)>,
    /// When this leader last wrote the create marker (its pod cache may not show it yet).
    pub create_marked_at: Option<Timestamp>,
    /// The last provision ended knowing that nothing was created (capacity, no candidates):
    /// the next create need not wait for a settling list.
    pub nothing_created: bool,
    /// Do not try to create before this time (backoff after capacity errors).
    pub next_create_at: Option<Timestamp>,
    pub create_failures: u32,
    /// GPU types refused for this pod (placed outside its constraints).
    pub excluded_gpu_types: Vec<String>,
    /// Instances confirmed terminated.
    pub terminated: HashSet<String>,
    /// Instances whose placement was verified.
    pub verified: HashSet<String>,
    /// When `stop` was sent to each instance (deletion honours the grace period).
    pub stop_sent: HashMap<String, Timestamp>,
    /// Instances whose stop or GPU-ending termination is under way (`cloud::billing`).
    pub ending: HashSet<String>,
    /// Instances whose stop the provider accepted: their GPU billing ended, so terminating
    /// them waits behind other pods' stops.
    pub stopped: HashSet<String>,
    /// The pod's `preStop` hook was started (once per pod, before the first stop).
    pub pre_stop_ran: bool,
    /// The container start (instance, restart count) its `httpGet` `postStart` hook was sent
    /// to and passed.
    pub post_start_sent: Option<(String, i32)>,
    /// Last uptime seen per instance; going back means the container restarted.
    pub uptime: HashMap<String, u64>,
    pub restarts: i32,
    /// The exit code read from the log, once read (`Some(None)`: read, none found).
    pub exit_code: Option<Option<i32>>,
    /// The end of the finished container's log, served by `kubectl logs` once the instance is
    /// gone (lost with this leader's memory).
    pub final_log: Option<std::sync::Arc<Vec<LogEntry>>>,
    /// Likewise for each init container.
    pub final_init_logs: Option<std::sync::Arc<crate::provider::InitLogs>>,
    /// How far the pod's init containers got, as the container's log last said.
    pub init_progress: Option<crate::provider::InitProgress>,
    /// Events already published (a hash of reason and message: a pod's messages can be long
    /// and many), so a reconcile loop does not repeat them.
    pub events: HashSet<u64>,
    /// Failed reads of the finished container's log, counted while the API answers.
    pub log_read_failures: u32,
    /// The instance RunPod returned when asked by id while the lists omitted it, and when
    /// (boxed: rarely set, and every pod's memory would carry its size).
    pub looked_up: Option<Box<(Timestamp, Instance)>>,
    /// When this leader began replacing an instance that vanished (the provisioning clock).
    pub replacing_since: Option<Timestamp>,
    /// What the pod's probes say of its container (`None`: no prober runs for it).
    pub probed: Option<crate::controller::probes::state::Probed>,
    /// Whether this pod may get an instance, as last judged.
    pub refusal: Option<Judged>,
}

/// Machines where an instance was lost lately, by the pod's UID and its owner's (a Job's next
/// pod avoids them too), each until its time is up. Not kept across restarts: forgetting costs
/// at most one placement on a machine that lost an instance before, never money or safety.
#[derive(Debug, Default)]
pub struct LostMachines {
    entries: Vec<LostMachine>,
}

#[derive(Debug, Clone)]
struct LostMachine {
    key: String,
    machine: String,
    until: Timestamp,
}

impl LostMachines {
    /// `machine` lost an instance of the pod with these keys (its UID, its owner's) at `now`.
    pub fn lost(&mut self, keys: &[String], machine: &str, now: Timestamp) {
        let until = now
            .checked_add(runpod_contract::interruptible::AVOID_MACHINE_FOR)
            .unwrap_or(now);
        self.entries.retain(|entry| entry.until > now);
        for key in keys {
            self.entries
                .retain(|e| !(e.key == *key && e.machine == machine));
            self.entries.push(LostMachine {
                key: key.clone(),
                machine: machine.to_owned(),
                until,
            });
        }
    }

    /// The machines a pod with these keys avoids at `now`, each once, in the order lost.
    pub fn avoided(&self, keys: &[String], now: Timestamp) -> Vec<String> {
        let mut machines: Vec<String> = Vec::new();
        for entry in &self.entries {
            if entry.until > now && keys.contains(&entry.key) && !machines.contains(&entry.machine)
            {
                machines.push(entry.machine.clone());
            }
        }
        machines
    }
}

/// The keys a pod's lost machines are kept under: its UID, and its controlling owner's (a
/// Job's replacement pod is a new pod).
pub(crate) fn lost_machine_keys(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<String> {
    let mut keys: Vec<String> = pod.metadata.uid.iter().cloned().collect();
    keys.extend(
        pod.metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|owner| owner.controller == Some(true))
            .map(|owner| owner.uid.clone()),
    );
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_machine_is_avoided_by_its_pod_and_its_owners_next_pod_for_a_while() {
        let now: Timestamp = "2026-11-29T10:00:00Z".parse().unwrap();
        let mut lost = LostMachines::default();
        lost.lost(&["pod-1".into(), "job-1".into()], "4711", now);
        lost.lost(&["pod-9".into()], "99", now);
        assert_eq!(lost.avoided(&["pod-1".into()], now), vec!["4711"]);
        assert_eq!(
            lost.avoided(&["pod-2".into(), "job-1".into()], now),
            vec!["4711"]
        );
        assert!(lost.avoided(&["pod-3".into()], now).is_empty());
        let later = now
            .checked_add(runpod_contract::interruptible::AVOID_MACHINE_FOR)
            .unwrap();
        assert!(
            lost.avoided(&["job-1".into()], later).is_empty(),
            "after 30 minutes"
        );
        lost.lost(&["job-1".into()], "4712", later);
        assert_eq!(lost.entries.len(), 1, "expired entries are dropped");
    }

    #[test]
    fn keys_are_the_pod_and_its_controlling_owner() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": "u1", "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "j1", "controller": true},
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"}
            ]}
        }))
        .unwrap();
        assert_eq!(lost_machine_keys(&pod), vec!["u1", "j1"]);
    }
}
