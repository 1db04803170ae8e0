//! Instances the Go kubelet made, taken over by `runpod-kubelet adopt`: the operator's record,
//! a ConfigMap `runpod-kubelet-adopted-<node>` in the controller's namespace (instance id ->
//! Kubernetes pod UID). An instance cannot be re-tagged without a restart (its tags live in its
//! environment), so ownership is recorded here, where only the operator writes (pod users
//! cannot), and the controller reads an adopted instance as if it carried our tags: it is
//! tracked, terminated and collected like ours. Only instances with no tag of ours at all are
//! ever read this way; an id on a pod alone is never trusted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use crate::provider::{Instance, InstanceOrigin, Tags};

/// The record's name for a node.
pub fn record_name(node_name: &str) -> String {
    format!("runpod-kubelet-adopted-{node_name}")
}

/// Instance id -> pod UID, as recorded.
pub type Record = BTreeMap<String, String>;

/// Whose tags an adopted instance gets: this controller's cluster id and node.
#[derive(Debug, Clone, Copy)]
pub struct Owner<'a> {
    pub cluster_id: &'a str,
    pub node_name: &'a str,
}

/// Gives an untagged instance the record names our tags (this cluster, this node, the pod);
/// anything else is left as it is.
pub fn tag(instance: &mut Instance, record: &Record, owner: Owner<'_>) {
    if !instance.tags.none() {
        return;
    }
    if let Some(uid) = record.get(&instance.id) {
        instance.tags = Tags {
            cluster_id: Some(owner.cluster_id.to_owned()),
            node_name: Some(owner.node_name.to_owned()),
            pod_uid: Some(uid.clone()),
        };
    }
}

/// Whether an instance without our tags was made for `pod` as the Go kubelet made them: its
/// image is the pod's container's, and every literal env value of the container is in the
/// instance's environment. A pod's name and `runpod.io/pod-id` are the user's to write; what
/// the instance was made with is not, so a same-named pod elsewhere annotated with a guessed
/// id links nothing. `Err` says what differs (names only, never values).
pub fn made_for(
    pod: &k8s_openapi::api::core::v1::Pod,
    origin: &InstanceOrigin,
) -> Result<(), String> {
    let Some(container) = pod.spec.as_ref().and_then(|spec| spec.containers.first()) else {
        return Err("the pod has no container".to_owned());
    };
    let image = container.image.as_deref().unwrap_or_default().trim();
    if image.is_empty() || origin.image.as_deref().map(str::trim) != Some(image) {
        return Err("its image is not the pod's".to_owned());
    }
    // The Go kubelet sent a literal only when non-empty, and dropped the names its
    // "auto-injected" filter matched (`go_kubelet_dropped`).
    let differing: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .filter(|var| var.value_from.is_none() && !go_kubelet_dropped(&var.name))
        .filter(|var| var.value.as_deref().is_some_and(|value| !value.is_empty()))
        .filter(|var| origin.env.get(&var.name) != var.value.as_ref())
        .map(|var| var.name.as_str())
        .collect();
    if !differing.is_empty() {
        return Err(format!(
            "its environment differs from the pod's ({})",
            differing.join(", ")
        ));
    }
    // Every variable the instance was made with must come from the pod (its env, or a source
    // whose keys cannot be listed here: envFrom, secret volume items) or from what the Go
    // kubelet's virtual-kubelet layer adds itself (service links).
    let open_ended = !container.env_from.as_deref().unwrap_or_default().is_empty()
        || pod
            .spec
            .as_ref()
            .and_then(|spec| spec.volumes.as_ref())
            .is_some_and(|volumes| volumes.iter().any(|v| v.secret.is_some()));
    if open_ended {
        return Ok(());
    }
    let declared: std::collections::BTreeSet<&str> = container
        .env
        .iter()
        .flatten()
        .map(|var| var.name.as_str())
        .collect();
    let unaccounted: Vec<&str> = origin
        .env
        .keys()
        .map(String::as_str)
        .filter(|name| !declared.contains(name) && !service_link(name))
        .collect();
    if unaccounted.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "its environment has variables the pod does not set ({})",
            unaccounted.join(", ")
        ))
    }
}

/// The names the Go kubelet's env filter dropped (a substring test).
fn go_kubelet_dropped(name: &str) -> bool {
    [
        "KUBERNETES_",
        "_PORT_",
        "_TCP_",
        "_SERVICE_PORT_",
        "_SERVICE_HOST",
    ]
    .iter()
    .any(|part| name.contains(part))
}

/// Variables virtual-kubelet adds to every container (service links, the `kubernetes`
/// service's), which the Go kubelet passed on.
fn service_link(name: &str) -> bool {
    name.starts_with("KUBERNETES_")
        || name.ends_with("_SERVICE_HOST")
        || name.ends_with("_SERVICE_PORT")
        || name.ends_with("_PORT")
        || name.contains("_PORT_")
        || name.contains("_SERVICE_PORT_")
}

/// The record of `node` in `namespace` (empty when there is none); `Err` when it cannot be read.
pub async fn load(
    client: &kube::Client,
    namespace: &str,
    node: &str,
) -> Result<Record, kube::Error> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    Ok(maps
        .get_opt(&record_name(node))
        .await?
        .and_then(|map| map.data)
        .map(|data| data.into_iter().collect())
        .unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::{self, settings};

    /// Issue 41, item 12: what decides whether an untagged instance is a pod's is what the
    /// instance was made with, not the pod's name or its user-written id.
    #[test]
    fn an_instance_is_a_pods_only_when_made_with_its_image_and_env() {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "trainer"},
            "spec": {"containers": [{"name": "main", "image": "team/trainer:1", "env": [
                {"name": "MODE", "value": "train"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
            ]}]}
        }))
        .unwrap();
        let origin = InstanceOrigin {
            image: Some("team/trainer:1".into()),
            env: [
                ("MODE".to_owned(), "train".to_owned()),
                ("TOKEN".to_owned(), "secret".to_owned()),
            ]
            .into(),
        };
        assert_eq!(made_for(&pod, &origin), Ok(()));
        let mut other = origin.clone();
        other.image = Some("team/trainer:2".into());
        assert!(made_for(&pod, &other).unwrap_err().contains("image"));
        let mut other = origin.clone();
        other.env.insert("MODE".into(), "serve".into());
        let differs = made_for(&pod, &other).unwrap_err();
        assert!(
            differs.contains("MODE") && !differs.contains("serve"),
            "{differs}"
        );
        assert!(made_for(&pod, &InstanceOrigin::default()).is_err());
        let mut linked = origin.clone();
        linked
            .env
            .insert("DB_SERVICE_HOST".into(), "10.0.0.1".into());
        assert_eq!(
            made_for(&pod, &linked),
            Ok(()),
            "service links are the kubelet's"
        );
        let mut extra = origin.clone();
        extra.env.insert("HF_TOKEN".into(), "x".into());
        assert!(made_for(&pod, &extra).unwrap_err().contains("HF_TOKEN"));
        // What the Go kubelet never sent: an empty literal, a name its filter dropped.
        let mut go_dropped = pod.clone();
        if let Some(spec) = go_dropped.spec.as_mut() {
            let env = spec.containers[0].env.get_or_insert_default();
            env.push(
                serde_json::from_value(serde_json::json!({"name": "EMPTY", "value": ""})).unwrap(),
            );
            env.push(
                serde_json::from_value(
                    serde_json::json!({"name": "DB_SERVICE_HOST", "value": "db"}),
                )
                .unwrap(),
            );
        }
        assert_eq!(made_for(&go_dropped, &origin), Ok(()));
    }

    /// The shared fixture with these tags.
    fn instance(id: &str, tags: Tags) -> Instance {
        Instance {
            tags,
            ..fixtures::instance(id, "", "", None)
        }
    }

    /// Only an untagged instance the record names becomes ours; a tagged one (another
    /// cluster's, another pod's) is never re-tagged, whatever the record says.
    #[test]
    fn only_recorded_untagged_instances_become_ours() {
        let settings = settings();
        let owner = Owner {
            cluster_id: &settings.cluster_id,
            node_name: &settings.node_name,
        };
        let record: Record = [
            ("seed1".to_owned(), "uid-1".to_owned()),
            ("theirs".to_owned(), "uid-2".to_owned()),
        ]
        .into();
        let mut seed = instance("seed1", Tags::default());
        tag(&mut seed, &record, owner);
        assert_eq!(seed.tags.pod_uid.as_deref(), Some("uid-1"));
        assert_eq!(
            seed.tags.cluster_id.as_deref(),
            Some(settings.cluster_id.as_str())
        );
        assert_eq!(
            seed.tags.node_name.as_deref(),
            Some(settings.node_name.as_str())
        );

        let other = Tags {
            cluster_id: Some("other".into()),
            node_name: Some("vr".into()),
            pod_uid: Some("x".into()),
        };
        let mut theirs = instance("theirs", other.clone());
        tag(&mut theirs, &record, owner);
        assert_eq!(theirs.tags, other);

        let mut unrecorded = instance("seed2", Tags::default());
        tag(&mut unrecorded, &record, owner);
        assert!(unrecorded.tags.none());
    }
}
