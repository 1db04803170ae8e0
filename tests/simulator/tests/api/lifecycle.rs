//! Lifecycle, list lag, delete, actions, PATCH, image rules and forced statuses.

use std::time::Duration;

use runpod_simulator::PodStatus;
use runpod_simulator::scenario::{ImageRule, Outcome, Scenario};
use serde_json::json;

use crate::support::{Api, fast};

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn pods_go_provisioning_starting_running_then_publish_ports() {
    let api = Api::start(Scenario {
        provisioning_ms: 400,
        starting_ms: 400,
        ports_ms: 400,
        ..fast()
    })
    .await;
    let pod = api
        .create("life", json!({"ports": ["8888/http", "22/tcp"]}))
        .await;
    let id = pod["id"].as_str().unwrap();

    let (starting, seen) = api
        .wait_for(id, WAIT, |p| p["status"] != "PROVISIONING")
        .await;
    assert_eq!(seen, ["PROVISIONING", "STARTING"]);
    assert_eq!(starting["status"], "STARTING");
    assert_eq!(starting["runtime"], json!({}));
    assert_eq!(starting["actions"], json!(["stop", "terminate"]));

    // RUNNING comes before the ports (api-notes P6).
    let (running, seen) = api.wait_for(id, WAIT, |p| p["status"] == "RUNNING").await;
    assert_eq!(seen, ["STARTING", "RUNNING"]);
    assert_eq!(running["runtime"]["ports"], json!([]), "{running}");
    assert_eq!(running["ssh"]["direct"], json!(null));
    assert!(running["startedAt"].is_string());
    assert_eq!(running["actions"], json!(["stop", "restart", "terminate"]));
    assert_eq!(running["runtime"]["gpus"].as_array().unwrap().len(), 1);

    let (ready, seen) = api
        .wait_for(id, WAIT, |p| {
            p["runtime"]["ports"]
                .as_array()
                .is_some_and(|a| !a.is_empty())
        })
        .await;
    let ports = ready["runtime"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 2);
    for port in ports {
        let public = port["public"].as_u64().unwrap();
        assert!((10000..=60000).contains(&public), "{port}");
        assert!(port["ip"].is_string());
    }
    let ssh = ports.iter().find(|p| p["private"] == 22).unwrap();
    assert_eq!(ssh["type"], "tcp");
    assert_eq!(ready["ssh"]["direct"]["port"], ssh["public"]);
    assert_eq!(ready["ssh"]["direct"]["username"], "root");
    assert_eq!(seen, ["RUNNING"]);
    api.assert_contract();
}

#[tokio::test]
async fn the_list_lags_behind_creates() {
    let api = Api::start(Scenario {
        list_lag_ms: 400,
        ..fast()
    })
    .await;
    let pod = api.create("lagging", json!({})).await;
    let id = pod["id"].as_str().unwrap();
    assert_eq!(api.get("/v2/pods").await.body, json!({"pods": []}));
    assert_eq!(
        api.get(&format!("/v2/pods/{id}")).await.status,
        200,
        "GET by id does not lag"
    );
    tokio::time::sleep(Duration::from_millis(450)).await;
    let list = api.get("/v2/pods").await;
    assert_eq!(list.body["pods"][0]["id"], id);
    api.assert_contract();
}

#[tokio::test]
async fn delete_answers_204_then_404_and_terminates_in_the_ledger() {
    let api = Api::start(fast()).await;
    let pod = api.create("doomed", json!({})).await;
    let id = pod["id"].as_str().unwrap();
    let deleted = api.delete(&format!("/v2/pods/{id}")).await;
    assert_eq!(deleted.status, 204);
    assert_eq!(deleted.body, json!(null));
    assert!(deleted.header("content-type").is_none());
    assert_eq!(api.get(&format!("/v2/pods/{id}")).await.status, 404);
    let again = api.delete(&format!("/v2/pods/{id}")).await;
    assert_eq!(
        (again.status, again.body["title"].as_str()),
        (404, Some("Not Found"))
    );
    assert_eq!(api.get("/v2/pods").await.body, json!({"pods": []}));
    assert!(api.sim.ledger()[0].terminated_at.is_some());
    assert_eq!(api.delete("/v2/pods/neverexisted00").await.status, 404);
    api.assert_contract();
}

#[tokio::test]
async fn actions_follow_the_status_table_and_409_otherwise() {
    let api = Api::start(Scenario {
        provisioning_ms: 60_000,
        ..fast()
    })
    .await;
    let pod = api.create("acts", json!({})).await;
    let path = format!("/v2/pods/{}/action", pod["id"].as_str().unwrap());
    for action in ["start", "restart"] {
        let refused = api.post(&path, &json!({"action": action})).await;
        assert_eq!(refused.status, 409, "{action} while PROVISIONING");
    }
    let invalid = api.post(&path, &json!({"action": "explode"})).await;
    assert_eq!(invalid.status, 422);
    assert_eq!(
        api.post(&path, &json!({"action": "stop", "extra": 1}))
            .await
            .status,
        422
    );

    let locked = api
        .patch(
            &format!("/v2/pods/{}", pod["id"].as_str().unwrap()),
            &json!({"locked": true}),
        )
        .await;
    assert_eq!((locked.status, &locked.body["locked"]), (200, &json!(true)));
    assert_eq!(
        api.post(&path, &json!({"action": "stop"})).await.status,
        409,
        "locked"
    );
    api.patch(
        &format!("/v2/pods/{}", pod["id"].as_str().unwrap()),
        &json!({"locked": false}),
    )
    .await;

    let stopped = api.post(&path, &json!({"action": "stop"})).await;
    assert_eq!(stopped.status, 200);
    assert_eq!(stopped.body["status"], "EXITED");
    assert_eq!(stopped.body["cost"], json!(0.0));
    assert_eq!(stopped.body["actions"], json!(["start", "terminate"]));
    assert_eq!(
        api.post(&path, &json!({"action": "stop"})).await.status,
        409
    );
    let started = api.post(&path, &json!({"action": "start"})).await;
    assert_eq!(
        (started.status, started.body["status"].as_str()),
        (200, Some("PROVISIONING"))
    );
    assert_eq!(started.body["cost"], json!(0.44));
    let terminated = api.post(&path, &json!({"action": "terminate"})).await;
    assert_eq!((terminated.status, &terminated.body), (204, &json!(null)));
    assert_eq!(
        api.post(&path, &json!({"action": "start"})).await.status,
        404
    );
    api.assert_contract();
}

#[tokio::test]
async fn patch_applies_present_fields_and_validates() {
    let api = Api::start(fast()).await;
    let pod = api.create("before", json!({"env": {"A": "1"}})).await;
    let path = format!("/v2/pods/{}", pod["id"].as_str().unwrap());
    let renamed = api
        .patch(&path, &json!({"name": "after", "registry": "cred-1"}))
        .await;
    assert_eq!(renamed.status, 200, "{:?}", renamed.body);
    assert_eq!(
        (
            renamed.body["name"].as_str(),
            renamed.body["registry"].as_str()
        ),
        (Some("after"), Some("cred-1"))
    );
    assert_eq!(
        renamed.body["env"],
        json!({"A": "1"}),
        "omitted fields are untouched"
    );
    assert_eq!(api.sim.ledger()[0].name, "after");
    assert_eq!(
        api.patch(&path, &json!({"registry": null})).await.body["registry"],
        json!(null)
    );
    assert_eq!(api.patch(&path, &json!({"nme": "typo"})).await.status, 422);
    assert_eq!(api.patch(&path, &json!({"name": ""})).await.status, 422);
    let mount = api
        .patch(
            &path,
            &json!({"mounts": {"persistent": {"size": 20, "path": "/w"}}}),
        )
        .await;
    assert_eq!(mount.status, 400, "mount kind is fixed at create");
    assert_eq!(
        api.patch("/v2/pods/unknownpod0000", &json!({"name": "x"}))
            .await
            .status,
        404
    );
    api.assert_contract();
}

#[tokio::test]
async fn image_rules_script_exits_and_pull_errors() {
    let scenario = Scenario {
        images: vec![
            ImageRule {
                pattern: "private/secret".into(),
                outcome: Some(Outcome::Error),
                after_ms: 50,
                logs: vec![],
                exit_code: None,
                run: false,
            },
            ImageRule {
                pattern: "batch-job".into(),
                outcome: Some(Outcome::Exited),
                after_ms: 100,
                logs: vec!["working".into(), "done".into()],
                exit_code: None,
                run: false,
            },
        ],
        ..fast()
    };
    let api = Api::start(scenario).await;
    let failing = api
        .create("pull", json!({"image": "private/secret:1"}))
        .await;
    let (errored, seen) = api
        .wait_for(failing["id"].as_str().unwrap(), WAIT, |p| {
            p["status"] == "ERROR"
        })
        .await;
    assert!(!seen.contains(&"RUNNING".to_owned()), "{seen:?}");
    assert_eq!(
        (errored["cost"].as_f64(), &errored["runtime"]),
        (Some(0.0), &json!(null))
    );

    let batch = api
        .create("batch", json!({"image": "me/batch-job:2"}))
        .await;
    let (exited, seen) = api
        .wait_for(batch["id"].as_str().unwrap(), WAIT, |p| {
            p["status"] == "EXITED"
        })
        .await;
    assert!(seen.contains(&"RUNNING".to_owned()), "{seen:?}");
    assert_eq!(exited["cost"], json!(0.0));
    assert_eq!(exited["actions"], json!(["start", "terminate"]));
    api.assert_contract();
}

#[tokio::test]
async fn statuses_can_be_forced_on_command() {
    let api = Api::start(fast()).await;
    let pod = api.create("forced", json!({})).await;
    let id = pod["id"].as_str().unwrap();
    assert!(api.sim.set_status(id, PodStatus::Running));
    let running = api.get(&format!("/v2/pods/{id}")).await;
    assert_eq!(running.body["status"], "RUNNING");
    assert!(api.sim.set_status(id, PodStatus::Exited));
    let exited = api.get(&format!("/v2/pods/{id}")).await;
    assert_eq!(
        (exited.body["status"].as_str(), exited.body["cost"].as_f64()),
        (Some("EXITED"), Some(0.0))
    );
    // EXITED stays EXITED: no timer moves it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        api.get(&format!("/v2/pods/{id}")).await.body["status"],
        "EXITED"
    );
    assert!(api.sim.set_status(id, PodStatus::Terminated));
    assert_eq!(api.get(&format!("/v2/pods/{id}")).await.status, 404);
    assert!(!api.sim.set_status(id, PodStatus::Running));
    assert!(!api.sim.set_status("unknown", PodStatus::Running));
    api.assert_contract();
}

#[tokio::test]
async fn a_wrapped_command_stops_its_pod_and_an_unwrapped_one_restarts() {
    let scenario = Scenario {
        images: vec![ImageRule {
            pattern: "trainer".into(),
            outcome: Some(Outcome::Exited),
            after_ms: 2500,
            logs: vec!["epoch 1".into()],
            exit_code: Some(3),
            run: false,
        }],
        ..fast()
    };
    let api = Api::start(scenario).await;
    let wrapped = api
        .create(
            "wrapped",
            json!({"image": "me/trainer:1",
                   "args": "sh -c 'cmd; echo \"runpod-kubelet: exit-code=$?\"' w python train.py"}),
        )
        .await;
    let wrapped_id = wrapped["id"].as_str().unwrap().to_owned();
    let (_, seen) = api
        .wait_for(&wrapped_id, WAIT, |p| p["status"] == "EXITED")
        .await;
    assert!(seen.contains(&"RUNNING".to_owned()), "{seen:?}");
    let lines = container_lines(&api, &wrapped_id).await;
    assert_eq!(
        lines.last().map(String::as_str),
        Some("runpod-kubelet: exit-code=3"),
        "the wrapper's code is not the last container line: {lines:?}"
    );

    let plain = api
        .create(
            "plain",
            json!({"image": "me/trainer:1", "args": "python train.py"}),
        )
        .await;
    let plain_id = plain["id"].as_str().unwrap().to_owned();
    let (running, _) = api
        .wait_for(&plain_id, WAIT, |p| p["status"] == "RUNNING")
        .await;
    let mut highest = running["runtime"]["uptime"].as_u64().unwrap_or(0);
    let mut went_back = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline && !went_back {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let pod = api.get(&format!("/v2/pods/{plain_id}")).await.body;
        assert_eq!(
            pod["status"], "RUNNING",
            "an unwrapped container must keep running"
        );
        let uptime = pod["runtime"]["uptime"].as_u64().unwrap_or(0);
        went_back = uptime < highest;
        highest = highest.max(uptime);
    }
    assert!(went_back, "the restart did not show as uptime going back");
    api.assert_contract();
}

#[tokio::test]
async fn a_pods_env_fixes_the_utilization_it_reports() {
    let api = Api::start(Scenario {
        provisioning_ms: 50,
        starting_ms: 50,
        ..fast()
    })
    .await;
    let pod = api
        .create(
            "busy",
            json!({"gpu": {"id": crate::support::RTX_4090, "count": 2}, "env": {
                "SIM_CPU_UTIL": "40", "SIM_MEM_UTIL": "25",
                "SIM_GPU_UTIL": "90", "SIM_GPU_MEM_UTIL": "500"}}),
        )
        .await;
    let id = pod["id"].as_str().unwrap();
    let (running, _) = api.wait_for(id, WAIT, |p| p["status"] == "RUNNING").await;
    let runtime = &running["runtime"];
    assert_eq!(runtime["cpu"], json!({"util": 40}), "{runtime}");
    assert_eq!(runtime["memory"], json!({"util": 25}));
    assert_eq!(
        runtime["gpus"],
        json!([{"util": 90, "memoryUtil": 100}, {"util": 90, "memoryUtil": 100}]),
        "one figure per GPU, capped at 100"
    );
}

#[tokio::test]
async fn a_command_that_runs_for_real_is_the_containers_log_and_its_end() {
    let scenario = Scenario {
        images: vec![ImageRule {
            pattern: "runs".into(),
            outcome: None,
            after_ms: 0,
            logs: Vec::new(),
            exit_code: None,
            run: true,
        }],
        ..fast()
    };
    let api = Api::start(scenario).await;
    // The wrapper's mark in args: the pod stops when the process ends, as a wrapped one does.
    let created = api
        .create(
            "real",
            json!({"image": "me/runs:1", "env": {"WHO": "the pod"},
                   "args": "sh -c 'echo \"hello from $WHO\"; echo oops >&2; sleep 1; echo \"runpod-kubelet: exit-code=4\"; exit 4'"}),
        )
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let (_, seen) = api.wait_for(&id, WAIT, |p| p["status"] == "EXITED").await;
    assert!(seen.contains(&"RUNNING".to_owned()), "{seen:?}");
    let lines = container_lines(&api, &id).await;
    for expected in ["hello from the pod", "oops", "runpod-kubelet: exit-code=4"] {
        assert!(
            lines.iter().any(|l| l == expected),
            "{expected} missing: {lines:?}"
        );
    }
}

/// The last lines of the pod's container log.
async fn container_lines(api: &Api, id: &str) -> Vec<String> {
    let response = api
        .request(
            reqwest::Method::GET,
            &format!("/v2/pods/{id}/logs?source=container&tail=10"),
        )
        .send()
        .await
        .unwrap();
    let mut sse = crate::support::Sse::new(response);
    sse.drain(Duration::from_millis(500))
        .await
        .iter()
        .map(|e| e.line().to_owned())
        .collect()
}
