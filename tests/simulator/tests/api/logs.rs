//! `GET /v2/pods/{id}/logs`: SSE backlog (tail, since, Last-Event-ID), follow, end on terminate.

use std::time::Duration;

use runpod_simulator::scenario::{ImageRule, Scenario};
use serde_json::json;

use crate::support::{Api, Sse, fast};

const QUIET: Duration = Duration::from_millis(300);

async fn chatty() -> (Api, String) {
    let scenario = Scenario {
        images: vec![ImageRule {
            pattern: "chatty".into(),
            outcome: None,
            after_ms: 0,
            logs: (1..=5).map(|i| format!("line {i}")).collect(),
            exit_code: None,
            run: false,
        }],
        ..fast()
    };
    let api = Api::start(scenario).await;
    let pod = api.create("logger", json!({"image": "me/chatty:1"})).await;
    let id = pod["id"].as_str().unwrap().to_owned();
    api.wait_for(&id, Duration::from_secs(5), |p| p["status"] == "RUNNING")
        .await;
    (api, id)
}

async fn open(api: &Api, path: &str, last_event_id: Option<&str>) -> Sse {
    let mut request = api.request(reqwest::Method::GET, path);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200, "{path}");
    let headers = response.headers();
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["x-accel-buffering"], "no");
    assert!(headers.contains_key("ratelimit"));
    Sse::new(response)
}

#[tokio::test]
async fn tail_selects_the_backlog_and_new_lines_follow() {
    let (api, id) = chatty().await;
    let mut sse = open(
        &api,
        &format!("/v2/pods/{id}/logs?source=container&tail=2"),
        None,
    )
    .await;
    let backlog = sse.drain(QUIET).await;
    let lines: Vec<&str> = backlog.iter().map(|e| e.line()).collect();
    assert_eq!(lines, ["line 4", "line 5"]);
    for event in &backlog {
        assert_eq!(event.data["source"], "container");
        let ts = event.data["ts"].as_str().unwrap();
        assert!(event.id.starts_with(ts), "id {} carries ts {ts}", event.id);
        let seq = event.id.rsplit('/').next().unwrap();
        assert_eq!(seq.len(), 12);
    }
    assert!(api.sim.push_log(&id, "pushed"));
    let next = sse
        .next(Duration::from_secs(2))
        .await
        .expect("followed line");
    assert_eq!(next.line(), "pushed");
    assert!(!api.sim.push_log("nosuchpod0000", "x"));

    // tail=0: nothing old, only new lines.
    let mut live = open(&api, &format!("/v2/pods/{id}/logs?tail=0"), None).await;
    assert!(live.next(QUIET).await.is_none());
    assert!(!live.ended, "the stream stays open");
    api.sim.push_log(&id, "fresh");
    assert_eq!(
        live.next(Duration::from_secs(2)).await.unwrap().line(),
        "fresh"
    );

    // Both sources by default: system lifecycle lines are there too.
    let mut both = open(&api, &format!("/v2/pods/{id}/logs"), None).await;
    let all = both.drain(QUIET).await;
    assert!(
        all.iter()
            .any(|e| e.data["source"] == "system" && e.line().starts_with("Pulling image"))
    );
    assert!(all.iter().any(|e| e.line() == "Container started"));
    let mut system = open(&api, &format!("/v2/pods/{id}/logs?source=system"), None).await;
    assert!(
        system
            .drain(QUIET)
            .await
            .iter()
            .all(|e| e.data["source"] == "system")
    );
    api.assert_contract();
}

#[tokio::test]
async fn last_event_id_resumes_without_loss_or_repeat_and_since_filters_by_time() {
    let (api, id) = chatty().await;
    let path = format!("/v2/pods/{id}/logs?tail=5000");
    let mut first = open(&api, &path, None).await;
    let all = first.drain(QUIET).await;
    assert!(all.len() >= 8, "{all:?}");
    let cut = 3;
    drop(first);
    api.sim.push_log(&id, "while away");

    let mut resumed = open(&api, &path, Some(&all[cut].id)).await;
    let rest = resumed.drain(QUIET).await;
    let mut expected: Vec<String> = all[cut + 1..].iter().map(|e| e.id.clone()).collect();
    let got: Vec<String> = rest.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        got[..expected.len()],
        expected[..],
        "resume must continue exactly after the cut"
    );
    assert_eq!(rest.last().unwrap().line(), "while away");
    expected.push(rest.last().unwrap().id.clone());
    assert_eq!(got, expected);
    // A Last-Event-ID at the very end yields nothing old.
    let mut at_end = open(&api, &path, Some(&rest.last().unwrap().id)).await;
    assert!(at_end.next(QUIET).await.is_none());

    let since = all[cut].data["ts"].as_str().unwrap();
    let mut from = open(
        &api,
        &format!("/v2/pods/{id}/logs?since={}", since.replace('+', "%2B")),
        None,
    )
    .await;
    let from_events = from.drain(QUIET).await;
    assert!(!from_events.is_empty());
    assert!(
        from_events
            .iter()
            .all(|e| e.data["ts"].as_str().unwrap() >= since)
    );
    let at_or_after: Vec<&str> = all
        .iter()
        .filter(|e| e.data["ts"].as_str().unwrap() >= since)
        .map(|e| e.id.as_str())
        .collect();
    assert!(
        at_or_after.contains(&all[cut].id.as_str()),
        "since is inclusive"
    );
    let from_ids: Vec<&str> = from_events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(from_ids[..at_or_after.len()], at_or_after[..]);
    api.assert_contract();
}

#[tokio::test]
async fn bad_parameters_unknown_pods_and_termination_end_streams() {
    let (api, id) = chatty().await;
    for query in ["tail=5001", "tail=-1", "source=stdout", "since=yesterday"] {
        let resp = api.get(&format!("/v2/pods/{id}/logs?{query}")).await;
        assert_eq!(resp.status, 422, "{query}");
        assert_eq!(resp.detail(), "Request validation failed.");
    }
    let bad_id = api
        .send(
            api.request(reqwest::Method::GET, &format!("/v2/pods/{id}/logs"))
                .header("last-event-id", "nonsense"),
        )
        .await;
    assert_eq!(bad_id.status, 422);
    assert_eq!(api.get("/v2/pods/nosuchpod0000/logs").await.status, 404);

    let mut sse = open(&api, &format!("/v2/pods/{id}/logs?tail=0"), None).await;
    assert_eq!(api.delete(&format!("/v2/pods/{id}")).await.status, 204);
    let last = sse
        .next(Duration::from_secs(2))
        .await
        .expect("termination line");
    assert_eq!(last.line(), "Pod terminated");
    assert!(sse.next(Duration::from_secs(2)).await.is_none());
    assert!(sse.ended, "the stream ends once the pod is terminated");
    assert_eq!(api.get(&format!("/v2/pods/{id}/logs")).await.status, 404);
    let sse_exchange = api
        .sim
        .exchanges()
        .into_iter()
        .find(|e| e.content_type.as_deref() == Some("text/event-stream"))
        .unwrap();
    assert_eq!((sse_exchange.status, sse_exchange.body), (200, None));
    api.assert_contract();
}
