//! The ledger helpers, scenario files, the control API and the vendored spec.

use runpod_simulator::scenario::{Scenario, ScenarioError};
use runpod_simulator::{Effect, LedgerEntry, Operation, duplicate_names, live_pods};
use serde_json::json;
use std::path::Path;

use crate::support::{Api, RTX_4090, fast};

#[tokio::test]
async fn duplicate_names_and_live_pods_follow_lifetimes() {
    let api = Api::start(fast()).await;
    let first = api.create("dup", json!({})).await;
    api.create("dup", json!({})).await;
    let seq = api.create("seq", json!({})).await;
    assert_eq!(
        api.delete(&format!("/v2/pods/{}", seq["id"].as_str().unwrap()))
            .await
            .status,
        204
    );
    api.create("seq", json!({})).await;

    let ledger = api.sim.ledger();
    assert_eq!(ledger.len(), 4);
    assert_eq!(duplicate_names(&ledger), vec!["dup".to_owned()]);
    assert_eq!(live_pods(&ledger).len(), 3);
    assert_eq!(api.sim.pods_by_name("dup").len(), 2);
    // Terminating one duplicate does not undo the overlap that happened.
    api.delete(&format!("/v2/pods/{}", first["id"].as_str().unwrap()))
        .await;
    let ledger = api.sim.ledger();
    assert_eq!(duplicate_names(&ledger), vec!["dup".to_owned()]);
    assert_eq!(live_pods(&ledger).len(), 2);
    api.assert_contract();
}

fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("runpod-sim-{}-{name}", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn scenario_files_round_trip_and_drive_the_simulator() {
    let text = json!({
        "gpus": [{
            "id": "NVIDIA L4", "name": "L4", "memory": 24, "manufacturer": "NVIDIA",
            "secure": true, "community": false,
            "price": {"secure": 0.43, "community": 0.0}, "maxCount": {"secure": 4, "community": 0},
            "pool": null
        }],
        "data_centers": [
            {"id": "EU-NL-1", "name": "Netherlands", "region": "EUROPE", "country": "NL",
             "compliance": ["GDPR"], "globalNetwork": true, "networkVolumeTypes": ["STANDARD"],
             "gpu_availability": {"NVIDIA L4": "LOW"}}
        ],
        "rate_limits": [{"name": "minute", "quota": 100, "window_secs": 60}],
        "provisioning_ms": 10, "starting_ms": 10, "ports_ms": 10, "list_lag_ms": 5,
        "images": [{"match": "fail", "outcome": "ERROR", "after_ms": 5, "logs": []}],
        "faults": [{"when": {"operation": "createPod", "pod_name": "unlucky"},
                    "effect": {"kind": "status", "status": 402}, "times": 1}]
    })
    .to_string();
    let path = temp_file("scenario.json", &text);
    let scenario = Scenario::from_file(&path).unwrap();
    assert_eq!(scenario.gpus[0].id, "NVIDIA L4");
    assert_eq!(scenario.data_centers[0].country.as_deref(), Some("NL"));
    assert_eq!(
        scenario.faults[0].effect,
        Effect::Status {
            status: 402,
            detail: None,
            retry_after: None
        }
    );
    assert_eq!(
        scenario.faults[0].when.operation,
        Some(Operation::CreatePod)
    );
    assert_eq!(
        scenario.templates,
        Scenario::default().templates,
        "absent fields take defaults"
    );
    // Serialising and reading back gives the same scenario.
    let again = temp_file("again.json", &serde_json::to_string(&scenario).unwrap());
    assert_eq!(Scenario::from_file(&again).unwrap(), scenario);

    let api = Api::start(scenario).await;
    let gpus = api.get("/v2/catalog/gpus").await;
    assert_eq!(gpus.body["gpus"].as_array().unwrap().len(), 1);
    assert_eq!(
        api.get("/v2/pods").await.header("ratelimit-policy"),
        Some("\"minute\";q=100;w=60")
    );
    let body = json!({"name": "unlucky", "image": "i", "gpu": {"id": "NVIDIA L4", "count": 1}});
    assert_eq!(api.post("/v2/pods", &body).await.status, 402);
    let created = api.post("/v2/pods", &body).await;
    assert_eq!(
        (created.status, created.body["dataCenterId"].as_str()),
        (201, Some("EU-NL-1"))
    );
    assert_eq!(
        api.post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}})
        )
        .await
        .status,
        400
    );
    api.assert_contract();

    let broken = temp_file("broken.json", "{\"gpus\": [");
    assert!(matches!(
        Scenario::from_file(&broken),
        Err(ScenarioError::Json { .. })
    ));
    let unknown_gpu = temp_file(
        "unknown.json",
        &json!({"data_centers": [{"id": "X-1", "name": "x", "region": "EUROPE", "gpu_availability": {"nope": "HIGH"}}]}).to_string(),
    );
    assert!(matches!(
        Scenario::from_file(&unknown_gpu),
        Err(ScenarioError::Invalid(_))
    ));
    let typo = temp_file("typo.json", r#"{"provisioning": 5}"#);
    assert!(
        Scenario::from_file(&typo).is_err(),
        "unknown keys are refused"
    );
    assert!(matches!(
        Scenario::from_file(Path::new("/nonexistent/x.json")),
        Err(ScenarioError::Io { .. })
    ));
    for path in [path, again, broken, unknown_gpu, typo] {
        let _ = std::fs::remove_file(path);
    }
}

#[tokio::test]
async fn the_control_api_steers_the_simulator_without_counting() {
    let api = Api::start(Scenario::default()).await;
    let http = &api.http;
    let sim = |path: &str| format!("{}/_sim{path}", api.sim.base_url());
    assert_eq!(
        http.get(sim("/healthz")).send().await.unwrap().status(),
        200
    );

    let fault =
        json!({"when": {"operation": "createPod"}, "effect": {"kind": "status", "status": 402}});
    assert_eq!(
        http.post(sim("/faults"))
            .json(&fault)
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let bad = json!({"effect": {"kind": "status", "status": 200}});
    assert_eq!(
        http.post(sim("/faults"))
            .json(&bad)
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    let body = json!({"name": "ctl", "image": "i", "gpu": {"id": RTX_4090, "count": 1}});
    assert_eq!(api.post("/v2/pods", &body).await.status, 402);
    assert_eq!(
        http.delete(sim("/faults")).send().await.unwrap().status(),
        204
    );
    let pod = api.post("/v2/pods", &body).await;
    let id = pod.body["id"].as_str().unwrap();

    let forced = http
        .post(sim(&format!("/pods/{id}/status")))
        .json(&json!({"status": "EXITED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forced.status(), 200);
    assert_eq!(
        api.get(&format!("/v2/pods/{id}")).await.body["status"],
        "EXITED"
    );
    let logged = http
        .post(sim(&format!("/pods/{id}/logs")))
        .json(&json!({"line": "from outside"}))
        .send()
        .await
        .unwrap();
    assert_eq!(logged.status(), 204);
    let missing = http
        .post(sim("/pods/nope/status"))
        .json(&json!({"status": "EXITED"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);

    let ledger: Vec<LedgerEntry> = http
        .get(sim("/ledger"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ledger, api.sim.ledger());
    let raw: serde_json::Value = http
        .get(sim("/ledger"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(raw[0]["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(raw[0]["terminated_at"], json!(null));

    // Control calls are neither recorded nor rate limited.
    assert!(
        api.sim
            .exchanges()
            .iter()
            .all(|e| e.path.starts_with("/v2/"))
    );
    let pods = api.get("/v2/pods").await;
    assert!(
        pods.header("ratelimit")
            .unwrap()
            .starts_with("\"minute\";r=56;"),
        "{:?}",
        pods.header("ratelimit")
    );
    api.assert_contract();
}

#[test]
fn vendored_spec_is_identical_to_the_shared_copy() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = crate_dir.join("../../../shared/runpod/openapi-v2.json");
    let Ok(upstream) = std::fs::read(&shared) else {
        println!(
            "note: {} is absent; skipping the comparison",
            shared.display()
        );
        return;
    };
    let vendored = std::fs::read(crate_dir.join("openapi-v2.json")).unwrap();
    assert!(
        vendored == upstream,
        "tests/simulator/openapi-v2.json differs from {}",
        shared.display()
    );
}
