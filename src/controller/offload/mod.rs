//! The offloader's shell (leader only): watches the pods bound to no node and the Jobs'
//! metadata, takes the plan (`plan::plan`) every few seconds over the waiting pods the
//! controller would run (the same eligibility as before a create: opt-in, shape, policy), and
//! carries each move out with one pod patch that adds the virtual node's toleration and the
//! outage tolerations. The patch carries the pod's `resourceVersion`, so a pod bound or changed
//! meanwhile is left for the next round; nothing is ever deleted or re-created.

pub mod plan;

use kube::Resource as _;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{PartialObjectMeta, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::controller::clock::elapsed;
use crate::controller::context::Shared;
use crate::controller::eligibility;
use crate::controller::leader::Fence;
use crate::controller::metrics::ReasonLabel;
use crate::controller::pods::outage_tolerations;
use crate::provider::Provider;
use plan::{Move, OffloadSettings, Waiting};

/// How often the waiting pods are looked at.
const ROUND: Duration = Duration::from_secs(2);
/// How long a namespace's labels are trusted before they are read again.
const NAMESPACE_TTL: Duration = Duration::from_secs(60);

/// Runs until aborted (the leader's tasks are aborted when leadership ends).
pub async fn run<P: Provider>(shared: Arc<Shared<P>>, settings: OffloadSettings, fence: Fence) {
    let client = shared.client.clone();
    let (pods, pod_writer) = reflector::store();
    let pod_stream = watcher(
        Api::<Pod>::all(client.clone()),
        watcher::Config::default().fields("spec.nodeName=,status.phase=Pending"),
    )
    .default_backoff()
    .reflect(pod_writer)
    .applied_objects();
    let (jobs, job_writer) = reflector::store();
    // `PartialObjectMeta` makes the list and watch metadata-only.
    let job_stream = watcher(
        Api::<PartialObjectMeta<Job>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(job_writer)
    .applied_objects();
    let watches = tokio::spawn(async move {
        let pods = pod_stream.for_each(|event| async move {
            if let Err(error) = event {
                warn!(%error, "watching pending pods failed");
            }
        });
        let jobs = job_stream.for_each(|event| async move {
            if let Err(error) = event {
                warn!(%error, "watching Jobs failed");
            }
        });
        futures_util::join!(pods, jobs);
    });
    if pods.wait_until_ready().await.is_err() || jobs.wait_until_ready().await.is_err() {
        watches.abort();
        return;
    }
    info!(
        max_pending_time = %humantime::format_duration(settings.max_pending_time),
        threshold = settings.pending_job_threshold,
        "offloader watching pods that wait for a local GPU"
    );
    let mut namespaces: HashMap<String, (BTreeMap<String, String>, Timestamp)> = HashMap::new();
    let mut interval = tokio::time::interval(ROUND);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // No pod is written once the lease may be someone else's.
        if fence.is_valid() {
            round(&shared, &pods, &jobs, settings, &mut namespaces).await;
        }
    }
}

/// One look at the waiting pods: the plan, the metrics, the moves.
async fn round<P: Provider>(
    shared: &Shared<P>,
    pods: &Store<Pod>,
    jobs: &Store<PartialObjectMeta<Job>>,
    settings: OffloadSettings,
    namespaces: &mut HashMap<String, (BTreeMap<String, String>, Timestamp)>,
) {
    let now = Timestamp::now();
    let all = pods.state();
    let job_annotations: Vec<Option<BTreeMap<String, String>>> = all
        .iter()
        .map(|pod| owning_job(pod).and_then(|job| jobs.get(&job)?.metadata.annotations.clone()))
        .collect();
    let mut eligible = Vec::new();
    for (pod, job) in all.iter().zip(&job_annotations) {
        let waiting = Waiting {
            pod,
            job: job.as_ref(),
        };
        if !plan::is_delayed(&waiting)
            || plan::tolerates_virtual_node(pod)
            || plan::wanted_cloud(&waiting).as_str() != shared.provider.name()
        {
            continue;
        }
        let labels = namespace_labels(shared, pod, namespaces, now).await;
        // A pod the controller would not run is never moved (it waits for a local GPU).
        if eligibility::refusal(
            pod,
            &labels,
            &shared.settings.admission,
            shared.provider.cloud(),
            None,
        )
        .is_none()
        {
            eligible.push(waiting);
        }
    }
    let plan = plan::plan(&eligible, settings, now);
    let metrics = &shared.metrics;
    metrics
        .offload_waiting
        .set(i64::try_from(plan.waiting).unwrap_or(i64::MAX));
    metrics
        .offload_longest_wait
        .set(plan.longest_wait.as_secs_f64());
    for planned in &plan.moves {
        let Some(pod) = all
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(planned.uid.as_str()))
        else {
            continue;
        };
        match move_pod(shared, pod, planned).await {
            Ok(true) => {
                metrics
                    .offloaded
                    .get_or_create(&ReasonLabel {
                        reason: planned.reason.label(),
                    })
                    .inc();
                announce(shared, pod, planned).await;
            }
            Ok(false) => {}
            Err(error) => {
                warn!(pod = %planned.name, namespace = %planned.namespace, %error, "moving a waiting pod failed; tried again next round")
            }
        }
    }
}

/// The owning Job of a pod (ownerReference of kind Job in group batch).
fn owning_job(pod: &Pod) -> Option<ObjectRef<PartialObjectMeta<Job>>> {
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job" && o.api_version.starts_with("batch/"))?;
    Some(ObjectRef::new(&owner.name).within(pod.metadata.namespace.as_deref()?))
}

/// The pod's namespace's labels, read at most once a minute per namespace; none when it cannot
/// be read (the pod then counts as not opted in unless it opts in itself).
async fn namespace_labels<P>(
    shared: &Shared<P>,
    pod: &Pod,
    cache: &mut HashMap<String, (BTreeMap<String, String>, Timestamp)>,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let name = pod.metadata.namespace.clone().unwrap_or_default();
    if !eligibility::needs_namespace_labels(pod) {
        return BTreeMap::new();
    }
    if let Some((labels, at)) = cache.get(&name)
        && elapsed(*at, now) < NAMESPACE_TTL
    {
        return labels.clone();
    }
    let api: Api<Namespace> = Api::all(shared.client.clone());
    match api.get_metadata_opt(&name).await {
        Ok(found) => {
            let labels = found.and_then(|ns| ns.metadata.labels).unwrap_or_default();
            cache.insert(name, (labels.clone(), now));
            labels
        }
        Err(error) => {
            warn!(namespace = %name, %error, "reading a namespace's labels failed");
            BTreeMap::new()
        }
    }
}

/// Adds the virtual node's toleration and the outage tolerations, on the version of the pod
/// that was planned on. `Ok(false)`: the pod changed or went (bound locally, say): left alone.
#[instrument(skip_all, fields(pod = %planned.name, namespace = %planned.namespace, reason = planned.reason.label()))]
async fn move_pod<P: Provider>(
    shared: &Shared<P>,
    pod: &Pod,
    planned: &Move,
) -> Result<bool, kube::Error> {
    let mut tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    tolerations.push(plan::virtual_node_toleration(shared.provider.name()));
    if let Some(longer) = outage_tolerations(&tolerations, shared.settings.outage_grace) {
        tolerations = longer;
    }
    let patch = json!({
        "metadata": {"resourceVersion": pod.metadata.resource_version},
        "spec": {"tolerations": tolerations},
    });
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &planned.namespace);
    match api
        .patch(
            &planned.name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {
            info!(message = %planned.reason.message(shared.provider.cloud()), "moved a waiting pod to the virtual node");
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Events on the pod and on its Job saying why it moved.
async fn announce<P: Provider>(shared: &Shared<P>, pod: &Pod, planned: &Move) {
    let message = planned.reason.message(shared.provider.cloud());
    shared
        .event(&pod.object_ref(&()), false, "Offloaded", message.clone())
        .await;
    let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "Job" && o.api_version.starts_with("batch/"))
    else {
        return;
    };
    let job = ObjectReference {
        api_version: Some(owner.api_version.clone()),
        kind: Some("Job".into()),
        name: Some(owner.name.clone()),
        namespace: Some(planned.namespace.clone()),
        uid: Some(owner.uid.clone()),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Normal,
        reason: "Offloaded".into(),
        note: Some(format!("pod {}: {message}", planned.name)),
        action: "Offloaded".into(),
        secondary: None,
    };
    if let Err(error) = shared.recorder.publish(&event, &job).await {
        warn!(%error, "could not publish an Event on the Job");
    }
}
