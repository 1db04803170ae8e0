//! The parts of a pod the admission policy reads, deserialised straight from the review.
//!
//! A full `k8s_openapi` `Pod` costs an allocation for every string, map and list of the pod (its
//! env, image, resources, status...), most of which the policy never looks at; this view keeps
//! only what the rules and the patch need. Field names and `Option`s follow the Kubernetes API,
//! so absent and `null` members read as `None` exactly as they do in the typed pod, and the
//! patch can tell a missing parent (added whole) from an existing one (added into).

use std::collections::BTreeMap;
use std::fmt;

use std::marker::PhantomData;

/// The view's strings: most of a pod's (names, keys, ports) fit inline, so reading one allocates for
/// few of them.
pub use compact_str::CompactString;
use serde::Deserialize;
use serde::de::value::MapAccessDeserializer;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

/// A pod under review.
#[derive(Debug, Default, Deserialize)]
pub struct PodView {
    /// `None` when the pod has no `metadata` object at all.
    #[serde(default, deserialize_with = "object")]
    pub metadata: Option<MetaView>,
    #[serde(default, deserialize_with = "object")]
    pub spec: Option<SpecView>,
}

/// `metadata` of a pod.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaView {
    #[serde(default)]
    pub name: Option<CompactString>,
    #[serde(default)]
    pub generate_name: Option<CompactString>,
    #[serde(default)]
    pub namespace: Option<CompactString>,
    #[serde(default)]
    pub labels: Option<BTreeMap<CompactString, CompactString>>,
    #[serde(default)]
    pub annotations: Option<BTreeMap<CompactString, CompactString>>,
    #[serde(default)]
    pub owner_references: Option<Vec<OwnerView>>,
}

const NO_METADATA: MetaView = MetaView {
    name: None,
    generate_name: None,
    namespace: None,
    labels: None,
    annotations: None,
    owner_references: None,
};

impl PodView {
    /// The metadata, empty when the pod has none.
    pub fn meta(&self) -> &MetaView {
        self.metadata.as_ref().unwrap_or(&NO_METADATA)
    }
}

/// An `ownerReferences` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OwnerView {
    #[serde(default)]
    pub api_version: CompactString,
    #[serde(default)]
    pub kind: CompactString,
    #[serde(default)]
    pub name: CompactString,
    #[serde(default)]
    pub uid: CompactString,
}

/// `spec` of a pod.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecView {
    #[serde(default)]
    pub containers: Vec<ContainerView>,
    #[serde(default)]
    pub init_containers: Option<Vec<ContainerView>>,
    #[serde(default)]
    pub volumes: Option<Vec<VolumeView>>,
    #[serde(default)]
    pub tolerations: Option<Vec<TolerationView>>,
    #[serde(default)]
    pub node_selector: Option<BTreeMap<CompactString, CompactString>>,
    #[serde(default, deserialize_with = "object")]
    pub affinity: Option<AffinityView>,
    #[serde(default)]
    pub runtime_class_name: Option<CompactString>,
    /// A pod that names its node is bound by its author, not by the webhook.
    #[serde(default)]
    pub node_name: Option<CompactString>,
    /// Kept as written: only which fields are set is read ([`crate::checks::unapplied_security_context`]).
    #[serde(default)]
    pub security_context: Option<serde_json::Value>,
}

/// A container (regular or init).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    #[serde(default)]
    pub name: CompactString,
    #[serde(default)]
    pub image: Option<CompactString>,
    /// An init container's own (`Always`: a sidecar).
    #[serde(default)]
    pub restart_policy: Option<CompactString>,
    #[serde(default)]
    pub command: Option<Vec<CompactString>>,
    #[serde(default)]
    pub args: Option<Vec<CompactString>>,
    #[serde(default)]
    pub ports: Option<Vec<PortView>>,
    #[serde(default, deserialize_with = "object")]
    pub resources: Option<ResourcesView>,
    #[serde(default)]
    pub volume_mounts: Option<Vec<MountView>>,
    #[serde(default)]
    pub security_context: Option<serde_json::Value>,
    /// Probes and hooks: only whether they are set is read ([`crate::checks::unhonoured`]).
    #[serde(default)]
    pub startup_probe: Option<serde_json::Value>,
    #[serde(default)]
    pub liveness_probe: Option<serde_json::Value>,
    #[serde(default)]
    pub readiness_probe: Option<serde_json::Value>,
    #[serde(default)]
    pub lifecycle: Option<serde_json::Value>,
}

/// A `containerPort` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortView {
    #[serde(default)]
    pub container_port: i32,
    #[serde(default)]
    pub name: Option<CompactString>,
    #[serde(default)]
    pub protocol: Option<CompactString>,
}

/// A `volumeMounts` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MountView {
    #[serde(default)]
    pub name: CompactString,
    #[serde(default)]
    pub mount_path: CompactString,
}

/// `resources`: only the GPU quantity ([`crate::GPU_RESOURCE`]) is read.
#[derive(Debug, Default, Deserialize)]
pub struct ResourcesView {
    #[serde(default, deserialize_with = "object")]
    pub limits: Option<GpuQuantity>,
    #[serde(default, deserialize_with = "object")]
    pub requests: Option<GpuQuantity>,
}

/// The GPU, memory and CPU entries of a `limits` or `requests` map; other resources are
/// skipped unread.
#[derive(Debug, Default, Deserialize)]
pub struct GpuQuantity {
    /// Must equal [`crate::GPU_RESOURCE`] (serde needs the literal; a test checks it).
    #[serde(default, rename = "nvidia.com/gpu")]
    pub gpu: Option<CompactString>,
    /// Only whether it is set is read (a limit no cloud container enforces). Skipped unread, so
    /// a value serde_json would refuse as a number (`1e400`) is not checked here: the apiserver
    /// sends quantities as strings.
    #[serde(default)]
    pub memory: Option<IgnoredAny>,
    #[serde(default)]
    pub cpu: Option<IgnoredAny>,
}

impl ResourcesView {
    /// The GPU limit, else the GPU request, as Kubernetes reads extended resources.
    pub fn gpu(&self) -> Option<&str> {
        let limit = self.limits.as_ref().and_then(|l| l.gpu.as_deref());
        limit.or_else(|| self.requests.as_ref().and_then(|r| r.gpu.as_deref()))
    }
}

/// A toleration: all of its fields, so that one can be compared with ours exactly.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TolerationView {
    #[serde(default)]
    pub key: Option<CompactString>,
    #[serde(default)]
    pub operator: Option<CompactString>,
    #[serde(default)]
    pub value: Option<CompactString>,
    #[serde(default)]
    pub effect: Option<CompactString>,
    #[serde(default)]
    pub toleration_seconds: Option<i64>,
}

/// `affinity`: only node affinity's preferred terms are read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffinityView {
    #[serde(default, deserialize_with = "object")]
    pub node_affinity: Option<NodeAffinityView>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAffinityView {
    #[serde(default)]
    pub preferred_during_scheduling_ignored_during_execution: Option<Vec<PreferredTermView>>,
    /// Kept whole: a node binding is added into each of the pod's own terms.
    #[serde(default)]
    pub required_during_scheduling_ignored_during_execution: Option<serde_json::Value>,
}

/// A preferred scheduling term: all of its fields, so that one can be compared with ours.
#[derive(Debug, Default, Deserialize)]
pub struct PreferredTermView {
    #[serde(default)]
    pub weight: i32,
    #[serde(default)]
    pub preference: NodeSelectorTermView,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTermView {
    #[serde(default)]
    pub match_expressions: Option<Vec<RequirementView>>,
    /// Only whether there are any (and how many) matters.
    #[serde(default)]
    pub match_fields: Option<Vec<IgnoredAny>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct RequirementView {
    #[serde(default)]
    pub key: CompactString,
    #[serde(default)]
    pub operator: CompactString,
    #[serde(default)]
    pub values: Option<Vec<CompactString>>,
}

/// A volume: its name and what kind of source it has.
#[derive(Debug, Default)]
pub struct VolumeView {
    pub name: CompactString,
    /// It has a configMap, secret, emptyDir or downwardAPI source.
    pub simple_source: bool,
    /// Its projected source, if any.
    pub projected: Option<ProjectedView>,
    /// The first other source, by its key as the user wrote it (`hostPath`, `nfs`...).
    pub other_source: Option<CompactString>,
    /// The claim of a `persistentVolumeClaim` volume (judged by its StorageClass).
    pub claim: Option<CompactString>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClaimSource {
    #[serde(default)]
    claim_name: CompactString,
}

/// A projected volume's sources.
#[derive(Debug, Default, Deserialize)]
pub struct ProjectedView {
    #[serde(default)]
    pub sources: Option<Vec<ProjectionView>>,
}

/// One projected source: which kind it is.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProjectionView {
    #[serde(default)]
    pub service_account_token: Option<IgnoredAny>,
    #[serde(default)]
    pub config_map: Option<IgnoredAny>,
    #[serde(default)]
    pub secret: Option<IgnoredAny>,
    #[serde(default, rename = "downwardAPI")]
    pub downward_api: Option<IgnoredAny>,
}

/// An optional member that must be a JSON object (or null). Derived structs also accept an
/// array of their fields; the typed pod does not, and the patch adds members into these.
fn object<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: de::Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_option(OptionalObject(PhantomData))
}

struct OptionalObject<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OptionalObject<T> {
    type Value = Option<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an object or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        deserializer
            .deserialize_map(ObjectOnly(PhantomData))
            .map(Some)
    }
}

struct ObjectOnly<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectOnly<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

// A volume has `name` and one source among thirty-odd kinds; only a few are told apart, the
// others are named by their key, so a derive with every kind is not needed.
impl<'de> Deserialize<'de> for VolumeView {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(VolumeVisitor)
    }
}

struct VolumeVisitor;

impl<'de> Visitor<'de> for VolumeVisitor {
    type Value = VolumeView;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a volume object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<VolumeView, A::Error> {
        let mut volume = VolumeView::default();
        while let Some(key) = map.next_key::<VolumeKey>()? {
            match key {
                VolumeKey::Name => volume.name = map.next_value()?,
                VolumeKey::Simple => {
                    volume.simple_source |= map.next_value::<Option<IgnoredAny>>()?.is_some();
                }
                VolumeKey::Projected => {
                    if let Some(projected) = map.next_value::<Option<ProjectedView>>()? {
                        volume.projected = Some(projected);
                    }
                }
                VolumeKey::Claim => {
                    if let Some(claim) = map.next_value::<Option<ClaimSource>>()? {
                        volume.claim = Some(claim.claim_name);
                    }
                }
                VolumeKey::Other(kind) => {
                    if map.next_value::<Option<IgnoredAny>>()?.is_some() {
                        volume.other_source.get_or_insert(kind);
                    }
                }
            }
        }
        Ok(volume)
    }
}

enum VolumeKey {
    Name,
    Simple,
    Projected,
    Claim,
    Other(CompactString),
}

impl<'de> Deserialize<'de> for VolumeKey {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_identifier(VolumeKeyVisitor)
    }
}

struct VolumeKeyVisitor;

impl Visitor<'_> for VolumeKeyVisitor {
    type Value = VolumeKey;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a volume field name")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<VolumeKey, E> {
        Ok(match key {
            "name" => VolumeKey::Name,
            "configMap" | "secret" | "emptyDir" | "downwardAPI" => VolumeKey::Simple,
            "projected" => VolumeKey::Projected,
            "persistentVolumeClaim" => VolumeKey::Claim,
            other => VolumeKey::Other(other.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn the_gpu_field_is_the_contracts_resource() {
        let resources: ResourcesView =
            serde_json::from_value(json!({"limits": {crate::GPU_RESOURCE: "2", "cpu": "4"}}))
                .unwrap();
        assert_eq!(resources.gpu(), Some("2"));
    }

    #[test]
    fn null_and_absent_members_are_none() {
        let pod: PodView = serde_json::from_value(json!({
            "metadata": null,
            "spec": {"tolerations": null, "affinity": {"nodeAffinity": null}}
        }))
        .unwrap();
        assert!(pod.metadata.is_none());
        let spec = pod.spec.unwrap();
        assert!(spec.tolerations.is_none() && spec.node_selector.is_none());
        assert!(spec.affinity.unwrap().node_affinity.is_none());
    }

    #[test]
    fn volumes_are_told_apart_by_source() {
        let volumes: Vec<VolumeView> = serde_json::from_value(json!([
            {"name": "a", "secret": {"secretName": "s"}},
            {"name": "b", "hostPath": {"path": "/"}},
            {"name": "c", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
            {"name": "d", "secret": null, "nfs": {"server": "x"}},
            {"name": "e"}
        ]))
        .unwrap();
        assert!(volumes[0].simple_source && volumes[0].other_source.is_none());
        assert_eq!(volumes[1].other_source.as_deref(), Some("hostPath"));
        assert!(volumes[2].projected.is_some() && !volumes[2].simple_source);
        assert!(!volumes[3].simple_source);
        assert_eq!(volumes[3].other_source.as_deref(), Some("nfs"));
        assert_eq!(volumes[4].name, "e");
        assert!(volumes[4].other_source.is_none() && volumes[4].projected.is_none());
    }

    #[test]
    fn members_the_patch_adds_into_must_be_objects() {
        for pod in [
            json!({"metadata": []}),
            json!({"spec": ["x"]}),
            json!({"spec": {"affinity": []}}),
            json!({"spec": {"affinity": {"nodeAffinity": [null]}}}),
            json!({"spec": {"containers": [{"resources": {"limits": ["1"]}}]}}),
        ] {
            assert!(
                serde_json::from_value::<PodView>(pod.clone()).is_err(),
                "{pod}"
            );
        }
        let pod: PodView = serde_json::from_value(json!({"metadata": {}, "spec": null})).unwrap();
        assert!(pod.metadata.is_some() && pod.spec.is_none());
    }

    #[test]
    fn a_volume_that_is_not_an_object_is_an_error() {
        assert!(serde_json::from_value::<VolumeView>(json!("hostPath")).is_err());
        assert!(serde_json::from_value::<VolumeView>(json!({"name": 5})).is_err());
    }
}
