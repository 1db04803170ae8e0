//! Everything a reconcile needs, shared by the pod workers, the list poller and the GC.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::{Event, EventType, Recorder};
use runpod_contract::config::PolicyConfig;
use tokio::sync::watch;
use tracing::warn;

use crate::controller::memory::PodMemory;
use crate::controller::metrics::ControllerMetrics;
use crate::controller::node::health::ApiHealth;
use crate::controller::usage::UsageLedger;
use crate::controller::usage::idle::IdleSettings;
use crate::provider::Instance;

/// Settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_name: String,
    pub cluster_id: String,
    pub host_ip: String,
    pub reconcile_interval: Duration,
    pub provision_timeout: Duration,
    /// After an ambiguous create, how long the list must have had to show the pod before a
    /// second create is allowed; also how young an instance may be and still be missing.
    pub create_settle: Duration,
    pub outage_grace: Duration,
    /// The webhook's opt-in rule and the policy it enforces, re-checked before any create.
    pub admission: PolicyConfig,
    /// When a pod's GPUs count as idle (`--idle-gpu-threshold`, `--idle-gpu-after`).
    pub idle: IdleSettings,
    /// Where the API key comes from, for messages (`--api-key-secret`, else the variable).
    pub key_source: String,
    /// Namespace of the adoption record (`--adoption-namespace`).
    pub adoption_namespace: String,
    /// Exec and port-forward over the cloud's SSH (`--exec-ssh`, the node's key).
    pub exec: crate::controller::node::exec_key::ExecAccess,
    /// Namespace of the budget ledgers, shared by every node of the installation (the
    /// controller's own).
    pub ledger_namespace: String,
    /// The namespaces this node serves (`--serve-namespaces`); empty: those bound to no node.
    pub serve_namespaces: Vec<String>,
    /// The Deployment running this controller, held by the drain finalizer
    /// (`--owner-deployment`); `None`: not run by the chart.
    pub owner_deployment: Option<crate::controller::node::removal::OwnerDeployment>,
    /// How long one drain for the finalizer may take (`--drain-timeout`).
    pub drain_timeout: Duration,
    /// Burst pods in the cluster's network (`--cluster-network` and its lists).
    pub network: runpod_contract::network::NetworkSettings,
}

/// One complete, successful list of the cloud's instances, reduced to this cluster and node.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub taken_at: Timestamp,
    pub instances: Vec<Instance>,
    /// When the oldest of the last `provider::LISTS_TO_CONFIRM` complete lists was asked
    /// for: instances missing from lists are carried forward until that many omit them, so an
    /// instance absent here was absent from every list since then. A decision that nothing
    /// exists needs this time, not `taken_at`, to be past its settle time.
    pub confirmed_at: Option<Timestamp>,
}

impl Snapshot {
    /// Live instances tagged with this pod UID.
    pub fn for_pod<'a>(&'a self, uid: &'a str) -> impl Iterator<Item = &'a Instance> + 'a {
        self.instances
            .iter()
            .filter(move |i| i.tags.pod_uid.as_deref() == Some(uid) && i.state.is_live())
    }

    /// The pod's instance a person means (`kubectl exec`, `logs`): the one this leader tracks,
    /// else a running one, else the oldest; never one it terminated (a duplicate on its way
    /// out must not take the session).
    pub fn pods_instance<'a>(
        &'a self,
        uid: &'a str,
        tracked: Option<&str>,
        terminated: &std::collections::HashSet<String>,
    ) -> Option<&'a Instance> {
        self.for_pod(uid)
            .filter(|i| !terminated.contains(&i.id))
            .min_by_key(|i| {
                (
                    Some(i.id.as_str()) != tracked,
                    i.state != crate::provider::InstanceState::Running,
                    i.created_at,
                )
            })
    }
}

/// The shared state of the controller.
pub struct Shared<P> {
    pub client: kube::Client,
    pub provider: Arc<P>,
    pub settings: Settings,
    pub snapshot: watch::Receiver<Option<Arc<Snapshot>>>,
    pub health: watch::Sender<ApiHealth>,
    pub memory: Mutex<HashMap<String, PodMemory>>,
    pub recorder: Recorder,
    pub metrics: Arc<ControllerMetrics>,
    /// Usage of burst pods from the cloud's reports, for the kubelet API's stats.
    pub usage: Mutex<UsageLedger>,
    /// Wakes `cloud::billing` at once: a worker saw a deleted pod whose GPU still bills.
    pub ends_due: tokio::sync::Notify,
    /// The operator's adoption record as last read (`controller::adoption`).
    pub adopted: Mutex<std::collections::BTreeMap<String, String>>,
    /// Budget reservations under way and whether the ledgers were rebuilt (`budget`).
    pub budget: crate::controller::budget::state::BudgetState,
    /// Machines that lost an instance lately, avoided by the next placement of its pod.
    pub lost_machines: Mutex<crate::controller::memory::LostMachines>,
}

impl<P> Shared<P> {
    /// What a new leader starts from: nothing remembered, no list yet, Events recorded as the
    /// node's controller.
    pub fn new(
        client: kube::Client,
        provider: Arc<P>,
        settings: Settings,
        snapshot: watch::Receiver<Option<Arc<Snapshot>>>,
        health: watch::Sender<ApiHealth>,
        metrics: Arc<ControllerMetrics>,
    ) -> Shared<P> {
        let reporter = kube::runtime::events::Reporter {
            controller: "runpod-kubelet".into(),
            instance: Some(settings.node_name.clone()),
        };
        Shared {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            provider,
            settings,
            snapshot,
            health,
            memory: Mutex::default(),
            metrics,
            usage: Mutex::default(),
            ends_due: tokio::sync::Notify::new(),
            adopted: Mutex::default(),
            budget: crate::controller::budget::state::BudgetState::default(),
            lost_machines: Mutex::default(),
        }
    }

    /// Reads and updates one pod's memory.
    pub fn remember<T>(&self, uid: &str, f: impl FnOnce(&mut PodMemory) -> T) -> T {
        let mut guard = match self.memory.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(guard.entry(uid.to_owned()).or_default())
    }

    /// Drops the memory of every pod not in `uids` (pods deleted from the cluster), and says
    /// which instances this leader terminated for them (garbage collection need not again).
    pub fn forget_all_but(
        &self,
        uids: &std::collections::HashSet<String>,
    ) -> std::collections::HashSet<String> {
        let mut guard = match self.memory.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        let mut terminated = std::collections::HashSet::new();
        guard.retain(|uid, memory| {
            let keep = uids.contains(uid);
            if !keep {
                terminated.extend(memory.terminated.drain());
            }
            keep
        });
        terminated
    }

    /// The usage ledger, even after a panic elsewhere poisoned its lock.
    pub fn usage_ledger(&self) -> std::sync::MutexGuard<'_, UsageLedger> {
        match self.usage.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// [`Snapshot::pods_instance`] of the latest snapshot, with what this leader remembers.
    pub fn pods_instance(&self, uid: &str) -> Option<Instance> {
        let (tracked, terminated) = self.remember(uid, |m| {
            (
                m.instance.as_ref().map(|(id, _)| id.clone()),
                m.terminated.clone(),
            )
        });
        self.latest()?
            .pods_instance(uid, tracked.as_deref(), &terminated)
            .cloned()
    }

    pub fn latest(&self) -> Option<Arc<Snapshot>> {
        self.snapshot.borrow().clone()
    }

    /// Publishes an Event on the pod `about` refers to, once per reason and message. A new
    /// message of a reason said before is an Event of its own: its action names the message
    /// (the recorder folds Events of one reason and action into a series that keeps the first
    /// message, which would hide what changed).
    pub async fn event(
        &self,
        about: &ObjectReference,
        warning: bool,
        reason: &str,
        message: String,
    ) {
        use std::hash::{Hash as _, Hasher as _};
        let uid = about.uid.clone().unwrap_or_default();
        let mut hasher = std::hash::DefaultHasher::new();
        message.hash(&mut hasher);
        let of_message = hasher.finish();
        reason.hash(&mut hasher);
        if !self.remember(&uid, |m| m.events.insert(hasher.finish())) {
            return;
        }
        // Published as is, not through the recorder: each message is said once, so it never
        // makes a series, and the recorder would keep every Event for six minutes (megabytes
        // when a thousand pods start).
        use k8s_openapi::api::events::v1::Event as K8sEvent;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = Timestamp::now();
        let event = K8sEvent {
            action: Some(format!("{reason}-{of_message:016x}")),
            reason: Some(reason.to_owned()),
            event_time: Some(MicroTime(now)),
            regarding: Some(about.clone()),
            note: Some(truncate(&message, 1000)),
            metadata: kube::api::ObjectMeta {
                namespace: about.namespace.clone(),
                name: Some(event_name(
                    about.name.as_deref().unwrap_or("runpod-kubelet"),
                    now.as_nanosecond(),
                )),
                ..Default::default()
            },
            reporting_controller: Some("runpod-kubelet".to_owned()),
            reporting_instance: Some(self.settings.node_name.clone()),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            ..Default::default()
        };
        let events: kube::Api<K8sEvent> = kube::Api::namespaced(
            self.client.clone(),
            about.namespace.as_deref().unwrap_or("default"),
        );
        if let Err(error) = events.create(&Default::default(), &event).await {
            warn!(reason, error = %error, "could not publish an Event");
        }
    }

    /// Publishes an Event every time it is said, with an action of its own, as the kubelet says
    /// what recurs (a failing probe): the recorder aggregates the Events of one reason and
    /// action on one object into a series (keeping the first message), so a reason said of
    /// several things (`Unhealthy` of each probe) needs one action per thing. Nothing is kept
    /// per message.
    pub async fn event_as(
        &self,
        about: &ObjectReference,
        warning: bool,
        (reason, action): (&str, &str),
        message: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(truncate(&message, 1000)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, about).await {
            warn!(reason, error = %error, "could not publish an Event");
        }
    }
}

impl Settings {
    /// Whose tags an adopted instance gets.
    pub fn owner(&self) -> crate::controller::adoption::Owner<'_> {
        crate::controller::adoption::Owner {
            cluster_id: &self.cluster_id,
            node_name: &self.node_name,
        }
    }
}

impl<P> Shared<P> {
    /// Publishes an Event on the virtual node (what `kubectl describe node` shows), through
    /// the core Event API as kubelets do: events.k8s.io would refuse a cluster-scoped object's
    /// empty namespace in `default`.
    pub async fn node_event(&self, warning: bool, reason: &str, message: String) {
        use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, Node, ObjectReference};
        let nodes: kube::Api<Node> = kube::Api::all(self.client.clone());
        let uid = match nodes.get_opt(&self.settings.node_name).await {
            Ok(Some(node)) => node.metadata.uid,
            _ => None,
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now());
        let event = CoreEvent {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(format!("{}.", self.settings.node_name)),
                namespace: Some("default".to_owned()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.settings.node_name.clone()),
                uid,
                ..Default::default()
            },
            reason: Some(reason.to_owned()),
            message: Some(truncate(&message, 1000)),
            type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
            source: Some(EventSource {
                component: Some("runpod-kubelet".to_owned()),
                host: Some(self.settings.node_name.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            ..Default::default()
        };
        let events: kube::Api<CoreEvent> = kube::Api::namespaced(self.client.clone(), "default");
        if let Err(error) = events.create(&Default::default(), &event).await {
            warn!(reason, error = %error, "could not publish a node Event");
        }
    }
}

/// An Event's name: the object's, shortened so that the whole stays a DNS subdomain of at most
/// 253 characters (a pod's own name may take all of them, and the apiserver would refuse the
/// Event), then the time in hex.
fn event_name(object: &str, nanos: i128) -> String {
    let suffix = format!(".{nanos:x}");
    let mut end = object.len().min(253 - suffix.len());
    while !object.is_char_boundary(end) {
        end -= 1;
    }
    // A label ends with a letter or digit: no `-.` or `..` where it was cut.
    let prefix = object[..end].trim_end_matches(['-', '.']);
    format!("{prefix}{suffix}")
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::instance;
    use crate::provider::InstanceState;

    #[test]
    fn an_event_name_stays_a_dns_subdomain_whatever_the_pod_name() {
        let nanos = 1_800_000_000_123_456_789_i128;
        assert_eq!(event_name("train-0", nanos), format!("train-0.{nanos:x}"));
        for long in [
            "a".repeat(253),
            format!("{}-b", "a".repeat(235)),
            format!("{}.b", "c".repeat(235)),
        ] {
            let name = event_name(&long, nanos);
            assert!(name.len() <= 253, "{} characters", name.len());
            assert!(name.ends_with(&format!(".{nanos:x}")), "{name}");
            assert!(!name.contains("-.") && !name.contains(".."), "{name}");
        }
    }

    /// Exec, port-forward, hooks and logs reach the instance this leader tracks, not whichever
    /// a list happens to name first (a duplicate on its way out, say).
    #[test]
    fn a_person_reaches_the_tracked_instance_else_a_running_one() {
        let at = |s: i64| Some(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let mut older = instance("older", "c", "n", Some("u"));
        older.created_at = at(0);
        older.state = InstanceState::Starting;
        let mut running = instance("running", "c", "n", Some("u"));
        running.created_at = at(10);
        let mut tracked = instance("tracked", "c", "n", Some("u"));
        tracked.created_at = at(20);
        tracked.state = InstanceState::Starting;
        let snapshot = Snapshot {
            taken_at: Timestamp::from_second(1_800_000_100).unwrap(),
            instances: vec![
                older,
                running,
                tracked,
                instance("other", "c", "n", Some("v")),
            ],
            confirmed_at: None,
        };
        let none = std::collections::HashSet::new();
        let id = |tracked: Option<&str>, terminated: &std::collections::HashSet<String>| {
            snapshot
                .pods_instance("u", tracked, terminated)
                .map(|i| i.id.clone())
        };
        assert_eq!(id(Some("tracked"), &none).as_deref(), Some("tracked"));
        assert_eq!(id(None, &none).as_deref(), Some("running"));
        let gone: std::collections::HashSet<String> = ["running".to_owned()].into();
        assert_eq!(id(None, &gone).as_deref(), Some("older"));
        assert_eq!(
            snapshot.pods_instance("w", None, &none).map(|i| &i.id),
            None
        );
    }
}
