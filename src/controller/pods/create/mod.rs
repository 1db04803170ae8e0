//! Creating a pod's one instance, as a pipeline of named steps: the gates before any create
//! (eligibility, the provisioning timeout, backoff, an unavailable API, an earlier create whose
//! outcome is not settled), the pod's inputs, the namespace's budget, the marked create, and
//! what its outcome writes. The decisions are pure (`decide::gates`, `decide::provisioned`);
//! a step that ends the create returns `Break` with the reconcile's answer.

mod judged;
mod marker;

use std::ops::ControlFlow::{self, Break, Continue};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use runpod_contract::CREATE_REQUESTED;
use runpod_contract::budget::{BUDGET_EXCEEDED, BUDGET_TOO_SMALL};
use serde_json::json;
use tracing::{info, warn};

use super::decide::gates::{self, CreateFacts};
use super::decide::provisioned::{self, Created};
use super::decide::{Note, Outcome};
use super::tolerations::outage_tolerations;
use super::{ReconcileError, annotation, bound_at, finish, pods_in, write};
use crate::controller::budget::{self, Gate, Settled};
use crate::controller::context::{Shared, Snapshot};
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::node::health::ApiHealth;
use crate::controller::pods::inputs::env::{self, ClusterEnvSource};
use crate::controller::pods::inputs::{pull_secrets, volumes};
use crate::provider::request::{PullCredential, ResolvedEnv, Volumes};
use crate::provider::{
    Provider, ProvisionError, ProvisionRequest, Provisioned, ShellAccess, VolumeMount,
};

/// Where the create ends: a decision for the one executor to write, or just when to look again.
enum End {
    Write(Box<Outcome>),
    Look(Action),
}

/// What a step hands on, or where the create ends.
type Step<T> = Result<ControlFlow<End, T>, ReconcileError>;

/// Hands a step's value on, or ends the create where the step says.
macro_rules! step {
    ($step:expr) => {
        match $step {
            Continue(value) => value,
            Break(end) => return Ok(end),
        }
    };
}

/// Creates the pod's instance, once; what the steps decide is written in one place.
pub(super) async fn create<P: Provider>(
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    match steps(pod, uid, snapshot, ctx).await? {
        End::Write(outcome) => write::apply(ctx, pod, *outcome).await,
        End::Look(action) => Ok(action),
    }
}

async fn steps<P: Provider>(
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<End, ReconcileError> {
    let passed = step!(gate(ctx, pod, uid, snapshot).await?);
    let inputs = step!(inputs(ctx, pod).await?);
    let reserved = step!(reserve(ctx, pod, uid).await?);
    // The create is under way (its reservation kept) until this function returns.
    let _sending = reserved.map(|_| budget::sending(ctx, uid));
    let mut notes = inputs.notes.clone();
    if passed.first_attempt {
        notes.extend(provisioned::cheapest_note(pod, ctx.provider.name()));
    }
    let for_cloud = provisioned::shaped(pod, ctx.settings.admission.expose_no_ports, reserved);
    let outcome = send(ctx, pod, uid, &for_cloud, &inputs, &passed.excluded, notes).await?;
    if reserved.is_some() {
        let settled = match &outcome {
            Ok(made) => Settled::Created(made.instance.cost_per_hour),
            Err(error) if provisioned::made_nothing(error) => Settled::Nothing,
            Err(_) => Settled::Unknown,
        };
        budget::after_create(ctx, pod, uid, settled).await;
    }
    match outcome {
        Err(error) => {
            if let ProvisionError::AccountBlocked(message) = &error {
                warn_claims(ctx, pod, &inputs.volumes.claims, message).await;
            }
            Ok(End::Write(Box::new(failed(
                ctx,
                uid,
                &passed.facts,
                &error,
            ))))
        }
        Ok(made) => created(ctx, uid, &for_cloud, made).await,
    }
}

/// The account was refused (a zero balance, say): the claims the pod mounts are told too, as
/// their volumes bill storage and outlive the pods only while the account pays; their owners
/// read the claim, not a pod that failed.
async fn warn_claims<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    claims: &[(String, String)],
    message: &str,
) {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let api = kube::Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        namespace,
    );
    for (claim, _) in claims {
        // Read for its UID, by which `kubectl describe` finds the claim's Events.
        let about = match api.get_opt(claim).await {
            Ok(Some(found)) => kube::Resource::object_ref(&found, &()),
            Ok(None) => continue,
            Err(error) => {
                warn!(%error, claim, "reading the claim to warn it failed");
                continue;
            }
        };
        let note =
            provisioned::account_refused_for_claim(ctx.provider.cloud().title, pod_name, message);
        ctx.event_as(&about, true, ("AccountRefused", "AccountRefused"), note)
            .await;
    }
}

/// What the gates let through: the facts they judged, and what this leader remembers.
struct Passed {
    facts: CreateFacts,
    /// GPU types not to try again for this pod.
    excluded: Vec<String>,
    /// No create was ever requested for this pod.
    first_attempt: bool,
}

/// The gates before any create: this node may run the pod, and the create gate (provisioning
/// timeout, backoff, an unavailable API, an unsettled earlier create) lets it through.
async fn gate<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
) -> Step<Passed> {
    if let Some(refusal) = judged::eligibility(ctx, pod, uid).await? {
        return Ok(Break(End::Write(Box::new(gates::refused(refusal)))));
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
    let now = Timestamp::now();
    let marker = gates::create_marker(pod, marked_at, nothing_created, now);
    let facts = CreateFacts {
        now,
        marker,
        confirmed_at: snapshot.confirmed_at,
        clock_start: replacing_since.or_else(|| bound_at(pod)),
        next_create_at,
        unavailable: matches!(*ctx.health.borrow(), ApiHealth::Unavailable { .. }),
    };
    if let Some(outcome) = gates::create_gate(&facts, &ctx.settings, ctx.provider.cloud()) {
        return Ok(Break(End::Write(Box::new(outcome))));
    }
    Ok(Continue(Passed {
        facts,
        excluded,
        first_attempt: annotation(pod, CREATE_REQUESTED).is_none() && marked_at.is_none(),
    }))
}

/// What the container is given: its environment and its files, and what the create Events
/// say of them.
struct Inputs {
    env: ResolvedEnv,
    /// Each init container's, in order.
    init_env: Vec<ResolvedEnv>,
    volumes: Volumes,
    /// The network volume of the claim the pod mounts.
    network_volume: Option<VolumeMount>,
    /// The `imagePullSecrets` login for the image's registry.
    pull_credential: Option<PullCredential>,
    notes: Vec<Note>,
}

/// The pod's outage tolerations first (the node must never be tainted before they are in
/// place), then its environment and files from the cluster; a reference that cannot be
/// resolved is the pod's configuration error.
async fn inputs<P: Provider>(ctx: &Shared<P>, pod: &Pod) -> Step<Inputs> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    if let Some(longer) = outage_tolerations(&tolerations, ctx.settings.outage_grace) {
        let patch = json!({"spec": {"tolerations": longer}});
        pods_in(&ctx.client, pod.metadata.namespace.as_deref())
            .patch(
                pod.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        return Ok(Break(End::Look(Action::requeue(Duration::from_millis(
            200,
        )))));
    }
    let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return Ok(Break(End::Look(Action::await_change())));
    };
    let source = ClusterEnvSource(ctx.client.clone());
    let env = match env::resolve(&source, pod, container).await {
        Ok(env) => env,
        Err(error) => {
            return Ok(Break(End::Write(Box::new(gates::config_error(
                error.to_string(),
            )))));
        }
    };
    let mut init_env = Vec::new();
    for init in pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
    {
        match env::resolve(&source, pod, init).await {
            Ok(env) => init_env.push(env),
            Err(error) => {
                return Ok(Break(End::Write(Box::new(gates::config_error(format!(
                    "init container {:?}: {error}",
                    init.name
                ))))));
            }
        }
    }
    let volumes = match volumes::resolve(&source, pod, container).await {
        Ok(volumes) => volumes,
        Err(error) => {
            return Ok(Break(End::Write(Box::new(gates::config_error(
                error.to_string(),
            )))));
        }
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let network_volume = match crate::controller::storage::claims::mount_for(
        &ctx.client,
        ctx.provider.as_ref(),
        namespace,
        &volumes.claims,
    )
    .await
    {
        Ok(mount) => mount,
        Err(error) => {
            return Ok(Break(End::Write(Box::new(gates::config_error(
                error.to_string(),
            )))));
        }
    };
    // Unreadable pull secrets are not fatal: an image that needs none still runs.
    let pull_credential = match pull_secrets::logins(&source, pod).await {
        Ok(logins) => container
            .image
            .as_deref()
            .and_then(|image| pull_secrets::credential_for(image, &logins))
            .cloned(),
        Err(error) => {
            warn!(%error, "reading the pod's imagePullSecrets failed");
            None
        }
    };
    let notes = provisioned::token_not_mounted(
        &volumes.skipped,
        ctx.provider.cloud().title,
        ctx.provider.instance_noun(),
    )
    .into_iter()
    .collect();
    Ok(Continue(Inputs {
        env,
        init_env,
        volumes,
        network_volume,
        pull_credential,
        notes,
    }))
}

/// The namespace's budget: what this create may cost is reserved (`Some(usd)`), or the pod
/// waits for room; `None` when the namespace has no budget.
async fn reserve<P: Provider>(ctx: &Shared<P>, pod: &Pod, uid: &str) -> Step<Option<f64>> {
    let settings = &ctx.settings;
    Ok(match budget::before_create(ctx, pod, uid).await? {
        Gate::Unbounded => Continue(None),
        Gate::Reserved { usd } => Continue(Some(usd)),
        Gate::Later => Break(End::Look(Action::requeue(settings.reconcile_interval))),
        Gate::Wait(message) => Break(End::Write(Box::new(gates::budget_wait(
            BUDGET_EXCEEDED,
            message,
            settings,
        )))),
        Gate::TooSmall(message) => Break(End::Write(Box::new(gates::budget_wait(
            BUDGET_TOO_SMALL,
            message,
            settings,
        )))),
    })
}

/// Records the attempt, then sends it: a leader that dies after the create sees the marker
/// and searches instead of creating a second instance.
async fn send<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    for_cloud: &Pod,
    inputs: &Inputs,
    excluded: &[String],
    notes: Vec<Note>,
) -> Result<Result<Provisioned, ProvisionError>, ReconcileError> {
    let pods = pods_in(&ctx.client, pod.metadata.namespace.as_deref());
    let name = pod.metadata.name.clone().unwrap_or_default();
    // Said before the marker: the create is sent as soon after it as possible.
    let sending = provisioned::sending(notes, ctx.provider.instance_noun());
    write::apply(ctx, pod, sending).await?;
    marker::mark_create_requested(ctx, uid, &pods, &name).await?;
    ctx.remember(uid, |m| m.nothing_created = false);

    let avoided = ctx
        .lost_machines
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .avoided(
            &crate::controller::memory::lost_machine_keys(pod),
            Timestamp::now(),
        );
    let request = ProvisionRequest {
        pod: for_cloud,
        env: &inputs.env,
        init_env: &inputs.init_env,
        volumes: &inputs.volumes,
        excluded_gpu_types: excluded,
        avoided_machines: &avoided,
        network_volume: inputs.network_volume.as_ref(),
        pull_credential: inputs.pull_credential.as_ref(),
    };
    ctx.metrics.created(ctx.provider.name());
    Ok(marker::provision_marked(ctx, &pods, &name, request).await)
}

/// An instance was made: remember it and terminate any duplicate; returns what to write (what
/// it is, where it is public, what was not applied, and the instance's annotations).
async fn created<P: Provider>(
    ctx: &Shared<P>,
    uid: &str,
    for_cloud: &Pod,
    made: Provisioned,
) -> Result<End, ReconcileError> {
    let instance = &made.instance;
    info!(instance = %instance.id, cloud = ctx.provider.name(), summary = %made.summary, "instance for the pod");
    ctx.remember(uid, |m| {
        m.instance = Some((instance.id.clone(), Timestamp::now()));
        m.create_failures = 0;
        m.next_create_at = None;
    });
    let shell_opened = match ctx.provider.shell_access() {
        ShellAccess::Offered { opened, .. }
            if matches!(ctx.settings.exec, ExecAccess::Ready { .. }) =>
        {
            Some(opened)
        }
        _ => None,
    };
    let mut outcome = provisioned::described(
        &Created {
            made: &made,
            pod: for_cloud,
            noun: ctx.provider.instance_noun(),
            title: ctx.provider.cloud().title,
            shell_opened,
            // Hooks and probes run in the container over the node's SSH connection.
            in_container: ctx.provider.runs_post_start_hooks()
                && matches!(
                    ctx.settings.exec,
                    crate::controller::node::exec_key::ExecAccess::Ready { .. }
                ),
            endpoint: &|port| ctx.provider.endpoint(&instance.id, port),
        },
        ctx.settings.reconcile_interval,
    );
    for duplicate in &made.duplicates {
        outcome
            .events
            .extend(finish::terminate_once(ctx, uid, duplicate, "duplicate").await?);
    }
    Ok(End::Write(Box::new(outcome)))
}

/// Nothing (or nothing known) was made: count the failure, remember what the decision says
/// (backoff, nothing created), mark a refused account; returns what to write.
fn failed<P: Provider>(
    ctx: &Shared<P>,
    uid: &str,
    facts: &CreateFacts,
    error: &ProvisionError,
) -> Outcome {
    let failures = ctx.remember(uid, |m| {
        m.create_failures += 1;
        m.create_failures
    });
    let failed = provisioned::provision_failed(error, failures, facts, &ctx.settings);
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
    failed.outcome
}
