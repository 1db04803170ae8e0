//! One cloud instance as the controller sees it, whichever cloud made it: its ownership tags,
//! state, endpoints, usage, and whether the cloud took it away.

use k8s_openapi::jiff::Timestamp;

/// Ownership tags every instance carries, set at create time. Matching is done on these,
/// never on names or on annotations a user could edit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags {
    pub cluster_id: Option<String>,
    pub node_name: Option<String>,
    pub pod_uid: Option<String>,
}

impl Tags {
    /// No tag of ours at all: an instance someone else made (the Go kubelet, the console).
    pub fn none(&self) -> bool {
        self.cluster_id.is_none() && self.node_name.is_none() && self.pod_uid.is_none()
    }
}

/// Lifecycle of an instance, in the cloud's terms mapped to a common set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceState {
    Provisioning,
    Starting,
    Running,
    /// Stopped: the container ended (or was stopped); an exited instance still bills storage.
    Exited,
    Error,
    Terminated,
    Unknown,
}

/// What terminating an instance ends: when calls queue behind the quota, those that end GPU
/// billing go first, then the release of stopped instances (storage), then everything else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ends {
    /// The instance may still be running: its GPU bills until this call.
    GpuBilling,
    /// The instance is stopped: only its storage bills.
    Storage,
}

impl InstanceState {
    /// What terminating an instance in this state ends (unknown states count as running).
    pub fn termination_ends(self) -> Ends {
        match self {
            InstanceState::Exited | InstanceState::Terminated => Ends::Storage,
            _ => Ends::GpuBilling,
        }
    }

    /// Still holding (and billing) resources.
    pub fn is_live(self) -> bool {
        !matches!(self, InstanceState::Terminated)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Provisioning => "provisioning",
            InstanceState::Starting => "starting",
            InstanceState::Running => "running",
            InstanceState::Exited => "exited",
            InstanceState::Error => "error",
            InstanceState::Terminated => "terminated",
            InstanceState::Unknown => "unknown",
        }
    }
}

/// How one container port can be reached from outside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub port: u32,
    /// `http` or `tcp`.
    pub protocol: String,
    /// `https://…` for http ports, `IP:PORT` for tcp ports; `None` until published.
    pub address: Option<String>,
}

/// A cloud's live utilization report for one instance. Clouds report shares, not amounts:
/// every figure is a ratio in 0..=1, `None` where the cloud left it out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Share of the CPU the instance was given.
    pub cpu: Option<f64>,
    /// Share of the memory the instance was given.
    pub memory: Option<f64>,
    /// One entry per GPU.
    pub gpus: Vec<GpuUsage>,
}

/// Utilization of one GPU, ratios in 0..=1.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuUsage {
    pub util: Option<f64>,
    pub memory: Option<f64>,
}

impl Usage {
    /// A percentage (0–100) as a ratio, clamped into 0..=1; `None` for a missing or
    /// non-finite figure.
    pub fn ratio(percent: Option<f64>) -> Option<f64> {
        percent
            .filter(|p| p.is_finite())
            .map(|p| (p / 100.0).clamp(0.0, 1.0))
    }

    /// The mean compute utilization of the GPUs that reported one.
    pub fn gpu_util(&self) -> Option<f64> {
        mean(self.gpus.iter().filter_map(|g| g.util))
    }

    /// The mean memory utilization of the GPUs that reported one.
    pub fn gpu_memory(&self) -> Option<f64> {
        mean(self.gpus.iter().filter_map(|g| g.memory))
    }

    /// The busiest GPU's utilization: a pod is idle only when every GPU is.
    pub fn gpu_busiest(&self) -> Option<f64> {
        self.gpus
            .iter()
            .filter_map(|g| g.util)
            .fold(None, |max: Option<f64>, u| {
                Some(max.map_or(u, |m| m.max(u)))
            })
    }
}

fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, count) = values.fold((0.0, 0u32), |(sum, count), v| (sum + v, count + 1));
    (count > 0).then(|| sum / f64::from(count))
}

/// One cloud instance as the last list showed it.
#[derive(Debug, Clone)]
pub struct Instance {
    pub id: String,
    pub name: String,
    pub tags: Tags,
    pub state: InstanceState,
    /// Seconds the container has been up; going back means it restarted.
    pub uptime_secs: Option<u64>,
    pub cost_per_hour: Option<f64>,
    pub gpu_type: Option<String>,
    pub datacenter: Option<String>,
    pub endpoints: Vec<Endpoint>,
    /// A public IP of the instance, when it has one.
    pub ip: Option<String>,
    pub created_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    /// The cloud's last message about the instance (an error), if any.
    pub message: Option<String>,
    /// The live utilization report of this list; `None` when there is none (not running, or
    /// carried forward from an earlier list): such an instance's usage is not shown at all.
    pub usage: Option<Usage>,
    /// Where the container's sshd answers, for exec and port-forward (RunPod's `ssh.direct`);
    /// `None` on clouds without it, and until the cloud publishes the port.
    pub ssh: Option<SshAddress>,
    /// The host machine, where the cloud says (avoided for a while once an instance is lost
    /// there).
    pub machine: Option<String>,
    /// Set: the cloud took the instance away (outbid, host lost); the pod is disrupted, not
    /// failed by its program.
    pub disruption: Option<Disruption>,
}

/// Why the cloud took an instance away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disruption {
    /// A higher bid took an interruptible instance's machine.
    Outbid,
    /// The host was lost, or the cloud stopped or removed the instance.
    Lost,
}

impl Disruption {
    /// The pod's `DisruptionTarget` reason, and its Event's.
    pub fn reason(self) -> &'static str {
        match self {
            Disruption::Outbid => runpod_contract::interruptible::OUTBID,
            Disruption::Lost => runpod_contract::interruptible::CLOUD_INSTANCE_LOST,
        }
    }
}

/// What an instance was made from, as the cloud reports it: the image and the environment the
/// creator sent (values may come from Secrets: compared, never shown).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct InstanceOrigin {
    pub image: Option<String>,
    pub env: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for InstanceOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceOrigin")
            .field("image", &self.image)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// An SSH server's address and login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshAddress {
    pub host: String,
    pub port: u16,
    pub user: String,
}

impl Instance {
    /// Ready to serve: running, and every TCP port published.
    pub fn ports_ready(&self) -> bool {
        self.state == InstanceState::Running
            && self
                .endpoints
                .iter()
                .filter(|endpoint| endpoint.protocol == "tcp")
                .all(|endpoint| endpoint.address.is_some())
    }
}
