//! Reconciling one Kubernetes pod bound to the virtual node against the cloud: create exactly
//! once, track, finish, delete. Every decision that creates, fails or destroys is taken on a
//! complete list (the snapshot), never on an error or a missing answer. The decision itself is
//! pure (`decide`); `create`, `track` and `finish` carry it out.

mod create;
pub(crate) mod decide;
pub(crate) mod finish;
pub(crate) mod hooks;
pub(crate) mod inputs;
pub(crate) mod status;
pub(crate) mod tolerations;
mod track;
mod write;

use kube::Resource as _;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::controller::Action;
use tracing::instrument;

pub(crate) use tolerations::outage_tolerations;

use super::cached::CachedPod;
use super::context::Shared;
use super::memory::PodMemory;
use crate::provider::{Ends, Provider, ProviderError};
use decide::{Remembered, Step};
use status::{annotation, bound_at};

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cloud API: {0}")]
    Provider(#[from] ProviderError),
    #[error("recording how the pod ended: {0}")]
    Record(#[from] serde_json::Error),
    /// The pod's cached text does not decode (a bug: it was written by the cache itself).
    #[error("reading the cached pod: {0}")]
    Cache(serde_json::Error),
}

impl ReconcileError {
    /// The error counter's `kind` label: a few fixed values, so alerts can tell apiserver
    /// conflicts (retried at once, harmless) from a cloud that fails or refuses the account.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            ReconcileError::Kube(kube::Error::Api(status)) if status.code == 409 => "conflict",
            ReconcileError::Kube(kube::Error::Api(status)) if status.code == 404 => "not_found",
            ReconcileError::Kube(kube::Error::Api(_)) => "kube_api",
            ReconcileError::Kube(_) => "kube_unreachable",
            ReconcileError::Provider(ProviderError::Account(_) | ProviderError::KeyRefused(_)) => {
                "cloud_account"
            }
            ReconcileError::Provider(ProviderError::Unavailable(_)) => "cloud_unavailable",
            ReconcileError::Record(_) => "record",
            ReconcileError::Cache(_) => "cache",
        }
    }
}

pub(crate) const SHORT: Duration = Duration::from_secs(2);

/// The pods API of a pod's namespace, for writing to it.
fn pods_in(client: &kube::Client, namespace: Option<&str>) -> Api<Pod> {
    Api::namespaced(client.clone(), namespace.unwrap_or("default"))
}

/// Reconciles one pod (decoded from the cache here, once per reconcile).
#[instrument(skip_all, fields(pod = %format!("{}/{}", cached.metadata.namespace.as_deref().unwrap_or(""), cached.metadata.name.as_deref().unwrap_or(""))))]
pub(crate) async fn reconcile<P: Provider>(
    cached: Arc<CachedPod>,
    ctx: Arc<Shared<P>>,
) -> Result<Action, ReconcileError> {
    let pod = cached.pod().map_err(ReconcileError::Cache)?;
    let settings = &ctx.settings;
    let on_node =
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(settings.node_name.as_str());
    let Some(uid) = pod.metadata.uid.clone() else {
        return Ok(Action::await_change());
    };
    if !on_node {
        return Ok(Action::await_change());
    }
    let Some(snapshot) = ctx.latest() else {
        // Nothing is decided before the first complete list.
        return Ok(Action::requeue(SHORT));
    };
    let (instance, terminated) = ctx.remember(&uid, |m| (m.instance.clone(), m.terminated.clone()));
    let remembered = Remembered {
        instance: instance.as_ref().map(|(id, at)| (id.as_str(), *at)),
        terminated: Some(&terminated),
    };
    match decide::decide(
        &pod,
        &uid,
        &snapshot,
        &remembered,
        settings.create_settle,
        ctx.provider.id_annotation(),
    ) {
        Step::Delete { live } => {
            finish::delete(&pod, &uid, &live, snapshot.confirmed_at, &ctx).await
        }
        Step::Ended { live } => {
            for instance in &live {
                finish::terminate(&ctx, &pod, &uid, instance, "the pod has finished").await?;
            }
            if !live.is_empty() {
                return Ok(Action::requeue(SHORT));
            }
            // Only the kept logs outlive the instance, for `kubectl logs` of a finished pod.
            ctx.remember(&uid, |m| {
                *m = PodMemory {
                    final_log: m.final_log.take(),
                    final_init_logs: m.final_init_logs.take(),
                    terminated: std::mem::take(&mut m.terminated),
                    ..PodMemory::default()
                }
            });
            Ok(Action::await_change())
        }
        Step::Track {
            primary,
            duplicates,
        } => {
            for duplicate in duplicates {
                ctx.event(
                    &pod.object_ref(&()),
                    true,
                    "DuplicateTerminated",
                    format!(
                        "{} {} is a second instance for this Kubernetes pod; terminating it",
                        ctx.provider.instance_noun(),
                        duplicate.id
                    ),
                )
                .await;
                finish::terminate(&ctx, &pod, &uid, duplicate, "duplicate").await?;
            }
            track::track(&pod, &uid, primary, &snapshot, &ctx).await
        }
        Step::WaitForList => Ok(Action::requeue(SHORT)),
        Step::Confirm { id } => track::confirm(&pod, &uid, id, &snapshot, &ctx).await,
        Step::FinishFromRecord { record, terminate } => {
            if let Some(id) = terminate {
                // Its terminate answer may have been lost: DELETE again (gone counts as done).
                // Mostly the instance is stopped or gone: only one listed as possibly running
                // goes ahead of other pods' stops.
                let ends = snapshot
                    .instances
                    .iter()
                    .find(|instance| instance.id == id)
                    .map_or(Ends::Storage, |instance| instance.state.termination_ends());
                ctx.provider.terminate(&id, ends).await?;
                ctx.remember(&uid, |m| m.terminated.insert(id));
            }
            write::status(&ctx, &pod, &record.view()).await?;
            Ok(Action::await_change())
        }
        Step::Create => create::create(&pod, &uid, &snapshot, &ctx).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> ReconcileError {
        let status: kube::core::Status =
            serde_json::from_value(serde_json::json!({ "code": code, "message": "m" })).unwrap();
        ReconcileError::Kube(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn every_error_kind_has_its_own_metric_label() {
        let record = serde_json::from_str::<u8>("x").unwrap_err();
        let cache = serde_json::from_str::<u8>("y").unwrap_err();
        let cases = [
            (api(409), "conflict"),
            (api(404), "not_found"),
            (api(500), "kube_api"),
            (
                ReconcileError::Kube(kube::Error::LinesCodecMaxLineLengthExceeded),
                "kube_unreachable",
            ),
            (
                ReconcileError::Provider(ProviderError::Account("402".into())),
                "cloud_account",
            ),
            (
                ReconcileError::Provider(ProviderError::Unavailable("503".into())),
                "cloud_unavailable",
            ),
            (ReconcileError::Record(record), "record"),
            (ReconcileError::Cache(cache), "cache"),
        ];
        for (error, label) in cases {
            assert_eq!(error.metric_label(), label, "{error}");
        }
    }
}
