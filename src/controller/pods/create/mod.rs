//! Creating a pod's one instance, as a pipeline of named steps: the gates before any create
//! (eligibility, the provisioning timeout, backoff, an unavailable API, an earlier create whose
//! outcome is not settled), the pod's inputs, the namespace's budget, the marked create, and
//! what its outcome writes. The decisions are pure (`decide::gates`, `decide::provisioned`);
//! a step that ends the create returns `Break` with the reconcile's answer.

mod judged;
mod marker;

pub use marker::marker_refresh;

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
use super::tolerations::outage_tolerations;
use super::{ReconcileError, annotation, bound_at, finish, pods_in_namespace_of, write};
use crate::controller::budget::{self, Gate, Settled};
use crate::controller::context::{Shared, Snapshot};
use crate::controller::node::exec_key::ExecAccess;
use crate::controller::node::health::ApiHealth;
use crate::controller::pods::inputs::env::{self, ClusterEnvSource};
use crate::controller::pods::inputs::{pull_secrets, volumes};
use crate::provider::request::{ResolvedEnv, Volumes};
use crate::provider::{Provider, ProvisionError, ProvisionRequest, Provisioned, ShellAccess};

/// What a step hands on, or the reconcile's answer when the create ends there.
type Step<T> = Result<ControlFlow<Action, T>, ReconcileError>;

/// Creates the pod's instance, once.
pub(super) async fn create<P: Provider>(
    pod: &Pod,
    uid: &str,
    snapshot: &Snapshot,
    ctx: &Shared<P>,
) -> Result<Action, ReconcileError> {
    let passed = match gate(ctx, pod, uid, snapshot).await? {
        Continue(passed) => passed,
        Break(action) => return Ok(action),
    };
    let inputs = match inputs(ctx, pod).await? {
        Continue(inputs) => inputs,
        Break(action) => return Ok(action),
    };
    let reserved = match reserve(ctx, pod, uid).await? {
        Continue(reserved) => reserved,
        Break(action) => return Ok(action),
    };
    // The create is under way (its reservation kept) until this function returns.
    let _sending = reserved.map(|_| budget::sending(ctx, uid));
    if passed.first_attempt {
        announce_cheapest(ctx, pod).await;
    }
    let for_cloud = provisioned::shaped(pod, ctx.settings.admission.expose_no_ports, reserved);
    let outcome = send(ctx, pod, uid, &for_cloud, &inputs, &passed.excluded).await?;
    if reserved.is_some() {
        let settled = match &outcome {
            Ok(made) => Settled::Created(made.instance.cost_per_hour),
            Err(error) if provisioned::made_nothing(error) => Settled::Nothing,
            Err(_) => Settled::Unknown,
        };
        budget::after_create(ctx, pod, uid, settled).await;
    }
    match outcome {
        Ok(made) => created(ctx, pod, uid, &for_cloud, made).await,
        Err(error) => failed(ctx, pod, uid, &passed.facts, &error).await,
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
        return write::apply(ctx, pod, gates::refused(refusal))
            .await
            .map(Break);
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
    if let Some(outcome) = gates::create_gate(&facts, &ctx.settings, ctx.provider.cloud()) {
        return write::apply(ctx, pod, outcome).await.map(Break);
    }
    Ok(Continue(Passed {
        facts,
        excluded,
        first_attempt: annotation(pod, CREATE_REQUESTED).is_none() && marked_at.is_none(),
    }))
}

/// What the container is given: its environment and its files.
struct Inputs {
    env: ResolvedEnv,
    volumes: Volumes,
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
        pods_in_namespace_of(&ctx.client, pod)
            .patch(
                pod.metadata.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        return Ok(Break(Action::requeue(Duration::from_millis(200))));
    }
    let Some(container) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return Ok(Break(Action::await_change()));
    };
    let source = ClusterEnvSource(ctx.client.clone());
    let env = match env::resolve(&source, pod, container).await {
        Ok(env) => env,
        Err(error) => {
            let outcome = gates::config_error(error.to_string());
            return write::apply(ctx, pod, outcome).await.map(Break);
        }
    };
    let volumes = match volumes::resolve(&source, pod, container).await {
        Ok(volumes) => volumes,
        Err(error) => {
            let outcome = gates::config_error(error.to_string());
            return write::apply(ctx, pod, outcome).await.map(Break);
        }
    };
    if let Some(note) = provisioned::token_not_mounted(
        &volumes.skipped,
        ctx.provider.cloud().title,
        ctx.provider.instance_noun(),
    ) {
        ctx.event(pod, note.warning, note.reason, note.message)
            .await;
    }
    Ok(Continue(Inputs { env, volumes }))
}

/// The namespace's budget: what this create may cost is reserved (`Some(usd)`), or the pod
/// waits for room; `None` when the namespace has no budget.
async fn reserve<P: Provider>(ctx: &Shared<P>, pod: &Pod, uid: &str) -> Step<Option<f64>> {
    let settings = &ctx.settings;
    let outcome = match budget::before_create(ctx, pod, uid).await? {
        Gate::Unbounded => return Ok(Continue(None)),
        Gate::Reserved { usd } => return Ok(Continue(Some(usd))),
        Gate::Later => return Ok(Break(Action::requeue(settings.reconcile_interval))),
        Gate::Wait(message) => gates::budget_wait(BUDGET_EXCEEDED, message, settings),
        Gate::TooSmall(message) => gates::budget_wait(BUDGET_TOO_SMALL, message, settings),
    };
    write::apply(ctx, pod, outcome).await.map(Break)
}

/// The first attempt repeats `cheapest`'s choice and prices where users read Events.
async fn announce_cheapest<P: Provider>(ctx: &Shared<P>, pod: &Pod) {
    if let Some(choice) = annotation(pod, runpod_contract::provider::CHEAPEST_CHOICE)
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
) -> Result<Result<Provisioned, ProvisionError>, ReconcileError> {
    let pods = pods_in_namespace_of(&ctx.client, pod);
    let name = pod.metadata.name.clone().unwrap_or_default();
    marker::mark_create_requested(ctx, uid, &pods, &name).await?;
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
    let request = ProvisionRequest {
        pod: for_cloud,
        env: &inputs.env,
        volumes: &inputs.volumes,
        excluded_gpu_types: excluded,
        pull_credential: provisioned::container_image(pod)
            .and_then(|image| pull_secrets::credential_for(image, &pull_credentials)),
    };
    ctx.metrics.created(ctx.provider.name());
    Ok(marker::provision_marked(ctx, &pods, &name, request).await)
}

/// An instance was made: remember it, say what it is, where it is public and what was not
/// applied, terminate any duplicate, and write the instance's annotations.
async fn created<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    for_cloud: &Pod,
    made: Provisioned,
) -> Result<Action, ReconcileError> {
    let instance = &made.instance;
    info!(instance = %instance.id, cloud = ctx.provider.name(), summary = %made.summary, "instance for the pod");
    ctx.remember(uid, |m| {
        m.instance = Some((instance.id.clone(), Timestamp::now()));
        m.create_failures = 0;
        m.next_create_at = None;
    });
    let shell_opened = match ctx.provider.shell_access() {
        ShellAccess::Offered { opened }
            if matches!(ctx.settings.exec, ExecAccess::Ready { .. }) =>
        {
            Some(opened)
        }
        _ => None,
    };
    let notes = provisioned::created_notes(&Created {
        made: &made,
        pod: for_cloud,
        noun: ctx.provider.instance_noun(),
        title: ctx.provider.cloud().title,
        shell_opened,
        endpoint: &|port| ctx.provider.endpoint(&instance.id, port),
    });
    for note in notes {
        ctx.event(pod, note.warning, note.reason, note.message)
            .await;
    }
    for duplicate in &made.duplicates {
        finish::terminate(ctx, pod, uid, duplicate, "duplicate").await?;
    }
    write::annotations(ctx, pod, instance).await?;
    Ok(Action::requeue(ctx.settings.reconcile_interval))
}

/// Nothing (or nothing known) was made: count the failure, remember what the decision says
/// (backoff, nothing created), mark a refused account, and write the outcome.
async fn failed<P: Provider>(
    ctx: &Shared<P>,
    pod: &Pod,
    uid: &str,
    facts: &CreateFacts,
    error: &ProvisionError,
) -> Result<Action, ReconcileError> {
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
    write::apply(ctx, pod, failed.outcome).await
}
