//! A claim of ours that asks for more storage than its volume has (the class allows
//! expansion) grows the volume (the cloud never shrinks one), then its PV and the claim's status,
//! as an external resizer does. A crash in between sends the same size again, which changes
//! nothing at the cloud.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{Patch, PatchParams};
use runpod_contract::volumes as contract;
use serde_json::json;
use tracing::info;

use super::Storage;
use super::{pinned_to, say};
use crate::provider::Provider;

/// What to grow: the volume, and the sizes (GB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Growth {
    pub volume_id: String,
    pub from_gb: u32,
    pub to_gb: u32,
}

/// The growth a bound claim asks of its PV on `node`, if any.
pub(super) fn wanted(
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    node: &str,
) -> Option<Growth> {
    if !pinned_to(pv, node) {
        return None;
    }
    let requested = pvc
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")?;
    let spec = pv.spec.as_ref()?;
    let has = spec.capacity.as_ref()?.get("storage")?;
    let to_gb = contract::size_gb(&requested.0).ok()?;
    let from_gb = contract::size_gb(&has.0).ok()?;
    (to_gb > from_gb).then(|| Growth {
        volume_id: spec
            .csi
            .as_ref()
            .map(|c| c.volume_handle.clone())
            .unwrap_or_default(),
        from_gb,
        to_gb,
    })
}

/// The claim's storage request, as written.
pub(super) fn requested(pvc: &PersistentVolumeClaim) -> Option<String> {
    let requests = pvc.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    requests.get("storage").map(|q| q.0.clone())
}

/// Grows every bound claim's volume that asks for more.
pub(super) async fn grow<P: Provider>(
    ctx: &Storage<P>,
    bound: &[PersistentVolumeClaim],
    pvs: &[PersistentVolume],
) {
    for pvc in bound {
        let Some(pv) = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .and_then(|name| {
                pvs.iter()
                    .find(|pv| pv.metadata.name.as_deref() == Some(name))
            })
        else {
            continue;
        };
        // A size the cloud cannot have is said, not sent.
        if let Some(Err(problem)) = requested(pvc).map(|q| contract::size_gb(&q))
            && pinned_to(pv, &ctx.settings.node_name)
        {
            say(ctx, pvc, true, "VolumeResizeFailed", problem).await;
            continue;
        }
        let Some(growth) = wanted(pvc, pv, &ctx.settings.node_name) else {
            continue;
        };
        match apply(ctx, pvc, pv, &growth).await {
            Ok(()) => {
                info!(volume = %growth.volume_id, from_gb = growth.from_gb, to_gb = growth.to_gb, "network volume grown");
                say(
                    ctx,
                    pvc,
                    false,
                    "VolumeResizeSuccessful",
                    format!(
                        "{} network volume {} grew from {} GB to {} GB",
                        ctx.provider.cloud().title,
                        growth.volume_id,
                        growth.from_gb,
                        growth.to_gb
                    ),
                )
                .await;
            }
            Err(problem) => say(ctx, pvc, true, "VolumeResizeFailed", problem).await,
        }
    }
}

async fn apply<P: Provider>(
    ctx: &Storage<P>,
    pvc: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    growth: &Growth,
) -> Result<(), String> {
    ctx.provider
        .resize_volume(&growth.volume_id, growth.to_gb)
        .await
        .map_err(|e| format!("growing network volume {}: {e}", growth.volume_id))?;
    let capacity = json!({"storage": format!("{}G", growth.to_gb)});
    Api::<PersistentVolume>::all(ctx.client.clone())
        .patch(
            pv.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"capacity": capacity}})),
        )
        .await
        .map_err(|e| format!("recording the new size on the PV: {e}"))?;
    Api::<PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        pvc.metadata.namespace.as_deref().unwrap_or_default(),
    )
    .patch_status(
        pvc.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"capacity": capacity}})),
    )
    .await
    .map_err(|e| format!("recording the new size on the claim: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(gb: u32, node: &str) -> PersistentVolume {
        serde_json::from_value(contract::persistent_volume(
            "ns",
            "data",
            "u1",
            "runpod-network",
            &["ReadWriteOnce".into()],
            "Delete",
            "vol1",
            "EU-RO-1",
            gb,
            node,
        ))
        .unwrap()
    }

    fn claim(size: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "data"},
            "spec": {"volumeName": "pvc-u1", "resources": {"requests": {"storage": size}}}}))
        .unwrap()
    }

    #[test]
    fn a_claim_asking_for_more_grows_its_volume_and_never_shrinks_it() {
        assert_eq!(
            wanted(&claim("30G"), &pv(20, "vr"), "vr"),
            Some(Growth {
                volume_id: "vol1".into(),
                from_gb: 20,
                to_gb: 30
            })
        );
        assert_eq!(
            wanted(&claim("20G"), &pv(20, "vr"), "vr"),
            None,
            "same size"
        );
        assert_eq!(
            wanted(&claim("10G"), &pv(20, "vr"), "vr"),
            None,
            "never shrunk"
        );
        assert_eq!(
            wanted(&claim("30G"), &pv(20, "other"), "vr"),
            None,
            "another node's"
        );
    }
}
