//! The node's pods as the controller's cache keeps them: the metadata and the status as they
//! are, the spec as its JSON text, decoded into a whole `Pod` where one is read.
//!
//! Why: k8s-openapi's `Pod` keeps every optional member of each container and volume inline,
//! whether set or not. A one-container pod with its service-account volume takes about 9 KB of
//! heap for its spec that way, and about 1 KB as text: with 1,000 pods on the node, the cache
//! takes about 5 MB instead of 16 MB. The metadata and the status stay decoded: they are what
//! the loops over every pod read (uid, annotations, deletion, phase, conditions), and they
//! change, where the spec of a pod is all but fixed. Where a loop over the node's pods needs
//! the spec, it decodes one pod at a time and lets it go. What holds a decoded pod longer: each
//! reconcile in flight (at most `--concurrency` of them), and each prober during a probe.

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Deserialize;
use std::sync::Arc;

/// One pod of the node, as the cache keeps it (see the module doc).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "Pod")]
pub(crate) struct CachedPod {
    /// Without `managedFields` (about half of a pod's text, and nothing here reads them).
    pub(crate) metadata: ObjectMeta,
    pub(crate) status: Option<PodStatus>,
    /// The spec as k8s-openapi wrote it (`null` for none).
    spec: Box<str>,
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        let Pod {
            mut metadata,
            spec,
            status,
        } = pod;
        metadata.managed_fields = None;
        // Serialising k8s-openapi's own types to a string cannot fail (no maps with non-string
        // keys, no failing Serialize impls); were it to, the pod reads as having no spec, which
        // every reader treats as a pod not (yet) to act on.
        let spec = serde_json::to_string(&spec).unwrap_or_else(|error| {
            tracing::warn!(
                pod = metadata.name.as_deref().unwrap_or_default(),
                %error,
                "a pod's spec could not be cached; it is read as having none"
            );
            "null".to_owned()
        });
        CachedPod {
            metadata,
            status,
            spec: spec.into_boxed_str(),
        }
    }
}

impl CachedPod {
    /// The whole pod, its spec decoded from the text it was cached as.
    pub(crate) fn pod(&self) -> Result<Pod, serde_json::Error> {
        let spec: Option<PodSpec> = serde_json::from_str(&self.spec)?;
        Ok(Pod {
            metadata: self.metadata.clone(),
            spec,
            status: self.status.clone(),
        })
    }

    /// The pod's uid, where the apiserver gave one.
    pub(crate) fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }

    /// The pod's phase, where its status has one.
    pub(crate) fn phase(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.phase.as_deref())
    }
}

impl k8s_openapi::Resource for CachedPod {
    const API_VERSION: &'static str = <Pod as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <Pod as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <Pod as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <Pod as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <Pod as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <Pod as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for CachedPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The node's pod cache.
pub(crate) type PodStore = Store<CachedPod>;

/// The cached pod `namespace/name`, decoded.
pub(crate) fn get(store: &PodStore, namespace: &str, name: &str) -> Option<Arc<Pod>> {
    store
        .get(&ObjectRef::new(name).within(namespace))
        .and_then(|cached| decode(&cached))
        .map(Arc::new)
}

/// One cached pod, decoded; a pod whose text does not decode (which would be a bug here) is
/// left out with a warning rather than failing what reads it.
pub(crate) fn decode(cached: &CachedPod) -> Option<Pod> {
    match cached.pod() {
        Ok(pod) => Some(pod),
        Err(error) => {
            tracing::warn!(
                pod = cached.metadata.name.as_deref().unwrap_or_default(),
                error = %error,
                "a cached pod does not decode; it is skipped"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn full_pod() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
                "labels": {"runpod.io/burst": "enabled"}, "annotations": {"a": "b"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"nodeName": "n", "containers": [{"name": "main", "image": "i:1",
                "command": ["serve"], "env": [{"name": "A", "value": "1"}],
                "readinessProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 3},
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "volumes": [{"name": "kube-api-access-x", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token"}}]}}],
                "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists"}]},
            "status": {"phase": "Running", "podIP": "100.64.0.2",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "main", "ready": true, "restartCount": 1,
                    "image": "i:1", "imageID": "", "state": {"running": {}}}]}
        })
    }

    #[test]
    fn a_cached_pod_decodes_to_the_pod_it_was_less_its_managed_fields() {
        let pod: Pod = serde_json::from_value(full_pod()).unwrap();
        let cached: CachedPod = serde_json::from_value(full_pod()).unwrap();
        let mut expected = pod.clone();
        expected.metadata.managed_fields = None;
        assert_eq!(cached.pod().unwrap(), expected);
        assert!(cached.metadata.managed_fields.is_none());
        assert_eq!(cached.uid(), Some("u-1"));
    }

    #[test]
    fn the_cached_pod_is_referred_to_as_the_pod_itself() {
        // Events said on a cached pod (a deleted pod's billing calls) name the Pod.
        use kube::Resource as _;
        let pod: Pod = serde_json::from_value(full_pod()).unwrap();
        let cached = CachedPod::from(pod.clone());
        assert_eq!(cached.object_ref(&()), pod.object_ref(&()));
        assert_eq!(cached.object_ref(&()).kind.as_deref(), Some("Pod"));
        assert_eq!(cached.phase(), Some("Running"));
    }

    #[test]
    fn a_pod_without_spec_or_status_decodes_without_them() {
        let cached: CachedPod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "ns"}})).unwrap();
        let pod = cached.pod().unwrap();
        assert!(pod.spec.is_none());
        assert!(pod.status.is_none());
    }

    #[test]
    fn a_list_item_without_api_version_or_kind_is_read() {
        // The apiserver's list items carry neither; the watcher's list reads them.
        let mut item = full_pod();
        let object = item.as_object_mut().unwrap();
        object.remove("apiVersion");
        object.remove("kind");
        let cached: CachedPod = serde_json::from_value(item).unwrap();
        assert_eq!(
            cached.pod().unwrap().spec.unwrap().containers[0]
                .image
                .as_deref(),
            Some("i:1")
        );
    }
}
