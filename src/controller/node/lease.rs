//! The node's heartbeat Lease in `kube-node-lease`: 40 s, renewed every 10 s, recreated if
//! someone deletes it (server-side apply creates what is missing).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::controller::node::FIELD_MANAGER;

pub(crate) const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
pub(crate) const LEASE_DURATION: Duration = Duration::from_secs(40);
pub(crate) const RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// The Lease body for `node` renewed at `now`.
pub(crate) fn lease_patch(node: &str, node_uid: Option<&str>, now: Timestamp) -> serde_json::Value {
    let mut metadata = json!({"name": node, "namespace": NODE_LEASE_NAMESPACE});
    if let Some(uid) = node_uid {
        // Owned by the node, like a kubelet's: deleting the node deletes its Lease.
        metadata["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]);
    }
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION.as_secs(),
            "renewTime": MicroTime(now),
        }
    })
}

/// Renews (or recreates) the node Lease once.
pub(crate) async fn renew(
    client: &kube::Client,
    node: &str,
    node_uid: Option<&str>,
) -> Result<(), kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NODE_LEASE_NAMESPACE);
    let patch = lease_patch(node, node_uid, Timestamp::now());
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_the_node_and_lasts_forty_seconds() {
        let now: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let lease = lease_patch("virtual-runpod", Some("uid-1"), now);
        assert_eq!(lease["metadata"]["namespace"], "kube-node-lease");
        assert_eq!(lease["spec"]["holderIdentity"], "virtual-runpod");
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
        assert_eq!(lease["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert!(
            lease["spec"]["renewTime"]
                .as_str()
                .unwrap()
                .starts_with("2026-01-01T00:00:00")
        );
    }
}
