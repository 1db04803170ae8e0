//! The network volume a burst pod mounts: its PersistentVolumeClaim, bound to a PV of this
//! project's StorageClass, names the volume and where it is.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use runpod_contract::volumes::{ATTRIBUTE_DATACENTER, PROVISIONER};

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
    let datacenter = csi.volume_attributes.as_ref()?.get(ATTRIBUTE_DATACENTER)?;
    Some(VolumeMount {
        volume_id: csi.volume_handle.clone(),
        path: path.to_owned(),
        datacenter: datacenter.clone(),
    })
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
}
