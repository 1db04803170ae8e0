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

use crate::provider::{Instance, Tags};

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
