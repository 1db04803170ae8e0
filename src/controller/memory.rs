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
    /// Last uptime seen per instance; going back means the container restarted.
    pub uptime: HashMap<String, u64>,
    pub restarts: i32,
    /// The exit code read from the log, once read (`Some(None)`: read, none found).
    pub exit_code: Option<Option<i32>>,
    /// The end of the finished container's log, served by `kubectl logs` once the instance is
    /// gone (lost with this leader's memory).
    pub final_log: Option<std::sync::Arc<Vec<LogEntry>>>,
    /// Events already published (reason and message), so a reconcile loop does not repeat them.
    pub events: HashSet<String>,
    /// Failed reads of the finished container's log, counted while the API answers.
    pub log_read_failures: u32,
    /// The instance RunPod returned when asked by id while the lists omitted it, and when.
    pub looked_up: Option<(Timestamp, Instance)>,
    /// When this leader began replacing an instance that vanished (the provisioning clock).
    pub replacing_since: Option<Timestamp>,
    /// What the pod's probes say of its container (`None`: no prober runs for it).
    pub probed: Option<crate::controller::probes::state::Probed>,
    /// Whether this pod may get an instance, as last judged.
    pub refusal: Option<Judged>,
}
