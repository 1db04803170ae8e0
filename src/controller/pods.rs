//! Reconciling one Kubernetes pod bound to the virtual node against the cloud: create exactly
//! once, track, finish, delete. Every decision that creates, fails or destroys is taken on a
//! complete list (the snapshot), never on an error or a missing answer.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Toleration};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use runpod_webhook::contract::{
    self, COST_PER_HR, CREATE_REQUESTED, DATACENTER, ENDED, ENDPOINTS, GPU_TYPE, POD_ID,
};
use serde_json::json;
use tracing::{debug, info, instrument, warn};

use super::context::{Shared, Snapshot, elapsed};
use super::env::{self, ClusterEnvSource};
use super::memory::PodMemory;
use super::node::ApiHealth;
use super::provider::{
    Instance, InstanceState, Provider, ProviderError, ProvisionError, ProvisionRequest,
};
use super::status::{self, RecordedEnd, View};
use super::volumes;

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cloud API: {0}")]
    Provider(#[from] ProviderError),
    #[error("recording how the pod ended: {0}")]
    Record(#[from] serde_json::Error),
}

const SHORT: Duration = Duration::from_secs(2);

/// Taints the node lifecycle controller puts on an unhealthy node.
const OUTAGE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// Whether the controller runs this pod at all: it must ask for a GPU (DaemonSet pods that
/// tolerate every taint, and CPU pods, are not ours to run).
pub fn not_ours(pod: &Pod) -> Option<String> {
    let daemonset = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|owner| owner.kind == "DaemonSet");
    if daemonset {
        return Some("DaemonSet pods are not run on RunPod".into());
    }
    if runpod_webhook::policy::gpu_count(pod) == 0 {
        return Some(format!(
            "the pod requests no {}: only GPU pods are run on RunPod",
            contract::GPU_RESOURCE
        ));
    }
    None
}

/// The tolerations with `not-ready`/`unreachable` NoExecute lengthened to `grace`, or `None`
/// when they already are: burst pods must outlive a controller outage, which the node
/// lifecycle controller would otherwise punish by evicting them after 300 s.
pub fn outage_tolerations(current: &[Toleration], grace: Duration) -> Option<Vec<Toleration>> {
    let seconds = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
    let mut next = current.to_vec();
    let mut changed = false;
    for key in OUTAGE_TAINTS {
        let existing = next.iter_mut().find(|t| {
            t.key.as_deref() == Some(key)
                && t.effect.as_deref().is_none_or(|e| e == "NoExecute")
                && t.operator.as_deref().is_none_or(|o| o == "Exists")
        });
        match existing {
            Some(toleration) => match toleration.toleration_seconds {
                // Unbounded already: leave it.
                None => {}
                Some(current) if current >= seconds => {}
                Some(_) => {
                    toleration.toleration_seconds = Some(seconds);
                    changed = true;
                }
            },
            None => {
                next.push(Toleration {
                    key: Some(key.to_owned()),
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(seconds),
                    value: None,
                });
                changed = true;
            }
        }
    }
    changed.then_some(next)
}

/// `8080/http=https://…,22/tcp=IP:PORT` for the ports that are published.
pub fn endpoints_annotation(instance: &Instance) -> String {
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
pub fn instance_annotations(instance: &Instance) -> Vec<(&'static str, Option<String>)> {
    vec![
        (POD_ID, Some(instance.id.clone())),
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

/// The oldest instance is the one kept; the others are duplicates.
pub fn split_duplicates<'a>(
    mut instances: Vec<&'a Instance>,
    preferred: Option<&str>,
) -> (Option<&'a Instance>, Vec<&'a Instance>) {
    instances.sort_by_key(|i| {
        (
            Some(i.id.as_str()) != preferred,
            i.created_at.is_none(),
            i.created_at,
            i.id.clone(),
        )
    });
    let mut iter = instances.into_iter();
    let first = iter.next();
    (first, iter.collect())
}

/// The pods API of `pod`'s namespace, for writing to it.
fn pods_in_namespace_of(client: &kube::Client, pod: &Pod) -> Api<Pod> {
    Api::namespaced(
        client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// When the pod was bound to the node (its clock for the provisioning timeout).
fn bound_at(pod: &Pod) -> Option<Timestamp> {
    let scheduled = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            c.iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    scheduled.or_else(|| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Reconciles one pod.
#[instrument(skip_all, fields(pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or(""), pod.metadata.name.as_deref().unwrap_or(""))))]
pub async fn reconcile<P: Provider>(
    pod: Arc<Pod>,
    ctx: Arc<Shared<P>>,
) -> Result<Action, ReconcileError> {
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
    let terminated = ctx.remember(&uid, |m| m.terminated.clone());
    let live: Vec<&Instance> = snapshot
        .for_pod(&uid)
        .filter(|i| !terminated.contains(&i.id))
        .collect();

    if pod.metadata.deletion_timestamp.is_some() {
        return delete(&pod, &uid, &live, &ctx).await;
    }
    if status::is_terminal(&pod) {
        for instance in &live {
            terminate(&ctx, &pod, &uid, instance, "the pod has finished").await?;
        }
        if live.is_empty() {
            // Only the kept log outlives the instance, for `kubectl logs` of a finished pod.
            ctx.remember(&uid, |m| {
                *m = PodMemory {
                    final_log: m.final_log.take(),
                    terminated: std::mem::take(&mut m.terminated),
                    ..PodMemory::default()
                }
            });
            return Ok(Action::await_change());
        }
        return Ok(Action::requeue(SHORT));
    }
    if let Some(reason) = not_ours(&pod) {
        ctx.event(&pod, true, "NotRunOnRunPod", reason).await;
        return Ok(Action::await_change());
    }

    let remembered = ctx.remember(&uid, |m| m.instance.clone());
    let (primary, duplicates) =
        split_duplicates(live.clone(), remembered.as_ref().map(|(id, _)| id.as_str()));
    for duplicate in duplicates {
        ctx.event(
            &pod,
            true,
            "DuplicateTerminated",
            format!(
                "RunPod pod {} is a second pod for this Kubernetes pod; terminating it",
                duplicate.id
            ),
        )
        .await;
        terminate(&ctx, &pod, &uid, duplicate, "duplicate").await?;
    }
    match primary {
        Some(instance) => track(&pod, &uid, instance, &snapshot, &ctx).await,
        None => match remembered {
            Some((id, created)) if !terminated.contains(&id) => {
                // Created by us but not in this list. Young: the list lags. Old: it is gone.
                let listed_after = snapshot
                    .confirmed_at
                    .map_or(Duration::ZERO, |confirmed| elapsed(created, confirmed));
                if listed_after < settings.create_settle {
                    return Ok(Action::requeue(SHORT));
                }
                vanished(&pod, &uid, &id, &ctx).await
            }
            _ => {
                if let Some(record) = RecordedEnd::on(&pod) {
                    // Ended and terminated by a controller that died before writing the phase.
                    write_status(&ctx, &pod, &record.view()).await?;
                    return Ok(Action::await_change());
                }
                let was_running =
                    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                let started = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.start_time.as_ref())
                    .map(|t| t.0);
                match started {
                    Some(started)
                        if was_running
                            && snapshot.confirmed_at.is_some_and(|confirmed| {
                                elapsed(started, confirmed) > settings.create_settle
                            }) =>
                    {
                        let id = annotation(&pod, POD_ID).unwrap_or("unknown").to_owned();
                        vanished(&pod, &uid, &id, &ctx).await
                    }
                    _ => create(&pod, &uid, &snapshot, &ctx).await,
                }
            }
        },
    }
}

/// The pod's instance disappeared from a complete list while the pod was running: it was
/// terminated outside the controller. The pod fails; it is never created again.
async fn vanished<P: Provider>(
    pod: &Pod,
    uid: &str,
    id: &str,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let message = format!("RunPod pod {id} no longer exists (terminated outside runpod-kubelet)");
    ctx.event(pod, true, "RunPodPodGone", message.clone()).await;
    write_status(
        ctx,
        pod,
        &View::Failed {
            reason: "RunPodPodGone",
            message,
        },
    )
    .await?;
    ctx.remember(uid, |m| m.instance = None);
    Ok(Action::await_change())
}

/// Creates the pod's instance, once.
async fn create<P: Provider>(
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let settings = &ctx.settings;
    let now = Timestamp::now();
    let (nothing_created, next_at, excluded, marked_at) = ctx.remember(uid, |m| {
        (
            m.nothing_created,
            m.next_create_at,
            m.excluded_gpu_types.clone(),
            m.create_marked_at,
        )
    });
    // A create was sent (maybe by a previous leader) and its outcome is unknown here: only
    // two complete lists in a row, both taken long enough after it, may show that nothing
    // exists. The marker is the later of the pod's and this leader's own record (the pod
    // cache may lag behind a marker just written).
    let marker = annotation(pod, CREATE_REQUESTED)
        .map(|m| m.parse::<Timestamp>().unwrap_or(Timestamp::UNIX_EPOCH))
        .into_iter()
        .chain(marked_at)
        .max()
        .filter(|_| !nothing_created);
    let absence_unsettled = marker.is_some_and(|marker| {
        let settled_by = marker
            .checked_add(SignedDuration::try_from(settings.create_settle).unwrap_or_default())
            .unwrap_or(marker);
        snapshot
            .confirmed_at
            .is_none_or(|confirmed| confirmed < settled_by)
    });
    let unavailable = matches!(*ctx.health.borrow(), ApiHealth::Unavailable { .. });
    // The timeout waits for the lists to settle (an instance may be starting), unless RunPod
    // is down: then it still applies, and an instance that shows up later is terminated.
    if let Some(bound) = bound_at(pod)
        && elapsed(bound, now) > settings.provision_timeout
        && (!absence_unsettled || unavailable)
    {
        let message = format!(
            "no RunPod pod could be started within {}",
            humantime::format_duration(settings.provision_timeout)
        );
        ctx.event(pod, true, "ProvisioningTimeout", message.clone())
            .await;
        write_status(
            ctx,
            pod,
            &View::Failed {
                reason: "ProvisioningTimeout",
                message,
            },
        )
        .await?;
        return Ok(Action::requeue(SHORT));
    }
    if let Some(next_at) = next_at
        && next_at > now
    {
        return Ok(Action::requeue(elapsed(now, next_at).max(SHORT)));
    }
    if unavailable {
        // The account is refused or the API is down: wait, without a create per pod.
        write_waiting(ctx, pod, "RunPodUnavailable", "waiting for the RunPod API").await?;
        return Ok(Action::requeue(settings.reconcile_interval));
    }
    if absence_unsettled {
        return Ok(Action::requeue(SHORT));
    }

    let pods = pods_in_namespace_of(&ctx.client, pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    // Outage tolerations first: the node must never be tainted before they are in place.
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    if let Some(longer) = outage_tolerations(&tolerations, settings.outage_grace) {
        let patch = json!({"spec": {"tolerations": longer}});
        pods.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return Ok(Action::await_change());
    };
    let resolved = match env::resolve(&ClusterEnvSource(ctx.client.clone()), pod, container).await {
        Ok(resolved) => resolved,
        Err(error) => {
            ctx.event(pod, true, "CreateContainerConfigError", error.to_string())
                .await;
            write_waiting(ctx, pod, "CreateContainerConfigError", &error.to_string()).await?;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    };
    let volumes =
        match volumes::resolve(&ClusterEnvSource(ctx.client.clone()), pod, container).await {
            Ok(volumes) => volumes,
            Err(error) => {
                ctx.event(pod, true, "CreateContainerConfigError", error.to_string())
                    .await;
                write_waiting(ctx, pod, "CreateContainerConfigError", &error.to_string()).await?;
                return Ok(Action::requeue(Duration::from_secs(10)));
            }
        };
    if !volumes.skipped.is_empty() {
        ctx.event(
            pod,
            false,
            "ServiceAccountTokenNotMounted",
            format!(
                "{} is not mounted on RunPod: RunPod pods cannot reach the cluster's apiserver, \
                 and a cluster credential is not shipped to the cloud",
                volumes.skipped.join(", ")
            ),
        )
        .await;
    }

    // Record the attempt before sending it: a leader that dies after the create sees this
    // and searches instead of creating a second pod.
    mark_create_requested(ctx, uid, &pods, &name).await?;
    ctx.remember(uid, |m| m.nothing_created = false);
    write_waiting(ctx, pod, "ContainerCreating", "creating the RunPod pod").await?;

    let request = ProvisionRequest {
        pod,
        env: &resolved,
        volumes: &volumes,
        excluded_gpu_types: &excluded,
    };
    ctx.metrics.creates.inc();
    match provision_marked(ctx, &pods, &name, request).await {
        Ok(provisioned) => {
            let instance = provisioned.instance;
            info!(instance = %instance.id, summary = %provisioned.summary, "RunPod pod for the pod");
            ctx.remember(uid, |m| {
                m.instance = Some((instance.id.clone(), Timestamp::now()));
                m.create_failures = 0;
                m.next_create_at = None;
            });
            if !provisioned.refusals.is_empty() {
                ctx.event(
                    pod,
                    false,
                    "CapacityRetries",
                    format!(
                        "refused before success: {}",
                        provisioned.refusals.join("; ")
                    ),
                )
                .await;
            }
            ctx.event(
                pod,
                false,
                "RunPodPodCreated",
                format!("RunPod pod {}: {}", instance.id, provisioned.summary),
            )
            .await;
            if provisioned.possibly_duplicated {
                // Every later list is checked for a second pod with this UID tag, which the
                // duplicate handling above terminates at once.
                ctx.event(
                    pod,
                    true,
                    "PossibleDuplicate",
                    "an earlier create may also have made a RunPod pod; it will be terminated as soon as RunPod lists it".into(),
                )
                .await;
            }
            for duplicate in &provisioned.duplicates {
                terminate(ctx, pod, uid, duplicate, "duplicate").await?;
            }
            write_annotations(ctx, pod, &instance).await?;
            Ok(Action::requeue(settings.reconcile_interval))
        }
        Err(error) => {
            let failures = ctx.remember(uid, |m| {
                m.create_failures += 1;
                m.create_failures
            });
            let backoff = Duration::from_secs(10u64.saturating_mul(1 << failures.min(5)).min(300));
            match &error {
                ProvisionError::NoCandidates(message) | ProvisionError::NoCapacity(message) => {
                    ctx.remember(uid, |m| {
                        m.nothing_created = true;
                        m.next_create_at = Timestamp::now()
                            .checked_add(SignedDuration::try_from(backoff).unwrap_or_default())
                            .ok();
                    });
                    ctx.event(pod, true, "NoGpuCapacity", message.clone()).await;
                    write_waiting(ctx, pod, "NoGpuCapacity", message).await?;
                    // Back at the provisioning deadline at the latest, to fail the pod on time.
                    let until_deadline = bound_at(pod).map_or(backoff, |bound| {
                        settings
                            .provision_timeout
                            .saturating_sub(elapsed(bound, Timestamp::now()))
                            + Duration::from_secs(1)
                    });
                    Ok(Action::requeue(backoff.min(until_deadline)))
                }
                ProvisionError::Rejected(message) => {
                    ctx.remember(uid, |m| m.nothing_created = true);
                    ctx.event(pod, true, "RunPodRejected", message.clone())
                        .await;
                    write_status(
                        ctx,
                        pod,
                        &View::Failed {
                            reason: "RunPodRejected",
                            message: message.clone(),
                        },
                    )
                    .await?;
                    Ok(Action::await_change())
                }
                ProvisionError::AccountBlocked(message) => {
                    ctx.remember(uid, |m| m.nothing_created = true);
                    ctx.health.send_replace(ApiHealth::Unavailable {
                        reason: "AccountRefused".into(),
                        message: message.clone(),
                    });
                    ctx.event(pod, true, "RunPodAccountRefused", message.clone())
                        .await;
                    Ok(Action::requeue(settings.reconcile_interval))
                }
                ProvisionError::Unsettled(message) => {
                    ctx.event(
                        pod,
                        true,
                        "CreateUnsettled",
                        format!("{message}; looking for the pod before any new create"),
                    )
                    .await;
                    Ok(Action::requeue(settings.create_settle))
                }
            }
        }
    }
}

/// Writes `runpod.io/create-requested` with the current time, remembering it first: the next
/// reconcile may see a pod cache that does not show the marker yet.
async fn mark_create_requested<P>(
    ctx: &Shared<P>,
    uid: &str,
    pods: &Api<Pod>,
    name: &str,
) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    ctx.remember(uid, |m| m.create_marked_at = Some(now));
    let patch = json!({"metadata": {"annotations": {CREATE_REQUESTED: now.to_string()}}});
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// How often the create marker is moved on while a provision is in flight.
pub fn marker_refresh(create_settle: Duration) -> Duration {
    (create_settle / 4).max(Duration::from_millis(250))
}

/// Provisions while keeping the create marker fresh. A provision can send its creates long
/// after the marker was written (the rate limiter holds them, 429s and 5xx are retried, the
/// catalogue is slow): a successor that waited only `--create-settle` after an old marker could
/// then miss a pod sent just before this process died, and create a second one. So the marker
/// is rewritten every quarter of the settle time: every create is sent at most that long after
/// the last marker, and the list a successor waits for (taken `--create-settle` after it)
/// shows it. If the marker cannot be written, the provision is abandoned (nothing more is sent)
/// and its outcome is treated as unknown.
async fn provision_marked<P: Provider>(
    ctx: &Shared<P>,
    pods: &Api<Pod>,
    name: &str,
    request: ProvisionRequest<'_>,
) -> Result<super::provider::Provisioned, ProvisionError> {
    let every = marker_refresh(ctx.settings.create_settle);
    let uid = request.pod.metadata.uid.clone().unwrap_or_default();
    let provision = ctx.provider.provision(request);
    tokio::pin!(provision);
    let mut next = tokio::time::Instant::now() + every;
    loop {
        tokio::select! {
            outcome = &mut provision => return outcome,
            () = tokio::time::sleep_until(next) => {
                if let Err(error) = mark_create_requested(ctx, &uid, pods, name).await {
                    warn!(error = %error, "cannot move the create marker on; abandoning the create");
                    return Err(ProvisionError::Unsettled(format!(
                        "the create was abandoned (its marker could not be written: {error})"
                    )));
                }
                next = tokio::time::Instant::now() + every;
            }
        }
    }
}

/// Tracks an existing instance: annotations, placement check, status, completion.
async fn track<P: Provider>(
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    // Ended already (recorded by a controller that died before the terminate went through):
    // finish the same way, whatever the instance does meanwhile (RunPod may have restarted it).
    if let Some(record) = RecordedEnd::on(pod) {
        return finish(ctx, pod, uid, instance, record.view()).await;
    }
    let settings = &ctx.settings;
    ctx.remember(uid, |m| {
        if m.instance.as_ref().map(|(id, _)| id) != Some(&instance.id) {
            m.instance = Some((
                instance.id.clone(),
                instance.created_at.unwrap_or(snapshot.taken_at),
            ));
        }
    });
    // Placement is verified: RunPod treats datacenters as a preference only.
    let verified = ctx.remember(uid, |m| m.verified.contains(&instance.id));
    if !verified {
        match ctx.provider.constraints(pod) {
            Ok(constraints) => {
                match constraints.violation(instance) {
                    Some(violation) => {
                        ctx.event(
                        pod,
                        true,
                        "PlacementRejected",
                        format!("RunPod pod {} {violation}; terminating it and trying the next offer", instance.id),
                    )
                    .await;
                        terminate(ctx, pod, uid, instance, "placement outside the constraints")
                            .await?;
                        ctx.remember(uid, |m| {
                            if let Some(gpu) = &instance.gpu_type {
                                m.excluded_gpu_types.push(gpu.clone());
                            }
                            m.instance = None;
                            m.nothing_created = true;
                        });
                        return Ok(Action::requeue(SHORT));
                    }
                    None if instance.datacenter.is_some() && instance.cost_per_hour.is_some() => {
                        ctx.remember(uid, |m| m.verified.insert(instance.id.clone()));
                    }
                    None => {}
                }
            }
            Err(message) => warn!(%message, "cannot check the placement"),
        }
    }
    write_annotations(ctx, pod, instance).await?;

    let restart_policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
        .to_owned();
    // A container restart shows as uptime going back.
    let restarted = ctx.remember(uid, |m| {
        let previous = instance.uptime_secs.and_then(|now| {
            let before = m.uptime.insert(instance.id.clone(), now)?;
            Some(now < before)
        });
        if previous == Some(true) {
            m.restarts += 1;
        }
        previous == Some(true)
    });
    let restarts = ctx.remember(uid, |m| m.restarts);

    if let Some(deadline) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds)
        && let Some(start) = pod.status.as_ref().and_then(|s| s.start_time.as_ref())
        && elapsed(start.0, Timestamp::now()) > Duration::from_secs(deadline.max(0) as u64)
    {
        let message =
            format!("Pod was active on the node longer than the specified deadline ({deadline} s)");
        return finish(
            ctx,
            pod,
            uid,
            instance,
            View::Failed {
                reason: "DeadlineExceeded",
                message,
            },
        )
        .await;
    }

    match instance.state {
        InstanceState::Exited => {
            let code = exit_code(ctx, uid, instance).await?;
            let (reason, message) = ended_reason(code);
            let view = View::Ended {
                exit_code: code,
                reason,
                message,
                started_at: instance.started_at,
                restarts,
            };
            finish(ctx, pod, uid, instance, view).await
        }
        InstanceState::Error => {
            let message = instance.message.clone().unwrap_or_else(|| {
                format!(
                    "RunPod pod {} is in ERROR (e.g. the image could not be pulled)",
                    instance.id
                )
            });
            finish(
                ctx,
                pod,
                uid,
                instance,
                View::Failed {
                    reason: "RunPodError",
                    message,
                },
            )
            .await
        }
        InstanceState::Running if restarted && restart_policy != "Always" => {
            // The container ended and RunPod restarted it: the wrapper could not stop the pod,
            // or there was no command to wrap. Count it as an exit.
            let code = exit_code(ctx, uid, instance).await?;
            let (reason, message) = ended_reason(code);
            let view = View::Ended {
                exit_code: code,
                reason,
                message: format!("{message} (the container restarted on RunPod)"),
                started_at: instance.started_at,
                restarts,
            };
            finish(ctx, pod, uid, instance, view).await
        }
        _ => {
            write_status(ctx, pod, &View::Instance { instance, restarts }).await?;
            Ok(Action::requeue(settings.reconcile_interval))
        }
    }
}

fn ended_reason(code: Option<i32>) -> (&'static str, String) {
    match code {
        Some(0) => ("Completed", "the command exited with code 0".to_owned()),
        Some(code) => ("Error", format!("the command exited with code {code}")),
        None => (
            "ExitCodeUnknown",
            "the container ended without reporting an exit code".to_owned(),
        ),
    }
}

async fn exit_code<P: Provider>(
    ctx: &Shared<P>,
    uid: &str,
    instance: &Instance,
) -> Result<Option<i32>, ReconcileError> {
    if let Some(code) = ctx.remember(uid, |m| m.exit_code) {
        return Ok(code);
    }
    let log = ctx.provider.final_log(&instance.id).await?;
    let code = log.exit_code;
    ctx.remember(uid, |m| {
        m.exit_code = Some(code);
        m.final_log = Some(std::sync::Arc::new(log.lines));
    });
    Ok(code)
}

/// Ends a pod: terminate the instance, confirm, and only then write the terminal phase (a
/// terminal pod can be removed by anyone at once, taking the record of the instance with it).
async fn finish<P: Provider>(
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
        pods_in_namespace_of(&ctx.client, pod)
            .patch(
                pod.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        ctx.metrics.pod_writes.inc();
    }
    terminate(ctx, pod, uid, instance, "the pod finished").await?;
    write_status(ctx, pod, &view).await?;
    Ok(Action::await_change())
}

/// Deletion: stop first (the container gets its signal), terminate once stopped or once the
/// grace period passed, then remove the pod object (UID precondition).
async fn delete<P: Provider>(
    pod: &Pod,
    uid: &str,
    live: &[&Instance],
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let grace = Duration::from_secs(
        pod.metadata
            .deletion_grace_period_seconds
            .unwrap_or(30)
            .max(0) as u64,
    );
    let now = Timestamp::now();
    let remembered = ctx.remember(uid, |m| m.instance.clone());
    let mut pending = false;
    for instance in live {
        let stopped = matches!(instance.state, InstanceState::Exited | InstanceState::Error);
        let running = matches!(instance.state, InstanceState::Running);
        let stop_sent = ctx.remember(uid, |m| m.stop_sent.get(&instance.id).copied());
        let grace_over = stop_sent.is_some_and(|at| elapsed(at, now) >= grace) || grace.is_zero();
        if stopped || grace_over || !running {
            terminate(ctx, pod, uid, instance, "the pod was deleted").await?;
        } else if stop_sent.is_none() {
            ctx.provider.stop(&instance.id).await?;
            ctx.remember(uid, |m| m.stop_sent.insert(instance.id.clone(), now));
            pending = true;
        } else {
            pending = true;
        }
    }
    // Created by us but not listed yet: terminate by id.
    if let Some((id, _)) = remembered
        && !live.iter().any(|i| i.id == id)
        && !ctx.remember(uid, |m| m.terminated.contains(&id))
    {
        ctx.provider.terminate(&id).await?;
        ctx.remember(uid, |m| m.terminated.insert(id.clone()));
        ctx.metrics.terminations.inc();
    }
    if pending {
        return Ok(Action::requeue(SHORT));
    }
    let pods = pods_in_namespace_of(&ctx.client, pod);
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
    ctx.forget(uid);
    Ok(Action::await_change())
}

async fn terminate<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    why: &str,
) -> Result<(), ReconcileError> {
    if ctx.remember(uid, |m| m.terminated.contains(&instance.id)) {
        return Ok(());
    }
    ctx.provider.terminate(&instance.id).await?;
    ctx.metrics.terminations.inc();
    ctx.remember(uid, |m| m.terminated.insert(instance.id.clone()));
    ctx.event(
        pod,
        false,
        "RunPodPodTerminated",
        format!("RunPod pod {} terminated: {why}", instance.id),
    )
    .await;
    Ok(())
}

async fn write_waiting<P>(
    ctx: &Shared<P>,
    pod: &Pod,
    reason: &str,
    message: &str,
) -> Result<(), ReconcileError> {
    write_status(
        ctx,
        pod,
        &View::Waiting {
            reason,
            message: message.to_owned(),
        },
    )
    .await
}

/// Writes the status only when it changes anything.
async fn write_status<P>(
    ctx: &Shared<P>,
    pod: &Pod,
    view: &View<'_>,
) -> Result<(), ReconcileError> {
    let desired = status::desired(pod, view, &ctx.settings.host_ip, Timestamp::now());
    let changed = status::changes(pod, &desired);
    if changed.is_empty() {
        return Ok(());
    }
    debug!(?changed, "writing the pod status");
    let pods = pods_in_namespace_of(&ctx.client, pod);
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
async fn write_annotations<P>(
    ctx: &Shared<P>,
    pod: &Pod,
    instance: &Instance,
) -> Result<(), ReconcileError> {
    let mut patch = serde_json::Map::new();
    for (key, value) in instance_annotations(instance) {
        if annotation(pod, key) != value.as_deref() {
            patch.insert(
                key.to_owned(),
                value.map_or(serde_json::Value::Null, serde_json::Value::String),
            );
        }
    }
    if patch.is_empty() {
        return Ok(());
    }
    debug!(changed = ?patch.keys().collect::<Vec<_>>(), "writing the instance annotations");
    let pods = pods_in_namespace_of(&ctx.client, pod);
    ctx.metrics.pod_writes.inc();
    pods.patch(
        pod.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": patch}})),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::provider::{Endpoint, Tags};

    fn toleration(key: &str, seconds: Option<i64>) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            toleration_seconds: seconds,
            value: None,
        }
    }

    #[test]
    fn default_outage_tolerations_are_lengthened_once() {
        let hour = Duration::from_secs(3600);
        let defaults = vec![
            toleration("node.kubernetes.io/not-ready", Some(300)),
            toleration("node.kubernetes.io/unreachable", Some(300)),
        ];
        let longer = outage_tolerations(&defaults, hour).unwrap();
        assert!(longer.iter().all(|t| t.toleration_seconds == Some(3600)));
        assert_eq!(longer.len(), 2);
        assert_eq!(outage_tolerations(&longer, hour), None);
        // Missing ones are added; unbounded ones are left alone.
        let added =
            outage_tolerations(&[toleration("node.kubernetes.io/not-ready", None)], hour).unwrap();
        assert_eq!(added.len(), 2);
        assert_eq!(added[0].toleration_seconds, None);
        assert_eq!(added[1].toleration_seconds, Some(3600));
    }

    #[test]
    fn the_create_marker_moves_on_four_times_per_settle_window() {
        // A create is sent at most this long after the last marker; the list a successor
        // waits for is taken a whole settle window after it, leaving 3/4 for the list lag.
        assert_eq!(
            marker_refresh(Duration::from_secs(30)),
            Duration::from_millis(7500)
        );
        assert_eq!(
            marker_refresh(Duration::from_millis(400)),
            Duration::from_millis(250)
        );
    }

    fn instance(id: &str, created: &str) -> Instance {
        Instance {
            id: id.into(),
            name: "n".into(),
            tags: Tags::default(),
            state: InstanceState::Running,
            uptime_secs: None,
            cost_per_hour: Some(0.44),
            gpu_type: Some("RTX".into()),
            datacenter: Some("EU-RO-1".into()),
            endpoints: vec![
                Endpoint {
                    port: 8888,
                    protocol: "http".into(),
                    address: Some("https://x-8888.proxy.runpod.net".into()),
                },
                Endpoint {
                    port: 22,
                    protocol: "tcp".into(),
                    address: None,
                },
            ],
            ip: None,
            created_at: Some(created.parse().unwrap()),
            started_at: None,
            message: None,
        }
    }

    #[test]
    fn the_oldest_instance_is_kept_unless_one_is_known() {
        let old = instance("old", "2026-01-01T00:00:00Z");
        let new = instance("new", "2026-01-01T00:00:05Z");
        let (keep, extra) = split_duplicates(vec![&new, &old], None);
        assert_eq!(keep.unwrap().id, "old");
        assert_eq!(extra[0].id, "new");
        let (keep, _) = split_duplicates(vec![&new, &old], Some("new"));
        assert_eq!(keep.unwrap().id, "new");
    }

    #[test]
    fn annotations_describe_the_instance() {
        let i = instance("abc", "2026-01-01T00:00:00Z");
        let map: std::collections::BTreeMap<_, _> = instance_annotations(&i).into_iter().collect();
        assert_eq!(map[POD_ID].as_deref(), Some("abc"));
        assert_eq!(map[COST_PER_HR].as_deref(), Some("0.440"));
        assert_eq!(
            map[ENDPOINTS].as_deref(),
            Some("8888/http=https://x-8888.proxy.runpod.net")
        );
    }

    #[test]
    fn cpu_and_daemonset_pods_are_not_ours() {
        let gpu: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
        }))
        .unwrap();
        assert_eq!(not_ours(&gpu), None);
        let cpu: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}
        }))
        .unwrap();
        assert!(not_ours(&cpu).is_some());
        let mut ds = gpu.clone();
        ds.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                kind: "DaemonSet".into(),
                name: "d".into(),
                api_version: "apps/v1".into(),
                uid: "x".into(),
                ..Default::default()
            },
        ]);
        assert!(not_ours(&ds).is_some());
    }
}
