//! Authentication and rate limiting.

use std::time::Duration;

use runpod_simulator::Simulator;
use runpod_simulator::scenario::{RateLimitSpec, Scenario};

use crate::support::{Api, client};

#[tokio::test]
async fn requests_without_the_right_bearer_key_get_401_problems() {
    let mut api = Api::start(Scenario::default()).await;

    api.key = None;
    let missing = api.get("/v2/pods").await;
    assert_eq!(missing.status, 401);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.body["title"], "Unauthorized");
    assert_eq!(missing.body["status"], 401);
    assert!(
        missing.header("ratelimit").is_none(),
        "401s are not authenticated"
    );

    let basic = api
        .send(
            api.request(reqwest::Method::GET, "/v2/pods")
                .basic_auth("u", Some("p")),
        )
        .await;
    assert_eq!(basic.status, 401);

    api.key = Some("wrong".into());
    assert_eq!(api.get("/v2/pods").await.status, 401);
    assert_eq!(
        api.post("/v2/pods", &serde_json::json!({})).await.status,
        401
    );

    api.key = Some(crate::support::KEY.into());
    let ok = api.get("/v2/pods").await;
    assert_eq!(ok.status, 200, "{:?}", ok.body);
    assert_eq!(ok.body, serde_json::json!({"pods": []}));
    api.assert_contract();
}

#[tokio::test]
async fn without_a_configured_key_any_bearer_token_is_accepted() {
    let sim = Simulator::start(Scenario::default(), None).await.unwrap();
    let http = client();
    let url = format!("{}/v2/catalog/gpus", sim.base_url());
    let ok = http.get(&url).bearer_auth("anything").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let none = http.get(&url).send().await.unwrap();
    assert_eq!(none.status(), 401);
    sim.shutdown().await;
}

#[tokio::test]
async fn every_authenticated_response_carries_the_default_rate_limit_headers() {
    let api = Api::start(Scenario::default()).await;
    let first = api.get("/v2/pods").await;
    assert_eq!(
        first.header("ratelimit"),
        Some("\"minute\";r=59;t=60, \"hour\";r=2999;t=3600, \"day\";r=49999;t=86400")
    );
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"minute\";q=60;w=60, \"hour\";q=3000;w=3600, \"day\";q=50000;w=86400")
    );
    // Errors count and carry the headers too.
    let missing = api.get("/v2/pods/doesnotexist00").await;
    assert_eq!(missing.status, 404);
    assert!(
        missing
            .header("ratelimit")
            .unwrap()
            .starts_with("\"minute\";r=58;")
    );
    let unknown = api.get("/v2/nothing-here").await;
    assert_eq!(unknown.status, 404);
    assert!(
        unknown
            .header("ratelimit")
            .unwrap()
            .starts_with("\"minute\";r=57;")
    );
    let wrong_method = api
        .send(api.request(reqwest::Method::PUT, "/v2/pods"))
        .await;
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.header("allow"), Some("GET, POST"));
    api.assert_contract();
}

#[tokio::test]
async fn quota_exhaustion_gives_429_and_the_announced_reset_is_honoured() {
    let scenario = Scenario {
        rate_limits: vec![
            RateLimitSpec {
                name: "minute".into(),
                quota: 5,
                window_secs: 2,
                ..RateLimitSpec::default()
            },
            RateLimitSpec {
                name: "hour".into(),
                quota: 100,
                window_secs: 3600,
                ..RateLimitSpec::default()
            },
        ],
        ..Scenario::default()
    };
    let api = Api::start(scenario).await;
    for remaining in (0..5).rev() {
        let resp = api.get("/v2/catalog/datacenters").await;
        assert_eq!(resp.status, 200);
        let header = resp.header("ratelimit").unwrap();
        assert!(
            header.starts_with(&format!("\"minute\";r={remaining};t=")),
            "{header}"
        );
        let minute = header.split(',').next().unwrap();
        let t: u64 = minute.rsplit("t=").next().unwrap().parse().unwrap();
        assert!((1..=2).contains(&t), "{header}");
        assert_eq!(
            resp.header("ratelimit-policy"),
            Some("\"minute\";q=5;w=2, \"hour\";q=100;w=3600")
        );
    }
    let limited = api.get("/v2/catalog/datacenters").await;
    assert_eq!(limited.status, 429);
    assert_eq!(
        limited.detail(),
        "rate limit exceeded for the minute window"
    );
    assert_eq!(limited.body["title"], "Too Many Requests");
    let retry_after: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry_after));
    assert!(
        limited
            .header("ratelimit")
            .unwrap()
            .starts_with("\"minute\";r=0;")
    );
    // A refused request does not count, and is refused again.
    assert_eq!(api.get("/v2/pods").await.status, 429);

    // Waiting exactly what was announced is enough.
    tokio::time::sleep(Duration::from_secs(retry_after)).await;
    let again = api.get("/v2/catalog/datacenters").await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    let header = again.header("ratelimit").unwrap();
    assert!(
        header.starts_with("\"minute\";r=4;t=2, \"hour\";r=94;"),
        "429s are not counted: {header}"
    );
    api.assert_contract();
}
