//! The network volume a burst pod mounts: its PersistentVolumeClaim, bound to a PV of this
//! project's StorageClass, names the volume and where it is.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use runpod_contract::DATACENTER_IDS;
use runpod_contract::volumes::{PROVISIONER, VOLUME_ID, pv_datacenter};

use crate::provider::{Provider, VolumeMount};

/// Why a pod's claims cannot be its instance's network volume (the pod waits, with an Event).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClaimError {
    #[error(
        "the pod mounts {0} PersistentVolumeClaims; a burst pod mounts at most one network volume"
    )]
    TooMany(usize),
    #[error("this cloud has no network volumes for PersistentVolumeClaim {0}")]
    NoVolumes(String),
    #[error("PersistentVolumeClaim {0} is not bound yet")]
    NotBound(String),
    #[error(
        "PersistentVolumeClaim {claim} is bound to {volume}, which is not a network volume \
         (StorageClass provisioner {PROVISIONER})"
    )]
    NotOurs { claim: String, volume: String },
    #[error("reading PersistentVolumeClaim {claim}: {source}")]
    Api { claim: String, source: kube::Error },
    #[error(
        "PersistentVolumeClaim {claim} names network volume {volume_id}, which the cloud does \
         not list: {reason}"
    )]
    Unknown {
        claim: String,
        volume_id: String,
        reason: String,
    },
}

/// The claim's PV as a mount at `path`; `Ok(None)` when the pod mounts no claim.
pub(crate) async fn mount_for<P: Provider>(
    client: &kube::Client,
    provider: &P,
    namespace: &str,
    claims: &[(String, String)],
) -> Result<Option<VolumeMount>, ClaimError> {
    let cloud_has_volumes = provider.network_volumes();
    let (claim, path) = match claims {
        [] => return Ok(None),
        [one] => one,
        many => return Err(ClaimError::TooMany(many.len())),
    };
    if !cloud_has_volumes {
        return Err(ClaimError::NoVolumes(claim.clone()));
    }
    let api_error = |source| ClaimError::Api {
        claim: claim.clone(),
        source,
    };
    let pvc = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .get(claim)
        .await
        .map_err(api_error)?;
    let Some(volume_name) = pvc.spec.and_then(|spec| spec.volume_name) else {
        return Err(ClaimError::NotBound(claim.clone()));
    };
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume_name)
        .await
        .map_err(api_error)?;
    let Some((volume_id, datacenter)) = volume_of(&pv) else {
        return Err(ClaimError::NotOurs {
            claim: claim.clone(),
            volume: volume_name,
        });
    };
    // A PV that names its volume but not where it is (only the annotation): the cloud says.
    let datacenter = match datacenter {
        Some(datacenter) => datacenter,
        None => {
            let unknown = |reason: String| ClaimError::Unknown {
                claim: claim.clone(),
                volume_id: volume_id.clone(),
                reason,
            };
            provider
                .list_volumes()
                .await
                .map_err(|error| unknown(error.to_string()))?
                .into_iter()
                .find(|volume| volume.id == volume_id)
                .map(|volume| volume.datacenter)
                .ok_or_else(|| unknown("no volume has that id".to_owned()))?
        }
    };
    Ok(Some(VolumeMount {
        volume_id,
        path: path.clone(),
        datacenter,
    }))
}

/// The network volume a PV names, and its datacenter when the PV says: this project's CSI
/// driver (`csi.volumeHandle`, `csi.volumeAttributes.dataCenter`), else the annotation
/// `runpod.io/network-volume-id` alone (a PV written by hand).
pub(crate) fn volume_of(pv: &PersistentVolume) -> Option<(String, Option<String>)> {
    if let Some(csi) = pv.spec.as_ref().and_then(|spec| spec.csi.as_ref())
        && csi.driver == PROVISIONER
    {
        return Some((csi.volume_handle.clone(), pv_datacenter(pv)));
    }
    let id = pv.metadata.annotations.as_ref()?.get(VOLUME_ID)?.trim();
    (!id.is_empty()).then(|| (id.to_owned(), None))
}

/// Of the pods that mount `claim`, the first created: the datacenters its
/// `runpod.io/datacenter-ids` allows (empty: any).
pub(crate) fn first_consumer_datacenters(pods: &[Pod], claim: &str) -> Vec<String> {
    // A finished or leaving pod is no consumer (it may even be of an earlier claim of the name).
    let live = |pod: &&Pod| {
        pod.metadata.deletion_timestamp.is_none()
            && !matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
    };
    let mounts = |pod: &&Pod| {
        pod.spec.as_ref().is_some_and(|spec| {
            spec.volumes.iter().flatten().any(|volume| {
                volume
                    .persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == claim)
            })
        })
    };
    pods.iter()
        .filter(live)
        .filter(mounts)
        .min_by_key(|pod| pod.metadata.creation_timestamp.as_ref().map(|t| t.0))
        .and_then(|pod| pod.metadata.annotations.as_ref()?.get(DATACENTER_IDS))
        .and_then(|value| runpod_contract::split_list(value).ok())
        .map(|ids| ids.into_iter().map(str::to_owned).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pv_names_its_volume_by_our_driver_or_the_annotation() {
        let ours: PersistentVolume =
            serde_json::from_value(runpod_contract::volumes::persistent_volume(
                "ns",
                "data",
                "u1",
                "runpod-network",
                &["ReadWriteOnce".into()],
                "Delete",
                "vol1",
                "EU-RO-1",
                20,
                "virtual-runpod",
            ))
            .unwrap();
        assert_eq!(
            volume_of(&ours),
            Some(("vol1".to_owned(), Some("EU-RO-1".to_owned())))
        );
        // Written by hand, naming the volume by the annotation only: where it is, the cloud
        // says.
        let annotated: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "by-hand", "annotations": {VOLUME_ID: " vol2 "}},
            "spec": {"hostPath": {"path": "/unused"}}
        }))
        .unwrap();
        assert_eq!(volume_of(&annotated), Some(("vol2".to_owned(), None)));
        let nfs: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nfs"},
            "spec": {"nfs": {"server": "s", "path": "/"}}
        }))
        .unwrap();
        assert_eq!(volume_of(&nfs), None);
    }

    /// A claim's volume goes where its first pod may run (issue 46).
    #[test]
    fn the_first_pod_of_a_claim_says_where_its_volume_may_go() {
        let pod = |name: &str, created: &str, claim: &str, ids: Option<&str>| -> Pod {
            let mut value = serde_json::json!({
                "metadata": {"name": name, "creationTimestamp": created},
                "spec": {"containers": [{"name": "c"}], "volumes": [
                    {"name": "v", "persistentVolumeClaim": {"claimName": claim}}
                ]}
            });
            if let Some(ids) = ids {
                value["metadata"]["annotations"] = serde_json::json!({DATACENTER_IDS: ids});
            }
            serde_json::from_value(value).unwrap()
        };
        let mut done = pod("done", "2026-11-29T08:00:00Z", "data", Some("CA-MTL-1"));
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let pods = [
            done,
            pod("later", "2026-11-29T10:00:05Z", "data", Some("US-TX-3")),
            pod("other", "2026-11-29T09:00:00Z", "scratch", Some("CA-MTL-1")),
            pod(
                "first",
                "2026-11-29T10:00:00Z",
                "data",
                Some("EU-RO-1, EU-SE-1"),
            ),
        ];
        assert_eq!(
            first_consumer_datacenters(&pods, "data"),
            ["EU-RO-1", "EU-SE-1"]
        );
        assert!(first_consumer_datacenters(&pods, "missing").is_empty());
        let silent = [pod("p", "2026-11-29T10:00:00Z", "data", None)];
        assert!(first_consumer_datacenters(&silent, "data").is_empty());
    }
}
