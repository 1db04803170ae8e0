//! Probes run where the pod runs. A kubelet probes its containers; a burst pod's container is
//! on a cloud, so the leader runs its startup, liveness and readiness probes there, over the
//! node's SSH connection to the pod (the path of `kubectl exec` and `port-forward`): an `exec`
//! probe runs its command in the container, `httpGet` and `tcpSocket` reach the container's
//! loopback. Readiness gates Ready (through the pod's memory, which the status reads); a
//! liveness or startup probe that fails its threshold restarts the container (RunPod's
//! `restart`; a `restartPolicy: Never` pod's container is stopped instead, and the pod ends),
//! with the kubelet's Events `Unhealthy` and `Killing`. Clouds without a shell run none: the
//! admission warning and the `PodFieldsNotHonoured` Event say so.

pub mod run;
pub mod spec;
pub mod state;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::reflector::Store;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use self::spec::{Kind, Spec};
use self::state::{Probed, Probing, Verdict, next_run};
use crate::controller::context::Shared;
use crate::controller::kubelet_api::exec::ssh::{self, Session};
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::pods::status::is_terminal;
use crate::controller::shell;
use crate::provider::{InstanceState, Provider, ShellAccess};

/// How often the pods are looked at for probers to start or end.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Starts a prober for each running burst pod with probes, and ends it when the pod stops
/// running, is deleted or ends. Nothing runs where the node has no shell into its pods.
pub async fn run<P: Provider>(shared: Arc<Shared<P>>, pods: Store<Pod>) {
    if !runs_here(&shared) {
        return;
    }
    let mut probers: HashMap<String, JoinHandle<()>> = HashMap::new();
    let mut look = tokio::time::interval(LOOK_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        let Some(snapshot) = shared.latest() else {
            continue;
        };
        let mut wanted = HashSet::new();
        for pod in pods.state() {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            let probed = has_probes(&pod)
                && pod.metadata.deletion_timestamp.is_none()
                && !is_terminal(&pod)
                && snapshot
                    .for_pod(&uid)
                    .any(|instance| instance.state == InstanceState::Running);
            if !probed {
                continue;
            }
            wanted.insert(uid.clone());
            probers
                .entry(uid.clone())
                .or_insert_with(|| tokio::spawn(probe_pod(shared.clone(), pods.clone(), uid)));
        }
        probers.retain(|uid, prober| {
            let keep = wanted.contains(uid) && !prober.is_finished();
            if !keep {
                prober.abort();
            }
            keep
        });
    }
}

/// Whether probes run on this node: its cloud offers a shell and the node has its key.
pub fn runs_here<P: Provider>(shared: &Shared<P>) -> bool {
    matches!(shared.settings.exec, ExecAccess::Ready { .. })
        && matches!(shared.provider.shell_access(), ShellAccess::Offered { .. })
}

/// What the status shows of a probed pod before its prober has said anything: not ready (a
/// readiness probe must pass first) and not started (likewise a startup probe); `None` for a
/// pod without probes, or where none run.
pub fn before_any(pod: &Pod, probes_run: bool) -> Option<Probed> {
    let container = pod.spec.as_ref()?.containers.first()?;
    (probes_run && has_probes(pod)).then(|| Probed {
        ready: container.readiness_probe.is_some().then_some(false),
        started: container.startup_probe.is_none(),
    })
}

/// Whether the pod's container has a probe at all.
fn has_probes(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .is_some_and(|c| {
            c.startup_probe.is_some() || c.liveness_probe.is_some() || c.readiness_probe.is_some()
        })
}

fn find(pods: &Store<Pod>, uid: &str) -> Option<Arc<Pod>> {
    pods.state()
        .into_iter()
        .find(|pod| pod.metadata.uid.as_deref() == Some(uid))
}

/// One pod's prober: runs each due probe, counts, publishes what it means, restarts.
async fn probe_pod<P: Provider>(shared: Arc<Shared<P>>, pods: Store<Pod>, uid: String) {
    let Some(pod) = find(&pods, &uid) else {
        return;
    };
    let Some(container) = pod.spec.as_ref().and_then(|spec| spec.containers.first()) else {
        return;
    };
    let specs = match spec::specs(container) {
        Ok(specs) => specs,
        Err(why) => {
            let message = format!("{why}; Ready follows the container's ports");
            shared
                .event(&pod.object_ref(&()), true, "ProbeNotRun", message)
                .await;
            shared.remember(&uid, |m| {
                m.probed = Some(Probed {
                    ready: None,
                    started: true,
                });
            });
            // Parked until the pod stops running (a finished prober would be started again).
            std::future::pending::<()>().await;
            return;
        }
    };
    let mut prober = Prober {
        has_startup: specs.iter().any(|s| s.kind == Kind::Startup),
        has_readiness: specs.iter().any(|s| s.kind == Kind::Readiness),
        probing: Probing::default(),
        since: Instant::now(),
        last_run: HashMap::new(),
        restarts_seen: shared.remember(&uid, |m| m.restarts),
    };
    prober.publish(&shared, &uid);
    let mut session: Option<Session> = None;
    loop {
        let restarts = shared.remember(&uid, |m| m.restarts);
        if restarts != prober.restarts_seen {
            // The container started over (on the cloud, or after a probe): so do its probes.
            prober.start_over(restarts);
            session = None;
            prober.publish(&shared, &uid);
        }
        let Some(pod) = find(&pods, &uid) else {
            return;
        };
        let now = Instant::now();
        let waits: Vec<(Duration, &Spec)> = specs
            .iter()
            .filter(|s| prober.probing.runs(s.kind, prober.has_startup))
            .map(|s| (prober.wait(s, now), s))
            .collect();
        let Some(due) = waits
            .iter()
            .find(|(wait, _)| wait.is_zero())
            .map(|(_, s)| *s)
        else {
            let wait = waits
                .iter()
                .map(|(wait, _)| *wait)
                .min()
                .unwrap_or(LOOK_EVERY);
            tokio::time::sleep(wait.min(LOOK_EVERY)).await;
            continue;
        };
        prober.last_run.insert(due.kind, Instant::now());
        let live = match session.take() {
            Some(open) if !open.is_closed() => open,
            _ => match connect(&shared, &pod, &uid).await {
                Ok(open) => open,
                Err(why) => {
                    // Not the container's failure: nothing is counted, and it is tried again.
                    debug!(pod_uid = %uid, %why, "the prober cannot reach the pod");
                    tokio::time::sleep(LOOK_EVERY).await;
                    continue;
                }
            },
        };
        let answer = run::check(&live, &due.check, due.timeout).await;
        session = Some(live);
        let verdict = prober.probing.observe(due, answer.is_ok());
        if let Err(why) = &answer
            && verdict != Verdict::Nothing
        {
            let message = format!("{} probe failed: {why}", due.kind.title());
            let action = format!("{}Probe", due.kind.title());
            shared
                .event_as(&pod.object_ref(&()), true, ("Unhealthy", &action), message)
                .await;
        }
        if verdict == Verdict::Restart {
            restart(&shared, &pod, &uid, due.kind, &container.name).await;
            let restarts = shared.remember(&uid, |m| m.restarts);
            prober.start_over(restarts);
            session = None;
        }
        prober.publish(&shared, &uid);
    }
}

/// One pod's probing state.
struct Prober {
    has_startup: bool,
    has_readiness: bool,
    probing: Probing,
    /// When the container was (last) seen starting.
    since: Instant,
    last_run: HashMap<Kind, Instant>,
    restarts_seen: i32,
}

impl Prober {
    fn wait(&self, spec: &Spec, now: Instant) -> Duration {
        let last = self.last_run.get(&spec.kind).map(|at| now - *at);
        next_run(spec, now - self.since, last)
    }

    fn start_over(&mut self, restarts: i32) {
        self.probing.restarted();
        self.last_run.clear();
        self.since = Instant::now();
        self.restarts_seen = restarts;
    }

    /// What the probes say now, where the status reads it.
    fn publish<P>(&self, shared: &Shared<P>, uid: &str) {
        let probed = Probed {
            ready: self.probing.ready(self.has_readiness, self.has_startup),
            started: self.probing.started(self.has_startup),
        };
        shared.remember(uid, |m| m.probed = Some(probed));
    }
}

async fn connect<P: Provider>(shared: &Shared<P>, pod: &Pod, uid: &str) -> Result<Session, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let reach = shell::reach(shared, pod, namespace, name)
        .await
        .map_err(|refusal| refusal.message)?;
    ssh::connect(&reach.target, uid, &reach.key, &reach.expected)
        .await
        .map_err(|error| error.to_string())
}

/// Restarts the container as the kubelet does after a failed liveness or startup probe; a
/// `restartPolicy: Never` container is stopped instead (it is not restarted, and the pod ends).
async fn restart<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    kind: Kind,
    container: &str,
) {
    let Some(snapshot) = shared.latest() else {
        return;
    };
    let Some(instance) = snapshot
        .for_pod(uid)
        .find(|instance| instance.state == InstanceState::Running)
    else {
        return;
    };
    let never = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.restart_policy.as_deref())
        == Some("Never");
    let probe = kind.title().to_lowercase();
    let message = if never {
        format!("Container {container} failed {probe} probe, will be stopped (restartPolicy Never)")
    } else {
        format!("Container {container} failed {probe} probe, will be restarted")
    };
    shared
        .event(&pod.object_ref(&()), false, "Killing", message)
        .await;
    let done = if never {
        shared.provider.stop(&instance.id).await
    } else {
        shared.provider.restart(&instance.id).await
    };
    match done {
        Ok(true) => {
            info!(pod_uid = %uid, instance = %instance.id, probe = %probe, "the container failed its probe and was restarted or stopped");
        }
        Ok(false) => {
            warn!(pod_uid = %uid, instance = %instance.id, "the cloud would not restart or stop the container")
        }
        Err(error) => {
            warn!(pod_uid = %uid, instance = %instance.id, %error, "restarting the container failed")
        }
    }
}
