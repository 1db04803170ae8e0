//! Probes run where the pod runs. A kubelet probes its containers; a burst pod's container is
//! on a cloud, so the leader runs its startup, liveness and readiness probes there, over the
//! node's SSH connection to the pod (the path of `kubectl exec` and `port-forward`): an `exec`
//! probe runs its command in the container, `httpGet` and `tcpSocket` reach the container's
//! loopback. Readiness gates Ready (through the pod's memory, which the status reads); a
//! liveness or startup probe that fails its threshold restarts the container (the provider's
//! `restart`; a `restartPolicy: Never` pod's container is stopped instead, and the pod ends),
//! with the kubelet's Events `Unhealthy` and `Killing`. Clouds without a shell run none: the
//! admission warning and the `PodFieldsNotHonoured` Event say so.

pub(crate) mod run;
pub(crate) mod spec;
pub(crate) mod state;
pub(crate) mod tls;

use crate::controller::cached::{self, CachedPod, PodStore};
use crate::controller::pods::status::inits;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use self::run::Failure;
use self::spec::{Check, Kind, Spec};
use self::state::{Probed, Probing, Verdict, next_run};
use crate::controller::context::{Shared, Snapshot};
use crate::controller::kubelet_api::exec::ssh::{self, Session};
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::shell;
use crate::provider::{Instance, InstanceState, Provider, ShellAccess};

/// How long a `postStart` `httpGet` hook may take; one that takes longer failed (and its
/// container is killed). The container is not held back while it runs: its cloud says it runs.
const POST_START_TIMEOUT: Duration = Duration::from_secs(30);

/// After a failed `postStart` hook killed the container, how long the prober waits before
/// sending the hook again (to the restarted container, or the old one if it is still there:
/// then it fails again, as it would).
const POST_START_HOLD: Duration = Duration::from_secs(20);

/// How often the pods are looked at for probers to start or end.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// How many connections in a row may fail before the pod is said to be unreachable by its
/// probes (its sshd may take a few seconds to start).
const UNREACHED_BEFORE_FALLBACK: u32 = 10;

/// After the prober restarted a container, how long it waits for the restart to show (the
/// uptime going back) before it probes again: it must not probe the old container.
const RESTART_HOLD: Duration = Duration::from_secs(120);

/// A prober task, ended when dropped (with the leader's tasks, or when its pod stops running).
struct Running(JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts a prober for each running burst pod with probes, and ends it when the pod stops
/// running, is deleted or ends. Nothing runs where the node has no shell into its pods.
///
/// `ticks` asks for every pod to be reconciled (the poller's list does the same): a change of
/// what the probes say shows in the status at once, not at the next list.
pub(crate) async fn run<P: Provider>(
    shared: Arc<Shared<P>>,
    pods: PodStore,
    ticks: mpsc::Sender<()>,
) {
    if !runs_here(&shared) {
        return;
    }
    let mut probers: HashMap<String, Running> = HashMap::new();
    // What each pod's spec says for probing: fixed for a pod's life (its containers' probes
    // and hooks, its init containers), so a pod is decoded for it once, not every second.
    let mut probeable: HashMap<String, Probeable> = HashMap::new();
    let mut look = tokio::time::interval(LOOK_EVERY);
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        let Some(snapshot) = shared.latest() else {
            continue;
        };
        let mut wanted = HashSet::new();
        let state = pods.state();
        let present: HashSet<&str> = state.iter().filter_map(|pod| pod.uid()).collect();
        probeable.retain(|uid, _| present.contains(uid.as_str()));
        for cached in &state {
            let Some(uid) = cached.metadata.uid.clone() else {
                continue;
            };
            let kind = *probeable
                .entry(uid.clone())
                .or_insert_with(|| Probeable::of(cached));
            if !kind.any
                || cached.metadata.deletion_timestamp.is_some()
                || matches!(cached.phase(), Some("Succeeded" | "Failed"))
            {
                continue;
            }
            // As the kubelet, nothing probes a container before its init containers are done
            // (the pod's status says so, or what its log said last).
            let initializing = !shared.remember(&uid, |m| {
                inits::initialized(kind.inits, cached.status.as_ref(), m.init_progress.as_ref())
            });
            if initializing || running_instance(&shared, &snapshot, &uid).is_none() {
                continue;
            }
            wanted.insert(uid.clone());
            probers.entry(uid.clone()).or_insert_with(|| {
                Running(tokio::spawn(probe_pod(
                    shared.clone(),
                    pods.clone(),
                    uid,
                    ticks.clone(),
                )))
            });
        }
        probers.retain(|uid, prober| {
            let keep = wanted.contains(uid) && !prober.0.is_finished();
            if !keep {
                // What it said was of a container that is gone: the next one starts unprobed.
                shared.remember(uid, |m| m.probed = None);
            }
            keep
        });
    }
}

/// The pod's running instance: the one this leader tracks, else the oldest listed running,
/// never one it terminated.
fn running_instance<P>(shared: &Shared<P>, snapshot: &Snapshot, uid: &str) -> Option<Instance> {
    let (tracked, terminated) = shared.remember(uid, |m| {
        (
            m.instance.as_ref().map(|(id, _)| id.clone()),
            m.terminated.clone(),
        )
    });
    let mut running: Vec<&Instance> = snapshot
        .for_pod(uid)
        .filter(|i| i.state == InstanceState::Running && !terminated.contains(&i.id))
        .collect();
    running.sort_by_key(|i| (Some(&i.id) != tracked.as_ref(), i.created_at));
    running.first().map(|i| (*i).clone())
}

/// Whether probes run on this node: its cloud offers a shell and the node has its key.
pub(crate) fn runs_here<P: Provider>(shared: &Shared<P>) -> bool {
    matches!(shared.settings.exec, ExecAccess::Ready { .. })
        && matches!(shared.provider.shell_access(), ShellAccess::Offered { .. })
}

/// What the status shows of a probed pod before its prober has said anything: not ready (a
/// readiness or startup probe must pass first) and not started (likewise a startup probe);
/// `None` for a pod without probes, or where none run.
pub(crate) fn before_any(pod: &Pod, probes_run: bool) -> Option<Probed> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let gated = container.readiness_probe.is_some() || container.startup_probe.is_some();
    (probes_run && has_probes(pod)).then(|| Probed {
        ready: gated.then_some(false),
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

/// The container start a `postStart` hook is for: the pod's running instance and its restart
/// count; `None` while it has no running instance.
fn container_start<P>(shared: &Shared<P>, uid: &str) -> Option<(String, i32)> {
    let snapshot = shared.latest()?;
    let instance = running_instance(shared, &snapshot, uid)?;
    Some((instance.id, shared.remember(uid, |m| m.restarts)))
}

/// Whether the pod's container has an `httpGet` `postStart` hook (the prober runs it).
fn has_post_start_http(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .is_some_and(|c| spec::post_start_http(c).is_some())
}

/// What a pod's spec says for the prober.
#[derive(Clone, Copy)]
struct Probeable {
    /// It has probes, or a `postStart` HTTP hook.
    any: bool,
    /// It has init containers (nothing is probed before they are done).
    inits: bool,
}

impl Probeable {
    fn of(cached: &CachedPod) -> Probeable {
        cached::decode(cached).map_or(
            Probeable {
                any: false,
                inits: false,
            },
            |pod| Probeable {
                any: has_probes(&pod) || has_post_start_http(&pod),
                inits: inits::has_inits(&pod),
            },
        )
    }
}

fn find(pods: &PodStore, uid: &str) -> Option<Arc<Pod>> {
    pods.state()
        .iter()
        .find(|pod| pod.uid() == Some(uid))
        .and_then(|pod| cached::decode(pod))
        .map(Arc::new)
}

/// One pod's prober: runs each due probe, counts, publishes what it means, restarts.
async fn probe_pod<P: Provider>(
    shared: Arc<Shared<P>>,
    pods: PodStore,
    uid: String,
    ticks: mpsc::Sender<()>,
) {
    let Some(pod) = find(&pods, &uid) else {
        return;
    };
    let Some(container) = pod.spec.as_ref().and_then(|spec| spec.containers.first()) else {
        return;
    };
    // What the prober needs of the container is taken now; the decoded pod is not kept (a
    // pod is decoded again for each step that reaches it, and let go after it).
    let container_name = container.name.clone();
    let (specs, mut unrunnable) = spec::specs(container);
    let post_start = match spec::post_start_http(container) {
        Some(Ok(check)) => Some(check),
        Some(Err(why)) => {
            unrunnable.push(why);
            None
        }
        None => None,
    };
    for why in unrunnable {
        let message = format!("{why}; it is not run");
        shared
            .event(&pod.object_ref(&()), true, "ProbeNotRun", message)
            .await;
    }
    drop(pod);
    let mut prober = Prober {
        has_startup: specs.iter().any(|s| s.kind == Kind::Startup),
        has_readiness: specs.iter().any(|s| s.kind == Kind::Readiness),
        probing: Probing::default(),
        since: Instant::now(),
        last_run: HashMap::new(),
        restarts_seen: shared.remember(&uid, |m| m.restarts),
        held: None,
        unreached: 0,
        killed_for_hook: false,
        ticks,
    };
    prober.publish(&shared, &uid);
    let mut session: Option<Session> = None;
    loop {
        let restarts = shared.remember(&uid, |m| m.restarts);
        if restarts != prober.restarts_seen {
            // The container started over (on the cloud, or after a probe): so do its probes,
            // and its postStart hook (due again: the start it was sent for is another).
            prober.start_over(restarts);
            session = None;
            prober.publish(&shared, &uid);
        }
        // Once per container start, before any probe (the kubelet's order); a start is this
        // instance at this restart count, remembered with the pod (a new prober, after a
        // failover, does not send it again).
        let start = post_start
            .as_ref()
            .and_then(|_| container_start(&shared, &uid))
            .filter(|start| shared.remember(&uid, |m| m.post_start_sent.as_ref() != Some(start)));
        if specs.is_empty() && start.is_none() {
            // Parked until the pod stops running (a finished prober would be started again);
            // a restart seen later runs the hook again.
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        }
        if prober
            .held
            .is_some_and(|(since, hold)| since.elapsed() < hold)
        {
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        }
        if let (Some(start), Some(check)) = (start, post_start.as_ref()) {
            let Some(pod) = find(&pods, &uid) else {
                return;
            };
            let hook = (start, check, container_name.as_str());
            post_start_step(&shared, &pod, &uid, &mut prober, &mut session, hook).await;
            continue;
        }
        let probes = (specs.as_slice(), container_name.as_str());
        if !probe_step(&shared, &pods, &uid, &mut prober, &mut session, probes).await {
            return;
        }
    }
}

/// Runs the probe due now, if any: counts its answer, says a failure that counts, restarts the
/// container when a threshold is reached, and publishes what the probes say.
/// The pod is decoded only once a probe is due (not across the wait for one); `false` when
/// the pod is gone.
async fn probe_step<P: Provider>(
    shared: &Shared<P>,
    pods: &PodStore,
    uid: &str,
    prober: &mut Prober,
    session: &mut Option<Session>,
    (specs, container): (&[Spec], &str),
) -> bool {
    let due = match prober.next_due(specs) {
        Ok(due) => due,
        Err(wait) => {
            tokio::time::sleep(wait).await;
            return true;
        }
    };
    let Some(decoded) = find(pods, uid) else {
        return false;
    };
    let pod = &*decoded;
    prober.last_run.insert(due.kind, Instant::now());
    let Some(live) = reach(shared, pod, uid, prober, session).await else {
        drop(decoded);
        tokio::time::sleep(LOOK_EVERY).await;
        return true;
    };
    let answer = run::check(&live, &due.check, due.timeout).await;
    if let Err(Failure::Unreached(why)) = &answer {
        // The link, not the container: nothing is counted, and the connection is made anew.
        prober.unreachable(shared, pod, uid, why).await;
        return true;
    }
    *session = Some(live);
    prober.reached(shared, uid);
    let verdict = prober.probing.observe(due, answer.is_ok());
    if let Err(failure) = &answer
        && verdict != Verdict::Nothing
    {
        unhealthy(shared, pod, due.kind, failure).await;
    }
    if verdict == Verdict::Restart {
        let failed = format!("failed {} probe", due.kind.title().to_lowercase());
        restart(shared, pod, uid, &failed, container).await;
        let restarts = shared.remember(uid, |m| m.restarts);
        prober.start_over(restarts);
        prober.held = Some((Instant::now(), RESTART_HOLD));
        *session = None;
    }
    prober.publish(shared, uid);
    true
}

/// Sends the `postStart` hook to the container start `hook.0` (instance, restart count), once
/// it answers; a failure kills the container as the kubelet does, and the hook stays due for
/// the restarted one.
async fn post_start_step<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    prober: &mut Prober,
    session: &mut Option<Session>,
    (start, check, container): ((String, i32), &Check, &str),
) {
    if prober.killed_for_hook {
        // The container it killed has restarted by now, with new host keys; its restart may
        // have gone unseen (killed seconds after its start, its uptime never goes back in a
        // list), so what was known of the old one goes.
        prober.killed_for_hook = false;
        *session = None;
        shell::forget_host_keys(shared, pod, &start.0).await;
    }
    let Some(live) = reach(shared, pod, uid, prober, session).await else {
        tokio::time::sleep(LOOK_EVERY).await;
        return;
    };
    match run::check(&live, check, POST_START_TIMEOUT).await {
        Err(Failure::Unreached(why)) => {
            prober.unreachable(shared, pod, uid, &why).await;
            return;
        }
        Ok(()) => {
            debug!(pod_uid = %uid, "the postStart hook ran");
            shared.remember(uid, |m| m.post_start_sent = Some(start));
            *session = Some(live);
        }
        Err(Failure::Failed(why)) => {
            // As the kubelet: the container is killed, and restarted per its policy. Still
            // due: sent again once the restart shows (or the hold ends, should the restart go
            // unseen), to the new container.
            shared
                .event_as(
                    &pod.object_ref(&()),
                    true,
                    ("FailedPostStartHook", "FailedPostStartHook"),
                    format!("PostStartHook failed: {why}"),
                )
                .await;
            restart(shared, pod, uid, "failed its postStart hook", container).await;
            let restarts = shared.remember(uid, |m| m.restarts);
            prober.start_over(restarts);
            // A container killed seconds after its start may restart unseen (its uptime never
            // goes back in a list): a short hold, then the hook again.
            prober.held = Some((Instant::now(), POST_START_HOLD));
            prober.killed_for_hook = true;
        }
    }
    prober.reached(shared, uid);
}

/// The open session to the pod, else a new one; `None` when the pod cannot be reached (said
/// and counted by the prober).
async fn reach<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    uid: &str,
    prober: &mut Prober,
    session: &mut Option<Session>,
) -> Option<Session> {
    match session.take() {
        Some(open) if !open.is_closed() => Some(open),
        _ => match connect(shared, pod, uid).await {
            Ok(open) => Some(open),
            Err(why) => {
                prober.unreachable(shared, pod, uid, &why).await;
                None
            }
        },
    }
}

/// The kubelet's `Unhealthy` Event for a failure that counts, with one action per probe (the
/// recorder would merge every probe's into one series otherwise).
async fn unhealthy<P: Provider>(shared: &Shared<P>, pod: &Pod, kind: Kind, failure: &Failure) {
    let message = format!("{} probe failed: {}", kind.title(), failure.message());
    let action = format!("{}Probe", kind.title());
    shared
        .event_as(&pod.object_ref(&()), true, ("Unhealthy", &action), message)
        .await;
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
    /// Since when, and for how long at most, probing waits for a restart this prober asked
    /// for to show.
    held: Option<(Instant, Duration)>,
    /// Connections that failed in a row.
    unreached: u32,
    /// This prober killed the container for its failed `postStart` hook.
    killed_for_hook: bool,
    /// Asks for every pod to be reconciled, so a change shows in the status at once.
    ticks: mpsc::Sender<()>,
}

impl Prober {
    fn wait(&self, spec: &Spec, now: Instant) -> Duration {
        let last = self.last_run.get(&spec.kind).map(|at| now - *at);
        next_run(spec, now - self.since, last)
    }

    /// The probe due now, else how long to sleep before looking again (at most a second).
    fn next_due<'a>(&self, specs: &'a [Spec]) -> Result<&'a Spec, Duration> {
        let now = Instant::now();
        let waits: Vec<(Duration, &Spec)> = specs
            .iter()
            .filter(|s| self.probing.runs(s.kind, self.has_startup))
            .map(|s| (self.wait(s, now), s))
            .collect();
        match waits.iter().find(|(wait, _)| wait.is_zero()) {
            Some((_, due)) => Ok(due),
            None => Err(waits
                .iter()
                .map(|(wait, _)| *wait)
                .min()
                .unwrap_or(LOOK_EVERY)
                .min(LOOK_EVERY)),
        }
    }

    fn start_over(&mut self, restarts: i32) {
        self.probing.restarted();
        self.last_run.clear();
        self.since = Instant::now();
        self.restarts_seen = restarts;
        self.held = None;
    }

    /// What the probes say now: while the pod cannot be reached, the ports decide (as where
    /// probes do not run), rather than a pod that never becomes Ready.
    fn verdict(&self) -> Probed {
        if self.unreached >= UNREACHED_BEFORE_FALLBACK {
            Probed {
                ready: None,
                started: true,
            }
        } else {
            Probed {
                ready: self.probing.ready(self.has_readiness, self.has_startup),
                started: self.probing.started(self.has_startup),
            }
        }
    }

    /// The verdict, where the status reads it; a change asks for the status at once.
    fn publish<P>(&self, shared: &Shared<P>, uid: &str) {
        let probed = self.verdict();
        let before = shared.remember(uid, |m| m.probed.replace(probed));
        self.tell(before, probed);
    }

    /// Asks for every pod's reconcile when what the probes say changed (a full channel: one
    /// is coming anyway).
    fn tell(&self, before: Option<Probed>, now: Probed) {
        if before != Some(now) {
            let _ = self.ticks.try_send(());
        }
    }

    /// A connection failed: after enough in a row, the pod is said to be unreachable by its
    /// probes (an image without sshd) and the ports decide its readiness.
    async fn unreachable<P: Provider>(
        &mut self,
        shared: &Shared<P>,
        pod: &Pod,
        uid: &str,
        why: &str,
    ) {
        debug!(pod_uid = %uid, %why, "the prober cannot reach the pod");
        self.unreached = self.unreached.saturating_add(1);
        if self.unreached == UNREACHED_BEFORE_FALLBACK {
            let message = format!(
                "the probes cannot reach the container over SSH ({why}); until they can, \
                 Ready follows the container's ports and nothing is restarted"
            );
            shared
                .event(&pod.object_ref(&()), true, "ProbeNotRun", message)
                .await;
            self.publish(shared, uid);
        }
    }

    fn reached<P>(&mut self, shared: &Shared<P>, uid: &str) {
        if self.unreached >= UNREACHED_BEFORE_FALLBACK {
            self.unreached = 0;
            self.publish(shared, uid);
        }
        self.unreached = 0;
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
    failed: &str,
    container: &str,
) {
    let Some(snapshot) = shared.latest() else {
        return;
    };
    let Some(instance) = running_instance(shared, &snapshot, uid) else {
        return;
    };
    let never = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.restart_policy.as_deref())
        == Some("Never");
    let message = if never {
        format!("Container {container} {failed}, will be stopped (restartPolicy Never)")
    } else {
        format!("Container {container} {failed}, will be restarted")
    };
    shared
        .event_as(&pod.object_ref(&()), false, ("Killing", "Killing"), message)
        .await;
    let done = if never {
        shared.provider.stop(&instance.id).await
    } else {
        shared.provider.restart(&instance.id).await
    };

    match done {
        Ok(true) => {
            info!(pod_uid = %uid, instance = %instance.id, why = %failed, "the container failed and was restarted or stopped");
        }
        Ok(false) => {
            warn!(pod_uid = %uid, instance = %instance.id, "the cloud would not restart or stop the container")
        }
        Err(error) => {
            warn!(pod_uid = %uid, instance = %instance.id, %error, "restarting the container failed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prober(ticks: mpsc::Sender<()>) -> Prober {
        Prober {
            has_startup: false,
            has_readiness: true,
            probing: Probing::default(),
            since: Instant::now(),
            last_run: HashMap::new(),
            restarts_seen: 0,
            held: None,
            unreached: 0,
            killed_for_hook: false,
            ticks,
        }
    }

    #[tokio::test]
    async fn a_changed_verdict_asks_for_the_status_at_once_an_unchanged_one_does_not() {
        let (tx, mut rx) = mpsc::channel(1);
        let prober = prober(tx);
        let unready = prober.verdict();
        assert_eq!(unready.ready, Some(false), "no readiness result yet");
        prober.tell(None, unready);
        assert_eq!(rx.try_recv(), Ok(()), "the first verdict is a change");
        prober.tell(Some(unready), unready);
        assert!(rx.try_recv().is_err(), "the same verdict asks nothing");
        let ready = Probed {
            ready: Some(true),
            ..unready
        };
        prober.tell(Some(unready), ready);
        assert_eq!(rx.try_recv(), Ok(()), "ready now");
        // A full channel (a reconcile already asked for) is not an error.
        prober.tell(Some(ready), unready);
        prober.tell(Some(unready), ready);
        assert_eq!(rx.try_recv(), Ok(()));
    }
}
