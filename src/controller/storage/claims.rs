//! The network volume a burst pod mounts: its PersistentVolumeClaim, bound to a PV of this
//! project's StorageClass, names the volume and where it is.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;
use runpod_contract::DATACENTER_IDS;
use runpod_contract::volumes::{PROVISIONER, pv_datacenter};

use crate::provider::VolumeMount;

/// Why a pod's claims cannot be its instance's network volume (the pod waits, with an Event).
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
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
}

/// The claim's PV as a mount at `path`; `Ok(None)` when the pod mounts no claim.
pub async fn mount_for(
    client: &kube::Client,
    namespace: &str,
    claims: &[(String, String)],
    cloud_has_volumes: bool,
) -> Result<Option<VolumeMount>, ClaimError> {
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
    mount_of(&pv, path).map(Some).ok_or(ClaimError::NotOurs {
        claim: claim.clone(),
        volume: volume_name,
    })
}

/// The mount a PV of ours stands for; `None` for any other PV.
pub fn mount_of(pv: &PersistentVolume, path: &str) -> Option<VolumeMount> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    if csi.driver != PROVISIONER {
        return None;
    }
    Some(VolumeMount {
        volume_id: csi.volume_handle.clone(),
        path: path.to_owned(),
        datacenter: pv_datacenter(pv)?,
    })
}

/// Of the pods that mount `claim`, the first created: the datacenters its
/// `runpod.io/datacenter-ids` allows (empty: any).
pub fn first_consumer_datacenters(pods: &[Pod], claim: &str) -> Vec<String> {
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
    fn only_a_pv_of_ours_is_a_mount() {
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
            mount_of(&ours, "/data"),
            Some(VolumeMount {
                volume_id: "vol1".into(),
                path: "/data".into(),
                datacenter: "EU-RO-1".into()
            })
        );
        let nfs: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "nfs"},
            "spec": {"nfs": {"server": "s", "path": "/"}}
        }))
        .unwrap();
        assert_eq!(mount_of(&nfs, "/data"), None);
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
        let pods = [
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
