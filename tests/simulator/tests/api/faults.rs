//! Injected faults: create-then-fail (P3), 402/403, data-centre-specific faults, delays.

use std::time::{Duration, Instant};

use runpod_simulator::scenario::Scenario;
use runpod_simulator::{Effect, Fault, Match, Operation, live_pods};
use serde_json::json;

use crate::support::{Api, RTX_4090};

fn status(status: u16, detail: Option<&str>) -> Effect {
    Effect::Status {
        status,
        detail: detail.map(str::to_owned),
        retry_after: None,
    }
}

#[tokio::test]
async fn create_then_fail_leaves_a_billed_pod_behind_p3() {
    let api = Api::start(Scenario::default()).await;
    api.sim.inject(
        Fault::new(
            Match::operation(Operation::CreatePod),
            Effect::CreateThenFail { status: 500 },
        )
        .times(1),
    );
    let failed = api
        .post(
            "/v2/pods",
            &json!({"name": "ns-job-uid", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(failed.status, 500);
    assert_eq!(
        failed.header("content-type"),
        Some("application/problem+json")
    );
    let ledger = api.sim.ledger();
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0].create_status, 500);
    assert_eq!(ledger[0].name, "ns-job-uid");
    assert!(ledger[0].cost_per_hr > 0.0);
    assert_eq!(live_pods(&ledger).len(), 1);
    // The pod exists and, once the list has caught up (default lag 500 ms), is listed, so a
    // careful client finds it instead of creating again.
    let lagging = api.get("/v2/pods").await;
    assert_eq!(
        lagging.body["pods"],
        json!([]),
        "the list lags behind the create"
    );
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let list = api.get("/v2/pods").await;
    assert_eq!(
        list.body["pods"][0]["id"].as_str(),
        Some(ledger[0].id.as_str())
    );
    assert_eq!(api.sim.pods_by_name("ns-job-uid").len(), 1);
    // `times: 1`: the next create is normal.
    let next = api
        .post(
            "/v2/pods",
            &json!({"name": "other", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(next.status, 201);
    api.assert_contract();
}

#[tokio::test]
async fn status_faults_answer_402_and_403_without_creating() {
    let api = Api::start(Scenario::default()).await;
    api.sim.inject(Fault::new(
        Match::operation(Operation::CreatePod).gpu("NVIDIA L40S"),
        status(403, None),
    ));
    let forbidden = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": "NVIDIA L40S", "count": 1}}),
        )
        .await;
    assert_eq!(
        (forbidden.status, forbidden.body["title"].as_str()),
        (403, Some("Forbidden"))
    );
    let other = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(other.status, 201);

    // A data-centre fault fires when placement would land there.
    api.sim.inject(Fault::new(
        Match::operation(Operation::CreatePod).data_center("EU-SE-1"),
        status(403, Some("pool denied")),
    ));
    let se = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "dataCenterIds": ["EU-SE-1"]}))
        .await;
    assert_eq!((se.status, se.detail()), (403, "pool denied"));
    let ca = api
        .post("/v2/pods", &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "dataCenterIds": ["US-CA-2"]}))
        .await;
    assert_eq!(ca.status, 201);

    api.sim.clear_faults();
    api.sim.inject(Fault::new(
        Match::any(),
        status(402, Some("Insufficient balance.")),
    ));
    let broke = api
        .post(
            "/v2/pods",
            &json!({"name": "x", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(
        (broke.status, broke.detail()),
        (402, "Insufficient balance.")
    );
    assert!(broke.header("ratelimit").is_some());
    assert_eq!(api.sim.ledger().len(), 2);

    api.sim.clear_faults();
    api.sim.inject(
        Fault::new(
            Match::operation(Operation::ListPods),
            Effect::Status {
                status: 503,
                detail: None,
                retry_after: Some(7),
            },
        )
        .times(1),
    );
    let unavailable = api.get("/v2/pods").await;
    assert_eq!(
        (unavailable.status, unavailable.header("retry-after")),
        (503, Some("7"))
    );
    assert_eq!(api.get("/v2/pods").await.status, 200);
    api.assert_contract();
}

#[tokio::test]
async fn pod_faults_match_the_pods_name_and_delays_compose_with_the_answer() {
    let api = Api::start(Scenario::default()).await;
    let pod = api.create("slow-one", json!({})).await;
    let id = pod["id"].as_str().unwrap();
    api.sim.inject(Fault::new(
        Match::operation(Operation::GetPod).pod_name("slow-one"),
        Effect::Delay { millis: 300 },
    ));
    let started = Instant::now();
    let slow = api.get(&format!("/v2/pods/{id}")).await;
    assert_eq!(slow.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Only getPod is delayed: a list sent while a delayed get is pending answers first.
    api.sim.inject(Fault::new(
        Match::operation(Operation::GetPod).pod_name("slow-one"),
        Effect::Delay { millis: 5_000 },
    ));
    let path = format!("/v2/pods/{id}");
    let slow = api.get(&path);
    let list = api.get("/v2/pods");
    tokio::pin!(slow, list);
    let first = tokio::select! {
        answer = &mut list => { assert_eq!(answer.status, 200); "list" }
        _ = &mut slow => "get",
    };
    assert_eq!(first, "list", "only getPod is delayed");

    // A delete whose answer is lost still deletes.
    api.sim.inject(
        Fault::new(
            Match::operation(Operation::DeletePod),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    assert_eq!(api.delete(&format!("/v2/pods/{id}")).await.status, 502);
    assert!(api.sim.ledger()[0].terminated_at.is_some());
    assert_eq!(api.delete(&format!("/v2/pods/{id}")).await.status, 404);
    api.assert_contract();
}

#[tokio::test]
async fn misplace_puts_the_pod_outside_the_requested_data_centres() {
    let api = Api::start(Scenario::default()).await;
    api.sim
        .inject(Fault::new(Match::operation(Operation::CreatePod), Effect::Misplace).times(1));
    let wanted = json!(["EU-RO-1", "US-TX-3"]);
    let misplaced = api
        .post(
            "/v2/pods",
            &json!({"name": "m", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "dataCenterIds": wanted}),
        )
        .await;
    assert_eq!(misplaced.status, 201);
    let dc = misplaced.body["dataCenterId"].as_str().unwrap().to_owned();
    assert!(
        !["EU-RO-1", "US-TX-3"].contains(&dc.as_str()),
        "placed in {dc}, a requested data centre"
    );
    let ledger = api.sim.ledger();
    assert_eq!(ledger[0].data_center_id, dc);
    // `times: 1`: the next create lands where it asked.
    let placed = api
        .post(
            "/v2/pods",
            &json!({"name": "m2", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "dataCenterIds": wanted}),
        )
        .await;
    assert_eq!(placed.body["dataCenterId"], "EU-RO-1");

    // A named target data centre; a request naming none is placed normally.
    api.sim.inject(Fault::new(
        Match::operation(Operation::CreatePod).data_center("EU-SE-1"),
        Effect::Misplace,
    ));
    let named = api
        .post(
            "/v2/pods",
            &json!({"name": "m3", "image": "i", "gpu": {"id": RTX_4090, "count": 1}, "dataCenterIds": ["EU-RO-1"]}),
        )
        .await;
    assert_eq!(named.body["dataCenterId"], "EU-SE-1");
    let anywhere = api
        .post(
            "/v2/pods",
            &json!({"name": "m4", "image": "i", "gpu": {"id": RTX_4090, "count": 1}}),
        )
        .await;
    assert_eq!(anywhere.body["dataCenterId"], "EU-RO-1");
    api.assert_contract();
}
