//! Ending GPU billing without waiting for a reconcile worker. When hundreds of pods are
//! deleted at once, the workers reconcile them in whatever order the queue holds, and a worker
//! waiting for its pod's DELETE (a stopped instance: storage only) cannot ask for another
//! pod's stop. So the stops (and the terminations of instances that still bill a GPU) of
//! deleted pods are sent from here: every second, and at once when a worker asks, every
//! deleted pod on the node is looked at, and each of its instances that still bills a GPU gets
//! its one call, each in its own task. In the rate limiter they all wait ahead of every DELETE
//! of a stopped instance, every create and every read, however many pods wait for a worker.
//!
//! The rules are the deletion's (`pods::decide::ends`, shared with `pods::finish::delete`):
//! the grace period starts with the stop; a grace-0 deletion, or an instance not running yet,
//! is terminated with one call. The workers keep the rest: a DELETE once the container stopped
//! or the grace period passed, and removing the pod.

use crate::controller::cached::{self, CachedPod, PodStore};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::controller::context::{Shared, Snapshot};
use crate::controller::pods::decide::ends::{EndCall, due};
use crate::controller::pods::{finish, hooks};
use crate::provider::{Instance, Provider};

/// How often deleted pods are looked at when nobody asks.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// After a failed call, how long before the instance's call is tried again (the client has
/// retried inside the call already; an outage must not turn into a call per pod per second).
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// Looks at the deleted pods every second, or at once when `shared.ends_due` is notified, and
/// starts the calls `due` names. The calls live in this task's set: they end with it.
pub(crate) async fn run<P: Provider>(shared: Arc<Shared<P>>, pods: PodStore) {
    let mut calls: JoinSet<()> = JoinSet::new();
    let mut interval = tokio::time::interval(SWEEP_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = shared.ends_due.notified() => {}
            Some(_) = calls.join_next(), if !calls.is_empty() => continue,
        }
        let Some(snapshot) = shared.latest() else {
            continue;
        };
        for pod in pods.state() {
            start_due(&shared, &snapshot, &pod, &mut calls);
        }
    }
}

/// Marks and starts each call `pod` needs (under the memory lock, so no call is sent twice).
fn start_due<P: Provider>(
    shared: &Arc<Shared<P>>,
    snapshot: &Snapshot,
    pod: &Arc<CachedPod>,
    calls: &mut JoinSet<()>,
) {
    if pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    let Some(uid) = pod.metadata.uid.clone() else {
        return;
    };
    let started: Vec<(Instance, EndCall)> = shared.remember(&uid, |memory| {
        let due: Vec<(Instance, EndCall)> = due(&pod.metadata, snapshot.for_pod(&uid), memory)
            .into_iter()
            .map(|(instance, call)| (instance.clone(), call))
            .collect();
        for (instance, _) in &due {
            memory.ending.insert(instance.id.clone());
        }
        due
    });
    for (instance, call) in started {
        debug!(instance = %instance.id, ?call, "ending GPU billing of a deleted pod");
        calls.spawn(end(
            shared.clone(),
            pod.clone(),
            uid.clone(),
            instance,
            call,
        ));
    }
}

/// Sends one call and records what it did; a failure is tried again at the next look.
async fn end<P: Provider>(
    shared: Arc<Shared<P>>,
    pod: Arc<CachedPod>,
    uid: String,
    instance: Instance,
    call: EndCall,
) {
    let id = instance.id.clone();
    match call {
        EndCall::Stop => {
            // As the kubelet: the preStop hook first, inside the grace period (which then runs
            // from the hook's start), then the signal; the hook's Event after the stop.
            // The hook needs the spec: the pod is decoded for it alone, not held while the
            // stop waits for the quota.
            // The hook, the Event and the terminate are boxed: a call's task is kept small
            // while it waits for the quota (a thousand deleted pods wait at once), holding
            // only the stop's state, not the largest of every step's.
            let hook = Box::pin(async {
                match cached::decode(&pod) {
                    Some(decoded) => hooks::pre_stop(&shared, &decoded, &uid).await,
                    None => hooks::PreStop::default(),
                }
            })
            .await;
            stop(&shared, &uid, &id, hook.began).await;
            Box::pin(finish::say(&shared, &*pod, hook.note.into_iter().collect())).await;
        }
        EndCall::Terminate => {
            // The same bookkeeping, Event and metric as every other termination.
            let ended = Box::pin(finish::terminate(
                &shared,
                &*pod,
                &uid,
                &instance,
                "the pod was deleted",
            ))
            .await;
            if let Err(error) = ended {
                warn!(instance = %id, %error, "terminating a deleted pod's instance failed; trying again");
                tokio::time::sleep(RETRY_AFTER).await;
            }
            shared.remember(&uid, |m| m.ending.remove(&id));
        }
    }
}

/// Sends the stop; the grace period runs from its answer (the container got its signal then,
/// however long the stop waited for the quota), or from the start of the `preStop` hook that
/// ran before it (`since`).
async fn stop<P: Provider>(shared: &Shared<P>, uid: &str, id: &str, since: Option<Timestamp>) {
    match shared.provider.stop(id).await {
        Ok(accepted) => shared.remember(uid, |m| {
            m.ending.remove(id);
            m.stop_sent
                .insert(id.to_owned(), since.unwrap_or_else(Timestamp::now));
            if accepted {
                m.stopped.insert(id.to_owned());
            }
        }),
        Err(error) => {
            warn!(instance = %id, %error, "stopping a deleted pod's instance failed; trying again");
            tokio::time::sleep(RETRY_AFTER).await;
            shared.remember(uid, |m| m.ending.remove(id));
        }
    }
}

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod task_size {
    /// The size of the future an async fn of five arguments returns.
    fn future_size<F, A1, A2, A3, A4, A5, R>(_: &F) -> usize
    where
        F: Fn(A1, A2, A3, A4, A5) -> R,
    {
        std::mem::size_of::<R>()
    }

    /// A mass deletion spawns one call per deleted pod, and they wait for the quota together:
    /// each task must hold the stop's state, not the hook's, the Event's and the terminate's
    /// too (it was 11 KB: 11 MB for a thousand deleted pods).
    #[test]
    fn a_billing_call_waiting_for_the_quota_is_small() {
        type P = crate::controller::cloud::gate::Gated<crate::runpod::provider::RunPodProvider>;
        let size = future_size(&super::end::<P>);
        assert!(size <= 4096, "a billing call's task takes {size} bytes");
    }
}
