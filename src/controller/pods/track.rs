//! Following an existing instance: its placement is verified, its annotations and status
//! written, and its end (exit, error, a start that never came, a deadline) carried out. An
//! instance missing from the lists is confirmed by id before the pod is failed for it.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use tracing::{info, warn};

use super::decide::{self, Note, TrackStep};
use super::{ReconcileError, SHORT, finish, write};
use crate::controller::clock::elapsed;
use crate::controller::context::{Settings, Shared, Snapshot};
use crate::controller::pods::status::{RecordedEnd, View};
use crate::provider::{CloudName, Instance, InstanceState, Provider};
use log_reads::{ExitCode, LOG_READ_ATTEMPTS, exit_code, read_init_progress};

mod log_reads;

/// An instance that was there is missing from lists that had time to show it: RunPod is asked
/// for it by id (at most once per settle time); only a 404 (or a terminated answer, or one
/// that is not this pod's) means it is gone. Found, it is tracked from that answer.
pub(super) async fn confirm<P: Provider>(
    pod: &Pod,
    uid: &str,
    id: Option<String>,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let Some(id) = id else {
        return vanished(pod, uid, "(unknown)", ctx).await;
    };
    match looked_up(ctx, uid, &id).await? {
        Some(instance) if is_for(&instance, uid, &ctx.settings) => {
            info!(instance = %id, cloud = ctx.provider.name(), "missing from the cloud's list but still there");
            ctx.remember(uid, |m| {
                m.looked_up = Some(Box::new((Timestamp::now(), instance.clone())));
            });
            track(pod, uid, &instance, snapshot, ctx).await
        }
        // This pod's instance, but tagged for another cluster id or node name (a flag
        // changed): it bills, and a second one must not be made; the operator decides.
        Some(instance) if instance.tags.pod_uid.as_deref() == Some(uid) => {
            let note = Note::warning(
                "RunPodPodMistagged",
                format!(
                    "{} {id} of this pod is tagged with cluster {} and node {}, not this \
                     controller's ({} and {}): was --cluster-id or --nodename changed? Nothing \
                     new is created while it exists",
                    ctx.provider.instance_noun(),
                    instance.tags.cluster_id.as_deref().unwrap_or("-"),
                    instance.tags.node_name.as_deref().unwrap_or("-"),
                    ctx.settings.cluster_id,
                    ctx.settings.node_name
                ),
            );
            held(ctx, pod, uid, None, note).await
        }
        // No tag of ours, and the cloud says it was made with another image or env than the
        // pod's: nothing about it is disclosed (the id is the user's to write), yet nothing new
        // is created either while the annotation names it (should it be the pod's after all,
        // a second instance would bill twice).
        Some(instance) if instance.tags.none() && !made_for_pod(pod, &id, ctx).await? => {
            let note = Note::warning(
                "PodIdUnverified",
                format!(
                    "this pod's {} names an instance runpod-kubelet cannot take as this pod's; \
                     nothing new is created while it does: remove the annotation to get a new \
                     instance (or, moving from the Go kubelet, see `runpod-kubelet adopt` in \
                     docs/migrating.md)",
                    ctx.provider.id_annotation()
                ),
            );
            held(ctx, pod, uid, Some(instance), note).await
        }
        // No tag of ours: most likely the Go kubelet made it for this pod (a migration). It
        // bills; a second instance would bill twice. Only `runpod-kubelet adopt`, an operator's
        // act, takes it over: the controller never trusts an id it did not write.
        Some(instance) if instance.tags.none() => {
            let note = Note::warning(
                "AdoptionNeeded",
                format!(
                    "{} {id} named by this pod's {} carries no runpod-kubelet tags (made by the \
                     Go kubelet?); nothing new is created while it exists. Take it over with \
                     `runpod-kubelet adopt` (see docs/migrating.md), or \
                     terminate it and remove the annotation",
                    ctx.provider.instance_noun(),
                    ctx.provider.id_annotation()
                ),
            );
            held(ctx, pod, uid, Some(instance), note).await
        }
        // Gone, or not this pod's at all (the id may come from an annotation a user can edit):
        // another pod's instance is never tracked, let alone terminated.
        _ if pod_ran(pod) => vanished(pod, uid, &id, ctx).await,
        _ => {
            // Never ran: its instance went away before starting (terminated by an earlier
            // leader, say); the create gate decides whether a new one may be made.
            ctx.remember(uid, |m| {
                m.terminated.insert(id.clone());
            });
            Ok(Action::requeue(SHORT))
        }
    }
}

/// The instance `id` as the cloud last answered for it: this leader's answer from less than a
/// settle time ago, else the cloud's own by id (live instances only), tagged if adopted.
async fn looked_up<P: Provider>(
    ctx: &Shared<P>,
    uid: &str,
    id: &str,
) -> Result<Option<Instance>, ReconcileError> {
    let recent = ctx.remember(uid, |m| m.looked_up.clone());
    if let Some((at, instance)) = recent.map(|boxed| *boxed)
        && instance.id == id
        && elapsed(at, Timestamp::now()) < ctx.settings.create_settle
    {
        return Ok(Some(instance));
    }
    Ok(ctx
        .provider
        .lookup(id)
        .await?
        .filter(|i| i.state.is_live())
        .map(|mut instance| {
            if let Ok(adopted) = ctx.adopted.lock() {
                crate::controller::adoption::tag(&mut instance, &adopted, ctx.settings.owner());
            }
            instance
        }))
}

/// Nothing new is created for the pod while an instance it names is not known to be its own:
/// the Event says why; the instance (when given) is kept as the answer for a settle time, so
/// the cloud is asked once per settle time, not at every reconcile.
async fn held<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    instance: Option<Instance>,
    note: Note,
) -> Result<Action, ReconcileError> {
    if let Some(instance) = instance {
        ctx.remember(uid, |m| {
            m.looked_up = Some(Box::new((Timestamp::now(), instance)));
        });
    }
    write::notes(ctx, pod, vec![note]).await;
    Ok(Action::requeue(ctx.settings.reconcile_interval))
}

/// Whether the untagged instance `id` may have been made for `pod`: the cloud's word on its
/// image and env matches the pod's, or the cloud does not say (then, money first, it is taken
/// as the pod's and nothing new is created).
async fn made_for_pod<P: Provider>(
    pod: &Pod,
    id: &str,
    ctx: &Shared<P>,
) -> Result<bool, ReconcileError> {
    Ok(match ctx.provider.origin(id).await? {
        Some(origin) => crate::controller::adoption::made_for(pod, &origin).is_ok(),
        None => true,
    })
}

fn pod_ran(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Whether `instance` carries the tags of this cluster, node and pod.
fn is_for(instance: &Instance, uid: &str, settings: &Settings) -> bool {
    instance.tags.pod_uid.as_deref() == Some(uid)
        && instance.tags.cluster_id.as_deref() == Some(settings.cluster_id.as_str())
        && instance.tags.node_name.as_deref() == Some(settings.node_name.as_str())
}

/// The pod's instance is gone (the cloud answered 404 for its id) while the pod was not
/// finished: replaced or failed as [`decide::vanished`] says.
async fn vanished<P: Provider>(
    pod: &Pod,
    uid: &str,
    id: &str,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let decided = decide::vanished(pod, id, ctx.provider.cloud());
    let action = write::apply(ctx, pod, decided.outcome).await?;
    if decided.replace {
        ctx.remember(uid, |m| {
            m.terminated.insert(id.to_owned());
            m.instance = None;
            m.looked_up = None;
            m.nothing_created = true;
            m.restarts += 1;
            m.replacing_since = Some(Timestamp::now());
        });
    } else {
        ctx.remember(uid, |m| m.instance = None);
    }
    Ok(action)
}

/// The cloud took the pod's instance away: its machine is avoided for a while, the instance
/// is destroyed (a stopped instance may still bill storage), and the pod fails with
/// `DisruptionTarget` or, `restartPolicy: Always`, gets a new instance.
async fn disrupted<P: Provider>(
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    disruption: crate::provider::Disruption,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let now = Timestamp::now();
    let lost = decide::lost(pod, instance, disruption, ctx.provider.cloud(), now);
    if let Some(machine) = instance.machine.as_deref() {
        ctx.lost_machines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .lost(
                &crate::controller::memory::lost_machine_keys(pod),
                machine,
                now,
            );
    }
    write::notes(ctx, pod, vec![lost.note]).await;
    if !lost.replace {
        let view = View::Failed {
            reason: lost.reason,
            message: lost.message,
        };
        return finish::finish(ctx, pod, uid, instance, view).await;
    }
    finish::terminate(ctx, pod, uid, instance, "the cloud took it away").await?;
    ctx.remember(uid, |m| {
        m.instance = None;
        m.looked_up = None;
        m.nothing_created = true;
        m.restarts += 1;
        m.replacing_since = Some(now);
    });
    Ok(Action::requeue(SHORT))
}

/// Tracks an existing instance: annotations, placement check, status, completion.
pub(super) async fn track<P: Provider>(
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    // Ended already (recorded by a controller that died before the terminate went through):
    // finish the same way, whatever the instance does meanwhile (RunPod may have restarted it).
    if let Some(record) = RecordedEnd::on(pod) {
        return finish::finish(ctx, pod, uid, instance, record.view()).await;
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
    if let Some(action) = verify_placement(pod, uid, instance, ctx).await? {
        return Ok(action);
    }
    write::annotations(ctx, pod, instance).await?;

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
    if restarted {
        crate::controller::shell::forget_host_keys(ctx, pod, &instance.id).await;
    }
    let restarts = ctx.remember(uid, |m| m.restarts);

    let replacing_since = ctx.remember(uid, |m| {
        if instance.state == InstanceState::Running {
            m.replacing_since = None;
        }
        m.replacing_since
    });
    match decide::track_step(
        pod,
        instance,
        restarted,
        decide::provisioning_clock(pod, replacing_since),
        settings.provision_timeout,
        Timestamp::now(),
        ctx.provider.cloud(),
    ) {
        TrackStep::Exited { restarted } => {
            let read = exit_code(ctx, pod, uid, instance).await?;
            let view = exited(read, restarted, restarts, instance, ctx.provider.cloud());
            finish::finish(ctx, pod, uid, instance, view).await
        }
        TrackStep::Fail { reason, message } => {
            write::notes(ctx, pod, vec![Note::warning(reason, message.clone())]).await;
            finish::finish(ctx, pod, uid, instance, View::Failed { reason, message }).await
        }
        TrackStep::Disrupted(disruption) => disrupted(pod, uid, instance, disruption, ctx).await,
        TrackStep::Status => {
            read_init_progress(ctx, pod, uid, instance).await;
            write::status(
                ctx,
                pod,
                &View::Instance {
                    instance,
                    restarts,
                    cloud: ctx.provider.cloud(),
                    probed: ctx.remember(uid, |m| m.probed).or_else(|| {
                        crate::controller::probes::before_any(
                            pod,
                            crate::controller::probes::runs_here(ctx),
                        )
                    }),
                },
            )
            .await?;
            Ok(Action::requeue(settings.reconcile_interval))
        }
    }
}

/// Whether an instance's placement is checked: not one the operator adopted (`runpod-kubelet
/// adopt`), which is tracked as it is: it was made by the Go kubelet under its own rules, and
/// replacing it would kill the running job adoption exists to keep.
fn placement_checked(instance: &Instance, adopted: &crate::controller::adoption::Record) -> bool {
    !adopted.contains_key(&instance.id)
}

/// Placement is verified: RunPod treats datacenters as a preference only. A misplaced
/// instance is terminated at once and its GPU type not tried again for this pod.
async fn verify_placement<P: Provider>(
    pod: &Pod,
    uid: &str,
    instance: &Instance,
    ctx: &Shared<P>,
) -> Result<Option<Action>, ReconcileError> {
    if ctx.remember(uid, |m| m.verified.contains(&instance.id)) {
        return Ok(None);
    }
    let checked = match ctx.adopted.lock() {
        Ok(adopted) => placement_checked(instance, &adopted),
        Err(poisoned) => placement_checked(instance, &poisoned.into_inner()),
    };
    if !checked {
        return Ok(None);
    }
    let constraints = match ctx.provider.constraints(pod) {
        Ok(constraints) => constraints,
        Err(message) => {
            warn!(%message, "cannot check the placement");
            return Ok(None);
        }
    };
    match constraints.violation(instance) {
        Some(violation) => {
            let note = decide::placement_rejected(ctx.provider.cloud(), &instance.id, &violation);
            write::notes(ctx, pod, vec![note]).await;
            finish::terminate(ctx, pod, uid, instance, "placement outside the constraints").await?;
            ctx.remember(uid, |m| {
                if let Some(gpu) = &instance.gpu_type {
                    m.excluded_gpu_types.push(gpu.clone());
                }
                m.instance = None;
                m.nothing_created = true;
            });
            Ok(Some(Action::requeue(SHORT)))
        }
        None if instance.datacenter.is_some() && instance.cost_per_hour.is_some() => {
            ctx.remember(uid, |m| m.verified.insert(instance.id.clone()));
            Ok(None)
        }
        None => Ok(None),
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

/// The pod's end when its container exited: the code its log reported (or that it could not
/// be read), and a restart the cloud made before it, said in the message.
fn exited(
    read: ExitCode,
    restarted: bool,
    restarts: i32,
    instance: &Instance,
    cloud: CloudName,
) -> View<'static> {
    let (code, reason, message) = match read {
        ExitCode::Read(code) => {
            let (reason, message) = ended_reason(code);
            (code, reason, message)
        }
        ExitCode::Unreadable(error) => (
            None,
            "ContainerStatusUnknown",
            format!(
                "the container ended but its exit code could not be read from the {} log \
                 ({LOG_READ_ATTEMPTS} attempts; last: {error})",
                cloud.instance
            ),
        ),
    };
    View::Ended {
        exit_code: code,
        reason,
        message: if restarted {
            format!("{message} (the container restarted on {})", cloud.title)
        } else {
            message
        },
        started_at: instance.started_at,
        restarts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::pods::write::instance_annotations;
    use crate::provider::{Endpoint, InstanceState, Tags};
    use runpod_contract::{COST_PER_HR, ENDPOINTS, POD_ID};

    fn instance(id: &str) -> Instance {
        Instance {
            ssh: None,
            machine: None,
            disruption: None,
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
            created_at: None,
            started_at: None,
            message: None,
            usage: None,
        }
    }

    #[test]
    fn annotations_describe_the_instance() {
        let i = instance("abc");
        let map: std::collections::BTreeMap<_, _> =
            instance_annotations(&i, POD_ID).into_iter().collect();
        assert_eq!(map[POD_ID].as_deref(), Some("abc"));
        assert_eq!(map[COST_PER_HR].as_deref(), Some("0.440"));
        assert_eq!(
            map[ENDPOINTS].as_deref(),
            Some("8888/http=https://x-8888.proxy.runpod.net")
        );
    }

    #[test]
    fn an_instance_found_by_id_counts_only_with_this_pods_tags() {
        let settings = Settings {
            node_name: "vr".into(),
            cluster_id: "c1".into(),
            host_ip: "127.0.0.1".into(),
            reconcile_interval: std::time::Duration::from_secs(10),
            provision_timeout: std::time::Duration::from_secs(900),
            create_settle: std::time::Duration::from_secs(30),
            outage_grace: std::time::Duration::from_secs(3600),
            admission: Default::default(),
            idle: Default::default(),
            key_source: "Secret ns/key".into(),
            adoption_namespace: "runpod-system".into(),
            exec: crate::controller::node::exec_key::ExecAccess::Off,
            ledger_namespace: "runpod-system".into(),
            serve_namespaces: Vec::new(),
            owner_deployment: None,
            drain_timeout: std::time::Duration::from_secs(600),
            network: Default::default(),
        };
        let tagged = |cluster: &str, node: &str, uid: &str| Instance {
            tags: Tags {
                cluster_id: Some(cluster.into()),
                node_name: Some(node.into()),
                pod_uid: Some(uid.into()),
            },
            ..instance("x")
        };
        assert!(is_for(&tagged("c1", "vr", "u1"), "u1", &settings));
        // A forged pod-id annotation naming another pod's, node's or cluster's instance.
        assert!(!is_for(&tagged("c1", "vr", "u2"), "u1", &settings));
        assert!(!is_for(&tagged("c1", "other", "u1"), "u1", &settings));
        assert!(!is_for(&tagged("c2", "vr", "u1"), "u1", &settings));
        assert!(!is_for(&instance("untagged"), "u1", &settings));
    }

    /// Issue 42: an adopted instance is tracked as it is, never replaced for its placement.
    #[test]
    fn an_adopted_instance_is_never_replaced_for_its_placement() {
        let adopted: crate::controller::adoption::Record =
            [("legacy".to_owned(), "uid".to_owned())].into();
        assert!(!placement_checked(&instance("legacy"), &adopted));
        assert!(placement_checked(&instance("ours"), &adopted));
    }

    #[test]
    fn an_unknown_exit_code_never_reads_as_success() {
        assert_eq!(ended_reason(None).0, "ExitCodeUnknown");
        assert_eq!(ended_reason(Some(0)).0, "Completed");
        assert_eq!(ended_reason(Some(3)).0, "Error");
    }
}
