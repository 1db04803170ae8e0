//! `POST /v2/pods`: the 201 shape, validation (422), cross-field rules (400), P11, placement.

use runpod_simulator::scenario::Scenario;
use runpod_simulator::{Effect, Fault, Match, Operation};
use serde_json::json;

use crate::support::{Api, RTX_4090};

const CAPACITY: &str = "There are no longer any instances available with the requested specifications. Please refresh and try again.";

#[tokio::test]
async fn create_answers_201_with_a_full_provisioning_pod() {
    let api = Api::start(Scenario::default()).await;
    let resp = api
        .post(
            "/v2/pods",
            &json!({
                "name": "shape", "image": "runpod/pytorch:2.4.0",
                "gpu": {"id": RTX_4090, "count": 2},
                "ports": ["8888/http", "22/tcp"], "env": {"A": "1"},
                "dataCenterIds": ["EU-RO-1"], "disk": 20, "args": "--serve",
            }),
        )
        .await;
    assert_eq!(resp.status, 201, "{:?}", resp.body);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let pod = &resp.body;
    let id = pod["id"].as_str().unwrap();
    assert_eq!(id.len(), 14);
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
        "{id}"
    );
    assert_eq!(pod["status"], "PROVISIONING");
    assert_eq!(pod["actions"], json!(["stop", "terminate"]));
    assert_eq!(pod["runtime"], json!({}), "as in the spec's 201 example");
    assert_eq!(pod["startedAt"], json!(null));
    assert_eq!(pod["cost"], json!(0.88));
    assert_eq!(pod["gpu"], json!({"id": RTX_4090, "count": 2}));
    assert_eq!(pod["cloud"], "SECURE");
    assert_eq!(pod["dataCenterId"], "EU-RO-1");
    assert_eq!(pod["cudaVersion"], "12.8");
    assert_eq!(pod["ssh"]["proxy"]["host"], "ssh.runpod.io");
    assert_eq!(pod["ssh"]["direct"], json!(null));
    assert_eq!(pod["registry"], json!(null));
    assert_eq!(pod["template"], json!(null));
    assert_eq!(pod["mounts"], json!({}));
    assert_eq!(pod["globalNetworking"], json!({"enabled": false}));
    assert_eq!(pod["env"], json!({"A": "1"}));
    assert_eq!(
        (pod["disk"].as_u64(), pod["args"].as_str()),
        (Some(20), Some("--serve"))
    );
    assert!(pod["createdAt"].as_str().unwrap().ends_with('Z'));

    let ledger = api.sim.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].id, id);
    assert_eq!((ledger[0].create_status, ledger[0].gpu_count), (201, 2));
    assert_eq!(ledger[0].cost_per_hr, 0.88);
    assert_eq!(ledger[0].ports, vec!["8888/http", "22/tcp"]);

    let fetched = api.get(&format!("/v2/pods/{id}")).await;
    assert_eq!(fetched.body["id"], id);

    let community = api
        .post("/v2/pods", &json!({"name": "c", "image": "i", "cloud": "COMMUNITY", "gpu": {"id": RTX_4090, "count": 1}}))
        .await;
    assert_eq!(
        (community.status, community.body["cost"].as_f64()),
        (201, Some(0.31))
    );
    api.assert_contract();
}

#[tokio::test]
async fn gpu_without_count_gets_the_misleading_capacity_400_p11() {
    let api = Api::start(Scenario::default()).await;
    let without = api
        .post(
            "/v2/pods",
            &json!({"name": "p11", "image": "i", "gpu": {"id": RTX_4090}}),
        )
        .await;
    assert_eq!(without.status, 400);
    assert_eq!(without.detail(), CAPACITY);
    assert!(api.sim.ledger().is_empty());
    let with = api
        .post(
            "/v2/pods",
            &json!({"name": "p11", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(with.status, 201, "{:?}", with.body);
    api.assert_contract();
}

#[tokio::test]
async fn schema_violations_are_422_with_one_error_per_violation() {
    let api = Api::start(Scenario::default()).await;
    let unknown = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "bogus": true}),
        )
        .await;
    assert_eq!(unknown.status, 422);
    assert_eq!(unknown.detail(), "Request validation failed.");
    let errors: Vec<&str> = unknown.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("$.bogus:") && errors[0].contains("bogus"),
        "{errors:?}"
    );

    let nameless = api
        .post(
            "/v2/pods",
            &json!({"image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(nameless.status, 422);
    assert!(
        nameless.body["errors"].to_string().contains("name"),
        "{:?}",
        nameless.body
    );

    let zero = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 0}}),
        )
        .await;
    assert_eq!(zero.status, 422);
    assert!(
        zero.body["errors"][0]
            .as_str()
            .unwrap()
            .starts_with("$.gpu.count:"),
        "{:?}",
        zero.body
    );

    let wrong_type = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": 5, "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(wrong_type.status, 422);

    let no_image = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(no_image.status, 422, "image is required without templateId");

    let not_json = api
        .send(
            api.request(reqwest::Method::POST, "/v2/pods")
                .header("content-type", "application/json")
                .body("{nope"),
        )
        .await;
    assert_eq!(not_json.status, 400);
    assert!(api.sim.ledger().is_empty());
    api.assert_contract();
}

#[tokio::test]
async fn cross_field_rules_are_400() {
    let api = Api::start(Scenario::default()).await;
    let both = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "cpu": {"id": "cpu3c", "vcpuCount": 2}}))
        .await;
    assert_eq!(both.status, 400);
    assert!(
        both.detail().contains("exactly one of `gpu` or `cpu`"),
        "{}",
        both.detail()
    );
    let neither = api
        .post("/v2/pods", &json!({"name": "x", "image": "i"}))
        .await;
    assert_eq!(neither.status, 400);
    assert!(neither.detail().contains("exactly one"));
    let cuda = api
        .post("/v2/pods", &json!({"name": "x", "image": "i",
            "gpu": {"id": RTX_4090, "count": 1, "allowedCudaVersions": ["12.8"], "minCudaVersion": "12.4"}}))
        .await;
    assert_eq!(cuda.status, 400);
    let mounts = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1},
            "mounts": {"persistent": {"size": 20, "path": "/workspace"}, "network": [{"volumeId": "v", "path": "/data"}]}}))
        .await;
    assert_eq!(mounts.status, 400);
    let ports = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "ports": ["8888/udp"]}))
        .await;
    assert_eq!(ports.status, 400);
    let unknown_gpu = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": "RTX 4090", "count": 1}}),
        )
        .await;
    assert_eq!(unknown_gpu.status, 400);
    assert!(unknown_gpu.detail().contains("unknown GPU type"));
    let too_many = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 9}}),
        )
        .await;
    assert_eq!(too_many.status, 400);
    assert!(too_many.detail().contains("maximum of 8"));
    let not_on_community = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "cloud": "COMMUNITY", "gpu": {"id": "NVIDIA H200", "count": 1}}))
        .await;
    assert_eq!(not_on_community.status, 400);
    assert!(
        not_on_community
            .detail()
            .contains("not offered on COMMUNITY")
    );
    let template = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "templateId": "nope", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(template.status, 404);
    assert!(api.sim.ledger().is_empty());

    let cpu = api
        .post(
            "/v2/pods",
            &json!({"name": "cpu", "image": "i", "cpu": {"id": "cpu3c", "vcpuCount": 4}}),
        )
        .await;
    assert_eq!(cpu.status, 201, "{:?}", cpu.body);
    assert_eq!(
        cpu.body["cpu"],
        json!({"id": "cpu3c", "vcpuCount": 4, "memory": 8})
    );
    assert_eq!(cpu.body["cudaVersion"], json!(null));
    let from_template = api
        .post("/v2/pods", &json!({"name": "t", "templateId": "runpod-torch-v240", "gpu": {"id": RTX_4090, "count": 1}}))
        .await;
    assert_eq!(from_template.status, 201, "{:?}", from_template.body);
    assert!(
        from_template.body["image"]
            .as_str()
            .unwrap()
            .starts_with("runpod/pytorch")
    );
    assert_eq!(from_template.body["ports"], json!(["8888/http", "22/tcp"]));
    api.assert_contract();
}

#[tokio::test]
async fn placement_walks_data_centres_in_order_and_capacity_faults_move_it_on() {
    let api = Api::start(Scenario::default()).await;
    let create = |dcs: serde_json::Value| {
        let api = &api;
        async move {
            let mut body =
                json!({"name": "place", "image": "i", "gpu": {"id": RTX_4090, "count": 1}});
            if !dcs.is_null() {
                body["dataCenterIds"] = dcs;
            }
            api.post("/v2/pods", &body).await
        }
    };
    // No preference: the first catalogue data centre with stock.
    assert_eq!(create(json!(null)).await.body["dataCenterId"], "EU-RO-1");
    // US-TX-3 has no RTX 4090 (NONE), so the next preferred one.
    assert_eq!(
        create(json!(["US-TX-3", "US-CA-2"])).await.body["dataCenterId"],
        "US-CA-2"
    );
    // Unknown data centres are simply not placeable.
    let unknown = create(json!(["XX-NOPE-1"])).await;
    assert_eq!((unknown.status, unknown.detail()), (400, CAPACITY));

    api.sim.inject(Fault::new(
        Match::operation(Operation::CreatePod)
            .gpu(RTX_4090)
            .data_center("US-CA-2"),
        Effect::Capacity,
    ));
    assert_eq!(
        create(json!(["US-CA-2", "EU-RO-1"])).await.body["dataCenterId"],
        "EU-RO-1"
    );
    let refused = create(json!(["US-CA-2"])).await;
    assert_eq!((refused.status, refused.detail()), (400, CAPACITY));
    // Another GPU type is not affected.
    let other = api
        .post("/v2/pods", &json!({"name": "a6000", "image": "i", "gpu": {"id": "NVIDIA RTX A6000", "count": 1}, "dataCenterIds": ["US-CA-2"]}))
        .await;
    assert_eq!(other.status, 201);

    // A capacity fault without a data centre refuses everywhere, here once.
    api.sim.clear_faults();
    api.sim
        .inject(Fault::new(Match::operation(Operation::CreatePod), Effect::Capacity).times(1));
    let everywhere = create(json!(null)).await;
    assert_eq!((everywhere.status, everywhere.detail()), (400, CAPACITY));
    assert_eq!(create(json!(null)).await.status, 201);
    assert_eq!(api.sim.ledger().len(), 5);
    api.assert_contract();
}
