//! `/v2/network-volumes`: create in a data centre, list, get, grow (never shrink), delete
//! refused while mounted; a pod's `mounts.network` pins it to the volume's data centre.

use runpod_simulator::scenario::Scenario;
use serde_json::json;

use crate::support::{Api, RTX_4090};

#[tokio::test]
async fn volumes_are_made_grown_mounted_and_deleted_as_runpod_allows() {
    let api = Api::start(Scenario::default()).await;
    for (body, why) in [
        (
            json!({"name": "v", "size": 5, "dataCenter": "EU-RO-1"}),
            "too small",
        ),
        (
            json!({"name": "v", "size": 10, "dataCenter": "MARS-1"}),
            "no such data centre",
        ),
        (
            json!({"name": "v", "size": 10, "dataCenter": "EU-RO-1", "type": "FAST"}),
            "no such tier",
        ),
        (json!({"name": "v", "size": 10}), "no data centre"),
    ] {
        let refused = api.post("/v2/network-volumes", &body).await;
        assert!(
            matches!(refused.status, 400 | 422),
            "{why}: {:?}",
            refused.body
        );
    }
    let made = api
        .post(
            "/v2/network-volumes",
            &json!({"name": "rpk-data", "size": 20, "dataCenter": "EU-RO-1"}),
        )
        .await;
    assert_eq!(made.status, 201, "{:?}", made.body);
    let id = made.body["id"].as_str().unwrap().to_owned();
    assert_eq!(made.body["type"], "STANDARD");
    let listed = api.get("/v2/network-volumes").await;
    assert_eq!(listed.body["networkVolumes"][0]["name"], "rpk-data");
    // Grown, never shrunk.
    let shrunk = api
        .patch(&format!("/v2/network-volumes/{id}"), &json!({"size": 15}))
        .await;
    assert_eq!(shrunk.status, 400, "{:?}", shrunk.body);
    let grown = api
        .patch(&format!("/v2/network-volumes/{id}"), &json!({"size": 40}))
        .await;
    assert_eq!((grown.status, grown.body["size"].as_u64()), (200, Some(40)));

    // A pod mounting it runs in its data centre; another data centre, or two volumes, are 400.
    let gpu = json!({"id": RTX_4090, "count": 1});
    let mount = json!({"network": [{"volumeId": id, "path": "/data"}]});
    let elsewhere = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": gpu, "mounts": mount,
                    "dataCenterIds": ["US-TX-3"]}),
        )
        .await;
    assert_eq!(elsewhere.status, 400, "{:?}", elsewhere.body);
    let two = json!({"network": [{"volumeId": id, "path": "/a"}, {"volumeId": id, "path": "/b"}]});
    let refused = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": gpu, "mounts": two}),
        )
        .await;
    assert_eq!(refused.status, 400, "{:?}", refused.body);
    let pod = api
        .post(
            "/v2/pods",
            &json!({"name": "p", "image": "i", "gpu": gpu, "mounts": mount,
                    "dataCenterIds": ["US-TX-3", "EU-RO-1"]}),
        )
        .await;
    assert_eq!(pod.status, 201, "{:?}", pod.body);
    assert_eq!(pod.body["dataCenterId"], "EU-RO-1");
    assert_eq!(pod.body["mounts"], mount);
    let pod_id = pod.body["id"].as_str().unwrap().to_owned();

    // Not deleted while mounted; deleted once the pod is gone, then 404.
    let in_use = api.delete(&format!("/v2/network-volumes/{id}")).await;
    assert_eq!(in_use.status, 403, "{:?}", in_use.body);
    assert_eq!(api.delete(&format!("/v2/pods/{pod_id}")).await.status, 204);
    assert_eq!(
        api.delete(&format!("/v2/network-volumes/{id}"))
            .await
            .status,
        204
    );
    assert_eq!(
        api.get(&format!("/v2/network-volumes/{id}")).await.status,
        404
    );
    let ledger = api.sim.volumes();
    assert_eq!(ledger.len(), 1);
    assert!(ledger[0].deleted && ledger[0].resizes == 1 && ledger[0].size == 40);
    api.assert_contract();
}
