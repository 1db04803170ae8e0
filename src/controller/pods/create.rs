//! Creating a pod's one instance: the gates before any create (eligibility, the provisioning
//! timeout, backoff, an unavailable API, an earlier create whose outcome is not settled), the
//! create marker that makes a create crash-safe, and the outcome of a provision.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Toleration};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use runpod_contract::{self as contract, CREATE_REQUESTED};
use serde_json::json;
use tracing::{info, warn};

use super::decide::{self, create::CreateFacts};
use super::{ReconcileError, annotation, bound_at, finish, pods_in_namespace_of, write};
use crate::controller::budget::{self, Gate, Settled};
use crate::controller::context::{Shared, Snapshot};
use crate::controller::eligibility::{self, Judged, Refusal};
use crate::controller::node::health::ApiHealth;
use crate::controller::pods::inputs::env::{self, ClusterEnvSource};
use crate::controller::pods::inputs::{pull_secrets, volumes};
use crate::provider::{Provider, ProvisionError, ProvisionRequest, Provisioned};
use runpod_contract::budget::{BUDGET_EXCEEDED, BUDGET_TOO_SMALL};

/// Taints the node lifecycle controller puts on an unhealthy node.
const OUTAGE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

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

/// Creates the pod's instance, once.
pub(super) async fn create<P: Provider>(
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let settings = &ctx.settings;
    if let Some(refusal) = eligibility(ctx, pod, uid).await? {
        return write::apply(ctx, pod, decide::create::refused(refusal)).await;
    }
    let (nothing_created, next_create_at, excluded, marked_at, replacing_since) =
        ctx.remember(uid, |m| {
            (
                m.nothing_created,
                m.next_create_at,
                m.excluded_gpu_types.clone(),
                m.create_marked_at,
                m.replacing_since,
            )
        });
    // The create marker is the later of the pod's and this leader's own record (the pod
    // cache may lag behind a marker just written).
    let marker = annotation(pod, CREATE_REQUESTED)
        .map(|m| m.parse::<Timestamp>().unwrap_or(Timestamp::UNIX_EPOCH))
        .into_iter()
        .chain(marked_at)
        .max()
        .filter(|_| !nothing_created);
    let facts = CreateFacts {
        now: Timestamp::now(),
        marker,
        confirmed_at: snapshot.confirmed_at,
        clock_start: replacing_since.or_else(|| bound_at(pod)),
        next_create_at,
        unavailable: matches!(*ctx.health.borrow(), ApiHealth::Unavailable { .. }),
    };
    if let Some(outcome) = decide::create::create_gate(&facts, settings, ctx.provider.cloud()) {
        return write::apply(ctx, pod, outcome).await;
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
            return write::apply(ctx, pod, decide::create::config_error(error.to_string())).await;
        }
    };
    let volumes =
        match volumes::resolve(&ClusterEnvSource(ctx.client.clone()), pod, container).await {
            Ok(volumes) => volumes,
            Err(error) => {
                let outcome = decide::create::config_error(error.to_string());
                return write::apply(ctx, pod, outcome).await;
            }
        };
    if !volumes.skipped.is_empty() {
        ctx.event(
            pod,
            false,
            "ServiceAccountTokenNotMounted",
            format!(
                "{} is not mounted on {}: {}s cannot reach the cluster's apiserver, \
                 and a cluster credential is not shipped to the cloud",
                volumes.skipped.join(", "),
                ctx.provider.cloud().title,
                ctx.provider.instance_noun()
            ),
        )
        .await;
    }

    // The namespace's budget: reserve what this create may cost, or wait for room.
    let reserved = match budget::before_create(ctx, pod, uid).await? {
        Gate::Unbounded => None,
        Gate::Reserved { usd } => Some(usd),
        Gate::Wait(message) => {
            let outcome = decide::create::budget_wait(BUDGET_EXCEEDED, message, settings);
            return write::apply(ctx, pod, outcome).await;
        }
        Gate::TooSmall(message) => {
            let outcome = decide::create::budget_wait(BUDGET_TOO_SMALL, message, settings);
            return write::apply(ctx, pod, outcome).await;
        }
        Gate::Later => return Ok(Action::requeue(settings.reconcile_interval)),
    };
    // The create is under way (its reservation kept) until this function returns.
    let _sending = reserved.map(|_| budget::sending(ctx, uid));

    // The first attempt repeats `cheapest`'s choice and prices where users read Events.
    let first_attempt = annotation(pod, CREATE_REQUESTED).is_none() && marked_at.is_none();
    if let Some(choice) = annotation(pod, runpod_contract::provider::CHEAPEST_CHOICE)
        && first_attempt
        && runpod_contract::gpus::recorded_choice(choice)
            .is_some_and(|cloud| cloud.as_str() == ctx.provider.name())
    {
        ctx.event(
            pod,
            false,
            "CheapestChosen",
            format!("{}=cheapest {choice}", runpod_contract::provider::PROVIDER),
        )
        .await;
    }

    // Record the attempt before sending it: a leader that dies after the create sees this
    // and searches instead of creating a second pod.
    mark_create_requested(ctx, uid, &pods, &name).await?;
    ctx.remember(uid, |m| m.nothing_created = false);
    let message = format!("creating the {}", ctx.provider.instance_noun());
    write::waiting(ctx, pod, "ContainerCreating", &message).await?;

    // Unreadable pull secrets are not fatal: an image that needs none still runs.
    let pull_credentials =
        match pull_secrets::resolve(&ClusterEnvSource(ctx.client.clone()), pod).await {
            Ok(credentials) => credentials,
            Err(error) => {
                warn!(%error, "reading the pod's imagePullSecrets failed");
                Vec::new()
            }
        };
    let for_cloud = decide::create::with_default_ports(pod, ctx.settings.admission.expose_no_ports);
    // A create under a reservation may cost no more than was reserved.
    let for_cloud = match reserved {
        Some(usd) => std::borrow::Cow::Owned(decide::create::capped(&for_cloud, usd)),
        None => for_cloud,
    };
    let request = ProvisionRequest {
        pod: &for_cloud,
        env: &resolved,
        volumes: &volumes,
        excluded_gpu_types: &excluded,
        pull_credential: request_container_image(pod)
            .and_then(|image| pull_secrets::credential_for(image, &pull_credentials)),
    };
    ctx.metrics.created(ctx.provider.name());
    let provisioned = provision_marked(ctx, &pods, &name, request).await;
    if reserved.is_some() {
        let settled = match &provisioned {
            Ok(made) => Settled::Created(made.instance.cost_per_hour),
            Err(error) if decide::create::made_nothing(error) => Settled::Nothing,
            Err(_) => Settled::Unknown,
        };
        budget::after_create(ctx, pod, uid, settled).await;
    }
    match provisioned {
        Ok(provisioned) => {
            let instance = provisioned.instance;
            info!(instance = %instance.id, cloud = ctx.provider.name(), summary = %provisioned.summary, "instance for the pod");
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
                format!(
                    "{} {}: {}; {}{}",
                    ctx.provider.instance_noun(),
                    instance.id,
                    provisioned.summary,
                    // The controller's own port, published like the pod's: say so.
                    match ctx.provider.shell_access() {
                        crate::provider::ShellAccess::Offered { opened }
                            if matches!(
                                ctx.settings.exec,
                                crate::controller::node::exec_key::ExecAccess::Ready { .. }
                            ) && !runpod_contract::exposes_nothing(
                                for_cloud.metadata.annotations.as_ref(),
                                false,
                            ) =>
                            format!("{opened}; "),
                        _ => String::new(),
                    },
                    decide::create::exposure(
                        &runpod_contract::policy::ports(&for_cloud).unwrap_or_default(),
                        |port| ctx.provider.endpoint(&instance.id, port)
                    )
                ),
            )
            .await;
            // What admission warned about, said where a Job's pods are read: their Events.
            let unapplied = serde_json::to_value(&for_cloud)
                .and_then(serde_json::from_value::<runpod_contract::pod::PodView>)
                .ok()
                .and_then(|view| {
                    runpod_contract::checks::unapplied_security_context_message(
                        &view,
                        ctx.provider.cloud().title,
                    )
                });
            if let Some(message) = unapplied {
                ctx.event(pod, true, "SecurityContextNotApplied", message)
                    .await;
            }
            if provisioned.possibly_duplicated {
                // Every later list is checked for a second pod with this UID tag, which the
                // duplicate handling above terminates at once.
                ctx.event(
                    pod,
                    true,
                    "PossibleDuplicate",
                    format!(
                        "an earlier create may also have made a {}; it will be terminated as soon as {} lists it",
                        ctx.provider.instance_noun(),
                        ctx.provider.cloud().title
                    ),
                )
                .await;
            }
            for duplicate in &provisioned.duplicates {
                finish::terminate(ctx, pod, uid, duplicate, "duplicate").await?;
            }
            write::annotations(ctx, pod, &instance).await?;
            Ok(Action::requeue(settings.reconcile_interval))
        }
        Err(error) => {
            let failures = ctx.remember(uid, |m| {
                m.create_failures += 1;
                m.create_failures
            });
            let failed = decide::create::provision_failed(&error, failures, &facts, settings);
            ctx.remember(uid, |m| {
                if failed.nothing_created {
                    m.nothing_created = true;
                }
                if failed.next_create_at.is_some() {
                    m.next_create_at = failed.next_create_at;
                }
            });
            if let Some(message) = failed.account_refused {
                ctx.health.send_replace(ApiHealth::Unavailable {
                    reason: "AccountRefused".into(),
                    message,
                });
            }
            write::apply(ctx, pod, failed.outcome).await
        }
    }
}

/// Why this pod must get no instance, judged once per pod by this leader: the webhook's
/// opt-in rule and the checks it can repeat (see `eligibility`).
async fn eligibility<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
) -> Result<Option<Refusal>, ReconcileError> {
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(contract::BURST_LABEL))
        .cloned();
    let now = Timestamp::now();
    if let Some(judged) = ctx.remember(uid, |m| m.refusal.clone())
        && judged.still_holds(label.as_deref(), now)
    {
        return Ok(judged.refusal);
    }
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let name = pod.metadata.namespace.as_deref().unwrap_or("default");
    // The namespace's labels: its opt-in and its node binding.
    let labels = match namespaces.get_metadata_opt(name).await {
        Ok(namespace) => namespace
            .and_then(|ns| ns.metadata.labels)
            .unwrap_or_default(),
        // A pod that opts in itself is judged without them (manifests from an older chart),
        // unless nodes are bound to teams: then the namespace's binding must be known.
        Err(kube::Error::Api(status))
            if status.code == 403
                && !eligibility::needs_namespace_labels(pod)
                && ctx.settings.serve_namespaces.is_empty()
                && ctx.settings.admission.namespace_nodes.is_empty() =>
        {
            Default::default()
        }
        Err(error) => match error {
            // Said on the pod rather than retried in silence (manifests from an older chart).
            kube::Error::Api(status) if status.code == 403 => {
                return Ok(Some(Refusal {
                    reason: "NamespaceUnreadable",
                    message: format!(
                        "the controller may not read namespace {name} to check its opt-in \
                         label and node binding (RBAC: namespaces get); grant it, or give the \
                         pod the label {}={}",
                        contract::BURST_LABEL,
                        contract::BURST_ENABLED
                    ),
                    fail: false,
                }));
            }
            error => return Err(error.into()),
        },
    };
    let refusal = eligibility::refusal(pod, &labels, &ctx.settings.admission, ctx.provider.cloud());
    let why_not_here = wrong_node(ctx, name, &labels).await?;
    let refusal = eligibility::with_binding(refusal, why_not_here);
    ctx.remember(uid, |m| {
        m.refusal = Some(Judged {
            refusal: refusal.clone(),
            label,
            at: now,
        })
    });
    Ok(refusal)
}

/// Why this node must not run pods of `namespace`, if it must not: the namespace's label
/// `runpod.io/node`, else the nodes listing it (this node's own list from its flags, the
/// others' from their annotations).
async fn wrong_node<P: Provider>(
    ctx: &Shared<P>,
    namespace: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<Option<String>, ReconcileError> {
    use runpod_contract::teams::{self, Served};
    let label = labels.get(teams::NODE_LABEL).map(String::as_str);
    let node = &ctx.settings.node_name;
    let serves = &ctx.settings.serve_namespaces;
    let installed = &ctx.settings.admission.namespace_nodes;
    let mut nodes = vec![Served {
        node: node.clone(),
        namespaces: serves.clone(),
    }];
    let listed = |nodes: &[Served]| {
        nodes
            .iter()
            .any(|served| served.namespaces.iter().any(|ns| ns == namespace))
    };
    if !listed(&nodes) && !listed(installed) {
        // Only another node listing the namespace can bind it now (a label may not override
        // that node's list, so it is looked for with a label too).
        let all: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
        let listed = all
            .list_metadata(&kube::api::ListParams::default().labels("type=virtual-kubelet"))
            .await?;
        nodes.extend(
            listed
                .items
                .iter()
                .filter(|other| other.metadata.name.as_deref() != Some(node))
                .map(|other| {
                    Served::parse(
                        other.metadata.name.as_deref().unwrap_or_default(),
                        other
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(teams::SERVES_NAMESPACES))
                            .map(String::as_str),
                    )
                }),
        );
    }
    // The nodes' own lists first, then the installation's (a node that is not registered).
    let nodes = teams::with_more(nodes, installed);
    let binding = teams::binding(namespace, label, &nodes);
    Ok(teams::may_run(namespace, &binding, node, serves).err())
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
) -> Result<Provisioned, ProvisionError> {
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

/// The image of the pod's one container, whose registry login the cloud is handed.
fn request_container_image(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .and_then(|container| container.image.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
