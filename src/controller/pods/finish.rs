//! The ends of a pod's instance: finishing (record the end, terminate, then write the terminal
//! phase), deletion (stop, terminate once stopped or the grace period passed, then remove the
//! pod) and terminating one instance exactly once.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use runpod_contract::ENDED;
use serde_json::json;
use tracing::debug;

use super::decide::ends::Unlisted;
use super::decide::{Note, ends, gates};
use super::{ReconcileError, SHORT, pods_in, write};
use crate::controller::clock::elapsed;
use crate::controller::context::Shared;
use crate::controller::pods::status::{self, RecordedEnd, View, annotation};
use crate::provider::{Ends, Instance, InstanceState, Provider};

/// Ends a pod: terminate the instance, confirm, and only then write the terminal phase (a
/// terminal pod can be removed by anyone at once, taking the record of the instance with it).
pub(super) async fn finish<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    view: View<'_>,
) -> Result<Action, ReconcileError> {
    // Record the end first: a controller that dies after the terminate finds it here, and
    // finishes the pod the same way instead of failing it or creating it again.
    if let Some(record) = RecordedEnd::of(&view)
        && RecordedEnd::on(pod).as_ref() != Some(&record)
    {
        let value = serde_json::to_string(&record)?;
        let patch = json!({"metadata": {"annotations": {ENDED: value}}});
        pods_in(&ctx.client, pod.metadata.namespace.as_deref())
            .patch(
                pod.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        ctx.metrics.pod_writes.inc();
    }
    terminate(ctx, pod, uid, instance, "the pod finished").await?;
    write::status(ctx, pod, &view).await?;
    Ok(Action::await_change())
}

/// Deletion: stop first (the container gets its signal), terminate once stopped or once the
/// grace period passed, then remove the pod object (UID precondition). The calls that end GPU
/// billing (the stop; one DELETE for a grace-0 deletion or an instance not running yet) are
/// `cloud::billing`'s, which sends them ahead of every other pod's DELETE whatever the workers
/// are doing; this worker is only told to look, and waits for their record.
pub(super) async fn delete<P: Provider>(
    pod: &Pod,
    uid: &str,
    live: &[&Instance],
    confirmed_at: Option<Timestamp>,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let now = Timestamp::now();
    let listed_pending = end_listed(pod, uid, live, now, ctx).await?;
    let unlisted_pending = end_unlisted(pod, uid, live, confirmed_at, now, ctx).await?;
    if listed_pending || unlisted_pending {
        return Ok(Action::requeue(SHORT));
    }
    remove(pod, uid, ctx).await
}

/// Ends each listed instance of the deleted pod in its turn; returns whether any is still
/// ending (billing's stop not yet sent, or stopping within the grace period).
async fn end_listed<P: Provider>(
    pod: &Pod,
    uid: &str,
    live: &[&Instance],
    now: Timestamp,
    ctx: &Shared<P>,
) -> Result<bool, ReconcileError> {
    let grace = ends::grace_period(&pod.metadata);
    let mut pending = false;
    let mut billing_due = false;
    for instance in live {
        let (stop_sent, ending, bills) = ctx.remember(uid, |m| {
            (
                m.stop_sent.get(&instance.id).copied(),
                m.ending.contains(&instance.id),
                ends::bills_gpu(instance, m),
            )
        });
        if ending {
            pending = true;
            continue;
        }
        if stop_sent.is_none() && bills {
            billing_due = true;
            pending = true;
            continue;
        }
        let stopped = matches!(instance.state, InstanceState::Exited | InstanceState::Error);
        let running = matches!(instance.state, InstanceState::Running);
        let grace_over = stop_sent.is_some_and(|at| elapsed(at, now) >= grace) || grace.is_zero();
        if stopped || grace_over || !running {
            terminate(ctx, pod, uid, instance, "the pod was deleted").await?;
        } else {
            pending = true;
        }
    }
    if billing_due {
        ctx.ends_due.notify_one();
    }
    Ok(pending)
}

/// An instance no list shows: one known by id is ended by id (when it is this pod's), and a
/// create whose outcome is unknown holds the pod until lists could show its instance. Returns
/// whether the pod must wait.
async fn end_unlisted<P: Provider>(
    pod: &Pod,
    uid: &str,
    live: &[&Instance],
    confirmed_at: Option<Timestamp>,
    now: Timestamp,
    ctx: &Shared<P>,
) -> Result<bool, ReconcileError> {
    let mut pending = false;
    let (memory_id, marked_at, nothing_created, terminated) = ctx.remember(uid, |m| {
        (
            m.instance.as_ref().map(|(id, _)| id.clone()),
            m.create_marked_at,
            m.nothing_created,
            m.terminated.clone(),
        )
    });
    let recorded = (!status::is_terminal(pod))
        .then(|| annotation(pod, ctx.provider.id_annotation()))
        .flatten();
    let marker = gates::create_marker(pod, marked_at, nothing_created, now);
    let facts = ends::UnlistedFacts {
        known: memory_id.as_deref().or(recorded),
        listed: live,
        terminated: &terminated,
        create_unsettled: gates::unsettled(marker, confirmed_at, ctx.settings.create_settle),
    };
    match ends::unlisted(&facts) {
        Unlisted::TerminateById(id) => {
            // An id this leader made or adopted is ours. One read from the pod's annotation
            // (which a user can edit) is asked for first, and ended only when the cloud says it
            // is this pod's (its tag) and alive.
            // An unanswerable id (a user's junk) must not hold the pod: an instance of this
            // pod that the lookup missed is garbage-collected at the first list that shows it.
            let looked_up = if memory_id.as_deref() == Some(id.as_str()) {
                None
            } else {
                ctx.provider.lookup(&id).await.unwrap_or_else(|error| {
                    debug!(pod_uid = uid, instance = %id, %error, "the pod's recorded instance could not be looked up");
                    None
                })
            };
            let ours = ends::ours_to_end(&id, memory_id.as_deref(), uid, looked_up.as_ref());
            if ours {
                ctx.provider.terminate(&id, Ends::GpuBilling).await?;
                ctx.metrics.terminated(ctx.provider.name());
            }
            ctx.remember(uid, |m| m.terminated.insert(id.clone()));
        }
        Unlisted::WaitForList => {
            debug!(
                pod_uid = uid,
                "a create's outcome is unknown: the deleted pod waits for lists that may show its instance"
            );
            pending = true;
        }
        Unlisted::Nothing => {}
    }
    Ok(pending)
}

/// Removes the pod object once nothing of it bills (UID precondition: never a new pod of the
/// same name).
async fn remove<P: Provider>(
    pod: &Pod,
    uid: &str,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let pods = pods_in(&ctx.client, pod.metadata.namespace.as_deref());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match pods
        .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
        Err(error) => return Err(error.into()),
    }
    // The memory of what was terminated stays until the pod has left the cache (the list loop
    // forgets pods that are gone): a reconcile of the removed pod, on a list taken before the
    // DELETE, must not send the DELETE again.
    Ok(Action::await_change())
}

/// Says `notes` on the pod (for the deletion's calls outside the reconcile).
pub(crate) async fn say<P: Provider>(
    ctx: &Shared<P>,
    pod: &impl kube::Resource<DynamicType = ()>,
    notes: Vec<Note>,
) {
    write::notes(ctx, pod, notes).await;
}

/// Terminates the pod's `instance` once, and says so on the pod.
pub(crate) async fn terminate<P: Provider>(
    ctx: &Shared<P>,
    pod: &impl kube::Resource<DynamicType = ()>,
    uid: &str,
    instance: &Instance,
    why: &str,
) -> Result<(), ReconcileError> {
    let said = terminate_once(ctx, uid, instance, why).await?;
    write::notes(ctx, pod, said.into_iter().collect()).await;
    Ok(())
}

/// Terminates the pod's `instance` once (a stop the cloud accepted already ended GPU
/// billing); returns the Event to say, `None` when it was terminated before.
pub(super) async fn terminate_once<P: Provider>(
    ctx: &Shared<P>,
    uid: &str,
    instance: &Instance,
    why: &str,
) -> Result<Option<Note>, ReconcileError> {
    if ctx.remember(uid, |m| m.terminated.contains(&instance.id)) {
        return Ok(None);
    }
    let stopped = ctx.remember(uid, |m| m.stopped.contains(&instance.id));
    let ends = if stopped {
        Ends::Storage
    } else {
        instance.state.termination_ends()
    };
    ctx.provider.terminate(&instance.id, ends).await?;
    ctx.metrics.terminated(ctx.provider.name());
    ctx.remember(uid, |m| m.terminated.insert(instance.id.clone()));
    Ok(Some(Note::normal(
        "RunPodPodTerminated",
        format!(
            "{} {} terminated: {why}",
            ctx.provider.instance_noun(),
            instance.id
        ),
    )))
}
