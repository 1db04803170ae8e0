//! The node's pods as the controller's cache keeps them: the metadata as it is, the spec and the
//! status as their JSON text, decoded into a whole `Pod` where one is read.
//!
//! Why: k8s-openapi's `Pod` keeps every optional member of each container, volume and status
//! inline, whether set or not. A one-container pod with its service-account volume takes about
//! 16 KB of heap that way, and the text of its spec and status about 2 KB. With 1,000 pods on
//! the node that is the difference between the cache taking 16 MB and 4 MB. The metadata stays
//! decoded: it is what most readers of every pod look at (uid, annotations, deletion).

use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One pod of the node, as the cache keeps it (see the module doc).
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "Pod")]
pub(crate) struct CachedPod {
    /// Without `managedFields` (about half of a pod's text, and nothing here reads them).
    pub(crate) metadata: ObjectMeta,
    /// `{"spec":…,"status":…}` as k8s-openapi wrote it.
    body: Box<str>,
}

/// The members of a pod the cache keeps as text, borrowed for writing and owned for reading.
#[derive(Serialize)]
struct BodyRef<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    spec: Option<&'a PodSpec>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a PodStatus>,
}

#[derive(Deserialize)]
struct Body {
    spec: Option<PodSpec>,
    status: Option<PodStatus>,
}

impl From<Pod> for CachedPod {
    fn from(pod: Pod) -> Self {
        let Pod {
            mut metadata,
            spec,
            status,
        } = pod;
        metadata.managed_fields = None;
        let body = BodyRef {
            spec: spec.as_ref(),
            status: status.as_ref(),
        };
        // Serialising k8s-openapi's own types to a string cannot fail (no maps with non-string
        // keys, no failing Serialize impls); were it to, the pod reads as having no spec and no
        // status, which every reader treats as a pod not (yet) to act on.
        let body = serde_json::to_string(&body).unwrap_or_else(|_| "{}".to_owned());
        CachedPod {
            metadata,
            body: body.into_boxed_str(),
        }
    }
}

impl CachedPod {
    /// The whole pod, decoded from the text it was cached as.
    pub(crate) fn pod(&self) -> Result<Pod, serde_json::Error> {
        let Body { spec, status } = serde_json::from_str(&self.body)?;
        Ok(Pod {
            metadata: self.metadata.clone(),
            spec,
            status,
        })
    }

    /// The pod's uid, where the apiserver gave one.
    pub(crate) fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
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

/// Every cached pod, decoded; a pod whose text does not decode (which would be a bug here) is
/// left out with a warning rather than failing the whole read.
pub(crate) fn decoded(store: &PodStore) -> Vec<Arc<Pod>> {
    store
        .state()
        .iter()
        .filter_map(|cached| decode(cached))
        .collect()
}

/// The cached pod `namespace/name`, decoded.
pub(crate) fn get(store: &PodStore, namespace: &str, name: &str) -> Option<Arc<Pod>> {
    store
        .get(&ObjectRef::new(name).within(namespace))
        .and_then(|cached| decode(&cached))
}

/// One cached pod, decoded (see [`decoded`] for a pod that does not decode).
pub(crate) fn decode(cached: &CachedPod) -> Option<Arc<Pod>> {
    match cached.pod() {
        Ok(pod) => Some(Arc::new(pod)),
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
