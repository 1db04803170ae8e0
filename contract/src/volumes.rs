//! Persistent volumes on RunPod network volumes: the StorageClass this project provisions, how
//! a claim's size and parameters become a volume, and the PersistentVolume that stands for it.
//! Shared by the webhook (which pods may mount such a claim) and the controller (which
//! provisions them and mounts them into its pods' instances).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// The StorageClass `provisioner` (and the PVs' CSI driver name) of RunPod network volumes.
pub const PROVISIONER: &str = "network-volume.runpod.io";
/// The chart's StorageClass name.
pub const CLASS_NAME: &str = "runpod-network";
/// PV annotation naming the volume (also its `csi.volumeHandle`).
pub const VOLUME_ID: &str = "runpod.io/network-volume-id";
/// Claim annotation: when the controller sent the volume's create (RFC 3339), so that a
/// restarted or new leader looks for it before it ever creates another.
pub const VOLUME_CREATE_REQUESTED: &str = "runpod.io/volume-create-requested";
/// The scheduler's annotation on a `WaitForFirstConsumer` claim: the node its first pod goes to.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// StorageClass parameters.
pub const PARAM_DATACENTER: &str = "dataCenter";
pub const PARAM_TYPE: &str = "type";
pub const PARAM_NODE: &str = "node";
/// The volume attribute of the PV that says where the volume is.
pub const ATTRIBUTE_DATACENTER: &str = "dataCenter";

/// RunPod's smallest and largest network volume, GB.
pub const MIN_GB: u32 = 10;
pub const MAX_GB: u32 = 4096;
/// USD per GB-month, and the hours of that month: a volume's hourly storage cost.
pub const PRICE_PER_GB_MONTH: f64 = 0.07;
const MONTH_HOURS: f64 = 720.0;

/// A StorageClass's parameters, read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassParams {
    /// Empty: wherever the claim's first pod lands (`WaitForFirstConsumer`).
    pub datacenter: Option<String>,
    /// `STANDARD` or `HIGH_PERFORMANCE`; `None`: the datacenter's default.
    pub tier: Option<String>,
    /// The node that provisions an immediately bound claim (with a `dataCenter`).
    pub node: Option<String>,
}

/// Reads a StorageClass's parameters; `Err` names a bad one.
pub fn class_params(parameters: &BTreeMap<String, String>) -> Result<ClassParams, String> {
    let get = |key: &str| {
        parameters
            .get(key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if let Some(unknown) = parameters
        .keys()
        .find(|k| ![PARAM_DATACENTER, PARAM_TYPE, PARAM_NODE].contains(&k.as_str()))
    {
        return Err(format!(
            "StorageClass parameter {unknown:?} is not one of {PARAM_DATACENTER}, {PARAM_TYPE}, \
             {PARAM_NODE}"
        ));
    }
    let tier = get(PARAM_TYPE).map(|t| t.to_ascii_uppercase());
    if let Some(tier) = &tier
        && tier != "STANDARD"
        && tier != "HIGH_PERFORMANCE"
    {
        return Err(format!(
            "StorageClass parameter {PARAM_TYPE} {tier:?} is not STANDARD or HIGH_PERFORMANCE"
        ));
    }
    Ok(ClassParams {
        datacenter: get(PARAM_DATACENTER),
        tier,
        node: get(PARAM_NODE),
    })
}

/// A claim's requested storage (a Kubernetes quantity) as whole GB of RunPod's: rounded up,
/// at least [`MIN_GB`]; `Err` above [`MAX_GB`] or unreadable.
pub fn size_gb(quantity: &str) -> Result<u32, String> {
    let bytes = crate::quantity::parse_quantity(quantity)
        .map_err(|_| format!("storage request {quantity:?} is not a quantity"))?;
    let gb = (bytes / 1e9).ceil().max(f64::from(MIN_GB));
    if gb > f64::from(MAX_GB) {
        return Err(format!(
            "storage request {quantity} is more than RunPod's {MAX_GB} GB network volume"
        ));
    }
    Ok(gb as u32)
}

/// Virtual node annotation: the GPU types (canonical names) each datacenter offers on Secure
/// Cloud, where network volumes live: what admission judges a volume pod's price cap against.
/// `EU-RO-1=A100-80GB|H100,US-TX-3=L40S`.
pub const DATACENTER_GPUS: &str = "runpod.io/datacenter-gpus";

/// The value of [`DATACENTER_GPUS`].
pub fn format_datacenter_gpus(
    offered: &BTreeMap<String, std::collections::BTreeSet<String>>,
) -> String {
    offered
        .iter()
        .filter(|(_, gpus)| !gpus.is_empty())
        .map(|(datacenter, gpus)| {
            format!(
                "{datacenter}={}",
                gpus.iter().cloned().collect::<Vec<_>>().join("|")
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`DATACENTER_GPUS`]; entries it cannot read are left out (they only narrow a check).
pub fn parse_datacenter_gpus(value: &str) -> BTreeMap<String, std::collections::BTreeSet<String>> {
    value
        .split(',')
        .filter_map(|entry| {
            let (datacenter, gpus) = entry.split_once('=')?;
            let datacenter = datacenter.trim();
            let gpus: std::collections::BTreeSet<String> = gpus
                .split('|')
                .map(str::trim)
                .filter(|gpu| !gpu.is_empty())
                .map(str::to_owned)
                .collect();
            (!datacenter.is_empty() && !gpus.is_empty()).then(|| (datacenter.to_owned(), gpus))
        })
        .collect()
}

/// The datacenter of a PV's network volume (`csi.volumeAttributes.dataCenter` of this
/// project's driver), when it names one.
pub fn pv_datacenter(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Option<String> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (csi.driver == PROVISIONER)
        .then(|| {
            csi.volume_attributes
                .as_ref()?
                .get(ATTRIBUTE_DATACENTER)
                .cloned()
        })
        .flatten()
}

/// The volume's name at RunPod: this cluster's, for this claim (RunPod volumes carry no tags,
/// so the name is how one is found again).
pub fn volume_name(cluster_id: &str, claim_uid: &str) -> String {
    format!("rpk-{cluster_id}-{claim_uid}")
}

/// What one volume costs an hour.
pub fn cost_per_hour(size_gb: u32) -> f64 {
    f64::from(size_gb) * PRICE_PER_GB_MONTH / MONTH_HOURS
}

/// The PersistentVolume that stands for `volume_id` (in `datacenter`, `size_gb`) and is
/// pre-bound to the claim: with node affinity to `node`, the only node that can mount it.
#[allow(clippy::too_many_arguments)]
pub fn persistent_volume(
    claim_namespace: &str,
    claim_name: &str,
    claim_uid: &str,
    class: &str,
    access_modes: &[String],
    reclaim: &str,
    volume_id: &str,
    datacenter: &str,
    size_gb: u32,
    node: &str,
) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{claim_uid}"),
            "annotations": {
                VOLUME_ID: volume_id,
                "pv.kubernetes.io/provisioned-by": PROVISIONER,
            },
        },
        "spec": {
            "capacity": {"storage": format!("{size_gb}G")},
            "accessModes": access_modes,
            "persistentVolumeReclaimPolicy": reclaim,
            "storageClassName": class,
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": claim_namespace, "name": claim_name, "uid": claim_uid},
            "csi": {"driver": PROVISIONER, "volumeHandle": volume_id,
                    "volumeAttributes": {ATTRIBUTE_DATACENTER: datacenter}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datacenter_gpus_round_trip_and_skip_what_is_unreadable() {
        let offered = parse_datacenter_gpus("EU-RO-1=H100|A100-80GB, US-TX-3=L40S,junk,X=");
        assert_eq!(offered.len(), 2);
        assert_eq!(
            format_datacenter_gpus(&offered),
            "EU-RO-1=A100-80GB|H100,US-TX-3=L40S"
        );
        assert_eq!(
            parse_datacenter_gpus(&format_datacenter_gpus(&offered)),
            offered
        );
    }

    #[test]
    fn sizes_round_up_to_runpods_limits() {
        assert_eq!(size_gb("1Gi"), Ok(10), "at least 10 GB");
        assert_eq!(size_gb("50G"), Ok(50));
        assert_eq!(size_gb("50Gi"), Ok(54), "53.7 GB rounds up");
        assert!(size_gb("5Ti").is_err());
        assert!(size_gb("lots").is_err());
    }

    #[test]
    fn class_parameters_are_checked() {
        let read = |pairs: &[(&str, &str)]| {
            class_params(
                &pairs
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        assert_eq!(read(&[]), Ok(ClassParams::default()));
        assert_eq!(
            read(&[("dataCenter", "EU-RO-1"), ("type", "high_performance")]),
            Ok(ClassParams {
                datacenter: Some("EU-RO-1".into()),
                tier: Some("HIGH_PERFORMANCE".into()),
                node: None
            })
        );
        assert!(read(&[("type", "FAST")]).unwrap_err().contains("STANDARD"));
        assert!(read(&[("zone", "a")]).unwrap_err().contains("zone"));
    }

    #[test]
    fn the_pv_is_pre_bound_and_pinned_to_the_node() {
        let pv = persistent_volume(
            "ns",
            "data",
            "u1",
            CLASS_NAME,
            &["ReadWriteOnce".into()],
            "Delete",
            "vol1",
            "EU-RO-1",
            20,
            "virtual-runpod",
        );
        assert_eq!(pv["metadata"]["name"], "pvc-u1");
        assert_eq!(pv["spec"]["claimRef"]["uid"], "u1");
        assert_eq!(pv["spec"]["csi"]["volumeHandle"], "vol1");
        assert_eq!(
            pv["spec"]["csi"]["volumeAttributes"]["dataCenter"],
            "EU-RO-1"
        );
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
                [0],
            "virtual-runpod"
        );
        assert_eq!(volume_name("c1", "u1"), "rpk-c1-u1");
        assert!((cost_per_hour(720) - 0.07).abs() < 1e-12);
    }
}
