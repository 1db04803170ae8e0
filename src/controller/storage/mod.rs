//! PersistentVolumeClaims of this project's StorageClass become the cloud's network volumes:
//! the leader of the node a claim is for (the scheduler's `selected-node` of a
//! `WaitForFirstConsumer` claim, or the class's `node`) creates the volume, once, and a PV
//! pre-bound to the claim with affinity to its node. No CSI node plugin is needed: only the
//! virtual node consumes these volumes, and its instances mount them at create.
//!
//! A volume is named from the claim's UID and found again by that name: before any create the
//! volumes are listed, and a claim whose create was sent (its annotation) is not created again
//! until the settle time has passed with no such volume listed, so a lost answer, a crash or a
//! new leader never makes a second one.

pub(crate) mod claims;
mod resize;

use std::collections::BTreeMap;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Resource};
use runpod_contract::volumes::{
    self as contract, ClassParams, PROVISIONER, SELECTED_NODE, VOLUME_CREATE_REQUESTED,
};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::controller::clock::elapsed;
use crate::controller::context::Shared;
use crate::provider::{NetworkVolume, Provider, VolumeRequest};
use runpod_contract::budget::ledger::{Stored, storage_key};

/// Every this many passes, this cluster's volumes that no claim or PV names are looked for.
const ORPHAN_CHECK_EVERY: u64 = 30;

/// Volumes of this cluster (by their name) that no live claim and no PV names: made for a claim
/// deleted before its PV existed, say. They bill storage; the spec wants them reported, never
/// deleted unasked (the claim's UID is in the name).
async fn report_orphans<P: Provider>(
    ctx: &Storage<P>,
    reported: &mut std::collections::HashSet<String>,
) -> Result<(), String> {
    let prefix = contract::volume_name(&ctx.settings.cluster_id, "");
    let volumes = ctx
        .provider
        .list_volumes()
        .await
        .map_err(|e| e.to_string())?;
    let ours: Vec<&NetworkVolume> = volumes
        .iter()
        .filter(|v| v.name.starts_with(&prefix))
        .collect();
    if ours.is_empty() {
        return Ok(());
    }
    let claims = Api::<PersistentVolumeClaim>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?
        .items;
    for volume in orphans(&ours, &prefix, &claims, &pvs) {
        if reported.insert(volume.id.clone()) {
            warn!(
                volume = %volume.id, name = %volume.name, datacenter = %volume.datacenter,
                size_gb = volume.size_gb,
                cloud = ctx.provider.cloud().title,
                "network volume of this cluster that no claim or PV names; it bills storage until deleted at the cloud"
            );
        }
    }
    Ok(())
}

/// The volumes among `ours` whose claim UID (after `prefix`) no claim has and no PV names.
fn orphans<'a>(
    ours: &[&'a NetworkVolume],
    prefix: &str,
    claims: &[PersistentVolumeClaim],
    pvs: &[PersistentVolume],
) -> Vec<&'a NetworkVolume> {
    ours.iter()
        .copied()
        .filter(|volume| {
            let uid = volume.name.strip_prefix(prefix).unwrap_or_default();
            let claimed = claims
                .iter()
                .any(|c| c.metadata.uid.as_deref() == Some(uid));
            let named = pvs
                .iter()
                .any(|pv| claims::volume_of(pv).is_some_and(|(id, _)| id == volume.id));
            !claimed && !named
        })
        .collect()
}

/// How often an installation without storage RBAC is asked again.
const FORBIDDEN_RETRY: Duration = Duration::from_secs(300);

/// Looks for claims to provision every `reconcile_interval` (at least every 2 s).
pub(crate) async fn run<P: Provider>(shared: Arc<Shared<P>>) {
    if !shared.provider.network_volumes() {
        return;
    }
    let shared = Storage {
        shared,
        said: Mutex::new(HashSet::new()),
    };
    let every = shared
        .settings
        .reconcile_interval
        .max(Duration::from_secs(2));
    let mut said_forbidden = false;
    let mut reported = std::collections::HashSet::new();
    let mut pass: u64 = 0;
    loop {
        pass += 1;
        if pass % ORPHAN_CHECK_EVERY == 1
            && let Err(error) = report_orphans(&shared, &mut reported).await
        {
            debug!(%error, "looking for orphaned network volumes failed");
        }
        match once(&shared).await {
            Ok(()) => {}
            // The installation did not enable storage (chart `storage.runpod.enabled`): nothing
            // to provision; asked again now and then, in case it is enabled later.
            Err(kube::Error::Api(status)) if status.code == 403 => {
                if !said_forbidden {
                    info!(
                        "not allowed to read StorageClasses: network volumes are not provisioned"
                    );
                    said_forbidden = true;
                }
                tokio::time::sleep(FORBIDDEN_RETRY).await;
                continue;
            }
            Err(error) => debug!(%error, "looking for claims to provision failed"),
        }
        tokio::time::sleep(every).await;
    }
}

/// The storage loop's view of the leader: its shared state, and the Events it has said. Claims
/// and PVs are no pods, whose memory (where `Shared::event` keeps what was said) the list loop
/// clears at every list.
pub(super) struct Storage<P> {
    shared: Arc<Shared<P>>,
    said: Mutex<HashSet<String>>,
}

impl<P> std::ops::Deref for Storage<P> {
    type Target = Shared<P>;

    fn deref(&self) -> &Shared<P> {
        &self.shared
    }
}

/// Events said by one leader before the memory of them starts again (claims come and go).
const SAID_AT_MOST: usize = 10_000;

/// A class of ours: its parameters, reclaim policy and binding mode.
struct Class {
    params: ClassParams,
    reclaim: String,
    wait_for_consumer: bool,
}

async fn once<P: Provider>(ctx: &Storage<P>) -> Result<(), kube::Error> {
    let classes: BTreeMap<String, Result<Class, String>> =
        Api::<StorageClass>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|class| class.provisioner == PROVISIONER)
            .map(|class| {
                let name = class.metadata.name.clone().unwrap_or_default();
                let params = contract::class_params(&class.parameters.unwrap_or_default());
                (
                    name,
                    params.map(|params| Class {
                        params,
                        reclaim: class.reclaim_policy.unwrap_or_else(|| "Delete".to_owned()),
                        wait_for_consumer: class.volume_binding_mode.as_deref()
                            == Some("WaitForFirstConsumer"),
                    }),
                )
            })
            .collect();
    let pvs = reclaim(ctx).await?;
    if classes.is_empty() {
        return Ok(());
    }
    let (pending, bound): (Vec<PersistentVolumeClaim>, Vec<PersistentVolumeClaim>) =
        Api::<PersistentVolumeClaim>::all(ctx.client.clone())
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|pvc| pvc.metadata.deletion_timestamp.is_none())
            .partition(|pvc| pvc.spec.as_ref().is_some_and(|s| s.volume_name.is_none()));
    resize::grow(ctx, &bound, &pvs).await;
    let mut listed: Option<Vec<NetworkVolume>> = None;
    for pvc in pending {
        let Some(class_name) = pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()) else {
            continue;
        };
        let Some(class) = classes.get(&class_name) else {
            continue;
        };
        let class = match class {
            Ok(class) => class,
            Err(problem) => {
                say(ctx, &pvc, true, "ProvisioningFailed", problem.clone()).await;
                continue;
            }
        };
        if !for_this_node(&pvc, class, &ctx.settings.node_name) {
            continue;
        }
        if listed.is_none() {
            match ctx.provider.list_volumes().await {
                Ok(volumes) => listed = Some(volumes),
                Err(error) => {
                    warn!(%error, "listing network volumes failed");
                    return Ok(());
                }
            }
        }
        let volumes = listed.as_deref().unwrap_or_default();
        if let Err(problem) = provision(ctx, &pvc, &class_name, class, volumes).await {
            say(ctx, &pvc, true, "ProvisioningFailed", problem).await;
        }
    }
    Ok(())
}

/// Volumes whose claim is gone (their PV `Released`) under the `Delete` policy are deleted,
/// then their PV; the cloud refuses while an instance still mounts one, so it is tried again at
/// the next pass. Only the node the PV is pinned to does it. `Retain` keeps both.
async fn reclaim<P: Provider>(ctx: &Storage<P>) -> Result<Vec<PersistentVolume>, kube::Error> {
    let pvs = Api::<PersistentVolume>::all(ctx.client.clone());
    let listed = pvs.list(&ListParams::default()).await?.items;
    let stored = stored(&listed, &ctx.settings.node_name);
    let costs: BTreeMap<String, f64> = stored
        .iter()
        .map(|(namespace, volumes)| (namespace.clone(), volumes.values().map(|v| v.usd).sum()))
        .collect();
    ctx.metrics.volume_costs(&costs);
    // The budget sync writes them into the namespaces' ledgers at its next pass.
    ctx.budget.set_stored(stored);
    for pv in &listed {
        if let Some(notice) = retained_notice(pv, &ctx.settings.node_name) {
            // Once per leader: the Event's message is the same at every pass.
            say_of(ctx, pv.object_ref(&()), false, "VolumeRetained", notice).await;
            continue;
        }
        let Some(volume_id) = released_for_deletion(pv, &ctx.settings.node_name) else {
            continue;
        };
        let name = pv.metadata.name.clone().unwrap_or_default();
        match ctx.provider.delete_volume(&volume_id).await {
            Ok(_) => {
                info!(volume = %volume_id, pv = %name, "network volume deleted with its claim");
                match pvs.delete(&name, &Default::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(error) => return Err(error),
                }
            }
            Err(error) => debug!(volume = %volume_id, %error, "network volume not deleted yet"),
        }
    }
    Ok(listed)
}

/// The volumes of this node's PVs and what each costs per hour, by their claims' namespaces
/// (a `Released` PV under `Retain` still stores, and still bills).
fn stored(pvs: &[PersistentVolume], node: &str) -> crate::controller::budget::state::Stored {
    let mut stored = crate::controller::budget::state::Stored::new();
    for pv in pvs.iter().filter(|pv| pinned_to(pv, node)) {
        let (Some(spec), Some(name)) = (pv.spec.as_ref(), pv.metadata.name.as_deref()) else {
            continue;
        };
        let gb = spec
            .capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .and_then(|q| contract::size_gb(&q.0).ok());
        let claim = spec.claim_ref.as_ref();
        let namespace = claim.and_then(|c| c.namespace.clone());
        if let (Some(gb), Some(namespace)) = (gb, namespace) {
            let line = Stored {
                claim: claim.and_then(|c| c.name.clone()).unwrap_or_default(),
                usd: contract::cost_per_hour(gb),
            };
            stored
                .entry(namespace)
                .or_default()
                .insert(storage_key(name), line);
        }
    }
    stored
}

/// Whether `pv` is one of ours, pinned to `node`.
pub(super) fn pinned_to(pv: &PersistentVolume, node: &str) -> bool {
    let Some(spec) = pv.spec.as_ref() else {
        return false;
    };
    spec.csi
        .as_ref()
        .is_some_and(|csi| csi.driver == PROVISIONER)
        && spec
            .node_affinity
            .as_ref()
            .and_then(|a| a.required.as_ref())
            .is_some_and(|required| {
                required.node_selector_terms.iter().any(|term| {
                    term.match_expressions
                        .iter()
                        .flatten()
                        .any(|e| e.values.iter().flatten().any(|v| v == node))
                })
            })
}

/// The volume id of a PV of ours, pinned to `node`, released by its claim under `Delete`.
fn released_for_deletion(pv: &PersistentVolume, node: &str) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref()?;
    let delete = spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete");
    (released(pv) && delete && pinned_to(pv, node)).then(|| csi.volume_handle.clone())
}

/// Whether the PV's claim is gone.
fn released(pv: &PersistentVolume) -> bool {
    pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
}

/// What to say of a PV of this node whose claim is gone under `Retain`: its volume stays, and
/// bills, until someone deletes it (`None` for any other PV).
fn retained_notice(pv: &PersistentVolume, node: &str) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    let volume = &spec.csi.as_ref()?.volume_handle;
    let retain = spec.persistent_volume_reclaim_policy.as_deref() == Some("Retain");
    if !(released(pv) && retain && pinned_to(pv, node)) {
        return None;
    }
    let claim = spec
        .claim_ref
        .as_ref()
        .map(|c| {
            format!(
                "{}/{}",
                c.namespace.as_deref().unwrap_or_default(),
                c.name.as_deref().unwrap_or_default()
            )
        })
        .unwrap_or_else(|| "its claim".to_owned());
    let gb = spec
        .capacity
        .as_ref()
        .and_then(|c| c.get("storage"))
        .and_then(|q| contract::size_gb(&q.0).ok());
    let cost = gb.map_or(String::new(), |gb| {
        format!(" ({gb} GB, {:.4} USD/h)", contract::cost_per_hour(gb))
    });
    Some(format!(
        "claim {claim} is gone; network volume {volume} is kept (reclaimPolicy Retain) and bills \
         storage{cost} until you delete it in the cloud's console, then this PV"
    ))
}

/// Whether this node provisions the claim: the scheduler chose it for the claim's first pod,
/// or (bound at once, with a datacenter) the class names it.
fn for_this_node(pvc: &PersistentVolumeClaim, class: &Class, node: &str) -> bool {
    if class.wait_for_consumer {
        return pvc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SELECTED_NODE))
            .is_some_and(|selected| selected == node);
    }
    class.params.datacenter.is_some() && class.params.node.as_deref() == Some(node)
}

/// Finds or creates the claim's volume, then its PV.
async fn provision<P: Provider>(
    ctx: &Storage<P>,
    pvc: &PersistentVolumeClaim,
    class_name: &str,
    class: &Class,
    volumes: &[NetworkVolume],
) -> Result<(), String> {
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    let namespace = pvc.metadata.namespace.clone().unwrap_or_default();
    let claim = pvc.metadata.name.clone().unwrap_or_default();
    let name = contract::volume_name(&ctx.settings.cluster_id, &uid);
    let request = resize::requested(pvc).ok_or("the claim requests no storage")?;
    let size_gb = contract::size_gb(&request)?;
    let volume = match volumes.iter().find(|v| v.name == name) {
        Some(found) => found.clone(),
        None => match create_volume(ctx, pvc, class, &name, size_gb).await? {
            Some(made) => made,
            None => return Ok(()),
        },
    };
    let access_modes = pvc
        .spec
        .as_ref()
        .and_then(|s| s.access_modes.clone())
        .unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
    let pv: PersistentVolume = serde_json::from_value(contract::persistent_volume(
        &namespace,
        &claim,
        &uid,
        class_name,
        &access_modes,
        &class.reclaim,
        &volume.id,
        &volume.datacenter,
        volume.size_gb.max(size_gb),
        &ctx.settings.node_name,
    ))
    .map_err(|e| e.to_string())?;
    match Api::<PersistentVolume>::all(ctx.client.clone())
        .create(&PostParams::default(), &pv)
        .await
    {
        Ok(_) => {
            say(
                ctx,
                pvc,
                false,
                "ProvisioningSucceeded",
                format!(
                    "{} network volume {} ({} GB in {}) is PersistentVolume pvc-{uid}",
                    ctx.provider.cloud().title,
                    volume.id,
                    volume.size_gb,
                    volume.datacenter
                ),
            )
            .await;
            Ok(())
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(error) => Err(format!("creating PersistentVolume pvc-{uid}: {error}")),
    }
}

/// Creates the claim's volume, its create recorded on the claim first; `None` while an earlier
/// create, not listed yet, may still show up (its answer may have been lost).
async fn create_volume<P: Provider>(
    ctx: &Storage<P>,
    pvc: &PersistentVolumeClaim,
    class: &Class,
    name: &str,
    size_gb: u32,
) -> Result<Option<NetworkVolume>, String> {
    let namespace = pvc.metadata.namespace.clone().unwrap_or_default();
    let claim = pvc.metadata.name.clone().unwrap_or_default();
    let sent = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VOLUME_CREATE_REQUESTED))
        .and_then(|at| at.parse::<Timestamp>().ok());
    if sent.is_some_and(|at| elapsed(at, Timestamp::now()) < ctx.settings.create_settle) {
        return Ok(None);
    }
    let datacenter = match class.params.datacenter.clone() {
        Some(datacenter) => datacenter,
        None => {
            let wanted = consumers_datacenters(ctx, &namespace, &claim).await;
            ctx.provider
                .default_volume_datacenter(&wanted)
                .await
                .ok_or_else(|| {
                    if wanted.is_empty() {
                        "no datacenter for the volume: set the StorageClass parameter dataCenter"
                            .to_owned()
                    } else {
                        format!(
                            "the pods of this claim allow only datacenter(s) {}, which this \
                             installation does not (its --datacenter-ids)",
                            wanted.join(", ")
                        )
                    }
                })?
        }
    };
    let marker = json!({"metadata": {"annotations": {
        VOLUME_CREATE_REQUESTED: Timestamp::now().to_string()
    }}});
    Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
        .patch(&claim, &PatchParams::default(), &Patch::Merge(&marker))
        .await
        .map_err(|e| format!("recording the volume's create on the claim: {e}"))?;
    let made = ctx
        .provider
        .create_volume(&VolumeRequest {
            name: name.to_owned(),
            size_gb,
            datacenter,
            tier: class.params.tier.clone(),
        })
        .await
        .map_err(|e| format!("creating network volume {name}: {e}"))?;
    info!(volume = %made.id, claim = %claim, namespace = %namespace, "network volume created");
    Ok(Some(made))
}

/// The datacenters the claim's first pod (by creation) allows through
/// `runpod.io/datacenter-ids` (the webhook writes a Job's value on its pods); empty when it
/// says nothing or the pods cannot be read, so the volume goes where the installation's go.
async fn consumers_datacenters<P: Provider>(
    ctx: &Storage<P>,
    namespace: &str,
    claim: &str,
) -> Vec<String> {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(ctx.client.clone(), namespace);
    let listed = match pods.list(&ListParams::default()).await {
        Ok(listed) => listed.items,
        Err(error) => {
            debug!(%error, claim, "reading the claim's pods failed; its volume goes where the installation's go");
            return Vec::new();
        }
    };
    claims::first_consumer_datacenters(&listed, claim)
}

/// An Event on the claim (each message once per leader).
async fn say<P: Provider>(
    ctx: &Storage<P>,
    pvc: &PersistentVolumeClaim,
    warning: bool,
    reason: &str,
    message: String,
) {
    say_of(ctx, pvc.object_ref(&()), warning, reason, message).await;
}

/// An Event on a claim or PV, each message once per object and leader.
async fn say_of<P: Provider>(
    ctx: &Storage<P>,
    about: ObjectReference,
    warning: bool,
    reason: &str,
    message: String,
) {
    let key = format!(
        "{}\u{0}{reason}\u{0}{message}",
        about.uid.as_deref().unwrap_or_default()
    );
    {
        let mut said = ctx.said.lock().unwrap_or_else(PoisonError::into_inner);
        if said.len() >= SAID_AT_MOST {
            said.clear();
        }
        if !said.insert(key) {
            return;
        }
    }
    if about.namespace.is_some() {
        ctx.event_as(&about, warning, (reason, reason), message)
            .await;
    } else {
        cluster_scoped_event(ctx, about, warning, reason, message).await;
    }
}

/// An Event on a cluster-scoped object (a PV), written as a core/v1 Event in `default`: the
/// recorder's events.k8s.io Events of such objects must live in `kube-system` on older
/// apiservers, where `kubectl describe pv` does not look for them.
async fn cluster_scoped_event<P: Provider>(
    ctx: &Storage<P>,
    about: ObjectReference,
    warning: bool,
    reason: &str,
    message: String,
) {
    use k8s_openapi::api::core::v1::{Event, EventSource};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    let now = Time(Timestamp::now());
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", about.name.as_deref().unwrap_or("object"))),
            namespace: Some("default".to_owned()),
            ..ObjectMeta::default()
        },
        involved_object: about,
        reason: Some(reason.to_owned()),
        message: Some(message),
        type_: Some(if warning { "Warning" } else { "Normal" }.to_owned()),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        source: Some(EventSource {
            component: Some("runpod-kubelet".to_owned()),
            host: Some(ctx.settings.node_name.clone()),
        }),
        ..Event::default()
    };
    let events = Api::<Event>::namespaced(ctx.client.clone(), "default");
    if let Err(error) = events.create(&PostParams::default(), &event).await {
        warn!(reason, %error, "could not publish an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(phase: &str, reclaim: &str, node: &str) -> PersistentVolume {
        let mut value = contract::persistent_volume(
            "ns",
            "data",
            "u1",
            "runpod-network",
            &["ReadWriteOnce".into()],
            reclaim,
            "vol1",
            "EU-RO-1",
            20,
            node,
        );
        value["status"] = json!({"phase": phase});
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_a_released_delete_volume_of_this_node_is_deleted() {
        assert_eq!(
            released_for_deletion(&pv("Released", "Delete", "vr"), "vr"),
            Some("vol1".to_owned())
        );
        assert_eq!(
            released_for_deletion(&pv("Bound", "Delete", "vr"), "vr"),
            None
        );
        assert_eq!(
            released_for_deletion(&pv("Released", "Retain", "vr"), "vr"),
            None
        );
        assert_eq!(
            released_for_deletion(&pv("Released", "Delete", "other"), "vr"),
            None
        );
    }

    #[test]
    fn a_retained_volume_is_said_to_stay_and_bill() {
        let notice = retained_notice(&pv("Released", "Retain", "vr"), "vr").unwrap();
        assert!(
            notice.contains("vol1") && notice.contains("ns/data") && notice.contains("20 GB"),
            "{notice}"
        );
        assert_eq!(retained_notice(&pv("Bound", "Retain", "vr"), "vr"), None);
        assert_eq!(retained_notice(&pv("Released", "Delete", "vr"), "vr"), None);
        assert_eq!(
            retained_notice(&pv("Released", "Retain", "other"), "vr"),
            None
        );
    }

    #[test]
    fn stored_volumes_add_up_per_namespace_on_this_node() {
        let named = |name: &str, phase: &str, reclaim: &str, node: &str| {
            let mut pv = pv(phase, reclaim, node);
            pv.metadata.name = Some(name.to_owned());
            pv
        };
        let stored = stored(
            &[
                named("pv-a", "Bound", "Delete", "vr"),
                // Retained after its claim went: it still stores, and bills.
                named("pv-b", "Released", "Retain", "vr"),
                named("pv-c", "Bound", "Delete", "other"),
            ],
            "vr",
        );
        let each = 20.0 * 0.07 / 720.0;
        assert_eq!(stored.len(), 1);
        let volumes = &stored["ns"];
        assert_eq!(
            volumes.keys().cloned().collect::<Vec<_>>(),
            [storage_key("pv-a"), storage_key("pv-b")]
        );
        let total: f64 = volumes.values().map(|v| v.usd).sum();
        assert!((total - 2.0 * each).abs() < 1e-12, "{stored:?}");
        assert_eq!(volumes[&storage_key("pv-a")].claim, "data");
    }

    #[test]
    fn a_volume_no_claim_or_pv_names_is_an_orphan() {
        let volume = |id: &str, uid: &str| NetworkVolume {
            id: id.into(),
            name: contract::volume_name("c1", uid),
            size_gb: 10,
            datacenter: "EU-RO-1".into(),
            tier: None,
        };
        let (claimed, named, lost) = (
            volume("v1", "u-claim"),
            volume("vol1", "u-pv"),
            volume("v3", "u-gone"),
        );
        let claim: PersistentVolumeClaim =
            serde_json::from_value(json!({"metadata": {"name": "c", "uid": "u-claim"}})).unwrap();
        let found = orphans(
            &[&claimed, &named, &lost],
            &contract::volume_name("c1", ""),
            &[claim],
            &[pv("Bound", "Delete", "vr")],
        );
        assert_eq!(
            found.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["v3"]
        );
    }

    #[test]
    fn a_claim_is_this_nodes_when_the_scheduler_or_the_class_says_so() {
        let claim = |selected: Option<&str>| -> PersistentVolumeClaim {
            let annotations = selected
                .map(|node| json!({SELECTED_NODE: node}))
                .unwrap_or(json!({}));
            serde_json::from_value(json!({"metadata": {"name": "c", "annotations": annotations}}))
                .unwrap()
        };
        let waiting = Class {
            params: ClassParams::default(),
            reclaim: "Delete".into(),
            wait_for_consumer: true,
        };
        assert!(for_this_node(&claim(Some("vr")), &waiting, "vr"));
        assert!(!for_this_node(&claim(Some("other")), &waiting, "vr"));
        assert!(!for_this_node(&claim(None), &waiting, "vr"));
        let immediate = Class {
            params: ClassParams {
                datacenter: Some("EU-RO-1".into()),
                tier: None,
                node: Some("vr".into()),
            },
            reclaim: "Delete".into(),
            wait_for_consumer: false,
        };
        assert!(for_this_node(&claim(None), &immediate, "vr"));
        assert!(!for_this_node(&claim(None), &immediate, "other"));
    }
}
