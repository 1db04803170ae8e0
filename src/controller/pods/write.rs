//! The pod writes: status (only when something owned changed) and the controller-owned
//! annotations that describe the instance.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use runpod_contract::{COST_PER_HR, DATACENTER, ENDPOINTS, GPU_TYPE};
use serde_json::json;
use tracing::debug;

use super::decide::{Next, Note, Outcome};
use super::{ReconcileError, pods_in};
use crate::controller::context::Shared;
use crate::controller::pods::status::{self, View};
use crate::provider::{Instance, Provider};

/// `8080/http=https://…,22/tcp=IP:PORT` for the ports that are published.
pub(crate) fn endpoints_annotation(instance: &Instance) -> String {
    instance
        .endpoints
        .iter()
        .filter_map(|e| {
            Some(format!(
                "{}/{}={}",
                e.port,
                e.protocol,
                e.address.as_deref()?
            ))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The controller-owned annotations that describe `instance`.
pub(crate) fn instance_annotations(
    instance: &Instance,
    id_annotation: &'static str,
) -> Vec<(&'static str, Option<String>)> {
    vec![
        (id_annotation, Some(instance.id.clone())),
        (
            COST_PER_HR,
            instance.cost_per_hour.map(|c| format!("{c:.3}")),
        ),
        (GPU_TYPE, instance.gpu_type.clone()),
        (DATACENTER, instance.datacenter.clone()),
        (
            ENDPOINTS,
            Some(endpoints_annotation(instance)).filter(|e| !e.is_empty()),
        ),
    ]
}

/// The instance's annotations that differ from the pod's (a forged value among them), as a
/// merge patch's members: `null` removes one the instance no longer has.
fn changed_annotations(
    pod: &Pod,
    instance: &Instance,
    id_annotation: &'static str,
) -> serde_json::Map<String, serde_json::Value> {
    let current = pod.metadata.annotations.as_ref();
    instance_annotations(instance, id_annotation)
        .into_iter()
        .filter(|(key, value)| {
            current.and_then(|all| all.get(*key)).map(String::as_str) != value.as_deref()
        })
        .map(|(key, value)| {
            (
                key.to_owned(),
                value.map_or(serde_json::Value::Null, serde_json::Value::String),
            )
        })
        .collect()
}

/// Carries a decision out: its Events, its status, then the annotations of the instance it
/// describes; returns when to look again.
pub(super) async fn apply<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    outcome: Outcome,
) -> Result<Action, ReconcileError> {
    notes(ctx, pod, outcome.events).await;
    if let Some(view) = &outcome.status {
        status(ctx, pod, view).await?;
    }
    if let Some(instance) = &outcome.describes {
        annotations(ctx, pod, instance).await?;
    }
    Ok(match outcome.next {
        Next::Requeue(after) => Action::requeue(after),
        Next::AwaitChange => Action::await_change(),
    })
}

/// Records decided Events on the pod, in order.
pub(super) async fn notes<P>(
    ctx: &Shared<P>,
    pod: &impl kube::Resource<DynamicType = ()>,
    notes: Vec<Note>,
) {
    for note in notes {
        ctx.event(
            &pod.object_ref(&()),
            note.warning,
            note.reason,
            note.message,
        )
        .await;
    }
}

/// Writes the status only when it changes anything.
pub(super) async fn status<P>(
    ctx: &Shared<P>,
    pod: &Pod,
    view: &View<'_>,
) -> Result<(), ReconcileError> {
    let now = Timestamp::now();
    let desired = status::desired(pod, view, &ctx.settings.host_ip, now);
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let progress = ctx.remember(uid, |m| m.init_progress.clone());
    let desired = status::inits::with_inits(pod, desired, progress.as_ref(), now);
    let changed = status::changes(pod, &desired);
    if changed.is_empty() {
        return Ok(());
    }
    debug!(?changed, "writing the pod status");
    let pods = pods_in(&ctx.client, pod.metadata.namespace.as_deref());
    ctx.metrics.pod_writes.inc();
    pods.patch_status(
        pod.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &status::patch(pod, &desired),
    )
    .await?;
    Ok(())
}

/// Writes the controller-owned annotations that describe the instance, when they differ (a
/// forged value is overwritten).
pub(super) async fn annotations<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    instance: &Instance,
) -> Result<(), ReconcileError> {
    let patch = changed_annotations(pod, instance, ctx.provider.id_annotation());
    if patch.is_empty() {
        return Ok(());
    }
    debug!(changed = ?patch.keys().collect::<Vec<_>>(), "writing the instance annotations");
    let pods = pods_in(&ctx.client, pod.metadata.namespace.as_deref());
    ctx.metrics.pod_writes.inc();
    pods.patch(
        pod.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": patch}})),
    )
    .await?;
    Ok(())
}
