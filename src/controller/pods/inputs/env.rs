//! Resolving a container's environment like the kubelet does: Secret and ConfigMap key refs
//! (with `optional`), `envFrom` (with prefixes), and downward-API fields. A mandatory key that
//! is missing stops the pod from being created, with the kubelet's reason, until it appears.

use std::collections::BTreeMap;
use std::future::Future;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

pub(crate) use runpod_contract::env::ResolvedEnv;

/// Why the environment cannot be built (the kubelet's `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EnvError {
    #[error("{kind} {name:?} not found")]
    MissingObject { kind: &'static str, name: String },
    #[error("couldn't find key {key} in {kind} {name:?}")]
    MissingKey {
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("unsupported field path {0:?}")]
    FieldPath(String),
    #[error("reading {kind} {name:?}: {message}")]
    Read {
        kind: &'static str,
        name: String,
        message: String,
    },
}

/// An object's keys and raw values (a Secret's `data`, a ConfigMap's `data` and `binaryData`).
pub(crate) type ObjectData = BTreeMap<String, Vec<u8>>;

/// Where Secrets and ConfigMaps come from (the cluster, or a map in tests). Values are bytes:
/// env turns them into text, mounted files keep them as they are.
pub(crate) trait EnvSource: Sync {
    /// The Secret's data; `Ok(None)` when it does not exist.
    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectData>, String>> + Send;
    /// The ConfigMap's data and binary data; `Ok(None)` when it does not exist.
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ObjectData>, String>> + Send;
}

/// Reads Secrets and ConfigMaps with single GETs (RBAC: `get` only, no list/watch).
pub(crate) struct ClusterEnvSource(pub kube::Client);

impl EnvSource for ClusterEnvSource {
    async fn secret(&self, namespace: &str, name: &str) -> Result<Option<ObjectData>, String> {
        let api: Api<Secret> = Api::namespaced(self.0.clone(), namespace);
        let secret = api.get_opt(name).await.map_err(|e| e.to_string())?;
        Ok(secret.map(|secret| {
            let mut data: ObjectData = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.0))
                .collect();
            for (key, value) in secret.string_data.unwrap_or_default() {
                data.insert(key, value.into_bytes());
            }
            data
        }))
    }

    async fn config_map(&self, namespace: &str, name: &str) -> Result<Option<ObjectData>, String> {
        let api: Api<ConfigMap> = Api::namespaced(self.0.clone(), namespace);
        let map = api.get_opt(name).await.map_err(|e| e.to_string())?;
        Ok(map.map(|map| {
            let mut data: ObjectData = map
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, value)| (key, value.into_bytes()))
                .collect();
            for (key, value) in map.binary_data.unwrap_or_default() {
                data.insert(key, value.0);
            }
            data
        }))
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Secret,
    ConfigMap,
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Secret => "secret",
            Kind::ConfigMap => "configmap",
        }
    }
}

/// The object's raw data (`Ok(None)`: it does not exist).
pub(crate) async fn fetch_bytes(
    source: &impl EnvSource,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<Option<ObjectData>, EnvError> {
    let result = match kind {
        Kind::Secret => source.secret(namespace, name).await,
        Kind::ConfigMap => source.config_map(namespace, name).await,
    };
    result.map_err(|message| EnvError::Read {
        kind: kind.name(),
        name: name.to_owned(),
        message,
    })
}

/// The object's data as text, for env.
async fn fetch(
    source: &impl EnvSource,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, EnvError> {
    let data = fetch_bytes(source, kind, namespace, name).await?;
    Ok(data.map(|data| {
        data.into_iter()
            .map(|(key, value)| (key, String::from_utf8_lossy(&value).into_owned()))
            .collect()
    }))
}

/// Resolves the environment of `container` in `pod`.
pub(crate) async fn resolve(
    source: &impl EnvSource,
    pod: &Pod,
    container: &Container,
) -> Result<ResolvedEnv, EnvError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut resolved = ResolvedEnv::default();
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let (kind, name, optional) = if let Some(r) = &from.secret_ref {
            (Kind::Secret, r.name.as_str(), r.optional.unwrap_or(false))
        } else if let Some(r) = &from.config_map_ref {
            (
                Kind::ConfigMap,
                r.name.as_str(),
                r.optional.unwrap_or(false),
            )
        } else {
            continue;
        };
        match fetch(source, kind, namespace, name).await? {
            Some(data) => {
                for (key, value) in data {
                    resolved.env_from.insert(format!("{prefix}{key}"), value);
                }
            }
            None if optional => {}
            None => {
                return Err(EnvError::MissingObject {
                    kind: kind.name(),
                    name: name.to_owned(),
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        let Some(value_from) = &var.value_from else {
            continue;
        };
        let key_ref = if let Some(r) = &value_from.secret_key_ref {
            Some((
                Kind::Secret,
                r.name.as_str(),
                &r.key,
                r.optional.unwrap_or(false),
            ))
        } else {
            value_from.config_map_key_ref.as_ref().map(|r| {
                (
                    Kind::ConfigMap,
                    r.name.as_str(),
                    &r.key,
                    r.optional.unwrap_or(false),
                )
            })
        };
        if let Some((kind, name, key, optional)) = key_ref {
            let value = fetch(source, kind, namespace, name)
                .await?
                .and_then(|data| data.get(key).cloned());
            match value {
                Some(value) => {
                    resolved.value_from.insert(var.name.clone(), value);
                }
                None if optional => {}
                None => {
                    return Err(EnvError::MissingKey {
                        kind: kind.name(),
                        name: name.to_owned(),
                        key: key.clone(),
                    });
                }
            }
        } else if let Some(field) = &value_from.field_ref {
            let value = field_value(pod, &field.field_path)?;
            resolved.value_from.insert(var.name.clone(), value);
        } else if let Some(resource) = &value_from.resource_field_ref {
            let value = resource_value(container, &resource.resource);
            resolved.value_from.insert(var.name.clone(), value);
        }
    }
    Ok(resolved)
}

/// The downward-API fields the kubelet supports for env.
pub(crate) fn field_value(pod: &Pod, path: &str) -> Result<String, EnvError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let from_map = |map: Option<&BTreeMap<String, String>>, key: &str| {
        map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" => status.and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        "status.podIP" => status.and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        other => {
            if let Some(key) = subscript(other, "metadata.labels") {
                from_map(meta.labels.as_ref(), key)
            } else if let Some(key) = subscript(other, "metadata.annotations") {
                from_map(meta.annotations.as_ref(), key)
            } else {
                return Err(EnvError::FieldPath(other.to_owned()));
            }
        }
    };
    Ok(value)
}

/// `metadata.labels['key']` → `key`.
fn subscript<'a>(path: &'a str, field: &str) -> Option<&'a str> {
    let rest = path
        .strip_prefix(field)?
        .strip_prefix('[')?
        .strip_suffix(']')?;
    rest.strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .or_else(|| rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')))
}

/// `limits.cpu`, `requests.memory`, … as the container declares them (unset: empty).
pub(crate) fn resource_value(container: &Container, resource: &str) -> String {
    let resources = container.resources.as_ref();
    let (map, name) = match resource.split_once('.') {
        Some(("limits", name)) => (resources.and_then(|r| r.limits.as_ref()), name),
        Some(("requests", name)) => (resources.and_then(|r| r.requests.as_ref()), name),
        _ => (None, resource),
    };
    map.and_then(|m| m.get(name))
        .map(|quantity| quantity.0.clone())
        .unwrap_or_default()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// Secrets and ConfigMaps from maps, for unit tests of env and volumes.
    pub(crate) struct Maps {
        pub(crate) secrets: BTreeMap<String, ObjectData>,
        pub(crate) config_maps: BTreeMap<String, ObjectData>,
    }

    impl EnvSource for Maps {
        async fn secret(&self, _: &str, name: &str) -> Result<Option<ObjectData>, String> {
            Ok(self.secrets.get(name).cloned())
        }
        async fn config_map(&self, _: &str, name: &str) -> Result<Option<ObjectData>, String> {
            Ok(self.config_maps.get(name).cloned())
        }
    }

    /// `[("key", "value")]` as object data.
    pub(crate) fn map(pairs: &[(&str, &str)]) -> ObjectData {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    fn maps() -> Maps {
        Maps {
            secrets: [("creds".to_owned(), map(&[("token", "s3cr3t")]))].into(),
            config_maps: [("settings".to_owned(), map(&[("A", "1"), ("B", "2")]))].into(),
        }
    }

    fn pod(env: serde_json::Value, env_from: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "u-1",
                         "labels": {"team": "vision"}},
            "spec": {"nodeName": "virtual-runpod", "containers": [{
                "name": "main", "image": "img", "env": env, "envFrom": env_from,
                "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "8Gi"}}}]}
        }))
        .unwrap()
    }

    async fn run(pod: &Pod) -> Result<ResolvedEnv, EnvError> {
        let container = &pod.spec.as_ref().unwrap().containers[0];
        resolve(&maps(), pod, container).await
    }

    #[tokio::test]
    async fn refs_env_from_and_downward_fields_resolve() {
        let pod = pod(
            json!([
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
                {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope", "optional": true}}},
                {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}
            ]),
            json!([{"configMapRef": {"name": "settings"}, "prefix": "CFG_"},
                   {"secretRef": {"name": "absent", "optional": true}}]),
        );
        let resolved = run(&pod).await.unwrap();
        assert_eq!(resolved.value_from["TOKEN"], "s3cr3t");
        assert!(!resolved.value_from.contains_key("OPT"));
        assert_eq!(resolved.value_from["POD"], "train");
        assert_eq!(resolved.value_from["TEAM"], "vision");
        assert_eq!(resolved.value_from["NODE"], "virtual-runpod");
        assert_eq!(resolved.value_from["MEM"], "8Gi");
        assert_eq!(resolved.env_from["CFG_A"], "1");
        assert_eq!(resolved.env_from["CFG_B"], "2");
    }

    #[tokio::test]
    async fn a_missing_mandatory_key_or_object_is_an_error() {
        let missing_key = pod(
            json!([{"name": "T", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "nope"}}}]),
            json!([]),
        );
        assert_eq!(
            run(&missing_key).await,
            Err(EnvError::MissingKey {
                kind: "secret",
                name: "creds".into(),
                key: "nope".into()
            })
        );
        let missing_map = pod(json!([]), json!([{"configMapRef": {"name": "gone"}}]));
        assert!(matches!(
            run(&missing_map).await,
            Err(EnvError::MissingObject {
                kind: "configmap",
                ..
            })
        ));
        let bad_field = pod(
            json!([{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]),
            json!([]),
        );
        assert!(matches!(run(&bad_field).await, Err(EnvError::FieldPath(_))));
    }
}
