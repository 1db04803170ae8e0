//! RunPod's network volumes in the seam's terms, and what a pod mounting one is sent.

use serde_json::{Value, json};

use crate::provider::{NetworkVolume, VolumeMount, VolumeRequest};
use crate::runpod::select::Candidate;
use crate::runpod::volumes::{self as api, CreateVolume};

pub(super) fn from_runpod(volume: api::NetworkVolume) -> NetworkVolume {
    NetworkVolume {
        id: volume.id,
        name: volume.name,
        size_gb: volume.size,
        datacenter: volume.data_center,
        tier: volume.tier,
    }
}

pub(super) fn create_body(request: &VolumeRequest) -> CreateVolume<'_> {
    CreateVolume {
        name: &request.name,
        size: request.size_gb,
        data_center: &request.datacenter,
        tier: request.tier.as_deref(),
    }
}

/// `mounts` of a create: the one network volume at the container's path.
pub(super) fn mounts(mount: &VolumeMount) -> Value {
    json!({"network": [{"volumeId": mount.volume_id, "path": mount.path}]})
}

/// The datacenter where the most Secure Cloud GPU types have stock (ties: the first by id),
/// among `among` (empty: any).
pub(super) fn best_stocked(
    catalogue: &crate::runpod::catalogue::Catalogue,
    among: &[String],
) -> Option<String> {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for gpu in catalogue.gpus(runpod_contract::CloudType::Secure) {
        for stock in gpu
            .data_centers
            .iter()
            .filter(|s| s.availability != crate::runpod::catalogue::Availability::None)
            .filter(|s| among.is_empty() || among.contains(&s.id))
        {
            *counts.entry(stock.id.as_str()).or_default() += 1;
        }
    }
    let best = counts.values().copied().max()?;
    counts
        .into_iter()
        .find(|(_, count)| *count == best)
        .map(|(id, _)| id.to_owned())
}

/// The candidates that can run where the volume is: Secure Cloud, in its datacenter (a
/// candidate that lets RunPod choose is sent there).
pub(super) fn pinned(candidates: Vec<Candidate>, datacenter: &str) -> Vec<Candidate> {
    candidates
        .into_iter()
        .filter(|c| c.cloud == runpod_contract::CloudType::Secure)
        .filter(|c| {
            c.data_center_ids.is_empty() || c.data_center_ids.iter().any(|d| d == datacenter)
        })
        .map(|mut c| {
            c.data_center_ids = vec![datacenter.to_owned()];
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(cloud: runpod_contract::CloudType, dcs: &[&str]) -> Candidate {
        Candidate {
            gpu_id: "NVIDIA GeForce RTX 4090".into(),
            gpu_count: 1,
            memory_gb: Some(24),
            cloud,
            data_center_ids: dcs.iter().map(|d| (*d).to_owned()).collect(),
            price_per_gpu: 0.5,
            price_per_hour: 0.5,
        }
    }

    #[test]
    fn a_pod_with_a_volume_goes_only_where_the_volume_is() {
        use runpod_contract::CloudType::{Community, Secure};
        let kept = pinned(
            vec![
                candidate(Secure, &["US-TX-3", "EU-RO-1"]),
                candidate(Secure, &["US-TX-3"]),
                candidate(Community, &["EU-RO-1"]),
                candidate(Secure, &[]),
            ],
            "EU-RO-1",
        );
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().all(|c| c.data_center_ids == ["EU-RO-1"]));
        let mount = VolumeMount {
            volume_id: "v1".into(),
            path: "/data".into(),
            datacenter: "EU-RO-1".into(),
        };
        assert_eq!(
            mounts(&mount),
            json!({"network": [{"volumeId": "v1", "path": "/data"}]})
        );
    }
}
