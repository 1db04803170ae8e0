//! The simulator over HTTP: the routes, their shapes and the pitfalls it models.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use vastai_simulator::{
    Behaviour, Effect, Fault, ImageRule, Match, RateLimits, Route, RouteLimit, Scenario,
    SimulatorHandle, Status, VastSimulator, duplicate_labels, live_instances,
};

const KEY: &str = "vast-test-key";

fn fast() -> Scenario {
    Scenario {
        provisioning_ms: 20,
        loading_ms: 40,
        list_lag_ms: 0,
        log_ready_polls: 1,
        rate_limits: RateLimits::none(),
        ..Scenario::default()
    }
}

async fn start(scenario: Scenario) -> (SimulatorHandle, Client) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let sim = VastSimulator::start(scenario, Some(KEY.into()))
        .await
        .unwrap();
    (sim, Client::new())
}

async fn call(
    client: &Client,
    sim: &SimulatorHandle,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client
        .request(method, format!("{}{path}", sim.base_url()))
        .bearer_auth(KEY);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn create_body(label: &str) -> Value {
    json!({"client_id": "me", "image": "org/app:1", "disk": 20, "label": label,
           "env": {"A": "1", "-p 8080:8080": "1"}, "runtype": "args", "cancel_unavail": true})
}

async fn wait_for(client: &Client, sim: &SimulatorHandle, id: u64, want: &str) -> Value {
    for _ in 0..200 {
        let (_, body) = call(
            client,
            sim,
            Method::GET,
            &format!("/api/v0/instances/{id}/"),
            None,
        )
        .await;
        if body["instances"]["actual_status"] == want {
            return body["instances"].clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("instance {id} never became {want}");
}

#[tokio::test]
async fn search_buy_run_and_destroy() {
    let (sim, client) = start(fast()).await;
    let (status, found) = call(&client, &sim, Method::POST, "/api/v0/bundles/", Some(json!({
        "gpu_name": {"in": ["RTX 4090"]}, "num_gpus": {"eq": 1}, "gpu_ram": {"gte": 24000},
        "verified": {"eq": true}, "datacenter": {"eq": true}, "reliability2": {"gte": 0.99},
        "rentable": {"eq": true}, "rented": {"eq": false}, "geolocation": {"in": ["US", "JP"]},
        "type": "on-demand", "order": [["dph_total", "asc"]], "limit": 10, "allocated_storage": 20
    }))).await;
    assert_eq!(status, 200);
    let ids: Vec<u64> = found["offers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_u64().unwrap())
        .collect();
    // 1006 ("California, United States") has no country code; 1004 has two GPUs.
    assert_eq!(ids, vec![1005, 1001]);

    let (status, created) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("a")),
    )
    .await;
    assert_eq!(status, 200, "{created}");
    let id = created["new_contract"].as_u64().unwrap();
    let running = wait_for(&client, &sim, id, "running").await;
    assert_eq!(running["label"], "a");
    assert!(running["ports"]["8080/tcp"][0]["HostPort"].is_string());
    assert_eq!(
        running["public_ipaddr"].as_str().unwrap().trim(),
        "203.0.113.10"
    );

    // The offer is gone: buying it again is a 404 no_such_ask, and search no longer shows it.
    let (status, again) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("b")),
    )
    .await;
    assert_eq!(status, 404);
    assert!(again["msg"].as_str().unwrap().contains("no_such_ask"));
    let (_, found) = call(
        &client,
        &sim,
        Method::POST,
        "/api/v0/bundles/",
        Some(json!({"id": {"eq": 1001}})),
    )
    .await;
    assert_eq!(found["offers"], json!([]));

    let (status, _) = call(
        &client,
        &sim,
        Method::DELETE,
        &format!("/api/v0/instances/{id}/"),
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 200);
    let (status, gone) = call(
        &client,
        &sim,
        Method::DELETE,
        &format!("/api/v0/instances/{id}/"),
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (status.as_u16(), gone["error"].as_str()),
        (404, Some("not_found"))
    );
    let (_, got) = call(
        &client,
        &sim,
        Method::GET,
        &format!("/api/v0/instances/{id}/"),
        None,
    )
    .await;
    assert!(got["instances"].is_null());
    let ledger = sim.ledger();
    assert_eq!(ledger.len(), 1);
    assert!(live_instances(&ledger).is_empty());
    assert!(ledger[0].gpu_cost > 0.0 && ledger[0].storage_cost > 0.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn the_list_pages_filters_by_label_and_lags() {
    let mut scenario = fast();
    scenario.offers = (0..30)
        .map(|i| {
            let mut offer = Scenario::default().offers[0].clone();
            offer.id = 9000 + i;
            offer
        })
        .collect();
    let (sim, client) = start(scenario).await;
    for i in 0..30 {
        let label = if i % 2 == 0 { "even" } else { "odd" };
        let (status, _) = call(
            &client,
            &sim,
            Method::PUT,
            &format!("/api/v0/asks/{}/", 9000 + i),
            Some(create_body(label)),
        )
        .await;
        assert_eq!(status, 200);
    }
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut url = format!("{}/api/v1/instances/?limit=25", sim.base_url());
        if let Some(token) = &token {
            url.push_str(&format!("&after_token={token}"));
        }
        let page: Value = client
            .get(url)
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(page["total_instances"], 30);
        seen.extend(
            page["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_u64().unwrap()),
        );
        match page["next_token"].as_str() {
            Some(next) => token = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen.len(), 30);
    let filters = r#"{"label":{"eq":"odd"}}"#;
    let page: Value = client
        .get(format!("{}/api/v1/instances/", sim.base_url()))
        .query(&[("select_filters", filters)])
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["total_instances"], 15);
    assert_eq!(page["label_counts"], json!({"odd": 15}));
    let bad = client
        .get(format!("{}/api/v1/instances/", sim.base_url()))
        .query(&[("select_filters", r#"{"dph_total":{"lt":1}}"#)])
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400, "computed columns cannot be filtered");
    let bad = client
        .get(format!(
            "{}/api/v1/instances/?after_token=garbage",
            sim.base_url()
        ))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    sim.shutdown().await;

    let (sim, client) = start(Scenario {
        list_lag_ms: 60_000,
        ..fast()
    })
    .await;
    let (_, created) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("late")),
    )
    .await;
    let (_, page) = call(&client, &sim, Method::GET, "/api/v1/instances/", None).await;
    assert_eq!(page["instances"], json!([]), "the list lags a create");
    let id = created["new_contract"].as_u64().unwrap();
    let (_, got) = call(
        &client,
        &sim,
        Method::GET,
        &format!("/api/v0/instances/{id}/"),
        None,
    )
    .await;
    assert_eq!(got["instances"]["id"], id);
    sim.shutdown().await;
}

#[tokio::test]
async fn rate_limits_answer_429_without_retry_after() {
    let scenario = Scenario {
        rate_limits: RateLimits(vec![
            (
                Route::Search,
                RouteLimit {
                    per_window: Some(2),
                    window_ms: 60_000,
                    ..RouteLimit::interval(0)
                },
            ),
            (
                Route::Create,
                RouteLimit::interval(60_000).with_penalty(60_000),
            ),
        ]),
        ..fast()
    };
    let (sim, client) = start(scenario).await;
    for _ in 0..2 {
        let (status, _) = call(
            &client,
            &sim,
            Method::POST,
            "/api/v0/bundles/",
            Some(json!({})),
        )
        .await;
        assert_eq!(status, 200);
    }
    let response = client
        .post(format!("{}/api/v0/bundles/", sim.base_url()))
        .bearer_auth(KEY)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert!(response.headers().get("retry-after").is_none());
    let body: Value = response.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("too frequent"));
    let (first, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("x")),
    )
    .await;
    let (second, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1002/",
        Some(create_body("y")),
    )
    .await;
    assert_eq!((first.as_u16(), second.as_u16()), (200, 429));
    assert_eq!(sim.ledger().len(), 1, "a refused create buys nothing");
    assert_eq!(sim.requests(Route::Create), 2);
    sim.shutdown().await;
}

#[tokio::test]
async fn faults_lose_answers_and_take_offers() {
    let (sim, client) = start(fast()).await;
    sim.inject(
        Fault::new(
            Match::route(Route::Create),
            Effect::CreateThenFail { status: 502 },
        )
        .times(1),
    );
    let (status, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("lost")),
    )
    .await;
    assert_eq!(status, 502);
    let lost = sim.instances_labelled("lost");
    assert_eq!(
        lost.len(),
        1,
        "the instance exists although the answer was an error"
    );
    assert_eq!(lost[0].create_status, 502);

    sim.inject(Fault::new(Match::route(Route::Create), Effect::NoSuchAsk).times(1));
    let (status, body) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1002/",
        Some(create_body("race")),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(body["ask_id"], 1002);
    assert!(sim.instances_labelled("race").is_empty());

    // An unstartable machine: 410 with cancel_unavail, a stopped instance billing storage without.
    let mut offer = Scenario::default().offers[1].clone();
    offer.id = 5555;
    offer.startable = false;
    sim.add_offer(offer);
    let (status, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/5555/",
        Some(create_body("careful")),
    )
    .await;
    assert_eq!(status, 410);
    let mut careless = create_body("careless");
    careless.as_object_mut().unwrap().remove("cancel_unavail");
    let (status, created) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/5555/",
        Some(careless),
    )
    .await;
    assert_eq!(status, 200);
    let id = created["new_contract"].as_u64().unwrap();
    let stopped = wait_for(&client, &sim, id, "stopped").await;
    assert_eq!(stopped["intended_status"], "stopped");
    tokio::time::sleep(Duration::from_millis(120)).await;
    let entry = &sim.instances_labelled("careless")[0];
    assert!(
        entry.storage_cost > 0.0 && entry.gpu_cost == 0.0,
        "{entry:?}"
    );
    assert!(duplicate_labels(&sim.ledger()).is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn images_get_stuck_or_exit_and_logs_come_through_a_result_url() {
    let scenario = Scenario {
        images: vec![
            ImageRule {
                contains: "stuck".into(),
                behaviour: Behaviour::LoadingForever,
                logs: Vec::new(),
            },
            ImageRule {
                contains: "batch".into(),
                behaviour: Behaviour::Exit {
                    after_ms: 50,
                    code: 3,
                },
                logs: vec!["one".into(), "two".into(), "three".into()],
            },
        ],
        ..fast()
    };
    let (sim, client) = start(scenario).await;
    let mut body = create_body("batch");
    body["image"] = json!("org/batch:1");
    let (_, created) = call(&client, &sim, Method::PUT, "/api/v0/asks/1001/", Some(body)).await;
    let id = created["new_contract"].as_u64().unwrap();
    let exited = wait_for(&client, &sim, id, "exited").await;
    assert_eq!(exited["status_msg"], "Container exited with code 3");

    let (status, requested) = call(
        &client,
        &sim,
        Method::PUT,
        &format!("/api/v0/instances/request_logs/{id}/"),
        Some(json!({"tail": "2"})),
    )
    .await;
    assert_eq!(status, 200);
    let url = requested["result_url"].as_str().unwrap().to_owned();
    // Not uploaded yet, then the file, without authentication.
    assert_eq!(client.get(&url).send().await.unwrap().status(), 404);
    let text = client.get(&url).send().await.unwrap().text().await.unwrap();
    assert_eq!(text, "two\nthree\n");

    let mut body = create_body("stuck");
    body["image"] = json!("org/stuck:1");
    let (_, created) = call(&client, &sim, Method::PUT, "/api/v0/asks/1002/", Some(body)).await;
    let stuck = created["new_contract"].as_u64().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    wait_for(&client, &sim, stuck, "loading").await;
    assert!(sim.set_status(stuck, Status::Offline));
    wait_for(&client, &sim, stuck, "offline").await;
    sim.shutdown().await;
}

#[tokio::test]
async fn authentication_and_strictness() {
    let (sim, client) = start(fast()).await;
    let response = client
        .post(format!("{}/api/v0/bundles/", sim.base_url()))
        .bearer_auth("wrong")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "auth_error");
    let by_query = client
        .get(format!(
            "{}/api/v0/users/current/?api_key={KEY}",
            sim.base_url()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(by_query.status(), 200);
    let (status, _) = call(
        &client,
        &sim,
        Method::POST,
        "/api/v0/bundles/",
        Some(json!({"gpu_ram_gte": 24})),
    )
    .await;
    assert_eq!(status, 400, "an unknown search field is refused");
    let (status, body) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(json!({"image": "x", "env": "-e A=1"})),
    )
    .await;
    assert_eq!(
        (status.as_u16(), body["error"].as_str()),
        (400, Some("invalid_args"))
    );
    let (status, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001",
        Some(create_body("x")),
    )
    .await;
    assert_eq!(status, 404, "paths keep their trailing slash");
    assert!(sim.ledger().is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn the_control_api_serves_the_ledger_faults_and_forced_states() {
    let (sim, client) = start(fast()).await;
    let control = |method: Method, path: &str| {
        client.request(method, format!("{}/_sim/{path}", sim.base_url()))
    };
    // A fault added over HTTP fires on the next create.
    let fault = json!({"when": {"route": "create"}, "times": 1,
                       "effect": {"kind": "create_then_fail", "status": 502}});
    let added = control(Method::POST, "faults")
        .json(&fault)
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), StatusCode::NO_CONTENT);
    let invalid = control(Method::POST, "faults")
        .json(&json!({"effect": {"kind": "nonsense"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(invalid.status(), StatusCode::BAD_REQUEST);
    let (status, _) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1001/",
        Some(create_body("rpk:c:n:u1")),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let ledger: Vec<Value> = control(Method::GET, "ledger")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["label"], "rpk:c:n:u1");
    assert_eq!(ledger[0]["create_status"], 502);
    // Forced into offline; unknown ids are 404.
    let id = ledger[0]["id"].as_u64().unwrap();
    let forced = control(Method::POST, &format!("instances/{id}/status"))
        .json(&json!({"status": "offline"}))
        .send()
        .await
        .unwrap();
    assert_eq!(forced.status(), StatusCode::NO_CONTENT);
    let (_, got) = call(
        &client,
        &sim,
        Method::GET,
        &format!("/api/v0/instances/{id}/"),
        None,
    )
    .await;
    assert_eq!(got["instances"]["actual_status"], "offline");
    let missing = control(Method::POST, "instances/999999/status")
        .json(&json!({"status": "offline"}))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let cleared = control(Method::DELETE, "faults").send().await.unwrap();
    assert_eq!(cleared.status(), StatusCode::NO_CONTENT);
    sim.shutdown().await;
}

#[tokio::test]
async fn bids_rent_at_their_price_and_can_be_outbid() {
    let (sim, client) = start(fast()).await;
    let (_, found) = call(
        &client,
        &sim,
        Method::POST,
        "/api/v0/bundles/",
        Some(json!({"type": "bid", "id": {"eq": 1001}, "allocated_storage": 20})),
    )
    .await;
    let offer = &found["offers"][0];
    let min_bid = offer["min_bid"].as_f64().unwrap();
    assert_eq!(offer["is_bid"], true);
    // Under the minimum: refused, nothing rented.
    let mut low = create_body("rpk:c:n:bid");
    low["price"] = json!(min_bid / 2.0);
    let (status, body) = call(&client, &sim, Method::PUT, "/api/v0/asks/1001/", Some(low)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["msg"].as_str().unwrap().contains("minimum bid"),
        "{body}"
    );
    let mut bid = create_body("rpk:c:n:bid");
    bid["price"] = json!(min_bid * 1.1);
    let (status, body) = call(&client, &sim, Method::PUT, "/api/v0/asks/1001/", Some(bid)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = body["new_contract"].as_u64().unwrap();
    let running = wait_for(&client, &sim, id, "running").await;
    assert_eq!(running["is_bid"], true);
    assert!((running["dph_base"].as_f64().unwrap() - min_bid * 1.1).abs() < 1e-9);
    let control = |path: String| client.post(format!("{}/_sim/{path}", sim.base_url()));
    let outbid = control(format!("instances/{id}/outbid"))
        .send()
        .await
        .unwrap();
    assert_eq!(outbid.status(), StatusCode::NO_CONTENT);
    let stopped = wait_for(&client, &sim, id, "stopped").await;
    assert_eq!(
        stopped["intended_status"], "running",
        "it still means to run"
    );
    let ledger = sim.ledger();
    let entry = ledger.iter().find(|e| e.id == id).unwrap();
    assert!(
        entry.outbid && entry.bid.is_some() && entry.is_live(),
        "{entry:?}"
    );
    assert!(entry.machine_id > 0);
    // An on-demand instance cannot be outbid; unknown ids are 404.
    let (_, body) = call(
        &client,
        &sim,
        Method::PUT,
        "/api/v0/asks/1002/",
        Some(create_body("rpk:c:n:od")),
    )
    .await;
    let on_demand = body["new_contract"].as_u64().unwrap();
    let refused = control(format!("instances/{on_demand}/outbid"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let missing = control("instances/999999/outbid".into())
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    sim.shutdown().await;
}
